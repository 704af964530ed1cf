"""Every weight a Keras model computes with is faulted, or listed as left out with why.

The reference is a plain loop: ``bitfault.inject`` (the NumPy core) on each kernel in
PyTorch layout, with the maps ``inject`` drew, written back into a clone's kernels.
The layouts here are written out by hand, apart from the code under test.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import bitfault as bf
from bitfault.keras import fault_maps, faulty_layers, inject, left_out, select_report

INT8 = bf.FaultSpec(format=bf.IntQuant(8, per_channel=True), ber=1e-2, seed=3)


def _t(k: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(k.T)


def _conv(k: np.ndarray) -> np.ndarray:  # (*k, in, out) -> (out, in, *k)
    n = k.ndim - 2
    return np.ascontiguousarray(np.transpose(k, (n + 1, n, *range(n))))


def _conv_back(w: np.ndarray, shape: tuple) -> np.ndarray:
    n = w.ndim - 2
    return np.transpose(w, (*range(2, n + 2), 1, 0))


def _depthwise(k: np.ndarray) -> np.ndarray:  # (kh, kw, cin, m) -> (cin * m, 1, kh, kw)
    kh, kw, cin, m = k.shape
    return np.ascontiguousarray(np.transpose(k, (2, 3, 0, 1))).reshape(cin * m, 1, kh, kw)


def _depthwise_back(w: np.ndarray, shape: tuple) -> np.ndarray:
    kh, kw, cin, m = shape
    return np.transpose(w.reshape(cin, m, kh, kw), (2, 3, 0, 1))


def _heads_in(k: np.ndarray) -> np.ndarray:  # (E, heads, d) -> (heads * d, E)
    e, h, d = k.shape
    return np.ascontiguousarray(np.transpose(k, (1, 2, 0))).reshape(h * d, e)


def _heads_in_back(w: np.ndarray, shape: tuple) -> np.ndarray:
    e, h, d = shape
    return np.transpose(w.reshape(h, d, e), (2, 0, 1))


def _heads_out(k: np.ndarray) -> np.ndarray:  # (heads, d, E) -> (E, heads * d)
    h, d, e = k.shape
    return np.ascontiguousarray(np.transpose(k, (2, 0, 1))).reshape(e, h * d)


def _heads_out_back(w: np.ndarray, shape: tuple) -> np.ndarray:
    h, d, e = shape
    return np.transpose(w.reshape(e, h, d), (1, 2, 0))


def _kernels(layer: keras.layers.Layer) -> list[tuple[str, object, object, object]]:
    """(name after the layer path, variable, to PyTorch, back) of each kernel of ``layer``."""
    same = (lambda k: k, lambda w, s: w)
    t = (_t, lambda w, s: w.T)
    if isinstance(layer, keras.layers.DepthwiseConv2D):
        return [("weight", layer.kernel, _depthwise, _depthwise_back)]
    if isinstance(layer, keras.layers.Conv2D):
        return [("weight", layer.kernel, _conv, _conv_back)]
    if isinstance(layer, keras.layers.Dense):
        return [("weight", layer.kernel, *t)]
    if isinstance(layer, keras.layers.Embedding):
        return [("weight", layer.embeddings, *same)]
    if isinstance(layer, keras.layers.RNN):
        return [("weight_ih_l0", layer.cell.kernel, *t),
                ("weight_hh_l0", layer.cell.recurrent_kernel, *t)]
    if isinstance(layer, keras.layers.MultiHeadAttention):
        return [(f"{q}_proj_weight", d.kernel, _heads_in, _heads_in_back) for q, d in
                (("q", layer.query_dense), ("k", layer.key_dense), ("v", layer.value_dense))
                ] + [("out_proj.weight", layer.output_dense.kernel, _heads_out, _heads_out_back)]
    return []


def reference(model: keras.Model, maps: dict, spec: bf.FaultSpec, x: object) -> np.ndarray:
    """A clone of ``model`` whose kernels hold ``bitfault.inject``'s values, run on ``x``."""
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    written = set()
    for layer in clone.layers:
        for attr, var, to_torch, back in _kernels(layer):
            name = f"{layer.name}.{attr}"
            if name in maps:
                k = var.numpy()
                w = bf.inject(to_torch(k), spec.format, spec.fault, maps[name])
                var.assign(np.ascontiguousarray(back(w, k.shape)))
                written.add(name)
    assert written == set(maps)
    return np.asarray(clone(x))


