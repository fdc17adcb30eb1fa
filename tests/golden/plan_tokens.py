"""The generated plan of the bench's tokens scenario (tests/test_codegen.py): kN are its constants."""

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
    # ['input_ids']
    flat6 = number_tensor(c2)
    if flat6 is None or flat6.dtype not in k7:
        return slow(samples, kind, slots, pin_slots, pin)  # the recipe, or the careful walk, takes it
    l4 = list(map(len, c2))
    joined7 = Joined(flat6, l4)  # the values, concatenated already
    m5 = max(l4)
    # root
    # numbers at 'label'
    try:
        r8 = list(map(k8, samples))
    except KeyError:  # absent in a sample (missing='none'): planned for each batch
        raise Mismatch(*k9) from None
    if set(map(type, r8)) != k10:
        raise Mismatch(*k11)  # ['label']
    sized = k12.get((m5,))
    if sized is None:
        sized = k13.get((m5,))
    layout, bulk, specs, ids = sized
    if kind is None:  # checked only
        return layout
    buffer = allocate(layout.nbytes, kind, slots, pin_slots, pin) if into is None else into
    views = Views(buffer, values, layout.parts, bulk, kind == PAGEABLE)
    made = views.made
    p9 = made[ids[0]] if ids[0] in made else specs[0].region(views)
    p10 = made[ids[1]] if ids[1] in made else specs[1].region(views)
    region11 = made[k16] if k16 in made else k17.region(views)
    grad = is_grad_enabled()
    set_grad_enabled(False)  # copies into the buffer are never part of a graph
    try:
        at = 0  # root
        region11.numpy()[:32] = r8
        at = 1  # ['input_ids']
        pad_1d(p9, joined7, l4, 0, k14, k15, valid_1d(l4, p10.shape[1], k15, p10.numpy()))
    except Exception as exc:
        raise Mismatch(*k18[at].blame((r8, None,)[at])) from exc
    finally:
        set_grad_enabled(grad)
    if views.source is None:  # not made at once (pinned memory): built by the layout
        return make_batch(layout, buffer, values, views)
    batch = Batch({k19: p9, k20: p10, k21: made[k22]})
    set_attribute(batch, CARRIED, (layout, buffer, values))
    return batch
