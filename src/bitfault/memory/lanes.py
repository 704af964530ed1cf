"""Memory words wider than 64 bits as rows of uint64 lanes.

A word of at most 64 bits is one ``uint64`` (arrays of shape ``(n,)``: the fast path).
A wider word (65..256 bits) is ``lanes(bits)`` uint64 lanes, LSB first: bit ``b`` of the
word is bit ``b % 64`` of lane ``b // 64`` (arrays of shape ``(n, lanes)``). The layout,
the protection codes and the fault patterns share these helpers, so one convention holds
everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from bitfault.errors import ArgumentError

MAX_WORD_BITS = 256
LANE = 64
_ONE = np.uint64(1)


def lanes(bits: int) -> int:
    """uint64 lanes of a ``bits``-bit word: 1 up to 64 bits (then a word is one uint64)."""
    return 1 if bits <= LANE else -(-bits // LANE)


def is_wide(bits: int) -> bool:
    """True when ``bits``-bit words are stored as ``(n, lanes)`` arrays."""
    return bits > LANE


def low_mask(bits: int) -> np.ndarray:
    """The mask of a word's ``bits`` low bits: a uint64 scalar array (narrow) or one
    ``(lanes,)`` row (wide)."""
    if not is_wide(bits):
        return np.uint64((1 << bits) - 1)
    return from_ints([(1 << bits) - 1], bits)[0]


def from_ints(values: Iterable[int], bits: int) -> np.ndarray:
    """Python ints (each below ``2**bits``) as words: ``(n,)`` uint64, or ``(n, lanes)``."""
    vals = [int(v) for v in values]
    if any(v < 0 or v >> bits for v in vals):
        raise ArgumentError("values", vals, f"non-negative ints of at most {bits} bits")
    if not is_wide(bits):
        return np.array(vals, np.uint64)
    k = lanes(bits)
    rows = [[(v >> (LANE * j)) & ((1 << LANE) - 1) for j in range(k)] for v in vals]
    return np.array(rows, np.uint64).reshape(len(vals), k)


def to_ints(words: Any) -> list[int]:
    """Words (``(n,)`` or ``(n, lanes)`` uint64) as Python ints."""
    arr = np.asarray(words, dtype=np.uint64)
    if arr.ndim == 1:
        return [int(x) for x in arr]
    return [sum(int(x) << (LANE * j) for j, x in enumerate(row)) for row in arr]


def parity(words: np.ndarray) -> np.ndarray:
    """Even parity (0 or 1, uint64) of each word: over its lanes for an ``(n, lanes)``
    array (the last axis), of each uint64 otherwise."""
    counts = np.bitwise_count(words)
    if words.ndim >= 2:
        counts = counts.sum(axis=-1, dtype=np.uint64)
    return (counts & np.uint8(1)).astype(np.uint64)


def join_fields(fields: np.ndarray, bits: int, n_lanes: int) -> np.ndarray:
    """Wide words ``(n, n_lanes)`` from ``(n, k)`` fields of ``bits`` bits each, field
    ``i`` at bits ``[i * bits, (i + 1) * bits)`` (a field may straddle two lanes)."""
    n, k = fields.shape
    if LANE % bits == 0:  # whole fields per lane: one shift-or per lane
        per = LANE // bits
        padded = np.zeros((n, n_lanes * per), np.uint64)
        padded[:, :k] = fields
        shifts = np.arange(per, dtype=np.uint64) * np.uint64(bits)
        return np.bitwise_or.reduce(padded.reshape(n, n_lanes, per) << shifts, axis=2)
    out = np.zeros((n, n_lanes), np.uint64)
    for i in range(k):
        lane, shift = divmod(i * bits, LANE)
        out[:, lane] |= fields[:, i] << np.uint64(shift)
        if shift + bits > LANE:
            out[:, lane + 1] |= fields[:, i] >> np.uint64(LANE - shift)
    return out


def split_fields(words: np.ndarray, bits: int, k: int) -> np.ndarray:
    """The ``(n, k)`` fields of ``bits`` bits of wide words ``(n, lanes)``: the inverse of
    ``join_fields``."""
    n, n_lanes = words.shape
    low = np.uint64((1 << bits) - 1)
    if LANE % bits == 0:
        per = LANE // bits
        shifts = np.arange(per, dtype=np.uint64) * np.uint64(bits)
        parts = (words[:, :, None] >> shifts) & low
        return parts.reshape(n, n_lanes * per)[:, :k]
    out = np.zeros((n, k), np.uint64)
    for i in range(k):
        lane, shift = divmod(i * bits, LANE)
        value = words[:, lane] >> np.uint64(shift)
        if shift + bits > LANE:
            value = value | (words[:, lane + 1] << np.uint64(LANE - shift))
        out[:, i] = value & low
    return out


def set_bits(n: int, rows: np.ndarray, pos: np.ndarray, bits: int) -> np.ndarray:
    """``n`` words (of ``bits`` bits) with bit ``pos[j]`` of word ``rows[j]`` set (a bit
    given twice is set once)."""
    if not is_wide(bits):
        out = np.zeros(n, np.uint64)
        np.bitwise_or.at(out, rows, _ONE << pos.astype(np.uint64))
        return out
    out = np.zeros((n, lanes(bits)), np.uint64)
    lane, shift = np.divmod(pos.astype(np.int64), LANE)
    np.bitwise_or.at(out, (rows, lane), _ONE << shift.astype(np.uint64))
    return out


def bit_of(words: np.ndarray, rows: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Bit ``pos[j]`` (0 or 1, int64) of word ``rows[j]`` of ``words`` (narrow or wide)."""
    pos = pos.astype(np.int64)
    if words.ndim == 1:
        return ((words[rows] >> pos.astype(np.uint64)) & _ONE).astype(np.int64)
    lane, shift = np.divmod(pos, LANE)
    return ((words[rows, lane] >> shift.astype(np.uint64)) & _ONE).astype(np.int64)


__all__ = ["LANE", "MAX_WORD_BITS", "bit_of", "from_ints", "is_wide", "join_fields", "lanes",
           "low_mask", "parity", "set_bits", "split_fields", "to_ints"]
