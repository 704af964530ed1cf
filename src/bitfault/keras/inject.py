"""inject: a copy of a Keras model whose chosen layers compute through faulty memory."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import keras

from bitfault.keras.layers import FaultyLayer, as_spec
from bitfault.keras.layouts import SUPPORTED_NAMES, draw_maps, is_supported, plan_slots
from bitfault.keras.seam import check_supported
from bitfault.keras.targets import as_filter, is_graph_model, walk_layers
from bitfault.maps import FaultMap
from bitfault.spec import FaultSpec

FilterFn = Callable[[keras.layers.Layer, str], bool] | str | Sequence[str]


def faulty_layers(model: keras.Model) -> list[FaultyLayer]:
    """The FaultyLayers of a model (searched recursively, in order)."""
    found: list[FaultyLayer] = []

    def visit(layer: Any) -> None:
        for sub in layer._flatten_layers(include_self=False, recursive=False):
            if isinstance(sub, FaultyLayer):
                if sub not in found:
                    found.append(sub)
            else:
                visit(sub)

    visit(model)
    return found


def fault_maps(model: keras.Model) -> dict[str, FaultMap]:
    """The fault map of every faulted tensor of the model (PyTorch layout), by tensor name."""
    maps: dict[str, FaultMap] = {}
    for layer in faulty_layers(model):
        maps.update(layer.maps)
    return maps


def resample(model: keras.Model, step: int) -> None:
    """Use the transient maps of ``step`` in every transient FaultyLayer of the model."""
    layers = [la for la in faulty_layers(model) if la.spec.persistence == "transient"]
    if not layers:
        raise ValueError("resample(model, step) needs FaultyLayers with a transient spec; this "
                         "model has none (permanent maps never change)")
    for layer in layers:
        layer.resample(step)


def _output_shape(layer: keras.layers.Layer, path: str) -> tuple[Any, ...] | None:
    try:
        return tuple(layer.output.shape)
    except (AttributeError, ValueError):
        return None


def _choose(model: keras.Model, spec: FaultSpec,
            filter_fn: FilterFn | None) -> dict[int, tuple[str, dict[str, FaultMap]]]:
    """id(layer) -> (tensor prefix, maps) for every chosen layer; all checks happen here."""
    chosen: dict[int, tuple[str, dict[str, FaultMap]]] = {}
    seen: list[str] = []
    candidates: list[str] = []
    accept = as_filter(filter_fn)
    for layer, path in walk_layers(model):
        seen.append(path)
        if isinstance(layer, FaultyLayer):
            raise ValueError(f"model already has faults injected (layer {path!r} is a "
                             "FaultyLayer); inject into the clean model")
        pick = accept(layer, path) if accept is not None else is_supported(layer)
        if not pick:
            continue
        if not is_supported(layer):
            raise TypeError(f"filter_fn chose layer {path!r}, a {type(layer).__name__}; "
                            f"bitfault.keras faults {SUPPORTED_NAMES} layers")
        if not layer.built:
            raise ValueError(f"layer {path!r} is not built; build the model (call it on data "
                             "or give it an Input) before inject")
        output_shape = _output_shape(layer, path) if "activations" in spec.targets else None
        slots = plan_slots(layer, path, spec.targets, spec.format, output_shape)
        candidates.extend(s.name for s in slots)
        slots = [s for s in slots if spec.targets.selects(s.name, s.target)]
        chosen[id(layer)] = (path, draw_maps(slots, spec, 0 if spec.persistence ==
                                             "transient" else None))
    if not chosen:
        what = "filter_fn matched no layer" if filter_fn is not None else (
            f"the model has no {SUPPORTED_NAMES} layer")
        raise ValueError(f"{what}; the model's layers: {seen}")
    unknown = spec.targets.unmatched(candidates)
    if unknown:
        raise ValueError(f"targets names unknown tensor(s) {unknown}; the chosen layers' "
                         f"tensors are {sorted(candidates)}")
    names = {name for _, maps in chosen.values() for name in maps}
    if not names:
        raise ValueError(f"targets={list(spec.targets.kinds)} name no tensor of the chosen "
                         f"layers {[path for path, _ in chosen.values()][:8]}")
    if spec.maps is not None:
        unknown = sorted(set(spec.maps) - names)
        if unknown:
            raise ValueError(f"spec.maps names tensor(s) {unknown} that no chosen layer has; the "
                             f"faulted tensors are {sorted(names)}")
    return chosen


def inject(model: keras.Model, spec: FaultSpec | dict[str, Any],
           filter_fn: FilterFn | None = None) -> keras.Model:
    """A new model whose chosen layers use faulty weights; ``model`` is left untouched.

    Chosen by default: every Dense, EinsumDense, Conv1D/2D/3D and Embedding
    layer, or those for which ``filter_fn(layer, path)`` is true (``path``:
    the layer's name, dotted through nested models: also the tensor-name
    prefix); a glob string or list of globs matches paths. Of each, the tensors
    ``spec.targets`` chooses by kind and name (``bitfault.keras.select_tensors``). Weights are
    copied over; the new model is not compiled. Transient specs start at
    step 0; the new model's ``fit``/``evaluate``/``predict`` add a
    ``ResampleFaults`` callback (unless given one), ``resample`` sets a step.
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
    chosen = _choose(model, spec, filter_fn)
    clones: list[tuple[keras.layers.Layer, keras.layers.Layer]] = []

    def clone(layer: keras.layers.Layer) -> keras.layers.Layer:
        new = layer.__class__.from_config(layer.get_config())
        if id(layer) in chosen:
            path, maps = chosen[id(layer)]
            step = 0 if spec.persistence == "transient" else None
            wrapper = FaultyLayer(new, spec, tensor_prefix=path, step=step)
            wrapper._preset_maps = maps
            clones.append((layer, new))
            return wrapper
        clones.append((layer, new))
        return new

    new_model = keras.models.clone_model(model, clone_function=clone, recursive=True)
    for old, new in clones:
        new.set_weights(old.get_weights())
    if spec.persistence == "transient":
        _resample_in_every_run(new_model)
    return new_model


def _resample_in_every_run(model: keras.Model) -> None:
    """Give ``model``'s fit, evaluate and predict one ``ResampleFaults`` callback of its own
    (unless the call passes one), so transient maps change without extra wiring."""
    from bitfault.keras.callbacks import ResampleFaults

    callback = ResampleFaults()  # one per model: forward counts carry on across calls

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def run(*args: Any, callbacks: Any = None, **kwargs: Any) -> Any:
            if isinstance(callbacks, keras.callbacks.CallbackList):
                if not any(isinstance(c, ResampleFaults) for c in callbacks.callbacks):
                    callback.set_model(model)
                    callbacks.callbacks.append(callback)
            else:
                callbacks = list(callbacks or [])
                if not any(isinstance(c, ResampleFaults) for c in callbacks):
                    callbacks.append(callback)
            return method(*args, callbacks=callbacks, **kwargs)
        return run

    for name in ("fit", "evaluate", "predict"):
        setattr(model, name, wrap(getattr(model, name)))


__all__ = ["fault_maps", "faulty_layers", "inject", "resample"]
