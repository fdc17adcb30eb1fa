"""The generated plan of the bench's detection scenario (tests/test_codegen.py): kN are its constants."""

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
    c3 = list(cols1[1])
    # ['boxes']
    try:
        if set(map(type, c3)) != k13 or set(map(TENSOR_DTYPE, c3)) != k14:
            return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
        s4 = list(map(TENSOR_SHAPE, c3))
        if 0 in chain(s4) and not plain_memory(c3):  # sparse, meta or accelerator: the careful error
            return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
    except (TypeError, AttributeError, RuntimeError):  # not tensors; a nested tensor has no shape
        return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
    if set(map(len, s4)) != k15:
        return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
    r5, step11, t10, shaped14 = k16.geometry(s4)
    v15 = c3
    if shaped14 is not None:
        if not plain_memory(c3):
            return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
        v15 = list(map(FLAT, c3))
    row13 = prod(t10) * 4
    zeros12 = k17(k18, t10, step11)
    g6 = gaps_to(r5, step11)  # rows of zeros after each value
    split7 = list(chain(zip(r5, g6, strict=True)))
    total8 = sum(split7)
    pieces9 = aligned_pieces(v15, r5, g6, zeros12)
    c16 = list(cols1[2])
    # ['labels']
    try:
        if set(map(type, c16)) != k19 or set(map(TENSOR_DTYPE, c16)) != k20:
            return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
        s17 = list(map(TENSOR_SHAPE, c16))
        if 0 in chain(s17) and not plain_memory(c16):  # sparse, meta or accelerator: the careful error
            return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
    except (TypeError, AttributeError, RuntimeError):  # not tensors; a nested tensor has no shape
        return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
    if set(map(len, s17)) != k21:
        return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
    r18 = list(map(FIRST, s17))
    g19 = gaps_to(r18, k22)  # rows of zeros after each value
    split20 = list(chain(zip(r18, g19, strict=True)))
    total21 = sum(split20)
    pieces22 = aligned_pieces(c16, r18, g19, k23)
    o23 = k24
    e24 = (o23 + total8 * row13 + ALIGN - 1) // ALIGN * ALIGN
    o25 = e24
    e26 = (o25 + total21 * k22 + ALIGN - 1) // ALIGN * ALIGN
    layout = Layout(k27, e26, None, k28, (k29, (split7, t10, o23, shaped14, split20, (), o25, )))
    if kind is None:  # checked only
        return layout
    buffer = allocate(e26, kind, slots, pin_slots, pin) if into is None else into
    views = Views(buffer, values, (), ((*k30, -1, -2), (*k31, k25, k26), (*k32, (total8, *t10), (total21,)), (*k33, o23, o25)), kind == PAGEABLE)
    made = views.made
    x27 = made[-1] if total8 and -1 in made else views.tensor(k18, (total8, *t10), o23)
    x29 = made[-2] if total21 and -2 in made else views.tensor(k34, (total21,), o25)
    region31 = made[k35] if k35 in made else k36.region(views)
    grad = is_grad_enabled()
    set_grad_enabled(False)  # copies into the buffer are never part of a graph
    try:
        at = 0  # ['image']
        stack(c2, out=region31)
        at = 1  # ['boxes']
        cat(pieces9, out=x27)
        at = 2  # ['labels']
        cat(pieces22, out=x29)
    except Exception as exc:
        raise Mismatch(*k37[at].blame((c2, None, None,)[at])) from exc
    finally:
        set_grad_enabled(grad)
    if views.source is None:  # not made at once (pinned memory): built by the layout
        return make_batch(layout, buffer, values, views)
    items28 = list(x27.unsafe_split_with_sizes(split7)[0::2]) if shaped14 is None else split_views(x27, split7, shaped14)
    items30 = list(x29.unsafe_split_with_sizes(split20)[0::2])
    batch = Batch({k38: made[k39], k40: items28, k41: items30})
    set_attribute(batch, CARRIED, (layout, buffer, values))
    return batch
