"""Statistics for fault campaigns, in NumPy and the standard library only.

- ``wilson_interval``: a per-trial accuracy's confidence interval (binomial, Wilson score).
- ``summarize``: across chips, mean, std, min, max, percentiles and a Student-t
  confidence interval of the mean.
- ``robust_error``: the bit-error-robustness definition (Stutz et al., MLSys 2021): an
  example counts as wrong if it is misclassified with or without faults.
- ``fault_injection_sample_size``: how many faults to inject for a margin of error at a
  confidence level (statistical fault injection, Leveugle et al., DATE 2009).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


def _check_confidence(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return float(confidence)


def normal_quantile(q: float) -> float:
    """The standard normal quantile (inverse CDF) at ``q`` in (0, 1), to ~1e-15."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q!r}")
    lo, hi = -40.0, 40.0
    for _ in range(200):  # bisection on the CDF written with erfc: exact enough, no tables
        mid = 0.5 * (lo + hi)
        if 0.5 * math.erfc(-mid / math.sqrt(2.0)) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-15:
            break
    return 0.5 * (lo + hi)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t cumulative distribution function."""
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t > 0 else tail


def t_quantile(q: float, df: float) -> float:
    """Student's t quantile at ``q`` in (0, 1) with ``df`` > 0 degrees of freedom."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q!r}")
    if df <= 0:
        raise ValueError(f"df must be positive, got {df!r}")
    lo, hi = -1e3, 1e3
    while t_cdf(lo, df) > q:
        lo *= 10
    while t_cdf(hi, df) < q:
        hi *= 10
    for _ in range(300):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, abs(mid)):
            break
    return 0.5 * (lo + hi)


def wilson_interval(successes: int, trials: int,
                    confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (e.g. one chip's accuracy)."""
    _check_confidence(confidence)
    if trials <= 0:
        raise ValueError(f"trials must be positive, got {trials!r}")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in 0..trials ({trials}), got {successes!r}")
    z = normal_quantile(0.5 + confidence / 2.0)
    p = successes / trials
    denom = 1.0 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Summary:
    """A metric across chips (trials): location, spread and a CI of the mean."""

    n: int
    mean: float
    std: float
    min: float
    max: float
    p5: float
    p25: float
    median: float
    p75: float
    p95: float
    ci_low: float
    ci_high: float
    confidence: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(values: Any, confidence: float = 0.95) -> Summary:
    """Summary of per-chip values; the mean's CI uses Student's t (std with ddof=1)."""
    _check_confidence(confidence)
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        raise ValueError("values must not be empty")
    if not np.all(np.isfinite(v)):
        raise ValueError("values must be finite")
    mean = float(v.mean())
    std = float(v.std(ddof=1)) if v.size > 1 else 0.0
    if v.size > 1:
        half = t_quantile(0.5 + confidence / 2.0, v.size - 1) * std / math.sqrt(v.size)
    else:
        half = math.inf
    p = np.percentile(v, [5, 25, 50, 75, 95])
    return Summary(int(v.size), mean, std, float(v.min()), float(v.max()), *map(float, p),
                   mean - half, mean + half, confidence)


def robust_error(labels: Any, clean_predictions: Any, faulty_predictions: Any) -> float:
    """Share of examples misclassified with faults OR without (Stutz et al.'s robust error)."""
    y = np.asarray(labels)
    clean, faulty = np.asarray(clean_predictions), np.asarray(faulty_predictions)
    if not (y.shape == clean.shape == faulty.shape) or y.ndim != 1 or y.size == 0:
        raise ValueError(f"labels and predictions must be non-empty 1-D arrays of one length, "
                         f"got {y.shape}, {clean.shape}, {faulty.shape}")
    return float(np.mean((clean != y) | (faulty != y)))


def fault_injection_sample_size(population: int, margin: float = 0.01,
                                confidence: float = 0.95, p: float = 0.5) -> int:
    """Faults to inject so that a failure rate is known within ``margin`` at ``confidence``.

    Leveugle et al. (DATE 2009): ``n = N / (1 + e**2 * (N - 1) / (t**2 * p * (1 - p)))``
    with ``t`` the normal quantile of the confidence and ``p = 0.5`` the worst case.
    """
    _check_confidence(confidence)
    if isinstance(population, bool) or not isinstance(population, (int, np.integer)) \
            or population < 1:
        raise ValueError(f"population must be a positive integer, got {population!r}")
    if not 0.0 < margin < 1.0:
        raise ValueError(f"margin must be in (0, 1), got {margin!r}")
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    t = normal_quantile(0.5 + confidence / 2.0)
    n = population / (1.0 + margin**2 * (population - 1) / (t * t * p * (1.0 - p)))
    return min(int(population), math.ceil(n - 1e-9))


__all__ = ["Summary", "fault_injection_sample_size", "normal_quantile", "robust_error",
           "summarize", "t_quantile", "wilson_interval"]
