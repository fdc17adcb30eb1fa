"""The generated plan of the bench's manyleaf scenario (tests/test_codegen.py): kN are its constants."""

# ruff: noqa: F821

def run(samples, kind, slots, pin_slots, pin, into=None):
    if len(samples) != 32:
        raise Mismatch()  # another batch size (an epoch's last batch): another plan
    values = [None] * 1
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
    c3 = list(cols1[21])
    # ['caption']
    if set(map(type, c3)) != k13:
        raise Mismatch(*k14)  # ['caption']
    values[0] = c3
    # root
    # a block of ['feat0'], ['feat4'], ['feat8'], ['feat12'], ['feat16'], ['feat20'], ['feat24'], ['feat28'], ['feat32'], ['feat36']
    v4 = [*cols1[1], *cols1[3], *cols1[5], *cols1[7], *cols1[9], *cols1[11], *cols1[13], *cols1[15], *cols1[17], *cols1[19]]
    f5 = (cols1[1][0], cols1[3][0], cols1[5][0], cols1[7][0], cols1[9][0], cols1[11][0], cols1[13][0], cols1[15][0], cols1[17][0], cols1[19][0],)
    try:
        ok6 = not HAS_TORCH_FUNCTION(v4) or set(map(type, v4)) == PLAIN
        ok6 = ok6 and set(map(TENSOR_SHAPE, f5)) == k15 and set(map(TENSOR_DTYPE, f5)) == k16
    except (TypeError, RuntimeError):  # a nested tensor has no shape
        ok6 = False
    if not ok6:
        raise Mismatch(*k17.blame(v4))
    # root
    # a block of ['ids1'], ['ids5'], ['ids9'], ['ids13'], ['ids17'], ['ids21'], ['ids25'], ['ids29'], ['ids33'], ['ids37']
    v7 = [*cols1[2], *cols1[4], *cols1[6], *cols1[8], *cols1[10], *cols1[12], *cols1[14], *cols1[16], *cols1[18], *cols1[20]]
    f8 = (cols1[2][0], cols1[4][0], cols1[6][0], cols1[8][0], cols1[10][0], cols1[12][0], cols1[14][0], cols1[16][0], cols1[18][0], cols1[20][0],)
    try:
        ok9 = not HAS_TORCH_FUNCTION(v7) or set(map(type, v7)) == PLAIN
        ok9 = ok9 and set(map(TENSOR_SHAPE, f8)) == k18 and set(map(TENSOR_DTYPE, f8)) == k19
    except (TypeError, RuntimeError):  # a nested tensor has no shape
        ok9 = False
    if not ok9:
        raise Mismatch(*k20.blame(v7))
    # root
    # numbers at 'score2', 'score6', 'score10', 'score14', 'score18', 'score22', 'score26', 'score30', 'score34', 'score38'
    try:
        r10 = list(map(k21, samples))
    except KeyError:  # absent in a sample (missing='none'): planned for each batch
        raise Mismatch(*k22) from None
    if set(map(type, chain(r10))) != k23:
        raise Mismatch(*k24.blame(r10))
    # root
    # numbers at 'count3', 'count7', 'count11', 'count15', 'count19', 'count23', 'count27', 'count31', 'count35', 'count39', 'label'
    try:
        r11 = list(map(k25, samples))
    except KeyError:  # absent in a sample (missing='none'): planned for each batch
        raise Mismatch(*k26) from None
    if set(map(type, chain(r11))) != k27:
        raise Mismatch(*k28.blame(r11))
    layout = k29
    if kind is None:  # checked only
        try:
            if set(map(SHAPE, c2)) != k30:
                raise Mismatch(*k31)  # ['image']
        except AttributeError:  # a value without a shape: its copy would fail
            raise Mismatch(*k32) from None
        try:
            if set(map(SHAPE, v4)) != k15:
                raise Mismatch(*k33)  # root
        except AttributeError:  # a value without a shape: its copy would fail
            raise Mismatch(*k34) from None
        try:
            if set(map(SHAPE, v7)) != k18:
                raise Mismatch(*k35)  # root
        except AttributeError:  # a value without a shape: its copy would fail
            raise Mismatch(*k36) from None
        return layout
    buffer = allocate(419072, kind, slots, pin_slots, pin) if into is None else into
    views = Views(buffer, values, (), k37, kind == PAGEABLE)
    made = views.made
    region12 = made[k38] if k38 in made else k39.region(views)
    region13 = made[k40] if k40 in made else k41.region(views)
    region14 = made[k42] if k42 in made else k43.region(views)
    region15 = made[k44] if k44 in made else k45.region(views)
    region16 = made[k46] if k46 in made else k47.region(views)
    grad = is_grad_enabled()
    set_grad_enabled(False)  # copies into the buffer are never part of a graph
    try:
        at = 0  # ['image']
        stack(c2, out=region12)
        at = 1  # root
        k48(region13, v4)
        at = 2  # root
        k49(region14, v7)
        at = 3  # root
        k50(region15, r10)
        at = 4  # root
        k50(region16, r11)
    except Exception as exc:
        raise Mismatch(*k51[at].blame((c2, v4, v7, r10, r11,)[at])) from exc
    finally:
        set_grad_enabled(grad)
    if views.source is None:  # not made at once (pinned memory): built by the layout
        return make_batch(layout, buffer, values, views)
    batch = Batch({k52: made[k53], k54: made[k55], k56: made[k57], k58: made[k59], k60: made[k61], k62: made[k63], k64: made[k65], k66: made[k67], k68: made[k69], k70: made[k71], k72: made[k73], k74: made[k75], k76: made[k77], k78: made[k79], k80: made[k81], k82: made[k83], k84: made[k85], k86: made[k87], k88: made[k89], k90: made[k91], k92: made[k93], k94: made[k95], k96: made[k97], k98: made[k99], k100: made[k101], k102: made[k103], k104: made[k105], k106: made[k107], k108: made[k109], k110: made[k111], k112: made[k113], k114: made[k115], k116: made[k117], k118: made[k119], k120: made[k121], k122: made[k123], k124: made[k125], k126: made[k127], k128: made[k129], k130: made[k131], k132: made[k133], k134: made[k135], k136: values[0]})
    set_attribute(batch, CARRIED, (layout, buffer, values))
    return batch
