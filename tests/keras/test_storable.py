"""inject's model keeps its clean weights storable under Keras's own training loops."""

from __future__ import annotations

import numpy as np
import pytest

import bitfault as bf

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from bitfault.keras import FaultyLayer, inject  # noqa: E402
from bitfault.keras.layers import KeepStorable, keep_storable, storable_range  # noqa: E402
from bitfault.keras.recipes import ClipToRange, ClipWeights  # noqa: E402

X = np.ones((8, 4), np.float32)
Y = np.zeros(8, np.int64)


def push_up(y_true, y_pred):
    """Every kernel element's gradient is -8 (the batch size): SGD moves it up."""
    return -keras.ops.sum(y_pred)


def _model(fmt: bf.Format, start: float, constraint=None) -> keras.Model:
    """Dense(4 -> 3) with every kernel element at ``start`` (a step or two from the top)."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(
        3, name="fc", kernel_initializer=keras.initializers.Constant(start),
        kernel_constraint=constraint)])
    return inject(model, bf.FaultSpec(format=fmt, ber=0.05, seed=1))


def _train(fmodel: keras.Model, how: str, lr: float, steps: int = 3) -> None:
    if how in ("fit", "train_on_batch"):
        fmodel.compile(keras.optimizers.SGD(lr), push_up)
        if how == "fit":
            fmodel.fit(X, Y, batch_size=8, epochs=steps, verbose=0)
        else:
            for _ in range(steps):
                fmodel.train_on_batch(X, Y)
        return
    opt = keras.optimizers.SGD(lr, momentum=0.9)
    variables = fmodel.trainable_variables

    @tf.function
    def step() -> None:
        with tf.GradientTape() as tape:
            loss = push_up(None, fmodel(X, training=True))
        grads = tape.gradient(loss, variables)
        if how == "apply":
            opt.apply(grads, variables)
        else:
            opt.apply_gradients(zip(grads, variables, strict=True))

    for _ in range(steps):
        step()


FORMATS = {  # (format, a start inside the range, a learning rate that leaves it in one step)
    "fixed32": (bf.FixedPoint(32, 28, rounding="trunc"), 7.5, 0.5),
    "fixed8": (bf.FixedPoint(8, 4), 7.0, 0.5),
    "float16": (bf.Float("float16"), 65000.0, 1000.0),
}


@pytest.mark.parametrize("how", ["fit", "train_on_batch", "apply", "apply_gradients"])
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_clean_weight_stays_inside_the_range(name: str, how: str) -> None:
    fmt, start, lr = FORMATS[name]
    fmodel = _model(fmt, start)
    _train(fmodel, how, lr)
    kernel = fmodel.get_layer("fc").layer.kernel.numpy()
    lo, hi = fmt.range
    assert lo <= kernel.min() and kernel.max() <= hi
    assert kernel.max() == np.float32(storable_range(fmt)[1])  # pushed to the top, no further
    assert np.all(fmodel.get_layer("fc").layer.bias.numpy() > 8)  # biases are not faulted


@pytest.mark.parametrize("how", ["fit", "train_on_batch", "apply"])
def test_without_the_constraint_the_same_steps_leave_the_range(how: str) -> None:
    """The setup above does provoke leaving the range: the test can fail."""
    fmt, start, lr = FORMATS["fixed32"]
    fmodel = _model(fmt, start)
    fmodel.get_layer("fc").layer.kernel.constraint = None
    _train(fmodel, how, lr)
    assert fmodel.get_layer("fc").layer.kernel.numpy().max() > fmt.range[1]


def test_fixed_point_32_top_does_not_round_past_the_end_of_the_range() -> None:
    """8 - 2**-28 is 8.0 in float32, which FixedPoint(32, 28, overflow="wrap") stores as -8."""
    fmt = bf.FixedPoint(32, 28, overflow="wrap")
    lo, hi = storable_range(fmt)
    assert lo == -8.0 and hi == float(np.nextafter(np.float32(8), np.float32(0)))
    fmodel = _model(fmt, 7.5)
    _train(fmodel, "train_on_batch", 0.5)
    faulty = fmodel.get_layer("fc").faulty_weights()["fc.weight"]
    clean = fmodel.get_layer("fc").layer.kernel.numpy()
    assert clean.max() == np.float32(hi)
    assert np.sum(faulty < 0) < clean.size // 2  # not wrapped to -8 (a few faults may flip signs)
    assert storable_range(bf.IntQuant(8)) is None


def test_the_users_constraint_runs_first_and_the_config_keeps_it(tmp_path) -> None:
    fmt = bf.FixedPoint(8, 4)
    fmodel = _model(fmt, 7.0, keras.constraints.NonNeg())
    layer = fmodel.get_layer("fc")
    kernel = layer.layer.kernel
    assert isinstance(kernel.constraint, KeepStorable)
    assert isinstance(kernel.constraint.first, keras.constraints.NonNeg)
    assert isinstance(layer.layer.kernel_constraint, keras.constraints.NonNeg)
    assert layer.get_config()["layer"]["config"]["kernel_constraint"]["class_name"] == "NonNeg"
    _train(fmodel, "fit", 0.5)
    assert kernel.numpy().max() == np.float32(fmt.range[1])
    kernel.assign(-np.ones(kernel.shape, np.float32))  # theirs: negative values become 0
    fmodel.optimizer.apply([tf.zeros(kernel.shape)], [kernel])
    assert kernel.numpy().max() == 0 and kernel.numpy().min() == 0
    path = tmp_path / "model.keras"
    fmodel.save(path)
    loaded = keras.models.load_model(path, compile=False)
    again = loaded.get_layer("fc").layer.kernel.constraint
    assert isinstance(again, KeepStorable) and isinstance(again.first, keras.constraints.NonNeg)


def test_clipping_constraints_merge_into_one_clip() -> None:
    fmt = bf.FixedPoint(8, 4)
    narrow = _model(fmt, 0.5, ClipWeights(2.0)).get_layer("fc").layer.kernel.constraint
    assert isinstance(narrow, KeepStorable) and narrow.first is None
    assert (narrow.lo, narrow.hi) == (-2.0, 2.0)
    wide = _model(fmt, 0.5, ClipToRange(-100.0, 100.0)).get_layer("fc").layer.kernel.constraint
    assert wide.first is None and (wide.lo, wide.hi) == fmt.range
    assert keep_storable(wide, (-1.0, 1.0)).hi == 1.0


def test_unbounded_formats_and_non_trainable_variables_get_no_constraint() -> None:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="fc")])
    fmodel = inject(model, bf.FaultSpec(format=bf.IntQuant(8), ber=0.05, seed=1))
    assert fmodel.get_layer("fc").layer.kernel.constraint is None
    layer = FaultyLayer(keras.layers.Dense(3), bf.FaultSpec(format=bf.FixedPoint(8, 4), ber=0.0,
                                                            targets=("weights", "biases")))
    layer.build((None, 4))
    assert all(isinstance(v.constraint, KeepStorable) and v.constraint.first is None
               for v in layer.layer.trainable_variables)
    assert all(v.constraint is None for v in layer.non_trainable_variables)


@pytest.mark.parametrize("jit", [False, True])
def test_checked_pass_zeroes_the_gradient_outside_exactly_as_the_plain_one(jit: bool) -> None:
    """fused_checked's 0/1 masks give +0.0 outside the range even for a NaN or infinite
    upstream gradient, the upstream itself inside, bit for bit the separate zeroing pass."""
    from bitfault.keras.seam import fused, fused_checked, straight_through

    fmt = bf.FixedPoint(8, 4)
    bounds = bf.formats.gradient_bounds(fmt)
    v = tf.constant([[-9.0, -8.0, 0.5], [7.9375, 8.0, 100.0]])
    mask = tf.constant([[0, 1, 0], [0, 0, 4]], tf.int8)
    upstream = tf.constant([[np.nan, -2.0, -3.0], [np.inf, -np.inf, -5.0]])
    grads = []
    for checked in (None, fused_checked(fmt, bf.BitFlip(), (None,), bounds)):
        @tf.function(jit_compile=jit)
        def grad(checked=checked) -> tf.Tensor:
            with tf.GradientTape() as tape:
                tape.watch(v)
                out = straight_through(fused(fmt, bf.BitFlip(), (None,)), [v], [mask], "ste",
                                       bounds, checked)[0]
            return tape.gradient(out, v, output_gradients=upstream)
        grads.append(grad().numpy())
    expected = np.array([[0.0, -2.0, -3.0], [np.inf, 0.0, 0.0]], np.float32)
    for g in grads:
        assert np.array_equal(g.view(np.int32), expected.view(np.int32))
