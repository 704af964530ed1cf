"""Logit rows scored for the output metrics: log-softmax, top-1 and KL per row, in chunks.

The faulty side of a trial is computed here on every trial (its clean side once, kept as
``CleanRows``), so each pass counts: a row's maximum is found once, float64 rows are
written into one reused workspace and shifted in place, exponentials that are 0 are not
taken, and the slow masking paths run only on rows holding a NaN. Every value equals the
textbook formulas in float64 bit for bit (``tests/campaign/test_logits.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from bitfault.errors import check_int


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


def _in_row_groups(n: int, width: int, threads: int,
                   score: Callable[[int, int, int], None]) -> None:
    """``score(lo, hi, step)`` on rows ``lo:hi`` (chunks of ``step`` rows inside), the rows
    split into up to ``threads`` contiguous groups of whole chunks run in threads of their
    own (NumPy lets go of the GIL in its loops). Every value is computed per row, so any
    split gives the same values, bit for bit."""
    step = max(1, ROW_CHUNK_BYTES // (8 * max(width, 1)))
    chunks = -(-n // step)
    groups = min(check_int(threads, "threads", 1), chunks)
    if groups <= 1:
        score(0, n, step)
        return
    bounds = [min(n, step * (chunks * g // groups)) for g in range(groups + 1)]
    with ThreadPoolExecutor(groups) as pool:
        runs = [pool.submit(score, lo, hi, step) for lo, hi in itertools.pairwise(bounds)]
        for run in runs:
            run.result()  # a worker's error is raised here


@dataclass(frozen=True)
class CleanRows:
    """The clean side of the logit metrics, computed once per batch of clean logits (what
    every trial would recompute): per row its log-softmax, ``exp`` of it and its top-1.
    ``nbytes``: what keeping it costs (17 bytes per logit and 8 per row)."""

    logp: np.ndarray
    p: np.ndarray
    top: np.ndarray

    @classmethod
    def of(cls, clean: np.ndarray, threads: int = 1) -> CleanRows:
        """The clean side of ``clean``'s rows, scored on up to ``threads`` threads."""
        c = np.asarray(clean)
        c2 = c.reshape(-1, c.shape[-1])
        logp, p = np.empty(c2.shape), np.empty(c2.shape)
        top = np.zeros(len(c2), np.int64)

        def score(lo: int, hi: int, step: int) -> None:
            for i in range(lo, hi, step):
                part = slice(i, min(i + step, hi))
                _log_softmax(c2[part], out=logp[part], work=p[part])
                np.exp(logp[part], out=p[part])
                top[part] = _argmax(c2[part])

        _in_row_groups(len(c2), c2.shape[-1], threads, score)
        return cls(logp, p, top)

    @staticmethod
    def nbytes_for(clean: np.ndarray) -> int:
        return int(np.size(clean)) * 16 + int(np.size(clean) // max(np.shape(clean)[-1], 1)) * 8

    @property
    def nbytes(self) -> int:
        return self.logp.nbytes + self.p.nbytes + self.top.nbytes


def logit_rows(faulty: np.ndarray, clean: np.ndarray, labels: np.ndarray | None,
               clean_rows: CleanRows | None = None, threads: int = 1
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row of logits (all axes but the last): top-1 agreement with the clean row, KL(clean
    || faulty), the faulty top-1 and the faulty row's negative log-likelihood of its label
    (0 where the label is negative or absent), computed in row chunks on up to ``threads``
    threads (the same values on any number); ``clean_rows``: ``CleanRows.of(clean)`` when
    kept (the same values, the clean side not recomputed)."""
    f, c = np.asarray(faulty), np.asarray(clean)
    rows, width = f.shape[:-1], f.shape[-1]
    f2, c2 = f.reshape(-1, width), c.reshape(-1, width)
    n = f2.shape[0]
    lab = np.zeros(n, np.int64) if labels is None else np.asarray(labels).reshape(-1)
    agree, top = np.zeros(n, bool), np.zeros(n, np.int64)
    kl, nll = np.zeros(n), np.zeros(n)

    def score(lo: int, hi: int, step: int) -> None:
        work = np.empty((3, min(step, hi - lo), width))  # one chunk's float64 rows, reused
        for i in range(lo, hi, step):
            part = slice(i, min(i + step, hi))
            lf_out, e_out, lc_out = work[:, :part.stop - i]
            fp = _floating(f2[part])
            with np.errstate(all="ignore"):
                fmax = _row_max(fp)
            lf = _log_softmax(fp, fmax, out=lf_out, work=e_out)
            top[part] = _argmax(fp, fmax)
            if clean_rows is None:
                cp = _floating(c2[part])
                with np.errstate(all="ignore"):
                    cmax = _row_max(cp)
                lc = _log_softmax(cp, cmax, out=lc_out, work=e_out)
                agree[part] = top[part] == _argmax(cp, cmax)
                kl[part] = _kl(lc, lf, work=e_out)
            else:
                agree[part] = top[part] == clean_rows.top[part]
                kl[part] = _kl(clean_rows.logp[part], lf, clean_rows.p[part], work=e_out)
            safe = np.where(lab[part] >= 0, lab[part], 0)
            nll[part] = -np.take_along_axis(lf, safe[:, None], axis=-1)[:, 0]

    _in_row_groups(n, width, threads, score)
    return (agree.reshape(rows), kl.reshape(rows), top.reshape(rows), nll.reshape(rows))
