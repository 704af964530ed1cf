"""``OutputEvaluator`` keeps no copy of the clean tensors and keeps its clean outputs in
the evaluator's one byte budget (``max_bytes``), shared with its other caches."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_hf import bert, llama  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.campaign import rate_sweep, trial_maps  # noqa: E402
from bitfault.errors import ArgumentError  # noqa: E402
from bitfault.torch import OutputEvaluator  # noqa: E402
from bitfault.torch.hf import mean_pooled  # noqa: E402

INT8 = bf.Memory(bf.IntQuant(8, per_channel=True), bf.BitFlip())
BF16 = bf.Memory(bf.Float("bfloat16"), bf.BitFlip())


def inputs(n=6, t=10):
    ids = torch.as_tensor(np.random.default_rng(1).integers(1, 64, (n, t)))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_clean_values_are_the_users_tensors():
    model = bert()
    ev = OutputEvaluator(model, inputs(), "cosine", output_fn=mean_pooled)
    users = dict(model.named_parameters())
    for name in ev.names:
        assert ev._clean[ev._path[name]].data_ptr() == users[ev._path[name]].data_ptr()
    ev.predict([{}], INT8)
    with torch.no_grad():
        users["encoder.layer.0.attention.self.query.weight"].add_(1.0)
    with pytest.raises(ArgumentError, match="changed in place"):
        ev.predict([{}], BF16)  # a new memory stores the tensors again: refused


@pytest.mark.parametrize("batch_size", [None, 2])
def test_clean_outputs_counted_in_the_budget(batch_size):
    x = inputs()
    one = 6 * 32 * 4 // (1 if batch_size is None else 3)  # bytes of one batch's embeddings
    ev = OutputEvaluator(bert(), x, "cosine", output_fn=mean_pooled, batch_size=batch_size,
                         max_bytes=one, stack_reuse=False)
    maps = trial_maps(rate_sweep([1e-3], 1)[0], INT8, ev.tensor_shapes())
    first = ev.predict([maps], INT8)[0]
    assert ev._budget.used == one and ev._budget.peak <= one  # one batch's outputs fit
    assert len(ev._clean_outs) == 1
    again = ev.predict([maps], INT8)[0]
    assert again.tobytes() == first.tobytes()
    ev.predict([{}], BF16)  # another memory: the first one's outputs go, budget given back
    assert all(k[0] == ev._key(BF16) for k in ev._clean_outs)
    assert ev._budget.used == one
    whole = OutputEvaluator(bert(), x, "cosine", output_fn=mean_pooled, batch_size=batch_size,
                            max_bytes=1 << 20, stack_reuse=False)
    assert whole.predict([maps], INT8)[0].tobytes() == first.tobytes()
    assert whole._budget.used >= 6 * 32 * 4


def test_language_model_clean_side_kept_in_the_budget_same_records():
    model = llama(kv_heads=2)
    from bitfault.torch.hf import next_token_labels

    ids = torch.as_tensor(np.random.default_rng(2).integers(0, 64, (4, 12)))
    labels = next_token_labels(ids.numpy())
    kept = OutputEvaluator(model, ids, "language_model", labels=labels, batch_size=2)
    bare = OutputEvaluator(model, ids, "language_model", labels=labels, batch_size=2,
                           max_bytes=0, stack_reuse=False)  # nothing kept
    for seed in range(3):
        maps = trial_maps(rate_sweep([1e-3], 1, base_seed=seed)[0], BF16,
                          kept.tensor_shapes())
        assert kept.predict([maps], BF16)[0].tobytes() == bare.predict([maps], BF16)[0].tobytes()
    assert len(kept._clean_rows) == 2 and not bare._clean_rows
    logits = 4 * 12 * 64
    held = sum(v.nbytes for c in (kept._clean_outs, kept._clean_rows) for v in c.values())
    assert held == logits * 4 + logits * 16 + 4 * 12 * 8  # float32 logits; float64 log p, p
    assert held <= kept._budget.used <= kept.max_bytes  # with the stored arrays, one budget
