"""Which tensors of a Keras model are faulted: ``bitfault.targets.Targets`` on layers.

The Keras counterpart of ``bitfault.torch.select_tensors``, with names in PyTorch
form (``"<layer path>.weight"`` for a kernel or embedding table, ``".bias"``,
``".running_mean"``, ``".output"``). The candidates are the stored tensors of every
layer of a kind ``bitfault.keras.kinds`` lists (Dense, EinsumDense, every convolution,
Embedding, MultiHeadAttention, recurrent layers, norms' statistics) that
``filter_fn(layer, path)`` (or glob patterns on layer paths) chooses, all of them by
default; a norm's scale and shift only when include patterns name them. ``inject``,
``FaultyLayer``, ``KerasEvaluator`` and ``bitfault inject`` choose through
``layer_slots`` / ``select_tensors``; ``select_report`` also lists every variable of
the model left out, and why (a layer of another kind, say).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import keras

from bitfault.keras.kinds import default_reason, left_out_reason, plan_layer
from bitfault.keras.layouts import Slot, is_supported, plan_slots
from bitfault.spec import FaultSpec
from bitfault.targets import Targets

LayerFilter = Callable[[keras.layers.Layer, str], bool]
TargetsLike = Targets | str | Sequence[str] | Mapping[str, Any]
VARIABLE_KINDS = ("weights", "biases", "buffers")  # what variables hold (no activations)
GRAPH_MODELS = ("Functional", "ResamplingModel")  # functional models (inject makes the second)


@dataclass(frozen=True)
class LeftOut:
    """A variable of the model that is not faulted, and why (as ``bitfault.torch``'s)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    reason: str


def is_graph_model(model: Any) -> bool:
    """Whether ``model`` is a Sequential or Functional model (its layers can be walked)."""
    return isinstance(model, keras.Sequential) or (
        isinstance(model, keras.Model) and type(model).__name__ in GRAPH_MODELS)


def sublayers(layer: Any) -> list[keras.layers.Layer]:
    """The layers ``layer`` holds directly, in the order it made them: a model's ``layers``;
    for any other layer, the layers among its attributes (a wrapper's ``layer``, an RNN's
    ``cell``, a Bidirectional's two RNNs, MultiHeadAttention's projections, lists of them)."""
    if isinstance(layer, keras.Model):
        return list(layer.layers)
    found: dict[int, keras.layers.Layer] = {}
    todo = list(vars(layer).values())
    while todo:
        value = todo.pop(0)
        if isinstance(value, keras.layers.Layer):
            found.setdefault(id(value), value)
        elif isinstance(value, (list, tuple)):
            todo[:0] = list(value)
        elif isinstance(value, dict):
            todo[:0] = list(value.values())
    found.pop(id(layer), None)
    return list(found.values())


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
    return [s for s in plan_slots(layer, path, spec.targets, spec.format, output_shape,
                                  every=bool(spec.targets.include))
            if spec.targets.selects(s.name, s.target)]


def select_tensors(model: keras.Model, targets: TargetsLike = "weights", filter_fn: Any = None,
                   kinds: tuple[str, ...] = VARIABLE_KINDS) -> list[Slot]:
    """The variables of ``model`` (kernels, embedding tables, biases, statistics) that
    ``targets`` (anything ``Targets.coerce`` takes, of ``kinds``) chooses, in model order (a
    list of names keeps its order); an include pattern that matches no candidate is a
    ValueError."""
    return select_report(model, targets, filter_fn, kinds)[0]


def _left(variable: Any, name: str, reason: str) -> LeftOut:
    return LeftOut(name, tuple(int(d) for d in variable.shape), str(variable.dtype), reason)


def select_report(model: keras.Model, targets: TargetsLike = "weights", filter_fn: Any = None,
                  kinds: tuple[str, ...] = VARIABLE_KINDS, fmt: Any = None,
                  output_shapes: Callable[[keras.layers.Layer], Any] | None = None
                  ) -> tuple[list[Slot], list[LeftOut]]:
    """``select_tensors`` and every variable of the model it left out, each with its reason
    (a layer of a kind bitfault.keras does not fault, a kind not targeted, ...).

    ``fmt``: the format the slots are checked against; ``output_shapes(layer)``: a layer's
    output shape, for activation targets."""
    targets = Targets.coerce(targets, kinds=kinds)
    accept = as_filter(filter_fn)
    every = bool(targets.include)
    found: list[Slot] = []
    names: list[str] = []
    left: dict[int, LeftOut] = {}  # id(variable) -> why (a variable seen twice counts once)
    chosen: set[int] = set()
    for layer, path in walk_layers(model):
        if not is_supported(layer):
            for v in layer.weights:
                left.setdefault(id(v), _left(v, f"{path}.{v.name}", left_out_reason(layer)))
            continue
        planned = plan_layer(layer, path) if layer.built else []
        stored = {id(t.variable) for t in planned}
        for v in layer.weights:
            if id(v) not in stored:
                left.setdefault(id(v), _left(v, f"{path}.{v.name}", left_out_reason(layer)))
        if accept is not None and not accept(layer, path):
            for t in planned:
                left.setdefault(id(t.variable), _left(t.variable, f"{path}.{t.attr}",
                                                      "its layer is not chosen by filter_fn"))
            continue
        shape = output_shapes(layer) if output_shapes and "activations" in targets else None
        slots = {s.name: s for s in plan_slots(layer, path, targets.kinds, fmt, shape, every)}
        for t in planned:
            name = f"{path}.{t.attr}"
            slot = slots.get(name)
            if slot is not None:
                names.append(name)
                if targets.selects(name, t.kind) and id(t.variable) not in chosen:
                    chosen.add(id(t.variable))
                    found.append(slot)
                    left.pop(id(t.variable), None)
                    continue
                why = "not kept by the targets' patterns"
            elif not (t.default or every):
                why = default_reason(layer, len(t.variable.shape))
            else:
                why = (f"kind {t.kind!r} is not targeted (targets.kinds="
                       f"{list(targets.kinds)})")
            if id(t.variable) not in chosen:
                left.setdefault(id(t.variable), _left(t.variable, name, why))
        for slot in slots.values():
            if slot.variable is None:
                names.append(slot.name)
                if targets.selects(slot.name, slot.target):
                    found.append(slot)
    unknown = targets.unmatched(names)
    if unknown:
        raise ValueError(f"targets names unknown tensor(s) {unknown}; this model's tensors "
                         f"are {sorted(names)}")
    by_name = {s.name: s for s in found}
    return [by_name[n] for n in targets.order(by_name)], list(left.values())


__all__ = ["LeftOut", "as_filter", "is_graph_model", "layer_slots", "select_report",
           "select_tensors", "sublayers", "walk_layers"]
