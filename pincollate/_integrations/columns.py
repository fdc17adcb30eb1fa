"""Columnar batches: a dict of arrays, one per column, into one buffer.

Ray Data (``iter_torch_batches(collate_fn=...)``, ``map_batches``) and other columnar
pipelines hand a collate function a whole batch at once, column by column: dense
numeric columns as one array each, variable-shape columns as object arrays of
per-row arrays, strings as object or unicode arrays. :class:`ColumnCollate` takes
such a batch into one buffer with the same policies as :class:`~pincollate.MMCollate`:
a dense column is one copy, a ragged one goes through its policy (``Pad``,
``Concat``, ``Jagged``, ``AsList``) with the row as the sample, walked by the careful
planner as :class:`~pincollate.MMCollate`'s first batch of a structure is: rows read from
Arrow stay one tensor (described from it and its lengths, copied from it whole).

For collating on the data side, :meth:`ColumnCollate.pack` turns the collated batch
into a one-row columnar batch (its buffer as one ``uint8`` array, its layout and
non-tensor values pickled beside it), which crosses an object store as one array;
:meth:`ColumnCollate.unpack` makes it a batch again with one copy, pinned where the
process pins.
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Hashable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any, Literal

import numpy as np
import torch

from .._batch.batch import carried, make_batch
from .._batch.layout import Layout, Spec
from .._batch.specs import MappingSpec
from .._batch.views import START
from .._collate.collate import MMCollate
from .._errors import EXTRA_NAMES, CollateError
from .._memory.arena import PinMode, allocate, resolve_kind
from .._plan.fill import Fill, Node, Segment, TensorNode, Value
from .._plan.padding import Joined
from .._plan.patterns import Fields
from .._plan.policies import Policy, Stack
from .._types.builtin import fill_numbers, torch_dtype
from .._types.leaves import type_name
from .arrow import arrow_columns, is_arrow_table

__all__ = ["ColumnCollate"]

#: The columns a packed batch travels in: its bytes, and its layout and values pickled.
BUFFER, LAYOUT = "pincollate_buffer", "pincollate_layout"
_NUMERIC = frozenset("biufc")


class ColumnCollate:
    """Collate a columnar batch (a mapping of column name to array) into one buffer.

    A dense numeric column (``bool``, ints, floats, complex; a tensor of a dtype numpy
    lacks, ``bfloat16`` say) is one tensor of the column's shape, under no policy or
    ``Stack``; the other policies (``Pad``, ``Concat``, ``Jagged``, ``AsList``,
    ``PerSample``) take its rows, and so does ``ragged=`` where each row is a tensor
    (the column has two or more dimensions): rows that share one length in a batch give
    the same keys as rows that do not. A 0-d array, a string, a mapping or a set is not
    a column of rows: it is refused, naming the column. String columns are lists of
    ``str`` (a policy named for one refuses them, as for samples). ``datetime64`` and
    ``timedelta64`` columns are refused: convert them first. A ``pyarrow.Table`` or
    ``RecordBatch`` is read column by column; two columns of one name are refused.

    Args:
        pin_memory: as for [MMCollate][pincollate.MMCollate]: ``"auto"`` pins where this
            process has started an accelerator.
        fields: policies by column name (or key-path pattern inside a column's
            values), e.g. ``{"input_ids": Pad(mask_key="attention_mask")}``; a column
            whose name holds a dot (Arrow's ``Table.flatten()`` gives ``"a.b"``) is named
            by a tuple, ``{("a.b",): Pad()}``.
        ragged: the policy for columns of rows no pattern names (object arrays, Arrow
            lists and dense columns of two or more dimensions: their tensors, arrays and
            token-id lists, in every batch, as ``MMCollate(ragged=...)`` takes them of the
            rows as samples; ``None``: a per-row list where rows differ, each row in the
            buffer).
        rename: output names for columns, e.g. ``{"label": "labels"}``.
        missing: ``"none"`` takes ``None`` rows in ragged columns (empty for
            ``Pad``/``Concat``/``Jagged``).

    Examples:
        >>> import numpy as np
        >>> import pincollate
        >>> collate = pincollate.ColumnCollate(fields={"ids": pincollate.Pad()})
        >>> ids = np.empty(2, dtype=object)
        >>> ids[:] = [np.array([1, 2, 3]), np.array([4])]
        >>> batch = collate({"image": np.zeros((2, 3, 4, 4), np.uint8), "ids": ids, "name": np.array(["a", "b"])})
        >>> batch["ids"].tolist(), batch["ids_lengths"].tolist(), batch["name"]
        ([[1, 2, 3], [4, 0, 0]], [3, 1], ['a', 'b'])
        >>> start = batch.buffer.data_ptr()  # every tensor lies in the batch's one buffer
        >>> all(start <= t.data_ptr() < start + batch.buffer.numel() for t in batch.values() if hasattr(t, "data_ptr"))
        True
    """

    def __init__(
        self,
        pin_memory: PinMode = "auto",
        *,
        fields: Fields | None = None,
        ragged: Policy | None = None,
        rename: Mapping[str, str] | None = None,
        missing: Literal["error", "none"] = "error",
    ):
        # One source of settings and their checks: an MMCollate holds the planner.
        self.__setstate__(
            {"samples": MMCollate(pin_memory, fields=fields, ragged=ragged, rename=rename, missing=missing)}
        )

    @property
    def pin_memory(self) -> PinMode:
        return self._samples.pin_memory

    def __repr__(self) -> str:
        s = self._samples
        return (
            f"ColumnCollate(pin_memory={s.pin_memory!r}, fields={s.fields!r}, ragged={s.ragged!r}, "
            f"rename={s.rename!r}, missing={s.missing!r})"
        )

    def __getstate__(self) -> dict[str, Any]:
        return {"samples": self._samples}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._samples: MMCollate = state["samples"]
        #: The column sets seen: a pattern or rename that matches none of a new set is reported.
        self._columns: set[tuple[Hashable, ...]] = set()

    def __call__(self, batch: Mapping[str, Any]) -> Any:
        """The batch's columns in one buffer, as a [Batch][pincollate.Batch].

        ``batch`` maps column names to arrays; a ``pyarrow.Table`` is read from Arrow's
        buffers (a ragged column's rows as one flat tensor, no array per row).
        """
        fallbacks = self._samples._fallbacks
        try:
            made = self._collate(batch)
        except BaseException:
            fallbacks.drop()  # a batch that fails warns of none of its columns
            raise
        if fallbacks.waiting:
            fallbacks.flush()
        return made

    def _collate(self, batch: Mapping[str, Any]) -> Any:
        if is_arrow_table(batch):
            batch = arrow_columns(batch)
        if not isinstance(batch, Mapping) or not batch:
            raise CollateError(f"expected a non-empty mapping of column name to array, got {type_name(batch)}")
        samples = self._samples
        samples._replan_if_registered()
        fill = Fill(samples._planner, 0, START)
        keys: list[Hashable] = []
        specs: list[Spec] = []
        rows = None
        given = list(batch)
        renamed = samples._renames.outputs((), given)
        # What no extra output may be called, with what took the name: what a clash names.
        taken: dict[Hashable, str] = {name: f"the column {name!r}" for name in (*given, *renamed)}
        twice = samples._renames.twice(given, renamed)
        if twice is not None:
            raise CollateError(f"rename gives the columns {twice[0]} one name, {twice[1]!r}")
        for (key, column), out_key in zip(batch.items(), renamed, strict=True):
            path = (key,)
            count = _rows(column, path)
            if rows is None:
                rows = count
            elif count != rows:
                raise CollateError(f"column has {count} rows, the first column {rows}", path=path)
            keys.append(out_key)
            node, extras = self._plan_column(column, path)
            specs.append(fill.place(node))
            for name, extra in extras.items():
                if name in taken:
                    raise CollateError(
                        f"the extra output {name!r} of column {key!r} clashes with {taken[name]}{EXTRA_NAMES}",
                        path=path,
                    )
                taken[name] = f"the extra output {name!r} of column {key!r}"
                keys.append(name)
                specs.append(fill.place(extra))
        columns = tuple(batch)
        if columns not in self._columns:
            self._columns.add(columns)
            if samples._rules or samples._renames:
                samples._report_unmatched()
        layout = Layout(MappingSpec(None, keys, specs), fill.offset, fill.parts)
        # The layout's tensors made at once, as its build reads them (a stack whose
        # segments each fill a part of it is made by none of its copies).
        fill.bulk = layout.bulk()
        kind = resolve_kind(samples.pin_memory)
        buffer = allocate(layout.nbytes, kind)
        return make_batch(layout, buffer, fill.values, fill.execute(buffer, kind == "plain"))

    def _plan_column(self, column: Any, path: tuple[Hashable, ...]) -> tuple[Node, dict[str, Node]]:
        samples = self._samples
        policy = samples._rules.lookup(path) if samples._rules else None
        if isinstance(column, torch.Tensor):
            column = _on_host(column, path)
        # A dense column whose rows are tensors takes ragged= as MMCollate's rows would: rows that
        # happen to share a length in this batch give the same keys as rows that do not.
        reads = policy if policy is not None or getattr(column, "ndim", 0) < 2 else samples.ragged
        dense = reads is None or isinstance(reads, Stack)
        if isinstance(column, torch.Tensor):  # a dtype numpy lacks (bfloat16, float8)
            if column.layout == torch.strided and not column.is_nested and dense:
                shape = tuple(column.shape)
                return TensorNode(column.dtype, shape, [Segment(0, shape, _copy_into, column)]), {}
        elif isinstance(column, np.ndarray) and column.dtype != object:
            kind = column.dtype.kind
            if kind in "Mm":
                raise CollateError(
                    f"a {column.dtype} column is not collated: convert it first (to int64 with "
                    ".astype('int64'), or to strings)",
                    path=path,
                )
            if kind in "USV":
                strings = [str(v) if kind == "U" else v for v in column.tolist()]
                if policy is None:
                    return Value(strings), {}
                # The field's own policy takes (or refuses) them, as MMCollate's would.
                return self._plan_rows(strings, path)
            dtype = torch_dtype(column.dtype)
            if kind in _NUMERIC and dtype is not None and dense:
                shape = tuple(column.shape)
                # One numpy assignment: it reads an object store's read-only arrays without torch's warning.
                return TensorNode(dtype, shape, [Segment(0, shape, fill_numbers, column)]), {}
        # Rows as samples: variable shapes (object arrays), policies, strings, None. Rows read
        # from Arrow come joined already (one flat tensor): the policies copy from it whole.
        if type(column) is Joined:
            return self._plan_rows(column, path)
        joined = _dense_rows(column)
        if joined is not None:  # a dense column under a policy: its rows joined, as Arrow's are
            return self._plan_rows(joined, path)
        # A nested tensor has no len(): its rows are its components.
        return self._plan_rows(column.unbind() if isinstance(column, torch.Tensor) else list(column), path)

    def _plan_rows(self, values: Any, path: tuple[Hashable, ...]) -> tuple[Node, dict[str, Node]]:
        if not len(values):
            raise CollateError("empty column: there are no rows to collate", path=path)
        planned: tuple[Node, dict[str, Node]] = self._samples._planner.plan(values, path, True)  # a mapping of columns
        return planned

    def iter_torch_batches(
        self,
        data: Any,
        *,
        batch_size: int | None = 256,
        prefetch_batches: int = 1,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
        unpack: bool = False,
    ) -> Iterable[Any]:
        """The batches of a Ray ``Dataset`` or ``DataIterator`` (a Ray Train shard), each a [Batch][pincollate.Batch].

        Ray's own ``iter_torch_batches``, with this collate in Ray's threads, on the CPU;
        but where Ray would rebuild a batch whose columns are all tensors as a plain
        ``dict``, each batch arrives whole, its layout with it, so ``batch.to(device)`` and
        the [Prefetcher][pincollate.Prefetcher] move it in one copy. The keywords are
        Ray's; with ``unpack``, each row is a batch [pack][pincollate.ColumnCollate.pack]
        made on the data side (iterate with ``batch_size=1``). Each ``for`` over the
        result is one pass over ``data``. Needs ``ray`` (``pip install "pincollate[ray]"``).

        Examples:
            >>> collate = pincollate.ColumnCollate(fields={"ids": pincollate.Pad()})  # doctest: +SKIP
            >>> shard = ray.train.get_dataset_shard("train")  # doctest: +SKIP
            >>> for batch in pincollate.Prefetcher(collate.iter_torch_batches(shard, batch_size=32)):  # doctest: +SKIP
            ...     loss = model(batch["ids"], batch["ids_mask"])
        """
        from .ray import RayBatches

        options = {
            "batch_size": batch_size,
            "prefetch_batches": prefetch_batches,
            "drop_last": drop_last,
            "local_shuffle_buffer_size": local_shuffle_buffer_size,
            "local_shuffle_seed": local_shuffle_seed,
        }
        return RayBatches(data, self, unpack, options)

    def for_ray(self, *, unpack: bool = False) -> Any:
        """This collate as Ray Data's ``ArrowBatchCollateFn``, for ``iter_torch_batches(collate_fn=...)``.

        Ray (2.47 and later) asks for a ``CollateFn`` subclass rather than a function; as
        an Arrow one it gets each batch's Arrow table, read from Arrow's buffers, not
        converted to numpy row by row. With ``unpack``, it unpacks batches ``pack`` made
        on the data side.
        Ray's finalize step rebuilds a batch whose columns are all tensors as a plain
        ``dict``, which this warns of once:
        [iter_torch_batches][pincollate.ColumnCollate.iter_torch_batches] keeps the batch
        whole. Needs ``ray`` (``pip install "pincollate[ray]"``).
        """
        from .ray import ray_collate

        return ray_collate(self, unpack=unpack)

    # --- collating on the data side --------------------------------------------------------

    def pack(self, batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Collate ``batch`` and return it as a one-row columnar batch, for ``map_batches``.

        The row holds the buffer (``uint8``) and the pickled layout and non-tensor
        values: one array through an object store instead of one per column.
        Iterate the packed dataset one row at a time and ``unpack`` each.
        """
        collated = self(batch)
        state = carried(collated)
        assert state is not None  # a fresh batch matches its layout
        layout, buffer, values = state
        described = np.empty(1, dtype=object)
        described[0] = pickle.dumps((layout, values), protocol=pickle.HIGHEST_PROTOCOL)
        return {BUFFER: buffer[: layout.nbytes].numpy()[None], LAYOUT: described}

    def unpack(self, row: Mapping[str, Any]) -> Any:
        """The batch ``pack`` made, from a one-row batch: one copy of its bytes.

        The copy lands in memory of this process (pinned where it pins), so the
        batch is writable and outlives the object store's read-only view.
        """
        if BUFFER not in row or LAYOUT not in row:
            raise CollateError(f"expected a packed batch with columns {BUFFER!r} and {LAYOUT!r}, got {sorted(row)}")
        if len(row[LAYOUT]) != 1:
            raise CollateError(f"unpack takes one packed batch at a time (batch_size=1), got {len(row[LAYOUT])}")
        try:
            layout, values = pickle.loads(row[LAYOUT][0])
        except Exception as exc:  # truncated bytes, another object: not what pack wrote
            raise CollateError(f"the packed batch's layout cannot be read ({type(exc).__name__}: {exc})") from exc
        if not isinstance(layout, Layout):
            raise CollateError(f"the packed batch's layout is a {type_name(layout)}, not what pack writes")
        data = np.asarray(row[BUFFER][0], dtype=np.uint8).reshape(-1)
        if data.size < layout.nbytes:
            raise CollateError(f"the packed buffer has {data.size} bytes, its layout needs {layout.nbytes}")
        buffer = allocate(layout.nbytes, resolve_kind(self._samples.pin_memory))
        buffer[: layout.nbytes].numpy()[...] = data[: layout.nbytes]
        return make_batch(layout, buffer, values)


def _rows(column: Any, path: tuple[Hashable, ...]) -> int:
    """How many rows ``column`` has; a 0-d array or tensor, or a value without rows, is refused naming the column."""
    if getattr(column, "ndim", None) == 0:
        raise CollateError(f"a column must have one row per sample, got a 0-d {type_name(column)}", path=path)
    if isinstance(column, (str, bytes, bytearray, Mapping, AbstractSet)):
        # Each would give rows (characters, bytes, keys) that no columnar batch means.
        raise CollateError(
            f"expected a column (an array, tensor or sequence of rows), got {type_name(column)}", path=path
        )
    if isinstance(column, torch.Tensor):
        return column.size(0)  # a strided nested tensor has no len()
    try:
        return len(column)
    except TypeError:
        raise CollateError(
            f"expected a column (an array, tensor or sequence of rows), got {type_name(column)}", path=path
        ) from None


def _on_host(column: torch.Tensor, path: tuple[Hashable, ...]) -> np.ndarray | torch.Tensor:
    """A tensor column as a host array, or as a host tensor where numpy cannot hold it.

    numpy has no ``bfloat16`` or ``float8`` dtype, and takes no nested or sparse tensor:
    those stay tensors, dense ones copied as they are, the others taken row by row.
    A quantized or meta column is refused, as a sample's tensor is.
    """
    if column.is_quantized:
        raise CollateError("quantized tensors are not supported; pass their dequantize() or int_repr()", path=path)
    if column.is_meta:
        raise CollateError("expected a CPU tensor, got one on meta (a meta tensor has no data)", path=path)
    try:
        return column.numpy(force=True)
    except (TypeError, RuntimeError):  # "Got unsupported ScalarType BFloat16", a nested tensor
        return column.detach().cpu().resolve_conj().resolve_neg()


def _dense_rows(column: Any) -> Joined | None:
    """A dense numeric column of two or more dimensions as its rows joined (``None``: another column).

    Its rows are the samples of a policy (``Pad``, ``Concat``, ``ragged=``): one flat tensor
    of them and their lengths, as Arrow's list columns are read, not an array per row.
    """
    if isinstance(column, torch.Tensor) and (column.is_nested or column.layout != torch.strided):
        return None
    if getattr(column, "ndim", 0) < 2 or 0 in column.shape[1:]:
        return None
    if isinstance(column, np.ndarray):
        if column.dtype.kind not in _NUMERIC or torch_dtype(column.dtype) is None:
            return None
        with warnings.catch_warnings():
            # An object store's read-only array: the tensor is only read (copied into the batch).
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            tensor = torch.from_numpy(np.ascontiguousarray(column))
    elif isinstance(column, torch.Tensor):
        tensor = column
    else:
        return None
    rows, length = tensor.shape[0], tensor.shape[1]
    return Joined(tensor.reshape(rows * length, *tensor.shape[2:]), [length] * rows)


def _copy_into(region: torch.Tensor, column: torch.Tensor) -> None:
    region.copy_(column)
