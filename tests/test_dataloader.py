"""Real DataLoaders: workers (fork and spawn), one storage per batch, one fd, the pin thread."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, default_collate
from torch.utils.data._utils.pin_memory import pin_memory as dataloader_pin

from pincollate import AsList, Batch, Concat, MMCollate, Pad, mm_collate
from pincollate._memory import receiver as _receiver
from samples import (
    LISTED,
    PARITY,
    RAGGED,
    TreeDataset,
    assert_one_buffer,
    assert_same,
    buffer_of,
    listing,
    print_ragged_warnings,
    storages,
)

pytestmark = pytest.mark.slow

WORKER_TREES = ["multimodal-dict", "tuple-samples", "namedtuple", "numpy-arrays", "deep", "strings"]


def _batches(dataset, collate, **kwargs):
    if kwargs.get("num_workers"):
        kwargs.setdefault("timeout", 60)
    loader = DataLoader(dataset, batch_size=4, collate_fn=collate, **kwargs)
    return list(loader)


@pytest.mark.parametrize("name", WORKER_TREES)
@pytest.mark.parametrize("workers", [0, 2])
def test_parity_through_dataloader(name, workers):
    dataset = TreeDataset(name)
    ours = _batches(dataset, mm_collate, num_workers=workers)
    theirs = _batches(dataset, default_collate, num_workers=0)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert_same(a, b)
        assert_one_buffer(a)


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("slots", [0, 8])
def test_worker_batches_share_one_storage(context, slots):
    dataset = TreeDataset("multimodal-dict", repeat=3)
    loader = DataLoader(
        dataset,
        batch_size=4,
        collate_fn=MMCollate(worker_slots=slots),
        num_workers=2,
        multiprocessing_context=context,
        timeout=60,
    )
    iterator = iter(loader)
    for batch in iterator:
        assert type(batch) is Batch
        assert len(storages(batch)) == 1
        if slots:
            assert _receiver.leased(batch["image"])  # a view of a worker slot this process maps
        else:
            assert buffer_of(batch).untyped_storage().is_shared()


@pytest.mark.parametrize("name", ["unequal-lists", "mixed-dtypes", "ragged-boxes"])
def test_ragged_results_are_the_same_in_workers_and_main_process(name, capfd):
    dataset = TreeDataset(name)
    in_workers = _batches(dataset, MMCollate(), num_workers=2, worker_init_fn=print_ragged_warnings)
    with listing(name):
        in_main = _batches(dataset, MMCollate(), num_workers=0)
    for a, b in zip(in_workers, in_main, strict=True):
        assert_same(a, b)
    # The process that collates warns: each of the two workers once for the listed field, on its stderr.
    assert capfd.readouterr().err.count("RaggedFieldWarning: pincollate:") == (2 if name in LISTED else 0)


def _storages_received(received, collate, dataset, keep=False):
    """Storages the main process received over one epoch, and how many batches it had."""
    loader = DataLoader(
        dataset, batch_size=4, collate_fn=collate, num_workers=2, multiprocessing_context="fork", timeout=60
    )
    received[0] = 0
    kept, count = [], 0
    for batch in loader:
        count += 1
        if keep:
            kept.append(batch)
    return received[0], count


def test_one_file_descriptor_per_worker_batch_without_the_ring(storages_received):
    dataset = TreeDataset("multimodal-dict", repeat=4)  # 16 samples, 4 batches
    fds, batches = _storages_received(storages_received, MMCollate(worker_slots=0), dataset)
    assert fds == batches == 4
    # image, audio, tokens, label, score, flag and meta.boxes: one storage each.
    fds, batches = _storages_received(storages_received, default_collate, dataset)
    assert fds == 7 * batches


def test_ring_slots_cross_once(storages_received):
    # 40 batches, each dropped at once: each worker's slots (and its state array)
    # cross once; every later batch crosses as a slot index.
    dataset = TreeDataset("multimodal-dict", repeat=40)
    fds, batches = _storages_received(storages_received, MMCollate(worker_slots=8), dataset)
    assert batches == 40
    assert fds <= 2 * (8 + 1) and fds < batches / 2


def test_ring_full_takes_fresh_buffers(storages_received):
    # Every batch kept: each worker's one slot stays leased, later batches take fresh buffers.
    dataset = TreeDataset("multimodal-dict", repeat=10)
    fds, batches = _storages_received(storages_received, MMCollate(worker_slots=1), dataset, keep=True)
    assert batches == 10
    assert fds == batches - 2 + 2 * 2  # fresh buffers, plus each worker's slot and state array once


@pytest.mark.parametrize("name", ["multimodal-dict", "tuple-samples", "namedtuple", "list-samples"])
def test_pin_thread_makes_one_pinned_copy_per_batch(pretend_accelerator, fake_pinned, name):
    dataset = TreeDataset(name, repeat=4)
    loader = DataLoader(dataset, batch_size=4, collate_fn=MMCollate(), num_workers=2, pin_memory=True, timeout=60)
    batches = list(loader)
    assert len(fake_pinned) == len(batches)
    for batch in batches:
        assert len(storages(batch)) == 1
    reference = _batches(dataset, default_collate)
    for a, b in zip(batches, reference, strict=True):
        assert_same(a, b)


def test_inline_pinning_allocates_pinned_directly(pretend_accelerator, fake_pinned):
    # num_workers=0: the buffer is allocated pinned, and DataLoader's pin step
    # finds it pinned and copies nothing more.
    dataset = TreeDataset("multimodal-dict", repeat=2)
    loader = DataLoader(dataset, batch_size=4, collate_fn=MMCollate(pin_memory="auto"), num_workers=0, pin_memory=True)
    batches = list(loader)
    assert len(fake_pinned) == len(batches) == 2
    assert all(len(storages(b)) == 1 for b in batches)


@pytest.mark.parametrize("name", ["multimodal-dict", "namedtuple", "tuple-samples", "unequal-lists"])
def test_torch_pin_memory_function_uses_the_batch_own_pin(fake_pinned, name):
    # What DataLoader's pin thread calls: one pinned allocation per batch, not per leaf.
    with listing(name):
        batch = MMCollate(pin_memory=False)((PARITY.get(name) or RAGGED[name])())
    pinned = dataloader_pin(batch)
    assert len(fake_pinned) == 1
    assert type(pinned) is type(batch) and len(storages(pinned)) == 1
    assert_same(pinned, batch)


def test_persistent_workers_many_epochs():
    dataset = TreeDataset("multimodal-dict", repeat=2)
    loader = DataLoader(
        dataset, batch_size=4, collate_fn=mm_collate, num_workers=2, persistent_workers=True, timeout=60
    )
    for _ in range(5):
        batches = list(loader)
        assert len(batches) == 2 and all(len(storages(b)) == 1 for b in batches)


class _BareTokens(torch.utils.data.Dataset):
    """Samples that are token tensors themselves, of 1 to 40 tokens."""

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.arange(1 + (7 * i) % 40) + i


@pytest.mark.parametrize(
    "policy",
    [Pad(lengths_key=None, mask_key=None), Concat(offsets_key=None, counts_key=None, item_offsets_key=None), AsList()],
    ids=["pad", "concat", "aslist"],
)
def test_a_batch_whose_samples_are_its_part_crosses_from_workers(policy):
    # The generated function makes a bare tensor (or list) of the samples, which crosses tensor by
    # tensor: every batch of two epochs is kept and compared with the walk's, after the workers
    # made many more batches than their rings have slots.
    expected = _batches(_BareTokens(), MMCollate(ragged=policy, compile=False))
    loader = DataLoader(
        _BareTokens(), batch_size=4, num_workers=2, collate_fn=MMCollate(ragged=policy, worker_slots=2), timeout=60
    )
    kept = [batch for _ in range(2) for batch in loader]
    for batch, reference in zip(kept, expected * 2, strict=True):
        assert_same(batch, reference)


def _report(batch, queue):
    queue.put((type(batch).__name__, batch["x"].tolist(), batch.layout is not None))


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_batch_crosses_to_a_spawned_process_and_a_spawned_workers_dataset(context):
    # Pickled for a process's launch, a batch crossed as a shared-memory descriptor of a storage
    # made for the pickle: closed before the launch, so the child failed ("unable to resize
    # file") and a spawned DataLoader refused its dataset ("bad value(s) in fds_to_keep").
    import multiprocessing

    made = mm_collate([{"x": torch.arange(3.0)}, {"x": torch.ones(3)}])
    from_worker = next(
        iter(
            DataLoader(
                [{"x": torch.full((3,), 2.0)}] * 4, batch_size=2, num_workers=1, collate_fn=mm_collate, timeout=60
            )
        )
    )
    ctx = multiprocessing.get_context(context)
    for batch in (made, from_worker):
        queue = ctx.Queue()
        child = ctx.Process(target=_report, args=(batch, queue))
        child.start()
        assert queue.get(timeout=120) == ("Batch", batch["x"].tolist(), True)
        child.join(60)
        assert child.exitcode == 0
    loader = DataLoader([made, made], batch_size=None, num_workers=2, multiprocessing_context=context, timeout=60)
    got = list(loader)
    assert [type(b) for b in got] == [Batch, Batch] and all(torch.equal(b["x"], made["x"]) for b in got)
    assert torch.equal(made["x"], torch.stack([torch.arange(3.0), torch.ones(3)]))  # the sender's batch as it was
