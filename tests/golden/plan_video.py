"""The generated plan of the bench's video scenario (tests/test_codegen.py): kN are its constants."""

# ruff: noqa: F821

def run(samples, fill):
    append = fill.tasks.append
    # root
    if set(map(type, samples)) != k0:
        raise Mismatch(*k1)  # root
    first0 = samples[0]
    cols1 = None
    if set(map(len, samples)) == k2 and tuple(first0) == k3 and tuple(map(type, first0)) == k4:
        try:
            cols1 = list(zip(*map(k5, samples), strict=True))
        except KeyError:  # a sample of the same size with another key
            cols1 = None
    if cols1 is None:
        raise Mismatch(*k6)  # root
    c2 = cols1[0]
    # ['video']
    try:
        if set(map(type, c2)) != k7 or set(map(k8, c2)) != k9 or c2[0].shape != k10:
            raise Mismatch(*k11)  # ['video']
    except (TypeError, AttributeError, RuntimeError):
        raise Mismatch(*k12) from None
    append((k13, k14, c2, k15))
    c3 = cols1[1]
    # ['flow']
    try:
        if set(map(type, c3)) != k16 or set(map(k8, c3)) != k17 or c3[0].shape != k18:
            raise Mismatch(*k19)  # ['flow']
    except (TypeError, AttributeError, RuntimeError):
        raise Mismatch(*k20) from None
    append((k13, k21, c3, k22))
    # root
    # numbers at 'label'
    try:
        r4 = list(map(k23, samples))
    except KeyError:  # absent in a sample (missing='none'): planned for each batch
        raise Mismatch(*k24) from None
    if set(map(type, r4)) != k25:
        raise Mismatch(*k26)  # ['label']
    append((fill_one_field, k27, r4, k28))
