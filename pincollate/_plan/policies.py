"""Ragged-field policies, and the patterns that assign them to key paths.

A policy turns one *column* (the values of one field across the batch) into an
output node, plus optional extra tensors (lengths, mask, offsets) returned beside
the field in its parent mapping under names the policy chooses::

    collate = MMCollate(fields={"input_ids": Pad(mask_key="attention_mask")})
    batch = collate(samples)
    model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])

Every output, extras included, lives in the batch's one buffer.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, Literal

import torch

from .._errors import CollateError
from .._types.builtin import builtin, fill_numbers
from .column import Column, listed
from .fill import Node, Segment, TensorNode
from .ops import PLAIN
from .padding import Joined, fill_mask, fill_mask_1d, fill_padded, fill_padded_1d

__all__ = ["MASK_DTYPES", "AsList", "Pad", "PerSample", "Policy", "Stack", "Unpadded", "int_node", "pad_refusal"]


class Policy:
    """How one field is collated: the type ``fields=`` and ``ragged=`` take.

    [Stack][pincollate.Stack], [AsList][pincollate.AsList], [PerSample][pincollate.PerSample],
    [Pad][pincollate.Pad], [Concat][pincollate.Concat] and [Jagged][pincollate.Jagged] are
    its subclasses; each implements ``plan``.
    """

    #: Whether per-sample values may be lists of items, flattened before planning.
    takes_items = False
    #: Whether a per-sample list of Python numbers is one 1-D sequence (token ids).
    numbers_as_sequence = False
    #: Whether tensors that agree are what the policy makes of them anyway (a stack, as
    #: with no policy): the plan then gives them a fixed slot and plans the field for a
    #: batch only where they do not agree.
    fixed_when_uniform = False
    #: The attributes naming the extra outputs (``"{key}_lengths"``-style templates, or ``None``).
    _extra_keys: tuple[str, ...] = ()
    #: Whether a batch in which every value is absent (``missing="none"``) gets the policy's empty result.
    empty_when_absent = False

    def extra_names(self, name: Hashable) -> frozenset[str]:
        """Every name an extra output beside field ``name`` can take, whatever the batch holds.

        Examples:
            >>> from pincollate import Pad
            >>> sorted(Pad(mask_key="attention_mask").extra_names("ids"))
            ['attention_mask', 'ids_lengths']
        """
        names = (self._extra_name(getattr(self, attribute), name) for attribute in self._extra_keys)
        return frozenset(extra for extra in names if extra is not None)

    def plan(self, column: Column, name: Hashable, counts: list[int] | None = None) -> tuple[Node, dict[str, Node]]:
        """Return the field's node and its extra outputs keyed by their names.

        ``counts`` is set for policies that take lists of items (``takes_items``):
        how many of the column's values each sample gave.
        """
        raise NotImplementedError

    def _extra_name(self, template: str | None, name: Hashable) -> str | None:
        return None if template is None else template.format(key=name)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(vars(self).items(), key=lambda kv: kv[0]))))


class Stack(Policy):
    """Strict stacking: values of different shapes are an error naming them.

    Examples:
        >>> import torch
        >>> from pincollate import MMCollate, Stack
        >>> collate = MMCollate(fields={"x": Stack()})
        >>> collate([{"x": torch.zeros(2)}, {"x": torch.zeros(3)}])
        Traceback (most recent call last):
        ...
        pincollate.CollateError: sample 1 at ['x']: Stack() needs equal shapes, got (3,) here and (2,) in sample 0
    """

    fixed_when_uniform = True

    def plan(self, column: Column, name: Hashable, counts: list[int] | None = None) -> tuple[Node, dict[str, Node]]:
        if not column.stackable:
            i, refusing = column.refusing()
            raise column.error(f"Stack() cannot stack {refusing.name}: they stay one tensor per sample", i)
        if not column.uniform:
            first = column.shapes[0]
            for i, shape in enumerate(column.shapes):
                if shape is None:
                    raise column.error("Stack() got a missing value", i)
                if shape != first:
                    raise column.error(
                        f"Stack() needs equal shapes, got {shape} here and {first} in sample {column.origin(0)[0]}", i
                    )
            raise column.error("Stack() needs equal metadata (a box format or canvas size differs)")
        return column.stacked(), {}


class AsList(Policy):
    """Always a list of per-sample tensors, each in the batch buffer.

    On a field whose values are lists of items, each sample's entry is its items stacked
    into one tensor where they share a shape, else its list of them: one batch may hold
    both kinds.

    Examples:
        >>> import torch
        >>> from pincollate import AsList, MMCollate
        >>> batch = MMCollate(fields={"box": AsList()})([{"box": torch.zeros(2, 4)}, {"box": torch.zeros(2, 4)}])
        >>> [t.shape for t in batch["box"]]  # a list even though the shapes agree
        [torch.Size([2, 4]), torch.Size([2, 4])]
    """

    def plan(self, column: Column, name: Hashable, counts: list[int] | None = None) -> tuple[Node, dict[str, Node]]:
        return listed(column), {}


class PerSample(Policy):
    """One output per sample for a whole subtree: a list of the samples' own structures.

    What torchvision's detection models take as targets: a list of per-image dicts of
    boxes and labels. Every tensor still lies in the batch's one buffer.

    Examples:
        >>> import torch
        >>> from pincollate import MMCollate, PerSample
        >>> collate = MMCollate(fields={"target": PerSample()})
        >>> batch = collate([{"target": {"boxes": torch.zeros(2, 4), "labels": [1, 2]}}, {"target": {"boxes": torch.zeros(0, 4), "labels": []}}])
        >>> [t["boxes"].shape for t in batch["target"]]
        [torch.Size([2, 4]), torch.Size([0, 4])]
    """

    def plan(self, column: Column, name: Hashable, counts: list[int] | None = None) -> tuple[Node, dict[str, Node]]:
        return AsList().plan(column, name)


def pad_refusal(value: complex, dtype: torch.dtype) -> str | None:
    """Why ``Pad(value=value)`` cannot fill a field of ``dtype``; ``None`` where it can.

    The value is written into the dtype once and read back: an integer dtype must give the
    value itself; a floating one may round it, within its range, keeping its sign, whether
    it is zero and whether it is finite (each part of a complex value; ``complex32`` is two
    ``float16``). A complex value fits only a complex dtype. A dtype torch cannot fill
    (``float4_e2m1fn_x2``, ``int4``, the ``bits`` types) is refused whatever the value.

    Examples:
        >>> pad_refusal(-1, torch.int64) is None, pad_refusal(1j, torch.complex64) is None
        (True, True)
        >>> pad_refusal(70000.0, torch.float16), pad_refusal(1.5, torch.int64)
        ('pad value 70000.0 does not fit dtype torch.float16', 'pad value 1.5 does not fit dtype torch.int64')
    """
    return _pad_refusal(value, type(value).__name__, dtype)


@functools.lru_cache(maxsize=256)
def _pad_refusal(value: complex, kind: str, dtype: torch.dtype) -> str | None:
    # ``kind``: 1, 1.0 and True are one key to the cache, but not one pad value.
    cannot = f"pad value {value!r} does not fit dtype {dtype}"
    try:
        torch.empty(2, dtype=dtype, device="cpu").fill_(0)  # Pad's fill (one element would take another path)
    except (TypeError, RuntimeError, NotImplementedError):
        return f"Pad() does not pad values of dtype {dtype}; convert them first, or list them (AsList())"
    if isinstance(value, complex) and not dtype.is_complex:
        return cannot
    if dtype == torch.bool:
        return None if value in (0, 1) else cannot
    exact = not (dtype.is_floating_point or dtype.is_complex)
    if exact and not (isinstance(value, int) or float(value).is_integer()):  # type: ignore[arg-type]
        return cannot  # a fraction in an integer dtype (a complex value reaches only complex dtypes)
    try:
        back = torch.empty(2, dtype=dtype, device="cpu").fill_(value)[0].item()
    except (TypeError, RuntimeError, OverflowError):  # past the dtype's range, or past what torch converts
        return cannot
    if exact:
        return None if back == value else cannot  # an integer written back as another
    top = torch.finfo(dtype).max
    wanted, got = complex(value), complex(back)
    for want, have in ((wanted.real, got.real), (wanted.imag, got.imag)):
        if math.isnan(want) or math.isinf(want):
            if not (math.isnan(have) if math.isnan(want) else have == want):
                return cannot
        elif abs(want) > top or not math.isfinite(have) or (want < 0) != (have < 0) or (want == 0) != (have == 0):
            # Past the range (float8 saturates, float16 gives inf), or a sign or a zero the
            # dtype cannot hold (float8_e8m0fnu): rounding alone is what a float pad may take.
            return cannot
    return None


def int_node(values: list[int] | list[list[int]], dtype: torch.dtype = torch.int64) -> TensorNode:
    """A small integer tensor (lengths, counts, offsets) computed while planning."""
    shape = (len(values),) if not values or not isinstance(values[0], list) else (len(values), len(values[0]))
    return TensorNode(dtype, shape, [Segment(0, shape, fill_numbers, values)])


def _fill_value(region: torch.Tensor, payload: None, *, value: complex) -> None:
    region.fill_(value)


def _constant(dtype: torch.dtype, shape: tuple[int, ...], value: complex) -> TensorNode:
    """A tensor of ``shape`` holding ``value`` everywhere (nothing to fill where it has no element)."""
    fill = functools.partial(_fill_value, value=value)
    return TensorNode(dtype, shape, [Segment(0, shape, fill, None)] if math.prod(shape) else [])


class Unpadded(Exception):
    """:meth:`Pad.measure` refuses the shapes: ``message`` says why, ``index`` which value (its position)."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.message = message
        self.index = index


