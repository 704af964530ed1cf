"""Campaign metrics: what a trial's predictions score, and the checks on a user's metric."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.campaign import logits
from bitfault.campaign.logits import CleanRows, logit_rows
from bitfault.campaign.stats import robust_error, wilson_interval
from bitfault.errors import ArgumentError, check_choice

Metric = Callable[[np.ndarray, np.ndarray, np.ndarray], Mapping[str, float]]


def accuracy_metrics(labels: np.ndarray, clean: np.ndarray, faulty: np.ndarray) -> dict[str, float]:
    """The default metric: accuracy, correct count, and robust error."""
    correct = int(np.sum(faulty == labels))
    return {"accuracy": correct / len(labels), "correct": correct, "n": len(labels),
            "robust_error": robust_error(labels, clean, faulty)}


def call_metric(metric: Metric, labels: np.ndarray, clean: np.ndarray, faulty: np.ndarray,
                where: str) -> dict[str, float]:
    """``metric``'s values as plain numbers; an error names the metric and ``where`` it ran."""
    try:
        values = dict(metric(labels, clean, faulty))
    except Exception as exc:
        raise RuntimeError(f"metric {getattr(metric, '__name__', metric)!r} raised on {where}: "
                           f"{type(exc).__name__}: {exc}") from exc
    for k, v in values.items():
        if not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"metric values must be numbers; {k!r} is {type(v).__name__}")
    return {k: float(v) if isinstance(v, (float, np.floating)) else int(v)
            for k, v in values.items()}




# ---- metrics on model outputs: a faulty run compared with the clean one ------------------
#
# An output evaluator (``bitfault.torch.OutputEvaluator``) turns each data batch of a trial
# into per-example records (``make_records``): the metric's own fields plus ``identical``
# (the example's outputs are bit-identical to the clean run's) and ``finite``. The metric
# then scores a trial's records like any campaign metric, ``metric(labels, clean, faulty)``,
# and classifies the trial (``outcome``; ``trial_outcome`` adds what a memory's decoder
# detected): masked, benign, sdc, detected or non-finite.

OUTCOMES = ("masked", "benign", "sdc", "detected", "non_finite")
"""A trial's class, as fault-injection studies name them: ``masked`` (outputs bit-identical
to the clean run), ``benign`` (outputs changed, every decision kept: each output row's
top-1, each scored token's next-token top-1, or each embedding's cosine to the clean one at
least ``benign_cosine``), ``sdc`` (silent data corruption: a decision changed), ``detected``
(a protection code flagged an uncorrectable word; only on memories with one) and
``non_finite`` (a NaN or Inf reached the outputs: detectable in practice)."""

BENIGN_COSINE = 0.99
"""An embedding whose cosine with the clean one is at least this is unchanged for a user
(the default of ``OutputMetric.benign_cosine``)."""


def _refuse(metric: str, shape: tuple[int, ...], wanted: str) -> None:
    raise ArgumentError("metric", metric, f"a metric that fits the model's outputs ({wanted})",
                        requirement=f"metric {metric!r} needs {wanted}; the model's outputs "
                                    f"have shape {tuple(shape)}: choose another metric or an "
                                    "output_fn that returns such outputs")


