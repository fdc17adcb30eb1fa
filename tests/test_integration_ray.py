"""Ray Data and Ray Train on a real local cluster (2 CPUs): parity, policies, the data-side path, a fit."""

from __future__ import annotations

import pathlib
import sys
import warnings

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")
pytest.importorskip("ray.train")

import pincollate  # noqa: E402
from pincollate._batch.trees import tensors  # noqa: E402
from samples import assert_one_buffer  # noqa: E402

pytestmark = pytest.mark.slow

EXAMPLES = str(pathlib.Path(__file__).parent.parent / "examples")
sys.path.insert(0, EXAMPLES)


@pytest.fixture(scope="module")
def cluster():
    # The training function lives in examples/ray_train.py: Ray's workers import it by name.
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": EXAMPLES}},
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def _items(n: int = 12) -> list[dict]:
    rng = np.random.default_rng(0)
    return [
        {
            "image": rng.random((3, 4, 4)).astype(np.float32),
            "count": i,
            "score": float(i) / 3,
            "flag": bool(i % 2),
            "ids": np.arange(i % 4 + 1) + i,
            "name": f"sample {i}",
        }
        for i in range(n)
    ]


def test_dense_columns_arrive_as_a_batch_equal_to_rays_own_conversion(cluster):
    ds = ray.data.from_items([{k: v for k, v in item.items() if k not in ("ids", "name")} for item in _items()])
    theirs = list(ds.iter_torch_batches(batch_size=5, device="cpu"))
    collate = pincollate.ColumnCollate()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = list(collate.iter_torch_batches(ds, batch_size=5))
    # Neither Ray's deprecation of plain collate functions, torch's read-only array warning, nor ours.
    assert not [str(w.message) for w in caught if "collate" in str(w.message) or "writable" in str(w.message)]
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs, strict=True):
        # Every column a tensor: Ray's finalize step would have rebuilt this as a plain dict.
        assert type(a) is pincollate.Batch and a.layout is not None
        assert list(a) == list(b)
        for key in b:
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
        assert_one_buffer(a)
    batches = collate.iter_torch_batches(ds, batch_size=5)
    for _ in batches:
        break  # leaving early closes Ray's iterator; each for is a new pass
    assert len(list(batches)) == 3


def test_rays_own_iterator_turns_such_a_batch_into_a_dict_and_for_ray_says_so(cluster):
    ds = ray.data.from_items([{"x": np.float32(i), "y": i} for i in range(6)])
    collate_fn = pincollate.ColumnCollate().for_ray()
    with pytest.warns(UserWarning, match="rebuilds a batch whose columns are all tensors as a plain dict") as warned:
        plain = list(ds.iter_torch_batches(batch_size=3, collate_fn=collate_fn, device="cpu"))
    assert len(warned) == 1 and [type(batch) for batch in plain] == [dict, dict]


def test_ragged_and_string_columns_through_rays_iterator(cluster):
    ds = ray.data.from_items(_items())
    collate = pincollate.ColumnCollate(fields={"ids": pincollate.Pad(mask_key="mask")})
    batches = list(collate.iter_torch_batches(ds, batch_size=4))
    # Ray's rows are read-only: planned once, concatenated once, without torch's warning.
    assert type(collate._recipes[("ids",)]).__name__ == "Arrays"
    names = [name for batch in batches for name in batch["name"]]
    assert names == [f"sample {i}" for i in range(12)]
    first = batches[0]
    assert first["ids"].tolist() == [[0, 0, 0, 0], [1, 2, 0, 0], [2, 3, 4, 0], [3, 4, 5, 6]]
    assert first["mask"].sum(1).tolist() == [1, 2, 3, 4]
    assert first.layout is not None
    assert_one_buffer(first)


