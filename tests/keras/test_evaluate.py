"""KerasEvaluator: a campaign on a Keras model equals injecting each trial's maps with
bitfault.keras.inject and predicting; the caller's model is untouched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import bitfault as bf
from bitfault.campaign import bit_sweep, layer_sweep, rate_sweep, run, trial_maps

keras = pytest.importorskip("keras")
bk = pytest.importorskip("bitfault.keras")
from bitfault.data import split_embedded_mnist  # noqa: E402
from bitfault.keras import KerasEvaluator  # noqa: E402
from bitfault.models.keras import seed_mlp  # noqa: E402


@pytest.fixture(scope="module")
def trained() -> tuple[keras.Model, np.ndarray, np.ndarray]:
    (x, y), (xt, yt) = split_embedded_mnist()
    keras.utils.set_random_seed(0)
    model = seed_mlp(hidden=32, seed=0)
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    model.fit(x, y, epochs=2, batch_size=100, verbose=0)
    return model, xt[:200], yt[:200]


@pytest.mark.parametrize("fmt", [bf.IntQuant(8), bf.IntQuant(6, per_channel=True),
                                 bf.FixedPoint(16, 12)], ids=repr)
def test_campaign_equals_adapter_injection(trained, fmt, tmp_path: Path) -> None:
    model, x, y = trained
    before = [w.copy() for w in model.get_weights()]
    ev = KerasEvaluator(model, x, y)
    assert ev.tensor_shapes() == {"fc1.weight": (32, 784), "fc2.weight": (32, 32),
                                  "fc3.weight": (10, 32)}
    spec = bf.FaultSpec(format=fmt, ber=1e-3)
    trials = (rate_sweep([1e-3, 1e-2], 2) + layer_sweep([1e-1], 1, ["fc2.weight"])
              + bit_sweep([1e-2], 1, [fmt.bits - 1]))
    result = run(ev, trials, spec.memory, tmp_path / "k.db")
    got = {r.trial_key: r.metrics["correct"] for r in result.records}
    for t in trials:
        maps = trial_maps(t, spec.memory, ev.tensor_shapes())
        fmodel = bk.inject(model, spec.replace(maps=maps))
        pred = np.argmax(np.nan_to_num(fmodel.predict(x, verbose=0), nan=-np.inf), axis=1)
        assert got[t.key] == int(np.sum(pred == y)), t.key
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))


def test_bad_input(trained) -> None:
    model, x, y = trained
    with pytest.raises(ValueError, match="same length"):
        KerasEvaluator(model, x, y[:5])
    with pytest.raises(ValueError, match=r"unknown tensor\(s\) \['fc9.weight'\]"):
        KerasEvaluator(model, x, y, targets=["fc9.weight"])
    with pytest.raises(ValueError, match="chose no tensor"):
        KerasEvaluator(model, x, y, filter_fn=lambda layer, path: False)
    for bad in (-1, 1.5, "1GB", True):
        with pytest.raises(ValueError, match="max_bytes must be a non-negative integer"):
            KerasEvaluator(model, x, y, max_bytes=bad)
    ev = KerasEvaluator(model, x, y, targets=["fc1.weight"])
    assert list(ev.tensor_shapes()) == ["fc1.weight"]


def test_reused_and_pickled_evaluator_gives_the_same_predictions(trained) -> None:
    """Cached stored kernels, variables written only when they change, the traced forward
    pass, a different format in between, and a pickled copy (as Ray ships it)."""
    import pickle

    model, x, y = trained
    ev = KerasEvaluator(model, x, y)
    shapes = ev.tensor_shapes()
    fixed = bf.Memory(bf.FixedPoint(32, 28), bf.BitFlip())
    int8 = bf.Memory(bf.IntQuant(8), bf.BitFlip())
    trials = rate_sweep([1e-2], 2) + layer_sweep([1e-2], 1, ["fc3.weight"])
    maps = [trial_maps(t, fixed, shapes) for t in trials]
    first = ev.predict(maps, fixed)
    ev.predict([trial_maps(trials[0], int8, shapes)], int8)
    again = ev.predict(maps[::-1], fixed)[::-1]
    copy = pickle.loads(pickle.dumps(ev))
    shipped = copy.predict(maps, fixed)
    fresh = [KerasEvaluator(model, x, y).predict([m], fixed)[0] for m in maps]
    for a, b, c, d in zip(first, again, shipped, fresh, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c) and np.array_equal(a, d)


@pytest.mark.parametrize("model_kind", ["mlp", "cnn-batchnorm"])
def test_layer_shortcut_and_golden_cache_equal_whole_model_runs(trained, model_kind) -> None:
    """Faults in one kernel run the model from that layer on (cached fault-free inputs);
    fault-free trials reuse the golden run: predictions equal fast_paths=False bit for bit,
    for every target, mixed with rate-sweep and fault-free trials and two formats."""
    from bitfault.models.keras import small_cnn

    model, x, y = trained
    if model_kind != "mlp":
        keras.utils.set_random_seed(1)
        model = small_cnn((4, 8), norm="batch")
        model.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy")
        model.fit(x, y, epochs=1, batch_size=50, verbose=0)
    fast = KerasEvaluator(model, x, y, batch_size=64)
    slow = KerasEvaluator(model, x, y, batch_size=64, fast_paths=False)
    shapes = fast.tensor_shapes()
    for memory in (bf.Memory(bf.FixedPoint(32, 28), bf.BitFlip()),
                   bf.Memory(bf.IntQuant(8), bf.BitFlip())):
        trials = (layer_sweep([1e-2, 5e-2], 2, list(shapes)) + rate_sweep([1e-2], 2)
                  + rate_sweep([0.0], 1))
        maps = [trial_maps(t, memory, shapes) for t in trials]
        for a, b in zip(fast.predict(maps, memory), slow.predict(maps, memory), strict=True):
            assert np.array_equal(a, b)
    assert len(fast._golden._runs) == 2 and any(fast._inputs._values.values())  # the shortcuts ran
    assert fast._tails[list(shapes)[-1]] is not None  # the first layer has nothing before it
    small = KerasEvaluator(model, x, y, batch_size=64, max_bytes=0)
    memory = bf.Memory(bf.FixedPoint(32, 28), bf.BitFlip())
    maps = [trial_maps(t, memory, shapes) for t in layer_sweep([1e-2], 1, list(shapes))]
    assert all(np.array_equal(a, b) for a, b in zip(small.predict(maps, memory),
                                                     slow.predict(maps, memory), strict=True))
    assert not any(small._inputs._values.values())  # over max_bytes: nothing cached


def test_layers_inside_a_nested_model_run_the_whole_model(trained) -> None:
    """A layer inside a nested model does not split the outer graph: those trials fall
    back to whole-model runs, with the same predictions as fast_paths=False."""
    _, x, y = trained
    keras.utils.set_random_seed(3)
    block = keras.Sequential([keras.Input((784,)), keras.layers.Dense(16, activation="relu",
                                                                       name="inner")],
                             name="block")
    inputs = keras.Input((784,))
    outputs = keras.layers.Dense(10, name="head")(block(inputs))
    model = keras.Model(inputs, outputs)
    fast, slow = KerasEvaluator(model, x, y), KerasEvaluator(model, x, y, fast_paths=False)
    shapes = fast.tensor_shapes()
    assert set(shapes) == {"block.inner.weight", "head.weight"}
    memory = bf.Memory(bf.FixedPoint(32, 28), bf.BitFlip())
    maps = [trial_maps(t, memory, shapes) for t in layer_sweep([1e-2], 2, list(shapes))]
    for a, b in zip(fast.predict(maps, memory), slow.predict(maps, memory), strict=True):
        assert np.array_equal(a, b)
    assert fast._tails["block.inner.weight"] is None  # inside the nested model: no split
