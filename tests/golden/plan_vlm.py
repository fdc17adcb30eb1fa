"""The generated plan of the bench's vlm scenario (tests/test_codegen.py): kN are its constants."""

# ruff: noqa: F821

def run(samples, kind, slots, pin_slots, pin, into=None):
    if len(samples) != 16:
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
    c2 = list(cols1[0])
    # ['input_ids']
    try:
        if set(map(type, c2)) != k7 or set(map(TENSOR_DTYPE, c2)) != k8:
            return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
        s5 = list(map(TENSOR_SHAPE, c2))
        if 0 in chain(s5) and not plain_memory(c2):  # sparse, meta or accelerator: the careful error
            return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
    except (TypeError, AttributeError, RuntimeError):  # not tensors; a nested tensor has no shape
        return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
    if set(map(len, s5)) != k9:
        return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
    l3 = list(map(FIRST, s5))
    m4 = max(l3)
    c6 = list(cols1[1])
    # ['pixel_values']
    if set(map(type, c6)) - k10:
        return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
    n7 = list(map(len, c6))
    v8 = list(chain(c6))
    try:
        if not v8 or set(map(type, v8)) != k11 or set(map(TENSOR_DTYPE, v8)) != k12:
            return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
        s9 = list(map(TENSOR_SHAPE, v8))
        if not plain_memory(v8):  # sparse, meta or accelerator: the careful error
            return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
    except (TypeError, AttributeError, RuntimeError):  # not tensors; a nested tensor has no shape
        return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
    if set(map(len, s9)) != k13:
        return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
    t10 = k14(s9[0])
    if set(map(k14, s9)) != {t10}:
        return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
    t11 = tuple(s9[0][1:])
    r12 = list(map(FIRST, s9))
    m13 = (sum(r12), t11, len(v8))
    if m13[0] > INT32_MAX:  # Concat's int32 offsets cannot hold it: the careful error
        return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
    sized = k15.get((m4, m13,))
    if sized is None:
        sized = k16.get((m4, m13,))
    layout, bulk, specs, ids = sized
    if kind is None:  # checked only
        return layout
    buffer = allocate(layout.nbytes, kind, slots, pin_slots, pin) if into is None else into
    views = Views(buffer, values, layout.parts, bulk, kind == PAGEABLE)
    made = views.made
    p14 = made[ids[0]] if ids[0] in made else specs[0].region(views)
    p15 = made[ids[1]] if ids[1] in made else specs[1].region(views)
    p16 = made[ids[2]] if ids[2] in made else specs[2].region(views)
    p17 = made[ids[3]] if ids[3] in made else specs[3].region(views)
    _io18, o19 = concat_offsets(r12, n7)
    grad = is_grad_enabled()
    set_grad_enabled(False)  # copies into the buffer are never part of a graph
    try:
        at = 0  # ['input_ids']
        pad_1d(p14, c2, l3, 0, k17, k18, valid_1d(l3, p15.shape[1], k18, p15.numpy()))
        at = 1  # ['pixel_values']
        cat(nonempty(v8, r12), out=p16)
        at = 2  # ['pixel_values']
        if p17.dtype in NARROW:  # a number past its range is inf, unwarned
            k19(p17, o19)
        else:
            p17.numpy()[...] = o19
    except Exception as exc:
        raise Mismatch(*k20[at].blame((None, None, None,)[at])) from exc
    finally:
        set_grad_enabled(grad)
    if views.source is None:  # not made at once (pinned memory): built by the layout
        return make_batch(layout, buffer, values, views)
    batch = Batch({k21: p14, k22: p15, k23: p16, k24: p17})
    set_attribute(batch, CARRIED, (layout, buffer, values))
    return batch
