"""Block-boundary reuse (``bitfault.torch.evaluate.stack_reuse``) in ``OutputEvaluator`` and
``GGUFEvaluator``: a trial faulting blocks >= k starts from block k's clean input, and its
outputs equal, bit for bit, a whole-model run of a copy of the model faulted by
``inject_`` (or, for GGUF, by ``GGUFModel.inject_``); hooks on the blocks' modules show
that blocks < k did not run."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_hf import bert, gpt2, llama  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.campaign.evaluator import memory_key  # noqa: E402
from bitfault.torch import OutputEvaluator, inject_  # noqa: E402
from bitfault.torch.evaluate.outputs import model_output  # noqa: E402
from bitfault.torch.evaluate.stack_reuse import find_stack, spread  # noqa: E402
from bitfault.torch.hf import next_token_labels  # noqa: E402

MEMORY = bf.Memory(bf.IntQuant(8, per_channel=True), bf.BitFlip())
N, T = 4, 12


# model -> (builder, stack path, its embedding, its tensor after the stack or None (tied))
MODELS = {"llama": (llama, "model.layers", "model.embed_tokens.weight", "lm_head.weight"),
          "gpt2": (gpt2, "transformer.h", "transformer.wte.weight", None),
          "bert": (bert, "encoder.layer", "embeddings.word_embeddings.weight",
                   "pooler.dense.weight")}


def inputs_for(kind: str):
    ids = torch.from_numpy(np.random.default_rng(3).integers(0, 64, (N, T)))
    if kind == "bert":
        mask = torch.ones(N, T, dtype=torch.long)
        mask[:, 9:] = 0  # padded sentences
        return {"input_ids": ids, "attention_mask": mask}, "cosine", None, pooled
    return ids, "language_model", next_token_labels(ids), model_output


def pooled(out, xb):
    """BERT's pooler output (so that a fault in the pooler, after the stack, is scored)."""
    return out.pooler_output


class Recorder:
    """An ``output_fn`` that keeps the last tensor it handed the metric."""

    def __init__(self, fn):
        self.fn, self.last = fn, None

    def __call__(self, out, xb):
        t = self.fn(out, xb)
        self.last = t.detach().clone()
        return t


def whole_run(model, maps, x, output_fn):
    """The reference: a copy of the model faulted by ``inject_`` (every target stored, the
    maps' faults), its whole forward."""
    spec = bf.FaultSpec(format=MEMORY.format, fault=MEMORY.fault, maps=maps, targets=list(maps))
    m = copy.deepcopy(model)
    with inject_(m, spec), torch.no_grad():
        out = m(**x) if isinstance(x, dict) else m(x)
        return output_fn(out, x).detach()


def chip(shapes, chosen, seed=1, ber=2e-2):
    """Maps for every tensor: faults (``ber``) in the ``chosen`` ones, empty elsewhere."""
    return {n: bf.FaultMap.random(s, MEMORY.format, ber=ber, seed=seed, name=n) if chosen(n)
            else bf.FaultMap.empty(s, n) for n, s in shapes.items()}


def block_calls(blocks):
    """Hooks counting, per block, the calls of the modules inside it that hold weights."""
    counts = [0] * len(blocks)
    handles = []
    for i, b in enumerate(blocks):
        for m in b.modules():
            if next(m.parameters(recurse=False), None) is not None:
                def bump(mod, args, i=i):
                    counts[i] += 1
                handles.append(m.register_forward_pre_hook(bump))
    return counts, handles


def predict_counting(ev, maps, memory, blocks=None):
    """``ev.predict([maps], memory)``'s records and, per block, the calls of its weighted
    modules during it (``block_calls``)."""
    counts, handles = block_calls(ev.stack_cache.blocks if blocks is None else blocks)
    try:
        return ev.predict([maps], memory)[0], counts
    finally:
        for h in handles:
            h.remove()


def bits(t):
    return t.contiguous().view(torch.int32)


def evaluator(kind, **kwargs):
    build, path, _, _ = MODELS[kind]
    x, metric, labels, fn = inputs_for(kind)
    model = build()
    rec = Recorder(fn)
    ev = OutputEvaluator(model, x, metric, labels=labels, output_fn=rec, **kwargs)
    return model, x, fn, rec, ev


CASES = [(kind, case) for kind in sorted(MODELS)
         for case in ("block1", "block0", "block1+tail", "embedding", "tail")
         if case != "tail" or MODELS[kind][3] is not None]  # GPT-2's head is its embedding


