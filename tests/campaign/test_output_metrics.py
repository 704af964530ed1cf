"""Metrics on model outputs, on hand-made cases: perplexity of a known distribution,
agreement, KL, cosine, the outcome classes and their Wilson intervals (NumPy only)."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

import bitfault as bf
from bitfault.campaign.metrics import (
    OutputMetric,
    make_records,
    memory_outcome_summary,
    outcome,
    outcome_summary,
    trial_outcome,
)
from bitfault.campaign.stats import wilson_interval


def test_perplexity_of_a_uniform_and_a_known_distribution():
    lm = OutputMetric("language_model")
    uniform = np.zeros((2, 3, 8), np.float32)  # every token 1/8: perplexity 8
    labels = np.array([[1, 2, -100], [3, 4, -100]])
    rec = make_records(lm, uniform, uniform, labels)
    v = lm(labels, rec, rec)
    assert v["perplexity"] == pytest.approx(8.0, rel=1e-12) and v["tokens"] == 4
    # p(label) = 1/2 at one position and 1/4 at the other: ppl = exp((ln2 + ln4) / 2)
    logits = np.log(np.array([[[0.5, 0.25, 0.25], [0.25, 0.5, 0.25]]]))
    lab = np.array([[0, 2]])
    v = lm(lab, None, make_records(lm, logits, logits, lab))
    assert v["perplexity"] == pytest.approx(math.exp((math.log(2) + math.log(4)) / 2))
    assert v["next_token_accuracy"] == 0.5 and v["next_token_agreement"] == 1.0
    assert v["kl"] == 0.0 and v["masked"] == 1


def test_agreement_kl_and_accuracy():
    acc = OutputMetric("accuracy")
    clean = np.array([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0]])
    faulty = np.array([[2.0, 0.0], [1.0, 0.0], [3.0, 1.0]])
    labels = np.array([0, 0, 1])
    v = acc(labels, None, make_records(acc, faulty, clean, labels))
    assert v["accuracy"] == pytest.approx(2 / 3) and v["agreement"] == pytest.approx(2 / 3)
    p = np.exp(clean[1]) / np.exp(clean[1]).sum()
    q = np.exp(faulty[1]) / np.exp(faulty[1]).sum()
    assert v["kl"] == pytest.approx(np.sum(p * np.log(p / q)) / 3)
    assert (v["masked"], v["benign"], v["sdc"], v["non_finite"]) == (0, 0, 1, 0)
    agree = OutputMetric("agreement")
    assert agree(labels, None, make_records(agree, faulty, clean, None))["agreement"] == \
        pytest.approx(2 / 3)


def test_cosine_of_embeddings():
    cos = OutputMetric("cosine")
    clean = np.array([[1.0, 0.0], [1.0, 1.0]])
    faulty = np.array([[0.0, 2.0], [2.0, 2.0]])
    v = cos(None, None, make_records(cos, faulty, clean, None))
    assert v["cosine"] == pytest.approx(0.5) and v["cosine_min"] == pytest.approx(0.0)


def test_cosine_of_an_embedding_with_itself_is_at_most_one():
    # float64 rounding puts a third of these at 1 + 2**-52 before the clip
    x = np.random.default_rng(0).standard_normal((64, 384))
    raw = np.sum(x * x, 1) / np.linalg.norm(x, axis=1) ** 2
    assert np.any(raw > 1.0)
    cos = OutputMetric("cosine").record(x, x.copy(), None)["cosine"]
    assert np.all(cos <= 1.0) and np.all(cos >= 1.0 - 1e-15)
    assert np.all(OutputMetric("cosine").record(-x, x, None)["cosine"] >= -1.0)


def test_outcomes_masked_non_finite_benign_sdc():
    m = OutputMetric("agreement")
    clean = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    assert outcome(make_records(m, clean.copy(), clean, None))["masked"] == 1
    nan = clean.copy()
    nan[1, 0] = np.nan
    assert outcome(make_records(m, nan, clean, None)) == {"masked": 0, "benign": 0, "sdc": 0,
                                                          "non_finite": 1}
    off = clean.copy()
    off[0, 1] = np.nextafter(np.float32(2), np.float32(3))  # one ulp: not masked, same top-1
    assert outcome(make_records(m, off, clean, None)) == {"masked": 0, "benign": 1, "sdc": 0,
                                                          "non_finite": 0}
    flipped = clean.copy()
    flipped[1, 0] = 5.0  # row 1's top-1 moves: a decision changed
    assert outcome(make_records(m, flipped, clean, None)) == {"masked": 0, "benign": 0,
                                                              "sdc": 1, "non_finite": 0}


def test_outcomes_of_a_language_model_and_of_embeddings():
    lm = OutputMetric("language_model")
    clean = np.log(np.array([[[0.5, 0.3, 0.2], [0.2, 0.5, 0.3]]]))
    labels = np.array([[0, -100]])  # the second position is not scored
    nudged = clean + np.array([0.0, 0.01, 0.0])  # no top-1 moves
    assert lm(labels, None, make_records(lm, nudged, clean, labels))["benign"] == 1
    unscored = clean.copy()
    unscored[0, 1] = [1.0, 0.0, 0.0]  # top-1 moves where no token is scored: still benign
    assert lm(labels, None, make_records(lm, unscored, clean, labels))["benign"] == 1
    scored = clean.copy()
    scored[0, 0] = [0.0, 1.0, 0.0]
    assert lm(labels, None, make_records(lm, scored, clean, labels))["sdc"] == 1
    emb = np.array([[1.0, 0.0], [0.0, 1.0]])
    near = np.array([[1.0, 0.1], [0.0, 1.0]])  # cosine 0.995 to its clean embedding
    for threshold, cls in ((0.99, "benign"), (0.999, "sdc")):
        cos = OutputMetric("cosine", benign_cosine=threshold)
        assert cos(None, None, make_records(cos, near, emb, None))[cls] == 1
    with pytest.raises(bf.ArgumentError, match="benign_cosine"):
        OutputMetric("cosine", benign_cosine=1.5)


def test_outcome_summary_gives_every_class_and_reads_older_stores():
    new = [{"masked": 1, "benign": 0, "sdc": 0, "non_finite": 0}] * 3 + [
        {"masked": 0, "benign": 1, "sdc": 0, "non_finite": 0},
        {"masked": 0, "benign": 0, "sdc": 1, "non_finite": 0},
        {"masked": 0, "benign": 0, "sdc": 0, "non_finite": 1}]
    rows = [SimpleNamespace(kind="rate", ber=0.1, target=None, bit=None, metrics=o) for o in new]
    (row,) = outcome_summary(rows)
    assert row["trials"] == 6 and row["masked"] == 0.5 and "detected" not in row
    assert (row["benign"], row["sdc"], row["non_finite"]) == (1 / 6, 1 / 6, 1 / 6)
    assert (row["masked_low"], row["masked_high"]) == wilson_interval(3, 6)
    assert (row["sdc_low"], row["sdc_high"]) == wilson_interval(1, 6)
    # a protection code that flagged a word wins over what the outputs show
    assert trial_outcome({**new[4], "detected": 1}) == "detected"
    # an older store recorded masked / non_finite / corrupted: classed by its decisions
    old = {"masked": 0, "non_finite": 0, "corrupted": 1}
    assert trial_outcome({**old, "agreement": 1.0}) == "benign"
    assert trial_outcome({**old, "next_token_agreement": 0.98}) == "sdc"
    assert trial_outcome({**old, "cosine_min": 0.995}) == "benign"
    assert trial_outcome({**old, "cosine_min": 0.995}, benign_cosine=0.999) == "sdc"
    assert trial_outcome({"masked": 0, "non_finite": 1, "corrupted": 0}) == "non_finite"
    with pytest.raises(KeyError, match="OutputMetric"):
        trial_outcome({"accuracy": 0.5})


def test_memory_outcomes_tell_masked_from_benign():
    def trial(detected, accuracy, silent):
        return SimpleNamespace(kind="rate", ber=1e-3, metrics={
            "detected": detected, "accuracy": accuracy, "words_silent": silent,
            "raw_bit_errors": 2, "words_corrected": 1, "words_due": detected})

    records = [trial(1, 0.5, 0), trial(0, 0.8, 3), trial(0, 0.9, 0), trial(0, 0.9, 2),
               trial(0, 0.9, 0)]
    (row,) = memory_outcome_summary(records, clean_accuracy=0.9)
    assert (row["detected"], row["sdc"], row["masked"], row["benign"]) == (0.2, 0.2, 0.4, 0.2)
    assert (row["benign_low"], row["benign_high"]) == wilson_interval(1, 5)


@pytest.mark.parametrize("kind,shape", [("accuracy", (4, 3, 5)), ("accuracy", (4,)),
                                        ("language_model", (4, 5)), ("cosine", (4, 2, 2))])
def test_a_metric_that_does_not_fit_the_outputs_is_refused(kind, shape):
    with pytest.raises(bf.ArgumentError, match=f"metric {kind!r} needs"):
        OutputMetric(kind).check(shape, np.zeros(shape[:1], np.int64))


def test_bad_labels_and_kinds_are_refused():
    with pytest.raises(bf.ArgumentError, match="integer labels of shape"):
        OutputMetric("accuracy").check((4, 3), None)
    with pytest.raises(bf.ArgumentError, match="metric"):
        OutputMetric("top5")


@pytest.mark.parametrize("kind", ["language_model", "accuracy", "agreement"])
def test_logits_scored_in_row_chunks_equal_one_pass_bit_for_bit(kind, monkeypatch):
    import bitfault.campaign.logits as kernels

    rng = np.random.default_rng(4)
    shape = (3, 9, 50) if kind == "language_model" else (27, 50)
    clean = (rng.normal(size=shape) * 3).astype(np.float32)
    faulty = clean + (rng.normal(size=shape) * 0.5).astype(np.float32)
    faulty.reshape(-1)[[7, 300, 901]] = [np.nan, np.inf, -np.inf]  # rows that are not finite
    labels = rng.integers(0, 50, shape[:-1])
    if kind == "language_model":
        labels[:, -1] = -100
    labels = None if kind == "agreement" else labels
    metric = OutputMetric(kind)
    whole = make_records(metric, faulty, clean, labels)
    for rows in (1, 4):  # rows per chunk
        monkeypatch.setattr(kernels, "ROW_CHUNK_BYTES", rows * 8 * 50)
        assert make_records(metric, faulty, clean, labels).tobytes() == whole.tobytes()
    assert not np.isfinite(whole["kl"]).all()  # the non-finite rows reached the records