@dataclass(frozen=True)
class OutputMetric:
    """A metric on outputs. ``kind``: "accuracy" (classification accuracy, top-1 agreement and
    KL divergence with the clean model; (N, classes) logits and (N,) labels), "agreement"
    (the same without labels), "cosine" (cosine similarity of (N, D) embeddings with the
    clean ones), "language_model" (perplexity, next-token accuracy, next-token agreement and
    KL with the clean model; (N, T, vocab) logits and (N, T) next-token labels, -100 where
    no token is scored), "similarity" (a downstream score of (N, dim) embeddings: the
    subclass ``bitfault.campaign.similarity.SimilarityMetric``, which holds the pairs).
    ``benign_cosine``: an embedding (cosine, similarity) whose cosine with the clean one is
    at least this counts as unchanged in a trial's outcome (``OUTCOMES``)."""

    kind: str = "accuracy"
    benign_cosine: float = BENIGN_COSINE

    def __post_init__(self) -> None:
        check_choice(self.kind, METRIC_KINDS, "metric")
        c = self.benign_cosine
        if isinstance(c, bool) or not isinstance(c, (int, float, np.integer, np.floating)) \
                or not -1.0 <= float(c) <= 1.0:
            raise ArgumentError("benign_cosine", c, "a number in [-1, 1] (default "
                                f"{BENIGN_COSINE})")
        if self.kind == "similarity" and getattr(self, "pairs", None) is None:
            raise ArgumentError("metric", "similarity", "a SimilarityMetric with the pairs",
                                requirement="metric 'similarity' needs the pairs and their "
                                            "human scores: bitfault.campaign.similarity."
                                            "SimilarityMetric.of(bitfault.data.text.text_pairs(...))")

    @property
    def __name__(self) -> str:  # call_metric names the metric in its errors
        return self.kind

    @property
    def needs_labels(self) -> bool:
        return self.kind in ("accuracy", "language_model")

    def check(self, shape: tuple[int, ...], labels: np.ndarray | None) -> None:
        """Refuse outputs (and labels) this metric cannot score, with the reason."""
        ndim = {"accuracy": 2, "agreement": 2, "cosine": 2, "language_model": 3}[self.kind]
        wanted = {2: "outputs of shape (N, classes)" if self.kind != "cosine" else
                  "embeddings of shape (N, dim)", 3: "logits of shape (N, tokens, vocab)"}[ndim]
        if len(shape) != ndim or (self.kind != "cosine" and shape[-1] < 2):
            _refuse(self.kind, shape, wanted)
        if not self.needs_labels:
            return
        want = tuple(shape[:ndim - 1])
        if labels is None or tuple(np.shape(labels)) != want or not np.issubdtype(
                np.asarray(labels).dtype, np.integer):
            raise ArgumentError("labels", None if labels is None else np.shape(labels),
                                f"integer labels of shape {want}",
                                requirement=f"metric {self.kind!r} needs integer labels of "
                                            f"shape {want} (the outputs are {tuple(shape)})")

    def fields(self) -> tuple[str, ...]:
        return {"accuracy": ("correct", "agree", "kl"), "agreement": ("agree", "kl"),
                "cosine": ("cosine",),
                "language_model": ("nll", "tokens", "correct", "agree", "kl")}[self.kind]

    def record(self, faulty: np.ndarray, clean: np.ndarray, labels: np.ndarray | None,
               clean_rows: CleanRows | None = None, threads: int = 1
               ) -> dict[str, np.ndarray]:
        """Per-example values of one batch (sums over tokens for a language model);
        ``clean_rows``: ``self.clean_rows(clean)`` when kept (same values, faster);
        ``threads``: logits are scored on up to this many (same values on any number)."""
        if self.kind == "cosine":
            f, c = np.asarray(faulty, np.float64), np.asarray(clean, np.float64)
            with np.errstate(all="ignore"):
                cos = np.sum(f * c, 1) / (np.linalg.norm(f, axis=1) * np.linalg.norm(c, axis=1))
            # a vector's cosine with itself can round to 1 + 2**-52: kept inside [-1, 1]
            return {"cosine": np.clip(np.nan_to_num(cos, nan=0.0), -1.0, 1.0)}
        labels = None if labels is None else np.asarray(labels, np.int64)
        agree, kl, top, nll = logit_rows(faulty, clean, labels, clean_rows, threads)
        if self.kind == "agreement":
            return {"agree": agree.astype(np.float64), "kl": kl}
        if self.kind == "accuracy":
            return {"correct": (top == labels).astype(np.float64),
                    "agree": agree.astype(np.float64), "kl": kl}
        scored = labels >= 0
        return {"nll": np.sum(np.where(scored, nll, 0.0), 1), "tokens": np.sum(scored, 1) * 1.0,
                "correct": np.sum(scored & (top == labels), 1) * 1.0,
                "agree": np.sum(scored & agree, 1) * 1.0,
                "kl": np.sum(np.where(scored, kl, 0.0), 1)}

    def clean_rows(self, clean: np.ndarray, threads: int = 1) -> CleanRows | None:
        """The clean side a trial of this metric can reuse (None: nothing to keep), scored on
        up to ``threads`` threads."""
        return CleanRows.of(clean, threads) if self.kind in ("accuracy", "agreement",
                                                    "language_model") else None

    def clean_rows_nbytes(self, clean: np.ndarray) -> int:
        """Bytes ``clean_rows(clean)`` would keep."""
        return CleanRows.nbytes_for(clean) if self.kind in ("accuracy", "agreement",
                                                           "language_model") else 0

    def values(self, records: np.ndarray) -> dict[str, float]:
        """A trial's scores from its records."""
        r = records
        if self.kind == "cosine":
            return {"cosine": float(np.mean(r["cosine"])), "cosine_min": float(np.min(r["cosine"]))}
        if self.kind in ("accuracy", "agreement"):
            out = {"agreement": float(np.mean(r["agree"])), "kl": float(np.mean(r["kl"]))}
            if self.kind == "accuracy":
                out = {"accuracy": float(np.mean(r["correct"])), **out}
            return out
        n = float(np.sum(r["tokens"]))
        with np.errstate(all="ignore"):
            return {"perplexity": float(np.exp(np.sum(r["nll"]) / n)),
                    "next_token_accuracy": float(np.sum(r["correct"]) / n),
                    "next_token_agreement": float(np.sum(r["agree"]) / n),
                    "kl": float(np.sum(r["kl"]) / n), "tokens": int(n)}

    def __call__(self, labels: np.ndarray, clean: np.ndarray, faulty: np.ndarray
                 ) -> dict[str, float]:
        """The campaign metric: the trial's scores and its outcome (``outcome``, 0/1 each)."""
        return {**self.values(faulty), **outcome(faulty, self.benign_cosine)}


