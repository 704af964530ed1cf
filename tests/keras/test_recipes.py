"""Recipe building blocks in Keras: clipping, bounded ReLUs, quantised and RandBET weights."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import bitfault as bf
from bitfault.keras import (
    BoundedReLU,
    bound_relus,
    calibrate_relu_thresholds,
    clip_weights_,
    evaluate,
    inject,
    quantised_weights,
    randbet_step,
    relu_bounds,
    stored_weights,
)
from bitfault.recipes import RandBET, Recipe

FORMATS = [bf.FixedPoint(32, 28, rounding="trunc"), bf.IntQuant(8),
           bf.IntQuant(8, per_channel=True), bf.Float("bfloat16"), bf.FixedPoint(8, 5)]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.int32), b.view(np.int32))


def kernels(model: keras.Model) -> dict[str, np.ndarray]:
    return {v.path: v.numpy().copy() for v in model.trainable_variables}  # with the biases


def core_faulty(kernel: np.ndarray, fmt: bf.Format, fault: bf.FaultModel,
                fmap: bf.FaultMap) -> np.ndarray:
    """A Dense kernel (in, out) through the core, in PyTorch layout (out, in) and back."""
    return bf.inject(kernel.T.copy(), fmt, fault, fmap).T


# ---- weight clipping --------------------------------------------------------------------


def test_clip_weights_projects_now_and_after_every_keras_step(mlp, data) -> None:
    x, y = data
    mlp.get_layer("fc1").kernel.assign(np.full((8, 16), 0.5, np.float32))
    mlp.get_layer("fc1").bias.assign(np.full(16, 0.5, np.float32))
    assert clip_weights_(mlp, 0.05) == ["fc1.weight", "fc2.weight"]
    assert all(np.abs(w.numpy()).max() <= 0.05 for w in stored_weights(mlp).values())
    assert mlp.get_layer("fc1").bias.numpy().max() == 0.5  # biases are not stored tensors
    seen = []

    class Check(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(max(np.abs(v.numpy()).max() for v in stored_weights(mlp).values()))

    mlp.compile(keras.optimizers.SGD(5.0), keras.losses.SparseCategoricalCrossentropy(True))
    mlp.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[Check()])
    assert len(seen) == 10 and max(seen) <= 0.05 and min(seen) > 0.049  # pushed to the bound
    # the constraint is in the layer config: clones and injected models keep it
    fmodel = inject(mlp, bf.FaultSpec(format=bf.IntQuant(8), ber=0.01))
    assert fmodel.get_layer("fc1").layer.kernel.constraint.w_max == 0.05
    clip_weights_(mlp, None)
    assert mlp.get_layer("fc1").kernel.constraint is None


def test_clipping_holds_after_every_randbet_step(mlp, data) -> None:
    x, y = data
    recipe = Recipe.randbet_clipped(w_max=0.08, p_train=0.05, seed=1)
    clip_weights_(mlp, recipe.weight_clip)
    opt = keras.optimizers.SGD(2.0, momentum=0.9)
    for t in range(4):
        randbet_step(mlp, opt, x, y, recipe, t)
        assert max(np.abs(w.numpy()).max() for w in stored_weights(mlp).values()) <= 0.08


@pytest.mark.parametrize("w_max", [0, -1.0, float("inf"), float("nan"), "0.1", True])
def test_clip_weights_bad_w_max(mlp, w_max) -> None:
    before = kernels(mlp)
    with pytest.raises((TypeError, ValueError), match="w_max"):
        clip_weights_(mlp, w_max)
    assert all(np.array_equal(before[k], v) for k, v in kernels(mlp).items())
    assert mlp.get_layer("fc1").kernel.constraint is None


# ---- quantised and RandBET weights --------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_quantised_forward_is_bit_exact_with_the_core(fmt) -> None:
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((6, 6, 2)),
                              keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
                              keras.layers.Flatten(), keras.layers.Dense(5, name="fc")])
    used = {k: v.numpy() for k, v in quantised_weights(model, fmt).items()}
    assert list(used) == ["conv.weight", "fc.weight"] == list(stored_weights(model))
    conv = model.get_layer("conv").kernel.numpy()  # (kh, kw, in, out) -> (out, in, kh, kw)
    empty = bf.FaultMap.empty((4, 2, 3, 3), "conv.weight")
    ref = bf.inject(conv.transpose(3, 2, 0, 1).copy(), fmt, bf.BitFlip(), empty)
    assert same_bits(used["conv.weight"], ref.transpose(2, 3, 1, 0))
    fc = model.get_layer("fc").kernel.numpy()
    assert same_bits(used["fc.weight"], core_faulty(fc, fmt, bf.BitFlip(),
                                                    bf.FaultMap.empty((5, 64))))
    # evaluate(format=...) runs exactly those weights
    x = np.random.default_rng(0).normal(size=(50, 6, 6, 2)).astype(np.float32)
    twin = keras.models.clone_model(model)
    twin.set_weights(model.get_weights())
    twin.get_layer("conv").kernel.assign(used["conv.weight"])
    twin.get_layer("fc").kernel.assign(used["fc.weight"])
    y = np.argmax(twin(x).numpy(), -1)
    assert evaluate(model, x, y, fmt) == 1.0
    y[:10] = (y[:10] + 1) % 5
    assert evaluate(model, x, y, Recipe(format=fmt), batch_size=7) == 0.8


def test_faulty_weights_are_bit_exact_with_the_core(mlp) -> None:
    fmt = bf.IntQuant(8)
    kernel = mlp.get_layer("fc1").kernel.numpy()
    spec = RandBET(p_train=0.05, seed=9, fault=bf.StuckAt(1)).spec(fmt)
    for t in (0, 1):
        fmap = bf.FaultMap.random((16, 8), fmt, ber=0.05, seed=9, name="fc1.weight", step=t)
        assert fmap == spec.map_for("fc1.weight", (16, 8), step=t)
        used = quantised_weights(mlp, fmt, {"fc1.weight": fmap}, bf.StuckAt(1))
        assert same_bits(used["fc1.weight"], core_faulty(kernel, fmt, bf.StuckAt(1), fmap))
        clean = core_faulty(mlp.get_layer("fc2").kernel.numpy(), fmt, bf.StuckAt(1),
                            bf.FaultMap.empty((3, 16)))
        assert same_bits(used["fc2.weight"], clean)  # no map: quantised only


def _reference_grads(model: keras.Model, weights: dict[str, np.ndarray], x: np.ndarray,
                     y: np.ndarray) -> tuple[float, list[np.ndarray]]:
    """Loss and gradients of a plain float forward with ``weights`` put into the kernels."""
    (w1, b1), (w2, b2) = (model.get_layer(n).get_weights() for n in ("fc1", "fc2"))
    params = [tf.Variable(weights["fc1.weight"]), tf.Variable(b1),
              tf.Variable(weights["fc2.weight"]), tf.Variable(b2)]
    with tf.GradientTape() as tape:
        logits = tf.nn.relu(x @ params[0] + params[1]) @ params[2] + params[3]
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    return float(loss), [g.numpy() for g in tape.gradient(loss, params)]


@pytest.mark.parametrize(("clamp", "step"), [(None, 0), (None, 1), (0.01, 3)])
def test_randbet_loss_and_gradient_are_the_sum_of_two_ste_terms(mlp, data, clamp, step) -> None:
    """The perturbed term uses the core's map of this step (a new pattern every step)."""
    x, y = data
    fmt = bf.FixedPoint(8, 5)
    recipe = Recipe(format=fmt, randbet=RandBET(p_train=0.1, seed=4, grad_clamp=clamp))
    before = [v.numpy().copy() for v in mlp.trainable_variables]  # k1, b1, k2, b2
    maps = {n: bf.FaultMap.random(s, fmt, ber=0.1, seed=4, name=n, step=step)
            for n, s in (("fc1.weight", (16, 8)), ("fc2.weight", (3, 16)))}
    quantised = {n: core_faulty(before[i], fmt, bf.BitFlip(), bf.FaultMap.empty(maps[n].shape))
                 for i, n in ((0, "fc1.weight"), (2, "fc2.weight"))}
    faulty = {n: core_faulty(before[i], fmt, bf.BitFlip(), maps[n])
              for i, n in ((0, "fc1.weight"), (2, "fc2.weight"))}
    clean_ref, g_clean = _reference_grads(mlp, quantised, x, y)
    pert_ref, g_pert = _reference_grads(mlp, faulty, x, y)
    if clamp is not None:
        assert max(np.abs(g).max() for g in g_pert) > 2 * clamp  # the clamp really acts
        g_pert = [np.clip(g, -clamp, clamp) for g in g_pert]
    clean, pert = randbet_step(mlp, keras.optimizers.SGD(1.0), x, y, recipe, step)
    assert clean == pytest.approx(clean_ref, rel=1e-5) and pert == pytest.approx(pert_ref, rel=1e-5)
    assert pert > clean
    for b, a, gc, gp in zip(before, mlp.trainable_variables, g_clean, g_pert, strict=True):
        np.testing.assert_allclose(b - a.numpy(), gc + gp, rtol=1e-4, atol=1e-6)


