"""Fault patterns over memory words: which physical bits of which words are faulty.

A physical memory word is ``data_bits + check_bits`` wide: bits ``0..data_bits-1`` are
its data bits (``bitfault.memory.layout``, up to 256), the bits above them its check bits, in
that order (``bitfault.memory.codes``). A pattern's ``draw`` returns ``WordFaults``
(``maps.wordfaults``): sorted word indices with a data mask (uint64, or ``(n, lanes)``
uint64 lanes above 64 data bits) and a check mask (uint64: a 72-bit word does not fit
one) of the bits that are faulty. A bit hit twice is faulty once (masks are OR-ed), so
every pattern is nested in its rates.

Interleaving (``draw(..., interleave=d)``, ``WordLayout.interleave``): ``d`` code words
share a physical segment of ``d * width`` bits, physical bit ``q`` being bit ``q // d`` of
word ``q % d`` of the group. Multi-bit upsets and columns are drawn in physical
positions; independent bits, rows and asymmetric cells are per bit or per word and keep
their law (and their draws). ``d = 1`` draws exactly what it drew before interleaving.

Every draw comes from the sampler's PCG64 streams (``bitfault.maps.sampling``), keyed by
(seed, name, step), at a cost proportional to the faults, through one Poisson process
per pattern: hits arrive at rate 1 per cell (a physical bit, a word, a column, a row) in
"time", and a cell is faulty if hit before ``-log(1 - p)``. So each cell is faulty
independently with probability exactly ``p``, and a lower rate's faults are a subset of
a higher rate's.

- ``IndependentBits(ber)``: every physical bit independently (today's maps, in words:
  with no check bits and no padding, the same cells as ``FaultMap.random``);
- ``MultiBitUpset(rate, sizes)``: events per word slot (a slot has at least one with
  probability ``rate``), each flipping ``k`` adjacent physical bits of the slot's segment
  (its word; with interleaving its group's ``d * width`` bits), ``k`` drawn from
  ``sizes``, its first bit uniform in ``0..d*width-k``: never across segments;
- ``ColumnFaults(rate)``: each (row, physical bit position of a segment) faulty with
  probability ``rate``; a faulty column hits that bit in every segment of the row (with
  ``d = 1``: that bit of every word);
- ``RowFaults(rate)``: each row faulty with probability ``rate``; a faulty row hits every
  bit of its words (``row_words=1``: whole-word faults);
- ``Asymmetric(p10, p01)``: each stored 1 fails (reads 0) with probability ``p10``, each
  stored 0 with probability ``p01``; needs the stored words (``stored=``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError, check_choice, check_int, check_rate
from bitfault.faults.word_faults import (
    WordFaults,
    bit_values,
    full_masks,
    interleaved_cells,
    word_faults,
)
from bitfault.maps.sampling import cell_stream, poisson_hits
from bitfault.memory import lanes as ln
from bitfault.memory.layout import check_interleave


def _stream(seed: int, name: str, tag: str, step: int | None) -> np.random.Generator:
    """The pattern's stream: the sampler's cell stream of ``name`` (``tag`` empty) or of a
    name no tensor has (``name`` NUL ``tag``), so patterns do not share draws."""
    return cell_stream(seed, f"{name}\x00{tag}" if tag else name, step)


def _horizon(p: float, n: int) -> float:
    return -n * math.log1p(-p)


def poisson_cells(n: int, p: float, rng: np.random.Generator) -> np.ndarray:
    """Cells of ``0..n-1`` hit before ``p``'s horizon (each faulty with probability ``p``),
    with repeats, in time order; every cell when ``p`` is 1."""
    if n == 0 or p <= 0.0:
        return np.zeros(0, np.int64)
    if p >= 1.0:
        return np.arange(n, dtype=np.int64)
    cells, _ = poisson_hits(n, rng, _horizon(p, n))
    return cells.astype(np.int64)


def _check_geometry(n_words: Any, data_bits: Any, check_bits: Any) -> tuple[int, int, int]:
    return (check_int(n_words, "n_words", 0),
            check_int(data_bits, "data_bits", 1, ln.MAX_WORD_BITS),
            check_int(check_bits, "check_bits", 0, 64))


def _rows(n_words: int, row_words: int | None) -> tuple[int, int]:
    """(rows, words per row)."""
    length = max(n_words, 1) if row_words is None else check_int(row_words, "row_words", 1)
    return -(-n_words // length), length


def _row_words(rows: np.ndarray, length: int, n_words: int) -> tuple[np.ndarray, np.ndarray]:
    """The words of each row in ``rows`` (flat) and the index of the row each came from."""
    starts = rows * length
    counts = np.minimum(starts + length, n_words) - starts
    owner = np.repeat(np.arange(rows.size), counts)
    offsets = np.arange(owner.size) - np.repeat(np.cumsum(counts) - counts, counts)
    return starts[owner] + offsets, owner


@dataclass(frozen=True)
class _Request:
    """One draw's checked geometry and keys, as every pattern reads them."""

    n: int
    data_bits: int
    check_bits: int
    seed: int
    name: str
    step: int | None
    row_words: int | None
    stored: tuple[np.ndarray, np.ndarray] | None
    interleave: int = 1

    @property
    def width(self) -> int:
        return self.data_bits + self.check_bits

    def stream(self, tag: str) -> np.random.Generator:
        return _stream(self.seed, self.name, tag, self.step)