def test_collated_on_the_data_side_arrives_as_one_buffer(cluster):
    collate = pincollate.ColumnCollate(fields={"ids": pincollate.Concat()})
    packed = ray.data.from_items(_items()).map_batches(collate.pack, batch_size=4)
    trainer_side = list(collate.iter_torch_batches(packed, batch_size=1, unpack=True))
    local = [
        collate({key: _column([item[key] for item in _items()[i : i + 4]]) for key in _items()[0]}) for i in (0, 4, 8)
    ]
    assert len(trainer_side) == 3
    trainer_side.sort(key=lambda batch: int(batch["count"][0]))  # Ray Data may reorder blocks
    for ours, expected in zip(trainer_side, local, strict=True):
        assert ours.layout == expected.layout and ours["name"] == expected["name"]
        for key in ("image", "count", "ids", "ids_offsets"):
            assert torch.equal(ours[key], expected[key]), key
        assert_one_buffer(ours)


def test_input_meter_over_rays_iterator(cluster):
    ds = ray.data.from_items(_items())
    collate = pincollate.ColumnCollate(fields={"ids": pincollate.Pad()})
    meter = pincollate.InputMeter(ds.iter_torch_batches(batch_size=4, collate_fn=collate.for_ray(), device="cpu"))
    batches = list(meter)
    assert (meter.epoch.batches, meter.epoch.samples) == (3, 12)
    assert meter.epoch.batch_bytes == sum(b.layout.nbytes for b in batches)
    assert 0.0 <= meter.epoch.input_bound <= 1.0


def test_through_the_prefetcher_each_batch_is_one_pinned_copy_and_one_move(cluster, fake_pinned, monkeypatch):
    # What a CPU can show of one DMA per batch: one pinned allocation, and one copy to the
    # device ("meta" stands in for an accelerator) of the batch's one buffer.
    from pincollate._batch import moving, spans

    copies = []
    real = moving.copy_to_device

    def counted(source, device, non_blocking):
        copies.append(source.numel())
        return real(source, device, non_blocking)

    monkeypatch.setattr(moving, "copy_to_device", counted)
    monkeypatch.setattr(spans, "copy_to_device", counted)
    collate = pincollate.ColumnCollate(pin_memory=False, fields={"ids": pincollate.Pad()})
    prefetcher = pincollate.Prefetcher(
        collate.iter_torch_batches(ray.data.from_items(_items()), batch_size=4), device="meta", pin_memory=True
    )
    batches = list(prefetcher)
    assert len(batches) == len(fake_pinned) == len(copies) == 3
    for batch, nbytes in zip(batches, copies, strict=True):
        assert type(batch) is pincollate.Batch and batch.buffer.device.type == "meta"
        assert nbytes == batch.layout.nbytes and all(t.device.type == "meta" for t in tensors(batch))


def _column(values: list) -> np.ndarray:
    if isinstance(values[0], np.ndarray) and len({v.shape for v in values}) > 1:
        column = np.empty(len(values), dtype=object)
        column[:] = values
        return column
    return np.array(values)


def test_torch_trainer_fits_with_two_workers(cluster):
    # The README's recipe (trainer side); the data side's path is checked above, without a fit.
    from ray_train import fit

    rows = fit(epochs=2, pack=False, count=128)
    assert sorted({row["rank"] for row in rows}) == [0, 1]
    assert all(row["batches"] == 4 for row in rows)  # 128 samples, 2 ranks, 16 a batch
    assert all(row["kinds"] == ["Batch"] for row in rows)  # each batch whole, through Ray Train too
    first = [row["loss"] for row in rows if row["epoch"] == 0]
    last = [row["loss"] for row in rows if row["epoch"] == 1]
    assert max(last) < min(first)


def test_the_bench_ray_rows_run_on_the_cluster(cluster, capsys, tmp_path):
    import json

    from pincollate import bench

    out = tmp_path / "ray.json"
    assert bench.main(["--ray", "--quick", "--no-progress", "--json", str(out)]) == 0
    report = json.loads(out.read_text())["ray"]["results"]
    for scenario in ("manyleaf", "ragged", "vlm"):
        rows = report[scenario]
        assert set(rows) == {"Ray's own conversion", "ColumnCollate, trainer side", "ColumnCollate, data side"}
        assert rows["Ray's own conversion"]["ratio"] == 1.0
        assert all(row["batches_per_s"] > 0 for row in rows.values())
    assert "x Ray" in capsys.readouterr().out
    assert ray.is_initialized()  # the module's cluster, left running for the tests after this one