def test_randbet_step_without_the_perturbed_term(mlp, data) -> None:
    x, y = data
    recipe = Recipe(format=bf.IntQuant(8), randbet=RandBET(p_train=0.1))
    before = [v.numpy().copy() for v in mlp.trainable_variables]
    q = {k: v.numpy() for k, v in quantised_weights(mlp, recipe.format).items()}
    clean_ref, g = _reference_grads(mlp, q, x, y)
    clean, pert = randbet_step(mlp, keras.optimizers.SGD(1.0), x, y, recipe, 0, perturb=False)
    assert np.isnan(pert) and clean == pytest.approx(clean_ref, rel=1e-5)
    for b, a, gc in zip(before, mlp.trainable_variables, g, strict=True):
        np.testing.assert_allclose(b - a.numpy(), gc, rtol=1e-4, atol=1e-6)


def test_randbet_step_bad_input(mlp, data) -> None:
    x, y = data
    opt = keras.optimizers.SGD(1.0)
    fat = Recipe(format=None, fault_aware=bf.FaultSpec(format=bf.IntQuant(8), ber=0.01))
    with pytest.raises(ValueError, match="fault_aware"):
        randbet_step(mlp, opt, x, y, fat, 0)
    recipe = Recipe(format=bf.IntQuant(8), randbet=RandBET())
    with pytest.raises(ValueError, match="step"):
        randbet_step(mlp, opt, x, y, recipe, -1)
    with pytest.raises(ValueError, match="y must be 40"):
        randbet_step(mlp, opt, x, y[:-1], recipe, 0)
    with pytest.raises(ValueError, match=r"y must be 40 integer class labels in \[0, 2\]"):
        randbet_step(mlp, opt, x, y + 1, recipe, 0)
    with pytest.raises(ValueError, match="perturb"):
        randbet_step(mlp, opt, x, y, recipe, 0, perturb="yes")
    with pytest.raises(TypeError, match="optimizer"):
        randbet_step(mlp, "sgd", x, y, recipe, 0)
    with pytest.raises(TypeError, match="format"):
        quantised_weights(mlp, "int8")
    fmt = bf.IntQuant(8)
    with pytest.raises(ValueError, match=r"maps names \['fc9.weight'\].*'fc1.weight'"):
        quantised_weights(mlp, fmt, {"fc9.weight": bf.FaultMap.empty((3, 16))})
    with pytest.raises(ValueError, match=r"maps\['fc1.weight'\].*shape \(8, 16\).*\(16, 8\)"):
        quantised_weights(mlp, fmt, {"fc1.weight": bf.FaultMap.empty((8, 16))})  # Keras layout
    assert not opt.built


