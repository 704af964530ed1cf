"""TorchEvaluator within ``max_bytes``: one copy of the model, bounded caches, same results.

What is compared: predictions of evaluators that differ only in ``max_bytes`` (0: nothing
cached; a middle budget: some batches keep every clean value, some only what layer
trials read, some nothing; 1 GiB: everything), trial for trial, on layer sweeps, rate
sweeps (faults in every tensor) and single faults, for an MLP and a small CNN with
BatchNorm and a depthwise conv; the layer and rate trials also against a plain
``inject_`` loop. The caches' bytes are counted independently in the test (distinct
tensor storages, NumPy buffers) after every call and at every ``take`` of the budget;
switching memories frees what the caches held for the previous one.
The replica is compared bit for bit with the stored tensors (``inject_tensor`` with an
empty map) after each run; the user's model with a snapshot.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch_helpers import bits_equal, plain_predictions, same_state, snapshot  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.campaign import (  # noqa: E402
    layer_sweep,
    rate_sweep,
    sampled_single_faults,
    trial_maps,
)
from bitfault.torch import TorchEvaluator, inject_, inject_tensor  # noqa: E402
from bitfault.torch.evaluate.budget import ByteBudget  # noqa: E402

FIXED = bf.Memory(bf.FixedPoint(32, 28, rounding="trunc"), bf.BitFlip())
F32 = bf.Memory(bf.Float("float32"), bf.BitFlip())
INT8 = bf.Memory(bf.IntQuant(8, per_channel=True), bf.BitFlip())
NVFP4 = bf.Memory(bf.NVFP4(), bf.BitFlip())
GIB = 1 << 30


def _bn(c: int) -> nn.BatchNorm2d:
    b = nn.BatchNorm2d(c)
    g = torch.Generator().manual_seed(c)
    b.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
    b.running_var.copy_(torch.rand(c, generator=g) + 0.5)
    return b.eval()


class DepthwiseCNN(nn.Module):
    """conv-BN-ReLU6, an inverted residual (1x1 expand, 3x3 depthwise, 1x1 project), a
    linear head: the shapes of a MobileNetV2 block at 8x8."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem, self.bn0 = nn.Conv2d(1, 4, 3, padding=1), _bn(4)
        self.expand, self.bn1 = nn.Conv2d(4, 8, 1, bias=False), _bn(8)
        self.dw, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), _bn(8)
        self.project, self.bn3 = nn.Conv2d(8, 4, 1, bias=False), _bn(4)
        self.fc = nn.Linear(4 * 16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.relu6(self.bn0(self.stem(x)))
        z = nn.functional.relu6(self.bn1(self.expand(y)))
        z = nn.functional.relu6(self.bn2(self.dw(z)))
        y = y + self.bn3(self.project(z))
        return self.fc(nn.functional.max_pool2d(y, 2).flatten(1))


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(),
                         nn.Linear(12, 5)).eval()


MODELS = {"mlp": (_mlp, (20,)), "cnn": (DepthwiseCNN, (1, 8, 8))}


def _data(shape: tuple[int, ...], n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, *shape, generator=g).numpy(), np.arange(n) % 5


def _trials(ev: TorchEvaluator, memory: bf.Memory) -> list:
    names = list(ev.tensor_shapes())
    return (layer_sweep([2e-2], 2, names) + rate_sweep([1e-2], 2)
            + sampled_single_faults(ev.tensor_shapes(), memory.format, size=40, seed=3))


def counted(ev: TorchEvaluator) -> int:
    """The bytes ``ev``'s caches hold, counted here: the distinct storages of the kept
    clean values other than the replica's tensors and the data, and the NumPy buffers
    of the stored arrays."""
    skip = {t.untyped_storage().data_ptr() for t in ev.model.state_dict().values()}
    skip.add(ev.x.untyped_storage().data_ptr())
    seen: dict[int, int] = {}
    for envs in ev._envs.values():
        for env in envs:
            for v in (env.values.values() if env is not None else ()):
                for t in (v if isinstance(v, (tuple, list)) else [v]):
                    if isinstance(t, torch.Tensor):
                        s = t.untyped_storage()
                        if s.data_ptr() not in skip:
                            seen[s.data_ptr()] = s.nbytes()
    arrays = 0
    for a in ev._patchable.values():
        if a is not None:
            arrays += a.words.nbytes + a.values.nbytes
            if a.params is not None:
                arrays += np.asarray(a.params.scale).nbytes + \
                    np.asarray(a.params.zero_point).nbytes
    return sum(seen.values()) + arrays