def count_kernels(model: keras.Model) -> int:
    return sum(v.name in ("kernel", "depthwise_kernel", "pointwise_kernel", "recurrent_kernel",
                          "embeddings") for v in model.weights)


def check_covered(model: keras.Model, spec: bf.FaultSpec, x: object) -> dict:
    fmodel = inject(model, spec)
    maps = fault_maps(fmodel)
    assert len(maps) == count_kernels(model) > 0
    assert sum(m.n_faults for m in maps.values()) > 0
    assert not [t for t in left_out(fmodel) if "kernel" in t.name or "embeddings" in t.name]
    got = np.asarray(fmodel(x))
    want = reference(model, maps, spec, x)
    assert not np.array_equal(got, np.asarray(model(x)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    return maps


@pytest.mark.parametrize("name", ["MobileNetV2", "EfficientNetB0"])
def test_applications_fault_every_kernel_as_the_core_does(name: str) -> None:
    keras.utils.set_random_seed(0)
    kwargs = {"alpha": 0.35} if name == "MobileNetV2" else {}
    model = getattr(keras.applications, name)(weights=None, input_shape=(32, 32, 3),
                                              classes=10, classifier_activation=None, **kwargs)
    x = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype(np.float32)
    maps = check_covered(model, INT8, x)
    depthwise = [la for la in model.layers if isinstance(la, keras.layers.DepthwiseConv2D)]
    assert len(depthwise) in (16, 17)
    cin, m = depthwise[0].kernel.shape[2:]
    assert maps[f"{depthwise[0].name}.weight"].shape == (cin * m, 1, 3, 3)


def test_recurrent_layers_fault_kernel_and_recurrent_kernel() -> None:
    keras.utils.set_random_seed(1)
    inputs = keras.Input((6, 4))
    h = keras.layers.LSTM(5, return_sequences=True, name="lstm")(inputs)
    h = keras.layers.GRU(4, return_sequences=True, name="gru")(h)
    h = keras.layers.SimpleRNN(3, name="rnn")(h)
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(h))
    x = np.random.default_rng(1).normal(size=(3, 6, 4)).astype(np.float32)
    spec = bf.FaultSpec(format=bf.FixedPoint(16, 12), ber=2e-2, seed=4)
    maps = check_covered(model, spec, x)
    assert maps["lstm.weight_ih_l0"].shape == (20, 4)
    assert maps["lstm.weight_hh_l0"].shape == (20, 5)
    assert maps["gru.weight_hh_l0"].shape == (12, 4)
    check_covered(model, INT8, x)


def attention_model() -> keras.Model:
    keras.utils.set_random_seed(2)
    tokens = keras.Input((5,), dtype="int32")
    h = keras.layers.Embedding(11, 8, name="embed")(tokens)
    h = keras.layers.MultiHeadAttention(2, 3, name="attn")(h, h)
    return keras.Model(tokens, keras.layers.Dense(4, name="head")(h))


def test_attention_and_embedding_are_faulted_as_the_core_does() -> None:
    model = attention_model()
    x = np.random.default_rng(2).integers(0, 11, (3, 5)).astype(np.int32)
    maps = check_covered(model, INT8, x)
    assert maps["attn.q_proj_weight"].shape == (6, 8)
    assert maps["attn.out_proj.weight"].shape == (8, 6)
    assert maps["embed.weight"].shape == (11, 8)


def test_training_passes_the_gradient_straight_through_new_kinds() -> None:
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6, 6, 2))
    h = keras.layers.DepthwiseConv2D(3, depth_multiplier=2, name="dw")(inputs)
    h = keras.layers.Reshape((4, 16))(h)
    h = keras.layers.LSTM(3, name="lstm")(h)
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(h))
    spec = bf.FaultSpec(format=bf.FixedPoint(16, 12), ber=2e-2, seed=5)
    fmodel = inject(model, spec)
    x = np.random.default_rng(3).normal(size=(4, 6, 6, 2)).astype(np.float32)
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    maps = fault_maps(fmodel)
    reference(model, maps, spec, x)  # checks the names
    for layer in clone.layers:  # the clone holds the faulty kernels
        for attr, var, to_torch, back in _kernels(layer):
            k = var.numpy()
            w = bf.inject(to_torch(k), spec.format, spec.fault, maps[f"{layer.name}.{attr}"])
            var.assign(np.ascontiguousarray(back(w, k.shape)))

    def grads(m: keras.Model, layer: str) -> list[np.ndarray]:
        la = m.get_layer(layer)
        inner = getattr(la, "layer", la)
        variables = [inner.kernel] if layer == "dw" else [inner.cell.kernel,
                                                          inner.cell.recurrent_kernel]
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(m(x) ** 2)
        return [g.numpy() for g in tape.gradient(loss, variables)]

    for layer in ("dw", "lstm"):
        got, want = grads(fmodel, layer), grads(clone, layer)
        for g, w in zip(got, want, strict=True):
            assert np.abs(g).max() > 0
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)
    fmodel.compile(keras.optimizers.SGD(0.05), "mse")
    before = fmodel.get_layer("dw").layer.kernel.numpy()
    fmodel.fit(x, np.zeros((4, 2), np.float32), epochs=1, verbose=0)
    assert not np.array_equal(fmodel.get_layer("dw").layer.kernel.numpy(), before)


