"""The building blocks of the training recipes in Keras: weight clipping and bounded ReLUs.

The *stored tensors* (``stored_weights``) are the kernels (embeddings) of every Dense,
EinsumDense, Conv1D/2D/3D and Embedding layer, named as ``inject`` names them
(``"fc1.weight"``). Weight clipping is framework-native: ``clip_weights_`` gives each a
:class:`ClipWeights` constraint, which the Keras optimizer applies after every update
(``BaseOptimizer.apply``), and projects the weights once right away. The constraint
is part of the layer's config, so it survives ``clone_model``, ``inject`` and saving.

A *ReLU site* is a layer whose output goes through a ReLU: a ``keras.layers.ReLU``
layer, an ``Activation("relu")`` layer, or a layer with a fused ``activation="relu"``
(``Dense``, ``Conv2D``, ...). Sites are named by their layer path (dotted through
nested models), which is what threshold dicts are keyed by.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from bitfault.errors import check_positive
from bitfault.faults.models import BitFlip, FaultModel
from bitfault.formats import Format, gradient_bounds
from bitfault.keras.layouts import SUPPORTED_LAYERS, Slot, dense_masks, plan_slots
from bitfault.keras.seam import channel_axis, check_supported, fused, straight_through
from bitfault.keras.targets import sublayers
from bitfault.maps import FaultMap
from bitfault.memory.memory import Memory
from bitfault.recipes import thresholds_from_activations

_STORED = ("kernel", "embeddings")


def _check_model(model: Any) -> None:
    if not isinstance(model, keras.Model):
        raise TypeError(f"model must be a keras.Model, got {type(model).__name__}")


def _leaves(model: keras.Model, prefix: str = "") -> Iterator[tuple[keras.layers.Layer, str]]:
    """Every layer below ``model`` that has no sub-layers, with its dotted path.

    Wrappers (e.g. ``FaultyLayer``) keep their own name: the inner layer gets the
    wrapper's path, as tensor names do.
    """
    for layer in sublayers(model):
        if isinstance(layer, keras.layers.InputLayer):
            continue
        path = f"{prefix}{layer.name}"
        if isinstance(layer, keras.layers.Wrapper):
            yield layer.layer, path
        elif isinstance(layer, keras.Model) or sublayers(layer):
            yield from _leaves(layer, f"{path}.")
        else:
            yield layer, path


# ---- stored tensors and weight clipping ----------------------------------------------------


def stored_weights(model: keras.Model) -> dict[str, Any]:
    """The tensors the recipes quantise, fault and clip, by tensor name (``"fc1.weight"``):
    the kernel (embeddings) of every Dense, EinsumDense, Conv1D/2D/3D and Embedding layer,
    exactly what ``inject(model, FaultSpec(...))`` faults by default. Biases and
    normalisation parameters are not stored tensors."""
    _check_model(model)
    found: dict[str, Any] = {}
    for layer, path in _leaves(model):
        if isinstance(layer, SUPPORTED_LAYERS) and layer.built:
            variable = next((v for v in layer.weights if v.name in _STORED), None)
            if variable is not None:
                found[f"{path}.weight"] = variable
    return found


def _owner(model: keras.Model) -> dict[int, tuple[keras.layers.Layer, str]]:
    """id(stored variable) -> (layer, constraint attribute) for clip_weights_."""
    owners = {}
    for layer, _ in _leaves(model):
        if isinstance(layer, SUPPORTED_LAYERS) and layer.built:
            for v in layer.weights:
                if v.name in _STORED:
                    owners[id(v)] = (layer, f"{v.name}_constraint")
    return owners


class _Stored:
    """The stored tensors of a model in one format: slots, fused transform, masks."""

    def __init__(self, model: keras.Model, fmt: Format, fault: FaultModel) -> None:
        check_supported(fmt, fault)
        self.memory = Memory(fmt, fault)
        self.slots: list[Slot] = [
            s for layer, path in _leaves(model) if isinstance(layer, SUPPORTED_LAYERS)
            and layer.built for s in plan_slots(layer, path, ("weights",), fmt, None)]
        if not self.slots:
            raise ValueError("a recipe format needs a model with a built Dense, EinsumDense, "
                             "Conv1D/2D/3D or Embedding layer; this model has none")
        axes = tuple(channel_axis(s, fmt) for s in self.slots)
        self.fused = fused(fmt, fault, axes)
        self.zeros = [self._tensors(dense_masks(s, FaultMap.empty(s.torch_shape), self.memory))
                      for s in self.slots]

    @staticmethod
    def _tensors(masks: tuple[np.ndarray, ...]) -> Any:
        """One slot's dense masks as the fault function takes them (block formats: a tuple,
        one per plane)."""
        out = tuple(tf.constant(m) for m in masks)
        return out[0] if len(out) == 1 else out

    def masks(self, maps: Mapping[str, FaultMap] | None) -> list[Any]:
        """Dense masks (Keras layout) of ``maps`` by tensor name (PyTorch layout)."""
        from bitfault.memory.memory import check_map_fits

        maps = dict(maps or {})
        unknown = sorted(set(maps) - {s.name for s in self.slots})
        if unknown:
            raise ValueError(f"maps names {unknown}, which are not stored tensors of the model; "
                             f"they are {[s.name for s in self.slots]}")
        out = []
        for slot, zero in zip(self.slots, self.zeros, strict=True):
            fmap = maps.get(slot.name)
            if fmap is None:
                out.append(zero)
                continue
            check_map_fits(fmap, slot.torch_shape, self.memory.format, f"maps[{slot.name!r}]")
            out.append(self._tensors(dense_masks(slot, fmap, self.memory)))
        return out

    def values(self, masks: list[Any], clean: list[Any] | None = None) -> list[tf.Tensor]:
        if clean is None:
            clean = [tf.convert_to_tensor(s.variable.value) for s in self.slots]
        return straight_through(self.fused, clean, masks, "ste",
                                gradient_bounds(self.memory.format))


def quantised_weights(model: keras.Model, format: Format,
                      maps: Mapping[str, FaultMap] | None = None,
                      fault: FaultModel | None = None) -> dict[str, tf.Tensor]:
    """The weights a recipe's forward pass uses: each of ``stored_weights(model)`` encoded
    in ``format``, faulted by ``fault`` (bit flips) at ``maps[name]`` (PyTorch layout;
    none by default), decoded; Keras layout. Bit for bit ``bitfault.inject``; under a
    ``tf.GradientTape`` the gradient passes straight through to the float variables."""
    if not isinstance(format, Format):
        raise TypeError(f"format must be FixedPoint, IntQuant or Float, got {format!r}")
    stored = _Stored(model, format, fault or BitFlip())
    return dict(zip([s.name for s in stored.slots], stored.values(stored.masks(maps)),
                    strict=True))


@keras.saving.register_keras_serializable(package="bitfault")
class ClipWeights(keras.constraints.Constraint):
    """Project a weight to ``[-w_max, w_max]`` (applied by the optimizer after each step)."""

    def __init__(self, w_max: float) -> None:
        self.w_max = check_positive(w_max, "w_max")

    def __call__(self, w: Any) -> Any:
        return keras.ops.clip(w, -self.w_max, self.w_max)

    def get_config(self) -> dict[str, Any]:
        return {"w_max": self.w_max}


@keras.saving.register_keras_serializable(package="bitfault")
class ClipToRange(keras.constraints.Constraint):
    """Project a weight to ``[lo, hi]`` (``fit``: the clean weights stay storable)."""

    def __init__(self, lo: float, hi: float) -> None:
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"ClipToRange needs finite lo < hi, got {lo!r}, {hi!r}")
        self.lo, self.hi = float(lo), float(hi)

    def __call__(self, w: Any) -> Any:
        return keras.ops.clip(w, self.lo, self.hi)

    def get_config(self) -> dict[str, Any]:
        return {"lo": self.lo, "hi": self.hi}


def _keep_in_range_(model: keras.Model, lo: float, hi: float) -> list[str]:
    """Keep every stored tensor of ``model`` in ``[lo, hi]``, as ``clip_weights_`` keeps it
    in ``[-w_max, w_max]`` (and within both when both are set: one constraint each)."""
    _check_model(model)
    owners = _owner(model)
    found = stored_weights(model)
    for variable in found.values():
        layer, attr = owners[id(variable)]
        old = variable.constraint
        low, high = (max(lo, -old.w_max), min(hi, old.w_max)) if isinstance(
            old, ClipWeights) else (lo, hi)
        constraint = ClipToRange(low, high)
        setattr(layer, attr, constraint)
        variable.constraint = constraint
        variable.assign(constraint(variable.value))
    return list(found)


def clip_weights_(model: keras.Model, w_max: float | None) -> list[str]:
    """Keep every stored tensor of ``model`` (see ``stored_weights``) in ``[-w_max, w_max]``.

    In place: sets a :class:`ClipWeights` constraint, which the Keras optimizer applies
    after every step (``fit``, ``model.fit``, any loop calling ``optimizer.apply``),
    and clips the current values now. ``w_max=None`` removes the constraints. Returns
    the names of the clipped tensors.
    """
    _check_model(model)
    constraint = None if w_max is None else ClipWeights(w_max)
    found = stored_weights(model)
    if not found:
        raise ValueError("clip_weights_ found no built Dense, EinsumDense, Conv1D/2D/3D or "
                         "Embedding layer in the model (build it first)")
    owners = _owner(model)
    for variable in found.values():
        layer, attr = owners[id(variable)]
        setattr(layer, attr, constraint)  # in the layer config: clones and saves keep it
        variable.constraint = constraint
        if constraint is not None:
            variable.assign(constraint(variable.value))
    return list(found)


# ---- bounded ReLUs ------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="bitfault")
class BoundedReLU:
    """``min(max(x, 0), max_value)`` as a serialisable activation function."""

    def __init__(self, max_value: float) -> None:
        self.max_value = check_positive(max_value, "max_value")

    def __call__(self, x: Any) -> Any:
        return keras.activations.relu(x, max_value=self.max_value)

    def get_config(self) -> dict[str, Any]:
        return {"max_value": self.max_value}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> BoundedReLU:
        return cls(**config)

    def __repr__(self) -> str:
        return f"BoundedReLU(max_value={self.max_value:g})"


def _is_relu(fn: Any) -> bool:
    return fn is keras.activations.relu or isinstance(fn, BoundedReLU)


def relu_sites(model: keras.Model) -> dict[str, keras.layers.Layer]:
    """Every ReLU site of ``model`` (see the module docstring), by layer path, in order."""
    _check_model(model)
    sites = {}
    for layer, path in _leaves(model):
        if isinstance(layer, keras.layers.ReLU) or _is_relu(getattr(layer, "activation", None)):
            sites[path] = layer
    return sites


def relu_bounds(model: keras.Model) -> dict[str, float | None]:
    """The cap of every ReLU site by path (None: unbounded)."""
    bounds: dict[str, float | None] = {}
    for path, layer in relu_sites(model).items():
        if isinstance(layer, keras.layers.ReLU):
            bounds[path] = None if layer.max_value is None else float(layer.max_value)
        else:
            act = layer.activation
            bounds[path] = act.max_value if isinstance(act, BoundedReLU) else None
    return bounds


def _thresholds_by_site(model: keras.Model, thresholds: Any) -> dict[str, float]:
    sites = relu_sites(model)
    if not sites:
        raise ValueError("the model has no ReLU to bound: no keras.layers.ReLU, "
                         "Activation('relu') or layer with activation='relu' (a subclassed "
                         "model calling keras.ops.relu in call() cannot be bounded from outside)")
    if isinstance(thresholds, Mapping):
        unknown = sorted(set(thresholds) - set(sites))
        if unknown:
            raise ValueError(f"thresholds names {unknown}, which are not ReLU sites of the "
                             f"model; its ReLU sites: {list(sites)}")
        return {k: check_positive(v, f"thresholds[{k!r}]") for k, v in thresholds.items()}
    t = check_positive(thresholds, "thresholds")
    return dict.fromkeys(sites, t)


def _reset_compiled(model: keras.Model) -> None:
    for name in ("train_function", "test_function", "predict_function"):
        if getattr(model, name, None) is not None:
            setattr(model, name, None)  # traced with the old activations


def bound_relus_(model: keras.Model, thresholds: float | Mapping[str, float]) -> list[str]:
    """Cap the ReLUs of ``model`` in place; returns the paths of the sites capped.

    ``thresholds``: one cap for every ReLU site, or a dict by site path (sites left
    out keep their current cap). ReLU layers get ``max_value``; fused and
    ``Activation`` ReLUs get a :class:`BoundedReLU` (saved with the model).
    """
    _check_model(model)
    caps = _thresholds_by_site(model, thresholds)
    sites = relu_sites(model)
    for path, t in caps.items():
        layer = sites[path]
        if isinstance(layer, keras.layers.ReLU):
            layer.max_value = t
        else:
            layer.activation = BoundedReLU(t)
    _reset_compiled(model)
    return list(caps)


def bound_relus(model: keras.Model, thresholds: float | Mapping[str, float]) -> keras.Model:
    """A copy of ``model`` (Sequential or Functional) with capped ReLUs; ``model`` is untouched.

    Layer names, weights and every other layer are the same; see ``bound_relus_``.
    """
    _check_model(model)
    _thresholds_by_site(model, thresholds)  # validate before cloning
    from bitfault.keras.targets import is_graph_model

    if not is_graph_model(model):
        raise TypeError(f"bound_relus clones Sequential and Functional models; for the "
                        f"subclassed {type(model).__name__} use bound_relus_ (in place)")
    new = keras.models.clone_model(model, recursive=True)
    new.set_weights(model.get_weights())
    bound_relus_(new, thresholds)
    return new


def calibrate_relu_thresholds(model: keras.Model, x: Any, quantile: float = 0.999,
                              batch_size: int = 1000) -> dict[str, float]:
    """The ``quantile`` of each ReLU site's outputs on ``x`` (all elements), by site path.

    The model runs in inference mode; its current caps apply (calibrate an unbounded
    model). A site whose quantile is 0 gets the smallest positive float32 cap.
    """
    _check_model(model)
    if isinstance(quantile, bool) or not isinstance(quantile, numbers.Real) \
            or not 0.0 < float(quantile) <= 1.0:
        raise ValueError(f"quantile must be in (0, 1], got {quantile!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) \
            or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    x = np.asarray(x, np.float32)
    if x.ndim < 1 or len(x) == 0:
        raise ValueError(f"x must hold at least one example, got shape {x.shape}")
    sites = relu_sites(model)
    if not sites:
        _thresholds_by_site(model, 1.0)  # raises the no-ReLU error
    seen: dict[str, list[np.ndarray]] = {path: [] for path in sites}
    for path, layer in sites.items():

        def recording(*args: Any, _call: Any = layer.call, _path: str = path, **kw: Any) -> Any:
            out = _call(*args, **kw)
            seen[_path].append(np.asarray(out, np.float32).reshape(-1))
            return out

        object.__setattr__(layer, "call", recording)
    try:
        for i in range(0, len(x), int(batch_size)):
            model(x[i:i + int(batch_size)], training=False)
    finally:
        for layer in sites.values():
            object.__delattr__(layer, "call")
    return thresholds_from_activations(seen, quantile, "ReLU site(s)")


__all__ = ["BoundedReLU", "ClipWeights", "bound_relus", "bound_relus_",
           "calibrate_relu_thresholds", "clip_weights_", "quantised_weights", "relu_bounds",
           "relu_sites", "stored_weights"]
