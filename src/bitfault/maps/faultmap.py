"""Fault maps: where the faults are, for one named tensor.

A map is sparse: sorted flat element indices and, for each, a mask of faulty
bits. Random maps come from NumPy (PCG64) streams keyed by (seed, tensor name,
step) through ``SeedSequence``, so the same seed gives the same map in every
process and framework.

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
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.random.bit_generator import ISeedSequence

from bitfault.errors import check_rate, check_seed
from bitfault.faults import BitSelection, resolve_bits
from bitfault.formats import Format, is_format

MAP_FILE_VERSION = 2  # 2: a checksum over the whole header (1: over the faults only)
_FIRST_CHUNK = 1 << 8
_MAX_BITS = 32
_MAX_CHUNK = 1 << 20
_MAX_MARKS = 1 << 30  # dense maps: one byte per (element, bit) cell up to this many cells
_BIT = np.left_shift(np.uint32(1), np.arange(32, dtype=np.uint32))


def _popcount(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.uint32)
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(x)
    return np.unpackbits(x.view(np.uint8).reshape(*x.shape, 4), axis=-1).sum(-1)


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


def _rate_faults(n: int, width: int, rates: dict[int, float], seed: int, name: str,
                 step: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Sorted element indices and masks of a ``ber=`` map (``rates``: position -> rate).

    One stream over the ``n * width`` cells, cell ``c`` being bit ``c % width`` of element
    ``c // width``: drawn up to the largest horizon, a hit counts if it comes before its
    own position's horizon. Positions at rate 1 are every element.
    """
    uniform = set(rates.values())
    if n and len(uniform) == 1 and 0.0 < (p := uniform.pop()) < 1.0:  # most maps: one rate
        cells, _ = _hits(n * width, cell_stream(seed, name, step), _horizon(p, n * width))
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
        cells, times = _hits(n * width, cell_stream(seed, name, step), end, with_times=uneven)
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


