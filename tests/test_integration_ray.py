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
from samples import assert_one_buffer, assert_same  # noqa: E402

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
    planner = collate._samples._planner
    walked = []
    plan = planner.plan
    planner.plan = lambda values, path, keyed=False: (
        walked.append((path, type(values).__name__)) or plan(values, path, keyed)
    )
    batches = list(collate.iter_torch_batches(ds, batch_size=4))
    # Read from Arrow's buffers as one flat tensor (no array per row, no read-only warning),
    # which the walk takes whole.
    assert set(walked) == {(("ids",), "Joined"), (("name",), "list")}
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


def _arrow_items(n: int = 13) -> list[dict]:
    rng = np.random.default_rng(1)
    return [
        {
            "tokens": np.arange(i % 5 + 1, dtype=np.int64) + 10 * i,  # 1-D rows, one of them short
            "patches": rng.random((i % 3 + 1, 4)).astype(np.float32),  # (n_i, 4): trailing dims shared
            "crops": np.full((i % 2 + 1, i % 3 + 1), i, np.uint8),  # trailing dims differ: Ray's conversion
            "image": rng.random((3, 2, 2)).astype(np.float32),  # fixed shape
            "count": i,
            "score": float(i) / 7,
            "name": f"row {i}",
        }
        for i in range(n)
    ]


POLICIES = {
    "none": {},
    "pad": {"fields": {"tokens": pincollate.Pad(), "patches": pincollate.Pad(mask_key="patches_mask")}},
    "concat": {"fields": {"tokens": pincollate.Concat(), "patches": pincollate.Concat()}},
    "jagged": {"fields": {"tokens": pincollate.Jagged(), "patches": pincollate.Jagged()}},
    "aslist": {"ragged": pincollate.AsList()},
}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_an_arrow_table_collates_as_rays_numpy_batch_does(cluster, policy):
    # Blocks of 4 rows, batches of 5: batches that span blocks (several chunks) and start
    # inside one (sliced arrays, offsets that do not start at 0).
    ds = ray.data.from_items(_arrow_items(), override_num_blocks=3).materialize()
    tables = list(ds.iter_batches(batch_size=5, batch_format="pyarrow"))
    arrays = list(ds.iter_batches(batch_size=5, batch_format="numpy"))
    assert any(t.column("tokens").num_chunks > 1 for t in tables)
    from_arrow = pincollate.ColumnCollate(**POLICIES[policy])
    from_numpy = pincollate.ColumnCollate(**POLICIES[policy])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no read-only warning from torch, no new RaggedFieldWarning
        warnings.filterwarnings("ignore", category=pincollate.RaggedFieldWarning)
        for _ in range(2):  # the first batches plan, the second pass runs the settled plans
            for table, array in zip(tables, arrays, strict=True):
                ours = from_arrow(table)
                assert_same(ours, from_numpy(array))
                assert_one_buffer(ours)
    # The ragged rows were read from Arrow's buffers, joined: no array per row.
    from pincollate._integrations.arrow import arrow_columns
    from pincollate._plan.padding import Joined

    columns = arrow_columns(tables[1])
    assert type(columns["tokens"]) is Joined and type(columns["patches"]) is Joined
    assert columns["tokens"].lengths == [len(row) for row in arrays[1]["tokens"]]


@pytest.mark.parametrize(
    ("rows", "policy"),
    [
        ([np.arange(3) + i for i in range(4)], pincollate.Stack()),  # ragged in type, not in this batch
        ([np.arange(i + 1) for i in range(1)], pincollate.Stack()),  # one row
        ([np.zeros((i + 1, 0), np.float32) for i in range(3)], None),  # a zero trailing dim
        ([np.zeros((i + 1, 0), np.float32) for i in range(3)], pincollate.Pad()),
    ],
    ids=["stack-agreeing", "stack-one-row", "zero-trailing", "zero-trailing-pad"],
)
def test_edge_columns_from_arrow_collate_as_their_numpy_batch(cluster, rows, policy):
    ds = ray.data.from_items([{"x": row} for row in rows] + [{"x": np.ones((5, *rows[0].shape[1:]), rows[0].dtype)}])
    table = next(iter(ds.iter_batches(batch_size=len(rows), batch_format="pyarrow")))
    array = next(iter(ds.iter_batches(batch_size=len(rows), batch_format="numpy")))
    settings = {} if policy is None else {"fields": {"x": policy}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pincollate.RaggedFieldWarning)
        assert_same(pincollate.ColumnCollate(**settings)(table), pincollate.ColumnCollate(**settings)(array))


def test_an_arrow_column_arrow_cannot_hand_over_whole_is_converted_as_ray_converts_it(cluster):
    # Lists of numbers with a None row, booleans (bit-packed): as Ray converts them to numpy.
    items = [{"ids": None if i == 2 else list(range(i + 1)), "flag": bool(i % 2)} for i in range(4)]
    table = next(iter(ray.data.from_items(items).iter_batches(batch_size=4, batch_format="pyarrow")))
    array = next(iter(ray.data.from_items(items).iter_batches(batch_size=4, batch_format="numpy")))
    settings = {"fields": {"ids": pincollate.Pad()}, "missing": "none"}
    assert_same(pincollate.ColumnCollate(**settings)(table), pincollate.ColumnCollate(**settings)(array))


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
