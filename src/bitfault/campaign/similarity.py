"""A downstream score of sentence embeddings: how well the cosine similarity of pairs of
faulty embeddings ranks the pairs as people rated them (Spearman's rank correlation, ties
averaged), beside how close each faulty embedding stays to its clean one.

    from bitfault.campaign.similarity import SimilarityMetric
    from bitfault.data.text import text_pairs
    pairs = text_pairs("lee")                           # 50 documents, 1225 rated pairs
    metric = SimilarityMetric.of(pairs)                 # an OutputMetric
    ev = OutputEvaluator(model, tokenised(pairs.texts), metric, output_fn=mean_pooled)

Each example's record carries its faulty embedding, so a trial's score is computed over
all its texts at once (the records of every batch, concatenated); the clean records of the
same campaign give the fault-free correlation (``spearman_clean``) beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.campaign.logits import CleanRows
from bitfault.campaign.metrics import BENIGN_COSINE, OutputMetric, outcome
from bitfault.errors import ArgumentError


def average_ranks(x: Any) -> np.ndarray:
    """Ranks 1..n of the values of ``x`` (1-D, finite); tied values share the mean of the
    ranks they span (as ``scipy.stats.rankdata(x, "average")``)."""
    v = np.asarray(x, np.float64)
    if v.ndim != 1 or not np.isfinite(v).all():
        raise ArgumentError("x", np.shape(v), "a 1-D array of finite numbers")
    order = np.argsort(v, kind="stable")
    sorted_v = v[order]
    new = np.ones(len(v), bool)
    new[1:] = sorted_v[1:] != sorted_v[:-1]
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(v))  # each tie group spans ranks starts+1 .. ends
    ranks = np.empty(len(v), np.float64)
    ranks[order] = ((starts + 1 + ends) / 2.0)[np.cumsum(new) - 1]
    return ranks


def spearman(a: Any, b: Any) -> float:
    """Spearman's rank correlation of ``a`` and ``b`` (1-D, finite, the same length, at
    least 2): Pearson's correlation of their average ranks, in [-1, 1]. When either holds
    one value only (no ranking), 0.0: no correlation (scipy says NaN)."""
    ra, rb = average_ranks(a), average_ranks(b)
    if len(ra) != len(rb) or len(ra) < 2:
        raise ArgumentError("b", len(rb), f"{len(ra)} values, at least 2 (as many as a)")
    da, db = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt(np.dot(da, da) * np.dot(db, db))
    if den == 0:
        return 0.0
    return float(np.clip(np.dot(da, db) / den, -1.0, 1.0))


def pair_cosines(embeddings: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """Cosine similarity of the two embeddings of each pair (float64); NaN where either
    embedding is not finite or is zero."""
    e = np.asarray(embeddings, np.float64)
    a, b = e[pairs[:, 0]], e[pairs[:, 1]]
    with np.errstate(all="ignore"):
        cos = np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return np.where(np.isfinite(cos), cos, np.nan)


@dataclass(frozen=True, eq=False)
class SimilarityMetric(OutputMetric):
    """The ``similarity`` metric on (N, dim) embeddings of N texts: per trial ``spearman``,
    the rank correlation of each pair's cosine similarity with the human ``scores``
    (``pairs[k]`` indexes two of the N examples); ``spearman_clean``, the same on the
    clean run; ``cosine`` and ``cosine_min``, each faulty embedding's cosine with its clean
    one; ``pairs_nonfinite``, the pairs whose cosine is not a number (a NaN/Inf or zero
    embedding), ranked as cosine 0 (no similarity), as ``cosine`` scores such embeddings;
    and the outcome (``metrics.OUTCOMES``: an embedding whose cosine with its clean one
    falls below ``benign_cosine`` is a changed decision)."""

    kind: str = "similarity"
    pairs: Any = None
    scores: Any = None

    def __post_init__(self) -> None:
        if self.kind != "similarity":
            raise ArgumentError("kind", self.kind, "'similarity'")
        if self.pairs is None or self.scores is None:
            raise ArgumentError("pairs", None, "(P, 2) indices of the texts and (P,) scores")
        pairs, scores = np.asarray(self.pairs), np.asarray(self.scores, np.float64)
        if pairs.ndim != 2 or pairs.shape[1:] != (2,) or len(pairs) < 2 or not np.issubdtype(
                pairs.dtype, np.integer) or pairs.min() < 0:
            raise ArgumentError("pairs", pairs.shape, "a (P, 2) array of non-negative integer "
                                "indices, P >= 2")
        if scores.shape != (len(pairs),) or not np.isfinite(scores).all():
            raise ArgumentError("scores", scores.shape, f"{len(pairs)} finite numbers (one "
                                "per pair)")
        if np.all(scores == scores[0]):
            raise ArgumentError("scores", float(scores[0]), "scores that are not all equal "
                                "(a rank correlation needs them to differ)")
        pairs = pairs.astype(np.int64)
        pairs.setflags(write=False)
        scores = scores.copy()
        scores.setflags(write=False)
        object.__setattr__(self, "pairs", pairs)
        object.__setattr__(self, "scores", scores)
        super().__post_init__()

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and np.array_equal(self.pairs, other.pairs)
                and np.array_equal(self.scores, other.scores)
                and self.benign_cosine == other.benign_cosine)

    def __hash__(self) -> int:
        return hash((self.kind, self.pairs.tobytes(), self.scores.tobytes(),
                     self.benign_cosine))

    @classmethod
    def of(cls, text_pairs: Any, benign_cosine: float = BENIGN_COSINE) -> SimilarityMetric:
        """The metric of a ``bitfault.data.text.TextPairs`` (its pairs and scores)."""
        return cls(pairs=text_pairs.pairs, scores=text_pairs.scores,
                   benign_cosine=benign_cosine)

    @property
    def needs_labels(self) -> bool:
        return False

    @property
    def n_texts(self) -> int:
        """How many texts (examples) the pairs index, at least."""
        return int(self.pairs.max()) + 1

    def check(self, shape: tuple[int, ...], labels: np.ndarray | None) -> None:
        if len(shape) != 2:
            raise ArgumentError("metric", self.kind, "a metric that fits the model's outputs "
                                "(embeddings of shape (N, dim))",
                                requirement=f"metric 'similarity' needs embeddings of shape "
                                            f"(N, dim); the model's outputs have shape "
                                            f"{tuple(shape)}: choose another metric or an "
                                            "output_fn that returns such outputs")

    def fields(self) -> tuple[str, ...]:
        return ("cosine", "embedding")

    def record(self, faulty: np.ndarray, clean: np.ndarray, labels: np.ndarray | None,
               clean_rows: CleanRows | None = None, threads: int = 1
               ) -> dict[str, np.ndarray]:
        """Per text its cosine with the clean embedding and the embedding itself (no logit
        rows: ``clean_rows`` and ``threads`` are unused)."""
        cos = OutputMetric("cosine").record(faulty, clean, None)["cosine"]
        return {"cosine": cos, "embedding": np.asarray(faulty, np.float64)}

    def values(self, records: np.ndarray) -> dict[str, float]:
        if len(records) < self.n_texts:
            raise ArgumentError("records", len(records), f"records of at least {self.n_texts} "
                                "texts (the pairs index them)")
        cos = pair_cosines(records["embedding"], self.pairs)
        bad = np.isnan(cos)
        return {"spearman": spearman(np.where(bad, 0.0, cos), self.scores),
                "cosine": float(np.mean(records["cosine"])),
                "cosine_min": float(np.min(records["cosine"])),
                "pairs_nonfinite": int(np.sum(bad))}

    def __call__(self, labels: np.ndarray, clean: np.ndarray, faulty: np.ndarray
                 ) -> dict[str, float]:
        clean_score = self.values(clean)["spearman"]
        return {**self.values(faulty), "spearman_clean": clean_score,
                **outcome(faulty, self.benign_cosine)}


__all__ = ["SimilarityMetric", "average_ranks", "pair_cosines", "spearman"]
