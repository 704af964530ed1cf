"""Every weight of a real model is reachable (tiny random Hugging Face models), tied weights
are one memory, chips survive wrappers, and buffers are faulted through ``inject_``."""

import copy
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch import nn  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.torch import TorchEvaluator, inject_, select_tensors  # noqa: E402

FORMATS = [bf.FixedPoint(32, 28, rounding="trunc"), bf.IntQuant(8, per_channel=True),
           bf.Float("bfloat16")]


def tiny(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=2, num_attention_heads=2,
                                       num_key_value_heads=1, max_position_embeddings=64)
        return transformers.LlamaForCausalLM(cfg).eval()
    if kind == "bert":
        cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, intermediate_size=64,
                                      max_position_embeddings=64)
        return transformers.BertModel(cfg).eval()
    cfg = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def weight_matrices(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every float parameter of 2+ dimensions, a tied one under its first name."""
    return {n: p for n, p in model.named_parameters() if p.ndim >= 2}


def output(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(x)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bit for bit (a NaN where the other has one)."""
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def reference(model: nn.Module, maps: dict, fmt) -> nn.Module:
    """A plain loop: ``bitfault.inject``'s values written into a copy's weights."""
    ref = copy.deepcopy(model)
    tensors = dict(ref.named_parameters(remove_duplicate=False))
    tensors.update(ref.named_buffers(remove_duplicate=False))
    with torch.no_grad():
        for name, fmap in maps.items():
            t = tensors[name]
            faulty = bf.inject(t.detach().numpy(), fmt, bf.BitFlip(), fmap)
            t.copy_(torch.from_numpy(np.ascontiguousarray(faulty)))
    return ref


@pytest.mark.parametrize("kind", ["llama", "bert", "gpt2"])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: type(f).__name__)
def test_every_weight_matrix_is_faulted_as_a_plain_loop_would(kind, fmt):
    model = tiny(kind)
    x = torch.randint(0, 64, (2, 7))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    clean = output(model, x)
    spec = bf.FaultSpec(format=fmt, ber=1e-3 if isinstance(fmt, bf.Float) else 1e-2, seed=3)
    handle = inject_(model, spec)
    assert set(handle.maps) == set(weight_matrices(model))  # all of them, a tied one once
    report = handle.report()
    assert report.n_elements == sum(p.numel() for p in weight_matrices(model).values())
    assert sum(t.faults > 0 for t in report.faulted) >= len(report.faulted) - 2
    left = {t.name: t.reason for t in report.left_out}
    assert left and all(p.ndim < 2 for n, p in model.named_parameters() if n in left)
    faulty, maps = output(model, x), handle.maps
    handle.remove()
    assert torch.equal(output(model, x), clean)
    same(faulty, output(reference(model, maps, fmt), x))
    assert not torch.equal(faulty, clean)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_gpt2_tied_embedding_is_one_memory():
    model = tiny("gpt2")
    assert model.lm_head.weight is model.transformer.wte.weight
    n_all = sum(p.numel() for p in model.parameters())
    chosen = select_tensors(model, "weights")
    assert sum(s.tensor.numel() for s in chosen) == sum(
        p.numel() for p in weight_matrices(model).values())
    assert n_all > sum(s.tensor.numel() for s in chosen)  # norms and biases are not weights
    wte = next(s for s in chosen if s.name == "transformer.wte.weight")
    assert wte.also == (("lm_head", "weight"),)
    handle = inject_(model, bf.FaultSpec(format=FORMATS[0], ber=1e-2, seed=0))
    assert "lm_head.weight" not in handle.maps
    row = next(t for t in handle.report().faulted if t.name == "transformer.wte.weight")
    assert row.also == ("lm_head.weight",)
    x = torch.randint(0, 64, (2, 5))
    with torch.no_grad():  # the head sees the same faulty embedding as the input side
        hidden = model.transformer(x).last_hidden_state
        head = model.lm_head(hidden)
    assert torch.equal(model(x).logits.detach(), head)
    handle.remove()