@pytest.mark.parametrize(("kind", "case"), CASES)
def test_reuse_equals_whole_model_runs_bit_for_bit(kind, case):
    _, path, embedding, tail = MODELS[kind]
    model, x, fn, rec, ev = evaluator(kind)
    assert ev.stack_cache.path == path and len(ev.stack_cache.blocks) == 2
    chosen = {"block1": lambda n: n.startswith(f"{path}.1."),
              "block0": lambda n: n.startswith(f"{path}.0."),
              "block1+tail": lambda n: n.startswith(f"{path}.1.") or n == (tail or embedding),
              "embedding": lambda n: n == embedding,
              "tail": lambda n: n == tail}[case]
    # GPT-2's lm_head is transformer.wte: a fault there lies before the stack
    start = {"block1": 1, "block0": 0, "block1+tail": 0 if tail is None else 1,
             "embedding": 0, "tail": 2}[case]
    shapes = ev.tensor_shapes()
    empty = {n: bf.FaultMap.empty(s, n) for n, s in shapes.items()}
    ev.predict([empty], MEMORY)  # the clean run: block outputs kept, the patched run checked
    clean = whole_run(model, empty, x, fn)
    assert ev.stack_cache.enabled, ev.stack_cache.reason
    maps = chip(shapes, chosen)
    assert any(m.n_faults for m in maps.values())
    records, counts = predict_counting(ev, maps, MEMORY)
    expect = whole_run(model, maps, x, fn)
    assert not torch.equal(bits(expect), bits(clean))  # the faults reach the outputs
    assert torch.equal(bits(rec.last), bits(expect))
    assert not records["identical"].any()
    assert [c == 0 for c in counts] == [i < start for i in range(2)], counts
    # the switch: every trial through the whole model, the same bits
    _, _, _, rec_off, off = evaluator(kind, stack_reuse=False)
    off.predict([maps], MEMORY)
    assert torch.equal(bits(rec_off.last), bits(expect))


@pytest.mark.parametrize("max_bytes", [0, 7000])
def test_cache_respects_max_bytes_and_results_stay_the_same(max_bytes):
    # 4 blocks; one boundary (4 x 12 x 32 float32) is 6,144 bytes, the logits 12,288:
    # 7,000 keeps one boundary (block 1, spread evenly) and no clean logits
    model = llama(layers=4)
    x, metric, labels, fn = inputs_for("llama")
    rec = Recorder(fn)
    ev = OutputEvaluator(model, x, metric, labels=labels, output_fn=rec, max_bytes=max_bytes)
    shapes = ev.tensor_shapes()
    ev.predict([{n: bf.FaultMap.empty(s, n) for n, s in shapes.items()}], MEMORY)
    assert ev.stack_cache.used_bytes() <= max_bytes
    assert ev.stack_cache.kept(memory_key(MEMORY), 0) == ([] if max_bytes == 0 else [1])
    for k, start in [(3, 2), (2, 2), (1, 0)]:
        maps = chip(shapes, lambda n, k=k: n.startswith(f"model.layers.{k}."), seed=k)
        _, counts = predict_counting(ev, maps, MEMORY)
        assert torch.equal(bits(rec.last), bits(whole_run(model, maps, x, fn)))
        ran_from = start if max_bytes else 0
        # the clean logits do not fit either: each trial reruns the clean model, then its own
        per_block = counts[-1] // 2
        assert counts == [per_block * (1 + (i >= ran_from)) for i in range(4)], (k, counts)
    assert ev.stack_cache.used_bytes() <= max_bytes


def test_boundaries_spread_evenly():
    assert spread(4, 9) == {0, 1, 2, 3} and spread(4, 0) == set()
    assert spread(30, 1) == {14} and spread(30, 2) == {9, 19} and spread(4, 1) == {1}


class Chain(torch.nn.Module):
    """A plain stack: blocks called in order, or (``mode``) summing every block's output,
    or calling the first block twice: patching may not reproduce those."""

    def __init__(self, mode="chain"):
        super().__init__()
        torch.manual_seed(0)
        self.mode = mode
        self.embed = torch.nn.Linear(6, 8)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        h, outs = self.embed(x), []
        for b in self.blocks:
            h = torch.tanh(b(h))
            outs.append(h)
        if self.mode == "twice":
            h = self.blocks[0](h)
        return self.head(sum(outs) if self.mode == "sum" else h)


