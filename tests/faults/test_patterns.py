"""Fault patterns over memory words: statistics, geometry, nesting, reproducibility."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

import bitfault as bf
from bitfault.errors import ArgumentError
from bitfault.faults.patterns import (
    Asymmetric,
    ColumnFaults,
    IndependentBits,
    MultiBitUpset,
    RowFaults,
    WordFaults,
    pattern_from_dict,
    poisson_cells,
)
from bitfault.maps.sampling import cell_stream
from bitfault.memory.layout import WordLayout
from ecc_reference import from_array, to_array


def physical(wf: WordFaults, data_bits: int) -> dict[int, int]:
    """{word: the physical mask as a Python int (check bits above the data bits)}."""
    assert wf.data.ndim == (1 if data_bits <= 64 else 2)
    return {int(w): d | int(c) << data_bits
            for w, d, c in zip(wf.indices, from_array(wf.data), wf.check, strict=True)}


def subset(small: dict[int, int], big: dict[int, int]) -> bool:
    return all(m & ~big.get(w, 0) == 0 for w, m in small.items())


def within(count: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p)) + 1


def test_independent_bits_are_todays_maps_in_words() -> None:
    fmt = bf.FixedPoint(8, 4)
    n = 64 * 1000  # eight int8 codes per 64-bit word, no padding, no check bit
    fmap = bf.FaultMap.random((n,), fmt, ber=1e-3, seed=3, name="fc1.weight")
    wf = IndependentBits(1e-3).draw(n // 8, 64, seed=3, name="fc1.weight")
    layout = WordLayout(64)
    got = set()
    for w, m in physical(wf, 64).items():
        for b in range(64):
            if m >> b & 1:
                e, eb = layout.element_bit(w, b, 8)
                got.add((int(e), int(eb)))
    want = {(int(e), b) for e, m in zip(fmap.indices, fmap.masks, strict=True)
            for b in range(8) if int(m) >> b & 1}
    assert got == want and len(want) > 300


def test_independent_bits_rate_nesting_and_check_bits() -> None:
    n, k, c = 20000, 32, 7
    lo = IndependentBits(1e-3).draw(n, k, c, seed=1, name="w")
    hi = IndependentBits(4e-3).draw(n, k, c, seed=1, name="w")
    assert within(lo.bit_errors(), n * (k + c), 1e-3)
    assert within(hi.bit_errors(), n * (k + c), 4e-3)
    assert subset(physical(lo, k), physical(hi, k))
    assert int(hi.check.max()) < 1 << c and int(hi.check.astype(bool).sum()) > 0
    assert within(int(np.bitwise_count(hi.check).sum()), n * c, 4e-3)


@pytest.mark.parametrize("pattern", [IndependentBits(1e-3), MultiBitUpset(1e-2),
                                     ColumnFaults(1e-2), RowFaults(0.05)])
def test_reproducible_and_keyed(pattern) -> None:
    args = {"n_words": 5000, "data_bits": 64, "check_bits": 8, "row_words": 16}
    a = pattern.draw(**args, seed=5, name="w", step=2)
    b = pattern.draw(**args, seed=5, name="w", step=2)
    assert physical(a, 64) == physical(b, 64) and len(a) > 0
    for other in ({"seed": 6, "name": "w", "step": 2}, {"seed": 5, "name": "v", "step": 2},
                  {"seed": 5, "name": "w", "step": 3}):
        assert physical(pattern.draw(**args, **other), 64) != physical(a, 64)


def test_mbu_sizes_follow_the_distribution() -> None:
    sizes = {1: 0.8, 2: 0.15, 3: 0.05}
    n, k, c = 200000, 64, 8
    wf = MultiBitUpset(2e-3, sizes).draw(n, k, c, seed=11, name="w")
    masks = physical(wf, k)
    assert within(len(masks), n, 2e-3)  # a word is hit with probability `rate`
    observed = {1: 0, 2: 0, 3: 0}
    for m in masks.values():
        run = m >> ((m & -m).bit_length() - 1)
        if run & (run + 1) == 0 and run.bit_length() in observed:  # one contiguous run
            observed[run.bit_length()] += 1
    total = sum(observed.values())
    assert total >= len(masks) - 5  # colliding events in one word are rare at this rate
    chi2 = sum((observed[s] - total * p) ** 2 / (total * p) for s, p in sizes.items())
    assert chi2 < 13.8  # chi-square, 2 degrees of freedom, p = 0.001


@pytest.mark.parametrize(("k", "c"), [(8, 5), (32, 7), (64, 0)])
def test_mbu_events_stay_inside_one_word(k: int, c: int) -> None:
    width = k + c
    wf = MultiBitUpset(0.3, {width: 0.5, 3: 0.5}).draw(3000, k, c, seed=2, name="w")
    masks = physical(wf, k)
    assert all(0 <= w < 3000 for w in masks)
    assert all(0 < m < 1 << width for m in masks.values())
    assert any(m == (1 << width) - 1 for m in masks.values())
    starts = {(m & -m).bit_length() - 1 for m in masks.values() if m.bit_count() == 3}
    assert max(starts) <= width - 3 and min(starts) == 0  # first bits span 0..width-3


def test_mbu_nested_in_rate() -> None:
    lo = MultiBitUpset(1e-3).draw(50000, 32, 7, seed=4, name="w")
    hi = MultiBitUpset(5e-3).draw(50000, 32, 7, seed=4, name="w")
    assert 0 < len(lo) < len(hi) and subset(physical(lo, 32), physical(hi, 32))


def test_mbu_size_larger_than_the_word_is_refused() -> None:
    with pytest.raises(ArgumentError) as e:
        MultiBitUpset(1e-3, {1: 0.5, 40: 0.5}).draw(10, 32, 7)
    assert e.value.argument == "sizes"
    MultiBitUpset(1e-3, {39: 1.0}).draw(10, 32, 7)  # exactly the physical word: fine
    for bad in ({0: 1.0}, {1: -0.5}, {1: 0.0}, {}):
        with pytest.raises((ArgumentError, TypeError)):
            MultiBitUpset(1e-3, bad)
    with pytest.raises(ArgumentError):
        MultiBitUpset(1.0)


@pytest.mark.parametrize("row_words", [4, 7, None])
def test_column_faults_hit_a_bit_in_every_word_of_a_row(row_words) -> None:
    n, k, c = 1000, 32, 7
    layout = WordLayout(32, row_words)
    wf = ColumnFaults(0.01).draw(n, k, c, seed=9, name="w", row_words=row_words)
    masks = physical(wf, k)
    rows = layout.n_rows(n)
    by_row: dict[int, set[int]] = {}
    for w, m in masks.items():
        by_row.setdefault(int(layout.row_of(w)), set()).add(m)
    length = layout.row_length(n)
    columns = 0
    for r, ms in by_row.items():
        assert len(ms) == 1  # one mask for the whole row
        words = [w for w in masks if int(layout.row_of(w)) == r]
        assert len(words) == min(length, n - r * length)  # every word of the row
        columns += next(iter(ms)).bit_count()
    if row_words is not None:
        assert within(columns, rows * (k + c), 0.01)
    lo = ColumnFaults(0.003).draw(n, k, c, seed=9, name="w", row_words=row_words)
    assert subset(physical(lo, k), masks)


def test_row_faults_hit_whole_rows() -> None:
    n, k, c = 10003, 16, 6
    wf = RowFaults(0.05).draw(n, k, c, seed=1, name="w", row_words=8)
    masks = physical(wf, k)
    assert set(masks.values()) == {(1 << (k + c)) - 1}
    rows = {w // 8 for w in masks}
    assert set(masks) == {w for r in rows for w in range(r * 8, min(r * 8 + 8, n))}
    assert within(len(rows), -(-n // 8), 0.05)
    words = RowFaults(0.02).draw(n, k, 0, seed=1, name="w", row_words=1)
    assert within(len(words), n, 0.02) and not words.check.any()


def test_asymmetric_hits_only_the_right_values() -> None:
    n, k, c = 20000, 32, 7
    rng = np.random.default_rng(0)
    data = rng.integers(0, 1 << k, n, dtype=np.uint64)
    check = rng.integers(0, 1 << c, n, dtype=np.uint64)
    ones = int(np.bitwise_count(data).sum() + np.bitwise_count(check).sum())
    zeros = n * (k + c) - ones
    stored = {w: int(d) | int(cc) << k for w, (d, cc) in enumerate(zip(data, check,
                                                                       strict=True))}
    for p10, p01 in ((2e-3, 0.0), (0.0, 2e-3), (3e-3, 1e-3)):
        wf = Asymmetric(p10, p01).draw(n, k, c, seed=3, name="w", stored=(data, check))
        hit10 = sum((m & stored[w]).bit_count() for w, m in physical(wf, k).items())
        hit01 = sum((m & ~stored[w]).bit_count() for w, m in physical(wf, k).items())
        assert (hit10 == 0) == (p10 == 0) and (hit01 == 0) == (p01 == 0)
        assert within(hit10, ones, p10) and within(hit01, zeros, p01)
    a = physical(Asymmetric(1e-3, 1e-3).draw(n, k, c, seed=3, name="w", stored=(data, check)), k)
    b = physical(Asymmetric(4e-3, 1e-3).draw(n, k, c, seed=3, name="w", stored=(data, check)), k)
    assert subset(a, b) and a != b
    every = Asymmetric(1.0, 0.0).draw(50, k, c, seed=3, name="w",
                                      stored=(data[:50], check[:50]))
    assert physical(every, k) == {w: stored[w] for w in range(50) if stored[w]}
    with pytest.raises(ArgumentError) as e:
        Asymmetric(1e-3, 0.0).draw(n, k, c)
    assert e.value.argument == "stored"


def test_rates_zero_and_one() -> None:
    assert len(IndependentBits(0.0).draw(100, 8, 5)) == 0
    full = IndependentBits(1.0).draw(10, 8, 5)
    assert set(physical(full, 8).values()) == {(1 << 13) - 1} and len(full) == 10
    assert len(ColumnFaults(0.0).draw(100, 8)) == 0 and len(RowFaults(0.0).draw(100, 8)) == 0
    assert len(IndependentBits(0.5).draw(0, 8)) == 0


def test_dict_round_trip_and_bad_input() -> None:
    for p in (IndependentBits(1e-3), MultiBitUpset(1e-3, {1: 0.5, 2: 0.5}), ColumnFaults(0.1),
              RowFaults(0.2), Asymmetric(1e-3, 2e-4)):
        assert pattern_from_dict(p.to_dict()) == p
        hash(p)
    assert pattern_from_dict({"kind": "mbu", "rate": 0.1, "sizes": {"1": 1}}) == \
        MultiBitUpset(0.1, {1: 1.0})
    with pytest.raises(ArgumentError) as e:
        pattern_from_dict({"kind": "burst", "rate": 0.1})
    assert e.value.argument == "pattern.kind"
    with pytest.raises(ArgumentError) as e:
        pattern_from_dict({"kind": "row", "ber": 0.1})
    assert e.value.argument == "pattern"
    with pytest.raises(ArgumentError) as e:
        IndependentBits(1.5)
    assert e.value.argument == "ber"
    with pytest.raises(ArgumentError) as e:
        ColumnFaults(0.1).draw(10, 8, row_words=0)
    assert e.value.argument == "row_words"


# ---- interleave 1 is the draw from before interleaving; wide words -------------------------

GEOMETRIES = [(3000, 64, 8, 16), (777, 32, 7, None), (500, 8, 5, 4), (2000, 16, 0, 8)]
BEFORE = {  # (faulty words, SHA-256 prefix of the draw) per geometry, recorded with the
    # patterns of commit 34a83b0 (before wide words and interleaving) by the code below
    "independent": [(413, "00c11f54f4afa1f2"), (63, "9a722171ee840a3e"),
                    (13, "072c8705cc08626f"), (68, "8df859c0fa5dcf36")],
    "mbu": [(161, "ef138628d08fa441"), (48, "c0863059e0cdeb4d"), (31, "de8d74b771d0285c"),
            (120, "04c9f6e8ae71ced2")],
    "column": [(2336, "f561342ac1bdd3bd"), (777, "63628af6eb6269c9"),
               (100, "c3f018ff8b9750a9"), (488, "a90d7e2808252162")],
    "row": [(48, "13031581da531960"), (0, "e3b0c44298fc1c14"), (12, "be5fe9e12f8bcf03"),
            (48, "59eedaf95be35f75")],
    "asymmetric": [(384, "a94501b8863d6e5c"), (56, "346d1c7dded8cd34"),
                   (12, "439d25f2201f808a"), (65, "ef17fcea46b329e0")],
}
PATTERNS = {"independent": IndependentBits(2e-3),
            "mbu": MultiBitUpset(0.05, {1: 0.5, 2: 0.3, 4: 0.2}),
            "column": ColumnFaults(0.02), "row": RowFaults(0.05),
            "asymmetric": Asymmetric(3e-3, 1e-3)}


@pytest.mark.parametrize("kind", list(PATTERNS))
def test_interleave_one_draws_exactly_what_was_drawn_before(kind) -> None:
    for (n, k, c, rw), want in zip(GEOMETRIES, BEFORE[kind], strict=True):
        rng = np.random.default_rng(n)
        stored = (rng.integers(0, 1 << k, n, dtype=np.uint64),
                  rng.integers(0, 1 << max(c, 1), n, dtype=np.uint64) & np.uint64((1 << c) - 1))
        for extra in ({}, {"interleave": 1}):
            wf = PATTERNS[kind].draw(n, k, c, seed=7, name="layer.w", step=3, row_words=rw,
                                     stored=stored if kind == "asymmetric" else None, **extra)
            digest = hashlib.sha256(wf.indices.astype("<i8").tobytes()
                                    + wf.data.astype("<u8").tobytes()
                                    + wf.check.astype("<u8").tobytes()).hexdigest()[:16]
            assert (len(wf), digest) == want


def test_independent_and_row_keep_their_draws_under_interleaving() -> None:
    for pattern in (IndependentBits(2e-3), RowFaults(0.1)):
        one = pattern.draw(4000, 64, 8, seed=1, name="w", row_words=8)
        four = pattern.draw(4000, 64, 8, seed=1, name="w", row_words=8, interleave=4)
        assert physical(one, 64) == physical(four, 64) and len(one) > 10


@pytest.mark.parametrize(("k", "c"), [(128, 9), (256, 10), (100, 8)])
def test_patterns_on_words_wider_than_64_bits(k: int, c: int) -> None:
    n, width = 4000, k + c
    ind = IndependentBits(1e-3).draw(n, k, c, seed=1, name="w")
    assert ind.data.shape == (len(ind), -(-k // 64)) and ind.lanes == -(-k // 64)
    assert within(ind.bit_errors(), n * width, 1e-3)
    hi = IndependentBits(3e-3).draw(n, k, c, seed=1, name="w")
    assert subset(physical(ind, k), physical(hi, k))
    masks = physical(hi, k)
    assert max(masks.values()) < 1 << width
    assert any(m >> k for m in masks.values()) and any(m >> 64 & (2 ** 64 - 1)
                                                       for m in masks.values())
    mbu = physical(MultiBitUpset(0.3, {width: 0.2, 3: 0.8}).draw(n, k, c, seed=2, name="w"), k)
    assert any(m == (1 << width) - 1 for m in mbu.values())
    starts = {(m & -m).bit_length() - 1 for m in mbu.values() if m.bit_count() == 3}
    assert max(starts) <= width - 3 and min(starts) == 0
    runs = [m >> ((m & -m).bit_length() - 1) for m in mbu.values()]
    assert sum(r & (r + 1) == 0 for r in runs) >= 0.75 * len(runs)  # one event: a run
    rows = physical(RowFaults(0.2).draw(n, k, c, seed=1, name="w", row_words=8), k)
    assert set(rows.values()) == {(1 << width) - 1}
    cols = ColumnFaults(0.01).draw(n, k, c, seed=9, name="w", row_words=16)
    by_row: dict[int, set[int]] = {}
    for w, m in physical(cols, k).items():
        by_row.setdefault(w // 16, set()).add(m)
    assert by_row and all(len(ms) == 1 for ms in by_row.values())
    rng = np.random.default_rng(0)
    values = [int.from_bytes(rng.bytes(-(-k // 8)), "little") % 2 ** k for _ in range(n)]
    data, check = to_array(values, k), rng.integers(0, 1 << c, n, dtype=np.uint64)
    stored = {w: v | int(cc) << k for w, (v, cc) in enumerate(zip(values, check, strict=True))}
    asym = physical(Asymmetric(2e-3, 0.0).draw(n, k, c, seed=3, name="w",
                                               stored=(data, check)), k)
    assert asym and all(m & ~stored[w] == 0 for w, m in asym.items())  # only stored 1s


def group_bits(masks: dict[int, int], d: int, width: int) -> dict[int, set[int]]:
    """{group: the physical bits q of its segment}, by the definition, with plain loops:
    bit b of word w is physical bit b * d + w % d of group w // d."""
    out: dict[int, set[int]] = {}
    for w, m in masks.items():
        for b in range(width):
            if m >> b & 1:
                out.setdefault(w // d, set()).add(b * d + w % d)
    return out


def ref_interleaved(n: int, d: int, width: int, group: int, q: int) -> tuple[int, int] | None:
    """(word, bit) of physical bit q of group `group`'s segment: bit q // d of word
    g*d + q % d; None past the plane's last word."""
    word = group * d + q % d
    return (word, q // d) if word < n else None


def ref_mbu(pattern: MultiBitUpset, n: int, width: int, d: int, seed: int,
            name: str) -> dict[int, int]:
    """The upset events from the pattern's streams (word slot, then a size and a first bit
    per event from two uniforms), placed by a plain loop over physical bits."""
    slots = poisson_cells(n, pattern.rate, cell_stream(seed, f"{name}\x00mbu"))
    shapes = cell_stream(seed, f"{name}\x00mbu-shape").random((slots.size, 2))
    out: dict[int, int] = {}
    for slot, (u0, u1) in zip(slots.tolist(), shapes.tolist(), strict=True):
        sizes, total = list(pattern.sizes.items()), 0.0
        size = sizes[-1][0]
        for value, p in sizes:  # the first size whose cumulative probability exceeds u0
            total += p
            if u0 < total:
                size = value
                break
        start = math.floor(u1 * (d * width - size + 1))
        for q in range(start, start + size):
            hit = ref_interleaved(n, d, width, slot // d, q)
            if hit:
                out[hit[0]] = out.get(hit[0], 0) | 1 << hit[1]
    return out


def ref_columns(rate: float, n: int, width: int, d: int, row_words: int | None, seed: int,
                name: str) -> dict[int, int]:
    """Faulty (row, physical column) cells from the pattern's stream; each hits that
    physical bit of every segment of the row, by a plain loop."""
    length = row_words or n
    n_rows = -(-n // length)
    cells = poisson_cells(n_rows * d * width, rate, cell_stream(seed, f"{name}\x00column"))
    out: dict[int, int] = {}
    for cell in set(cells.tolist()):
        row, q = divmod(cell, d * width)
        for group in range(row * length // d, (row + 1) * length // d):
            hit = ref_interleaved(n, d, width, group, q)
            if hit:
                out[hit[0]] = out.get(hit[0], 0) | 1 << hit[1]
    return out


@pytest.mark.parametrize("d", [1, 2, 3, 8])
def test_interleaved_draws_equal_the_plain_loop_placement(d) -> None:
    n, k, c = 2000 + d, 64, 8  # a short last group when d does not divide n
    mbu = MultiBitUpset(0.02, {1: 0.5, 2: 0.2, 3: 0.2, 7: 0.1})
    got = physical(mbu.draw(n, k, c, seed=3, name="w", row_words=24, interleave=d), k)
    assert got == ref_mbu(mbu, n, k + c, d, 3, "w") and len(got) > 40
    wide = physical(mbu.draw(n, 128, 9, seed=3, name="w", interleave=d), 128)
    assert wide == ref_mbu(mbu, n, 137, d, 3, "w")
    for row_words in (24, None):
        got = physical(ColumnFaults(0.01).draw(n, k, c, seed=4, name="w", row_words=row_words,
                                               interleave=d), k)
        assert got == ref_columns(0.01, n, k + c, d, row_words, 4, "w")
        assert got or row_words is None  # one row of d * 72 columns may have no fault


@pytest.mark.parametrize(("d", "size"), [(2, 2), (4, 3), (4, 4), (8, 5)])
def test_an_interleaved_upset_hits_adjacent_physical_bits_of_distinct_words(d, size) -> None:
    n, k, c = 40000, 64, 8
    width = k + c
    wf = MultiBitUpset(2e-3, {size: 1.0}).draw(n, k, c, seed=5, name="w", row_words=16,
                                              interleave=d)
    masks = physical(wf, k)
    groups = group_bits(masks, d, width)
    assert within(len(groups), n, 2e-3, sigmas=6)  # one event per word slot at this rate
    alone = 0
    for g, qs in groups.items():
        if len(qs) != size:
            continue  # two events in one group (rare)
        alone += 1
        assert max(qs) - min(qs) == size - 1  # `size` adjacent physical bits ...
        words = [g * d + q % d for q in qs]
        assert len(set(words)) == size  # ... of `size` distinct words, one bit each
        assert all(masks[w].bit_count() == 1 for w in words)
    assert alone >= 0.95 * len(groups)
    starts = [min(qs) for qs in groups.values() if len(qs) == size]
    segment = d * width  # first bits spread over the whole segment, never past it
    assert min(starts) <= segment // 8 and segment * 7 // 8 <= max(starts) <= segment - size
    lo = MultiBitUpset(5e-4, {size: 1.0}).draw(n, k, c, seed=5, name="w", row_words=16,
                                              interleave=d)
    assert 0 < len(lo) < len(wf) and subset(physical(lo, k), masks)  # nested in rate


def test_interleaved_upsets_stay_in_the_plane_and_the_segment() -> None:
    n, k, c, d = 1001, 32, 7, 4  # the last group holds one word of four
    wf = MultiBitUpset(0.5, {1: 0.5, 4 * 39: 0.5}).draw(n, k, c, seed=1, name="w",
                                                       interleave=d)
    masks = physical(wf, k)
    assert max(masks) < n and max(masks.values()) < 1 << 39
    assert any(masks.get(w) == (1 << 39) - 1 for w in range(0, 1000, 4))  # a whole segment
    with pytest.raises(ArgumentError) as e:
        MultiBitUpset(1e-3, {4 * 39 + 1: 1.0}).draw(n, k, c, interleave=d)
    assert e.value.argument == "sizes" and "interleaved" in e.value.allowed
    a = MultiBitUpset(0.01).draw(n, k, c, seed=3, name="w", step=1, interleave=d)
    assert physical(a, k) == physical(MultiBitUpset(0.01).draw(
        n, k, c, seed=3, name="w", step=1, interleave=d), k)


@pytest.mark.parametrize(("d", "row_words"), [(2, 8), (4, 16), (3, None)])
def test_interleaved_columns_hit_one_physical_position_of_every_segment(d, row_words) -> None:
    n, k, c = 1000, 32, 7
    width = k + c
    wf = ColumnFaults(0.01).draw(n, k, c, seed=9, name="w", row_words=row_words, interleave=d)
    masks = physical(wf, k)
    length = row_words or n
    rows: dict[int, dict[int, set[int]]] = {}
    for g, qs in group_bits(masks, d, width).items():
        rows.setdefault(g * d // length, {})[g] = qs
    total = 0
    for r, groups in rows.items():
        first, last = r * length // d, -(-min(n, (r + 1) * length) // d)
        full = [g for g in range(first, last) if (g + 1) * d <= n]
        columns = groups[full[0]]
        assert all(groups.get(g) == columns for g in full)  # every segment of the row
        total += len(columns)
    if row_words is not None:
        assert within(total, -(-n // row_words) * d * width, 0.01)
    lo = ColumnFaults(0.003).draw(n, k, c, seed=9, name="w", row_words=row_words, interleave=d)
    assert subset(physical(lo, k), masks)


def test_bad_interleave_is_named() -> None:
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ArgumentError) as e:
            MultiBitUpset(1e-3).draw(10, 8, interleave=bad)
        assert e.value.argument == "interleave"
    with pytest.raises(ArgumentError) as e:
        ColumnFaults(0.1).draw(10, 8, row_words=6, interleave=4)
    assert e.value.argument == "interleave"
    with pytest.raises(ArgumentError) as e:
        ColumnFaults(0.1).draw(10, 8, row_words=-2, interleave=4)
    assert e.value.argument == "row_words"
    with pytest.raises(ArgumentError) as e:
        IndependentBits(0.1).draw(10, 257)
    assert e.value.argument == "data_bits"
