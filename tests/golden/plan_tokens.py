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
    flat5 = number_tensor(c2)
    if flat5 is None or flat5.dtype not in k7:
        return slow(samples, kind, slots, pin_slots, pin, into)  # the careful walk takes it
    l3 = list(map(len, c2))
    joined6 = Joined(flat5, l3)  # the values, concatenated already
    m4 = max(l3)
    # root
    # numbers at 'label'
    try:
        r7 = list(map(k8, samples))
    except KeyError:  # absent in a sample (missing='none'): planned for each batch
        raise Mismatch(*k9) from None
    if set(map(type, r7)) != k10:
        raise Mismatch(*k11)  # ['label']
    sized = k12.get((m4,))
    if sized is None:
        sized = k13.get((m4,))
    layout, bulk, specs, ids = sized
    if kind is None:  # checked only
        return layout
    buffer = allocate(layout.nbytes, kind, slots, pin_slots, pin) if into is None else into
    views = Views(buffer, values, layout.parts, bulk, kind == PAGEABLE)
    made = views.made
    p8 = made[ids[0]] if ids[0] in made else specs[0].region(views)
    p9 = made[ids[1]] if ids[1] in made else specs[1].region(views)
    region10 = made[k16] if k16 in made else k17.region(views)
    grad = is_grad_enabled()
    set_grad_enabled(False)  # copies into the buffer are never part of a graph
    try:
        at = 0  # root
        region10.numpy()[:32] = r7
        at = 1  # ['input_ids']
        pad_1d(p8, joined6, l3, 0, k14, k15, valid_1d(l3, p9.shape[1], k15, p9.numpy()))
    except Exception as exc:
        raise Mismatch(*k18[at].blame((r7, None,)[at])) from exc
    finally:
        set_grad_enabled(grad)
    if views.source is None:  # not made at once (pinned memory): built by the layout
        return make_batch(layout, buffer, values, views)
    batch = Batch({k19: p8, k20: p9, k21: made[k22]})
    set_attribute(batch, CARRIED, (layout, buffer, values))
    return batch