METRIC_KINDS = ("accuracy", "agreement", "cosine", "language_model", "similarity")


def make_records(metric: OutputMetric, faulty: np.ndarray, clean: np.ndarray,
                 labels: np.ndarray | None, clean_rows: CleanRows | None = None,
                 threads: int = 1) -> np.ndarray:
    """One batch's per-example records: ``metric.record`` fields (a field may hold a
    vector per example, as similarity's embeddings), ``identical``, ``finite``;
    ``clean_rows``: ``metric.clean_rows(clean)`` kept by the caller (the same records);
    ``threads``: logits are scored on up to this many (the same records on any number)."""
    faulty, clean = np.asarray(faulty), np.asarray(clean)
    n = len(faulty)
    identical, finite = _identical_and_finite(faulty, clean)
    values = metric.record(faulty, clean, labels, clean_rows, threads)
    dtype = [(f, np.float64, np.shape(values[f])[1:]) for f in metric.fields()] + [
        ("identical", bool), ("finite", bool)]
    out = np.zeros(n, dtype)
    for f in metric.fields():
        out[f] = values[f]
    out["identical"], out["finite"] = identical, finite
    return out


def _identical_and_finite(faulty: np.ndarray, clean: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Per example: bit-identical to the clean outputs (NaN payloads included), and every
    value finite; compared in chunks of ``ROW_CHUNK_BYTES`` (no temporaries the size of the
    outputs; a differing example usually stops at its first chunk)."""
    n = len(faulty)
    identical, finite = np.zeros(n, bool), np.ones(n, bool)
    if n == 0:
        return identical, finite
    f = np.ascontiguousarray(faulty).reshape(n, -1)
    same = faulty.shape == clean.shape and faulty.dtype == clean.dtype
    fb = f.view(np.uint8) if same else None
    cb = np.ascontiguousarray(clean).reshape(n, -1).view(np.uint8) if same else None
    step = max(1, logits.ROW_CHUNK_BYTES // max(f.itemsize, 1))
    floating = np.issubdtype(f.dtype, np.floating) or np.issubdtype(f.dtype, np.complexfloating)
    for i in range(n):
        if same:
            width = fb.shape[1]
            identical[i] = all(np.array_equal(fb[i, j:j + step * f.itemsize],
                                              cb[i, j:j + step * f.itemsize])
                               for j in range(0, width, step * f.itemsize))
        if floating:
            finite[i] = all(bool(np.isfinite(f[i, j:j + step]).all())
                            for j in range(0, f.shape[1], step))
    return identical, finite


def outcome(records: np.ndarray, benign_cosine: float = BENIGN_COSINE) -> dict[str, int]:
    """A trial's class from its records, one 0/1 value each: ``masked`` (every output
    bit-identical to the clean run), else ``non_finite`` (a NaN or Inf reached an output),
    else ``sdc`` (a decision changed: a row's top-1 (``agree``), a scored token's top-1
    (``agree`` below ``tokens``), or an embedding's cosine to the clean one below
    ``benign_cosine``), else ``benign``. ``detected`` is the memory's (``trial_outcome``)."""
    masked = bool(np.all(records["identical"]))
    non_finite = not masked and not bool(np.all(records["finite"]))
    changed = not masked and not non_finite and _decision_changed(records, benign_cosine)
    return {"masked": int(masked), "benign": int(not (masked or non_finite or changed)),
            "sdc": int(changed), "non_finite": int(non_finite)}


def _decision_changed(records: np.ndarray, benign_cosine: float) -> bool:
    names = records.dtype.names or ()
    if "tokens" in names:
        return bool(np.any(records["agree"] < records["tokens"]))
    if "agree" in names:
        return bool(np.any(records["agree"] < 1.0))
    if "cosine" in names:
        return bool(np.any(records["cosine"] < benign_cosine))
    return True  # no decision to compare: any change counts