@pytest.mark.parametrize("mode", ["chain", "sum", "twice"])
def test_reuse_is_checked_and_turned_off_when_a_patched_run_differs(mode):
    model = Chain(mode).eval()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32))
    rec = Recorder(model_output)
    ev = OutputEvaluator(model, x, "agreement", output_fn=rec)
    shapes = ev.tensor_shapes()
    maps = chip(shapes, lambda n: n == "blocks.2.weight", ber=5e-2)
    ev.predict([maps], MEMORY)
    assert torch.equal(bits(rec.last), bits(whole_run(model, maps, x, model_output)))
    assert ev.stack_cache.enabled == (mode == "chain"), ev.stack_cache.reason
    assert ev.stack_cache.reason == {"chain": "", "sum": "a run reusing block 2's clean "
                                     "output differed from the whole model's",
                                     "twice": "its blocks did not run once each, in order, "
                                     "in a clean run"}[mode]
    assert ev.stack_cache.used_bytes() == (3 * 5 * 8 * 4 if mode == "chain" else 0)


def test_a_bad_stack_is_refused_by_name():
    model = llama()
    ids = torch.zeros(2, 8, dtype=torch.long)
    labels = next_token_labels(ids)
    for bad in ("model.nope", "lm_head"):
        with pytest.raises(bf.ArgumentError, match="stack must be") as err:
            OutputEvaluator(model, ids, "language_model", labels=labels, stack=bad)
        assert err.value.argument == "stack"
    with pytest.raises(bf.ArgumentTypeError) as err:
        OutputEvaluator(model, ids, "language_model", labels=labels, stack_reuse="yes")
    assert err.value.argument == "stack_reuse"
    assert find_stack(model, "model.layers")[0] == "model.layers"
    assert find_stack(torch.nn.Linear(2, 2)) is None


def test_gguf_trials_reuse_blocks_and_equal_whole_runs(tmp_path):
    pytest.importorskip("gguf")
    from bitfault.torch.gguf import load_gguf_model
    from bitfault.torch.gguf.evaluate import GGUFEvaluator
    from gguf_helpers import write_tiny_llama

    gm = load_gguf_model(write_tiny_llama(tmp_path / "tiny.gguf", seed=4, tied=True))
    ids = np.random.default_rng(0).integers(0, 128, (3, 16))
    labels = next_token_labels(torch.from_numpy(ids))
    ev = GGUFEvaluator(gm, ids, np.asarray(labels), metric="language_model")
    shapes = ev.tensor_shapes()
    x = torch.from_numpy(ids)
    last = {}
    grab = gm.model.register_forward_hook(
        lambda mod, args, out: last.__setitem__("logits", out.logits.detach().clone()))
    blocks = ev.stack_cache.blocks
    ev.predict([{}], ev.memory)  # the clean run (its patched check gives the same bits)
    clean = last["logits"]
    cases = [(lambda n: n.startswith("blk.1."), 1),
             (lambda n: n.startswith("blk.1.") or n == "output_norm.weight", 1),
             (lambda n: n == "output_norm.weight", 2),
             (lambda n: n.startswith("blk.0."), 0),
             (lambda n: n == "token_embd.weight", 0)]  # the tied head: before the stack
    try:
        for seed, (chosen, start) in enumerate(cases):
            maps = {n: gm.memory.random_maps(ber=3e-3, seed=seed, targets=[n])[n]
                    for n in shapes if chosen(n)}
            assert all(m.n_faults for m in maps.values())
            _, counts = predict_counting(ev, maps, ev.memory, blocks)
            got = last["logits"]
            assert [c == 0 for c in counts] == [i < start for i in range(2)], counts
            gm.inject_(maps)  # the reference: the whole model with the maps written in
            with torch.no_grad():
                expect = gm.model(x).logits
            gm.restore_()
            assert not torch.equal(bits(expect), bits(clean))
            assert torch.equal(bits(got), bits(expect))
    finally:
        grab.remove()
    assert ev.stack_cache.enabled and ev.stack_cache.kept("gguf", 0) == [0, 1]


