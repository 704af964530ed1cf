"""bitfault.stats against published values and by simulation with fixed seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bitfault.stats import (
    fault_injection_sample_size,
    normal_quantile,
    robust_error,
    summarize,
    t_quantile,
    wilson_interval,
)


@pytest.mark.parametrize(("q", "z"), [(0.975, 1.959963984540054), (0.995, 2.5758293035489),
                                      (0.5, 0.0), (0.05, -1.6448536269514729)])
def test_normal_quantile_matches_tables(q: float, z: float) -> None:
    assert normal_quantile(q) == pytest.approx(z, abs=1e-12)


@pytest.mark.parametrize(("df", "t"), [(1, 12.7062047361747), (5, 2.57058183563631),
                                       (24, 2.06389856162802), (49, 2.00957523712924)])
def test_t_quantile_matches_tables(df: int, t: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(t, rel=1e-9)


def test_leveugle_sample_sizes_match_the_paper_formula() -> None:
    # Worked values: e = 1%, 95% (t = 1.96), p = 0.5: 9604 for an infinite population,
    # slightly fewer for a finite one; e = 5% -> 384; 99% -> 16,587 (infinite).
    assert fault_injection_sample_size(10**12, 0.01, 0.95) == 9604
    assert fault_injection_sample_size(10**6, 0.01, 0.95) == 9513
    assert fault_injection_sample_size(10**12, 0.05, 0.95) == 385
    assert fault_injection_sample_size(10**12, 0.01, 0.99) == 16588
    assert fault_injection_sample_size(100, 0.05, 0.95) == 80
    assert fault_injection_sample_size(10, 0.01, 0.95) == 10


def test_wilson_interval_coverage_by_simulation() -> None:
    rng = np.random.Generator(np.random.PCG64(2024))
    for p, n in [(0.9, 100), (0.5, 40), (0.99, 500)]:
        k = rng.binomial(n, p, size=4000)
        inside = [lo <= p <= hi for lo, hi in (wilson_interval(int(x), n) for x in k)]
        coverage = float(np.mean(inside))
        assert 0.93 <= coverage <= 0.97, (p, n, coverage)


def test_wilson_interval_edges_and_errors() -> None:
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and 0 < hi < 0.35
    lo, hi = wilson_interval(10, 10)
    assert hi == 1.0 and 0.65 < lo < 1
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(11, 10)
    with pytest.raises(ValueError, match="trials"):
        wilson_interval(0, 0)
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(1, 10, confidence=1.5)


def test_summarize_mean_interval_coverage() -> None:
    rng = np.random.Generator(np.random.PCG64(7))
    hits = 0
    for _ in range(2000):
        s = summarize(rng.normal(0.8, 0.05, size=10))
        hits += s.ci_low <= 0.8 <= s.ci_high
    assert 0.93 <= hits / 2000 <= 0.97


def test_summarize_fields() -> None:
    s = summarize([0.5, 0.7, 0.9])
    assert (s.n, s.min, s.max, s.median) == (3, 0.5, 0.9, 0.7)
    assert s.mean == pytest.approx(0.7)
    assert s.std == pytest.approx(0.2)
    half = t_quantile(0.975, 2) * 0.2 / math.sqrt(3)
    assert (s.ci_low, s.ci_high) == pytest.approx((0.7 - half, 0.7 + half))
    with pytest.raises(ValueError, match="empty"):
        summarize([])


def test_robust_error_counts_either_mistake() -> None:
    y = np.array([0, 1, 2, 3])
    clean = np.array([0, 1, 0, 3])   # wrong on example 2
    faulty = np.array([0, 2, 2, 3])  # wrong on example 1
    assert robust_error(y, clean, faulty) == 0.5
    with pytest.raises(ValueError, match="labels"):
        robust_error(y, clean[:3], faulty)
