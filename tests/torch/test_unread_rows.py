"""Single faults in embedding rows the data never reads are masked without a forward, once
a run with those rows NaN proves it; every result equals a whole run of the faulty model.
A tied embedding (GPT-2's head) and a model that reads the whole matrix get no shortcut."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_hf import bert, gpt2  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.campaign import single_faults, trial_maps  # noqa: E402
from bitfault.torch import OutputEvaluator  # noqa: E402
from bitfault.torch.hf import mean_pooled, next_token_labels  # noqa: E402

MEMORIES = [bf.Memory(bf.IntQuant(8, per_channel=True), bf.BitFlip()),
            bf.Memory(bf.Float("bfloat16"), bf.BitFlip())]
WORDS = "embeddings.word_embeddings.weight"


def texts():
    ids = torch.as_tensor(np.random.default_rng(3).integers(1, 20, (5, 9)))  # rows 1..19
    mask = torch.ones_like(ids)
    mask[:, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def whole(model, memory, maps, x, output_fn):
    """By hand: every target stored in the format (the trial's map faulting its tensor)
    written into a copy of the model, the whole model run."""
    import copy

    from bitfault.torch.seam import inject_tensor

    clone = copy.deepcopy(model)
    params = dict(clone.named_parameters())
    with torch.no_grad():
        for name, fmap in maps.items():
            params[name].copy_(inject_tensor(params[name].detach(), memory.format,
                                             memory.fault, fmap))
        out = clone(**x) if isinstance(x, dict) else clone(x)
        return output_fn(out, x).float().numpy()


def faults_in(rows, width, bits):
    return [(WORDS, r * width + c, b) for r in rows for c in (5,) for b in bits]


@pytest.mark.parametrize("memory", MEMORIES, ids=["int8", "bfloat16"])
def test_unread_rows_masked_without_forward_read_rows_run(memory):
    model, x = bert(), texts()
    ev = OutputEvaluator(model, x, "cosine", output_fn=mean_pooled, batch_size=2)
    assert WORDS in ev.unread.candidates
    assert "embeddings.position_embeddings.weight" in ev.unread.candidates
    trials = single_faults([*faults_in([1, 19, 0, 63], 32, [7]),  # read 1..19: 1, 19
                            ("embeddings.position_embeddings.weight", 40 * 32 + 1, 7),
                            ("embeddings.position_embeddings.weight", 3 * 32 + 1, 7),
                            ("embeddings.token_type_embeddings.weight", 32 + 2, 6)])
    shapes = ev.tensor_shapes()
    calls = []
    ev.model.register_forward_pre_hook(lambda m, a, k=None: calls.append(1))
    clean = whole(model, memory, {n: bf.FaultMap.empty(s, n) for n, s in shapes.items()},
                  x, mean_pooled)
    for t in trials:
        maps = trial_maps(t, memory, shapes)
        before = len(calls), ev.unread.skipped
        got = ev.predict([maps], memory)[0]
        faulty = whole(model, memory, maps, x, mean_pooled)
        assert got["cosine"].tolist() == ev.metric.record(faulty, clean, None)["cosine"].tolist()
        assert bool(got["identical"].all()) == bool(np.array_equal(faulty.view(np.int32),
                                                                   clean.view(np.int32)))
        row = t.element // 32
        unread = (t.target == WORDS and row not in range(1, 20)) or \
            (t.target != WORDS and row >= (9 if "position" in t.target else 1))
        if unread:  # no forward (the proof ran on the first trial: two runs of 3 batches)
            assert ev.unread.skipped == before[1] + 1 and len(calls) == before[0]
            assert got["identical"].all()
        else:
            assert ev.unread.skipped == before[1] and len(calls) > before[0]
    assert ev.unread.skipped == 4  # word rows 0 and 63, position 40, token type 1


def test_tied_embedding_gets_no_shortcut():
    model = gpt2()
    ids = torch.as_tensor(np.random.default_rng(0).integers(1, 20, (3, 8)))
    ev = OutputEvaluator(model, ids, "language_model", labels=next_token_labels(ids.numpy()))
    assert "transformer.wte.weight" not in ev.unread.candidates  # tied to lm_head
    assert "transformer.wpe.weight" in ev.unread.candidates
    memory, shapes = MEMORIES[1], ev.tensor_shapes()
    for t in single_faults([("transformer.wte.weight", 40 * 32 + 3, 14)]):
        maps = trial_maps(t, memory, shapes)
        got = ev.predict([maps], memory)[0]
        assert not got["identical"].all()  # the head reads every row
    assert ev.unread.skipped == 0


class ReadsAll(torch.nn.Module):
    """A BERT whose output also reads the whole word-embedding matrix (its mean)."""

    def __init__(self):
        super().__init__()
        self.bert = bert()

    def forward(self, input_ids, attention_mask):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
        w = self.bert.embeddings.word_embeddings.weight
        return out.last_hidden_state + 0.0 * w.mean()


def test_a_model_reading_the_whole_matrix_fails_the_proof():
    model, x = ReadsAll().eval(), texts()
    ev = OutputEvaluator(model, x, "cosine", output_fn=mean_pooled)
    memory, shapes = MEMORIES[0], ev.tensor_shapes()
    name = "bert." + WORDS
    assert name in ev.unread.candidates
    maps = trial_maps(single_faults([(name, 40 * 32, 7)])[0], memory, shapes)
    got = ev.predict([maps], memory)[0]
    assert ev.unread.skipped == 0 and "NaN" in next(iter(ev.unread.reason.values()))
    clean = whole(model, memory, {n: bf.FaultMap.empty(s, n) for n, s in shapes.items()},
                  x, mean_pooled)
    faulty = whole(model, memory, maps, x, mean_pooled)
    assert got["cosine"].tolist() == ev.metric.record(faulty, clean, None)["cosine"].tolist()
    off = OutputEvaluator(bert(), x, "cosine", output_fn=mean_pooled, unread_rows=False)
    off.predict([trial_maps(single_faults([(WORDS, 40 * 32, 7)])[0], memory,
                            off.tensor_shapes())], memory)
    assert off.unread.skipped == 0


@pytest.mark.parametrize("memory", MEMORIES, ids=["int8", "bfloat16"])
def test_a_row_only_some_batches_read_runs_only_those_batches(memory):
    """Rows a batch never reads cannot change that batch's outputs (proven per batch): a
    fault in a row only the second batch reads runs that batch alone, and every record
    equals a whole run of the faulty model."""
    model = bert()
    ids = torch.as_tensor(np.random.default_rng(5).integers(1, 20, (6, 9)))
    ids[2:4, 3] = 25  # row 25: read by the second batch (examples 2 and 3) only
    x = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    ev = OutputEvaluator(model, x, "cosine", output_fn=mean_pooled, batch_size=2)
    shapes = ev.tensor_shapes()
    calls = []
    ev.model.register_forward_pre_hook(lambda m, a, k=None: calls.append(1))
    clean = whole(model, memory, {n: bf.FaultMap.empty(s, n) for n, s in shapes.items()},
                  x, mean_pooled)
    seen = []
    for element in (25 * 32 + 4, 3 * 32 + 4):  # row 25, then row 3 (read by other batches)
        maps = trial_maps(single_faults([(WORDS, element, 7)])[0], memory, shapes)
        ev.predict([maps], memory)  # the first trial runs the proof
        before, skipped = len(calls), ev.unread.skipped_batches
        got = ev.predict([maps], memory)[0]
        faulty = whole(model, memory, maps, x, mean_pooled)
        assert got["cosine"].tolist() == ev.metric.record(faulty, clean, None)["cosine"].tolist()
        reads = [bool((ids[i:i + 2] == element // 32).any()) for i in (0, 2, 4)]
        seen.append(reads)
        assert len(calls) - before == sum(reads)
        assert ev.unread.skipped_batches - skipped == 3 - sum(reads)
        same = got["identical"].reshape(3, 2).all(axis=1)
        assert all(same[i] for i, r in enumerate(reads) if not r)
    assert seen == [[False, True, False], [True, True, True]]  # row 3: every batch reads it
    assert ev.unread.skipped == 0