# ---- bounded ReLUs -----------------------------------------------------------------------


def relu_zoo() -> keras.Model:
    """ReLUs in all three forms: fused (fc1), a ReLU layer (r2), an Activation layer (a3)."""
    keras.utils.set_random_seed(5)
    x = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu", name="fc1")(x)
    h = keras.layers.ReLU(name="r2")(keras.layers.Dense(16, name="fc2")(h))
    h = keras.layers.Activation("relu", name="a3")(keras.layers.Dense(16, name="fc3")(h))
    return keras.Model(x, keras.layers.Dense(3, name="out")(h))


def site_outputs(model: keras.Model, x: np.ndarray) -> dict[str, np.ndarray]:
    names = ("fc1", "r2", "a3")
    probe = keras.Model(model.input, [model.get_layer(n).output for n in names])
    return dict(zip(names, (np.asarray(o) for o in probe(x)), strict=True))


def test_bound_relus_caps_every_form_and_leaves_the_original(data, tmp_path) -> None:
    x = data[0] * 3
    model = relu_zoo()
    raw = site_outputs(model, x)
    assert all(v.max() > 0.5 for v in raw.values())
    assert relu_bounds(model) == {"fc1": None, "r2": None, "a3": None}
    capped = bound_relus(model, {"fc1": 0.3, "r2": 0.2, "a3": 0.1})
    assert relu_bounds(capped) == {"fc1": 0.3, "r2": 0.2, "a3": 0.1}
    assert relu_bounds(model) == {"fc1": None, "r2": None, "a3": None}
    assert np.array_equal(site_outputs(model, x)["fc1"], raw["fc1"])
    fc1 = site_outputs(capped, x)["fc1"]
    np.testing.assert_array_equal(fc1, np.minimum(raw["fc1"], np.float32(0.3)))
    outs = site_outputs(capped, x)
    for name, cap in (("r2", 0.2), ("a3", 0.1)):
        assert outs[name].max() == np.float32(cap) and outs[name].min() == 0
    once = bound_relus(model, 0.25)
    assert set(relu_bounds(once).values()) == {0.25}
    path = tmp_path / "capped.keras"
    capped.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.get_layer("fc1").activation, BoundedReLU)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), capped.predict(x, verbose=0))


