"""The generated plan of the bench's detection scenario (tests/test_codegen.py): kN are its constants."""

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
    # ['image']
    try:
        if set(map(type, c2)) != k7 or set(map(k8, c2)) != k9 or c2[0].shape != k10:
            raise Mismatch(*k11)  # ['image']
    except (TypeError, AttributeError, RuntimeError):
        raise Mismatch(*k12) from None
    append((k13, k14, c2, k15))
    c3 = list(cols1[1])
    # ['boxes']
    k16.run(c3, fill)
    c4 = list(cols1[2])
    # ['labels']
    k17.run(c4, fill)
