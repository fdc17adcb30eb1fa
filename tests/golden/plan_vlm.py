"""The generated plan of the bench's vlm scenario (tests/test_codegen.py): kN are its constants."""

# ruff: noqa: F821

def run(samples, fill):
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
    c2 = list(cols1[0])
    # ['input_ids']
    k7.run(c2, fill)
    c3 = list(cols1[1])
    # ['pixel_values']
    k8.run(c3, fill)
