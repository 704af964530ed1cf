"""Statistics for fault campaigns, in NumPy and the standard library only.

- ``wilson_interval``: a per-trial accuracy's confidence interval (binomial, Wilson score).
- ``summarize``: across chips, mean, std, min, max, percentiles and a confidence
  interval of the mean: Student-t, or for a metric bounded in [lo, hi] (accuracy in
  [0, 1]) a Wilson score interval at the chips' effective sample size, inside the bounds.
- ``metric_bounds``: the bounds of bitfault's own metric values (shares, cosines...);
  ``metric_range`` adds the floors of unbounded ones (perplexity >= 1, KL >= 0).
- ``headline_stat``: what a table or plot headlines for a metric: the median for the
  heavy-tailed ones (``HEAVY_TAILED``: perplexity, KL), the mean for the others.
- ``summary_rows``: ``summarize`` of one value of trial records per (kind, rate, target,
  bit), over the chips where it is finite (the others counted).
- ``format_rates``: the shortest labels that keep a sweep's distinct rates distinct.
- ``robust_error``: the bit-error-robustness definition (Stutz et al., MLSys 2021): an
  example counts as wrong if it is misclassified with or without faults.
- ``fault_injection_sample_size``: how many faults to inject for a margin of error at a
  confidence level (statistical fault injection, Leveugle et al., DATE 2009).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bitfault.errors import check_int


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
    # at 0 or all successes the bound is exactly 0 or 1 (rounding must not leave p outside)
    low = 0.0 if successes == 0 else max(0.0, min(p, centre - half))
    high = 1.0 if successes == trials else min(1.0, max(p, centre + half))
    return low, high


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
    ci_method: str = "student_t"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_SHARES = ("accuracy", "robust_error", "agreement", "next_token_accuracy",
           "next_token_agreement", "masked", "benign", "sdc", "non_finite", "corrupted",
           "detected")
_CORRELATIONS = ("cosine", "cosine_min", "spearman", "spearman_clean")
METRIC_BOUNDS: dict[str, tuple[float, float]] = {**dict.fromkeys(_SHARES, (0.0, 1.0)),
                                                 **dict.fromkeys(_CORRELATIONS, (-1.0, 1.0))}
"""The range of every bounded value bitfault's metrics record: shares in [0, 1], cosines
and rank correlations in [-1, 1] (their summaries get an interval inside it)."""


HIGHER_IS_WORSE = frozenset({"perplexity", "kl", "loss", "robust_error", "non_finite",
                             "corrupted", "sdc"})
"""Metric values where a larger value is the worse one (the worst chip is the maximum)."""

METRIC_FLOORS: dict[str, float] = {"perplexity": 1.0, "kl": 0.0}
"""The lower end of unbounded metric values (perplexity >= 1, KL divergence >= 0): their
intervals never reach below it."""

HEAVY_TAILED = frozenset({"perplexity", "kl"})
"""Unbounded values whose spread over chips is heavy-tailed (one flipped exponent puts one
chip's perplexity at 1e6 while the others keep the fault-free 37): tables and plots
headline their median and quartiles (``headline_stat``); the mean stays in full tables."""


def metric_bounds(metric: str) -> tuple[float, float] | None:
    """The range of one of bitfault's metric values (``METRIC_BOUNDS``); None if unbounded
    or unknown (loss, perplexity, KL)."""
    return METRIC_BOUNDS.get(metric)


def metric_range(metric: str) -> tuple[float, float] | None:
    """``metric_bounds``, or for an unbounded value with a floor (``METRIC_FLOORS``) the
    half-open range ``(floor, inf)``; None if unknown (loss, a user's metric)."""
    bounds = metric_bounds(metric)
    if bounds is None and metric in METRIC_FLOORS:
        return METRIC_FLOORS[metric], math.inf
    return bounds


def headline_stat(metric: str) -> str:
    """The statistic over chips a table or plot headlines for ``metric``: "median" for a
    heavy-tailed value (``HEAVY_TAILED``), else "mean"."""
    return "median" if metric in HEAVY_TAILED else "mean"


def _overflow_safe(v: np.ndarray, stat: Callable[[np.ndarray], float]) -> float:
    """``stat(v)``, or where that overflows on finite values (perplexities near 1e300),
    ``s * stat(v / s)`` with ``s`` the largest magnitude: the same value where the plain
    one is finite, a finite one where it is not."""
    with np.errstate(over="ignore", invalid="ignore"):
        plain = float(stat(v))
        if math.isfinite(plain):
            return plain
        s = float(np.max(np.abs(v)))
        return s * float(stat(v / s))


def _check_bounds(bounds: Any, v: np.ndarray) -> tuple[float, float]:
    try:
        lo, hi = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise ValueError(f"bounds must be None or (lo, hi) with lo < hi, got {bounds!r}") from None
    if math.isnan(lo) or math.isnan(hi) or not lo < hi or (math.isinf(lo) and math.isinf(hi)):
        raise ValueError(f"bounds must be None or (lo, hi) with lo < hi, one of them finite, "
                         f"got {bounds!r}")
    if math.isinf(lo) or math.isinf(hi):
        return lo, hi  # a half-open range: the values are not checked (a KL of -1e-17)
    if v.min() < lo or v.max() > hi:
        raise ValueError(f"values must lie within bounds [{lo:g}, {hi:g}], got "
                         f"[{v.min():g}, {v.max():g}]")
    return lo, hi


def bounded_mean_interval(mean: float, std: float, n: int, lo: float, hi: float,
                          confidence: float = 0.95) -> tuple[float, float]:
    """CI of the mean of ``n`` values in [lo, hi] (sample ``std``, ddof=1), inside [lo, hi].

    The Wilson score interval of a proportion ``p = (mean - lo) / (hi - lo)`` at the
    effective sample size ``p (1 - p) / se**2`` (``se = std / sqrt(n)`` scaled the same
    way), with Student's t quantile at ``n - 1`` degrees of freedom in place of z. Away
    from the bounds it is the Student-t interval; near them it is asymmetric and never
    leaves them. One value gives [lo, hi]; equal values give [mean, mean].
    """
    _check_confidence(confidence)
    if n < 2:
        return lo, hi
    width = hi - lo
    p = min(1.0, max(0.0, (mean - lo) / width))
    se2 = (std / width) ** 2 / n
    if se2 == 0.0 or p in (0.0, 1.0):
        return mean, mean
    n_eff = p * (1.0 - p) / se2
    z = t_quantile(0.5 + confidence / 2.0, n - 1)
    denom = 1.0 + z * z / n_eff
    centre = (p + z * z / (2.0 * n_eff)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n_eff + z * z / (4.0 * n_eff * n_eff)) / denom
    low, high = max(0.0, centre - half), min(1.0, centre + half)
    return min(mean, lo + width * low), max(mean, lo + width * high)


def summarize(values: Any, confidence: float = 0.95,
              bounds: tuple[float, float] | None = None) -> Summary:
    """Summary of per-chip values (std with ddof=1) and a CI of their mean.

    Without ``bounds``: Student's t. With ``bounds=(lo, hi)`` (every value must lie in
    them): ``bounded_mean_interval``, which stays inside them. With a half-open range
    (``(1, inf)`` for perplexity): Student's t cut at its finite end (or at the lowest
    value, if one lies past it), ``ci_method`` "student_t_clipped" where it was cut.
    """
    _check_confidence(confidence)
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        raise ValueError("values must not be empty")
    if not np.all(np.isfinite(v)):
        raise ValueError("values must be finite")
    limits = None if bounds is None else _check_bounds(bounds, v)
    mean = _overflow_safe(v, np.mean)
    std = _overflow_safe(v, lambda x: x.std(ddof=1)) if v.size > 1 else 0.0
    p = np.percentile(v, [5, 25, 50, 75, 95])
    if limits is not None and all(map(math.isfinite, limits)):
        mean = min(limits[1], max(limits[0], mean))  # a float sum can step past a bound
        low, high = bounded_mean_interval(mean, std, int(v.size), *limits, confidence)
        method = "wilson_effective_n"
    else:
        half = (t_quantile(0.5 + confidence / 2.0, v.size - 1) * std / math.sqrt(v.size)
                if v.size > 1 else math.inf)
        low, high, method = mean - half, mean + half, "student_t"
        if limits is not None:  # never past the range, nor past a value that lies there
            cut = (max(low, min(limits[0], float(v.min()))),
                   min(high, max(limits[1], float(v.max()))))
            if cut != (low, high):
                low, high, method = *cut, "student_t_clipped"
    return Summary(int(v.size), mean, std, float(v.min()), float(v.max()), *map(float, p),
                   low, high, confidence, method)


SUMMARY_COLUMNS = ("kind", "ber", "target", "bit", "metric", "chips", "non_finite", "n",
                   "mean", "std", "min", "max", "p5", "p25", "median", "p75", "p95", "ci_low",
                   "ci_high", "confidence", "ci_method")
"""The columns of a ``summary_rows`` row (a group without a finite chip stops at ``n``)."""


def summary_rows(records: Sequence[Any], metric: str, confidence: float = 0.95
                 ) -> list[dict[str, Any]]:
    """Of trial records (``campaign.store.TrialRecord``: kind, ber, target, bit, metrics),
    one row per (kind, ber, target, bit) (single faults in one row, whatever their
    target): ``stats.summarize`` of ``metric`` over the chips where it is finite (``n``;
    bounded values, ``stats.METRIC_BOUNDS``, get an interval inside their bounds), with
    ``chips`` and ``non_finite`` counts (a record without ``metric`` counts as not finite);
    a group without a finite value has ``n`` 0 and no statistics. A value with a floor
    (``metric_range``: perplexity, KL) gets an interval that never reaches below it."""
    groups: dict[tuple, list[float]] = {}
    for r in records:
        key = (r.kind, r.ber, r.target if r.kind != "single" else None,
               r.bit if r.kind == "bit" else None)
        value = r.metrics.get(metric)
        groups.setdefault(key, []).append(math.nan if value is None else float(value))
    rows = []
    for (kind, ber, target, bit), values in sorted(groups.items(), key=lambda kv: str(kv[0])):
        finite = [v for v in values if math.isfinite(v)]
        row: dict[str, Any] = {"kind": kind, "ber": ber, "target": target, "bit": bit,
                               "metric": metric, "chips": len(values),
                               "non_finite": len(values) - len(finite), "n": len(finite)}
        if finite:
            row.update(summarize(finite, confidence, metric_range(metric)).to_dict())
        rows.append(row)
    return rows


def format_rates(rates: Any) -> list[str]:
    """Labels for ``rates`` that keep distinct rates distinct: each rate exactly, in as few
    digits as it needs (``1e-04``, ``1.5e-01``), rounded to 4 significant digits only
    where that still tells the sweep's rates apart (``3.162e-03`` for 10**-2.5)."""
    values = [float(r) for r in np.asarray(rates, dtype=np.float64).ravel()]
    exact = [next(d for d in range(17) if float(_rate_label(r, d)) == r)
             if math.isfinite(r) else 0 for r in values]
    for cap in range(3, 17):
        labels = [_rate_label(r, min(d, cap)) for r, d in zip(values, exact, strict=True)]
        if len(set(labels)) == len(set(values)):
            return labels
    return labels  # cap 16 is exact for every float: already distinct


def format_rate(rate: float) -> str:
    """One rate as ``format_rates`` writes it: ``1e-04``, ``1.5e-01``, ``0``."""
    return format_rates([rate])[0]


def _rate_label(rate: float, digits: int) -> str:
    if rate == 0:
        return "0"
    if not math.isfinite(rate):
        return str(rate)
    mantissa, exponent = f"{rate:.{digits}e}".split("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{exponent}"


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
    check_int(population, "population", 1)
    if not 0.0 < margin < 1.0:
        raise ValueError(f"margin must be in (0, 1), got {margin!r}")
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    t = normal_quantile(0.5 + confidence / 2.0)
    n = population / (1.0 + margin**2 * (population - 1) / (t * t * p * (1.0 - p)))
    return min(int(population), math.ceil(n - 1e-9))


__all__ = ["HEAVY_TAILED", "HIGHER_IS_WORSE", "METRIC_BOUNDS", "METRIC_FLOORS",
           "SUMMARY_COLUMNS", "Summary", "bounded_mean_interval", "fault_injection_sample_size",
           "format_rate", "format_rates", "headline_stat", "metric_bounds", "metric_range",
           "normal_quantile", "robust_error", "summarize", "summary_rows", "t_quantile",
           "wilson_interval"]