class _Pattern:
    kind: ClassVar[str]

    def draw(self, n_words: int, data_bits: int, check_bits: int = 0, *, seed: int = 0,
             name: str = "", step: int | None = None, row_words: int | None = None,
             stored: tuple[np.ndarray, np.ndarray] | None = None,
             interleave: int = 1) -> WordFaults:
        """The faulty bits of ``n_words`` words of ``data_bits + check_bits`` bits, in rows
        of ``row_words`` words, ``interleave`` words per physical segment."""
        n, data_bits, check_bits = _check_geometry(n_words, data_bits, check_bits)
        if row_words is not None:
            row_words = check_int(row_words, "row_words", 1)
        d = check_interleave(interleave, row_words)
        return self._draw(_Request(n, data_bits, check_bits, seed, name, step, row_words,
                                   stored, d))

    def _draw(self, r: _Request) -> WordFaults:
        raise NotImplementedError

    def _check_rates(self, *names: str) -> None:
        for key in names:
            object.__setattr__(self, key, check_rate(getattr(self, key), key))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **vars(self)}


@dataclass(frozen=True)
class IndependentBits(_Pattern):
    """Every physical bit faulty independently with probability ``ber``."""

    ber: float
    kind: ClassVar[str] = "independent"

    def __post_init__(self) -> None:
        self._check_rates("ber")

    def _draw(self, r: _Request) -> WordFaults:
        n, data_bits, width = r.n, r.data_bits, r.width
        cells = poisson_cells(n * width, self.ber, r.stream(""))
        return word_faults(cells, width, data_bits)


