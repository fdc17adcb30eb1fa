"""The generated plan of the bench's video scenario (tests/test_codegen.py): kN are its constants."""

# ruff: noqa: F821

def run(samples, kind, slots, pin_slots, pin, into=None):
    if len(samples) != 8:
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
    # ['video']
    try:
        if set(map(type, c2)) != k7 or set(map(k8, c2)) != k9 or c2[0].shape != k10:
            raise Mismatch(*k11)  # ['video']
    except (TypeError, AttributeError, RuntimeError):
        raise Mismatch(*k12) from None
    c3 = cols1[1]
    # ['flow']
    try:
        if set(map(type, c3)) != k13 or set(map(k8, c3)) != k14 or c3[0].shape != k15:
            raise Mismatch(*k16)  # ['flow']
    except (TypeError, AttributeError, RuntimeError):
        raise Mismatch(*k17) from None
    # root
    # numbers at 'label'
    try:
        r4 = list(map(k18, samples))
    except KeyError:  # absent in a sample (missing='none'): planned for each batch
        raise Mismatch(*k19) from None
    if set(map(type, r4)) != k20:
        raise Mismatch(*k21)  # ['label']
    layout = k22
    if kind is None:  # checked only
        return layout
    buffer = allocate(22937728, kind, slots, pin_slots, pin) if into is None else into
    views = Views(buffer, values, (), k23, kind == PAGEABLE)
    made = views.made
    region5 = made[k24] if k24 in made else k25.region(views)
    region6 = made[k26] if k26 in made else k27.region(views)
    region7 = made[k28] if k28 in made else k29.region(views)
    grad = is_grad_enabled()
    set_grad_enabled(False)  # copies into the buffer are never part of a graph
    try:
        at = 0  # ['video']
        stack(c2, out=region5)
        at = 1  # ['flow']
        stack(c3, out=region6)
        at = 2  # root
        region7.numpy()[:8] = r4
    except Exception as exc:
        raise Mismatch(*k30[at].blame((c2, c3, r4,)[at])) from exc
    finally:
        set_grad_enabled(grad)
    if views.source is None:  # not made at once (pinned memory): built by the layout
        return make_batch(layout, buffer, values, views)
    batch = Batch({k31: made[k32], k33: made[k34], k35: made[k36]})
    set_attribute(batch, CARRIED, (layout, buffer, values))
    return batch
