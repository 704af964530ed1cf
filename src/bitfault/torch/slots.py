"""What a ``FaultHandle`` faults, tensor by tensor: names, the faulted slots, the report.

``FaultedParam`` is one stored tensor ``inject_`` faults (a parameter or a buffer);
``FaultReport`` (``handle.report()``) lists every tensor faulted (name, kind, shape,
format, faults, the other places of a tied tensor) and every tensor of the model left
out, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from bitfault.maps import FaultMap


def join_name(module: str, leaf: str) -> str:
    """A tensor name in PyTorch's style: ``"fc1.weight"``, or ``"weight"`` on the model itself."""
    return f"{module}.{leaf}" if module else leaf


@dataclass(frozen=True)
class FaultedParam:
    """One faulted stored tensor: its name (relative to the naming root), module path in
    the model, attribute, shape, and whether it is a buffer."""

    name: str  # "fc1.weight"
    module: str  # "fc1"
    attr: str  # "weight"
    shape: tuple[int, ...]
    buffer: bool = False


def batch_map(fmap: FaultMap, batch: int) -> FaultMap:
    """The map of a whole batch of activations: ``fmap`` (one sample) repeated ``batch`` times.

    ``inject(output, fmt, fault, batch_map(m, len(output)))`` is exactly what an
    activation target does to a module's output.
    """
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 0:
        raise ValueError(f"batch must be a non-negative integer, got {batch!r}")
    size = fmap.size
    idx = (np.arange(batch, dtype=np.int64)[:, None] * size + fmap.indices[None, :]).reshape(-1)
    # a block format's planes (blocks along a negative axis: the same blocks in every
    # sample): element and block planes repeat per sample, a tensor plane (shape ()) is
    # the one word of the whole batch
    planes = {p: m if not m.shape else batch_map(m, batch) for p, m in fmap.planes.items()}
    return FaultMap((batch, *fmap.shape), idx, np.tile(fmap.masks, batch), fmap.name,
                    {**fmap.meta, "batch": batch}, planes)


def held(module: nn.Module, attr: str) -> torch.Tensor:
    """The clean tensor ``module`` holds under ``attr``: a parameter or a buffer."""
    found = module._parameters.get(attr)
    return found if found is not None else module._buffers[attr]


def original_forward(module: nn.Module) -> Callable[..., Any]:
    """The ``forward`` a chosen module had before ``inject_``: its own, or its class's."""
    original = module.__dict__.get("_bitfault_forward")
    return original if original is not None else type(module).forward.__get__(module)


@dataclass(frozen=True)
class FaultedTensor:
    """One row of ``FaultReport.faulted``: a tensor in faulty memory."""

    name: str
    kind: str
    shape: tuple[int, ...]
    format: str
    faults: int  # faulty bits of its map now (activations: per sample; -1 before a forward)
    also: tuple[str, ...] = ()  # the other names of a tied tensor (one memory, one map)


@dataclass(frozen=True)
class FaultReport:
    """Every tensor a handle faults and every tensor of the model it left out, and why."""

    faulted: list[FaultedTensor]
    left_out: list[Any] = field(default_factory=list)  # bitfault.torch.targets.LeftOut
    naming: dict[str, str] = field(default_factory=dict)

    @property
    def n_elements(self) -> int:
        """Elements of the faulted stored tensors (a tied tensor counted once)."""
        return sum(int(np.prod(t.shape)) for t in self.faulted if t.kind != "activations")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"faulted": [asdict(t) for t in self.faulted],
                "left_out": [asdict(t) for t in self.left_out], "naming": dict(self.naming)}

    def __str__(self) -> str:
        lines = [f"faulted: {len(self.faulted)} tensors, {self.n_elements} elements"]
        for t in self.faulted:
            tied = f"  (tied: also {', '.join(t.also)})" if t.also else ""
            faults = "per forward" if t.faults < 0 else f"{t.faults} faulty bits"
            lines.append(f"  {t.name}  {t.kind}  {list(t.shape)}  {t.format}  {faults}{tied}")
        lines.append(f"left out: {len(self.left_out)} tensors")
        lines += [f"  {t.name}  {list(t.shape)}  {t.dtype}: {t.reason}" for t in self.left_out]
        return "\n".join(lines)


def fault_report(fmt: str, params: list[FaultedParam], aliases: dict[tuple[str, str], str],
                 maps: dict[str, FaultMap], activations: Any, left_out: list[Any],
                 naming: dict[str, str]) -> FaultReport:
    """The report of a handle faulting ``params`` (tied ones: ``aliases``) and the
    ``activations`` named so, with ``maps`` in use (an activation's once it has a shape)."""
    tied: dict[str, list[str]] = {}
    for (fqn, attr), name in aliases.items():
        tied.setdefault(name, []).append(join_name(fqn, attr))
    rows = [FaultedTensor(p.name, "buffers" if p.buffer else
                          ("biases" if p.attr.endswith("bias") else "weights"), p.shape,
                          fmt, maps[p.name].n_faults, tuple(tied.get(p.name, ())))
            for p in params]
    rows += [FaultedTensor(n, "activations", maps[n].shape, fmt, maps[n].n_faults) if n in
             maps else FaultedTensor(n, "activations", (), fmt, -1) for n in activations]
    return FaultReport(rows, left_out, naming)


__all__ = ["FaultReport", "FaultedParam", "FaultedTensor", "batch_map", "fault_report", "held",
           "join_name", "original_forward"]