def replica_is_stored(ev: TorchEvaluator, model: nn.Module, memory: bf.Memory) -> bool:
    """Every target of the replica holds ``inject_tensor(clean, empty map)``'s bits, every
    other tensor the user's model's."""
    held = ev.model.state_dict()
    want = {k: v for k, v in model.state_dict().items()}
    for path in ev._clean:
        clean = want[path]
        want[path] = inject_tensor(clean, memory.format, memory.fault,
                                   bf.FaultMap.empty(tuple(clean.shape)))
    return all(bits_equal(held[k], want[k]) for k in want)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_results_do_not_depend_on_max_bytes(kind: str) -> None:
    make, shape = MODELS[kind]
    model = make()
    x, y = _data(shape, n=32)
    before = snapshot(model)
    small = TorchEvaluator(model, x, y, batch_size=8, max_bytes=0)
    memory = FIXED
    maps = [trial_maps(t, memory, small.tensor_shapes()) for t in _trials(small, memory)]
    large = TorchEvaluator(model, x, y, batch_size=8, max_bytes=GIB)
    got_large = large.predict(maps, memory)
    per_batch = large._envs[large._key(memory)][0].nbytes
    # a budget for two batches' complete values: the others keep what layer trials read
    mid = TorchEvaluator(model, x, y, batch_size=8, max_bytes=2 * per_batch + per_batch // 2)
    got_mid = mid.predict(maps, memory)
    got_small = small.predict(maps, memory)
    kinds = {name: [None if e is None else e.complete for e in ev._envs[ev._key(memory)]]
             for name, ev in (("small", small), ("mid", mid), ("large", large))}
    assert kinds["small"] == [None] * 4 and kinds["large"] == [True] * 4, kinds
    assert kinds["mid"][:2] == [True, True] and False in kinds["mid"], kinds
    n_layer = len(maps) - 40
    for k, (a, b, c) in enumerate(zip(got_small, got_mid, got_large, strict=True)):
        assert np.array_equal(a, c) and np.array_equal(b, c), k
        if k < n_layer:  # layer and rate trials: also the plain loop's
            assert np.array_equal(c, plain_predictions(model, x, memory, maps[k])), k
    assert len({p.tobytes() for p in got_large}) > 3  # the faults change predictions
    for ev in (small, mid, large):
        assert replica_is_stored(ev, model, memory) and not ev._undo
    assert same_state(model, before)


def test_cached_bytes_never_exceed_max_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    model = DepthwiseCNN()
    x, y = _data((1, 8, 8))
    seen: list[tuple[int, int]] = []
    take = ByteBudget.take

    def watched(self: ByteBudget, n: int) -> bool:
        ok = take(self, n)
        seen.append((self.used, self.max_bytes))
        return ok

    monkeypatch.setattr(ByteBudget, "take", watched)
    for max_bytes in (0, 30_000, 400_000, GIB):
        ev = TorchEvaluator(model, x, y, batch_size=8, max_bytes=max_bytes)
        for memory in (FIXED, F32, INT8):
            sparse = rate_sweep([1e-3], 1) if memory is F32 else []  # StoredArrays
            maps = [trial_maps(t, memory, ev.tensor_shapes())
                    for t in sparse + _trials(ev, memory)[::3]]
            for k in range(0, len(maps), 6):
                ev.predict(maps[k:k + 6], memory)
                assert ev.cached_bytes() == counted(ev) <= max_bytes, (max_bytes, memory)
            if max_bytes == GIB:  # something was kept: the count is not trivially 0
                assert counted(ev) > 0, memory
                arrays = [a for a in ev._patchable.values() if a is not None]
                assert bool(arrays) == (memory is F32), memory
    assert seen and all(used <= limit for used, limit in seen)


def test_replica_restores_every_bit_after_each_run() -> None:
    """Rate, layer and single-fault trials, faults in NVFP4 scales (whole blocks change)
    and maps faulting one tensor after maps faulting all of them: after every
    ``predict`` the replica holds the stored tensors bit for bit."""
    model = DepthwiseCNN()
    x, y = _data((1, 8, 8), n=16)
    ev = TorchEvaluator(model, x, y, targets="weights+biases")
    shapes = ev.tensor_shapes()
    for memory in (FIXED, INT8, F32, NVFP4, FIXED):
        rates = {"codes": 1e-2, "scale": 0.1} if memory is NVFP4 else 1e-2
        for t in _trials(ev, memory)[::2]:
            ev.predict([trial_maps(t, memory, shapes)], memory)
        maps = {n: bf.FaultMap.random(s, memory.format, ber=rates, seed=5, name=n)
                for n, s in shapes.items()}
        ev.predict([maps, {"fc.weight": maps["fc.weight"]}], memory)
        assert not ev._undo and replica_is_stored(ev, model, memory), memory


def test_one_copy_of_the_model_and_changes_to_it_are_refused() -> None:
    model = _mlp()
    x, y = _data((20,))
    ev = TorchEvaluator(model, x, y)
    ev.predict([{}], FIXED)
    params = dict(model.named_parameters())
    # the clean values are the user's tensors, the replica is the evaluator's only model
    assert all(ev._clean[p].data_ptr() == params[p].data_ptr() for p in ev._clean)
    assert [k for k, v in vars(ev).items() if isinstance(v, nn.Module)] == ["model"]
    user = {t.untyped_storage().data_ptr() for t in model.state_dict().values()}
    assert not user & {t.untyped_storage().data_ptr() for t in ev.model.state_dict().values()}
    with torch.no_grad():
        model[0].weight[0, 0] += 1.0
    with pytest.raises(bf.ArgumentError, match=r"'0.weight' was changed in place") as info:
        ev.predict([{}], FIXED)
    assert info.value.argument == "model"
    TorchEvaluator(model, x, y).predict([{}], FIXED)  # a new evaluator reads the new values


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("fmt", [bf.FixedPoint(32, 28, rounding="trunc"), bf.IntQuant(8),
                                 bf.Float("float16"), bf.NVFP4()], ids=repr)
def test_inject_on_cuda_equals_the_cpu_bit_for_bit(fmt) -> None:
    seen: dict[str, dict[str, torch.Tensor]] = {}
    for device in ("cpu", "cuda"):
        model = _mlp().to(device)
        got = seen.setdefault(device, {})
        for name, m in model.named_modules():
            if isinstance(m, nn.Linear):
                m.register_forward_pre_hook(
                    lambda mod, args, name=name, got=got:
                    got.__setitem__(name, mod.weight.detach().cpu()))
        handle = inject_(model, bf.FaultSpec(format=fmt, ber=1e-2, seed=3))
        with torch.no_grad():
            model(torch.zeros(2, 20, device=device))
        handle.remove()
    assert seen["cpu"] and seen["cpu"].keys() == seen["cuda"].keys()
    assert all(bits_equal(seen["cpu"][k], seen["cuda"][k]) for k in seen["cpu"])


@cuda
@pytest.mark.parametrize("memory", [FIXED, INT8, F32], ids=["fixed", "int8", "float32"])
def test_campaign_on_cuda_equals_the_cpu(memory: bf.Memory) -> None:
    """Stored and faulty tensors bit for bit; predictions equal (matmuls in float32, no
    TF32) on layer, rate and single-fault trials."""
    model = _mlp()
    x, y = _data((20,))
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        cpu = TorchEvaluator(model, x, y, batch_size=16)
        gpu = TorchEvaluator(model, x, y, batch_size=16, device="cuda")
        for p, t in cpu.stored(memory).items():
            assert bits_equal(t, gpu.stored(memory)[p].cpu()), p
        maps = [trial_maps(t, memory, cpu.tensor_shapes()) for t in _trials(cpu, memory)]
        for name, fmap in maps[0].items():
            assert bits_equal(cpu.faulty(name, fmap, memory),
                              gpu.faulty(name, fmap, memory).cpu()), name
        for a, b in zip(cpu.predict(maps, memory), gpu.predict(maps, memory), strict=True):
            assert np.array_equal(a, b)
        assert replica_is_stored(gpu, model.to("cuda"), memory)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
