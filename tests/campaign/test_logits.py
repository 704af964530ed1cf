"""The logit kernels (``bitfault.campaign.logits``) against a textbook row-by-row
reference in float64, bit for bit, on rows with NaN, infinities, no clean mass and
exponentials that underflow."""

import threading

import numpy as np
import pytest

from bitfault.campaign import logits
from bitfault.campaign.logits import CleanRows, logit_rows
from bitfault.errors import ArgumentError


def reference_row(faulty_row, clean_row, label):
    """One row scored the textbook way, in float64: log-softmax shifted by the largest
    value that is not NaN (0 where that is not finite), KL over the clean row's mass."""
    def log_softmax(row):
        x = np.asarray(row, np.float64)
        seen = x[~np.isnan(x)]
        top = float(np.max(seen)) if seen.size else np.nan
        top = top if np.isfinite(top) else 0.0
        return (x - top) - np.log(np.sum(np.exp(x - top)))

    with np.errstate(all="ignore"):
        lf, lc = log_softmax(faulty_row), log_softmax(clean_row)
        p = np.exp(lc)
        kl = np.sum(np.where(p > 0, p * (lc - lf), 0.0))
    masked = np.where(np.isnan(faulty_row), -np.inf, faulty_row)
    return kl, int(np.argmax(masked)), -lf[max(label, 0)]


@pytest.mark.parametrize(("rows_per_chunk", "threads"), [(None, 1), (2, 1), (2, 3), (5, 4)])
def test_each_row_equals_a_textbook_row_bit_for_bit(rows_per_chunk, threads, monkeypatch):
    """The kernels' shortcuts (the row maximum shared by log-softmax and top-1, a NaN row's
    exponentials skipped, KL summed again only where NaN) change no value, in chunks of
    any size and on any number of threads."""
    if rows_per_chunk is not None:
        monkeypatch.setattr(logits, "ROW_CHUNK_BYTES", 8 * 40 * rows_per_chunk)
    rng = np.random.default_rng(8)
    clean = (rng.normal(size=(12, 40)) * 4).astype(np.float32)
    faulty = clean + (rng.normal(size=clean.shape) * 0.2).astype(np.float32)
    faulty[1, 3] = np.nan
    faulty[2, :] = np.nan
    faulty[3, 5] = np.inf
    faulty[4, 6] = -np.inf  # -inf where the clean row has mass: KL inf
    clean[5, 7], faulty[5, 7] = -np.inf, 1.0  # no clean mass beside a finite faulty value
    clean[6, 8] = faulty[6, 8] = -np.inf  # no mass on both sides: that term is 0
    clean[7, :] = np.nan  # a clean row all NaN
    faulty[8] = clean[8]
    clean[9, 0], faulty[9, 0] = 800.0, 800.0  # every other exponential underflows to 0
    faulty[10, 1] = np.float32(3e38)
    labels = rng.integers(0, 40, 12)
    labels[11] = -100
    for kept in (None, CleanRows.of(clean, threads)):
        agree, kl, top, nll = logit_rows(faulty, clean, labels, kept, threads)
        for r in range(12):
            want_kl, want_top, want_nll = reference_row(faulty[r], clean[r], labels[r])
            c_top = reference_row(clean[r], clean[r], 0)[1]
            assert np.array_equal(kl[r], want_kl, equal_nan=True), r
            assert top[r] == want_top and agree[r] == (want_top == c_top), r
            assert np.array_equal(nll[r], want_nll, equal_nan=True), r
    assert np.isnan(kl[2]) and np.isinf(kl[4]) and kl[6] >= 0 and kl[8] == 0.0


@pytest.mark.parametrize(("n", "threads", "groups"), [(20, 3, 3), (20, 1, 1), (5, 4, 2),
                                                      (20, 9, 7), (0, 2, 0)])
def test_rows_go_to_the_threads_in_contiguous_groups_of_whole_chunks(n, threads, groups,
                                                                   monkeypatch):
    """``min(threads, chunks)`` groups of whole 3-row chunks, covering the rows once, each
    run off the calling thread when there are several."""
    monkeypatch.setattr(logits, "ROW_CHUNK_BYTES", 8 * 64 * 3)
    calls = []

    def score(lo, hi, step):
        calls.append((lo, hi, step, threading.current_thread() is threading.main_thread()))

    logits._in_row_groups(n, 64, threads, score)
    calls.sort()
    spans = [(lo, hi) for lo, hi, _, _ in calls if hi > lo]
    assert len(spans) == groups
    assert [lo for lo, _ in spans] == [0, *(hi for _, hi in spans[:-1])][:len(spans)]
    assert (spans[-1][1] if spans else 0) == n
    assert all(step == 3 and lo % 3 == 0 for lo, _, step, _ in calls)
    assert all(main == (groups <= 1) for *_, main in calls)


def test_threads_give_the_same_bits(monkeypatch):
    """The clean side and every row's values on three threads equal one thread's bit for
    bit."""
    monkeypatch.setattr(logits, "ROW_CHUNK_BYTES", 8 * 64 * 3)  # 3 rows a chunk: 7 chunks
    rng = np.random.default_rng(3)
    clean = (rng.normal(size=(20, 64)) * 5).astype(np.float32)
    faulty = clean * np.float32(1.5)
    faulty[4, 2] = np.nan
    faulty[11, :] = np.inf
    labels = rng.integers(0, 64, 20)
    rows, kept = CleanRows.of(clean, 3), CleanRows.of(clean)
    for name in ("logp", "p", "top"):
        assert getattr(rows, name).tobytes() == getattr(kept, name).tobytes()
    for side in (None, rows):
        one = logit_rows(faulty, clean, labels, side, 1)
        many = logit_rows(faulty, clean, labels, side, 3)
        for a, b in zip(one, many, strict=True):
            assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "2"])
def test_threads_must_be_a_positive_integer(threads):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ArgumentError, match="threads"):
        logit_rows(x, x, None, None, threads)
