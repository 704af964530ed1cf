"""Block formats in training and campaigns: ``fit`` through MXFP4 / Q4 (quantisation-aware
and fault-aware, the straight-through gradient everywhere) on real MNIST digits, and
``TorchEvaluator`` trials equal to ``NumpyEvaluator`` (the NumPy core) on plane maps."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from training_helpers import mnist_digits, one_thread  # noqa: E402, F401 (autouse fixture)

import bitfault as bf  # noqa: E402
from bitfault.campaign import NumpyEvaluator, rate_sweep, run, trial_maps  # noqa: E402
from bitfault.formats import GGUF, MX, NVFP4, GroupwiseInt  # noqa: E402
from bitfault.models.torch import SeedMLP  # noqa: E402
from bitfault.recipes import RandBET, Recipe  # noqa: E402
from bitfault.torch import TorchEvaluator, fit, inject_tensor  # noqa: E402

MXFP4 = MX("float4_e2m1fn")


@pytest.fixture(scope="module")
def mnist():
    return mnist_digits(400, 4)


@pytest.mark.parametrize("recipe", [
    Recipe(format=MXFP4),
    # a flipped high E8M0 bit scales a block by 2**+-64 or makes it NaN (0xFF): the loss
    # diverges at once, so the training faults hit the codes and the scales' low bits
    Recipe(format=None, fault_aware=bf.FaultSpec(
        format=MXFP4, ber={"codes": 1e-3, "scale": 1e-2}, seed=0, persistence="transient",
        fault=bf.BitFlip(bits=["codes", "scale.0", "scale.1"]))),
    Recipe(format=GGUF("q4_1"), randbet=RandBET(p_train=1e-2, fault=bf.BitFlip(bits="codes"))),
], ids=["qat-mxfp4", "fault-aware-mxfp4", "randbet-q4_1"])
def test_fit_through_block_formats_lowers_the_loss(mnist, recipe):
    model = SeedMLP(hidden=32, seed=0)
    before = model.fc1.weight.detach().clone()
    history = fit(model, mnist[0], mnist[1], recipe, epochs=3, batch_size=50, lr=0.05,
                  x_val=mnist[2], y_val=mnist[3])
    assert history[-1].clean_loss < 0.8 * history[0].clean_loss
    assert history[-1].val_accuracy > 0.5
    assert not torch.equal(model.fc1.weight, before)  # the gradient reached the clean weights


def test_the_gradient_passes_straight_through_every_block_format():
    for fmt in (MXFP4, NVFP4(), GGUF("q4_0"), GroupwiseInt(4, 32)):
        model = SeedMLP(hidden=8, seed=0)
        spec = bf.FaultSpec(format=fmt, ber={"codes": 0.01, "scale": 0.01}, seed=0)
        with bf.torch.inject_(model, spec) as handle:
            assert handle.maps["fc1.weight"].planes["scale"].n_faults
            model.fc1(torch.ones(3, 784)).sum().backward()  # d/dW of sum(W x): 3 everywhere
        assert torch.equal(model.fc1.weight.grad, torch.full((8, 784), 3.0))
        assert bf.formats.gradient_bounds(fmt) is None


def _numpy_evaluator(model, x, y, memory):
    names = [n for n, _ in model.named_parameters() if n.endswith("weight")]
    params = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}

    def forward(p, xb):
        with torch.no_grad():
            out = torch.func.functional_call(model, {k: torch.from_numpy(v) for k, v in
                                                     p.items()}, (torch.from_numpy(xb),))
        return out.numpy()

    return NumpyEvaluator(forward, params, x, y, names), names


@pytest.mark.parametrize("memory", [bf.Memory(MXFP4, bf.BitFlip()),
                                    bf.Memory(NVFP4(), bf.StuckAt(1)),
                                    bf.Memory(GGUF("q4_0"), bf.BitFlip(bits="scale")),
                                    bf.Memory(GroupwiseInt(4, 32, False), bf.StuckAt(0))],
                         ids=["mxfp4", "nvfp4", "q4_0-scales", "groupwise"])
def test_evaluator_trials_equal_the_numpy_core(mnist, memory, tmp_path):
    model = SeedMLP(hidden=16, seed=1).eval()
    x, y = mnist[2], mnist[3]
    ev = TorchEvaluator(model, x, y)
    ref, names = _numpy_evaluator(model, x, y, memory)
    shapes = ev.tensor_shapes()
    fmt = memory.format
    trials = []
    for seed in range(2):
        for ber in (0.002, {"scale": 0.01}, {"codes": 1e-3, "scale": 1e-3}):
            trials.append({n: bf.FaultMap.random(shapes[n], fmt, ber=ber, seed=seed, name=n)
                           for n in names})
    one = {n: bf.FaultMap.empty(shapes[n], n) for n in names}
    fc1 = shapes["fc1.weight"]
    scale_shape = fmt.plane_shapes(fc1)["scale"]
    trials.append({**one, "fc1.weight": bf.FaultMap(fc1, [5], [1], "fc1.weight")})  # single
    trials.append({**one, "fc1.weight": bf.FaultMap(  # one scale word only
        fc1, [], np.zeros(0, np.uint32), "fc1.weight",
        planes={"scale": bf.FaultMap(scale_shape, [3], [0x40], "fc1.weight:scale")})})
    trials.append({**one, "fc1.weight": bf.FaultMap(  # one code and one scale word
        fc1, [40], [2], "fc1.weight",
        planes={"scale": bf.FaultMap(scale_shape, [0], [0x8], "fc1.weight:scale")})})
    got, want = ev.predict(trials, memory), ref.predict(trials, memory)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert np.array_equal(g, w), k
    assert not all(np.array_equal(g, got[0]) for g in got)  # the faults change predictions
    sweep = rate_sweep([1e-3, 1e-2], chips=2)
    result = run(ev, sweep, memory, tmp_path / "store.sqlite")
    correct = {r.trial_key: r.metrics["correct"] for r in result.records}
    for t in sweep:
        pred = ref.predict([trial_maps(t, memory, shapes)], memory)[0]
        assert correct[t.key] == int(np.sum(pred == y)), t.key


def test_evaluator_stored_tensors_are_the_cores(mnist):
    model = SeedMLP(hidden=16, seed=1)
    memory = bf.Memory(NVFP4(), bf.BitFlip())
    ev = TorchEvaluator(model, mnist[2], mnist[3])
    for name, t in ev.stored(memory).items():
        clean = dict(model.named_parameters())[name].detach()
        want = bf.inject(clean.numpy(), memory.format, memory.fault,
                         bf.FaultMap.empty(tuple(clean.shape)))
        assert torch.equal(t.view(torch.int32), torch.from_numpy(want).view(torch.int32))
        assert torch.equal(t, inject_tensor(clean, memory.format, memory.fault,
                                            bf.FaultMap.empty(tuple(clean.shape))))
