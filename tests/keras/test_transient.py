"""Transient faults: a fresh map per batch, replayed exactly from (seed, name, step)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import bitfault as bf
from bitfault.keras import ResampleFaults, fault_maps, inject, resample

TRANSIENT = bf.FaultSpec(format=bf.FixedPoint(16, 12), ber=0.01, seed=2,
                         persistence="transient")


def train(mlp: keras.Model, data, spec: bf.FaultSpec, epochs: int = 2) -> list[np.ndarray]:
    x, y = data
    keras.utils.set_random_seed(0)
    fmodel = inject(mlp, spec)
    fmodel.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy")
    fmodel.fit(x, y, epochs=epochs, batch_size=10, shuffle=False, verbose=0,
               callbacks=[ResampleFaults()])
    return fmodel, [w.copy() for w in fmodel.get_weights()]


def test_same_seed_replays_exactly_and_another_seed_differs(mlp, data) -> None:
    first, weights_a = train(mlp, data, TRANSIENT)
    _, weights_b = train(mlp, data, TRANSIENT)
    _, weights_c = train(mlp, data, TRANSIENT.replace(seed=3))
    assert all(np.array_equal(a, b) for a, b in zip(weights_a, weights_b, strict=True))
    assert not all(np.array_equal(a, c) for a, c in zip(weights_a, weights_c, strict=True))
    # after 8 steps the maps are those of the last step, drawn from (seed, name, step)
    layer = first.get_layer("fc1")
    assert layer.step == 7
    expected = TRANSIENT.map_for("fc1.weight", (16, 8), step=7)
    assert layer.maps["fc1.weight"] == expected
    mask = np.transpose(expected.to_dense(np.int16))
    assert np.array_equal(layer.get_weights()[0], mask)


def test_maps_change_every_step_and_permanent_maps_cannot(mlp) -> None:
    fmodel = inject(mlp, TRANSIENT)
    at_zero = fault_maps(fmodel)["fc2.weight"]
    resample(fmodel, 1)
    at_one = fault_maps(fmodel)["fc2.weight"]
    assert at_zero != at_one and at_zero.meta["step"] == 0 and at_one.meta["step"] == 1
    resample(fmodel, 0)
    assert fault_maps(fmodel)["fc2.weight"] == at_zero
    permanent = inject(mlp, TRANSIENT.replace(persistence="permanent"))
    with pytest.raises(ValueError, match="needs FaultyLayers with a transient spec"):
        resample(permanent, 5)
    with pytest.raises(ValueError, match="persistence='transient'"):
        permanent.get_layer("fc1").resample(5)


def test_forward_resampling_counts_every_batch(mlp, data) -> None:
    x, _ = data
    fmodel = inject(mlp, TRANSIENT.replace(resample="forward"))
    callback = ResampleFaults(first_step=10)
    fmodel.predict(x, batch_size=10, verbose=0, callbacks=[callback])
    assert fmodel.get_layer("fc1").step == 13 and callback.forward_step == 14
    with pytest.raises(ValueError, match="first_step"):
        ResampleFaults(first_step=-1)


def test_fit_of_an_injected_model_resamples_without_the_callback(mlp, data) -> None:
    """inject's model adds ResampleFaults itself: the same run as with the callback given."""
    x, y = data
    with_callback, weights = train(mlp, data, TRANSIENT)
    keras.utils.set_random_seed(0)
    fmodel = inject(mlp, TRANSIENT)
    fmodel.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy")
    fmodel.fit(x, y, epochs=2, batch_size=10, shuffle=False, verbose=0)
    assert fmodel.get_layer("fc1").step == 7
    assert all(np.array_equal(a, b) for a, b in zip(weights, fmodel.get_weights(), strict=True))
    fmodel.fit(x, y, epochs=1, batch_size=10, shuffle=False, verbose=0,
               callbacks=keras.callbacks.CallbackList([], model=fmodel))
    assert fmodel.get_layer("fc1").step == 11  # a second fit carries on (optimizer steps)


def test_forward_resampling_of_an_injected_model_counts_across_calls(mlp, data) -> None:
    x, _ = data
    fmodel = inject(mlp, TRANSIENT.replace(resample="forward"))
    fmodel.predict(x, batch_size=10, verbose=0)
    fmodel.predict(x, batch_size=10, verbose=0)
    assert fmodel.get_layer("fc1").step == 7


def test_training_a_transient_layer_that_nothing_resamples_warns(data) -> None:
    x, y = data
    from bitfault.keras import FaultyDense

    def model() -> keras.Model:
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((8,)), FaultyDense(3, spec=TRANSIENT, name="fc")])
        m.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy")
        return m

    with pytest.warns(UserWarning, match=r"ResampleFaults\(\)"):
        model().fit(x, y, epochs=1, batch_size=10, verbose=0)
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*nothing resamples")
        model().fit(x, y, epochs=1, batch_size=10, verbose=0, callbacks=[ResampleFaults()])
        model().predict(x, verbose=0)  # inference at step 0 is not a mistake


@pytest.mark.parametrize("functional", [False, True])
def test_an_injected_transient_model_keeps_its_layers_and_reloads(mlp, data, tmp_path,
                                                                  functional) -> None:
    """inject's transient model is the clone's graph (same layers, config and outputs) and
    comes back from a .keras file still resampling by itself."""
    x, _ = data
    if functional:
        inputs = keras.Input((8,))
        mlp = keras.Model(inputs, mlp.get_layer("fc2")(mlp.get_layer("fc1")(inputs)), name="f")
    fmodel = inject(mlp, TRANSIENT.replace(resample="forward"))
    permanent = inject(mlp, TRANSIENT.replace(persistence="permanent"))
    assert [la.name for la in fmodel.layers] == [la.name for la in permanent.layers]
    got, want = fmodel.get_config(), permanent.get_config()
    assert [la["class_name"] for la in got["layers"]] == [la["class_name"] for la in want["layers"]]
    assert got["layers"][0] == want["layers"][0]  # the input layer, name and all
    assert isinstance(fmodel, keras.Sequential) != functional
    fmodel.save(tmp_path / "t.keras")
    again = keras.saving.load_model(tmp_path / "t.keras")
    assert np.array_equal(np.asarray(again(x)), np.asarray(fmodel(x)))
    again.predict(x, batch_size=10, verbose=0)
    assert again.get_layer("fc1").step == 3