def test_calibrated_thresholds_are_the_quantiles(data) -> None:
    x = data[0]
    model = relu_zoo()
    raw = site_outputs(model, x)
    for q in (0.5, 0.999, 1.0):
        got = calibrate_relu_thresholds(model, x, quantile=q, batch_size=16)
        assert list(got) == ["fc1", "r2", "a3"]
        for name, value in got.items():
            assert value == pytest.approx(float(np.quantile(raw[name], q)), rel=1e-6)
    assert model.get_layer("fc1").call.__func__ is keras.layers.Dense.call  # unpatched again


def test_bound_relus_bad_input(mlp, data) -> None:
    with pytest.raises(ValueError, match=r"thresholds names \['nope'\].*\['fc1'\]"):
        bound_relus(mlp, {"nope": 1.0})
    with pytest.raises(ValueError, match="thresholds"):
        bound_relus(mlp, -1.0)
    with pytest.raises(ValueError, match=r"thresholds\['fc1'\]"):
        bound_relus(mlp, {"fc1": float("inf")})
    plain = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match="no ReLU"):
        bound_relus(plain, 1.0)
    with pytest.raises(ValueError, match="quantile"):
        calibrate_relu_thresholds(mlp, data[0], quantile=0.0)
    assert relu_bounds(mlp) == {"fc1": None}


# ---- the same faults in both frameworks ---------------------------------------------------


def test_randbet_weights_match_pytorch_for_the_same_seed(mlp) -> None:
    torch = pytest.importorskip("torch")
    try:
        from bitfault.torch import inject_tensor as torch_inject
    except ImportError as exc:  # pragma: no cover - depends on the tree
        pytest.skip(f"bitfault.torch is not importable ({exc})")
    for fmt in (bf.IntQuant(8), bf.FixedPoint(16, 12)):
        recipe = Recipe(format=fmt, randbet=RandBET(p_train=0.02, seed=11))
        spec = recipe.randbet.spec(fmt)
        for t in (0, 5):
            maps = {n: spec.map_for(n, tuple(v.shape[::-1]), step=t)
                    for n, v in stored_weights(mlp).items()}
            used = quantised_weights(mlp, fmt, maps, spec.fault)
            for name in ("fc1", "fc2"):
                weight = torch.from_numpy(mlp.get_layer(name).kernel.numpy().T.copy())
                fmap = bf.FaultMap.random(tuple(weight.shape), fmt, ber=0.02, seed=11,
                                          name=f"{name}.weight", step=t)
                assert fmap.n_faults > 0
                expected = torch_inject(weight, fmt, spec.fault, fmap).numpy()
                assert same_bits(used[f"{name}.weight"].numpy().T, expected)
