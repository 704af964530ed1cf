"""Which tensors of a Keras model are faulted: ``bitfault.targets.Targets`` on layers.

The Keras counterpart of ``bitfault.torch.select_tensors``, with names in PyTorch
form (``"<layer path>.weight"`` for a kernel or embedding table, ``".bias"``,
``".output"``). The candidates are the tensors of the Dense, EinsumDense,
Conv1D/2D/3D and Embedding layers (the only layers bitfault.keras faults) that
``filter_fn(layer, path)`` (or glob patterns on layer paths) chooses, all of them
by default. ``inject``, ``FaultyLayer``, ``KerasEvaluator`` and ``bitfault inject``
choose through ``layer_slots`` / ``select_tensors``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import keras

from bitfault.keras.layouts import Slot, is_supported, plan_slots
from bitfault.spec import FaultSpec
from bitfault.targets import Targets

LayerFilter = Callable[[keras.layers.Layer, str], bool]
TargetsLike = Targets | str | Sequence[str] | Mapping[str, Any]
VARIABLE_KINDS = ("weights", "biases")  # what a model's variables hold (no activations)


def is_graph_model(model: Any) -> bool:
    """Whether ``model`` is a Sequential or Functional model (its layers can be walked)."""
    return isinstance(model, keras.Sequential) or (
        isinstance(model, keras.Model) and type(model).__name__ == "Functional")


def walk_layers(model: keras.Model, prefix: str = "") -> Iterator[tuple[keras.layers.Layer, str]]:
    """Every leaf layer with its dotted path (nested Sequential/Functional models recursed)."""
    for layer in model.layers:
        path = f"{prefix}{layer.name}"
        if is_graph_model(layer):
            yield from walk_layers(layer, f"{path}.")
        elif not isinstance(layer, keras.layers.InputLayer):
            yield layer, path


def as_filter(filter_fn: Any) -> LayerFilter | None:
    """``filter_fn`` as a ``(layer, path) -> bool`` (None: none given); glob patterns match
    layer paths."""
    if filter_fn is None or callable(filter_fn):
        return filter_fn
    patterns = [filter_fn] if isinstance(filter_fn, str) else filter_fn
    if isinstance(patterns, (list, tuple)) and all(isinstance(p, str) for p in patterns):
        patterns = tuple(patterns)
        return lambda layer, path: any(fnmatch.fnmatchcase(path, p) for p in patterns)
    raise TypeError(f"filter_fn must be a callable (layer, path) -> bool or glob pattern(s) "
                    f"on layer paths, got {filter_fn!r}")


def layer_slots(layer: keras.layers.Layer, path: str, spec: FaultSpec,
                output_shape: tuple[Any, ...] | None) -> list[Slot]:
    """The tensors of ``layer`` (named ``path.*``) that ``spec.targets`` chooses: its kinds,
    narrowed by its name patterns."""
    return [s for s in plan_slots(layer, path, spec.targets, spec.format, output_shape)
            if spec.targets.selects(s.name, s.target)]


def select_tensors(model: keras.Model, targets: TargetsLike = "weights", filter_fn: Any = None,
                   kinds: tuple[str, ...] = VARIABLE_KINDS) -> list[Slot]:
    """The variables of ``model`` (kernels, embedding tables, biases) that ``targets``
    (anything ``Targets.coerce`` takes, of ``kinds``) chooses, in model order (a list of
    names keeps its order); an include pattern that matches no candidate is a ValueError."""
    targets = Targets.coerce(targets, kinds=kinds)
    accept = as_filter(filter_fn)
    found: list[Slot] = []
    names: list[str] = []
    for layer, path in walk_layers(model):
        if not is_supported(layer) or (accept is not None and not accept(layer, path)):
            continue
        for slot in plan_slots(layer, path, targets.kinds, None, None):
            names.append(slot.name)
            if targets.selects(slot.name, slot.target):
                found.append(slot)
    unknown = targets.unmatched(names)
    if unknown:
        raise ValueError(f"targets names unknown tensor(s) {unknown}; this model's tensors "
                         f"are {sorted(names)}")
    by_name = {s.name: s for s in found}
    return [by_name[n] for n in targets.order(by_name)]


__all__ = ["as_filter", "is_graph_model", "layer_slots", "select_tensors", "walk_layers"]