@dataclass(frozen=True)
class MultiBitUpset(_Pattern):
    """Upset events, each flipping ``k`` adjacent bits of one word, ``k`` drawn from
    ``sizes`` ({size: probability}, normalised); a word is hit with probability ``rate``."""

    rate: float
    sizes: Mapping[int, float] = field(default_factory=lambda: {1: 0.8, 2: 0.15, 3: 0.05})
    kind: ClassVar[str] = "mbu"

    def __post_init__(self) -> None:
        rate = check_rate(self.rate, "rate")
        if rate >= 1.0:
            raise ArgumentError("rate", self.rate, "in [0, 1) (a word's chance of an upset)")
        object.__setattr__(self, "rate", rate)
        if not isinstance(self.sizes, Mapping) or not self.sizes:
            raise ArgumentTypeError("sizes", self.sizes, "a mapping {bits: probability}")
        sizes: dict[int, float] = {}
        for key, value in self.sizes.items():
            k = int(key) if isinstance(key, str) and key.isdigit() else key
            sizes[check_int(k, "sizes", 1)] = check_rate(value, f"sizes[{key!r}]")
        total = sum(sizes.values())
        if total <= 0.0:
            raise ArgumentError("sizes", self.sizes, "probabilities with a positive sum")
        object.__setattr__(self, "sizes", {k: sizes[k] / total for k in sorted(sizes)})

    def _draw(self, r: _Request) -> WordFaults:
        n, data_bits, width, d = r.n, r.data_bits, r.width, r.interleave
        segment = d * width
        if max(self.sizes) > segment:
            where = (f"the word's {width} bits" if d == 1 else
                     f"the {segment} bits of {d} interleaved words of {width} bits")
            raise ArgumentError("sizes", dict(self.sizes), f"sizes of at most {where}",
                                tail=f", got {max(self.sizes)}")
        words = poisson_cells(n, self.rate, r.stream("mbu"))
        if not words.size:
            return WordFaults.empty(data_bits)
        # event j's size and first bit come from the j-th pair of uniforms: nested in rate
        u = r.stream("mbu-shape").random((words.size, 2))
        values = np.array(list(self.sizes), np.int64)
        cdf = np.cumsum(list(self.sizes.values()))
        k = values[np.minimum(np.searchsorted(cdf, u[:, 0], side="right"), values.size - 1)]
        start = np.floor(u[:, 1] * (segment - k + 1)).astype(np.int64)
        offsets = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
        if d == 1:
            cells = np.repeat(words * width + start, k) + offsets
        else:  # physical bits of the event's group segment
            q = np.repeat(start, k) + offsets
            cells = interleaved_cells(np.repeat(words // d, k), q, width, d, n)
        return word_faults(cells, width, data_bits)

    def __hash__(self) -> int:
        return hash((self.rate, tuple(self.sizes.items())))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rate": self.rate, "sizes": dict(self.sizes)}


@dataclass(frozen=True)
class ColumnFaults(_Pattern):
    """Each (row, bit position) faulty with probability ``rate``: that bit in every word
    of the row."""

    rate: float
    kind: ClassVar[str] = "column"

    def __post_init__(self) -> None:
        self._check_rates("rate")

    def _draw(self, r: _Request) -> WordFaults:
        n, data_bits, width, d = r.n, r.data_bits, r.width, r.interleave
        n_rows, length = _rows(n, r.row_words)
        segment = d * width  # a row's physical columns: those of one segment
        columns = np.unique(poisson_cells(n_rows * segment, self.rate,
                                          r.stream("column")))
        rows, q = np.divmod(columns, segment)
        words, owner = _row_words(rows, length, n)
        if d > 1:  # rows start at whole groups: column q hits word q % d of each group
            keep = words % d == q[owner] % d
            words, owner = words[keep], owner[keep]
        return word_faults(words * width + q[owner] // d, width, data_bits)


@dataclass(frozen=True)
class RowFaults(_Pattern):
    """Each row faulty with probability ``rate``: every bit of every word in it."""

    rate: float
    kind: ClassVar[str] = "row"

    def __post_init__(self) -> None:
        self._check_rates("rate")

    def _draw(self, r: _Request) -> WordFaults:
        n, data_bits, check_bits = r.n, r.data_bits, r.check_bits
        n_rows, length = _rows(n, r.row_words)
        rows = np.unique(poisson_cells(n_rows, self.rate, r.stream("row")))
        words, _ = _row_words(rows, length, n)
        return WordFaults(words, *full_masks(words.size, data_bits, check_bits))


@dataclass(frozen=True)
class Asymmetric(_Pattern):
    """Each stored 1 fails to 0 with probability ``p10``, each stored 0 to 1 with
    probability ``p01`` (low-voltage SRAM); ``draw`` needs ``stored=(data, check)``."""

    p10: float
    p01: float
    kind: ClassVar[str] = "asymmetric"

    def __post_init__(self) -> None:
        self._check_rates("p10", "p01")

    def _draw(self, r: _Request) -> WordFaults:
        n, data_bits, width = r.n, r.data_bits, r.width
        data, check = _stored(r.stored, n, data_bits)
        rates = (self.p01, self.p10)  # by the stored bit's value
        horizons = np.array([-math.inf if p <= 0 else math.inf if p >= 1 else
                             _horizon(p, n * width) for p in rates])
        finite = horizons[np.isfinite(horizons)]
        parts = []
        if n and finite.size:
            cells, times = poisson_hits(n * width, r.stream("asymmetric"),
                                 float(finite.max()), with_times=True)
            cells = cells.astype(np.int64)
            parts.append(cells[times < horizons[bit_values(cells, width, data_bits,
                                                           data, check)]])
        for value in (0, 1):
            if n and horizons[value] == math.inf:  # rate 1: every bit of that value
                every = np.arange(n * width, dtype=np.int64)
                parts.append(every[bit_values(every, width, data_bits, data, check) == value])
        cells = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return word_faults(cells, width, data_bits)


def _stored(stored: Any, n: int, data_bits: int) -> tuple[np.ndarray, np.ndarray]:
    lanes = ln.lanes(data_bits)
    if stored is None or len(stored) != 2:
        raise ArgumentError("stored", stored, "the stored (data, check) uint64 words",
                            requirement="Asymmetric faults need the stored words: "
                                        "stored=(data, check)", tail=", got none")
    data, check = (np.asarray(s, dtype=np.uint64) for s in stored)
    if ln.is_wide(data_bits) and (data.ndim != 2 or data.shape[1] != lanes):
        raise ArgumentError("stored", stored, f"(n, {lanes}) data words of {data_bits} bits",
                            tail=f", got shape {data.shape}")
    data = data if ln.is_wide(data_bits) else data.reshape(-1)
    check = check.reshape(-1)
    if data.shape[0] != n or check.size != n:
        raise ArgumentError("stored", stored, f"{n} data and {n} check words",
                            tail=f", got {data.shape[0]} and {check.size}")
    return data, check


Pattern = IndependentBits | MultiBitUpset | ColumnFaults | RowFaults | Asymmetric
PATTERNS: dict[str, type] = {"independent": IndependentBits, "mbu": MultiBitUpset,
                             "column": ColumnFaults, "row": RowFaults, "asymmetric": Asymmetric}


def pattern_from_dict(d: Mapping[str, Any]) -> Pattern:
    """A pattern from its ``to_dict`` form."""
    if not isinstance(d, Mapping):
        raise ArgumentTypeError("pattern", d, "a mapping with a 'kind'")
    kind = check_choice(d.get("kind"), tuple(PATTERNS), "pattern.kind")
    cls = PATTERNS[kind]
    args = {k: v for k, v in d.items() if k != "kind"}
    names = tuple(f.name for f in fields(cls))
    required = {f.name for f in fields(cls)
                if f.default is MISSING and f.default_factory is MISSING}
    if set(args) - set(names) or required - set(args):
        raise ArgumentError("pattern", dict(d), f"a mapping with 'kind' and {names}",
                            tail=f", got keys {sorted(d)}")
    return cls(**args)


__all__ = ["PATTERNS", "Asymmetric", "ColumnFaults", "IndependentBits", "MultiBitUpset",
           "Pattern", "RowFaults", "WordFaults", "pattern_from_dict", "poisson_cells",
           "word_faults"]