class Mixed(nn.Module):
    """MultiheadAttention, a parametrized Linear, an Embedding and a BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.lin = nn.Linear(8, 8)
        nn.utils.parametrize.register_parametrization(self.lin, "weight", Doubled())
        self.bn = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        h, _ = self.attn(h, h, h, need_weights=False)
        h = self.lin(h).mean(1)
        return self.head(self.bn(h))


class Doubled(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return 2 * w


def mixed() -> Mixed:
    torch.manual_seed(1)
    m = Mixed()
    m.train()
    with torch.no_grad():
        for _ in range(3):
            m(torch.randint(0, 10, (4, 5)))  # running statistics move off their defaults
    return m.eval()


def test_attention_parametrized_and_buffers_are_reachable():
    model = mixed()
    x = torch.randint(0, 10, (4, 5))
    with torch.no_grad():  # (MultiheadAttention takes its fast path only without grad)
        clean = model(x)
    spec = bf.FaultSpec(format=FORMATS[0], ber=2e-2, seed=1,
                        targets=["weights", "biases", "buffers"])
    handle = inject_(model, spec)
    names = set(handle.maps)
    assert {"emb.weight", "attn.in_proj_weight", "attn.in_proj_bias", "attn.out_proj.weight",
            "attn.out_proj.bias", "lin.parametrizations.weight.original", "lin.bias",
            "bn.running_mean", "bn.running_var", "head.weight", "head.bias"} == names
    left = {t.name: t.reason for t in handle.report().left_out}
    assert "not a float tensor" in left["bn.num_batches_tracked"]
    assert "bn.weight" in left  # a norm's 1-D scale: named, with its reason
    with torch.no_grad():
        faulty, maps = model(x), handle.maps
        handle.remove()
        assert torch.equal(model(x), clean)
        assert torch.equal(faulty, reference(model, maps, spec.format)(x))


def test_buffers_of_a_training_module_are_left_to_update():
    model, twin = mixed(), mixed()
    spec = bf.FaultSpec(format=FORMATS[0], ber=5e-2, seed=0, targets="buffers")
    handle = inject_(model, spec)
    assert set(handle.maps) == {"bn.running_mean", "bn.running_var"}
    model.train()
    twin.train()
    x = torch.randint(0, 10, (4, 5))
    with torch.no_grad():
        assert torch.equal(model(x), twin(x))  # batch statistics: the buffers are not read
    handle.remove()
    assert torch.equal(model.bn.running_mean, twin.bn.running_mean)  # and updated as usual


class Wrapped(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


@pytest.mark.parametrize("how", ["root", "name_prefix"])
def test_chips_survive_a_wrapper(how):
    model = mixed()
    spec = bf.FaultSpec(format=FORMATS[0], ber=1e-2, seed=5)
    bare = inject_(model, spec)
    bare_maps = {n: (m.indices.copy(), m.masks.copy()) for n, m in bare.maps.items()}
    bare.remove()
    wrapped = Wrapped(model)
    kwargs = {"root": wrapped.inner} if how == "root" else {"name_prefix": "inner."}
    handle = inject_(wrapped, spec, **kwargs)
    assert set(handle.maps) == set(bare_maps)
    for n, m in handle.maps.items():
        assert np.array_equal(m.indices, bare_maps[n][0])
        assert np.array_equal(m.masks, bare_maps[n][1])
    assert handle.report().naming["root" if how == "root" else "strip"]
    handle.remove()
    other = inject_(wrapped, spec)  # without it the names, so the chips, change
    assert set(other.maps) == {f"inner.{n}" for n in bare_maps}
    other.remove()
    ev = TorchEvaluator(wrapped, torch.randint(0, 10, (6, 5)), np.zeros(6, np.int64), **kwargs)
    assert set(ev.tensor_shapes()) == set(bare_maps)


def test_root_outside_the_model_is_refused():
    with pytest.raises(bf.ArgumentError, match="root"):
        inject_(mixed(), bf.FaultSpec(format=FORMATS[0], ber=1e-2), root=nn.Linear(2, 2))


class TwoSharing(nn.Module):
    """Two modules sharing one weight, the second first in a filter's eyes."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.b.weight = self.a.weight
        self.head = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.b(torch.relu(self.a(x)))))


@pytest.mark.parametrize("filter_fn", [None, ["b", "head"]])
def test_evaluator_on_tied_weights_matches_the_whole_model_runs(filter_fn, tmp_path):
    from bitfault.campaign import layer_sweep, rate_sweep, run, single_faults

    torch.manual_seed(0)
    model = TwoSharing()
    x, y = torch.randn(32, 6), torch.randint(0, 4, (32,))
    memory = bf.Memory(bf.FixedPoint(8, 4), bf.BitFlip())
    fast = TorchEvaluator(model, x, y, filter_fn=filter_fn)
    slow = TorchEvaluator(model, x, y, filter_fn=filter_fn, fast_paths=False)
    tied = "a.weight" if filter_fn is None else "b.weight"
    assert tied in fast.names and len(fast.names) == 2
    trials = (rate_sweep([0.05], 3) + layer_sweep([0.1], 3, [tied])
              + single_faults([(tied, e, b) for e in range(0, 36, 5) for b in (3, 6, 7)]))
    r1 = run(fast, trials, memory, tmp_path / "fast.db")
    r2 = run(slow, trials, memory, tmp_path / "slow.db")
    assert [r.metrics for r in r1.records] == [r.metrics for r in r2.records]
    # and the whole-model runs are inject_'s: the tied weight faulted once, in both modules
    maps = {tied: bf.FaultMap.random((6, 6), memory.format, ber=0.1, seed=0, name=tied)}
    pred = slow.predict([maps], memory)[0]
    spec = bf.FaultSpec(format=memory.format, maps={**maps, "head.weight": bf.FaultMap.empty(
        (4, 6), "head.weight")}, targets=[tied, "head.weight"])
    with inject_(model, spec, filter_fn=filter_fn), torch.no_grad():
        assert np.array_equal(model(x).argmax(1).numpy(), pred)
