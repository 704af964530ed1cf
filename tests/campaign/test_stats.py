"""bitfault.campaign.stats against published values and by simulation with fixed seeds."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

from bitfault.campaign.stats import (
    bounded_mean_interval,
    fault_injection_sample_size,
    format_rate,
    format_rates,
    headline_stat,
    metric_bounds,
    metric_range,
    normal_quantile,
    robust_error,
    summarize,
    summary_rows,
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


def test_bounded_interval_stays_in_bounds_for_few_skewed_chips() -> None:
    # Three chips near zero accuracy: Student's t gives ci_low < 0 (issue 14, item 10).
    assert summarize([0.0, 0.02, 0.11]).ci_low < 0
    s = summarize([0.0, 0.02, 0.11], bounds=(0.0, 1.0))
    assert 0.0 <= s.ci_low <= s.mean <= s.ci_high <= 1.0
    assert s.ci_method == "wilson_effective_n"
    top = summarize([1.0, 0.99, 0.9], bounds=(0.0, 1.0))
    assert 0.0 <= top.ci_low <= top.mean <= top.ci_high <= 1.0
    other = summarize([2.0, 2.5, 9.0], bounds=(2.0, 10.0))
    assert 2.0 <= other.ci_low <= other.mean <= other.ci_high <= 10.0


@pytest.mark.parametrize("value", [0.0, 0.4, 1.0])
def test_bounded_interval_of_equal_values_is_the_value(value: float) -> None:
    s = summarize([value] * 4, bounds=(0.0, 1.0))
    assert (s.ci_low, s.mean, s.ci_high) == (value, value, value)


def test_bounded_interval_one_chip_is_the_whole_range() -> None:
    s = summarize([0.3], bounds=(0.0, 1.0))
    assert (s.ci_low, s.ci_high) == (0.0, 1.0)


def test_bounded_interval_contains_the_mean_and_matches_t_in_the_middle() -> None:
    rng = np.random.Generator(np.random.PCG64(3))
    for _ in range(300):
        n = int(rng.integers(2, 12))
        v = rng.beta(rng.uniform(0.2, 5), rng.uniform(0.2, 5), size=n)
        s = summarize(v, bounds=(0.0, 1.0))
        assert 0.0 <= s.ci_low <= s.mean <= s.ci_high <= 1.0
    v = rng.normal(0.5, 0.01, size=200)  # far from the bounds: the t-interval
    t, b = summarize(v), summarize(v, bounds=(0.0, 1.0))
    assert (b.ci_low, b.ci_high) == pytest.approx((t.ci_low, t.ci_high), abs=1e-4)


def test_bounded_interval_coverage_near_zero_by_simulation() -> None:
    rng = np.random.Generator(np.random.PCG64(11))
    hits = 0
    for _ in range(2000):
        s = summarize(rng.beta(1.0, 19.0, size=5), bounds=(0.0, 1.0))
        hits += s.ci_low <= 0.05 <= s.ci_high
    assert 0.91 <= hits / 2000 <= 0.97


def test_bounded_interval_errors() -> None:
    with pytest.raises(ValueError, match="within bounds"):
        summarize([0.5, 1.2], bounds=(0.0, 1.0))
    with pytest.raises(ValueError, match="bounds"):
        summarize([0.5], bounds=(1.0, 0.0))
    with pytest.raises(ValueError, match="confidence"):
        bounded_mean_interval(0.5, 0.1, 3, 0.0, 1.0, confidence=0.0)
    assert metric_bounds("accuracy") == (0.0, 1.0) and metric_bounds("loss") is None


def test_every_bounded_metric_value_has_its_range() -> None:
    for share in ("accuracy", "agreement", "next_token_accuracy", "next_token_agreement",
                  "masked", "benign", "sdc", "non_finite", "corrupted"):
        assert metric_bounds(share) == (0.0, 1.0)
    for corr in ("cosine", "cosine_min", "spearman"):
        assert metric_bounds(corr) == (-1.0, 1.0)
    assert metric_bounds("perplexity") is None and metric_bounds("kl") is None
    # a cosine interval near 1 stays at or below 1 (Student's t alone passes it)
    s = summarize([0.9999, 0.9996, 1.0], bounds=metric_bounds("cosine"))
    assert s.ci_high <= 1.0 and s.ci_method == "wilson_effective_n"


def test_heavy_tailed_perplexity_headlines_the_median_and_stays_above_one() -> None:
    # SmolLM2 at 1e-8: most chips keep the fault-free 37.46, one flipped exponent gives 1e7
    records = [SimpleNamespace(kind="rate", ber=1e-8, target=None, bit=None,
                               metrics={"perplexity": v}) for v in (37.4, 37.5, 1e7)]
    (row,) = summary_rows(records, "perplexity")
    assert headline_stat("perplexity") == "median" and row["median"] == 37.5
    assert row["ci_low"] == 1.0 and row["ci_method"] == "student_t_clipped"  # t says -1.4e7
    assert row["mean"] == pytest.approx((37.4 + 37.5 + 1e7) / 3)  # kept for the full table
    assert headline_stat("kl") == "median" and headline_stat("accuracy") == "mean"
    assert metric_range("perplexity") == (1.0, math.inf) and metric_range("kl")[0] == 0.0
    (kl,) = summary_rows([SimpleNamespace(**{**vars(r), "metrics": {"kl": v}}) for r, v in
                          zip(records, (-1e-17, 0.0, 9.0), strict=True)], "kl")
    assert kl["ci_low"] == -1e-17 and kl["n"] == 3  # never past the lowest value, no error
    one = summarize([42.0], bounds=(1.0, math.inf))
    assert (one.ci_low, one.ci_high) == (1.0, math.inf)


def _exact_mean_std(values: list[float]) -> tuple[float, float]:
    v = [Fraction(x) for x in values]
    mean = sum(v) / len(v)
    var = sum((x - mean) ** 2 for x in v) / (len(v) - 1)
    return float(mean), math.sqrt(float(var / Fraction(10) ** 600)) * 1e300  # var > 1e308


def test_summarize_huge_finite_values_without_overflow() -> None:
    # perplexities of faulty chips reach 1e153 and beyond: squares and sums overflow
    values = [37.46, 3.751e153, 1.2e308, 1.5e308]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = summarize(values)
    mean, std = _exact_mean_std(values)
    assert math.isfinite(s.mean) and math.isfinite(s.std)  # the interval may pass 1.8e308
    assert s.mean == pytest.approx(mean, rel=1e-12) and s.std == pytest.approx(std, rel=1e-12)
    # where nothing overflows the plain NumPy values, bit for bit
    small = [37.46, 3.751e153, 12.0]
    assert summarize(small).std == float(np.std(small, ddof=1))
    assert summarize(small).mean == float(np.mean(small))


def test_format_rates_keeps_distinct_rates_distinct() -> None:
    # 0.1 and 0.15 both printed as 1e-01 with {:.0e} (issue 14, item 11).
    assert format_rates([1e-4, 1e-3, 0.1, 0.15, 0.0]) == ["1e-04", "1e-03", "1e-01",
                                                          "1.5e-01", "0"]
    assert format_rates([10**-2.5]) == ["3.162e-03"]
    close = format_rates([1e-3, 1.00001e-3])
    assert len(set(close)) == 2 and float(close[1]) == 1.00001e-3
    assert format_rates([0.2, 0.2]) == ["2e-01", "2e-01"]
    assert format_rate(2e-3) == "2e-03"


def test_robust_error_counts_either_mistake() -> None:
    y = np.array([0, 1, 2, 3])
    clean = np.array([0, 1, 0, 3])   # wrong on example 2
    faulty = np.array([0, 2, 2, 3])  # wrong on example 1
    assert robust_error(y, clean, faulty) == 0.5
    with pytest.raises(ValueError, match="labels"):
        robust_error(y, clean[:3], faulty)
