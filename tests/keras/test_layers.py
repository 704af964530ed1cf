"""FaultyLayer: the forward uses faulty weights, gradients reach the clean ones, saving works."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import bitfault as bf
from bitfault.keras import FaultyDense, FaultyLayer, fault_maps, inject

SEED_FORMAT = bf.FixedPoint(32, 28, rounding="trunc")


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.int32), b.view(np.int32))


def seed_spec(**changes) -> bf.FaultSpec:
    return bf.FaultSpec(format=SEED_FORMAT, ber=0.02, seed=4).replace(**changes)


def test_forward_uses_the_faulty_kernel_from_a_user_fmap() -> None:
    """The seed's setting: a dense int32 fmap in the kernel's (in, out) layout."""
    rng = np.random.default_rng(0)
    kernel = rng.uniform(-1, 1, (6, 5)).astype(np.float32)
    fmap = rng.integers(-(2**31), 2**31, kernel.shape, dtype=np.int64).astype(np.int32)
    fmap[rng.random(kernel.shape) < 0.6] = 0
    spec = bf.FaultSpec(format=SEED_FORMAT,  # maps are named and laid out as in PyTorch
                        maps={"fc.weight": bf.FaultMap.from_mask(fmap.T, name="fc.weight")})
    layer = FaultyDense(5, spec=spec, use_bias=False, name="fc")
    layer.build((None, 6))
    layer.layer.kernel.assign(kernel)
    out = layer(np.eye(6, dtype=np.float32)).numpy()  # rows of I @ K are the rows of K
    expected = ((np.trunc(kernel.astype(np.float64) * 2**28).astype(np.int32) ^ fmap)
                .astype(np.float32) / np.float32(2**28))
    assert np.array_equal(out, expected)
    assert same_bits(layer.faulty_weights()["fc.weight"], expected)
    assert same_bits(layer.layer.kernel.numpy(), kernel)  # the variable stays clean


@pytest.mark.parametrize("fmt", [SEED_FORMAT, bf.IntQuant(8, per_channel=True),
                                 bf.Float("bfloat16")], ids=repr)
def test_faulty_weights_equal_core_inject_in_torch_layout(fmt) -> None:
    spec = bf.FaultSpec(format=fmt, ber=0.05, seed=9, targets=("weights", "biases"))
    layer = FaultyDense(7, spec=spec, name="fc", bias_initializer="random_normal")
    layer.build((None, 5))
    faulty = layer.faulty_weights()
    kernel, bias = layer.layer.kernel.numpy(), layer.layer.bias.numpy()
    weight_map, bias_map = layer.maps["fc.weight"], layer.maps["fc.bias"]
    assert weight_map.shape == (7, 5) and weight_map.n_faults > 0
    expected = bf.inject(np.ascontiguousarray(kernel.T), fmt, spec.fault, weight_map).T
    assert same_bits(faulty["fc.weight"], expected)
    assert same_bits(faulty["fc.bias"], bf.inject(bias, fmt, spec.fault, bias_map))


def _loss_and_grads(model: keras.Model, x: np.ndarray, y: np.ndarray, variables: list):
    with tf.GradientTape() as tape:
        loss = keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True)
        loss = tf.reduce_mean(loss)
    return loss, tape.gradient(loss, variables)


def test_ste_gradient_of_clean_kernel_equals_gradient_of_faulty_kernel(mlp, data) -> None:
    x, y = data
    fmodel = inject(mlp, seed_spec(targets=("weights", "biases")))
    fc1, fc2 = fmodel.get_layer("fc1"), fmodel.get_layer("fc2")
    variables = [fc1.layer.kernel, fc1.layer.bias, fc2.layer.kernel, fc2.layer.bias]
    _, grads = _loss_and_grads(fmodel, x, y, variables)
    # the clean model holding the faulty values: its gradients are those w.r.t. faulty weights
    faulty = {**fc1.faulty_weights(), **fc2.faulty_weights()}
    names = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
    reference = [mlp.get_layer("fc1").kernel, mlp.get_layer("fc1").bias,
                 mlp.get_layer("fc2").kernel, mlp.get_layer("fc2").bias]
    for variable, name in zip(reference, names, strict=True):
        variable.assign(faulty[name])
    _, expected = _loss_and_grads(mlp, x, y, reference)
    for g, e in zip(grads, expected, strict=True):
        assert g is not None and same_bits(g.numpy(), e.numpy())
    assert float(tf.reduce_max(tf.abs(grads[0]))) > 0


@pytest.mark.filterwarnings("ignore:Gradients do not exist:UserWarning")
def test_blocked_gradient_freezes_kernels_but_biases_train(mlp, data) -> None:
    x, y = data
    fmodel = inject(mlp, seed_spec(gradient="blocked"))
    before = {v.path: v.numpy().copy() for v in fmodel.trainable_variables}
    fmodel.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    fmodel.fit(x, y, epochs=3, batch_size=10, verbose=0)
    for v in fmodel.trainable_variables:
        changed = not np.array_equal(before[v.path], v.numpy())
        assert changed == v.path.endswith("bias"), v.path


def test_ste_training_moves_kernels(mlp, data) -> None:
    x, y = data
    fmodel = inject(mlp, seed_spec())
    kernel = fmodel.get_layer("fc1").layer.kernel
    before = kernel.numpy().copy()
    fmodel.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    fmodel.fit(x, y, epochs=2, batch_size=10, verbose=0)
    assert not np.array_equal(before, kernel.numpy())


def test_keras_file_round_trip_gives_identical_predictions(tmp_path, mlp, data) -> None:
    x, y = data
    spec = bf.FaultSpec(format=bf.IntQuant(8), ber=0.02, seed=3,
                        targets=("weights", "biases", "activations"))
    fmodel = inject(mlp, spec)
    fmodel.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
    fmodel.fit(x, y, epochs=1, batch_size=20, verbose=0)
    path = tmp_path / "faulty.keras"
    fmodel.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.get_layer("fc1"), FaultyLayer)
    assert loaded.get_layer("fc1").spec == spec
    assert np.array_equal(fmodel.predict(x, verbose=0), loaded.predict(x, verbose=0))
    for name, fmap in fault_maps(fmodel).items():
        assert fault_maps(loaded)[name] == fmap


def test_config_carries_spec_prefix_and_step() -> None:
    spec = seed_spec(persistence="transient")
    layer = FaultyDense(3, spec=spec, name="d", tensor_prefix="block.d")
    assert layer.step == 0  # transient maps start at step 0, as in bitfault.torch
    layer.resample(np.int64(4))
    config = layer.get_config()
    assert config["spec"] == spec.to_dict() and config["tensor_prefix"] == "block.d"
    assert config["step"] == 4
    clone = FaultyLayer.from_config(config)
    assert clone.spec == spec and clone.tensor_prefix == "block.d" and clone.name == "d"


def test_activation_faults_hit_the_layer_output() -> None:
    fmt = bf.FixedPoint(16, 8)
    spec = bf.FaultSpec(format=fmt, ber=0.05, seed=2, targets="activations")
    layer = FaultyDense(6, spec=spec, name="fc")
    x = np.random.default_rng(1).normal(size=(4, 5)).astype(np.float32)
    out = layer(x).numpy()
    clean = layer.layer(x).numpy()
    fmap = layer.maps["fc.output"]
    assert fmap.shape == (6,)  # one map per example, shared by every row of the batch
    expected = bf.inject(clean, fmt, spec.fault, bf.FaultMap.from_mask(
        np.broadcast_to(fmap.to_dense(np.uint32), clean.shape)))
    assert same_bits(out, expected)


def test_conv_activation_maps_are_per_example_in_channels_first_layout() -> None:
    fmt = bf.Float("float32")
    spec = bf.FaultSpec(format=fmt, ber=0.01, seed=8, targets="activations")
    layer = FaultyLayer(keras.layers.Conv2D(3, 2, name="conv"), spec)
    x = np.random.default_rng(2).normal(size=(2, 5, 4, 1)).astype(np.float32)
    out, clean = layer(x).numpy(), layer.layer(x).numpy()  # (N, H, W, C)
    fmap = layer.maps["conv.output"]
    assert fmap.shape == (3, 4, 3) and fmap.n_faults > 0  # (C, H, W) of one example
    per_example = np.broadcast_to(fmap.to_dense(np.uint32), (2, 3, 4, 3))
    expected = bf.inject(np.ascontiguousarray(clean.transpose(0, 3, 1, 2)), fmt, spec.fault,
                         bf.FaultMap.from_mask(per_example))
    assert same_bits(out, expected.transpose(0, 2, 3, 1))


def test_mixed_precision_faults_the_float32_kernel_then_casts() -> None:
    layer = FaultyDense(4, spec=seed_spec(ber=0.05), name="fc", use_bias=False,
                        dtype="mixed_float16")
    out = layer(np.eye(3, dtype=np.float32))
    assert out.dtype == tf.float16 and layer.layer.kernel.dtype == "float32"
    faulty = layer.faulty_weights()["fc.weight"]
    assert faulty.dtype == np.float32 and not same_bits(faulty, layer.layer.kernel.numpy())
    assert np.array_equal(out.numpy(), faulty.astype(np.float16))


def test_layer_construction_errors_are_clear() -> None:
    with pytest.raises(TypeError, match="layer must be one of Dense"):
        FaultyLayer(keras.layers.UnitNormalization(), seed_spec())
    with pytest.raises(TypeError, match="spec must be a bitfault.FaultSpec"):
        FaultyLayer(keras.layers.Dense(3), "seed")
    with pytest.raises(ValueError, match="tensor_prefix"):
        FaultyLayer(keras.layers.Dense(3), seed_spec(), tensor_prefix="")
    with pytest.raises(TypeError, match="already a FaultyLayer"):
        FaultyLayer(FaultyDense(3, spec=seed_spec()), seed_spec())


def test_issue_setup_keeps_the_clean_kernels_inside_the_range() -> None:
    """SGD, large lr, FixedPoint(32, 28), a permanent map at ber 2e-3 on the seed MLP: the
    optimizer projects every clean kernel into [-8, 8) after each train_on_batch."""
    from bitfault.models.keras import seed_mlp

    keras.utils.set_random_seed(0)
    fmodel = inject(seed_mlp(hidden=64), bf.FaultSpec(format=bf.FixedPoint(32, 28), ber=2e-3,
                                                      seed=0))
    fmodel.compile(keras.optimizers.SGD(2.0),
                   keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x, y = rng.random((192, 784), np.float32), rng.integers(0, 10, 192)
    kernels = [v for v in fmodel.trainable_variables if v.path.endswith("kernel")]
    lo, hi = -8.0, 8.0 - 2.0**-28
    at_the_ends = 0
    for i in range(12):
        fmodel.train_on_batch(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16])
        for k in kernels:
            w = k.numpy()
            assert lo <= w.min() and w.max() <= hi
            at_the_ends += int(np.sum((w == lo) | (w == np.nextafter(np.float32(8), 0))))
    assert at_the_ends > 0  # the steps did reach the ends


def test_kernels_pushed_out_of_range_stop_at_the_end() -> None:
    fmt = bf.FixedPoint(8, 4)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, use_bias=False,
                                                                    name="fc")])
    fmodel = inject(model, bf.FaultSpec(format=fmt, ber=0.05, seed=1))
    kernel = fmodel.get_layer("fc").layer.kernel
    opt = keras.optimizers.SGD(0.5)
    for _ in range(50):  # the gradient of -4 * sum(kernel) is -4: each step adds 2
        with tf.GradientTape() as tape:
            loss = -4 * tf.reduce_sum(fmodel(np.eye(4, dtype=np.float32)))
        opt.apply_gradients(zip(tape.gradient(loss, [kernel]), [kernel], strict=True))
    _, hi = fmt.range
    assert np.all(kernel.numpy() == hi)
