"""The generated plan of the bench's nested scenario (tests/test_codegen.py): kN are its constants."""

# ruff: noqa: F821

def run(samples, kind, slots, pin_slots, pin, into=None):
    if len(samples) != 32:
        raise Mismatch()  # another batch size (an epoch's last batch): another plan
    values = []
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
    c3 = cols1[1]
    # ['feats']
    if set(map(type, c3)) != k13:
        raise Mismatch(*k14)  # ['feats']
    first4 = c3[0]
    cols5 = None
    if set(map(len, c3)) == k15 and tuple(first4) == k16 and tuple(map(type, first4)) == k17:
        try:
            cols5 = list(zip(*map(k18, c3), strict=True))
        except KeyError:  # a sample of the same size with another key
            cols5 = None
    if cols5 is None:
        raise Mismatch(*k19)  # ['feats']
    # ['feats']
    # a block of ['feats']['f0'], ['feats']['f1'], ['feats']['f2'], ['feats']['f3'], ['feats']['f4'], ['feats']['f5'], ['feats']['f6'], ['feats']['f7'], ['feats']['f8'], ['feats
    v6 = [*cols5[0], *cols5[1], *cols5[2], *cols5[3], *cols5[4], *cols5[5], *cols5[6], *cols5[7], *cols5[8], *cols5[9], *cols5[10], *cols5[11], *cols5[12], *cols5[13], *cols5[14], *cols5[15], *cols5[16], *cols5[17], *cols5[18], *cols5[19], *cols5[20], *cols5[21], *cols5[22], *cols5[23]]
    f7 = (cols5[0][0], cols5[1][0], cols5[2][0], cols5[3][0], cols5[4][0], cols5[5][0], cols5[6][0], cols5[7][0], cols5[8][0], cols5[9][0], cols5[10][0], cols5[11][0], cols5[12][0], cols5[13][0], cols5[14][0], cols5[15][0], cols5[16][0], cols5[17][0], cols5[18][0], cols5[19][0], cols5[20][0], cols5[21][0], cols5[22][0], cols5[23][0],)
    try:
        ok8 = not HAS_TORCH_FUNCTION(v6) or set(map(type, v6)) == PLAIN
        ok8 = ok8 and set(map(TENSOR_SHAPE, f7)) == k20 and set(map(TENSOR_DTYPE, f7)) == k21
    except (TypeError, RuntimeError):  # a nested tensor has no shape
        ok8 = False
    if not ok8:
        raise Mismatch(*k22.blame(v6))
    c9 = cols1[2]
    # ['crops']
    if set(map(type, c9)) != k23 or set(map(len, c9)) != k24:
        raise Mismatch(*k25)  # ['crops']
    cols10 = list(zip(*c9, strict=True))
    # ['crops']
    # a block of ['crops'][0], ['crops'][1], ['crops'][2], ['crops'][3], ['crops'][4], ['crops'][5], ['crops'][6], ['crops'][7]
    v11 = [*cols10[0], *cols10[1], *cols10[2], *cols10[3], *cols10[4], *cols10[5], *cols10[6], *cols10[7]]
    f12 = (cols10[0][0], cols10[1][0], cols10[2][0], cols10[3][0], cols10[4][0], cols10[5][0], cols10[6][0], cols10[7][0],)
    try:
        ok13 = not HAS_TORCH_FUNCTION(v11) or set(map(type, v11)) == PLAIN
        ok13 = ok13 and set(map(TENSOR_SHAPE, f12)) == k26 and set(map(TENSOR_DTYPE, f12)) == k27
    except (TypeError, RuntimeError):  # a nested tensor has no shape
        ok13 = False
    if not ok13:
        raise Mismatch(*k28.blame(v11))
    c14 = cols1[3]
    # ['ids']
    try:
        if set(map(type, c14)) != k29 or set(map(k8, c14)) != k30 or c14[0].shape != k31:
            raise Mismatch(*k32)  # ['ids']
    except (TypeError, AttributeError, RuntimeError):
        raise Mismatch(*k33) from None
    # root
    # numbers at 'label'
    try:
        r15 = list(map(k34, samples))
    except KeyError:  # absent in a sample (missing='none'): planned for each batch
        raise Mismatch(*k35) from None
    if set(map(type, r15)) != k36:
        raise Mismatch(*k37)  # ['label']
    layout = k38
    if kind is None:  # checked only
        return layout
    buffer = allocate(618816, kind, slots, pin_slots, pin) if into is None else into
    views = Views(buffer, values, (), k39, kind == PAGEABLE)
    made = views.made
    region16 = made[k40] if k40 in made else k41.region(views)
    region17 = made[k42] if k42 in made else k43.region(views)
    region18 = made[k44] if k44 in made else k45.region(views)
    region19 = made[k46] if k46 in made else k47.region(views)
    region20 = made[k48] if k48 in made else k49.region(views)
    grad = is_grad_enabled()
    set_grad_enabled(False)  # copies into the buffer are never part of a graph
    try:
        at = 0  # ['image']
        stack(c2, out=region16)
        at = 1  # ['feats']
        k50(region17, v6)
        at = 2  # ['crops']
        k51(region18, v11)
        at = 3  # ['ids']
        stack(c14, out=region19)
        at = 4  # root
        region20.numpy()[:32] = r15
    except Exception as exc:
        raise Mismatch(*k52[at].blame((c2, v6, v11, c14, r15,)[at])) from exc
    finally:
        set_grad_enabled(grad)
    if views.source is None:  # not made at once (pinned memory): built by the layout
        return make_batch(layout, buffer, values, views)
    batch = Batch({k53: made[k54], k55: {k56: made[k57], k58: made[k59], k60: made[k61], k62: made[k63], k64: made[k65], k66: made[k67], k68: made[k69], k70: made[k71], k72: made[k73], k74: made[k75], k76: made[k77], k78: made[k79], k80: made[k81], k82: made[k83], k84: made[k85], k86: made[k87], k88: made[k89], k90: made[k91], k92: made[k93], k94: made[k95], k96: made[k97], k98: made[k99], k100: made[k101], k102: made[k103]}, k104: [made[k105], made[k106], made[k107], made[k108], made[k109], made[k110], made[k111], made[k112]], k113: made[k114], k115: made[k116]})
    set_attribute(batch, CARRIED, (layout, buffer, values))
    return batch
