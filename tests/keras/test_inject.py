"""inject(): which layers, which layouts, training loops, and clear errors on bad input."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import bitfault as bf
from bitfault.keras import FaultyLayer, fault_maps, faulty_layers, inject

SPEC = bf.FaultSpec(format=bf.FixedPoint(32, 28, "trunc"), ber=0.02, seed=5,
                    targets=("weights", "biases"))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.int32), b.view(np.int32))


def weights_of(model: keras.Model) -> list[np.ndarray]:
    return [w.copy() for w in model.get_weights()]


@pytest.mark.parametrize(("layer", "input_shape", "torch_shape", "to_torch"), [
    (keras.layers.Dense(4), (None, 3), (4, 3), (1, 0)),
    (keras.layers.Conv1D(4, 3), (None, 9, 2), (4, 2, 3), (2, 1, 0)),
    (keras.layers.Conv2D(4, (3, 2), groups=2), (None, 6, 6, 2), (4, 1, 3, 2), (3, 2, 0, 1)),
    (keras.layers.Conv3D(2, 2), (None, 4, 4, 4, 3), (2, 3, 2, 2, 2), (4, 3, 0, 1, 2)),
    (keras.layers.Embedding(11, 4), (None, 5), (11, 4), (0, 1)),
    (keras.layers.EinsumDense("ab,bc->ac", output_shape=4, bias_axes="c"), (None, 3), (3, 4),
     (0, 1)),
], ids=["dense", "conv1d", "conv2d", "conv3d", "embedding", "einsumdense"])
def test_kernel_maps_are_drawn_in_torch_layout(layer, input_shape, torch_shape, to_torch) -> None:
    spec = SPEC.replace(format=bf.IntQuant(8, per_channel=True))
    wrapper = FaultyLayer(layer, spec, tensor_prefix="m")
    wrapper.build(input_shape)
    kernel = wrapper.layer.weights[0].numpy()
    fmap = wrapper.maps["m.weight"]
    assert fmap.shape == torch_shape
    in_torch = np.ascontiguousarray(np.transpose(kernel, to_torch))
    expected = np.transpose(bf.inject(in_torch, spec.format, spec.fault, fmap),
                            np.argsort(to_torch))
    assert same_bits(wrapper.faulty_weights()["m.weight"], expected)


def test_inject_returns_a_new_model_and_leaves_the_original_alone(mlp, data) -> None:
    x, _ = data
    before = weights_of(mlp)
    clean_out = mlp(x).numpy()
    fmodel = inject(mlp, SPEC)
    assert fmodel is not mlp and not any(isinstance(la, FaultyLayer) for la in mlp.layers)
    assert [la.name for la in fmodel.layers] == ["fc1", "fc2"]
    # weights carried over: the clean variables of the copy are the original's
    assert same_bits(fmodel.get_layer("fc1").layer.kernel.numpy(), before[0])
    assert not np.array_equal(fmodel(x).numpy(), clean_out)
    fmodel.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    fmodel.fit(x, np.zeros(len(x), int), epochs=1, verbose=0)
    assert all(same_bits(a, b) for a, b in zip(weights_of(mlp), before, strict=True))
    assert np.array_equal(mlp(x).numpy(), clean_out)


def test_nested_models_name_tensors_by_dotted_path() -> None:
    block = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, name="inner")],
                             name="block")
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(2, name="head")(block(keras.layers.Dense(6, name="stem")(inputs)))
    model = keras.Model(inputs, outputs)
    fmodel = inject(model, SPEC)
    assert sorted(fault_maps(fmodel)) == ["block.inner.bias", "block.inner.weight", "head.bias",
                                          "head.weight", "stem.bias", "stem.weight"]
    chosen = inject(model, SPEC, filter_fn=lambda layer, path: path.startswith("block."))
    assert [la.tensor_prefix for la in faulty_layers(chosen)] == ["block.inner"]
    globbed = inject(model, SPEC, filter_fn=["st*", "head"])
    assert [la.tensor_prefix for la in faulty_layers(globbed)] == ["stem", "head"]


def test_fit_evaluate_tape_and_jit_compile_all_run(mlp, data) -> None:
    x, y = data
    fmodel = inject(mlp, SPEC)
    for jit in (False, True):
        fmodel.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy",
                       metrics=["accuracy"], jit_compile=jit)
        history = fmodel.fit(x, y, epochs=1, batch_size=20, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
        loss, accuracy = fmodel.evaluate(x, y, verbose=0)
        assert np.isfinite(loss) and 0 <= accuracy <= 1
    optimizer = keras.optimizers.RMSprop(1e-3)

    @tf.function(jit_compile=True)
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                yb, fmodel(xb, training=True), from_logits=True))
        grads = tape.gradient(loss, fmodel.trainable_variables)
        optimizer.apply_gradients(zip(grads, fmodel.trainable_variables, strict=True))
        return loss

    kernel = fmodel.get_layer("fc2").layer.kernel
    before = kernel.numpy().copy()
    losses = [float(step(x, y)) for _ in range(3)]
    assert np.isfinite(losses).all() and not np.array_equal(before, kernel.numpy())


def test_mlp_learns_mnist_subset_through_faults() -> None:
    from bitfault.data import split_embedded_mnist

    (x_train, y_train), (x_test, y_test) = split_embedded_mnist()
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    fmodel = inject(model, SPEC.replace(ber=1e-3))
    fmodel.compile(keras.optimizers.SGD(0.1),
                   keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                   metrics=["accuracy"])
    fmodel.fit(x_train[:2000], y_train[:2000], epochs=3, batch_size=50, verbose=0)
    assert fmodel.evaluate(x_test, y_test, verbose=0)[1] > 0.6  # chance is 0.1


# ---- bad input: clear errors naming the argument, nothing modified -----------------------


def test_filter_matching_nothing_is_an_error(mlp) -> None:
    before = weights_of(mlp)
    with pytest.raises(ValueError, match="filter_fn matched no layer.*fc1"):
        inject(mlp, SPEC, filter_fn=lambda layer, path: False)
    assert all(same_bits(a, b) for a, b in zip(weights_of(mlp), before, strict=True))


def test_filter_choosing_an_unsupported_layer_is_an_error() -> None:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="fc"),
                              keras.layers.UnitNormalization(name="norm")])
    with pytest.raises(TypeError, match="'norm', a UnitNormalization"):
        inject(model, SPEC, filter_fn=lambda layer, path: True)


def test_targets_naming_no_tensor_is_an_error() -> None:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, use_bias=False)])
    with pytest.raises(ValueError, match=r"targets=\['biases'\] name no tensor"):
        inject(model, SPEC.replace(targets="biases"))


def test_per_channel_axis_missing_from_a_tensor_is_an_error(mlp) -> None:
    with pytest.raises(ValueError, match="per_channel axis 1 is out of range.*fc1.bias"):
        inject(mlp, SPEC.replace(format=bf.IntQuant(8, per_channel=1)))


def test_map_of_the_wrong_shape_is_an_error(mlp) -> None:
    bad = bf.FaultMap.from_mask(np.ones((8, 16), np.int32), name="fc1.weight")  # Keras layout
    with pytest.raises(ValueError, match=r"maps\['fc1.weight'\] is for shape \(8, 16\)"):
        inject(mlp, SPEC.replace(maps={"fc1.weight": bad}, ber=None))


def test_map_naming_an_unknown_tensor_is_an_error(mlp) -> None:
    fmap = bf.FaultMap.from_mask(np.ones((16, 8), np.int32), name="fc9.weight")
    with pytest.raises(ValueError, match=r"spec.maps names tensor\(s\) \['fc9.weight'\]"):
        inject(mlp, bf.FaultSpec(maps={"fc9.weight": fmap}))


def test_map_with_bits_beyond_the_format_is_an_error(mlp) -> None:
    fmap = bf.FaultMap.from_mask(np.full((16, 8), 1 << 12, np.int32), name="fc1.weight")
    with pytest.raises(ValueError, match="faults above bit 7"):
        inject(mlp, bf.FaultSpec(format=bf.IntQuant(8), maps={"fc1.weight": fmap}))


@pytest.mark.filterwarnings("ignore:Layer InputLayer does not have a `quantize`:UserWarning")
def test_integer_dtype_variables_are_an_error() -> None:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="q")])
    model.quantize("int8")
    with pytest.raises(TypeError, match="'q.weight'.*dtype int8"):
        inject(model, SPEC)


def test_other_bad_arguments_are_named() -> None:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    with pytest.raises(TypeError, match="model must be a keras.Model"):
        inject("model", SPEC)
    with pytest.raises(TypeError, match="spec must be a bitfault.FaultSpec"):
        inject(model, {"ber": "high"} and 3)
    with pytest.raises(TypeError, match="filter_fn must be a callable"):
        inject(model, SPEC, filter_fn=3)
    with pytest.raises(ValueError, match="already has faults injected"):
        inject(inject(model, SPEC), SPEC)

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.fc = keras.layers.Dense(2)

        def call(self, x):
            return self.fc(x)

    with pytest.raises(TypeError, match="subclassed Sub.*FaultyLayer"):
        inject(Sub(), SPEC)