def test_batch_norm_statistics_are_buffers() -> None:
    keras.utils.set_random_seed(4)
    inputs = keras.Input((4,))
    h = keras.layers.BatchNormalization(name="bn")(keras.layers.Dense(6, name="fc")(inputs))
    model = keras.Model(inputs, h)
    bn = model.get_layer("bn")
    bn.moving_mean.assign(np.linspace(-1, 1, 6).astype(np.float32))
    bn.moving_variance.assign(np.linspace(0.5, 2, 6).astype(np.float32))
    spec = bf.FaultSpec(format=bf.FixedPoint(16, 12), ber=0.1, seed=6, targets="buffers")
    fmodel = inject(model, spec)
    maps = fault_maps(fmodel)
    assert sorted(maps) == ["bn.running_mean", "bn.running_var"]
    x = np.random.default_rng(4).normal(size=(5, 4)).astype(np.float32)
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    cbn = clone.get_layer("bn")
    for var, name in ((cbn.moving_mean, "running_mean"), (cbn.moving_variance, "running_var")):
        var.assign(bf.inject(var.numpy(), spec.format, spec.fault, maps[f"bn.{name}"]))
    np.testing.assert_allclose(np.asarray(fmodel(x)), np.asarray(clone(x)), rtol=1e-6)
    assert not np.allclose(np.asarray(fmodel(x)), np.asarray(model(x)))
    # training uses batch statistics and updates the clean moving ones
    inner = fmodel.get_layer("bn").layer
    before = inner.moving_mean.numpy()
    fmodel(x, training=True)
    assert not np.array_equal(inner.moving_mean.numpy(), before)
    reasons = {t.name: t.reason for t in left_out(fmodel)}
    assert "targets.kinds" in reasons["fc.weight"] and "norm's scale" in reasons["bn.weight"]


@keras.saving.register_keras_serializable(package="bitfault_tests")
class Scale(keras.layers.Layer):
    """A custom layer with a weight of its own."""

    def build(self, input_shape: tuple) -> None:
        self.alpha = self.add_weight(name="alpha", shape=(input_shape[-1],), initializer="ones")

    def call(self, x: object) -> object:
        return x * self.alpha


def test_a_layer_of_an_unknown_kind_is_listed_as_left_out_with_the_reason() -> None:
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="fc")(Scale(name="scale")(inputs)))
    fmodel = inject(model, INT8)
    assert list(fault_maps(fmodel)) == ["fc.weight"]
    out = {t.name: t for t in left_out(fmodel)}
    assert out["scale.alpha"].shape == (3,) and "Scale layer" in out["scale.alpha"].reason
    assert "does not fault" in out["scale.alpha"].reason
    assert "kind 'biases' is not targeted" in out["fc.bias"].reason
    slots, report = select_report(model, "weights")
    assert [s.name for s in slots] == ["fc.weight"] and report == left_out(fmodel)
    assert [la.tensor_prefix for la in faulty_layers(fmodel)] == ["fc"]
    with pytest.raises(TypeError, match="Scale"):
        inject(model, INT8, filter_fn=["scale"])


