"""TorchEvaluator: campaign results equal a plain inject-and-evaluate loop; strict about input.

What is compared: predicted labels (and the accuracies stored by ``run``) of the
evaluator against a reference that injects each map with ``bitfault.torch`` and
runs the model's own forward on the same examples in one batch. Rate, layer and
bit sweeps are compared exactly. The single-fault shortcut is compared on every
(element, bit) of a small layer: predictions equal brute force for every fault.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_helpers import plain_predictions  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.campaign import (  # noqa: E402
    bit_sweep,
    layer_sweep,
    rate_sweep,
    run,
    sampled_single_faults,
    single_faults,
    trial_maps,
)
from bitfault.data import split_embedded_mnist  # noqa: E402
from bitfault.models.torch import seed_mlp, small_cnn  # noqa: E402
from bitfault.torch import TorchEvaluator, inject_tensor  # noqa: E402

SEED_FORMAT = bf.FixedPoint(32, 28, rounding="trunc")
INT8 = bf.Memory(bf.IntQuant(8), bf.BitFlip())
FIXED = bf.Memory(SEED_FORMAT, bf.BitFlip())


def _train(model: torch.nn.Module, steps: int, lr: float) -> torch.nn.Module:
    (x, y), _ = split_embedded_mnist()
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
    for step in range(steps):
        i = torch.arange(step * 128, step * 128 + 128) % len(xt)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xt[i]), yt[i]).backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    _, (x, y) = split_embedded_mnist()
    return x[:300], y[:300]


@pytest.fixture(scope="module")
def mlp() -> torch.nn.Module:
    return _train(seed_mlp(hidden=16), steps=60, lr=0.1)


@pytest.fixture(scope="module")
def cnn() -> torch.nn.Module:
    return _train(small_cnn((4, 8)), steps=30, lr=0.05)


def check_campaign(model: torch.nn.Module, data: tuple, trials: list, memory: bf.Memory,
                   store: Path) -> list[float]:
    x, y = data
    ev = TorchEvaluator(model, x, y)
    result = run(ev, trials, memory, store)
    got = {r.trial_key: r.metrics for r in result.records}
    shapes = ev.tensor_shapes()
    accs = []
    for t in trials:
        pred = plain_predictions(model, x, memory, trial_maps(t, memory, shapes))
        assert got[t.key]["correct"] == int(np.sum(pred == y)), t.key
        accs.append(got[t.key]["accuracy"])
    clean = plain_predictions(model, x, memory, {})
    assert result.clean["correct"] == int(np.sum(clean == y))
    return accs


def test_rate_sweep_equals_a_plain_inject_loop(mlp, data, tmp_path: Path) -> None:
    accs = check_campaign(mlp, data, rate_sweep([1e-3, 1e-2, 5e-2], chips=2), INT8,
                          tmp_path / "c.db")
    assert accs[0] > 0.6 and min(accs[-2:]) < accs[0]  # a trained model that faults hurt


def test_layer_and_bit_sweeps_equal_a_plain_loop(mlp, cnn, data, tmp_path: Path) -> None:
    check_campaign(mlp, data, layer_sweep([1e-2], 2, ["fc1.weight", "fc2.weight", "fc3.weight"])
                   + bit_sweep([1e-2], 2, [7, 0]), INT8, tmp_path / "a.db")
    check_campaign(cnn, (data[0][:100], data[1][:100]),
                   layer_sweep([1e-3], 2, ["conv1.weight", "conv2.weight", "fc.weight"]),
                   FIXED, tmp_path / "b.db")


def brute_force(ev: TorchEvaluator, memory: bf.Memory, name: str, element: int,
                bit: int) -> np.ndarray:
    """One fault, injected into the whole tensor with bitfault.torch.inject_tensor; full forward."""
    from torch.func import functional_call

    params = dict(ev.stored(memory))
    shape = tuple(ev.tensor_shapes()[name])
    fmap = bf.FaultMap(shape, np.array([element]), np.array([1 << bit], np.uint32), name)
    params[name] = inject_tensor(ev._clean[name], memory.format, memory.fault, fmap)
    with torch.no_grad():
        logits = functional_call(ev.model, params, (ev.x,)).double()
    return torch.where(torch.isnan(logits), -torch.inf, logits).argmax(1).numpy()


@pytest.mark.parametrize("memory", [FIXED, INT8], ids=["fixed32", "int8"])
def test_single_fault_shortcut_equals_brute_force_for_every_fault(mlp, data, memory) -> None:
    ev = TorchEvaluator(mlp, *data)
    name = "fc2.weight"  # 16 x 16: every element, every bit
    bits = memory.format.bits
    faults = [(name, e, b) for e in range(16 * 16) for b in range(bits)]
    shapes = ev.tensor_shapes()
    maps = [trial_maps(t, memory, shapes) for t in single_faults(faults)]
    fast = ev.predict(maps, memory)
    slow = [brute_force(ev, memory, n, e, b) for n, e, b in faults]
    wrong = [f for f, a, b in zip(faults, fast, slow, strict=True) if not np.array_equal(a, b)]
    assert not wrong, f"{len(wrong)} of {len(faults)} faults differ, e.g. {wrong[:5]}"
    accs = [np.mean(p == data[1]) for p in fast]
    assert min(accs) < max(accs)  # some faults matter (high bits), so the test can fail


def test_single_fault_shortcut_on_conv_and_linear_layers(cnn, data) -> None:
    x, y = data[0][:100], data[1][:100]
    ev = TorchEvaluator(cnn, x, y)
    rng = np.random.default_rng(1)
    faults = [("conv1.weight", e, b) for e in range(36) for b in range(0, 32, 3)]
    for name, size in (("conv2.weight", 8 * 4 * 9), ("fc.weight", 10 * 8 * 49)):
        faults += [(name, int(e), int(b)) for e, b in zip(rng.integers(0, size, 120),
                                                          rng.integers(0, 32, 120), strict=True)]
    shapes = ev.tensor_shapes()
    maps = [trial_maps(t, FIXED, shapes) for t in single_faults(faults)]
    fast = ev.predict(maps, FIXED)
    for f, got in zip(faults, fast, strict=True):
        assert np.array_equal(got, brute_force(ev, FIXED, *f)), f


def test_single_fault_campaign_through_run(mlp, data, tmp_path: Path) -> None:
    trials = single_faults([("fc1.weight", e, b) for e in (0, 407, 12000) for b in (0, 27, 31)])
    check_campaign(mlp, data, trials, FIXED, tmp_path / "s.db")
    shapes = TorchEvaluator(mlp, *data).tensor_shapes()
    sampled = sampled_single_faults(shapes, FIXED.format, size=24, seed=4)  # every tensor
    check_campaign(mlp, data, sampled, FIXED, tmp_path / "sampled.db")


class Branchy(torch.nn.Module):
    """Data-dependent control flow: not traceable, so every trial runs the whole model."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(784, 8), torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        return self.fc2(h) if float(h.sum()) > -1 else -self.fc2(h)