def test_gguf_tied_embedding_faults_in_unread_rows_start_after_the_stack(tmp_path):
    """The tied token embedding is the LM head's weight: a fault in a row the token ids
    never name changes nothing before the stack's end, so no block runs, and the logits
    equal the whole faulty model's bit for bit; a fault in a row the data reads (or a
    weight read elsewhere, caught by the proof) runs the whole model."""
    pytest.importorskip("gguf")
    from bitfault.maps import FaultMap
    from bitfault.torch.gguf import load_gguf_model
    from bitfault.torch.gguf.evaluate import GGUFEvaluator
    from gguf_helpers import HIDDEN, write_tiny_llama

    gm = load_gguf_model(write_tiny_llama(tmp_path / "tiny.gguf", seed=5, tied=True))
    ids = np.random.default_rng(1).integers(0, 64, (3, 16))  # rows 64..127 never read
    ev = GGUFEvaluator(gm, ids, np.asarray(next_token_labels(torch.from_numpy(ids))),
                       metric="language_model")
    shapes, x, name = ev.tensor_shapes(), torch.from_numpy(ids), "token_embd.weight"
    last = {}
    grab = gm.model.register_forward_hook(
        lambda mod, args, out: last.__setitem__("logits", out.logits.detach().clone()))
    ev.predict([{}], ev.memory)
    scale = FaultMap((128, HIDDEN // 32), np.array([90 * 2 + 1]), np.array([1 << 14],
                     np.uint32), f"{name}:scale")
    read_row = int(ids[0, 0])
    cases = [(FaultMap(shapes[name], np.array([100 * HIDDEN + 5]), np.array([1 << 6],
                       np.uint32), name), 2),  # a code of unread row 100
             (FaultMap(shapes[name], np.zeros(0, np.int64), np.zeros(0, np.uint32), name,
                       planes={"scale": scale}), 2),  # the scale of a block of row 90
             (FaultMap(shapes[name], np.array([read_row * HIDDEN + 3]), np.array([1 << 6],
                       np.uint32), name), 0)]  # a row the data reads
    ev.predict([{name: cases[0][0]}], ev.memory)  # the first such trial runs the proof
    try:
        for fmap, start in cases:
            _, counts = predict_counting(ev, {name: fmap}, ev.memory)
            assert [c == 0 for c in counts] == [i < start for i in range(2)], counts
            got = last["logits"]
            gm.inject_({name: fmap})
            with torch.no_grad():
                expect = gm.model(x).logits
            gm.restore_()
            assert torch.equal(bits(got), bits(expect))
    finally:
        grab.remove()
    assert ev.rows_before_stack.proven("gguf") and ev.rows_before_stack.unread(
        "gguf", {"model.embed_tokens.weight": np.array([64, 127])})


def test_rows_before_stack_refuses_when_something_else_reads_the_weight():
    from bitfault.torch.evaluate.stack_reuse import StackReuse
    from bitfault.torch.evaluate.unread_rows import RowsBeforeStack, tied_candidates

    model = gpt2()  # its token embedding is its LM head's weight
    stack = StackReuse(model, "transformer.h")
    x = torch.from_numpy(np.random.default_rng(2).integers(0, 32, (2, 8)))
    with torch.no_grad(), stack.capture("k", 0):
        model(x)
    candidates = tied_candidates(model, stack)
    assert list(candidates) == ["transformer.wte.weight"]
    emb = model.transformer.wte.weight
    layer = model.transformer.h[0]
    run = [lambda: model(x)]  # one batch
    with torch.no_grad():
        fair = RowsBeforeStack(candidates, model.transformer.h[-1])
        assert fair.prove("k", run)
        assert fair.unread("k", {"transformer.wte.weight": np.array([40])})
        assert not fair.unread("k", {"transformer.wte.weight": np.array([int(x[0, 0])])})
        hook = layer.register_forward_pre_hook(  # a block that reads every row
            lambda m, args: (args[0] + emb.sum() * 0, *args[1:]))
        try:
            other = RowsBeforeStack(candidates, model.transformer.h[-1])
            assert not other.prove("k", run)
            assert "something else reads" in other.reason["k"]
        finally:
            hook.remove()


@pytest.mark.parametrize("row", [50, None])  # None: a row the data reads
def test_tied_embedding_rows_the_data_never_reads_start_after_the_stack(row):
    """GPT-2's token embedding is its LM head: a fault in a row no input id names runs no
    block, and the outputs equal the whole faulty model's bit for bit."""
    model = gpt2()
    ids = torch.from_numpy(np.random.default_rng(4).integers(0, 32, (N, T)))  # rows < 32
    rec = Recorder(model_output)
    ev = OutputEvaluator(model, ids, "language_model", labels=next_token_labels(ids),
                         output_fn=rec)
    shapes = ev.tensor_shapes()
    name = next(n for n in shapes if n in ("transformer.wte.weight", "lm_head.weight"))
    empty = {n: bf.FaultMap.empty(s, n) for n, s in shapes.items()}
    ev.predict([empty], MEMORY)
    r = int(ids[1, 2]) if row is None else row
    width = shapes[name][1]
    maps = {**empty, name: bf.FaultMap(shapes[name], np.array([r * width + 7]),
                                       np.array([1 << 6], np.uint32), name)}
    ev.predict([maps], MEMORY)  # the first such trial runs the proof
    _, counts = predict_counting(ev, maps, MEMORY)
    expect = whole_run(model, maps, ids, model_output)
    assert torch.equal(bits(rec.last), bits(expect))
    assert [c == 0 for c in counts] == [row is not None] * 2, counts
