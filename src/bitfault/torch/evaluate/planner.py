"""``TorchEvaluator.plan()``: which path each target tensor's faults take, and why.

Paths, fastest first (every one gives the predictions of the model's own forward; the
shortcut's Linear column and rank-one updates to rounding, docs/campaigns.md):

* ``"shortcut"``: single faults (one element of the codes plane) compute only the
  changed column/channel and what follows from it (``bitfault.torch.evaluate.single_faults``);
* ``"layer"``: the traced graph recomputes the nodes that depend on the tensor from the
  clean activations (``bitfault.torch.evaluate.activations``);
* ``"model"``: the whole model runs once per trial.

``path`` is the path of a single fault, ``several`` that of a trial whose faults all sit
in this tensor (several elements, or a scale word); trials faulting several tensors run
the whole model. A fast path that failed at run time shows here with its error
(``fallback``) and the path its trials take since.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from bitfault.formats.blocks import CODES
from bitfault.maps import FaultMap
from bitfault.memory.memory import Memory
from bitfault.torch.evaluate.batch_roles import BatchRoles
from bitfault.torch.evaluate.conv_calls import ConvCall, conv_call

SHORTCUT, LAYER, MODEL = "shortcut", "layer", "model"


@dataclass(frozen=True)
class PlanEntry:
    """One target tensor: the path of its single faults (``path``) and why, that of
    trials faulting several of its elements (``several``), the single faults the
    shortcut has evaluated so far, and the error a fast path failed with (or None)."""

    tensor: str
    path: str
    reason: str
    several: str
    shortcut_faults: int = 0
    fallback: str | None = None


class Plan(tuple):  # type: ignore[type-arg]
    """The entries of ``TorchEvaluator.plan()``, one per target tensor, in its order."""

    def to_dicts(self) -> list[dict[str, Any]]:
        return [asdict(e) for e in self]

    def to_frame(self) -> Any:
        """A pandas DataFrame, one row per tensor."""
        import pandas as pd

        return pd.DataFrame(self.to_dicts(), columns=[
            "tensor", "path", "reason", "several", "shortcut_faults", "fallback"])

    def __str__(self) -> str:
        rows = [(e.tensor, e.path, e.several, str(e.shortcut_faults), e.reason)
                for e in self]
        head = ("tensor", "path", "several", "shortcut_faults", "reason")
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True))
                         + "  " + r[4] for r in [head, *rows])


class PathPlanner:
    """Where ``TorchEvaluator`` decides which path a tensor's single faults take (a mixin
    of it: the checks read its model, traced graph and data). Every precondition of the
    shortcut is checked here, once per tensor, and a failure at run time is recorded here
    (``fallbacks``), so ``plan()`` reports exactly what the trials do."""

    model: Any
    x: Any
    _path: dict[str, str]
    _owner: dict[str, tuple[str, str, str]]
    _aliases: dict[str, list[str]]
    _single_calls: dict[str, ConvCall | bool | None]
    _single_why: dict[str, str]  # tensor -> why its single faults take the path they take
    _roles: BatchRoles | bool | None  # None: not probed yet; False: the probe failed
    fallbacks: dict[str, str]  # tensor -> the error its shortcut failed with at run time
    _full_only: set[str]  # tensors whose layer path failed at run time: the whole model
    fast_paths: bool

    def trial_path(self, active: Mapping[str, FaultMap],
                   faulted: Mapping[str, list[str]]) -> str:
        """The path of one trial, from its maps (tensor -> map, faulty bits only) and the
        planes each map faults: SHORTCUT for one fault in one element's code of a tensor
        whose preconditions hold, LAYER for faults in one tensor whose layer path holds,
        else MODEL (the whole model, always exact)."""
        if len(active) != 1 or not self.fast_paths:
            return MODEL
        (name, fmap), = active.items()
        if fmap.indices.size == 1 and list(faulted[name]) == [CODES] and self._single_ok(name):
            return SHORTCUT
        if self.graph() is not None and name not in self._full_only:
            return LAYER
        return MODEL

    graph: Any  # the evaluator's traced graph, a method of TorchEvaluator (CleanActivations)

    def _single_ok(self, name: str) -> bool:
        """Whether a single fault in tensor ``name`` can take the shortcut (asked once per
        tensor: the graph and the modules do not change)."""
        if self.graph() is None:
            return False
        if name not in self._single_calls:
            self._single_calls[name], self._single_why[name] = self._single_call(name)
        return self._single_calls[name] is not False

    def _single_call(self, name: str) -> tuple[ConvCall | bool | None, str]:
        """(the convolution call behind weight ``name``, None for an ``nn.Linear`` called on
        one input, False when the shortcut does not apply; why)."""
        from torch import nn

        module, _, attr = self._owner[name]
        mod = self.model.get_submodule(module) if module else self.model
        if attr != "weight":
            return False, f"{attr!r} of its module, not the weight of a Linear or a convolution"
        if name in self._aliases:
            return False, "a tied tensor (read by several modules)"
        if isinstance(mod, nn.Linear):
            seeds = self.graph().seeds(name)
            ok = (len(seeds) == 1 and seeds[0].op == "call_module" and seeds[0].target == module
                  and len(seeds[0].args) == 1 and not seeds[0].kwargs)
            call: ConvCall | bool | None = None if ok else False
            why = "nn.Linear: the changed output column" if ok else \
                "nn.Linear not called once on one input"
        else:
            call = conv_call(self.graph(), self.model, name)
            why = (f"{type(mod).__name__}: the changed output channel" if call is not None
                   else f"{type(mod).__name__}: not a convolution the shortcut can prove")
            call = False if call is None else call
        if call is False:
            return False, why
        roles = self.batch_roles()
        if roles is None:
            return False, "the graph does not run on 2 and 3 examples"
        g = self.graph()
        mixing = roles.first_mixing(g, g.dependents(g.seeds(name)))
        if mixing is not None:
            return False, f"node {mixing.name!r} after it mixes examples"
        return call, why

    def batch_roles(self) -> BatchRoles | None:
        """How the graph's nodes follow the batch (``batch_roles``), probed once; None when
        the graph does not run on 2 and 3 examples."""
        if self._roles is None:
            try:
                self._roles = BatchRoles.probe(self.graph(), self.model, self.x)
            except Exception:  # the exact paths still apply
                self._roles = False
        return self._roles or None

    def _fall_back(self, name: str, err: Exception) -> None:
        """The shortcut failed on tensor ``name``: its faults take the layer path from now
        on; said once per tensor, and recorded (``fallbacks``, ``plan()``)."""
        self._single_calls[name] = False
        text = f"{type(err).__name__}: {err}"
        self._single_why[name] = f"the shortcut failed at run time ({text})"
        public = next((n for n, p in self._path.items() if p == name), name)
        if public not in self.fallbacks:
            self.fallbacks[public] = text
            warnings.warn(f"TorchEvaluator: the single-fault shortcut failed on tensor "
                          f"{public!r} ({text}); its faults take the exact layer path",
                          RuntimeWarning, stacklevel=4)


def evaluation_plan(ev: Any, memory: Memory | None = None) -> Plan:
    """``ev``'s plan (a ``TorchEvaluator``); with ``memory`` the clean run is made (as a
    campaign makes it) and checked to reproduce the golden run, else only the trace."""
    if not ev.fast_paths:
        return Plan(PlanEntry(n, MODEL, "fast_paths=False", MODEL) for n in ev.names)
    if ev.graph() is not None and memory is not None:
        ev._clean_env(memory)  # may find that the trace does not reproduce the model
    if ev.graph() is None:
        why = ("torch.fx could not trace the model, or its trace does not give the "
               "model's predictions")
        return Plan(PlanEntry(n, MODEL, why, MODEL, 0, ev.fallbacks.get(n)) for n in ev.names)
    entries = []
    for name in ev.names:
        path = ev._path[name]
        fallback = ev.fallbacks.get(name)
        done = ev._shortcut_faults.get(path, 0)
        several = MODEL if path in ev._full_only else LAYER  # its layer path failed
        if ev._single_ok(path):
            entries.append(PlanEntry(name, SHORTCUT, ev._single_why[path], several, done,
                                     fallback))
        else:
            why = ev._single_why[path] if several == LAYER else \
                f"{ev._single_why[path]}; the layer path failed at run time"
            entries.append(PlanEntry(name, several, why, several, done, fallback))
    return Plan(entries)


__all__ = ["LAYER", "MODEL", "SHORTCUT", "PathPlanner", "Plan", "PlanEntry", "evaluation_plan"]
