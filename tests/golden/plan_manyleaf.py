"""The generated plan of the bench's manyleaf scenario (tests/test_codegen.py): kN are its constants."""

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
    c3 = list(cols1[21])
    # ['caption']
    if set(map(type, c3)) != k16:
        raise Mismatch(*k17)  # ['caption']
    fill.values[0] = c3
    # root
    # a block of ['feat0'], ['feat4'], ['feat8'], ['feat12'], ['feat16'], ['feat20'], ['feat24'], ['feat28'], ['feat32'], ['feat36']
    v4 = [*cols1[1], *cols1[3], *cols1[5], *cols1[7], *cols1[9], *cols1[11], *cols1[13], *cols1[15], *cols1[17], *cols1[19]]
    f5 = (cols1[1][0], cols1[3][0], cols1[5][0], cols1[7][0], cols1[9][0], cols1[11][0], cols1[13][0], cols1[15][0], cols1[17][0], cols1[19][0],)
    try:
        ok6 = not HAS_TORCH_FUNCTION(v4) or set(map(type, v4)) == PLAIN
        ok6 = ok6 and set(map(TENSOR_SHAPE, f5)) == k18 and set(map(TENSOR_DTYPE, f5)) == k19
    except (TypeError, RuntimeError):  # a nested tensor has no shape
        ok6 = False
    if not ok6:
        raise Mismatch(*k20.blame(v4))
    append((k21, k22, v4, k20))
    # root
    # a block of ['ids1'], ['ids5'], ['ids9'], ['ids13'], ['ids17'], ['ids21'], ['ids25'], ['ids29'], ['ids33'], ['ids37']
    v7 = [*cols1[2], *cols1[4], *cols1[6], *cols1[8], *cols1[10], *cols1[12], *cols1[14], *cols1[16], *cols1[18], *cols1[20]]
    f8 = (cols1[2][0], cols1[4][0], cols1[6][0], cols1[8][0], cols1[10][0], cols1[12][0], cols1[14][0], cols1[16][0], cols1[18][0], cols1[20][0],)
    try:
        ok9 = not HAS_TORCH_FUNCTION(v7) or set(map(type, v7)) == PLAIN
        ok9 = ok9 and set(map(TENSOR_SHAPE, f8)) == k23 and set(map(TENSOR_DTYPE, f8)) == k24
    except (TypeError, RuntimeError):  # a nested tensor has no shape
        ok9 = False
    if not ok9:
        raise Mismatch(*k25.blame(v7))
    append((k26, k27, v7, k25))
    # root
    # numbers at 'score2', 'score6', 'score10', 'score14', 'score18', 'score22', 'score26', 'score30', 'score34', 'score38'
    try:
        r10 = list(map(k28, samples))
    except KeyError:  # absent in a sample (missing='none'): planned for each batch
        raise Mismatch(*k29) from None
    if set(map(type, chain(r10))) != k30:
        raise Mismatch(*k31.blame(r10))
    append((fill_block, k32, r10, k31))
    # root
    # numbers at 'count3', 'count7', 'count11', 'count15', 'count19', 'count23', 'count27', 'count31', 'count35', 'count39', 'label'
    try:
        r11 = list(map(k33, samples))
    except KeyError:  # absent in a sample (missing='none'): planned for each batch
        raise Mismatch(*k34) from None
    if set(map(type, chain(r11))) != k35:
        raise Mismatch(*k36.blame(r11))
    append((fill_block, k37, r11, k36))
