"""The generated plan of the bench's ragged scenario (tests/test_codegen.py): kN are its constants."""

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
            cols1 = [list(map(k5, samples))]
        except KeyError:  # a sample of the same size with another key
            cols1 = None
    if cols1 is None:
        raise Mismatch(*k6)  # root
    c2 = list(cols1[0])
    # ['tokens']
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
    # root
    # numbers at 'label'
    try:
        r6 = list(map(k10, samples))
    except KeyError:  # absent in a sample (missing='none'): planned for each batch
        raise Mismatch(*k11) from None
    if set(map(type, r6)) != k12:
        raise Mismatch(*k13)  # ['label']
    sized = k14.get((m4,))
    if sized is None:
        sized = k15.get((m4,))
    layout, bulk, specs, ids = sized
    if kind is None:  # checked only
        return layout
    buffer = allocate(layout.nbytes, kind, slots, pin_slots, pin) if into is None else into
    views = Views(buffer, values, layout.parts, bulk, kind == PAGEABLE)
    made = views.made
    p7 = made[ids[0]] if ids[0] in made else specs[0].region(views)
    p8 = made[ids[1]] if ids[1] in made else specs[1].region(views)
    region9 = made[k18] if k18 in made else k19.region(views)
    grad = is_grad_enabled()
    set_grad_enabled(False)  # copies into the buffer are never part of a graph
    try:
        at = 0  # root
        region9.numpy()[:32] = r6
        at = 1  # ['tokens']
        if p8.dtype in NARROW:  # a number past its range is inf, unwarned
            k20(p8, l3)
        else:
            p8.numpy()[...] = l3
        at = 2  # ['tokens']
        pad_1d(p7, c2, l3, 0, k16, k17, None)
    except Exception as exc:
        raise Mismatch(*k21[at].blame((r6, None, None,)[at])) from exc
    finally:
        set_grad_enabled(grad)
    if views.source is None:  # not made at once (pinned memory): built by the layout
        return make_batch(layout, buffer, values, views)
    batch = Batch({k22: p7, k23: p8, k24: made[k25]})
    set_attribute(batch, CARRIED, (layout, buffer, values))
    return batch
