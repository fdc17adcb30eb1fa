"""The generated plan of the bench's audio scenario (tests/test_codegen.py): kN are its constants."""

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
            cols1 = [list(map(k5, samples))]
        except KeyError:  # a sample of the same size with another key
            cols1 = None
    if cols1 is None:
        raise Mismatch(*k6)  # root
    c2 = list(cols1[0])
    # ['audio']
    k7.run(c2, fill)
    # root
    # numbers at 'label'
    try:
        r3 = list(map(k8, samples))
    except KeyError:  # absent in a sample (missing='none'): planned for each batch
        raise Mismatch(*k9) from None
    if set(map(type, r3)) != k10:
        raise Mismatch(*k11)  # ['label']
    append((k12, k13, r3, k14))
