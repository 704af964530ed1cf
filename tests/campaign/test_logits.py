"""The logit kernels (``bitfault.campaign.logits``) against a textbook row-by-row
reference in float64, bit for bit, on rows with NaN, infinities, no clean mass and
exponentials that underflow."""

import numpy as np

from bitfault.campaign.logits import CleanRows, logit_rows


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


def test_each_row_equals_a_textbook_row_bit_for_bit():
    """The kernels' shortcuts (the row maximum shared by log-softmax and top-1, a NaN row's
    exponentials skipped, KL summed again only where NaN) change no value."""
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
    for kept in (None, CleanRows.of(clean)):
        agree, kl, top, nll = logit_rows(faulty, clean, labels, kept)
        for r in range(12):
            want_kl, want_top, want_nll = reference_row(faulty[r], clean[r], labels[r])
            c_top = reference_row(clean[r], clean[r], 0)[1]
            assert np.array_equal(kl[r], want_kl, equal_nan=True), r
            assert top[r] == want_top and agree[r] == (want_top == c_top), r
            assert np.array_equal(nll[r], want_nll, equal_nan=True), r
    assert np.isnan(kl[2]) and np.isinf(kl[4]) and kl[6] >= 0 and kl[8] == 0.0
