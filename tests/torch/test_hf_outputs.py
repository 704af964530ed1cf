"""``OutputEvaluator`` on tiny random Hugging Face models: each trial's scores are what a
plain ``inject_`` run gives, the outcomes are classified, bad metrics are refused."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_hf import bert, gpt2  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.campaign import rate_sweep, run, trial_maps  # noqa: E402
from bitfault.campaign.metrics import make_records, outcome_summary  # noqa: E402
from bitfault.torch import OutputEvaluator, inject_  # noqa: E402
from bitfault.torch.evaluate.outputs import model_output  # noqa: E402
from bitfault.torch.hf import (  # noqa: E402
    mean_pooled,
    next_token_labels,
    token_windows,
)

MEMORY = bf.Memory(bf.IntQuant(8, per_channel=True), bf.BitFlip())


def plain(model, maps, memory, x, output_fn=model_output):
    """A trial by hand: inject_ with the trial's maps, the model's forward."""
    spec = bf.FaultSpec(format=memory.format, fault=memory.fault, maps=maps, targets=list(maps))
    with inject_(model, spec), torch.no_grad():
        xb = x
        out = model(**x) if isinstance(x, dict) else model(x)
        return output_fn(out, xb).float().numpy()


def test_language_model_trials_equal_plain_inject_runs(tmp_path):
    model = gpt2()
    ids = token_windows(np.random.default_rng(0).integers(0, 64, 200), context=12, windows=6)
    labels = next_token_labels(ids)
    ev = OutputEvaluator(model, ids, "language_model", labels=labels, batch_size=4,
                         max_bytes=0)  # nothing cached: clean outputs recomputed per batch
    assert len(ev.names) == 10  # every weight matrix, the tied embedding once
    trials = rate_sweep([1e-4, 1e-2], 3)
    result = run(ev, trials, MEMORY, tmp_path / "lm.db", metric=ev.metric)
    shapes = ev.tensor_shapes()
    empty = {n: bf.FaultMap.empty(s, n) for n, s in shapes.items()}
    clean = plain(model, empty, MEMORY, ids)
    assert result.clean["masked"] == 1
    for trial, rec in zip(trials, result.records, strict=True):
        faulty = plain(model, trial_maps(trial, MEMORY, shapes), MEMORY, ids)
        expected = ev.metric(labels, None, make_records(ev.metric, faulty, clean, labels))
        assert rec.metrics == pytest.approx(expected, rel=1e-12, nan_ok=True)
    rows = outcome_summary(result.records)
    assert [r["ber"] for r in rows] == [1e-4, 1e-2]
    assert rows[1]["benign"] + rows[1]["sdc"] + rows[1]["non_finite"] == 1.0
    assert all(0 <= r["masked_low"] <= r["masked"] <= r["masked_high"] <= 1 for r in rows)
    again = run(ev, trials, MEMORY, tmp_path / "lm.db", metric=ev.metric)  # resumes
    assert again.ran == 0 and [r.metrics for r in again.records] == \
        [r.metrics for r in result.records]


def test_embeddings_cosine_with_mean_pooling(tmp_path):
    model = bert()
    rng = np.random.default_rng(1)
    inputs = {"input_ids": torch.from_numpy(rng.integers(0, 64, (5, 9))),
              "attention_mask": torch.ones(5, 9, dtype=torch.long)}
    inputs["attention_mask"][:, 7:] = 0
    memory = bf.Memory(bf.Float("bfloat16"), bf.BitFlip())
    ev = OutputEvaluator(model, inputs, "cosine", output_fn=mean_pooled, batch_size=2)
    trials = rate_sweep([1e-3], 2)
    result = run(ev, trials, memory, tmp_path / "emb.db", metric=ev.metric)
    shapes = ev.tensor_shapes()
    clean = plain(model, {n: bf.FaultMap.empty(s, n) for n, s in shapes.items()}, memory,
                  inputs, mean_pooled)
    for trial, rec in zip(trials, result.records, strict=True):
        faulty = plain(model, trial_maps(trial, memory, shapes), memory, inputs, mean_pooled)
        expected = ev.metric(None, None, make_records(ev.metric, faulty, clean, None))
        assert rec.metrics == pytest.approx(expected, rel=1e-12, nan_ok=True)
    assert result.clean["cosine"] == pytest.approx(1.0)


def test_a_metric_that_does_not_fit_is_refused_before_anything_runs(tmp_path):
    ids = torch.randint(0, 64, (3, 8))
    with pytest.raises(bf.ArgumentError, match="metric 'accuracy' needs outputs of shape"):
        OutputEvaluator(gpt2(), ids, "accuracy", labels=np.zeros(3, np.int64))
    with pytest.raises(bf.ArgumentError, match="labels"):
        OutputEvaluator(gpt2(), ids, "language_model")
    with pytest.raises(bf.ArgumentError, match="too short"):
        token_windows(np.arange(30), context=16, windows=2)
    assert not list(tmp_path.iterdir())
