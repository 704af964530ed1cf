"""``FaultHandle``: the faults ``inject_`` put into a model; steer them, read them, remove them.

The handle holds the maps and their device form, and runs the forward-time machinery
``inject_`` installs (see its module): the model's pre-hook computes the
faulty parameters through ``bitfault.torch.seam`` and shadows them, its forward hook takes
them away; activation hooks fault module outputs.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from bitfault.formats import gradient_bounds
from bitfault.inject import InjectionStats, inject_with_stats
from bitfault.maps import FaultMap
from bitfault.spec import FaultSpec
from bitfault.torch.activation_maps import ActivationMaps
from bitfault.torch.gradient import straight_through
from bitfault.torch.hooks import DIRECT, LIVE, Attrs, bind, faulted_forward, release
from bitfault.torch.seam import DeviceFaults, check_float_dtype, faulty_group
from bitfault.torch.slots import (
    FaultedParam,
    FaultReport,
    batch_map,
    fault_report,
    held,
    join_name,
    original_forward,
)
from bitfault.torch.steady import SteadyForward, fault_params


class FaultHandle:
    """Faults injected into a model by ``inject_``; steer them, read them, ``remove()`` them.

    ``maps``: the fault map of every targeted tensor now in use (activation maps
    appear once a forward has shown their shape). ``step``: the transient step
    whose maps are in use. Use as a context manager to remove on exit.

    Transient maps with ``resample="step"`` move to the next step by themselves: a
    forward of the model after any of its parameters changed (an optimizer step, a
    manual update, a replaced tensor) uses the maps of ``step + 1``. ``attach(optimizer)``
    counts ``optimizer.step()`` calls instead; ``resample(step)`` sets the step.
    """

    def __init__(self, model: nn.Module, spec: FaultSpec, params: list[FaultedParam],
                 aliases: dict[tuple[str, str], str], activations: list[str],
                 modules: dict[str, nn.Module], maps: dict[str, FaultMap],
                 act_names: dict[str, str] | None = None, left_out: Sequence[Any] = (),
                 naming: dict[str, str] | None = None, activation_length: int | None = None,
                 project: bool = True) -> None:
        self.spec = spec
        self._project = project  # clamp trained tensors into the format's range (inject_)
        # module path -> the name of its output (relative to the naming root)
        self._act_names = {a: (act_names or {}).get(a, join_name(a, "output")) for a in activations}
        self._left_out, self._naming = list(left_out), dict(naming or {})
        self._has_buffers = any(p.buffer for p in params)
        self._model = model
        self._params = params
        self._aliases = aliases  # (module, attr) of a tied parameter -> the name it is mapped under
        self._activations = activations  # module names whose output is faulted
        self._modules = modules
        self._maps = maps
        self._act_maps = ActivationMaps(self._act_names, activation_length)
        self._step = 0
        self._forwards = 0
        # transient resample="step" without attach(): a forward after the model's parameters
        # changed (updated in place or replaced) starts the next step
        self._watched = list(model.parameters())
        self._auto_step = spec.persistence == "transient" and spec.resample == "step"
        self._weights_seen: tuple | None = None
        self._faults: dict[tuple, DeviceFaults] = {}
        self._steady: SteadyForward | bool | None = None  # False: not for this handle's maps
        self._buffers: dict = {}  # the kernels' host scratch, reused forward after forward
        # (module, attribute, tensor name) of each faulted parameter (tied ones under every name)
        self._slot_names = [(p.module, p.attr, p.name) for p in params] + [
            (fqn, attr, name) for (fqn, attr), name in aliases.items()]
        self._model_slots = [(modules[fqn], attr, name) for fqn, attr, name in self._slot_names]
        self._model_params = [(modules[p.module], p.attr) for p in params]
        self._shadowed: list[tuple[nn.Module, str, str]] = []  # installed for this forward
        self._depth = 0
        self._hooks: list[Any] = []
        self._optimizer_hooks: list[Any] = []
        self._removed = False
        self.track_activation_stats = False
        self._act_stats: dict[str, InjectionStats] = {}

    # ---- public surface -----------------------------------------------------------------

    @property
    def maps(self) -> dict[str, FaultMap]:
        """Tensor name -> the FaultMap in use (activations: one sample's map, latest shape)."""
        return {**self._maps, **self._act_maps.latest()}

    @property
    def targets(self) -> list[str]:
        """Names of the faulted tensors: ``"<module>.weight"``, ``".bias"``, ``".output"``."""
        return [p.name for p in self._params] + [self._act_names[a] for a in self._activations]

    @property
    def step(self) -> int:
        """The step whose transient maps are in use (0 for permanent maps)."""
        return self._step

    @property
    def n_faults(self) -> int:
        """Faulty bits in the maps in use (activation maps: per sample)."""
        return sum(m.n_faults for m in self.maps.values())

    def report(self) -> FaultReport:
        """Every tensor faulted (name, kind, shape, format, faulty bits, tied names) and every
        tensor of the model left out, with the reason (``print(handle.report())``)."""
        return fault_report(repr(self.spec.format), self._params, self._aliases, self.maps,
                            self._act_names.values(), self._left_out, self._naming)

    def resample(self, step: int) -> FaultHandle:
        """Use the transient maps of ``step``, drawn from (seed, tensor name, step): replayable."""
        self._check_live()
        if self.spec.persistence != "transient":
            raise ValueError("resample(step) needs a spec with persistence='transient'; this "
                             "spec's maps are permanent")
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        self._set_maps(self.spec, int(step))
        self._forwards = int(step)
        self._weights_seen = self._weights_state()
        return self

    def set_ber(self, ber: float) -> FaultHandle:
        """Switch every map to bit error rate ``ber`` (same seed: a higher rate only adds)."""
        self._check_live()
        if self.spec.maps is not None:
            raise ValueError("set_ber needs a spec with ber= or count=; this spec has explicit "
                             "maps=")
        self._set_maps(self.spec.replace(ber=ber), self._step)
        return self

    def attach(self, optimizer: torch.optim.Optimizer) -> FaultHandle:
        """Resample transient maps after every ``optimizer.step()`` (step k+1 follows step k)."""
        self._check_live()
        if self.spec.persistence != "transient" or self.spec.resample != "step":
            raise ValueError("attach(optimizer) draws new maps every optimizer step; it needs "
                             "persistence='transient' and resample='step', this spec has "
                             f"persistence={self.spec.persistence!r}, "
                             f"resample={self.spec.resample!r}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        self._optimizer_hooks.append(optimizer.register_step_post_hook(
            lambda opt, args, kwargs: self.resample(self._step + 1)))
        self._auto_step = False  # the optimizer counts the steps now
        return self

    def stats(self) -> dict[str, InjectionStats]:
        """What the faults do now: per weight/bias from the current clean values (exact, on the
        host); per activation from its latest call when ``track_activation_stats`` is on."""
        out = {}
        for p in self._params:
            t = self._param_tensor(self._model, p).detach()
            arr = t.float().cpu().numpy() if t.dtype == torch.bfloat16 else t.cpu().numpy()
            out[p.name] = inject_with_stats(arr, self.spec.format, self.spec.fault,
                                            self._maps[p.name])[1]
        out.update(self._act_stats)
        return out

    def install(self, model: nn.Module, chosen: list[tuple[str, nn.Module]],
                by_module: dict[str, list[tuple[str, str]]]) -> None:
        """Put ``inject_``'s hooks on ``model``, and an instance ``forward`` on each ``chosen``
        module holding a faulted tensor (``by_module``: its (attribute, tensor name) pairs)."""
        self._hooks.append(model.register_forward_pre_hook(bind(self._root_pre), prepend=True))
        for fqn, module in chosen:
            attrs = tuple(by_module.get(fqn, ()))
            if attrs:  # called on its own, the module faults its parameters itself
                DIRECT[module] = (self, fqn, attrs)
                if "forward" in module.__dict__:  # an instance's own forward, kept for remove()
                    module.__dict__["_bitfault_forward"] = module.__dict__["forward"]
                module.forward = types.MethodType(faulted_forward, module)
            if fqn in self._activations:
                self._hooks.append(module.register_forward_hook(
                    bind(self._module_post, fqn), always_call=True))
            if attrs or fqn in self._activations:
                LIVE[module] = self
        self._hooks.append(model.register_forward_hook(bind(self._root_post), always_call=True))
        if self._auto_step and not self._watched:
            warnings.warn("inject_: a transient spec with resample='step' on a model without "
                          "parameters: no update can mark the end of a step, so the maps of "
                          "step 0 stay; call handle.resample(step) before each step or use "
                          "resample='forward'", UserWarning, stacklevel=3)

    @property
    def removed(self) -> bool:
        """Whether ``remove()`` has taken the faults off."""
        return self._removed

    def remove(self) -> None:
        """Take every hook off; the modules are exactly as before ``inject_`` (idempotent)."""
        if self._removed:
            return
        for h in self._hooks + self._optimizer_hooks:
            h.remove()
        self._hooks.clear()
        self._optimizer_hooks.clear()
        for module in self._modules.values():
            for attr in ("weight", "bias", *(n for n, _ in module.named_parameters(recurse=False)),
                         *(n for n, _ in module.named_buffers(recurse=False))):
                if isinstance(module.__dict__.get(attr), torch.Tensor):
                    del module.__dict__[attr]
            release(module, self)
        self._shadowed = []
        self._faults.clear()
        self._steady = None
        self._buffers.clear()
        self._removed = True

    def __enter__(self) -> FaultHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "removed" if self._removed else f"step={self._step}"
        return (f"FaultHandle({len(self.targets)} tensors, {self.n_faults} faulty bits, "
                f"{self.spec.persistence}, gradient={self.spec.gradient!r}, {state})")

    # ---- maps and device data ---------------------------------------------------------------

    def _weights_state(self) -> tuple:
        """What changes when a parameter is updated in place (its version) or replaced."""
        return tuple((p._version, p.data_ptr()) for p in self._watched)

    def _next_step_if_updated(self) -> None:
        state = self._weights_state()
        if self._weights_seen is None:
            self._weights_seen = state  # the first forward: step 0
        elif state != self._weights_seen:
            self.resample(self._step + 1)

    def _check_live(self) -> None:
        if self._removed:
            raise RuntimeError("this FaultHandle was removed; inject_ again to fault the model")

    def _set_maps(self, spec: FaultSpec, step: int) -> None:
        """Use ``spec``'s maps of ``step``; activation maps follow at the next forward."""
        self._maps = {p.name: spec.map_for(p.name, p.shape, step) for p in self._params}
        self.spec, self._step = spec, step
        self._act_maps.clear()
        self._faults.clear()
        self._steady = None

    def _device_faults(self, names: tuple[str, ...], maps: Sequence[FaultMap], batch: int,
                       device: torch.device) -> DeviceFaults:
        key = (names, batch, device, tuple(m.shape for m in maps))
        faults = self._faults.get(key)
        if faults is None:
            if len(self._faults) > 64:  # batch sizes and devices come and go
                self._faults.clear()
            if batch:
                maps = [batch_map(maps[0], batch)]
            faults = DeviceFaults.of(maps, self.spec.format, self.spec.fault, device)
            self._faults[key] = faults
        return faults

    def _activation_map(self, module: str, shape: tuple[int, ...]) -> FaultMap:
        return self._act_maps.get(module, shape, self.spec, self._step)

    # ---- forward-time machinery ----------------------------------------------------------------

    def _param_tensor(self, root: nn.Module, p: FaultedParam) -> torch.Tensor:
        return held(self._param_module(root, p), p.attr)

    def _fault_params(self, params: Sequence[FaultedParam], tensors: Sequence[torch.Tensor],
                      reuse_output: bool = False) -> dict[str, torch.Tensor]:
        return fault_params(self, params, tensors, reuse_output)

    def _param_module(self, root: nn.Module, p: FaultedParam) -> nn.Module:
        return self._modules[p.module] if root is self._model else root.get_submodule(p.module)

    def _slots(self, root: nn.Module) -> list[tuple[nn.Module, str, str]]:
        """(module, attribute, tensor name) of every faulted parameter of ``root``'s modules."""
        if root is self._model:
            return self._model_slots
        return [(root.get_submodule(fqn), attr, name) for fqn, attr, name in self._slot_names]

    def _root_pre(self, root: nn.Module, args: Any) -> None:
        if self._removed:  # hooks that a deepcopy of the model carried along
            return
        if self._depth == 0:
            steady = self._steady
            if root is not self._model or not steady or not steady.run(self):
                self._forward_pre(root)
                if root is self._model and steady is not False:  # bind it (again)
                    self._steady = SteadyForward.of(self) or False
        self._depth += 1

    def _forward_pre(self, root: nn.Module) -> None:
        """Shadow the faulted parameters of ``root``'s modules for a forward of ``root``."""
        if self.spec.persistence == "transient" and self.spec.resample == "forward":
            if self._forwards != self._step:
                self._set_maps(self.spec, self._forwards)
            self._forwards += 1
        elif self._auto_step:
            self._next_step_if_updated()
        params = self._params
        if self._has_buffers:  # a module in training mode updates its buffers itself
            params = [p for p in params if not (p.buffer and self._param_module(
                root, p).training)]
        if params:
            tensors = ([held(m, a) for m, a in self._model_params]
                       if params is self._params and root is self._model
                       else [self._param_tensor(root, p) for p in params])
            faulty = self._fault_params(params, tensors, reuse_output=True)
            slots = [s for s in self._slots(root) if s[2] in faulty]
            for module, attr, name in slots:  # seen before _parameters by module.attr
                module.__dict__[attr] = faulty[name]
            self._shadowed = slots

    def _root_post(self, root: nn.Module, args: Any, output: Any) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth == 0:
            for module, attr, _ in self._shadowed:
                module.__dict__.pop(attr, None)
            self._shadowed = []

    @torch.compiler.disable
    def call_alone(self, fqn: str, attrs: Attrs, module: nn.Module, args: tuple,
                   kwargs: dict) -> Any:
        """A module called on its own, outside a forward of the model: its tensors faulted for
        this call only (inside one, the model's pre-hook has already shadowed them)."""
        shadows = module.__dict__
        missing = [(attr, name) for attr, name in attrs if attr not in shadows and not (
            module.training and attr in module._buffers)]  # training: it updates its buffers
        if not missing:
            return original_forward(module)(*args, **kwargs)
        params = [FaultedParam(name, fqn, attr, ()) for attr, name in missing]
        faulty = self._fault_params(params, [held(module, attr) for attr, _ in missing])
        try:
            for attr, name in missing:
                shadows[attr] = faulty[name]
            return original_forward(module)(*args, **kwargs)
        finally:
            for attr, _ in missing:
                shadows.pop(attr, None)

    def _module_post(self, fqn: str, module: nn.Module, args: Any, output: Any) -> Any:
        if output is None or self._removed:
            return None
        return self._fault_activation(fqn, output)

    def _fault_activation(self, fqn: str, output: Any) -> torch.Tensor:
        name = self._act_names[fqn]
        if not isinstance(output, torch.Tensor):
            raise TypeError(f"activations: module {fqn!r} returned {type(output).__name__}, not a "
                            "tensor; leave it out with filter_fn or target weights/biases only")
        check_float_dtype(output.dtype, f"activations: the output of {fqn!r}")
        if output.ndim < 1:
            raise ValueError(f"activations: the output of {fqn!r} is a scalar; an activation map "
                             "covers one sample, output.shape[1:]")
        fmap = self._activation_map(fqn, tuple(output.shape[1:]))
        faults = self._device_faults((name,), [fmap], int(output.shape[0]), output.device)
        spec = self.spec
        with torch.no_grad():
            (faulty,) = faulty_group([output.detach()], spec.format, spec.fault, faults,
                                     buffers=self._buffers)
        if self.track_activation_stats:
            arr = output.detach().float().cpu().numpy() if output.dtype == torch.bfloat16 \
                else output.detach().cpu().numpy()
            self._act_stats[name] = inject_with_stats(arr, spec.format, spec.fault,
                                                      batch_map(fmap, int(output.shape[0])))[1]
        return straight_through([output], [faulty], spec.gradient == "blocked",
                        bounds=gradient_bounds(spec.format))[0]


__all__ = ["FaultHandle", "FaultReport", "FaultedParam", "batch_map", "held", "join_name",
           "original_forward"]