def trial_outcome(metrics: Mapping[str, Any], benign_cosine: float = BENIGN_COSINE) -> str:
    """One of ``OUTCOMES`` for a stored trial's metrics: ``detected`` when the memory's
    decoder flagged a word, else what the metric recorded. A trial of an older store
    (``masked`` / ``non_finite`` / ``corrupted``) is classed by the decisions it recorded
    (``agreement`` or ``next_token_agreement`` 1, or ``cosine_min`` at least
    ``benign_cosine``: benign). KeyError: the trial recorded no outcome."""
    if metrics.get("detected"):
        return "detected"
    if "masked" not in metrics:
        raise KeyError("outcomes not recorded: run the campaign with an OutputMetric")
    if metrics["masked"]:
        return "masked"
    if metrics.get("non_finite"):
        return "non_finite"
    if "sdc" in metrics:
        return "sdc" if metrics["sdc"] else "benign"
    for key, keeps in (("agreement", 1.0), ("next_token_agreement", 1.0),
                       ("cosine_min", benign_cosine)):
        if key in metrics:
            return "benign" if float(metrics[key]) >= keeps else "sdc"
    return "sdc"


def outcome_summary(records: Iterable[Any], confidence: float = 0.95,
                    benign_cosine: float = BENIGN_COSINE) -> list[dict[str, Any]]:
    """Per (kind, ber, target, bit) group of trial records (``TrialRecord``s with outcome
    metrics): the share of each outcome (``trial_outcome``; ``detected`` only where the
    memory has a decoder) with its Wilson interval; ``benign_cosine`` classes trials of
    older stores, which recorded no benign / sdc."""
    groups: dict[tuple, list[Mapping[str, float]]] = {}
    for r in records:
        key = (r.kind, r.ber, r.target if r.kind != "single" else None,
               r.bit if r.kind == "bit" else None)
        groups.setdefault(key, []).append(r.metrics)
    rows = []
    for (kind, ber, target, bit), ms in sorted(groups.items(), key=lambda kv: str(kv[0])):
        classes = [trial_outcome(m, benign_cosine) for m in ms]
        row: dict[str, Any] = {"kind": kind, "ber": ber, "target": target, "bit": bit,
                               "trials": len(ms), "confidence": confidence}
        for o in OUTCOMES:
            if o == "detected" and not any("detected" in m for m in ms):
                continue
            k = classes.count(o)
            lo, hi = wilson_interval(k, len(ms), confidence)
            row.update({o: k / len(ms), f"{o}_low": lo, f"{o}_high": hi})
        rows.append(row)
    return rows


def memory_outcome_summary(records: Iterable[Any], clean_accuracy: float,
                           confidence: float = 0.95) -> list[dict[str, Any]]:
    """Per rate of a campaign on a stored memory (trials that recorded the decoder's
    outcomes): the share of trials ``detected`` (a word was detected uncorrectable: the
    trial is flagged), of silent data corruption ``sdc`` (not detected, accuracy below the
    fault-free accuracy), ``masked`` (every word read back as stored: the outputs are the
    fault-free ones) and ``benign`` (the rest: words read back wrong, accuracy kept), each
    with its Wilson interval, and the mean raw bit errors and words corrected, detected and
    silently corrupted per trial."""
    groups: dict[float, list[Mapping[str, float]]] = {}
    for r in records:
        if r.kind == "rate" and "detected" in r.metrics:
            groups.setdefault(r.ber, []).append(r.metrics)
    rows = []
    for ber, ms in sorted(groups.items()):
        n = len(ms)
        detected = sum(int(m["detected"]) for m in ms)
        sdc = sum(not m["detected"] and m["accuracy"] < clean_accuracy for m in ms)
        masked = sum(not m["detected"] and m["accuracy"] >= clean_accuracy
                     and not m["words_silent"] for m in ms)
        row: dict[str, Any] = {"ber": ber, "trials": n, "confidence": confidence}
        for name, k in (("detected", detected), ("sdc", sdc), ("masked", masked),
                        ("benign", n - detected - sdc - masked)):
            lo, hi = wilson_interval(k, n, confidence)
            row.update({name: k / n, f"{name}_low": lo, f"{name}_high": hi})
        for key in ("raw_bit_errors", "words_corrected", "words_due", "words_silent"):
            row[key] = sum(float(m[key]) for m in ms) / n
        rows.append(row)
    return rows


__all__ = ["BENIGN_COSINE", "METRIC_KINDS", "OUTCOMES", "CleanRows", "Metric", "OutputMetric",
           "accuracy_metrics", "call_metric", "make_records", "memory_outcome_summary",
           "outcome", "outcome_summary", "trial_outcome"]
