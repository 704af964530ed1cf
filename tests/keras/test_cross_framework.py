"""One seed and spec, two frameworks: Keras and PyTorch use bit-identical faulty tensors."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import bitfault as bf
from bitfault.keras import fault_maps, faulty_layers, inject

torch = pytest.importorskip("torch")
try:
    from bitfault.torch import inject_
except ImportError as exc:  # pragma: no cover - depends on the tree
    pytest.skip(f"bitfault.torch is not importable yet ({exc})", allow_module_level=True)

SPECS = [
    bf.FaultSpec(format=bf.FixedPoint(32, 28, "trunc"), ber=0.01, seed=3,
                 targets=("weights", "biases")),
    bf.FaultSpec(format=bf.IntQuant(8, per_channel=True), ber=0.02, seed=4,
                 targets=("weights", "biases"), fault=bf.StuckAt(1)),
    bf.FaultSpec(format=bf.Float("bfloat16"), count=5, seed=5, targets=("weights", "biases")),
    bf.FaultSpec(format=bf.FixedPoint(16, 10), ber=0.02, seed=6, persistence="transient",
                 targets=("weights", "biases", "activations")),
]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.int32), b.view(np.int32))


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3)
        self.fc1 = torch.nn.Linear(4 * 4 * 4, 16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x):
        h = torch.relu(self.conv(x)).flatten(1)
        return self.fc2(torch.relu(self.fc1(h)))


def keras_twin(net: TorchNet) -> keras.Model:
    """The same network in Keras (channels last), holding the same weights."""
    model = keras.Sequential([
        keras.Input((6, 6, 2)),
        keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
        keras.layers.Permute((3, 1, 2)),  # flatten in PyTorch's (C, H, W) order
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu", name="fc1"),
        keras.layers.Dense(3, name="fc2")])
    for name in ("conv", "fc1", "fc2"):
        module = getattr(net, name)
        weight = module.weight.detach().numpy()
        kernel = weight.transpose(2, 3, 1, 0) if weight.ndim == 4 else weight.T
        model.get_layer(name).set_weights([kernel, module.bias.detach().numpy()])
    return model


def torch_faulty_tensors(net: TorchNet, x: np.ndarray) -> dict[str, np.ndarray]:
    """What each module's forward used as weight and bias (read inside the forward)."""
    seen: dict[str, np.ndarray] = {}
    hooks = []
    for name in ("conv", "fc1", "fc2"):
        def grab(module, args, name=name):
            seen[f"{name}.weight"] = module.weight.detach().numpy().copy()
            seen[f"{name}.bias"] = module.bias.detach().numpy().copy()
        hooks.append(getattr(net, name).register_forward_pre_hook(grab))
    with torch.no_grad():
        net(torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))))
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.format!r}-{s.persistence}")
def test_keras_and_torch_fault_the_same_bits(spec: bf.FaultSpec) -> None:
    torch.manual_seed(0)
    net = TorchNet()
    model = keras_twin(net)
    x = np.random.default_rng(0).normal(size=(5, 6, 6, 2)).astype(np.float32)
    handle = inject_(net, spec)
    fmodel = inject(model, spec)
    if spec.persistence == "transient":
        handle.resample(3)
        for layer in faulty_layers(fmodel):
            layer.resample(3)
    used_by_torch = torch_faulty_tensors(net, x)  # registered after inject_: sees its tensors
    fmodel(x)
    keras_maps, torch_maps = fault_maps(fmodel), handle.maps
    assert sorted(keras_maps) == sorted(torch_maps)
    for name, fmap in torch_maps.items():
        assert keras_maps[name] == fmap, name
    assert sum(m.n_faults for m in keras_maps.values()) > 0
    for layer in faulty_layers(fmodel):
        for name, keras_value in layer.faulty_weights().items():
            expected = used_by_torch[name]
            in_torch_layout = (keras_value.transpose(3, 2, 0, 1) if keras_value.ndim == 4
                               else keras_value.T)
            assert same_bits(in_torch_layout, expected), name
    handle.remove()


SATURATING = [bf.FixedPoint(8, 4), bf.FixedPoint(32, 28), bf.FixedPoint(8, 4, overflow="wrap"),
              bf.Float("float16"), bf.Float("bfloat16"), bf.IntQuant(8)]


@pytest.mark.parametrize("fmt", SATURATING, ids=repr)
def test_ste_gradient_masks_are_identical_in_keras_and_torch(fmt) -> None:
    """Zero where a clean weight lies outside the format's range, the upstream gradient
    (exact here: small integers) elsewhere, the same elements in both frameworks."""
    rng = np.random.default_rng(0)
    bounds = bf.formats.gradient_bounds(fmt)
    scale = 1.0 if bounds is None else min(bounds[1] * 1.5, float(np.finfo(np.float32).max))
    weight = (rng.uniform(-1, 1, (5, 6)) * scale).astype(np.float32)
    bias = (rng.uniform(-1, 1, 5) * scale).astype(np.float32)
    weight.flat[:2] = bias[:2] = [-scale, scale]  # beyond both ends (bfloat16: float32's)
    x = rng.integers(-3, 4, (4, 6)).astype(np.float32)
    g = rng.integers(-3, 4, (4, 5)).astype(np.float32)
    spec = bf.FaultSpec(format=fmt, ber=0.05, seed=0, targets=("weights", "biases"))

    net = torch.nn.Linear(6, 5)
    with torch.no_grad():
        net.weight.copy_(torch.from_numpy(weight))
        net.bias.copy_(torch.from_numpy(bias))
    inject_(net, spec, project=False)  # keep the weights outside, to see the zeros
    net(torch.from_numpy(x)).backward(torch.from_numpy(g))

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, name="fc")])
    model.get_layer("fc").set_weights([weight.T, bias])
    fmodel = inject(model, spec)
    layer = fmodel.get_layer("fc").layer
    with tf.GradientTape() as tape:
        out = tf.reduce_sum(fmodel(x) * g)
    kernel_grad, bias_grad = tape.gradient(out, [layer.kernel, layer.bias])

    for clean, torch_grad, keras_grad, upstream in (
            (weight, net.weight.grad.numpy(), kernel_grad.numpy().T, g.T @ x),
            (bias, net.bias.grad.numpy(), bias_grad.numpy(), g.sum(0))):
        inside = (np.ones(clean.shape, bool) if bounds is None
                  else (clean >= bounds[0]) & (clean <= bounds[1]))
        assert bounds is None or not inside.all()
        expected = np.where(inside, upstream, np.float32(0))
        assert same_bits(torch_grad, expected) and same_bits(keras_grad, expected)
