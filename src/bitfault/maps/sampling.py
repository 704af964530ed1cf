"""The fault-map sampler: where a random map's faults fall, from (seed, name, step).

Every stream is NumPy's PCG64, keyed by (seed, tensor name, step) through
``SeedSequence``, so the same seed gives the same map in every process and framework.

How a random map is drawn (``ber=``): hits arrive as a Poisson process of rate
1 per bit in "time", over the tensor's ``n x bits`` (element, bit position)
cells, each hit on a uniformly random cell, all from one stream per (seed, name,
step). A bit at position ``b`` is faulty if it has a hit before
``-log(1 - p_b)``. By Poisson splitting every bit is then faulty independently
with probability exactly ``p_b`` (so counts are Binomial), a lower rate's faults
are a subset of a higher rate's (nesting, per position too), the faults of
chosen positions are those of the full map at those positions, and the work is
proportional to the number of faults, not of bits. ``count=k`` takes the ``k``
bits hit first, one stream per bit position.
"""

from __future__ import annotations

import functools
import hashlib
import math
from typing import Any

import numpy as np
from numpy.random.bit_generator import ISeedSequence

_FIRST_CHUNK = 1 << 8
_MAX_BITS = 32
_MAX_CHUNK = 1 << 20
_MAX_MARKS = 1 << 30  # dense maps: one byte per (element, bit) cell up to this many cells
_BIT = np.left_shift(np.uint32(1), np.arange(32, dtype=np.uint32))


@functools.lru_cache(maxsize=4096)
def name_key(name: str) -> tuple[int, ...]:
    """Four 32-bit words from SHA-256 of the tensor name: stable across processes."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return tuple(int.from_bytes(digest[i:i + 4], "little") for i in range(0, 16, 4))


class _SeedWords(ISeedSequence):
    """Hands PCG64 the four 64-bit words SeedSequence made for one bit position."""

    __slots__ = ("words",)

    def __init__(self, words: np.ndarray) -> None:
        self.words = words

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        if np.dtype(dtype) != np.uint64 or n_words > self.words.size:
            raise ValueError("PCG64 asks for four uint64 words")
        return self.words[:n_words].copy()


@functools.lru_cache(maxsize=4096)
def _stream_words(seed: int, name: str, step: int | None) -> np.ndarray:
    """SeedSequence(seed, spawn_key=(name, step)) state: four uint64 words per bit position."""
    key = (*name_key(name), 0 if step is None else 1, 0 if step is None else int(step))
    words = np.random.SeedSequence(seed, spawn_key=key).generate_state(4 * _MAX_BITS, np.uint64)
    words.flags.writeable = False
    return words


@functools.lru_cache(maxsize=4096)
def _cell_words(seed: int, name: str, step: int | None) -> np.ndarray:
    key = (*name_key(name), 2, 0 if step is None else 1, 0 if step is None else int(step))
    words = np.random.SeedSequence(seed, spawn_key=key).generate_state(4, np.uint64)
    words.flags.writeable = False
    return words


def cell_stream(seed: int, name: str, step: int | None = None) -> np.random.Generator:
    """The PCG64 stream that places ``ber=`` faults on the (element, bit) cells of ``name``."""
    return np.random.Generator(np.random.PCG64(_SeedWords(_cell_words(seed, name, step))))


def rate_faults(n: int, width: int, rates: dict[int, float], seed: int, name: str,
                step: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Sorted element indices and masks of a ``ber=`` map (``rates``: position -> rate).

    One stream over the ``n * width`` cells, cell ``c`` being bit ``c % width`` of element
    ``c // width``: drawn up to the largest horizon, a hit counts if it comes before its
    own position's horizon. Positions at rate 1 are every element.
    """
    uniform = set(rates.values())
    if n and len(uniform) == 1 and 0.0 < (p := uniform.pop()) < 1.0:  # most maps: one rate
        cells, _ = poisson_hits(n * width, cell_stream(seed, name, step), _horizon(p, n * width))
        if len(rates) < width:  # keep the hits on the chosen positions
            chosen = np.zeros(width, dtype=bool)
            chosen[list(rates)] = True
            cells = cells[chosen[cells % width]]
        return _from_cells(n, width, cells)
    horizon = np.full(width, -np.inf)  # -inf: no faults at that position
    parts = []
    for pos, p in rates.items():
        if n and p >= 1.0:
            parts.append(np.arange(n, dtype=np.int64) * width + pos)
        elif n and p > 0.0:
            horizon[pos] = _horizon(p, n * width)
    drawn = horizon[np.isfinite(horizon)]
    if drawn.size:
        end = float(drawn.max())
        uneven = bool((drawn < end).any())
        cells, times = poisson_hits(n * width, cell_stream(seed, name, step), end,
                                    with_times=uneven)
        if uneven or drawn.size < width:  # keep each hit before its own position's horizon
            pos = cells % width
            cells = cells[times < horizon[pos]] if uneven else cells[np.isfinite(horizon)[pos]]
        parts.append(cells)
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.uint32)
    return _from_cells(n, width, np.concatenate(parts) if len(parts) > 1 else parts[0])


