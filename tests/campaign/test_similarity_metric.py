"""The similarity metric: Spearman's rank correlation (ties averaged) of pair cosines with
human scores, against a plain-loop reference in exact fractions (and scipy where it is
installed), on hand-made cases with ties, non-finite embeddings and batched records."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from bitfault.campaign.metrics import OutputMetric, make_records
from bitfault.campaign.similarity import (
    SimilarityMetric,
    average_ranks,
    pair_cosines,
    spearman,
)
from bitfault.errors import ArgumentError


def ref_ranks(x: list[float]) -> list[Fraction]:
    """Textbook average ranks: 1 + (values below) + (other values equal) / 2."""
    return [1 + sum(y < v for y in x) + Fraction(sum(y == v for y in x) - 1, 2) for v in x]


def ref_spearman(a: list[float], b: list[float]) -> float:
    """Pearson's r of the average ranks, in exact fractions until the last square root."""
    ra, rb = ref_ranks(a), ref_ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    sab = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    saa = sum((x - ma) ** 2 for x in ra)
    sbb = sum((y - mb) ** 2 for y in rb)
    if saa == 0 or sbb == 0:
        return 0.0
    r2 = sab * sab / (saa * sbb)
    return math.copysign(math.sqrt(r2), sab) if sab else 0.0


def ref_cosine(u: list[float], v: list[float]) -> float:
    dot = sum(x * y for x, y in zip(u, v, strict=True))
    return dot / (math.sqrt(sum(x * x for x in u)) * math.sqrt(sum(y * y for y in v)))


HAND = [
    ([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]),                 # one tie in b
    ([1, 2, 2, 3], [1, 3, 2, 4]),                       # one tie in a
    ([3, 3, 3, 1, 2, 2], [0.1, 0.2, 0.1, 0.4, 0.4, 0.0]),  # ties in both
    ([1, 2, 3], [3, 2, 1]),                             # reversed
    ([0.5, 0.5, 1.0, 1.0], [2.0, 2.0, 3.0, 3.0]),       # tied groups that agree
    ([-1e-300, 0.0, 1e-300, 2.0], [4, 3, 3, 1]),
]


@pytest.mark.parametrize(("a", "b"), HAND)
def test_spearman_equals_the_plain_reference_on_ties(a, b) -> None:
    assert average_ranks(a).tolist() == [float(r) for r in ref_ranks(a)]
    assert math.isclose(spearman(a, b), ref_spearman(a, b), rel_tol=1e-13, abs_tol=1e-15)


def test_spearman_on_random_ties_and_against_scipy() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    for _ in range(60):
        n = int(rng.integers(2, 25))
        a = rng.integers(0, 4, n).astype(float).tolist()
        b = np.round(rng.normal(size=n), 1).tolist()
        want = ref_spearman(a, b)
        assert math.isclose(spearman(a, b), want, rel_tol=1e-12, abs_tol=1e-14)
        assert np.array_equal(average_ranks(a), scipy_stats.rankdata(a))
        if len(set(a)) > 1 and len(set(b)) > 1:
            assert math.isclose(scipy_stats.spearmanr(a, b).statistic, want, rel_tol=1e-12,
                                abs_tol=1e-14)


def test_spearman_extremes_and_refusals() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert spearman([1, 1, 1], [1, 2, 3]) == 0.0  # no ranking: no correlation
    with pytest.raises(ArgumentError, match="finite"):
        spearman([1, np.nan], [1, 2])
    with pytest.raises(ArgumentError):
        spearman([1, 2, 3], [1, 2])
    with pytest.raises(ArgumentError):
        spearman([1], [1])


def _metric_case():
    rng = np.random.default_rng(7)
    emb = rng.normal(size=(5, 4)).astype(np.float32)
    pairs = np.array([[0, 1], [0, 2], [1, 3], [2, 4], [3, 4], [0, 4], [1, 1]])
    scores = np.array([2.0, 1.0, 1.0, 3.5, 0.0, 2.0, 4.0])
    return emb, pairs, scores, SimilarityMetric(pairs=pairs, scores=scores)


def _ref_value(emb: np.ndarray, pairs: np.ndarray, scores: np.ndarray) -> float:
    cos = []
    for i, j in pairs:
        u, v = [float(x) for x in emb[i]], [float(x) for x in emb[j]]
        c = ref_cosine(u, v) if all(map(math.isfinite, u + v)) else math.nan
        cos.append(0.0 if math.isnan(c) else c)  # a non-finite pair ranks as cosine 0
    return ref_spearman(cos, [float(s) for s in scores])


