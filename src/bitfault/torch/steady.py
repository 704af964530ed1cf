"""The faulty parameters of one forward of a model ``inject_`` faults: the general path
(``fault_params``), and its steady state in a training loop (``SteadyForward``).

Between two optimizer steps of a model with permanent maps nothing a forward depends on
changes but the clean values: the same parameters (same memory, shape, dtype), the same
maps, the same compiled kernels. ``SteadyForward`` binds all of that once, checks at each
forward that it still holds (a few attribute reads per tensor), and runs the compiled
kernels straight on the parameters' memory. A check that fails sends the forward back
through ``fault_params``; values the format cannot store take ``fault_params``' own
course (``finish``). Both give the same tensors, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from bitfault.torch import seam
from bitfault.torch.gradient import straight_through
from bitfault.torch.seam import checked_group, checked_pass, faulty_group
from bitfault.torch.slots import FaultedParam, held
from bitfault.torch.storable import settle, storable_bounds


def finish(handle: Any, names: Sequence[str], clean: Sequence[torch.Tensor],
           values: Sequence[torch.Tensor], computed: list, bad: list[int], faults: Any,
           reuse_output: bool) -> list[torch.Tensor]:
    """The faulty tensors of ``clean`` wired for autograd, from the kernels' output
    (``computed``: a one-item list, emptied here so that a kept output can be written
    again) and the positions ``bad`` they found unstorable: NaN or inf raise, values outside
    the range are projected where trained, then computed again (``storable.settle``)."""
    spec = handle.spec
    if bad:
        fixed, bad = settle(names, clean, values, bad, spec.format, handle._project)
        if fixed:
            if handle._auto_step:  # a projection is no optimizer step
                handle._weights_seen = handle._weights_state()
            computed.clear()  # the kept output may be written again
            computed.append(faulty_group(values, spec.format, spec.fault, faults,
                                         buffers=handle._buffers, reuse_output=reuse_output))
    return straight_through(clean, computed.pop(), spec.gradient == "blocked",
                            kept=reuse_output, bounds=storable_bounds(spec.format,
                                                                      clean[0].dtype),
                            only=bad)


def fault_params(handle: Any, params: Sequence[FaultedParam], tensors: Sequence[torch.Tensor],
                 reuse_output: bool = False) -> dict[str, torch.Tensor]:
    """Tensor name -> the faulty value of each of ``tensors`` (the clean ``params``) under
    ``handle``'s maps, wired for autograd: one pass per dtype and device."""
    first = tensors[0]
    dtype, cpu = first.dtype, first.is_cpu  # (``is_cpu`` is cheaper than ``device``)
    if all(t.dtype is dtype and t.is_cpu is cpu for t in tensors) and (
            cpu or all(t.device == first.device for t in tensors)):
        groups = {(dtype, first.device): range(len(tensors))}  # the usual case: one pass
    else:
        groups = {}
        for i, t in enumerate(tensors):
            groups.setdefault((t.dtype, t.device), []).append(i)
    out: dict[str, torch.Tensor] = {}
    spec = handle.spec
    for (_, device), members in groups.items():
        names = tuple(params[i].name for i in members)
        faults = handle._device_faults(names, [handle._maps[n] for n in names], 0, device)
        clean = [tensors[i] for i in members]
        values = [c.detach() for c in clean]  # (no graph: no_grad is not needed)
        faulty, bad = checked_group(values, spec.format, spec.fault, faults,
                                    buffers=handle._buffers, reuse_output=reuse_output)
        computed = [faulty]
        del faulty
        out.update(zip(names, finish(handle, names, clean, values, computed, bad, faults,
                                     reuse_output), strict=True))
    return out


class SteadyForward:
    """The forward-time work of a handle with permanent maps on its own model, bound once:
    ``run(handle)`` shadows every faulted parameter, or returns False (nothing done) when
    what it was bound to has changed; ``of(handle)`` binds it, or None where it does not
    apply (buffers, transient maps, gradient "blocked", tensors the compiled CPU kernels
    do not compute)."""

    def __init__(self, handle: Any, tensors: list[nn.Parameter], faults: Any,
                 fused: Any) -> None:
        self.names = tuple(p.name for p in handle._params)
        self.tensors = tensors
        self.values = [t.detach() for t in tensors]
        # (the module's parameters, attribute, tensor, an alias of its memory as bound)
        self.held = [(m._parameters, a, t, v)
                     for (m, a), t, v in zip(handle._model_params, tensors, self.values,
                                             strict=True)]
        self.flats = [v.numpy().reshape(-1) for v in self.values]
        position = {name: i for i, name in enumerate(self.names)}
        self.slots = [(module.__dict__, attr, position[name])
                      for module, attr, name in handle._model_slots]
        self.shadowed = list(handle._model_slots)
        self.faults, self.fused = faults, fused

    @classmethod
    def of(cls, handle: Any) -> SteadyForward | None:
        spec = handle.spec
        if handle._has_buffers or spec.persistence != "permanent" or \
                spec.gradient != "ste" or not handle._params:
            return None
        tensors = [held(m, a) for m, a in handle._model_params]
        if not all(isinstance(t, nn.Parameter) and t.dtype is torch.float32 and t.is_cpu and
                   t.is_contiguous() for t in tensors):
            return None
        names = tuple(p.name for p in handle._params)
        faults = handle._device_faults(names, [handle._maps[n] for n in names], 0,
                                       tensors[0].device)
        fused = checked_pass([t.detach() for t in tensors], spec.format, spec.fault, faults)
        if fused is None:
            return None
        steady = cls(handle, tensors, faults, fused)
        if any(f.ctypes.data != t.data_ptr() for f, t in zip(steady.flats, tensors,
                                                              strict=True)):
            return None  # (not the tensors' own memory)
        return steady

    def _holds(self) -> bool:
        """Whether every parameter is the one bound, in the same memory (storage, offset,
        shape and strides) and dtype, and the compiled kernels are still on."""
        for params, attr, t, alias in self.held:
            if params.get(attr) is not t or t.dtype is not torch.float32 or \
                    not t.is_set_to(alias):
                return False
        return seam.numba_available()  # (looked up here: a test may switch it off)

    def run(self, handle: Any) -> bool:
        """Shadow the faulted parameters for one forward of the model (as ``fault_params``
        and the model's pre-hook would); False, with nothing done, where it cannot."""
        if not self._holds():
            return False
        views, bad = self.fused.run(self.flats, True, True)
        if bad:
            computed = [views]
            del views
            faulty = finish(handle, self.names, self.tensors, self.values, computed, bad,
                            self.faults, True)
        else:
            grad = torch.is_grad_enabled()
            faulty = []
            for t, f in zip(self.tensors, views, strict=True):
                if grad and t.requires_grad:  # as ``straight_through``
                    view = t.view_as(t)
                    view.data = f
                    f = view
                faulty.append(f)
        for shadows, attr, i in self.slots:
            shadows[attr] = faulty[i]
        handle._shadowed = list(self.shadowed)
        return True
