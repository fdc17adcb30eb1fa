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
            return slow(samples, kind, slots, pin_slots, pin)  # the recipe, or the careful walk, takes it
        s4 = list(map(TENSOR_SHAPE, c3))
        if 0 in chain(s4) and not plain_memory(c3):  # sparse, meta or accelerator: the careful error
            return slow(samples, kind, slots, pin_slots, pin)  # the recipe, or the careful walk, takes it
    except (TypeError, AttributeError, RuntimeError):  # not tensors; a nested tensor has no shape
        return slow(samples, kind, slots, pin_slots, pin)  # the recipe, or the careful walk, takes it
    if set(map(len, s4)) != k15:
        return slow(samples, kind, slots, pin_slots, pin)  # the recipe, or the careful walk, takes it
    t10 = k16(s4[0])
    if set(map(k16, s4)) != {t10}:
        return slow(samples, kind, slots, pin_slots, pin)  # the recipe, or the careful walk, takes it
    t11 = tuple(s4[0][1:])
    row14 = prod(t11) * 4
    if not row14:  # values without elements: listed flat by the recipe
        return slow(samples, kind, slots, pin_slots, pin)  # the recipe, or the careful walk, takes it
    step12 = pitch(1, row14)
    zeros13 = k17(k18, t11, step12)
    r5 = list(map(FIRST, s4))
    g6 = gaps_to(r5, step12)  # rows of zeros after each value
    split7 = list(chain(zip(r5, g6, strict=True)))
    total8 = sum(split7)
    if not total8:  # every value empty: each its own empty tensor, by the recipe
        return slow(samples, kind, slots, pin_slots, pin)  # the recipe, or the careful walk, takes it
    pieces9 = aligned_pieces(c3, r5, g6, zeros13)
    c15 = list(cols1[2])
    # ['labels']
    try:
        if set(map(type, c15)) != k19 or set(map(TENSOR_DTYPE, c15)) != k20:
            return slow(samples, kind, slots, pin_slots, pin)  # the recipe, or the careful walk, takes it
        s16 = list(map(TENSOR_SHAPE, c15))
        if 0 in chain(s16) and not plain_memory(c15):  # sparse, meta or accelerator: the careful error
            return slow(samples, kind, slots, pin_slots, pin)  # the recipe, or the careful walk, takes it
    except (TypeError, AttributeError, RuntimeError):  # not tensors; a nested tensor has no shape
        return slow(samples, kind, slots, pin_slots, pin)  # the recipe, or the careful walk, takes it
    if set(map(len, s16)) != k21:
        return slow(samples, kind, slots, pin_slots, pin)  # the recipe, or the careful walk, takes it
    r17 = list(map(FIRST, s16))
    g18 = gaps_to(r17, k22)  # rows of zeros after each value
    split19 = list(chain(zip(r17, g18, strict=True)))
    total20 = sum(split19)
    if not total20:  # every value empty: each its own empty tensor, by the recipe
        return slow(samples, kind, slots, pin_slots, pin)  # the recipe, or the careful walk, takes it
    pieces21 = aligned_pieces(c15, r17, g18, k23)
    o22 = k24
    e23 = (o22 + total8 * row14 + ALIGN - 1) // ALIGN * ALIGN
    o24 = e23
    e25 = (o24 + total20 * k22 + ALIGN - 1) // ALIGN * ALIGN
    layout = Layout(k27, e25, None, k28, (k29, (split7, t11, o22, split19, (), o24, )))
    if kind is None:  # checked only
        return layout
    buffer = allocate(e25, kind, slots, pin_slots, pin) if into is None else into
    views = Views(buffer, values, (), ((*k30, -1, -2), (*k31, k25, k26), (*k32, (total8, *t11), (total20,)), (*k33, o22, o24)), kind == PAGEABLE)
    made = views.made
    x26 = made[-1] if -1 in made else views.tensor(k18, (total8, *t11), o22)
    x28 = made[-2] if -2 in made else views.tensor(k34, (total20,), o24)
    region30 = made[k35] if k35 in made else k36.region(views)
    grad = is_grad_enabled()
    set_grad_enabled(False)  # copies into the buffer are never part of a graph
    try:
        at = 0  # ['image']
        stack(c2, out=region30)
        at = 1  # ['boxes']
        cat(pieces9, out=x26)
        at = 2  # ['labels']
        cat(pieces21, out=x28)
    except Exception as exc:
        raise Mismatch(*k37[at].blame((c2, None, None,)[at])) from exc
    finally:
        set_grad_enabled(grad)
    if views.source is None:  # not made at once (pinned memory): built by the layout
        return make_batch(layout, buffer, values, views)
    items27 = list(x26.unsafe_split_with_sizes(split7)[0::2])
    items29 = list(x28.unsafe_split_with_sizes(split19)[0::2])
    batch = Batch({k38: made[k39], k40: items27, k41: items29})
    set_attribute(batch, CARRIED, (layout, buffer, values))
    return batch