def test_metric_scores_a_trial_and_the_clean_run() -> None:
    emb, pairs, scores, metric = _metric_case()
    faulty = emb.copy()
    faulty[2] *= -1.0  # one text's embedding reversed
    clean_rec = make_records(metric, emb, emb, None)
    rec = make_records(metric, faulty, emb, None)
    assert rec.dtype["embedding"].shape == (4,) and rec["embedding"].dtype == np.float64
    got = metric(None, clean_rec, rec)
    assert math.isclose(got["spearman"], _ref_value(faulty, pairs, scores), rel_tol=1e-13)
    assert math.isclose(got["spearman_clean"], _ref_value(emb, pairs, scores), rel_tol=1e-13)
    assert got["spearman"] != got["spearman_clean"]
    want_cos = [ref_cosine([float(x) for x in f], [float(x) for x in c])
                for f, c in zip(faulty, emb, strict=True)]
    assert math.isclose(got["cosine"], sum(want_cos) / 5, rel_tol=1e-12)
    assert math.isclose(got["cosine_min"], min(want_cos), rel_tol=1e-12)
    assert got["pairs_nonfinite"] == 0
    assert (got["masked"], got["benign"], got["sdc"], got["non_finite"]) == (0, 0, 1, 0)
    clean = metric(None, clean_rec, clean_rec)
    assert clean["masked"] == 1 and clean["spearman"] == clean["spearman_clean"]
    # records of batches, concatenated as an evaluator does, score as one batch
    parts = np.concatenate([make_records(metric, faulty[:2], emb[:2], None),
                            make_records(metric, faulty[2:], emb[2:], None)])
    assert metric(None, clean_rec, parts) == got


def test_non_finite_embeddings_count_as_non_finite_trials() -> None:
    emb, pairs, scores, metric = _metric_case()
    faulty = emb.copy()
    faulty[4, 1] = np.nan
    faulty[3] = 0.0  # a zero embedding: cosine undefined, finite outputs
    got = metric(None, make_records(metric, emb, emb, None),
                 make_records(metric, faulty, emb, None))
    bad = [k for k, (i, j) in enumerate(pairs) if {3, 4} & {int(i), int(j)}]
    assert got["pairs_nonfinite"] == len(bad) == 4
    assert np.isnan(pair_cosines(faulty, pairs)[bad]).all()
    assert math.isclose(got["spearman"], _ref_value(np.where(
        np.arange(5)[:, None] == 3, np.nan, faulty), pairs, scores), rel_tol=1e-13)
    assert (got["masked"], got["sdc"], got["non_finite"]) == (0, 0, 1)
    every = np.full_like(emb, np.inf)
    all_bad = metric(None, make_records(metric, emb, emb, None),
                     make_records(metric, every, emb, None))
    assert all_bad["spearman"] == 0.0 and all_bad["pairs_nonfinite"] == len(pairs)


def test_refusals() -> None:
    emb, pairs, scores, metric = _metric_case()
    with pytest.raises(ArgumentError, match="needs the pairs") as err:
        OutputMetric("similarity")
    assert err.value.argument == "metric"
    with pytest.raises(ArgumentError, match="not all equal"):
        SimilarityMetric(pairs=pairs, scores=np.ones(len(pairs)))
    with pytest.raises(ArgumentError, match="7 finite numbers"):
        SimilarityMetric(pairs=pairs, scores=scores[:-1])
    with pytest.raises(ArgumentError, match=r"\(P, 2\)"):
        SimilarityMetric(pairs=pairs[:, 0], scores=scores)
    with pytest.raises(ArgumentError, match=r"\(P, 2\)"):
        SimilarityMetric(pairs=-pairs, scores=scores)
    with pytest.raises(ArgumentError, match=r"shape \(N, dim\)") as err:
        metric.check((5, 3, 4), None)
    assert err.value.argument == "metric"
    with pytest.raises(ArgumentError, match="at least 5"):
        metric.values(make_records(metric, emb[:4], emb[:4], None))
    assert metric == SimilarityMetric(pairs=pairs.tolist(), scores=scores.tolist())
    assert metric != SimilarityMetric(pairs=pairs, scores=scores + 1)
    assert not metric.needs_labels and metric.n_texts == 5
