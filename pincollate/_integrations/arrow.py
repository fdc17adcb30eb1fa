"""Arrow tables as columns :class:`~pincollate.ColumnCollate` takes, read from Arrow's buffers.

Ray Data hands a ``NumpyBatchCollateFn`` each batch converted to numpy first: a ragged
column becomes an object array of one numpy array per row, which costs more than the
collate itself. Handed the Arrow table (an ``ArrowBatchCollateFn``), the collate reads each
column from Arrow's memory instead:

* a ragged tensor column (Ray's variable-shaped tensor type: a struct of the rows' flat
  values and their shapes) becomes :class:`~pincollate._plan.padding.Joined`: the values of
  every row as one flat tensor over Arrow's buffer (``torch.from_dlpack``, no copy) and the
  rows' leading sizes, which the policies copy from in one piece; so does a column of lists
  of numbers (token ids in a Hugging Face ``datasets`` table);
* a fixed-shape tensor column and a column of numbers become one numpy array;
* a string column becomes a list of ``str``.

Any other column (nulls, nested lists, bit-packed booleans, ragged rows of several trailing
shapes, types of other libraries) is converted as Ray converts it for a
``NumpyBatchCollateFn``, so the output is the same either way: :func:`arrow_columns` only
chooses the cheaper reading.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.utils.dlpack

from .._errors import CollateError
from .._plan.padding import Joined

__all__ = ["arrow_columns", "is_arrow_table"]

_VARIABLE = "ray.data.arrow_variable_shaped_tensor"
_FIXED = ("ray.data.arrow_tensor", "ray.data.arrow_tensor_v2")


def is_arrow_table(batch: Any) -> bool:
    """Whether ``batch`` is a ``pyarrow.Table`` or ``RecordBatch`` (read without importing pyarrow where it is not loaded)."""
    return type(batch).__name__ in ("Table", "RecordBatch") and type(batch).__module__.startswith("pyarrow")


def arrow_columns(table: Any) -> dict[str, Any]:
    """The columns of a ``pyarrow.Table``, each read from Arrow's buffers where it can be.

    Example:
        >>> import pyarrow as pa
        >>> columns = arrow_columns(pa.table({"label": [1, 2], "name": ["a", "b"]}))
        >>> columns["label"].tolist(), columns["name"]
        ([1, 2], ['a', 'b'])
    """
    if type(table).__name__ == "RecordBatch":
        table = _table_of(table)
    names = table.schema.names
    if len(set(names)) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise CollateError(f"the table has several columns named {', '.join(map(repr, twice))}: rename them first")
    readers = _readers(table.schema)
    columns: dict[str, Any] = {}
    left: list[int] = []
    for index, (name, read) in enumerate(readers):
        column = table.column(index)
        got = None if read is None or column.null_count else read(column)
        if got is None:
            left.append(index)
        columns[name] = got
    if left:  # in one conversion; the columns keep the table's order
        columns.update(_as_ray_converts(table.select(left)))
    return columns


def _table_of(batch: Any) -> Any:
    import pyarrow as pa  # type: ignore[import-untyped]

    return pa.Table.from_batches([batch])


Reader = Callable[[Any], Any]

#: Each schema's column readers, decided once: a loop's batches share their schema.
_READERS: dict[Any, list[tuple[str, Reader | None]]] = {}
_READERS_KEPT = 64


def _readers(schema: Any) -> list[tuple[str, Reader | None]]:
    found = _READERS.get(schema)
    if found is None:
        found = [(field.name, _reader(field.type)) for field in schema]
        if len(_READERS) >= _READERS_KEPT:
            _READERS.clear()
        _READERS[schema] = found
    return found


def _reader(kind: Any) -> Reader | None:
    """How a column of Arrow type ``kind`` is read from its buffers; ``None``: as Ray converts it."""
    import pyarrow as pa

    extension = getattr(kind, "extension_name", None)
    if extension == _VARIABLE:
        return _ragged
    if extension in _FIXED:
        return _fixed
    if extension is None and (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        return _numbers
    if extension is None and (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return _strings
    if (
        extension is None
        and (pa.types.is_list(kind) or pa.types.is_large_list(kind))
        and (pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type))
    ):
        return _lists
    return None


def _whole(column: Any) -> Any:
    """A ``ChunkedArray``'s one array (its chunks joined where there are several)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _numbers(column: Any) -> np.ndarray:
    return column.to_numpy()  # type: ignore[no-any-return]


def _strings(column: Any) -> list[str]:
    return column.to_pylist()  # type: ignore[no-any-return]


def _fixed(column: Any) -> np.ndarray:
    return _whole(column).to_numpy()  # type: ignore[no-any-return]


def _flat(lists: Any) -> torch.Tensor | None:
    """The values of a list array's rows as one tensor over Arrow's memory (``flatten`` follows
    a slice's offsets); ``None`` where a value is null or dlpack lacks the type (bit-packed
    booleans)."""
    values = lists.flatten()
    if values.null_count:
        return None
    try:
        return torch.utils.dlpack.from_dlpack(values)
    except (TypeError, ValueError, RuntimeError, BufferError):
        return None


def _lists(column: Any) -> Joined | None:
    """A column of lists of numbers (token ids, as Hugging Face ``datasets`` and Ray keep them)
    as their values in one flat tensor and the lists' lengths."""
    array = _whole(column)
    flat = _flat(array)
    if flat is None:
        return None
    offsets = array.offsets.to_numpy()  # the slice's, from wherever its first list starts
    return Joined(flat, (offsets[1:] - offsets[:-1]).tolist())


def _ragged(column: Any) -> Joined | None:
    """A variable-shaped tensor column as its rows' values in one flat tensor and their leading sizes.

    The rows must share their trailing dims (token ids, waveforms, patches ``(n_i, D)``);
    rows of other shapes (images of several sizes) are left to Ray's conversion.
    """
    storage = _whole(column).storage
    data = storage.field("data")
    rows = len(data)
    flat = _flat(data) if rows and not data.null_count else None
    if flat is None:
        return None
    if column.type.ndim == 1:
        offsets = data.offsets.to_numpy()
        return Joined(flat, (offsets[1:] - offsets[:-1]).tolist())
    shapes = storage.field("shape")
    if shapes.null_count:
        return None
    sizes = shapes.flatten().to_numpy()
    if sizes.size != rows * column.type.ndim:
        return None  # rows of several ranks
    sizes = sizes.reshape(rows, -1)
    if (sizes[:, 1:] != sizes[0, 1:]).any() or not sizes[0, 1:].all():
        return None  # trailing dims that differ, or a zero one (no flat length to read rows from)
    trailing = tuple(int(n) for n in sizes[0, 1:])
    return Joined(flat.view(-1, *trailing), sizes[:, 0].tolist())


def _as_ray_converts(table: Any) -> dict[str, Any]:
    """The columns as Ray converts them for a ``NumpyBatchCollateFn``; without Ray (a table
    of Hugging Face ``datasets``, say), as Arrow converts them to numpy."""
    try:
        from ray.data.block import BlockAccessor
    except ImportError:
        return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
    converted: dict[str, Any] = BlockAccessor.for_block(table).to_batch_format("numpy")
    return converted
