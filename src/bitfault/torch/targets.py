"""Which tensors of a PyTorch model are faulted: ``bitfault.targets.Targets`` on modules.

``select_tensors`` is the one walker: ``inject_``, ``TorchEvaluator``, ``fit`` (the
weights RandBET and clipping touch) and ``bitfault inject`` all choose through it,
so one ``Targets`` names the same tensors everywhere. By default the candidates are
every float tensor a model computes with as stored state, whatever module holds it
(``is_default_candidate``): each float parameter of two or more dimensions (Linear,
Hugging Face's ``Conv1D``, ``MultiheadAttention.in_proj_weight``, embeddings, convolution
kernels, a parametrized module's ``original``), the biases beside them, every parameter
of ``DEFAULT_MODULES``, and every persistent float buffer (BatchNorm statistics). With
``filter_fn`` the candidates are the own tensors of the modules it accepts; with include
patterns, every tensor of the model. A tied tensor is one memory: one entry, under the
first name that selects it. ``select_report`` also says what was left out and why.
``state_dict_targets`` is the same rule for a bare ``state_dict``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bitfault.errors import ArgumentError, ArgumentTypeError
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
    (module, attr) places of the model that hold the same (tied) tensor. ``module`` is
    the path in the model; ``name`` is relative to the naming root (see ``Naming``)."""

    name: str
    kind: str
    module: str
    attr: str
    tensor: torch.Tensor | None
    also: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class LeftOut:
    """A tensor of the model that is not faulted, and why."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    reason: str


@dataclass(frozen=True)
class Naming:
    """How tensors are named (fault maps are seeded by name): relative to the module at
    path ``root`` of the model (its tensors only), then without ``strip`` where a name
    starts with it. ``Naming()`` is the model's own ``named_parameters`` naming."""

    root: str = ""
    strip: str = ""

    @classmethod
    def of(cls, model: nn.Module, root: nn.Module | None = None,
           name_prefix: str | None = None) -> Naming:
        """The naming of ``root=`` (a submodule of ``model``) and ``name_prefix=``; checked."""
        path = ""
        if root is not None:
            if not isinstance(root, nn.Module):
                raise ArgumentTypeError("root", root, "a submodule of the model (nn.Module)",
                                        tail=f", got {type(root).__name__}")
            found = [fqn for fqn, m in model.named_modules() if m is root]
            if not found:
                raise ArgumentError("root", type(root).__name__, "a submodule of the model",
                                    requirement="root must be the model or one of its "
                                    "submodules (model.named_modules())")
            path = found[0]
        if name_prefix is not None and not isinstance(name_prefix, str):
            raise ArgumentTypeError("name_prefix", name_prefix, "a string such as 'model.'")
        return cls(path, name_prefix or "")

    def name(self, path: str) -> str | None:
        """The name of the tensor at model path ``path``; None if outside the root."""
        if self.root:
            if not path.startswith(self.root + "."):
                return None
            path = path[len(self.root) + 1:]
        if self.strip and path.startswith(self.strip) and len(path) > len(self.strip):
            path = path[len(self.strip):]
        return path

    def to_dict(self) -> dict[str, str]:
        """JSON form, recorded with a campaign (empty: the model's own names)."""
        return {"root": self.root, "strip": self.strip}


def as_filter(filter_fn: Any, targets: Targets | None = None) -> FilterFn | None:
    """``filter_fn`` as a ``(module, fqn) -> bool``: a callable, or glob patterns on module
    names; None stays None (the default candidates, ``is_default_candidate``)."""
    if filter_fn is None:
        return None
    if isinstance(filter_fn, str):
        filter_fn = [filter_fn]
    if isinstance(filter_fn, (list, tuple)) and all(isinstance(p, str) for p in filter_fn):
        patterns = tuple(filter_fn)
        return lambda module, fqn: any(fnmatch.fnmatchcase(fqn, p) for p in patterns)
    if callable(filter_fn):
        return filter_fn
    raise TypeError("filter_fn must be None (every weight matrix, its biases and the float "
                    "buffers), a callable (module, fully_qualified_name) -> bool, or glob "
                    f"patterns on module names; got {filter_fn!r}")


def is_default_candidate(module: nn.Module, attr: str, tensor: torch.Tensor,
                         buffer: bool) -> str | None:
    """None if the tensor is a default candidate, else why not (for ``LeftOut``). A
    parameter of integer dtype that the rule picks is refused later (``inject_`` cannot
    store it), never skipped."""
    if buffer:
        if not tensor.is_floating_point():
            return f"not a float tensor ({tensor.dtype}): bitfault faults float tensors"
        if attr in getattr(module, "_non_persistent_buffers_set", ()):
            return ("a non-persistent buffer (derived at run time, not in the state_dict); "
                    "name it in targets.include to fault it")
        return None
    if isinstance(module, DEFAULT_MODULES) or tensor.ndim >= 2:
        return None
    if kind_of(attr) == "biases" and any(
            p.is_floating_point() and p.ndim >= 2 for p in module.parameters(recurse=False)):
        return None
    return (f"a {tensor.ndim}-D parameter of {type(module).__name__}, not a weight matrix "
            "or its bias (a norm's scale, say); name it in targets.include to fault it")


