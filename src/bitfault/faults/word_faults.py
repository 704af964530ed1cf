"""WordFaults: faulty physical bits of memory words, and the cells patterns draw them from.

A physical memory word is ``data_bits + check_bits`` wide: bits ``0..data_bits-1`` are its
data bits, the bits above them its check bits. ``WordFaults`` holds, for sorted distinct
word indices, a data mask (uint64 ``(n,)`` up to 64 data bits, ``(n, lanes)`` uint64
lanes above: ``bitfault.memory.lanes``) and a check mask (uint64 ``(n,)``: at most 64 check bits).

Interleaving by ``d`` (``bitfault.memory.layout``): physical bit ``q`` of the segment of group
``g`` (words ``g*d .. g*d+d-1``) is physical bit ``q // d`` of word ``g*d + q % d``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bitfault.errors import ArgumentError
from bitfault.memory import lanes as ln

_ONE = np.uint64(1)


@dataclass(frozen=True, eq=False)
class WordFaults:
    """Faulty physical bits: sorted distinct word ``indices``, ``data`` masks (``(n,)``
    uint64, or ``(n, lanes)`` for words wider than 64 data bits) and ``check`` masks
    (``(n,)`` uint64) for each."""

    indices: np.ndarray
    data: np.ndarray
    check: np.ndarray

    def __post_init__(self) -> None:
        idx = np.asarray(self.indices, dtype=np.int64).reshape(-1)
        data = np.asarray(self.data, dtype=np.uint64)
        if data.ndim > 2:
            data = data.reshape(data.shape[0], int(np.prod(data.shape[1:])))
        elif data.ndim < 2:
            data = data.reshape(-1)
        check = np.asarray(self.check, dtype=np.uint64).reshape(-1)
        if not idx.size == data.shape[0] == check.size:
            raise ArgumentError("indices", self.indices, "one data and one check mask each",
                                tail=f", got {idx.size}, {data.shape[0]} and {check.size}")
        if idx.size and (idx[0] < 0 or np.any(np.diff(idx) <= 0)):
            raise ArgumentError("indices", self.indices, "sorted distinct word indices >= 0")
        for key, value in (("indices", idx), ("data", data), ("check", check)):
            object.__setattr__(self, key, value)

    def __len__(self) -> int:
        return int(self.indices.size)

    @property
    def lanes(self) -> int:
        """uint64 lanes of each data mask (1: one uint64 per word)."""
        return 1 if self.data.ndim == 1 else int(self.data.shape[1])

    def bit_errors(self) -> int:
        """The faulty physical bits, data and check."""
        return int(np.bitwise_count(self.data).sum()) + int(np.bitwise_count(self.check).sum())

    @classmethod
    def empty(cls, data_bits: int = 64) -> WordFaults:
        """No faulty bit, for words of ``data_bits`` data bits."""
        data = (np.zeros((0, ln.lanes(data_bits)), np.uint64) if ln.is_wide(data_bits)
                else np.zeros(0, np.uint64))
        return cls(np.zeros(0, np.int64), data, np.zeros(0, np.uint64))


def word_faults(cells: np.ndarray, width: int, data_bits: int) -> WordFaults:
    """``WordFaults`` of faulty cells (repeats allowed), cell ``c`` being physical bit
    ``c % width`` of word ``c // width``."""
    if not cells.size:
        return WordFaults.empty(data_bits)
    cells = np.sort(cells.astype(np.int64, copy=False))
    if cells.size > 1:  # distinct cells (a sort and a flag: cheaper than np.unique's hash)
        cells = cells[np.r_[True, cells[1:] != cells[:-1]]]
    words, pos = np.divmod(cells, width)
    in_data = pos < data_bits
    first = np.r_[True, words[1:] != words[:-1]]
    starts = np.flatnonzero(first)
    if ln.is_wide(data_bits):
        row = np.cumsum(first) - 1
        data = ln.set_bits(starts.size, row[in_data], pos[in_data], data_bits)
        check = ln.set_bits(starts.size, row[~in_data], pos[~in_data] - data_bits, 64)
        return WordFaults(words[starts], data, check)
    shift = np.where(in_data, pos, pos - data_bits).astype(np.uint64)
    bit = _ONE << shift
    zero = np.uint64(0)
    data_bit, check_bit = np.where(in_data, bit, zero), np.where(in_data, zero, bit)
    return WordFaults(words[starts], np.bitwise_or.reduceat(data_bit, starts),
                      np.bitwise_or.reduceat(check_bit, starts))


def interleaved_cells(group: np.ndarray, q: np.ndarray, width: int, interleave: int,
                      n_words: int) -> np.ndarray:
    """Cells (``word * width + bit``) of physical bits ``q`` of the segments of groups
    ``group`` under interleaving by ``interleave``; bits of words past ``n_words`` (a short
    last group) are dropped."""
    if interleave == 1:
        return group * width + q
    words = group * interleave + q % interleave
    keep = words < n_words
    return words[keep] * width + q[keep] // interleave


def full_masks(count: int, data_bits: int, check_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` data and check masks with every bit set."""
    low = ln.low_mask(data_bits)
    data = np.broadcast_to(low, (count, *np.shape(low))).copy()
    return data, np.full(count, np.uint64((1 << check_bits) - 1))


def bit_values(cells: np.ndarray, width: int, data_bits: int, data: np.ndarray,
               check: np.ndarray) -> np.ndarray:
    """The stored value (0 or 1, int64) of each cell of words ``(data, check)``."""
    words, pos = np.divmod(cells, width)
    in_data = pos < data_bits
    out = np.empty(cells.size, np.int64)
    out[in_data] = ln.bit_of(data, words[in_data], pos[in_data])
    out[~in_data] = ln.bit_of(check, words[~in_data], pos[~in_data] - data_bits)
    return out


__all__ = ["WordFaults", "bit_values", "full_masks", "interleaved_cells", "word_faults"]
