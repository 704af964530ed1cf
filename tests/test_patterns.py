"""Fault patterns over memory words: statistics, geometry, nesting, reproducibility."""

from __future__ import annotations

import math

import numpy as np
import pytest

import bitfault as bf
from bitfault.errors import ArgumentError
from bitfault.layout import WordLayout
from bitfault.maps.patterns import (
    Asymmetric,
    ColumnFaults,
    IndependentBits,
    MultiBitUpset,
    RowFaults,
    WordFaults,
    pattern_from_dict,
)


def physical(wf: WordFaults, data_bits: int) -> dict[int, int]:
    """{word: the physical mask as a Python int (check bits above the data bits)}."""
    return {int(w): int(d) | int(c) << data_bits
            for w, d, c in zip(wf.indices, wf.data, wf.check, strict=True)}


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
