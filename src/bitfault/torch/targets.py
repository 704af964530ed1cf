"""Which tensors of a PyTorch model are faulted: ``bitfault.targets.Targets`` on modules.

``select_tensors`` is the one walker: ``inject_``, ``TorchEvaluator``, ``fit`` (the
weights RandBET and clipping touch) and ``bitfault inject`` all choose through it,
so one ``Targets`` names the same tensors everywhere. The candidates are the own
parameters (and buffers, and outputs) of the chosen modules: those ``filter_fn``
accepts, else every module when ``targets`` has include patterns (they name the
tensors), else ``DEFAULT_MODULES``. A tied tensor is one memory: one entry, under
the first name that selects it. ``state_dict_targets`` is the same rule for a bare
``state_dict``, which holds no module types.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bitfault.targets import KINDS, Targets, kind_of
from bitfault.torch.handle import join_name

DEFAULT_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Embedding)

FilterFn = Callable[[nn.Module, str], bool]
TargetsLike = Targets | str | Sequence[str] | Mapping[str, Any]


@dataclass(frozen=True)
class Selected:
    """One chosen tensor: its ``name``, ``kind``, where it lives (``module`` path, ``attr``)
    and the tensor (None for activations, ``attr == "output"``); ``also``: the other
    (module, attr) places of the chosen modules that hold the same (tied) tensor."""

    name: str
    kind: str
    module: str
    attr: str
    tensor: torch.Tensor | None
    also: tuple[tuple[str, str], ...] = ()


def as_filter(filter_fn: Any, targets: Targets | None = None) -> FilterFn:
    """``filter_fn`` as a ``(module, fqn) -> bool``: None (``DEFAULT_MODULES``, or every
    module when ``targets`` has include patterns), a callable, or glob patterns on module
    names."""
    if filter_fn is None:
        if targets is not None and targets.include:
            return lambda module, fqn: True
        return lambda module, fqn: isinstance(module, DEFAULT_MODULES)
    if isinstance(filter_fn, str):
        filter_fn = [filter_fn]
    if isinstance(filter_fn, (list, tuple)) and all(isinstance(p, str) for p in filter_fn):
        patterns = tuple(filter_fn)
        return lambda module, fqn: any(fnmatch.fnmatchcase(fqn, p) for p in patterns)
    if callable(filter_fn):
        return filter_fn
    raise TypeError("filter_fn must be None (Linear, Conv1d/2d/3d and Embedding modules), a "
                    "callable (module, fully_qualified_name) -> bool, or glob patterns on module "
                    f"names; got {filter_fn!r}")


def select_modules(model: nn.Module, targets: Targets, filter_fn: Any = None
                   ) -> list[tuple[str, nn.Module]]:
    """The (fqn, module) pairs whose tensors are candidates, in ``named_modules`` order."""
    accept = as_filter(filter_fn, targets)
    return [(fqn, m) for fqn, m in model.named_modules() if accept(m, fqn)]


def select_tensors(model: nn.Module, targets: TargetsLike = "weights", filter_fn: Any = None,
                   kinds: tuple[str, ...] = KINDS,
                   modules: list[tuple[str, nn.Module]] | None = None) -> list[Selected]:
    """The tensors of ``model`` that ``targets`` (anything ``Targets.coerce`` takes, of
    ``kinds``) chooses among the chosen modules' own parameters, buffers and outputs.

    In model order (a list of names keeps its order); an include pattern that matches
    no candidate is a ValueError naming it.
    """
    targets = Targets.coerce(targets, kinds=kinds)
    if modules is None:
        modules = select_modules(model, targets, filter_fn)
    found: list[Selected] = []
    places: dict[int, list[tuple[str, str]]] = {}  # id(tensor) -> where the modules hold it
    chosen: dict[int, int] = {}  # id(tensor) -> its entry in found
    candidates: list[str] = []
    for fqn, module in modules:
        own = [(a, t, False) for a, t in module.named_parameters(recurse=False)]
        own += [(a, t, True) for a, t in module.named_buffers(recurse=False)]
        for attr, tensor, buffer in own:
            name = join_name(fqn, attr)
            candidates.append(name)
            places.setdefault(id(tensor), []).append((fqn, attr))
            kind = kind_of(name, buffer=buffer)
            if id(tensor) not in chosen and targets.selects(name, kind):
                chosen[id(tensor)] = len(found)
                found.append(Selected(name, kind, fqn, attr, tensor))
        name = join_name(fqn, "output")
        candidates.append(name)
        if targets.selects(name, "activations"):
            found.append(Selected(name, "activations", fqn, "output", None))
    for key, i in chosen.items():  # a tied tensor is one memory, wherever it is used
        s = found[i]
        also = tuple(p for p in places[key] if p != (s.module, s.attr))
        if also:
            found[i] = Selected(s.name, s.kind, s.module, s.attr, s.tensor, also)
    unknown = targets.unmatched(candidates)
    if unknown:
        raise ValueError(f"targets names unknown tensor(s) {unknown}; the model's tensors "
                         f"are {sorted(n for n in candidates if not n.endswith('output'))}")
    order = targets.order([s.name for s in found])
    by_name = {s.name: s for s in found}
    return [by_name[n] for n in order]


def state_dict_targets(state: Mapping[str, torch.Tensor], targets: TargetsLike = "weights",
                       kinds: tuple[str, ...] = ("weights", "biases")) -> list[str]:
    """The names of a ``state_dict`` that ``targets`` chooses, by ``select_tensors``'s rule
    without module types: the weights of Linear, Conv and Embedding modules are the float
    ``*.weight`` tensors with two or more dimensions, their biases the ``*.bias`` beside
    them; with include patterns every float tensor is a candidate (its kind read from its
    name). On a model built of those modules (plus norms, activations, pooling) this is
    exactly what ``select_tensors`` chooses. A tensor saved under two names (tied) is
    listed once, under its first name."""
    targets = Targets.coerce(targets, kinds=kinds)
    floats = [n for n, t in state.items() if t.is_floating_point()]
    weights = {n for n in floats if (n.endswith(".weight") or n == "weight")
               and state[n].ndim >= 2}
    biases = {n[:-len("weight")] + "bias" for n in weights} & set(floats)
    seen: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
    names = []
    for n in floats:
        if not targets.include and n not in weights | biases:
            continue
        if not targets.selects(n, kind_of(n)):
            continue
        t = state[n]
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
        if t.numel() and key in seen:
            continue
        seen.add(key)
        names.append(n)
    unknown = targets.unmatched(floats)
    if unknown:
        raise ValueError(f"targets names unknown tensor(s) {unknown}; the file's float "
                         f"tensors are {sorted(floats)}")
    return targets.order(names)


__all__ = ["DEFAULT_MODULES", "FilterFn", "Selected", "as_filter", "select_modules",
           "select_tensors", "state_dict_targets"]