#: A mask's dtypes: ``True``/``False``, or 1/0 in a dtype numpy writes (the mask is written through numpy).
MASK_DTYPES = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
    }
)

_MASK_NAMES = ", ".join(sorted(str(dtype) for dtype in MASK_DTYPES))


class Pad(Policy):
    """Pad ragged values to one shape; add their lengths and a validity mask.

    Args:
        value: the pad value; it must fit the field's dtype (a complex one only a
            complex field's).
        side: ``"right"`` pads after the values, ``"left"`` before them.
        multiple_of: round each padded dimension up to a multiple of this.
        max_length: pad each padded dimension to exactly this size, in every batch
            (shapes that agree across ranks, or for a compiled model). A longer value
            is an error naming its sample and key path, unless ``truncate``.
        truncate: with ``max_length``, keep the first ``max_length`` entries of a
            longer value (lengths and mask count what is kept).
        dims: the dimensions to pad. ``None`` pads every dimension whose size varies
            in the batch (dimension 0 when none does). Give it to keep the mask's
            shape the same from batch to batch.
        lengths_key: name of the lengths tensor (``int64``; shape ``(B,)`` for one
            padded dimension, ``(B, len(dims))`` otherwise), or ``None``.
        mask_key: name of the mask (``(B, *padded sizes)``, ``True`` on real values),
            or ``None``.
        mask_dtype: the mask's dtype: ``torch.bool``, or ``int8``, ``int16``, ``int32``,
            ``int64``, ``uint8``, ``float16``, ``float32`` or ``float64`` (``torch.int64``:
            1 on real values, 0 on padding) for models that do arithmetic on the mask
            (XLNet's ``attention_mask``).

    Examples:
        >>> import torch
        >>> from pincollate import MMCollate, Pad
        >>> collate = MMCollate(fields={"ids": Pad(value=-1)})
        >>> batch = collate([{"ids": torch.tensor([1, 2, 3])}, {"ids": torch.tensor([4])}])
        >>> batch["ids"].tolist(), batch["ids_lengths"].tolist()
        ([[1, 2, 3], [4, -1, -1]], [3, 1])
        >>> batch["ids_mask"].tolist()
        [[True, True, True], [True, False, False]]

        An integer mask, as ``DataCollatorWithPadding`` gives it:

        >>> collate = MMCollate(fields={"ids": Pad(mask_key="attention_mask", mask_dtype=torch.int64)})
        >>> collate([{"ids": torch.tensor([1, 2, 3])}, {"ids": torch.tensor([4])}])["attention_mask"]
        tensor([[1, 1, 1],
                [1, 0, 0]])
    """

    numbers_as_sequence = True
    empty_when_absent = True
    _extra_keys = ("lengths_key", "mask_key")

    def __init__(
        self,
        value: complex = 0,
        side: Literal["right", "left"] = "right",
        multiple_of: int | None = None,
        max_length: int | None = None,
        truncate: bool = False,
        dims: Iterable[int] | None = None,
        lengths_key: str | None = "{key}_lengths",
        mask_key: str | None = "{key}_mask",
        mask_dtype: torch.dtype = torch.bool,
    ):
        if side not in ("right", "left"):
            raise CollateError(f"Pad(side=...) must be 'right' or 'left', got {side!r}")
        if multiple_of is not None and (not isinstance(multiple_of, int) or multiple_of < 1):
            raise CollateError(f"Pad(multiple_of=...) must be a positive int, got {multiple_of!r}")
        if not isinstance(value, (bool, int, float, complex)):
            raise CollateError(f"Pad(value=...) must be a number, got {type(value).__name__}")
        if max_length is not None and (not isinstance(max_length, int) or max_length < 1):
            raise CollateError(f"Pad(max_length=...) must be a positive int, got {max_length!r}")
        if max_length is not None and multiple_of is not None:
            raise CollateError("Pad(max_length=...) and Pad(multiple_of=...) do not go together: max_length is exact")
        if truncate and max_length is None:
            raise CollateError("Pad(truncate=True) needs a max_length")
        if dims is not None and not tuple(dims):
            raise CollateError("Pad(dims=...) must name at least one dimension (or be None)")
        if dims is not None and len(set(dims)) != len(tuple(dims)):
            raise CollateError(f"Pad(dims={tuple(dims)}) names a dimension twice")
        if lengths_key is not None and lengths_key == mask_key:
            raise CollateError(f"Pad(lengths_key=..., mask_key=...) must differ, both are {lengths_key!r}")
        self.value: complex = value
        self.side: Literal["right", "left"] = side
        self.multiple_of: int | None = multiple_of
        self.max_length: int | None = max_length
        self.truncate: bool = truncate
        self.dims: tuple[int, ...] | None = None if dims is None else tuple(dims)
        self.lengths_key: str | None = lengths_key
        if not isinstance(mask_dtype, torch.dtype) or mask_dtype not in MASK_DTYPES:
            raise CollateError(f"Pad(mask_dtype=...) must be one of {_MASK_NAMES}, got {mask_dtype!r}")
        self.mask_key: str | None = mask_key
        self.mask_dtype: torch.dtype = mask_dtype

    def _round(self, size: int) -> int:
        m = self.multiple_of
        return size if m is None else -(-size // m) * m

    def measure(self, shapes: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], list[int], list[int]]:
        """Padding's size rule, the one the careful walk and the compiled plan both follow.

        ``shapes`` are those of the values present, of one rank (at least 1). Returns the
        padded dimensions (``dims``, else those whose sizes differ, else the first), the
        padded sizes of one value (``max_length`` exactly, or the longest rounded up to
        ``multiple_of``), and the positions in ``shapes`` of the values longer than
        ``max_length`` (cut with ``truncate``, else refused).

        Raises:
            Unpadded: ``dims`` out of range or naming a dimension twice, or a dimension it
                does not pad whose sizes differ (with the position of the first such value).

        Examples:
            >>> from pincollate import Pad
            >>> Pad().measure([(3, 2), (5, 2)])
            ((0,), [5, 2], [])
            >>> Pad(max_length=4, truncate=True).measure([(3,), (5,)])
            ((0,), [4], [1])
        """
        ndim = len(shapes[0])
        per_dim = list(zip(*shapes, strict=True))
        sizes = list(map(max, per_dim))
        varying = [d for d, sizes_d in enumerate(per_dim) if len(set(sizes_d)) > 1]
        if self.dims is None:
            dims = tuple(varying) or (0,)
        else:
            dims = tuple(d % ndim if -ndim <= d < ndim else d for d in self.dims)
            if any(not 0 <= d < ndim for d in dims):
                raise Unpadded(f"Pad(dims={self.dims}) out of range for {ndim}-d values")
            if len(set(dims)) != len(dims):
                raise Unpadded(f"Pad(dims={self.dims}) names a dimension twice for {ndim}-d values")
            if any(d not in dims for d in varying):
                for i, shape in enumerate(shapes):
                    for d in range(ndim):
                        if d not in dims and shape[d] != sizes[d]:
                            raise Unpadded(
                                f"Pad(dims={self.dims}) does not pad dim {d}, whose sizes differ ({shape[d]} vs {sizes[d]})",
                                i,
                            )
        longer: list[int] = []
        if self.max_length is not None:
            limit = self.max_length
            longer = [i for i, shape in enumerate(shapes) if any(shape[d] > limit for d in dims)]
            for d in dims:
                sizes[d] = limit
        for d in dims:
            sizes[d] = self._round(sizes[d])
        return dims, sizes, longer

    def _empty(self, n: int, name: Hashable) -> tuple[Node, dict[str, Node]]:
        """No value in the whole batch (a text-only batch, ``missing="none"``): ``n`` rows of nothing.

        ``float32``, as ``Concat``'s empty values; each padded dimension (one where ``dims``
        names none) ``max_length`` long, else empty; lengths 0, the mask all ``False``.
        """
        count = 1 if self.dims is None else len(self.dims)
        shape = (n, *[self.max_length or 0] * count)
        extras: dict[str, Node] = {}
        lengths_name = self._extra_name(self.lengths_key, name)
        if lengths_name is not None:
            extras[lengths_name] = int_node([0] * n if count == 1 else [[0] * count for _ in range(n)])
        mask_name = self._extra_name(self.mask_key, name)
        if mask_name is not None:
            extras[mask_name] = _constant(self.mask_dtype, shape, False)
        # float32 rows of nothing (or of padding); complex64 for a complex pad value.
        dtype = torch.complex64 if isinstance(self.value, complex) else torch.float32
        return _constant(dtype, shape, self.value), extras

    def plan(self, column: Column, name: Hashable, counts: list[int] | None = None) -> tuple[Node, dict[str, Node]]:
        present = column.present
        shapes = dict(column.known)  # truncation may shorten some
        if not present:
            return self._empty(len(column.values), name)
        ndim = len(shapes[present[0]])
        if ndim == 0:
            raise column.error("Pad() cannot pad 0-d values", present[0])
        if set(map(len, shapes.values())) != {ndim}:
            i = next(i for i in present if len(shapes[i]) != ndim)
            raise column.error(
                f"Pad() needs values of one rank, got shape {shapes[i]} here and {shapes[present[0]]} in sample {column.origin(present[0])[0]}",
                i,
            )
        dtype = column.dtype
        refusal = pad_refusal(self.value, dtype)
        if refusal is not None:
            raise column.error(refusal)
        try:
            dims, sizes, longer = self.measure(list(shapes.values()))  # the present values', in order
        except Unpadded as refused:
            raise column.error(refused.message, None if refused.index is None else present[refused.index]) from None
        values = list(column.values)
        for j in longer:
            i, limit = present[j], self.max_length
            assert limit is not None  # only max_length makes a value too long
            if not self.truncate:
                raise column.error(
                    f"shape {shapes[i]} is longer than Pad(max_length={limit}) (pass truncate=True to cut)", i
                )
            cut = tuple(slice(0, limit) if d in dims else slice(None) for d in range(ndim))
            values[i] = values[i][cut]
            shapes[i] = tuple(min(size, limit) if d in dims else size for d, size in enumerate(shapes[i]))
        n = len(column.values)
        shape = (n, *sizes)
        left = self.side == "left"
        # Each value's sizes along the padded dimensions (0 where it is absent).
        if len(dims) == 1:
            along = operator.itemgetter(dims[0])
            lengths: list[Any] = (
                list(map(along, shapes.values()))
                if len(present) == n
                else [along(shapes[i]) if i in shapes else 0 for i in range(n)]
            )
        else:
            lengths = [[shapes[i][d] for d in dims] if i in shapes else [0] * len(dims) for i in range(n)]
        if (
            len(dims) == 1
            and len(present) == n
            and builtin(torch.Tensor, column.handler)  # a user's handler for tensors fills its own way
            and (column.plain or set(map(type, values)) == PLAIN)
            and set(column.dtypes if column.plain else [value.dtype for value in values]) == {dtype}
        ):
            # One padded dimension of plain tensors of the field's dtype: the compiled plan's copy
            # kernel (pad_1d). Values of several dtypes are cast as each is copied, below.
            # Rows read from Arrow come joined already: the copy reads them as the one tensor they are.
            joined = type(column.values) is Joined and not longer
            payload: Any = (column.values if joined else values, lengths, dims[0])
            fill: Any = functools.partial(fill_padded_1d, value=self.value, left=left)
        else:  # several padded dimensions, absent values, arrays, subclasses: value by value
            payload = [(i, values[i], shapes[i]) for i in present]
            fill = functools.partial(fill_padded, value=self.value, left=left, handler=column.handler)
        node = TensorNode(dtype, shape, [Segment(0, shape, fill, payload)])
        extras: dict[str, Node] = {}
        lengths_name = self._extra_name(self.lengths_key, name)
        if lengths_name is not None:
            extras[lengths_name] = int_node(lengths)
        mask_name = self._extra_name(self.mask_key, name)
        if mask_name is not None:
            mask_shape = (n, *(sizes[d] for d in dims))
            mask_fill = functools.partial(fill_mask_1d if len(dims) == 1 else fill_mask, left=left)
            extras[mask_name] = TensorNode(self.mask_dtype, mask_shape, [Segment(0, mask_shape, mask_fill, lengths)])
        return node, extras
