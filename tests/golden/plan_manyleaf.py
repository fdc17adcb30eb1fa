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
        return layout
    buffer = allocate(419136, kind, slots, pin_slots, pin) if into is None else into
    views = Views(buffer, values, (), k30, kind == PAGEABLE)
    made = views.made
    region12 = made[k31] if k31 in made else k32.region(views)
    region13 = made[k33] if k33 in made else k34.region(views)
    region14 = made[k35] if k35 in made else k36.region(views)
    region15 = made[k37] if k37 in made else k38.region(views)
    region16 = made[k39] if k39 in made else k40.region(views)
    grad = is_grad_enabled()
    set_grad_enabled(False)  # copies into the buffer are never part of a graph
    try:
        at = 0  # ['image']
        stack(c2, out=region12)
        at = 1  # root
        k41(region13, v4)
        at = 2  # root
        k42(region14, v7)
        at = 3  # root
        k43(region15, r10)
        at = 4  # root
        k43(region16, r11)
    except Exception as exc:
        raise Mismatch(*k44[at].blame((c2, v4, v7, r10, r11,)[at])) from exc
    finally:
        set_grad_enabled(grad)
    if views.source is None:  # not made at once (pinned memory): built by the layout
        return make_batch(layout, buffer, values, views)
    batch = Batch({k45: made[k46], k47: made[k48], k49: made[k50], k51: made[k52], k53: made[k54], k55: made[k56], k57: made[k58], k59: made[k60], k61: made[k62], k63: made[k64], k65: made[k66], k67: made[k68], k69: made[k70], k71: made[k72], k73: made[k74], k75: made[k76], k77: made[k78], k79: made[k80], k81: made[k82], k83: made[k84], k85: made[k86], k87: made[k88], k89: made[k90], k91: made[k92], k93: made[k94], k95: made[k96], k97: made[k98], k99: made[k100], k101: made[k102], k103: made[k104], k105: made[k106], k107: made[k108], k109: made[k110], k111: made[k112], k113: made[k114], k115: made[k116], k117: made[k118], k119: made[k120], k121: made[k122], k123: made[k124], k125: made[k126], k127: made[k128], k129: values[0]})
    set_attribute(batch, CARRIED, (layout, buffer, values))
    return batch
