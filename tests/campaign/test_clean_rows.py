"""The metrics' clean side kept once (``CleanRows``) gives the records computed without it,
bit for bit; the top-1 of float logits matches a plain loop (NaN never wins, first max)."""

import math

import numpy as np
import pytest

from bitfault.campaign.metrics import CleanRows, OutputMetric, make_records


def logits(shape, seed):
    rng = np.random.default_rng(seed)
    clean = (rng.normal(size=shape) * 3).astype(np.float32)
    faulty = clean + (rng.normal(size=shape) * 0.5).astype(np.float32)
    faulty.reshape(-1)[[7, 300, 901]] = [np.nan, np.inf, -np.inf]
    clean.reshape(-1)[[55, 420]] = [np.nan, -np.inf]  # clean rows that are not finite
    clean.reshape(-1)[600:650] = np.nan  # a clean row all NaN
    faulty[0] = clean[0]  # an example identical to the clean run
    return clean, faulty


@pytest.mark.parametrize("kind", ["language_model", "accuracy", "agreement"])
def test_records_with_the_clean_side_kept_are_the_same_bits(kind, monkeypatch):
    import bitfault.campaign.logits as kernels

    shape = (3, 9, 50) if kind == "language_model" else (27, 50)
    clean, faulty = logits(shape, 4)
    labels = np.random.default_rng(5).integers(0, 50, shape[:-1])
    if kind == "language_model":
        labels[:, -1] = -100
    labels = None if kind == "agreement" else labels
    metric = OutputMetric(kind)
    whole = make_records(metric, faulty, clean, labels)
    for rows in (None, 1, 4):  # rows per chunk (None: the default)
        if rows is not None:
            monkeypatch.setattr(kernels, "ROW_CHUNK_BYTES", rows * 8 * 50)
        kept = metric.clean_rows(clean)
        assert kept.nbytes == metric.clean_rows_nbytes(clean) == CleanRows.nbytes_for(clean)
        got = make_records(metric, faulty, clean, labels, kept)
        assert got.tobytes() == whole.tobytes()
        assert make_records(metric, clean, clean, labels, kept).tobytes() == \
            make_records(metric, clean, clean, labels).tobytes()
    assert bool(whole["identical"][0]) and not np.isfinite(whole["kl"]).all()


def test_cosine_has_no_clean_side():
    metric = OutputMetric("cosine")
    emb = np.ones((3, 4), np.float32)
    assert metric.clean_rows(emb) is None and metric.clean_rows_nbytes(emb) == 0


def test_top1_matches_a_plain_loop():
    clean, faulty = logits((27, 50), 9)
    faulty[3] = np.nan
    faulty[4, [5, 9]] = np.float32(1e30)  # a tie: the first wins
    got = CleanRows.of(faulty).top
    for r, row in enumerate(faulty.tolist()):
        best, at = -math.inf, 0
        for j, v in enumerate(row):
            if not math.isnan(v) and v > best:
                best, at = v, j
        assert got[r] == at, r


@pytest.mark.parametrize("chunk", [None, 8, 12])
def test_identical_and_finite_per_example_match_a_plain_loop(chunk, monkeypatch):
    import bitfault.campaign.logits as kernels

    if chunk is not None:
        monkeypatch.setattr(kernels, "ROW_CHUNK_BYTES", chunk)
    rng = np.random.default_rng(2)
    clean = rng.normal(size=(6, 5, 7)).astype(np.float32)
    faulty = clean.copy()
    faulty[1, 4, 6] = -faulty[1, 4, 6]  # the last value differs
    faulty[2, 0, 0] = np.inf
    clean[3, 2, 2] = 0.0
    faulty[3, 2, 2] = -0.0  # equal as floats, not as bits
    clean[4, 1, 1] = faulty[4, 1, 1] = np.nan  # the same NaN: identical, not finite
    faulty[5, 3, 3] = np.frombuffer(b"\x01\x00\xc0\x7f", np.float32)[0]  # another NaN
    clean[5, 3, 3] = np.float32("nan")
    rec = make_records(OutputMetric("agreement"), faulty.reshape(6, -1),
                       clean.reshape(6, -1), None)
    for i in range(6):
        assert rec["identical"][i] == (faulty[i].tobytes() == clean[i].tobytes()), i
        assert rec["finite"][i] == all(math.isfinite(v) for v in faulty[i].reshape(-1).tolist())
    assert rec["identical"].tolist() == [True, False, False, False, True, False]
    other = make_records(OutputMetric("cosine"), faulty[:, 0], clean[:, 0].astype(np.float64),
                         None)
    assert not other["identical"].any()  # another dtype is never identical
