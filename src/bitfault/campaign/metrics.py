"""Campaign metrics: what a trial's predictions score, and the checks on a user's metric."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.errors import ArgumentError, check_choice
from bitfault.stats import robust_error, wilson_interval

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
# and classifies the trial: masked, non-finite (a NaN/Inf reached the output) or corrupted.

OUTCOMES = ("masked", "non_finite", "corrupted")


def _floating(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits)
    return x if np.issubdtype(x.dtype, np.floating) else x.astype(np.float64)


def _row_max(x: np.ndarray) -> np.ndarray:
    """Each row's maximum in its own dtype (widening it to float64 is exact: the float64
    maximum); NaN where the row holds a NaN."""
    return np.max(x, axis=-1, keepdims=True)


EXP_FLOOR = -746.0
"""At and below this, float64 ``exp`` is 0 (its smallest subnormal is exp(-744.4)). Faulty
logits of 1e5 put almost every shifted logit there, where NumPy's exp takes a slow path
(5-70 ns a value, 10x its usual cost), so those exponentials are not taken but set to 0:
the same values."""


def _log_softmax(logits: np.ndarray, top: np.ndarray | None = None,
                 out: np.ndarray | None = None, work: np.ndarray | None = None) -> np.ndarray:
    """Log-softmax over the last axis in float64, shifted by each row's maximum (0 where
    that is not finite: a row holding a NaN is NaN throughout, whatever the shift);
    ``top``: ``_row_max(logits)`` when already known. Written into ``out`` and shifted in
    place, the exponentials in ``work`` (float64 arrays of the logits' shape, allocated
    when None: fresh pages cost more than the arithmetic); a NaN row's exponentials are
    not computed."""
    x = _floating(logits)
    with np.errstate(all="ignore"):
        top = _row_max(x) if top is None else top
        out = np.subtract(x, np.where(np.isfinite(top), top, 0).astype(np.float64),
                          out=out, dtype=np.float64)
        nan = np.isnan(top)
        taken = out > EXP_FLOOR  # False at a NaN; every other exponential is 0
        if nan.any():
            taken &= ~nan
        if taken.all():
            e = np.exp(out, out=work)
        else:
            e = np.zeros_like(out) if work is None else work
            e.fill(0.0)
            np.exp(out, out=e, where=taken)
        lse = np.log(np.sum(e, axis=-1, keepdims=True))
        lse[nan] = np.nan
        out -= lse
    return out


def _argmax(logits: np.ndarray, top: np.ndarray | None = None) -> np.ndarray:
    """Argmax over the last axis; a NaN never wins (as ``predicted_labels``). Float logits
    are compared in their own dtype (widening to float64 keeps their order: same index);
    only rows holding a NaN (``top``, ``_row_max``, is NaN there) are masked."""
    x = _floating(logits)
    with np.errstate(all="ignore"):
        nan = np.isnan(_row_max(x) if top is None else top).reshape(x.shape[:-1])
    out = np.argmax(x, axis=-1)
    if nan.any():
        rows = x[nan]  # a copy
        rows[np.isnan(rows)] = -np.inf
        out[nan] = np.argmax(rows, axis=-1)
    return out


def _kl(clean_logp: np.ndarray, faulty_logp: np.ndarray, p: np.ndarray | None = None,
        work: np.ndarray | None = None) -> np.ndarray:
    """KL(clean || faulty) over the last axis, in nats (0 where clean gives no mass);
    ``p``: ``exp(clean_logp)`` when already known. ``p * (clean_logp - faulty_logp)``
    summed; a row where that is NaN is summed again with its massless terms set to 0
    (which may make it finite), unless the faulty row is NaN and the clean one is not
    (log-softmax rows are NaN throughout or nowhere; the KL is NaN either way); ``work``:
    a float64 array of their shape for the terms (allocated when None)."""
    p = np.exp(clean_logp) if p is None else p
    with np.errstate(all="ignore"):
        terms = np.subtract(clean_logp, faulty_logp, out=work)
        terms *= p
        kl = np.sum(terms, axis=-1)
        odd = np.isnan(kl) & ~(np.isnan(faulty_logp[..., 0]) & ~np.isnan(clean_logp[..., 0]))
        if odd.any():
            po, co, fo = p[odd], clean_logp[odd], faulty_logp[odd]
            kl[odd] = np.sum(np.where(po > 0, po * (co - fo), 0.0), axis=-1)
    return kl


ROW_CHUNK_BYTES = 4 << 20
"""Logits are scored this many bytes of float64 rows at a time: the same operations on
each row as on the whole array (so the same values, bit for bit), in cache."""


@dataclass(frozen=True)
class CleanRows:
    """The clean side of the logit metrics, computed once per batch of clean logits (what
    every trial would recompute): per row its log-softmax, ``exp`` of it and its top-1.
    ``nbytes``: what keeping it costs (17 bytes per logit and 8 per row)."""

    logp: np.ndarray
    p: np.ndarray
    top: np.ndarray

    @classmethod
    def of(cls, clean: np.ndarray) -> CleanRows:
        c = np.asarray(clean)
        c2 = c.reshape(-1, c.shape[-1])
        logp, p = np.empty(c2.shape), np.empty(c2.shape)
        step = max(1, ROW_CHUNK_BYTES // (8 * max(c2.shape[-1], 1)))
        for i in range(0, len(c2), step):
            part = slice(i, i + step)
            _log_softmax(c2[part], out=logp[part], work=p[part])
            np.exp(logp[part], out=p[part])
        return cls(logp, p, _argmax(c2))

    @staticmethod
    def nbytes_for(clean: np.ndarray) -> int:
        return int(np.size(clean)) * 16 + int(np.size(clean) // max(np.shape(clean)[-1], 1)) * 8

    @property
    def nbytes(self) -> int:
        return self.logp.nbytes + self.p.nbytes + self.top.nbytes


def _logit_rows(faulty: np.ndarray, clean: np.ndarray, labels: np.ndarray | None,
                clean_rows: CleanRows | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row of logits (all axes but the last): top-1 agreement with the clean row, KL(clean
    || faulty), the faulty top-1 and the faulty row's negative log-likelihood of its label
    (0 where the label is negative or absent), computed in row chunks; ``clean_rows``:
    ``CleanRows.of(clean)`` when kept (the same values, the clean side not recomputed)."""
    f, c = np.asarray(faulty), np.asarray(clean)
    rows, width = f.shape[:-1], f.shape[-1]
    f2, c2 = f.reshape(-1, width), c.reshape(-1, width)
    n = f2.shape[0]
    lab = np.zeros(n, np.int64) if labels is None else np.asarray(labels).reshape(-1)
    agree, top = np.zeros(n, bool), np.zeros(n, np.int64)
    kl, nll = np.zeros(n), np.zeros(n)
    step = max(1, ROW_CHUNK_BYTES // (8 * max(width, 1)))
    work = np.empty((3, min(step, n), width))  # one chunk's float64 rows, reused
    for i in range(0, n, step):
        part = slice(i, min(i + step, n))
        lf_out, e_out, lc_out = work[:, :part.stop - i]
        fp = _floating(f2[part])
        with np.errstate(all="ignore"):
            fmax = _row_max(fp)
        lf = _log_softmax(fp, fmax, out=lf_out, work=e_out)
        top[part] = _argmax(fp, fmax)
        if clean_rows is None:
            lc = _log_softmax(c2[part], out=lc_out, work=e_out)
            agree[part] = top[part] == _argmax(c2[part])
            kl[part] = _kl(lc, lf, work=e_out)
        else:
            agree[part] = top[part] == clean_rows.top[part]
            kl[part] = _kl(clean_rows.logp[part], lf, clean_rows.p[part], work=e_out)
        safe = np.where(lab[part] >= 0, lab[part], 0)
        nll[part] = -np.take_along_axis(lf, safe[:, None], axis=-1)[:, 0]
    return (agree.reshape(rows), kl.reshape(rows), top.reshape(rows), nll.reshape(rows))


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
    subclass ``bitfault.campaign.similarity.SimilarityMetric``, which holds the pairs)."""

    kind: str = "accuracy"

    def __post_init__(self) -> None:
        check_choice(self.kind, METRIC_KINDS, "metric")
        if self.kind == "similarity" and getattr(self, "pairs", None) is None:
            raise ArgumentError("metric", "similarity", "a SimilarityMetric with the pairs",
                                requirement="metric 'similarity' needs the pairs and their "
                                            "human scores: bitfault.campaign.similarity."
                                            "SimilarityMetric.of(bitfault.text.text_pairs(...))")

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
               clean_rows: CleanRows | None = None) -> dict[str, np.ndarray]:
        """Per-example values of one batch (sums over tokens for a language model);
        ``clean_rows``: ``self.clean_rows(clean)`` when kept (same values, faster)."""
        if self.kind == "cosine":
            f, c = np.asarray(faulty, np.float64), np.asarray(clean, np.float64)
            with np.errstate(all="ignore"):
                cos = np.sum(f * c, 1) / (np.linalg.norm(f, axis=1) * np.linalg.norm(c, axis=1))
            return {"cosine": np.nan_to_num(cos, nan=0.0)}
        labels = None if labels is None else np.asarray(labels, np.int64)
        agree, kl, top, nll = _logit_rows(faulty, clean, labels, clean_rows)
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

    def clean_rows(self, clean: np.ndarray) -> CleanRows | None:
        """The clean side a trial of this metric can reuse (None: nothing to keep)."""
        return CleanRows.of(clean) if self.kind in ("accuracy", "agreement",
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
        """The campaign metric: the trial's scores and its outcome (one of ``OUTCOMES``, 0/1)."""
        return {**self.values(faulty), **outcome(faulty)}