def select_modules(model: nn.Module, targets: Targets, filter_fn: Any = None
                   ) -> list[tuple[str, nn.Module]]:
    """The (fqn, module) pairs whose tensors are candidates, in ``named_modules`` order."""
    accept = as_filter(filter_fn, targets)
    if accept is not None:
        return [(fqn, m) for fqn, m in model.named_modules() if accept(m, fqn)]
    if targets.include:
        return list(model.named_modules())
    acts = "activations" in targets.kinds
    return [(fqn, m) for fqn, m in model.named_modules() if (acts and default_activation(m))
            or any(is_default_candidate(m, a, t, b) is None for a, t, b in _own(m))]


def default_activation(module: nn.Module) -> bool:
    """Whether ``module``'s output is a default activation target: a module of
    ``DEFAULT_MODULES`` or one whose ``weight`` is a float matrix (``Conv1D``)."""
    w = module._parameters.get("weight") if hasattr(module, "_parameters") else None
    return isinstance(module, DEFAULT_MODULES) or (
        w is not None and w.is_floating_point() and w.ndim >= 2)


def _own(module: nn.Module) -> list[tuple[str, torch.Tensor, bool]]:
    own = [(a, t, False) for a, t in module.named_parameters(recurse=False)]
    return own + [(a, t, True) for a, t in module.named_buffers(recurse=False)]


def select_tensors(model: nn.Module, targets: TargetsLike = "weights", filter_fn: Any = None,
                   kinds: tuple[str, ...] = KINDS,
                   modules: list[tuple[str, nn.Module]] | None = None,
                   naming: Naming | None = None) -> list[Selected]:
    """The tensors of ``model`` that ``targets`` (anything ``Targets.coerce`` takes, of
    ``kinds``) chooses among the candidates (see the module docstring).

    In model order (a list of names keeps its order); an include pattern that matches
    no candidate is a ValueError naming it.
    """
    return select_report(model, targets, filter_fn, kinds, modules, naming)[0]


def select_report(model: nn.Module, targets: TargetsLike = "weights", filter_fn: Any = None,
                  kinds: tuple[str, ...] = KINDS,
                  modules: list[tuple[str, nn.Module]] | None = None,
                  naming: Naming | None = None) -> tuple[list[Selected], list[LeftOut]]:
    """``select_tensors`` and the model's tensors it left out, each with its reason."""
    targets = Targets.coerce(targets, kinds=kinds)
    naming = naming or Naming()
    default = filter_fn is None and not targets.include
    if modules is None:
        modules = select_modules(model, targets, filter_fn)
    chosen_modules = {id(m) for _, m in modules}
    found: list[Selected] = []
    places: dict[int, list[tuple[str, str]]] = {}  # id(tensor) -> where the model holds it
    chosen: dict[int, int] = {}  # id(tensor) -> its entry in found
    reasons: dict[int, LeftOut] = {}
    candidates: list[str] = []
    for fqn, module in model.named_modules():
        picked = default or id(module) in chosen_modules
        for attr, tensor, buffer in _own(module):
            places.setdefault(id(tensor), []).append((fqn, attr))
            path = join_name(fqn, attr)
            name = naming.name(path)
            why = None
            if name is None:
                why = f"outside the naming root {naming.root!r}"
            elif not picked:
                why = "its module is not chosen by filter_fn"
            elif default:
                why = is_default_candidate(module, attr, tensor, buffer)
            elif buffer and not tensor.is_floating_point() and name not in targets.include:
                why = f"not a float tensor ({tensor.dtype}): bitfault faults float tensors"
            if why is None:
                candidates.append(name)
                kind = kind_of(name, buffer=buffer)
                if id(tensor) in chosen:
                    continue
                if targets.selects(name, kind):
                    chosen[id(tensor)] = len(found)
                    found.append(Selected(name, kind, fqn, attr, tensor))
                    reasons.pop(id(tensor), None)
                    continue
                why = (f"kind {kind!r} is not targeted (targets.kinds={list(targets.kinds)})"
                       if kind not in targets.kinds else "not kept by the targets' patterns")
            if id(tensor) not in chosen and id(tensor) not in reasons:
                reasons[id(tensor)] = LeftOut(name or path, tuple(tensor.shape),
                                              str(tensor.dtype).replace("torch.", ""), why)
        out_name = naming.name(join_name(fqn, "output"))
        if picked and out_name is not None and (not default or default_activation(module)):
            candidates.append(out_name)
            if targets.selects(out_name, "activations"):
                found.append(Selected(out_name, "activations", fqn, "output", None))
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
    return [by_name[n] for n in order], list(reasons.values())
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


__all__ = ["DEFAULT_MODULES", "FilterFn", "LeftOut", "Naming", "Selected", "as_filter",
           "default_activation", "is_default_candidate", "select_modules", "select_report",
           "select_tensors", "state_dict_targets"]