def _hits(n: int, rng: np.random.Generator, horizon: float,
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


def _rates_by_position(ber: Any, fmt: Format, positions: tuple[int, ...]) -> dict[int, float]:
    """One rate per eligible bit position, from a scalar, a sequence or a mapping."""
    if isinstance(ber, Mapping):
        rates: dict[int, float] = {}
        for key, value in ber.items():
            for pos in resolve_bits(key, fmt, argument="ber"):
                rates[pos] = check_rate(value, f"ber[{key!r}]")
        return {p: rates.get(p, 0.0) for p in positions}
    if isinstance(ber, (Sequence, np.ndarray)) and not isinstance(ber, str):
        values = list(ber)
        if len(values) != fmt.bits:
            raise ValueError(
                f"ber as a sequence needs one rate per bit position ({fmt.bits} for this "
                f"format, LSB first), got {len(values)}")
        return {p: check_rate(values[p], f"ber[{p}]") for p in positions}
    rate = check_rate(ber, "ber")
    return dict.fromkeys(positions, rate)


def _shape_tuple(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        dims = tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError(f"shape must be a tuple of non-negative ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"shape must be a tuple of non-negative ints, got {shape!r}")
    return dims


@dataclass(frozen=True, eq=False)
class FaultMap:
    """Faulty bits of one tensor: sorted flat ``indices`` and a uint32 ``masks`` entry each.

    ``meta`` records where the map came from (source, format, fault model, seed,
    rate or count, bit positions, step) and travels with ``save``/``load``.
    """

    shape: tuple[int, ...]
    indices: np.ndarray
    masks: np.ndarray
    name: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _shape_tuple(self.shape))
        idx = np.asarray(self.indices, dtype=np.int64).reshape(-1)
        masks = np.asarray(self.masks).reshape(-1)
        if masks.dtype.kind not in "iu":
            raise TypeError(f"masks must be an integer array, got dtype {masks.dtype}")
        if idx.shape != masks.shape:
            raise ValueError(f"indices and masks must have the same length, got {idx.size} "
                             f"and {masks.size}")
        size = math.prod(self.shape)
        if idx.size and (idx[0] < 0 or idx[-1] >= size or np.any(np.diff(idx) <= 0)):
            raise ValueError(f"indices must be sorted, distinct and in 0..{size - 1} "
                             f"for shape {self.shape}")
        if masks.dtype.kind == "i" and masks.size and masks.min() < 0:
            masks = masks.view(f"u{masks.dtype.itemsize}")
        if masks.size and int(masks.max()) >= 1 << 32:
            raise ValueError("masks must fit in 32 bits")
        idx.flags.writeable = False
        masks = masks.astype(np.uint32, copy=False)
        masks.flags.writeable = False
        object.__setattr__(self, "indices", idx)
        object.__setattr__(self, "masks", masks)

    # ---- constructors -------------------------------------------------------------------

    @classmethod
    def _checked(cls, shape: tuple[int, ...], indices: np.ndarray, masks: np.ndarray,
                 name: str, meta: dict[str, Any]) -> FaultMap:
        """A map from arrays this module built: sorted distinct int64 ``indices`` in range
        and uint32 ``masks`` (validating them again costs more than drawing a small map)."""
        fmap = object.__new__(cls)
        indices.flags.writeable = False
        masks.flags.writeable = False
        for key, value in (("shape", shape), ("indices", indices), ("masks", masks),
                           ("name", name), ("meta", meta)):
            object.__setattr__(fmap, key, value)
        return fmap

    @classmethod
    def empty(cls, shape: Any, name: str = "") -> FaultMap:
        """A map with no fault: the tensor is stored in its format and read back as stored."""
        return cls(shape, np.zeros(0, np.int64), np.zeros(0, np.uint32), name, {"source": "none"})

    @classmethod
    def from_mask(cls, mask: Any, name: str = "", fmt: Format | None = None,
                  fault: Any = None) -> FaultMap:
        """A map from a dense integer mask (a 1 bit wherever a fault is), like the seed's fmap."""
        arr = np.asarray(mask)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"mask must be an integer array, got dtype {arr.dtype}")
        flat = arr.reshape(-1)
        if arr.dtype.kind == "i":
            flat = flat.view(f"u{arr.dtype.itemsize}")
        if flat.size and int(flat.max()) >= 1 << 32:
            raise ValueError("mask values must fit in 32 bits")
        idx = np.flatnonzero(flat)
        meta: dict[str, Any] = {"source": "mask"}
        if fmt is not None:
            meta["format"] = fmt.to_dict()
        if fault is not None:
            meta["fault"] = fault.to_dict()
        return cls(arr.shape, idx, flat[idx].astype(np.uint32), name, meta)

    @classmethod
    def random(
        cls,
        shape: Any,
        fmt: Format,
        *,
        ber: float | Sequence[float] | Mapping[Any, float] | None = None,
        count: int | None = None,
        seed: int = 0,
        name: str = "",
        bits: BitSelection = None,
        step: int | None = None,
        fault: Any = None,
    ) -> FaultMap:
        """Random faulty bits: each eligible bit with probability ``ber``, or exactly ``count``.

        ``ber`` may be one rate, one rate per bit position (LSB first) or a mapping
        from positions / field names to rates. ``bits`` limits the eligible
        positions (ints or field names). ``step`` gives transient maps a fresh,
        replayable draw per step. Reproducible from (seed, name, step), nested in
        ``ber`` and in ``count``.
        """
        dims = _shape_tuple(shape)
        if not is_format(fmt):
            raise TypeError(f"fmt must be a bitfault format (FixedPoint, IntQuant, Float), "
                            f"got {fmt!r}")
        seed = check_seed(seed)
        if not isinstance(name, str):
            raise TypeError(f"name must be a string, got {name!r}")
        if step is not None and (isinstance(step, bool) or not isinstance(step, (int, np.integer))
                                 or step < 0):
            raise ValueError(f"step must be None or a non-negative integer, got {step!r}")
        if (ber is None) == (count is None):
            raise ValueError("give exactly one of ber= (a bit error rate) or count= (a number "
                             "of faulty bits)")
        positions = resolve_bits(bits, fmt)
        n = math.prod(dims)
        meta: dict[str, Any] = {"source": "random", "format": fmt.to_dict(), "seed": seed,
                                "bits": list(positions), "step": step}
        if fault is not None:
            meta["fault"] = fault.to_dict()
        if ber is not None:
            rates = _rates_by_position(ber, fmt, positions)
            meta["ber"] = ber if isinstance(ber, (int, float)) else [
                rates.get(p, 0.0) for p in range(fmt.bits)]
            idx, masks = _rate_faults(n, fmt.bits, rates, seed, name, step)
        else:
            idx, masks = cls._exact_count(n, fmt.bits, positions, count, seed, name, step)
            meta["count"] = int(count)  # type: ignore[arg-type]
        return cls._checked(dims, idx, masks.astype(np.uint32, copy=False), name, meta)

    @staticmethod
    def _exact_count(n: int, width: int, positions: tuple[int, ...], count: Any, seed: int,
                     name: str, step: int | None) -> tuple[np.ndarray, np.ndarray]:
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
                e, t = _hits(n, bit_stream(seed, name, pos, step), horizon, with_times=True)
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

    # ---- views --------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Elements in the tensor the map is for."""
        return math.prod(self.shape)

    @property
    def n_faults(self) -> int:
        """Faulty bits in the map."""
        return int(_popcount(self.masks).sum())

    @property
    def n_elements(self) -> int:
        """Elements with at least one faulty bit."""
        return int(self.indices.size)

    def bit_counts(self, width: int = 32) -> np.ndarray:
        """Faulty bits per bit position (LSB first)."""
        return np.array([int(np.count_nonzero(self.masks & np.uint32(1 << b)))
                         for b in range(width)])

    def to_dense(self, dtype: Any = np.uint32) -> np.ndarray:
        """The dense mask, shape ``self.shape``; signed dtypes hold the same bit patterns."""
        dt = np.dtype(dtype)
        out = np.zeros(self.size, dtype=f"u{dt.itemsize}")
        if self.masks.size and dt.itemsize < 4 and int(self.masks.max()) >= 1 << (8 * dt.itemsize):
            raise ValueError(f"masks use bits beyond a {dt} container")
        out[self.indices] = self.masks.astype(out.dtype)
        return out.view(dt).reshape(self.shape)

    def restricted(self, bits: int) -> FaultMap:
        """The same map with only the faults whose positions are set in mask ``bits``."""
        masks = self.masks & np.uint32(bits)
        keep = masks != 0
        return FaultMap(self.shape, self.indices[keep], masks[keep], self.name, dict(self.meta))

    def digest(self) -> str:
        """SHA-256 of shape, indices and masks: the faults (the chip), what campaigns record
        per trial; equal faults have equal digests (computed once: the arrays are read-only).
        A map file also checks its name and ``meta`` (``save``)."""
        found = self.__dict__.get("_digest")
        if found is None:
            h = hashlib.sha256(json.dumps(list(self.shape)).encode())
            h.update(self.indices.tobytes())
            h.update(self.masks.tobytes())
            found = self.__dict__["_digest"] = h.hexdigest()
        return found

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FaultMap):
            return NotImplemented
        return (self.shape == other.shape and self.name == other.name
                and np.array_equal(self.indices, other.indices)
                and np.array_equal(self.masks, other.masks))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"FaultMap(name={self.name!r}, shape={self.shape}, faults={self.n_faults}, "
                f"elements={self.n_elements}, meta={self.meta})")

    # ---- files ----------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the map to an ``.npz`` file with its provenance and a checksum over all of
        it (name, shape, meta, faults), through a temporary file renamed into place."""
        header = {"version": MAP_FILE_VERSION, "name": self.name, "shape": list(self.shape),
                  "meta": self.meta, "digest": self.digest()}
        header["checksum"] = _header_checksum(header)
        path = os.fspath(path)
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as fh:
                np.savez_compressed(fh, header=np.array(json.dumps(header)),
                                    indices=self.indices, masks=self.masks)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, shape: Any = None,
             name: str | None = None) -> FaultMap:
        """Read a map written by ``save``; ``shape``/``name`` check it fits its tensor."""
        try:
            with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as data:
                header = json.loads(str(data["header"]))
                indices, masks = data["indices"], data["masks"]
        except FileNotFoundError:
            raise
        except Exception as exc:  # zipfile, KeyError, JSON, ...
            raise ValueError(f"{os.fspath(path)}: not a bitfault fault map file "
                             f"({type(exc).__name__}: {exc})") from None
        if not isinstance(header, dict) or header.get("version") not in (1, MAP_FILE_VERSION):
            found = header.get("version") if isinstance(header, dict) else header
            raise ValueError(f"{os.fspath(path)}: fault map file version {found!r}, expected "
                             f"{MAP_FILE_VERSION} (or 1)")
        if header["version"] >= 2 and header.get("checksum") != _header_checksum(header):
            raise ValueError(f"{os.fspath(path)}: corrupted fault map (its header's checksum "
                             "does not match: the name, shape or metadata were changed)")
        try:
            fmap = cls(tuple(header["shape"]), indices, masks, header["name"], header["meta"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{os.fspath(path)}: corrupted fault map ({exc})") from None
        if fmap.digest() != header.get("digest"):
            raise ValueError(f"{os.fspath(path)}: corrupted fault map (digest mismatch)")
        if shape is not None and fmap.shape != _shape_tuple(shape):
            raise ValueError(f"{os.fspath(path)}: map is for shape {fmap.shape}, "
                             f"the tensor has shape {_shape_tuple(shape)}")
        if name is not None and fmap.name != name:
            raise ValueError(f"{os.fspath(path)}: map is for tensor {fmap.name!r}, not {name!r}")
        return fmap


def _header_checksum(header: Mapping[str, Any]) -> str:
    """SHA-256 of a map file's header (all of it but the checksum; its ``digest`` covers the
    faults), so an edited name, shape or meta does not load silently."""
    body = {k: v for k, v in header.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


__all__ = ["FaultMap", "bit_stream", "name_key"]
