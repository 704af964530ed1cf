"""Block formats: k element codes along one axis share scale words (and minimum words).

A tensor in a block format is stored as **planes** of integer words:

* ``codes``: one element code per tensor element, in the tensor's own shape (the padding
  a reference implementation adds to fill the last block is never stored, so it never
  receives faults);
* ``scale`` (and ``min`` / ``zero_point`` where the format has them): one word per
  block, in the tensor's shape with the block axis shortened to the number of blocks;
* ``tensor_scale`` (NVFP4): one word for the whole tensor, shape ``()``.

Each plane has its own word format (``Plane.format``: the E8M0 of an MX scale, the fp16
of a GGUF scale, ...), whose ``bits`` and ``bit_fields`` say what a fault there can
touch. Fault maps address a plane by name: ``fc1.weight`` is the codes plane of tensor
``fc1.weight`` and ``fc1.weight:scale`` its scales (``plane_map_name``); bit selections
and per-plane rates name a plane's fields as ``scale.exponent`` and a whole plane as
``scale`` (``formats.planes.split_by_plane``).

A subclass is a frozen dataclass with an ``axis`` field that defines ``block_size``,
``planes``, ``encode_blocks`` and ``decode_blocks``: the arithmetic on a ``(blocks, k)``
float32 array, once; ``BlockLayout`` moves tensors to blocks and back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.formats.base import (
    Format,
    FormatBase,
    QuantParams,
    cast_quietly,
    check_bits,
    check_float_input,
    low_bits_signed,
    low_bits_unsigned,
    to_container,
)

CODES = "codes"
PLANE_SEPARATOR = ":"
FIELD_SEPARATOR = "."
Per = Literal["element", "block", "tensor"]


def plane_map_name(tensor: str, plane: str) -> str:
    """The name of the fault map of ``plane`` of tensor ``tensor``: the tensor's own name
    for its codes, ``tensor:plane`` for every other plane."""
    return tensor if plane == CODES else f"{tensor}{PLANE_SEPARATOR}{plane}"


@dataclass(frozen=True)
class Plane:
    """One plane of a stored block tensor: its ``name``, the ``format`` of each of its words
    and what one word covers (``per``: an element, a block or the whole tensor)."""

    name: str
    format: Format
    per: Per


@dataclass(frozen=True)
class IntCodes(FormatBase):
    """Raw ``bits``-bit integers: two's complement when ``signed``, else unsigned.

    Encoding rounds to nearest (ties to even) and saturates at the ends of the range; a
    word decodes to its integer value. The word format of integer planes (GGUF and
    group-wise codes, zero points); not a tensor format of its own (not registered).
    """

    kind: ClassVar[str] = "int_codes"
    bits: int = 8
    signed: bool = True

    def __post_init__(self) -> None:
        check_bits(self.bits)
        if not isinstance(self.signed, (bool, np.bool_)):
            raise ArgumentTypeError("signed", self.signed, "True or False")
        object.__setattr__(self, "signed", bool(self.signed))

    @property
    def code_range(self) -> tuple[int, int]:
        if self.signed:
            return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        return 0, (1 << self.bits) - 1

    @property
    def bit_fields(self) -> dict[str, tuple[int, ...]]:
        top = self.bits - 1
        if self.signed:
            return {"sign": (top,), "magnitude": tuple(range(top))}
        return {"high": (top,), "low": tuple(range(top))}

    def encode(self, x: Any, params: QuantParams | None = None) -> np.ndarray:
        lo, hi = self.code_range
        y = np.nan_to_num(np.rint(np.asarray(x, dtype=np.float64)), nan=0.0)
        return to_container(np.clip(y, lo, hi).astype(np.int64), self.bits)

    def integers(self, words: Any) -> np.ndarray:
        """The integer each word holds (int64)."""
        if self.signed:
            return low_bits_signed(words, self.bits)
        return low_bits_unsigned(words, self.bits)

    def decode(self, words: Any, params: QuantParams | None = None,
               dtype: Any = np.float32) -> np.ndarray:
        return cast_quietly(self.integers(words), dtype)


def check_block_size(k: Any, allowed: Sequence[int] | None = None,
                     argument: str = "block_size") -> int:
    """``k`` if it is a positive int (one of ``allowed`` when given); else an error."""
    need = f"one of {tuple(allowed)}" if allowed else "a positive integer"
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ArgumentTypeError(argument, k, need)
    if k < 1 or (allowed and int(k) not in allowed):
        raise ArgumentError(argument, k, need)
    return int(k)


def check_axis(axis: Any) -> int:
    """``axis`` if it is an int (checked against a tensor's rank when one is stored)."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise ArgumentTypeError("axis", axis, "an int (the axis the blocks run along)")
    return int(axis)


def row_reduce(values: np.ndarray, op: np.ufunc = np.maximum) -> np.ndarray:
    """``op.reduce(values, axis=1)`` for 2-D ``values`` whose rows are blocks: a pairwise
    tree of 1-D passes over adjacent elements (NumPy's reduction over a short last axis
    pays per row; this pays per element). The pairing is fixed (adjacent elements, then
    adjacent results), so which of two equal zeros survives is too; rows whose width is not
    a power of two take ``op.reduce``."""
    m = np.asarray(values)
    n, k = m.shape
    if k == 0 or k & (k - 1):
        return op.reduce(m, axis=1) if k else np.zeros(n, m.dtype)
    m = np.ascontiguousarray(m).reshape(-1)
    while m.size > n:
        pairs = m.reshape(-1, 2)
        m = op(pairs[:, 0], pairs[:, 1])
    return m


@dataclass(frozen=True)
class BlockLayout:
    """How a tensor of ``shape`` splits into blocks of ``k`` along ``axis``.

    Blocks are numbered row by row: the tensor with ``axis`` moved last is a stack of
    rows, each cut into ``n_blocks_per_row`` blocks (the last one padded with zeros, as
    the OCP MX reference pads). A block plane in tensor form has ``shape`` with the axis
    shortened to ``n_blocks_per_row``.
    """

    shape: tuple[int, ...]
    axis: int
    k: int

    @classmethod
    def of(cls, shape: Sequence[int], axis: int, k: int) -> BlockLayout:
        shape = tuple(int(d) for d in shape)
        if not -len(shape) <= axis < len(shape) or not shape:
            allowed = f"an axis in {-len(shape)}..{len(shape) - 1}" if shape else \
                "a tensor with at least one dimension"
            raise ArgumentError("axis", axis, allowed,
                                requirement=f"block axis {axis} does not exist in a tensor of "
                                            f"shape {shape}; allowed: {allowed}")
        return cls(shape, axis % len(shape), k)

    @property
    def length(self) -> int:
        return self.shape[self.axis]

    @property
    def n_blocks_per_row(self) -> int:
        return max(1, math.ceil(self.length / self.k)) if self.length else 0

    @property
    def moved_shape(self) -> tuple[int, ...]:
        return self.shape[:self.axis] + self.shape[self.axis + 1:] + (self.length,)

    @property
    def n_blocks(self) -> int:
        return math.prod(self.moved_shape[:-1]) * self.n_blocks_per_row

    @property
    def block_plane_shape(self) -> tuple[int, ...]:
        s = list(self.shape)
        s[self.axis] = self.n_blocks_per_row
        return tuple(s)

    def to_blocks(self, x: np.ndarray, fill: Any = 0) -> np.ndarray:
        """``x`` (this shape) as ``(n_blocks, k)``, the last block of each row padded."""
        y = np.moveaxis(np.asarray(x), self.axis, -1)
        pad = self.n_blocks_per_row * self.k - self.length
        if pad:
            y = np.concatenate([y, np.full((*y.shape[:-1], pad), fill, dtype=y.dtype)], -1)
        return np.ascontiguousarray(y).reshape(self.n_blocks, self.k)

    def from_blocks(self, blocks: np.ndarray) -> np.ndarray:
        """The inverse of ``to_blocks``: the padding dropped, the axis put back."""
        lead = self.moved_shape[:-1]
        y = np.asarray(blocks).reshape(*lead, self.n_blocks_per_row * self.k)[..., :self.length]
        return np.ascontiguousarray(np.moveaxis(y, -1, self.axis))

    def block_plane_to_blocks(self, plane: np.ndarray) -> np.ndarray:
        """A block plane in tensor form -> one entry per block, in block order."""
        return np.ascontiguousarray(np.moveaxis(np.asarray(plane), self.axis, -1)).reshape(-1)

    def blocks_to_block_plane(self, values: np.ndarray) -> np.ndarray:
        """One entry per block, in block order -> the block plane in tensor form."""
        lead = self.moved_shape[:-1]
        y = np.asarray(values).reshape(*lead, self.n_blocks_per_row)
        return np.ascontiguousarray(np.moveaxis(y, -1, self.axis))

    def block_of_elements(self) -> np.ndarray:
        """For each element (flat, tensor order) its block number (int64)."""
        ids = np.arange(self.n_blocks, dtype=np.int64).repeat(self.k).reshape(self.n_blocks,
                                                                              self.k)
        return self.from_blocks(ids).reshape(-1)

    def block_of_plane_index(self) -> np.ndarray:
        """For each word of a block plane (flat, tensor form) its block number (int64)."""
        return self.blocks_to_block_plane(np.arange(self.n_blocks, dtype=np.int64)).reshape(-1)


class BlockFormat(FormatBase):
    """The base of the block formats (a dataclass subclass has an ``axis`` field).

    ``encode`` returns the planes (a dict of word arrays by plane name) and ``decode``
    takes them; ``bits`` and ``bit_fields`` are those of the codes plane. Input is
    rounded to float32 first and the arithmetic is float32, as in the formats' reference
    implementations; the decoded float32 values are then cast to the asked dtype.
    """

    axis: int

    # ---- what a subclass defines ---------------------------------------------------------

    @property
    def block_size(self) -> int:
        raise NotImplementedError

    @property
    def planes(self) -> tuple[Plane, ...]:
        """The planes, codes first."""
        raise NotImplementedError

    def encode_blocks(self, blocks: np.ndarray) -> dict[str, np.ndarray]:
        """float32 ``(n, k)`` blocks -> the planes in block form as bit patterns (any
        integer dtype; only the low ``bits`` count): codes ``(n, k)``, block planes
        ``(n,)``, tensor planes ``()``."""
        raise NotImplementedError

    def decode_blocks(self, planes: Mapping[str, np.ndarray]) -> np.ndarray:
        """Planes in block form (int64 bit patterns, as ``encode_blocks`` gives) -> float32
        ``(n, k)`` values."""
        raise NotImplementedError

    # ---- shared -------------------------------------------------------------------------

    @property
    def codes_format(self) -> Format:
        return self.planes[0].format

    @property
    def bits(self) -> int:  # type: ignore[override]
        return self.codes_format.bits

    @property
    def bit_fields(self) -> dict[str, tuple[int, ...]]:
        return self.codes_format.bit_fields

    @property
    def plane_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.planes)

    def plane(self, name: str) -> Plane:
        """The plane called ``name``; ArgumentError listing the planes otherwise."""
        for p in self.planes:
            if p.name == name:
                return p
        raise ArgumentError("plane", name, f"one of {self.plane_names}",
                            requirement=f"{type(self).__name__} has no plane {name!r}; its "
                                        f"planes: {self.plane_names}")

    def layout(self, shape: Sequence[int]) -> BlockLayout:
        """The blocks of a tensor of ``shape`` (ArgumentError for an axis it lacks)."""
        return BlockLayout.of(shape, self.axis, self.block_size)

    def plane_shapes(self, shape: Sequence[int]) -> dict[str, tuple[int, ...]]:
        """The shape of every plane of a tensor of ``shape``."""
        lay = self.layout(shape)
        by_per = {"element": lay.shape, "block": lay.block_plane_shape, "tensor": ()}
        return {p.name: by_per[p.per] for p in self.planes}

    def _to_tensor_form(self, lay: BlockLayout, planes: Mapping[str, np.ndarray]
                        ) -> dict[str, np.ndarray]:
        out = {}
        for p in self.planes:
            container = p.format.container
            # a wrapping cast keeps the low bits: narrow first, then move the narrow words
            v = np.asarray(planes[p.name]).astype(f"u{container.itemsize}", copy=False)
            v = v.view(container)
            if p.per == "element":
                v = lay.from_blocks(v)
            elif p.per == "block":
                v = lay.blocks_to_block_plane(v)
            out[p.name] = v.reshape(()) if p.per == "tensor" else v
        return out

    def to_block_form(self, lay: BlockLayout, planes: Mapping[str, np.ndarray]
                      ) -> dict[str, np.ndarray]:
        """Planes in tensor form (words in containers) -> block form (int64 bit patterns:
        codes ``(n, k)`` with the padding as code 0, block planes ``(n,)``, tensor ``()``),
        what ``decode_blocks`` takes."""
        out = {}
        for p in self.planes:
            v = low_bits_unsigned(planes[p.name], p.format.bits)
            if p.per == "element":
                v = lay.to_blocks(v)
            elif p.per == "block":
                v = lay.block_plane_to_blocks(v)
            out[p.name] = v if p.per != "tensor" else v.reshape(())
        return out

    def encode(self, x: Any, params: QuantParams | None = None) -> dict[str, np.ndarray]:
        """Float array -> its planes: ``{plane name: words}`` in each plane's container."""
        arr = check_float_input(x)
        lay = self.layout(arr.shape)
        with np.errstate(over="ignore"):
            blocks = lay.to_blocks(arr.astype(np.float32, copy=False))
        if not np.isfinite(blocks).all():
            bad = ~np.isfinite(arr)
            index = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.any() else ()
            raise ValueError(f"{type(self).__name__}: value at index {index} is NaN or "
                             "infinite (or too large for float32); a block scale cannot be "
                             "computed from it")
        return self._to_tensor_form(lay, self.encode_blocks(blocks))

    def encode_counting(self, x: Any, params: QuantParams | None = None
                        ) -> tuple[dict[str, np.ndarray], int]:
        return self.encode(x, params), 0

    def decode(self, words: Any, params: QuantParams | None = None,
               dtype: Any = np.float32) -> np.ndarray:
        """Planes (as ``encode`` gives them, possibly faulty) -> floats of the tensor."""
        if not isinstance(words, Mapping):
            raise ArgumentTypeError("words", words, f"a mapping of the planes {self.plane_names}")
        missing = [n for n in self.plane_names if n not in words]
        if missing:
            raise ArgumentError("words", sorted(words), f"the planes {self.plane_names}",
                                requirement=f"missing plane(s) {missing}")
        lay = self.layout(np.shape(words[CODES]))
        values = self.decode_blocks(self.to_block_form(lay, words))
        return cast_quietly(lay.from_blocks(values), dtype)


__all__ = [
    "CODES",
    "PLANE_SEPARATOR",
    "BlockFormat",
    "BlockLayout",
    "IntCodes",
    "Plane",
    "check_axis",
    "check_block_size",
    "plane_map_name",
    "row_reduce",
]