def _from_cells(n: int, width: int, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted element indices and OR-ed masks of faulty cells (repeats allowed), cell ``c``
    being bit ``c % width`` of element ``c // width``.

    Sparse: sorting the distinct cells orders them by element, so OR-ing each run of bits
    gives the masks. Dense (more cells than two per element): a flag per cell, packed
    eight to a byte, is each element's mask. Both give the same bits.
    """
    if cells.size > 2 * n and n * width <= _MAX_MARKS:
        row = -(-width // 8) * 8  # an element's bits, rounded up to whole bytes
        marks = np.zeros(n * row, dtype=bool)
        marks[cells if row == width else (cells // width) * row + cells % width] = True
        packed = np.packbits(marks.reshape(n, row), axis=1, bitorder="little")
        if packed.shape[1] < 4:
            packed = np.concatenate([packed, np.zeros((n, 4 - packed.shape[1]), np.uint8)], 1)
        acc = packed.view("<u4").reshape(n)
        idx = np.flatnonzero(acc)
        return idx, acc[idx].astype(np.uint32)
    if not cells.size:
        return np.zeros(0, np.int64), np.zeros(0, np.uint32)
    cells = np.sort(cells)  # repeats need no removal: OR-ing a bit twice sets it once
    pow2 = width & (width - 1) == 0  # then shifts and masks split a cell
    elems = cells >> (width.bit_length() - 1) if pow2 else cells // width
    bits = _BIT[cells & (width - 1) if pow2 else cells % width]
    first = np.empty(elems.size, dtype=bool)  # the first cell of each element
    first[0] = True
    np.not_equal(elems[1:], elems[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    return elems[starts].astype(np.int64), np.bitwise_or.reduceat(bits, starts)


def bit_stream(seed: int, name: str, position: int, step: int | None = None) -> np.random.Generator:
    """The PCG64 stream that places ``count=`` faults on bit ``position`` of tensor ``name``.

    One ``SeedSequence`` per (seed, name, step) makes the state of every position's
    stream (exactly the four words PCG64 would ask it for); building a generator
    from them costs microseconds instead of a SeedSequence per position.
    """
    words = _stream_words(seed, name, step)
    return np.random.Generator(np.random.PCG64(_SeedWords(words[4 * position:4 * position + 4])))


def poisson_hits(n: int, rng: np.random.Generator, horizon: float,
                 with_times: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """Elements hit before time ``horizon`` (with repeats) in time order, and their times.

    The stream is consumed in a fixed chunk schedule (set by ``n`` alone) and a chunk's end time is
    ``carry + sum(gaps)`` whether or not times are wanted, so the hits before any
    horizon are a prefix of the hits before a later one.
    """
    elements: list[np.ndarray] = []
    times: list[np.ndarray] = []
    carry, size = 0.0, min(max(_FIRST_CHUNK, n >> 10), 1 << 13)  # by size, never by rate
    index_dtype = np.uint32 if n <= 1 << 32 else np.int64
    while True:
        chunk = rng.standard_exponential(size)
        end = carry + float(chunk.sum())
        if end < horizon:  # the whole chunk lies before the horizon
            elements.append(rng.integers(0, n, size, dtype=index_dtype))
            if with_times:
                times.append(np.cumsum(chunk) + carry)
            carry, size = end, min(size * 2, _MAX_CHUNK)
            continue
        t = _times_past(chunk, carry, horizon)
        cut = int(np.searchsorted(t, horizon, side="left"))
        # the chunk's first `cut` elements: the same draws as the first `cut` of `size`
        e = rng.integers(0, n, cut, dtype=index_dtype)
        if not elements:  # the common case: one chunk was enough
            return e, t[:cut] if with_times else None
        elements.append(e)
        times.append(t[:cut])
        break
    return np.concatenate(elements), np.concatenate(times) if with_times else None


def _times_past(gaps: np.ndarray, carry: float, horizon: float) -> np.ndarray:
    """A prefix of ``cumsum(gaps) + carry`` reaching ``horizon`` (the same sums, added in
    the same order, as over all ``gaps``), for a chunk whose end lies past ``horizon``:
    the hits wanted are often a small part of the last chunk."""
    need = horizon - carry  # about as many gaps as that: they average 1
    k = min(gaps.size, int(need + 4.0 * math.sqrt(need) + 32.0))
    sums = np.cumsum(gaps[:k])
    while k < gaps.size and sums[-1] + carry < horizon:  # rarely: carry on summing
        more = gaps[k:2 * k].copy()
        more[0] += sums[-1]  # continues the running sum exactly
        sums = np.concatenate([sums, np.cumsum(more)])
        k = sums.size
    if carry:
        sums += carry
    return sums


def _first_hits(e: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct elements of a time-ordered hit list, with the time of each one's first hit."""
    order = np.argsort(e, kind="stable")
    es = e[order]
    starts = np.flatnonzero(np.r_[True, es[1:] != es[:-1]]) if es.size else order
    return es[starts], t[order][starts]


def _horizon(p: float, n: int) -> float:
    return math.inf if p >= 1.0 else -n * math.log1p(-p)


def count_faults(n: int, width: int, positions: tuple[int, ...], count: Any, seed: int,
                 name: str, step: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Sorted element indices and masks of a ``count=`` map: of the eligible bits (bit
    ``positions`` of ``n`` elements ``width`` bits wide), the ``count`` hit first."""
    eligible = n * len(positions)
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
        raise TypeError(f"count must be an integer in 0..{eligible}, got {count!r}")
    if not 0 <= count <= eligible:
        raise ValueError(f"count must be in 0..{eligible} (the eligible bits: {n} elements x "
                         f"{len(positions)} positions), got {count}")
    if count == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.uint32)
    if count == eligible:
        cells = np.arange(n, dtype=np.int64)[:, None] * width + np.array(positions)
        return _from_cells(n, width, cells.reshape(-1))
    # Take the `count` bits with the earliest first hit, widening the horizon until
    # enough distinct bits have been hit; the streams replay identically each time.
    horizon = _horizon(min(0.5, 2.0 * count / eligible), n)
    while True:
        elems, times, pos_of = [], [], []
        for pos in positions:
            e, t = poisson_hits(n, bit_stream(seed, name, pos, step), horizon, with_times=True)
            e, t = _first_hits(e, t)
            elems.append(e)
            times.append(t)
            pos_of.append(np.full(e.size, pos, np.int64))
        all_t = np.concatenate(times)
        if all_t.size >= count:
            break
        horizon *= 2.0  # finite: every bit is hit eventually
    keep = np.argsort(all_t, kind="stable")[:count]
    all_e, all_p = np.concatenate(elems)[keep], np.concatenate(pos_of)[keep]
    return _from_cells(n, width, all_e.astype(np.int64) * width + all_p)


__all__ = ["bit_stream", "cell_stream", "count_faults", "name_key", "poisson_hits",
           "rate_faults"]