METRIC_KINDS = ("accuracy", "agreement", "cosine", "language_model", "similarity")


def make_records(metric: OutputMetric, faulty: np.ndarray, clean: np.ndarray,
                 labels: np.ndarray | None, clean_rows: CleanRows | None = None
                 ) -> np.ndarray:
    """One batch's per-example records: ``metric.record`` fields (a field may hold a
    vector per example, as similarity's embeddings), ``identical``, ``finite``;
    ``clean_rows``: ``metric.clean_rows(clean)`` kept by the caller (the same records)."""
    faulty, clean = np.asarray(faulty), np.asarray(clean)
    n = len(faulty)
    identical, finite = _identical_and_finite(faulty, clean)
    values = metric.record(faulty, clean, labels) if clean_rows is None else \
        metric.record(faulty, clean, labels, clean_rows)
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
    step = max(1, ROW_CHUNK_BYTES // max(f.itemsize, 1))
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


def outcome(records: np.ndarray) -> dict[str, int]:
    """A trial's class: masked (every output bit-identical to the clean run), else
    non-finite (a NaN or Inf reached an output: detectable in practice), else corrupted."""
    masked = bool(np.all(records["identical"]))
    non_finite = not masked and not bool(np.all(records["finite"]))
    return {"masked": int(masked), "non_finite": int(non_finite),
            "corrupted": int(not masked and not non_finite)}


def outcome_summary(records: Iterable[Any], confidence: float = 0.95) -> list[dict[str, Any]]:
    """Per (kind, ber, target, bit) group of trial records (``TrialRecord``s with outcome
    metrics): the share of each outcome with its Wilson interval."""
    groups: dict[tuple, list[Mapping[str, float]]] = {}
    for r in records:
        key = (r.kind, r.ber, r.target if r.kind != "single" else None,
               r.bit if r.kind == "bit" else None)
        groups.setdefault(key, []).append(r.metrics)
    rows = []
    for (kind, ber, target, bit), ms in sorted(groups.items(), key=lambda kv: str(kv[0])):
        missing = [o for o in OUTCOMES if any(o not in m for m in ms)]
        if missing:
            raise KeyError(f"outcomes {missing} not recorded: run the campaign with an "
                           "OutputMetric")
        row: dict[str, Any] = {"kind": kind, "ber": ber, "target": target, "bit": bit,
                               "trials": len(ms), "confidence": confidence}
        for o in OUTCOMES:
            k = int(sum(int(m[o]) for m in ms))
            lo, hi = wilson_interval(k, len(ms), confidence)
            row.update({o: k / len(ms), f"{o}_low": lo, f"{o}_high": hi})
        rows.append(row)
    return rows


def memory_outcome_summary(records: Iterable[Any], clean_accuracy: float,
                           confidence: float = 0.95) -> list[dict[str, Any]]:
    """Per rate of a campaign on a stored memory (trials that recorded the decoder's
    outcomes): the share of trials ``detected`` (a word was detected uncorrectable: the
    trial is flagged), of silent data corruption ``sdc`` (not detected, accuracy below the
    fault-free accuracy) and ``masked`` (the rest), each with its Wilson interval, and the
    mean raw bit errors and words corrected, detected and silently corrupted per trial."""
    groups: dict[float, list[Mapping[str, float]]] = {}
    for r in records:
        if r.kind == "rate" and "detected" in r.metrics:
            groups.setdefault(r.ber, []).append(r.metrics)
    rows = []
    for ber, ms in sorted(groups.items()):
        n = len(ms)
        detected = sum(int(m["detected"]) for m in ms)
        sdc = sum(not m["detected"] and m["accuracy"] < clean_accuracy for m in ms)
        row: dict[str, Any] = {"ber": ber, "trials": n, "confidence": confidence}
        for name, k in (("detected", detected), ("sdc", sdc), ("masked", n - detected - sdc)):
            lo, hi = wilson_interval(k, n, confidence)
            row.update({name: k / n, f"{name}_low": lo, f"{name}_high": hi})
        for key in ("raw_bit_errors", "words_corrected", "words_due", "words_silent"):
            row[key] = sum(float(m[key]) for m in ms) / n
        rows.append(row)
    return rows


__all__ = ["METRIC_KINDS", "OUTCOMES", "CleanRows", "Metric", "OutputMetric", "accuracy_metrics",
           "call_metric", "make_records", "memory_outcome_summary", "outcome",
           "outcome_summary"]