def test_separable_transposed_and_1d_convolutions_are_mapped_in_torch_layout() -> None:
    keras.utils.set_random_seed(5)
    inputs = keras.Input((8, 8, 3))
    h = keras.layers.SeparableConv2D(4, 3, depth_multiplier=2, name="sep")(inputs)
    h = keras.layers.Conv2DTranspose(2, 3, name="up")(h)
    h = keras.layers.Reshape((64, 2))(h)
    h = keras.layers.DepthwiseConv1D(3, name="dw1")(h)
    model = keras.Model(inputs, keras.layers.Conv1D(2, 3, name="c1")(h))
    fmodel = inject(model, INT8)
    shapes = {n: m.shape for n, m in fault_maps(fmodel).items()}
    assert shapes == {"sep.depthwise.weight": (6, 1, 3, 3), "sep.pointwise.weight": (4, 6, 1, 1),
                      "up.weight": (4, 2, 3, 3), "dw1.weight": (2, 1, 3),
                      "c1.weight": (2, 2, 3)}
    sep = fmodel.get_layer("sep")
    faulty = sep.faulty_weights()["sep.depthwise.weight"]
    k = sep.layer.depthwise_kernel.numpy()
    want = _depthwise_back(bf.inject(_depthwise(k), INT8.format, INT8.fault,
                                     sep.maps["sep.depthwise.weight"]), k.shape)
    assert np.array_equal(faulty.view(np.int32), np.ascontiguousarray(want).view(np.int32))


def mixed_model() -> keras.Model:
    keras.utils.set_random_seed(6)
    inputs = keras.Input((6, 6, 2))
    h = keras.layers.DepthwiseConv2D(3, depth_multiplier=2, name="dw")(inputs)
    h = Scale(name="scale")(keras.layers.GlobalAveragePooling2D()(h))
    return keras.Model(inputs, keras.layers.Dense(3, name="fc")(h))


def test_bitfault_inject_faults_depthwise_kernels_and_prints_what_it_left_out(
        tmp_path, capsys) -> None:
    from bitfault.cli import main

    model = mixed_model()
    model.save(tmp_path / "m.keras")
    spec = INT8.replace(ber=5e-2)
    (tmp_path / "spec.json").write_text(__import__("json").dumps(spec.to_dict()))
    code = main(["inject", str(tmp_path / "m.keras"), "--spec", str(tmp_path / "spec.json"),
                 "--output", str(tmp_path / "f.keras")])
    out = capsys.readouterr().out
    assert code == 0
    assert "dw.weight (4, 1, 3, 3)" in out
    assert "left out: 3 tensors" in out and "dw.bias (4,): kind 'biases' is not targeted" in out
    assert "scale.alpha (4,): a variable of a Scale layer" in out
    faulty = keras.saving.load_model(tmp_path / "f.keras")
    k = model.get_layer("dw").kernel.numpy()
    want = _depthwise_back(bf.inject(_depthwise(k), spec.format, spec.fault,
                                     spec.map_for("dw.weight", (4, 1, 3, 3))), k.shape)
    assert np.array_equal(faulty.get_layer("dw").kernel.numpy(), want)


def test_evaluator_faults_depthwise_kernels_as_inject_does() -> None:
    from bitfault.keras import KerasEvaluator

    model = mixed_model()
    x = np.random.default_rng(6).normal(size=(5, 6, 6, 2)).astype(np.float32)
    ev = KerasEvaluator(model, x, np.zeros(5, int))
    assert sorted(ev.tensor_shapes()) == ["dw.weight", "fc.weight"]
    assert {t.name for t in ev.left_out} == {"dw.bias", "scale.alpha", "fc.bias"}
    fmodel = inject(model, INT8.replace(ber=5e-2))
    got = ev.predict([fault_maps(fmodel)], INT8.memory)[0]
    assert np.array_equal(got, np.argmax(np.asarray(fmodel(x)), axis=-1))


def test_a_faulty_attention_model_saves_and_reloads(tmp_path) -> None:
    fmodel = inject(attention_model(), INT8)
    x = np.random.default_rng(7).integers(0, 11, (2, 5)).astype(np.int32)
    fmodel.save(tmp_path / "f.keras")
    again = keras.saving.load_model(tmp_path / "f.keras")
    assert fault_maps(again)["attn.q_proj_weight"] == fault_maps(fmodel)["attn.q_proj_weight"]
    assert np.array_equal(np.asarray(again(x)), np.asarray(fmodel(x)))
