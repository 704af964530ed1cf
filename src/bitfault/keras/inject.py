"""inject: a copy of a Keras model whose chosen layers compute through faulty memory."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import keras

from bitfault.keras.callbacks import resampling
from bitfault.keras.layers import FaultyLayer, as_spec
from bitfault.keras.layouts import SUPPORTED_NAMES, draw_maps, is_supported
from bitfault.keras.seam import check_supported
from bitfault.keras.targets import LeftOut, as_filter, is_graph_model, select_report, walk_layers
from bitfault.maps import FaultMap
from bitfault.spec import FaultSpec
from bitfault.targets import KINDS

FilterFn = Callable[[keras.layers.Layer, str], bool] | str | Sequence[str]


def _output_shape(layer: keras.layers.Layer) -> tuple[Any, ...] | None:
    try:
        return tuple(layer.output.shape)
    except (AttributeError, ValueError):
        return None


def _choose(model: keras.Model, spec: FaultSpec, filter_fn: FilterFn | None
            ) -> tuple[dict[int, tuple[str, dict[str, FaultMap]]], list[LeftOut]]:
    """id(layer) -> (tensor prefix, maps) for every layer with a chosen tensor, and what is
    left out; all checks happen here."""
    seen: dict[str, keras.layers.Layer] = {}
    accept = as_filter(filter_fn)
    for layer, path in walk_layers(model):
        seen[path] = layer
        if isinstance(layer, FaultyLayer):
            raise ValueError(f"model already has faults injected (layer {path!r} is a "
                             "FaultyLayer); inject into the clean model")
        if accept is not None and accept(layer, path) and not is_supported(layer):
            raise TypeError(f"filter_fn chose layer {path!r}, a {type(layer).__name__}; "
                            f"bitfault.keras faults {SUPPORTED_NAMES} layers")
    slots, left_out = select_report(model, spec.targets, filter_fn, KINDS, spec.format,
                                    _output_shape)
    if not slots:
        picked = [p for p, la in seen.items() if is_supported(la) and
                  (accept is None or accept(la, p))]
        if not picked:
            what = "filter_fn matched no layer" if filter_fn is not None else (
                f"the model has no {SUPPORTED_NAMES} layer")
            raise ValueError(f"{what}; the model's layers: {list(seen)}")
        raise ValueError(f"targets={list(spec.targets.kinds)} name no tensor of the chosen "
                         f"layers {picked[:8]}")
    names = {s.name for s in slots}
    if spec.maps is not None:
        unknown = sorted(set(spec.maps) - names)
        if unknown:
            raise ValueError(f"spec.maps names tensor(s) {unknown} that no chosen layer has; the "
                             f"faulted tensors are {sorted(names)}")
    step = 0 if spec.persistence == "transient" else None
    chosen: dict[int, tuple[str, dict[str, FaultMap]]] = {}
    for path in dict.fromkeys(s.layer for s in slots):
        mine = [s for s in slots if s.layer == path]
        chosen[id(seen[path])] = (path, draw_maps(mine, spec, step))
    return chosen, left_out


def left_out(model: keras.Model) -> list[LeftOut]:
    """The variables of a model from ``inject`` that are not faulted, each with the reason
    (a layer of a kind bitfault.keras does not fault, a kind not targeted, ...)."""
    if model not in _LEFT_OUT:
        raise ValueError("left_out(model) needs a model returned by bitfault.keras.inject "
                         "(bitfault.keras.select_report lists them for any model)")
    return list(_LEFT_OUT[model])


_LEFT_OUT: weakref.WeakKeyDictionary[Any, list[LeftOut]] = weakref.WeakKeyDictionary()


def inject(model: keras.Model, spec: FaultSpec | dict[str, Any],
           filter_fn: FilterFn | None = None) -> keras.Model:
    """A new model whose chosen layers use faulty weights; ``model`` is left untouched.

    Chosen by default: every layer of a kind ``bitfault.keras.kinds`` lists (Dense,
    EinsumDense, every convolution, Embedding, MultiHeadAttention, recurrent layers,
    norms' statistics) with a tensor ``spec.targets`` chooses, or those for which
    ``filter_fn(layer, path)`` is true (``path``: the layer's name, dotted through
    nested models: also the tensor-name prefix); a glob string or list of globs matches
    paths. Of each, the tensors ``spec.targets`` chooses by kind and name
    (``bitfault.keras.select_tensors``). Weights are copied over; the new model is not
    compiled. Transient specs start at step 0 and return a ``ResamplingModel`` (or
    ``ResamplingSequential``) of the same layers, whose ``fit``/``evaluate``/``predict`` add a
    ``ResampleFaults`` callback (unless given one); ``resample`` sets a step.
    ``left_out(new_model)`` lists every variable not faulted, and why.

    The clean weights stay storable under your own training: for a format with a bounded
    range (FixedPoint, Float; see ``storable_range``) every faulted trainable variable gets
    a ``KeepStorable`` constraint (the kernel's own constraint first), which Keras
    optimizers apply after each update, so ``model.fit``, ``train_on_batch`` and a
    ``GradientTape`` loop calling ``optimizer.apply``/``apply_gradients`` keep every clean
    value inside the range. The copied weights are projected by the first update.
    """
    spec = as_spec(spec)
    check_supported(spec.format, spec.fault)
    if not isinstance(model, keras.Model):
        raise TypeError(f"model must be a keras.Model, got {type(model).__name__}")
    if not is_graph_model(model):
        raise TypeError(f"model must be a Sequential or Functional model, got the subclassed "
                        f"{type(model).__name__}; wrap its layers in bitfault.keras.FaultyLayer "
                        "instead")
    as_filter(filter_fn)  # a bad filter is refused before anything else
    chosen, skipped = _choose(model, spec, filter_fn)
    clones: list[tuple[keras.layers.Layer, keras.layers.Layer]] = []

    def clone(layer: keras.layers.Layer) -> keras.layers.Layer:
        new = layer.__class__.from_config(layer.get_config())
        if id(layer) in chosen:
            if layer.get_build_config():  # built as the original (MultiHeadAttention's shapes)
                new.build_from_config(layer.get_build_config())
            path, maps = chosen[id(layer)]
            step = 0 if spec.persistence == "transient" else None
            wrapper = FaultyLayer(new, spec, tensor_prefix=path, step=step)
            wrapper.use_maps(maps)
            clones.append((layer, new))
            return wrapper
        clones.append((layer, new))
        return new

    new_model = keras.models.clone_model(model, clone_function=clone, recursive=True)
    for old, new in clones:
        new.set_weights(old.get_weights())
    if spec.persistence == "transient":
        new_model = resampling(new_model)
    _LEFT_OUT[new_model] = skipped
    return new_model


__all__ = ["inject", "left_out"]
