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

from dataclasses import asdict, dataclass
from typing import Any

from bitfault.memory.memory import Memory

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


__all__ = ["LAYER", "MODEL", "SHORTCUT", "Plan", "PlanEntry", "evaluation_plan"]
