"""``fit``: train a Keras model for bit-error robustness as a :class:`Recipe` says.

The Keras twin of ``bitfault.torch.train`` (Stutz et al., MLSys 2021): a custom
loop (``tf.GradientTape`` around ``model.stateless_call``) in which the stored tensors
(``stored_weights``: kernels of Dense/Conv/Embedding layers, named as ``inject`` names
them) are replaced by their format-quantised values, straight through to the float
variables; RandBET adds the loss on weights with the bit errors of
``recipe.randbet.spec(format).map_for(name, torch_shape, step=t)``, the maps PyTorch
draws for the same names and step. Biases and norm parameters train in float; batch
statistics follow the clean forward pass only. See docs/recipes.md.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from bitfault.errors import check_int
from bitfault.faults.models import BitFlip
from bitfault.formats import Format
from bitfault.keras.callbacks import faulty_layers, resample
from bitfault.keras.inject import inject
from bitfault.keras.layers import _substituted, storable_range
from bitfault.keras.recipes import (
    _keep_in_range_,
    _leaves,
    _owner,
    _Stored,
    bound_relus_,
    calibrate_relu_thresholds,
    clip_weights_,
    relu_sites,
    stored_weights,
)
from bitfault.keras.seam import check_supported
from bitfault.keras.targets import is_graph_model
from bitfault.recipes import (
    CALIBRATION_SAMPLES,
    OPTIMIZERS,
    EpochRecord,
    Recipe,
    check_fit_settings,
    check_training_loss,
)

# ---- validation -----------------------------------------------------------------------------


def _check_data(model: keras.Model, x: Any, y: Any, xname: str,
                yname: str) -> tuple[np.ndarray, np.ndarray]:
    xa = np.asarray(x)
    if xa.ndim < 1 or len(xa) == 0 or not np.issubdtype(xa.dtype, np.number):
        raise ValueError(f"{xname} must be a non-empty numeric array, got shape {xa.shape}")
    ya = np.asarray(y)
    try:
        classes = int(model.output_shape[-1])
    except (AttributeError, ValueError, RuntimeError):  # a subclassed model: run it once
        classes = int(model(xa[:1].astype(np.float32), training=False).shape[-1])
    if ya.shape != (len(xa),) or not np.issubdtype(ya.dtype, np.integer) \
            or ya.min() < 0 or ya.max() >= classes:
        raise ValueError(f"{yname} must be {len(xa)} integer class labels in [0, {classes - 1}] "
                         f"(one per row of {xname}; the model has {classes} outputs)")
    return xa.astype(np.float32, copy=False), ya.astype(np.int32)


def _check(model: Any, recipe: Any, *, fault_aware_ok: bool = True) -> Recipe:
    """The recipe, once it and the model are known to fit each other (nothing changed)."""
    if isinstance(recipe, Mapping):
        recipe = Recipe.from_dict(recipe)
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a bitfault.recipes.Recipe, got {type(recipe).__name__}")
    if not isinstance(model, keras.Model) or not model.built:
        raise TypeError(f"model must be a built keras.Model, got {type(model).__name__}")
    if faulty_layers(model):
        raise ValueError("model already has faults injected (it has FaultyLayers); train the "
                         "clean model (recipe.fault_aware injects faults itself)")
    if recipe.fault_aware is not None:
        if not fault_aware_ok:
            raise ValueError("recipe: randbet_step runs format/randbet recipes; fault_aware "
                             "recipes train through inject (use fit)")
        check_supported(recipe.fault_aware.format, recipe.fault_aware.fault)
        if not is_graph_model(model):
            raise TypeError("recipe.fault_aware trains through bitfault.keras.inject, which "
                            f"needs a Sequential or Functional model, got {type(model).__name__}")
    elif recipe.format is not None:
        _Stored(model, recipe.format, recipe.randbet.fault if recipe.randbet else BitFlip())
    if recipe.activation_clip is not None and not relu_sites(model):
        raise ValueError("recipe.activation_clip: the model has no keras.layers.ReLU, "
                         "Activation('relu') or layer with activation='relu' to bound")
    return recipe


# ---- one step -------------------------------------------------------------------------------


def _loss(y: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=y, logits=tf.cast(logits, tf.float32)))


class _Trainer:
    """One compiled training step of ``model`` under ``recipe`` (faults injected already
    for fault_aware recipes)."""

    def __init__(self, model: keras.Model, recipe: Recipe, optimizer: Any,
                 weight_decay: float = 0.0) -> None:
        self.model, self.recipe, self.optimizer = model, recipe, optimizer
        self.weight_decay = weight_decay
        self.stored = None
        if recipe.format is not None and recipe.fault_aware is None:
            fault = recipe.randbet.fault if recipe.randbet else BitFlip()
            self.stored = _Stored(model, recipe.format, fault)
        pos = {id(v): ("t", i) for i, v in enumerate(model.trainable_variables)}
        pos.update({id(v): ("n", i) for i, v in enumerate(model.non_trainable_variables)})
        self.where = [pos[id(s.variable)] for s in self.stored.slots] if self.stored else []
        self.keep = [i for i in range(len(model.non_trainable_variables))
                     if ("n", i) not in self.where]  # state the clean pass writes back
        if not optimizer.built:
            optimizer.build(model.trainable_variables)

        def step_fn(*args: Any) -> Any:  # a function of its own: TF counts traces per function
            return self._step(*args)

        self.step_fn = tf.function(step_fn, reduce_retracing=True)

    def _forward(self, x: tf.Tensor, masks: list[tf.Tensor]) -> tuple[Any, list[Any], list[Any]]:
        lists = {"t": [v.value for v in self.model.trainable_variables],
                 "n": [v.value for v in self.model.non_trainable_variables]}
        if self.stored is not None:
            clean = [lists[k][i] for k, i in self.where]
            for (k, i), v in zip(self.where, self.stored.values(masks, clean), strict=True):
                lists[k][i] = v
        return self.model.stateless_call(lists["t"], lists["n"], x, training=True,
                                         return_losses=True)

    def _step(self, x: tf.Tensor, y: tf.Tensor, masks: list[tf.Tensor], mode: str) -> Any:
        """mode: "clean" (no perturbed term), "on", or "auto" (on if the clean loss is below
        ``start_below``)."""
        variables = self.model.trainable_variables
        rb = self.recipe.randbet
        zeros = self.stored.zeros if self.stored is not None else []
        with tf.GradientTape(persistent=mode != "clean") as tape:
            logits, state, losses = self._forward(x, zeros)
            clean = _loss(y, logits)
            total = clean + tf.add_n([tf.cast(v, tf.float32) for v in losses]) if losses \
                else clean
            if mode != "clean":
                pert = _loss(y, self._forward(x, masks)[0])
        grads = tape.gradient(total, variables)
        on, pert_value = tf.constant(False), tf.constant(math.nan)
        if mode != "clean":
            on = tf.constant(True) if mode == "on" else clean < rb.start_below
            pert_value = tf.where(on, pert, math.nan)
            for j, g in enumerate(tape.gradient(pert, variables)):
                if g is None:
                    continue
                if rb.grad_clamp is not None:
                    g = tf.clip_by_value(g, -rb.grad_clamp, rb.grad_clamp)
                g = tf.where(on, g, tf.zeros_like(g))
                grads[j] = g if grads[j] is None else grads[j] + g
            del tape
        if self.weight_decay:  # L2 on every parameter, as PyTorch's optimizers do
            grads = [g if g is None else g + self.weight_decay * tf.cast(v.value, g.dtype)
                     for g, v in zip(grads, variables, strict=True)]
        self.optimizer.apply(grads, variables)
        targets = self.model.non_trainable_variables
        for i in self.keep:
            targets[i].assign(state[i])
        hits = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), y),
                                     tf.int32))
        return clean, pert_value, on, hits

    def step(self, x: np.ndarray, y: np.ndarray, step: int,
             perturb: bool | None) -> tuple[float, float, int]:
        """(clean loss, perturbed loss or NaN, correct predictions); ``perturb`` as in
        ``randbet_step``."""
        rb = self.recipe.randbet
        spec = self.recipe.fault_aware
        if spec is not None and spec.persistence == "transient":
            resample(self.model, step)
        if rb is None or perturb is False:
            mode, masks = "clean", []
        else:
            mode = "on" if perturb or rb.start_below is None else "auto"
            rspec = rb.spec(self.recipe.format)
            masks = self.stored.masks({s.name: rspec.map_for(s.name, s.torch_shape, step)
                                       for s in self.stored.slots})
        c, p, _, k = self.step_fn(tf.constant(x), tf.constant(y), masks, mode)
        return float(c), float(p), int(k)


def _optimizer(name: str, lr: float) -> keras.optimizers.Optimizer:
    if name == "sgd":
        return keras.optimizers.SGD(lr, momentum=0.9)
    return keras.optimizers.Adam(lr, epsilon=1e-8)  # PyTorch's epsilon


def randbet_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, x: Any, y: Any,
                 recipe: Recipe, step: int, perturb: bool | None = None) -> tuple[float, float]:
    """One training step of ``recipe`` on the batch ``(x, y)``: the loss on the clean
    quantised weights plus, with ``recipe.randbet``, the loss on weights with step
    ``step``'s random bit errors.

    The update is ``optimizer.apply(g_clean + clamp(g_perturbed))``, both straight
    through to the float variables. ``perturb``: True/False forces the perturbed term
    on/off; None turns it on unless ``start_below`` is set and this step's clean loss is
    not below it. Returns (clean loss, perturbed loss or NaN when off). ``fit`` runs
    exactly this step; repeated calls with one optimizer reuse one compiled step.
    """
    recipe = _check(model, recipe, fault_aware_ok=False)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"optimizer must be a keras optimizer, got {type(optimizer).__name__}")
    xa, ya = _check_data(model, x, y, "x", "y")
    step = check_int(step, "step", 0)
    if perturb not in (None, True, False):
        raise ValueError(f"perturb must be None, True or False, got {perturb!r}")
    cached = getattr(optimizer, "_bitfault_trainer", None)
    if cached is not None and cached[0]() is model and cached[1] == recipe:
        trainer = cached[2]
    else:
        trainer = _Trainer(model, recipe, optimizer)
        object.__setattr__(optimizer, "_bitfault_trainer", (weakref.ref(model), recipe, trainer))
    clean, pert, _ = trainer.step(xa, ya, step, perturb)
    return clean, pert


def evaluate(model: keras.Model, x: Any, y: Any, recipe_or_format: Recipe | Format | None = None,
             batch_size: int = 1000) -> float:
    """Accuracy of ``model`` on ``(x, y)`` in inference mode; with a recipe (its
    ``stored_format``) or a format, through the clean quantised weights. Without one,
    the model runs as it is (an injected model through its faults)."""
    fmt = recipe_or_format.stored_format if isinstance(recipe_or_format, Recipe) \
        else recipe_or_format
    if fmt is not None and not isinstance(fmt, Format):
        raise TypeError(f"recipe_or_format must be a Recipe, a format or None, got "
                        f"{recipe_or_format!r}")
    if not isinstance(model, keras.Model) or not model.built:
        raise TypeError(f"model must be a built keras.Model, got {type(model).__name__}")
    xa, ya = _check_data(model, x, y, "x", "y")
    batch_size = check_int(batch_size, "batch_size", 1)
    pairs: list[tuple[Any, Any]] = []
    if fmt is not None:
        if faulty_layers(model):
            raise ValueError("evaluate(recipe_or_format=...) quantises a clean model; this one "
                             "has FaultyLayers (evaluate it with None)")
        stored = _Stored(model, fmt, BitFlip())
        pairs = list(zip([s.variable for s in stored.slots], stored.values(stored.zeros),
                         strict=True))
    hits = 0
    with _substituted(pairs):  # eager, one call per batch: nothing traced per evaluate
        for i in range(0, len(xa), batch_size):
            logits = model(tf.constant(xa[i:i + batch_size]), training=False)
            hits += int(np.sum(np.argmax(np.asarray(logits), -1) == ya[i:i + batch_size]))
    return hits / len(xa)


def fit(model: keras.Model, x: Any, y: Any, recipe: Recipe, *, epochs: int,
        batch_size: int = 100, lr: float = 0.05, optimizer: str = "sgd",
        weight_decay: float = 0.0, seed: int = 0, x_val: Any = None, y_val: Any = None,
        progress: Callable[[int, int], Any] | None = None,
        on_step: Callable[[int, float], Any] | None = None) -> list[EpochRecord]:
    """Train ``model`` (logits out, integer labels) in place as ``recipe`` says; one
    :class:`EpochRecord` per epoch (``epoch`` counts from 1).

    Mini-batches are shuffled by ``np.random.default_rng(seed)``; ``optimizer``: "sgd"
    (momentum 0.9) or "adam"; ``weight_decay``: L2 added to every gradient (PyTorch's
    convention). A float ``activation_clip`` bounds the ReLUs in place before training;
    ``"calibrate"`` bounds them after the first epoch at the ``activation_quantile`` of
    their outputs on the first 1,000 training samples (quantised forward), later epochs
    train bounded. ``progress(epoch, epochs)`` is called after each epoch, ``on_step(steps,
    loss)`` after each mini-batch (steps so far, the epoch's running mean loss). Afterwards
    ``model`` holds the trained float weights (clipped) and its own constraints again.
    """
    recipe = _check(model, recipe)
    xa, ya = _check_data(model, x, y, "x", "y")
    epochs, batch_size, lr, weight_decay, seed = check_fit_settings(
        epochs, batch_size, lr, optimizer, weight_decay, seed, progress)
    if on_step is not None and not callable(on_step):
        raise TypeError(f"on_step must be a callable (steps, loss) or None, got {on_step!r}")
    if (x_val is None) != (y_val is None):
        raise ValueError("give both x_val and y_val, or neither")
    val = None if x_val is None else _check_data(model, x_val, y_val, "x_val", "y_val")
    # ---- from here on the model changes ----
    if isinstance(recipe.activation_clip, float):
        bound_relus_(model, recipe.activation_clip)
    owners = _owner(model)  # the constraints clip_weights_ replaces, restored at the end
    saved = [(v, v.constraint, *owners[id(v)], getattr(owners[id(v)][0], owners[id(v)][1], None))
             for v in stored_weights(model).values()]
    if recipe.weight_clip is not None:
        clip_weights_(model, recipe.weight_clip)
    bounds = None if recipe.stored_format is None else storable_range(recipe.stored_format)
    if bounds is not None:  # the clean weights stay storable (zero gradient is not enough:
        _keep_in_range_(model, *bounds)  # one step, or momentum, carries a weight past the end)
    trained = model if recipe.fault_aware is None else inject(model, recipe.fault_aware)
    trainer = _Trainer(trained, recipe, _optimizer(optimizer, lr), weight_decay)
    rng = np.random.default_rng(seed)
    history: list[EpochRecord] = []
    step, started = 0, False
    try:
        for epoch in range(1, epochs + 1):
            start = time.perf_counter()
            sums = np.zeros(5)  # samples, clean, perturbed, perturbed samples, correct
            order = rng.permutation(len(xa))
            for i in range(0, len(xa), batch_size):
                idx = order[i:i + batch_size]
                clean, pert, hits = trainer.step(xa[idx], ya[idx], step,
                                                 True if started else None)
                check_training_loss(clean, pert, epoch, step)
                on = not math.isnan(pert)
                started = started or on
                n = len(idx)
                sums += (n, clean * n, pert * n if on else 0.0, n if on else 0, hits)
                step += 1
                if on_step is not None:
                    on_step(step, float((sums[1] + sums[2]) / sums[0]))
            if trained is not model:  # the injected twin's trained weights, back home
                for (layer, _), (twin, _) in zip(_leaves(model), _leaves(trained), strict=True):
                    for v, w in zip(layer.weights, twin.weights, strict=True):
                        v.assign(w.value)
            if recipe.activation_clip == "calibrate" and epoch == 1:
                _calibrate(model, trained, xa[:CALIBRATION_SAMPLES], recipe)
            history.append(EpochRecord(
                epoch=epoch, loss=float((sums[1] + sums[2]) / sums[0]),
                clean_loss=float(sums[1] / sums[0]),
                perturbed_loss=float(sums[2] / sums[3]) if sums[3] else math.nan,
                train_accuracy=float(sums[4] / sums[0]),
                val_accuracy=math.nan if val is None else evaluate(model, *val, recipe),
                seconds=time.perf_counter() - start))
            if progress is not None:
                progress(epoch, epochs)
    finally:
        for variable, constraint, layer, attr, layer_constraint in saved:
            variable.constraint = constraint
            setattr(layer, attr, layer_constraint)
    return history


def _calibrate(model: keras.Model, trained: keras.Model, x: np.ndarray, recipe: Recipe) -> None:
    """Bound ``model``'s ReLUs (and those of ``trained``, its injected twin) at the
    calibrated thresholds of the clean quantised forward."""
    pairs: list[tuple[Any, Any]] = []
    if recipe.stored_format is not None:
        stored = _Stored(model, recipe.stored_format, BitFlip())
        pairs = list(zip([s.variable for s in stored.slots], stored.values(stored.zeros),
                         strict=True))
    with _substituted(pairs):
        thresholds = calibrate_relu_thresholds(model, x, recipe.activation_quantile)
    bound_relus_(model, thresholds)
    if trained is not model:
        bound_relus_(trained, thresholds)


__all__ = ["CALIBRATION_SAMPLES", "OPTIMIZERS", "evaluate", "fit", "randbet_step"]