def test_untraceable_model_falls_back_to_full_runs(data, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Branchy().eval()
    ev = TorchEvaluator(model, *data)
    assert ev.graph() is None
    trials = layer_sweep([1e-2], 2, ["fc1.weight"]) + single_faults([("fc2.weight", 3, 30)])
    check_campaign(model, data, trials, FIXED, tmp_path / "u.db")


def test_bad_input_is_refused(mlp, data) -> None:
    x, y = data
    with pytest.raises(ValueError, match="unknown tensor.*'fc9.weight'"):
        TorchEvaluator(mlp, x, y, targets=["fc1.weight", "fc9.weight"])
    with pytest.raises(ValueError, match="same number of examples.*300.*299"):
        TorchEvaluator(mlp, x, y[:-1])
    with pytest.raises(ValueError, match="integer class labels"):
        TorchEvaluator(mlp, x, y.astype(np.float32))
    model = seed_mlp(hidden=4)
    model.register_buffer("steps", torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="'steps'.*floating"):
        TorchEvaluator(model, x, y, targets=["fc1.weight", "steps"])
    with pytest.raises(TypeError, match="torch.nn.Module"):
        TorchEvaluator(lambda t: t, x, y)
    with pytest.raises(ValueError, match="batch_size"):
        TorchEvaluator(mlp, x, y, batch_size=0)
    for bad in (-1, 1.5, "1GB", True):
        with pytest.raises(ValueError, match="max_bytes must be a non-negative integer"):
            TorchEvaluator(mlp, x, y, max_bytes=bad)
    ev = TorchEvaluator(mlp, x, y, targets=["fc1.weight"])
    with pytest.raises(ValueError, match="unknown tensor.*fc2.weight"):
        ev.predict([{"fc2.weight": bf.FaultMap.random((16, 16), INT8.format, ber=0.1,
                                                      name="fc2.weight")}], INT8)


def test_batches_and_evaluator_state_do_not_change_results(mlp, data) -> None:
    x, y = data
    shapes = TorchEvaluator(mlp, x, y).tensor_shapes()
    trials = rate_sweep([1e-2], 2) + layer_sweep([1e-2], 1, ["fc2.weight"])
    maps = [trial_maps(t, INT8, shapes) for t in trials]
    whole = TorchEvaluator(mlp, x, y).predict(maps, INT8)
    slow = TorchEvaluator(mlp, x, y, fast_paths=False).predict(maps, INT8)
    for a, b in zip(whole, slow, strict=True):
        assert np.array_equal(a, b)
    before = {k: v.clone() for k, v in mlp.state_dict().items()}
    TorchEvaluator(mlp, x, y).predict(maps, INT8)
    assert all(torch.equal(before[k], v) for k, v in mlp.state_dict().items())


def test_patched_replica_tracks_what_it_holds(mlp, data) -> None:
    """Formats the compiled pass lacks (Float, FixedPoint "wrap") are patched over the
    replica's stored values, the previous map's elements put back: any order of sparse,
    dense, fault-free, one-tensor and other-format maps, one evaluator, and a pickled copy
    give the plain loop's predictions."""
    import pickle

    x, _ = data
    ev = TorchEvaluator(mlp, x[:100], data[1][:100])
    shapes = ev.tensor_shapes()
    f32 = bf.Memory(bf.Float("float32"), bf.BitFlip())
    f16 = bf.Memory(bf.Float("float16"), bf.StuckAt(1))
    wrap = bf.Memory(bf.FixedPoint(16, 12, overflow="wrap"), bf.BitFlip())
    sequence = [(f32, 1e-3, 0), (f32, 2e-3, 1), (f32, 0.05, 2), (f32, 1e-3, 3), (f32, 0.0, 4),
                (f32, 1e-3, 5), (f16, 1e-3, 6), (f32, 1e-3, 7), (wrap, 1e-2, 8),
                (FIXED, 1e-3, 9), (wrap, 1e-2, 10), (f32, 1e-3, 11)]
    for k, (memory, ber, seed) in enumerate(sequence):
        maps = {n: bf.FaultMap.random(s, memory.format, ber=ber, seed=seed, name=n)
                for n, s in shapes.items()}
        if seed == 5:  # faults in one tensor: the others hold their stored values again
            maps = {"fc2.weight": maps["fc2.weight"]}
        if k == 9:
            ev = pickle.loads(pickle.dumps(ev))  # as Ray ships it
        got, = ev.predict([maps], memory)
        want = plain_predictions(mlp, x[:100], memory, maps)
        assert np.array_equal(got, want), (memory, ber, seed)
    assert any(v is not None for v in ev._patchable.values())  # the patch path ran
