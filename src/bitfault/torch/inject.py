"""``inject_``: put a model's tensors in faulty memory, in place; the handle that steers it.

How it works: hooks, and a ``forward`` on each chosen module instance. A
forward pre-hook on the model computes the faulty value of every targeted
parameter once per forward pass (one flat pass per dtype and device where the
format allows) and shadows each module's ``weight``/``bias`` with it (an
instance attribute, found before ``nn.Module.__getattr__`` looks in
``_parameters``); the model's forward hook takes the shadows away again. A
chosen module called on its own (outside a forward of the model) shadows its
parameters for that call through its instance ``forward``, which otherwise just
calls the class's. Activations are faulted by forward hooks on their modules.
Parameters, ``state_dict()`` and optimizers only ever see the clean tensors.
Gradients pass straight through the fault (``ste``: the faulty tensor is an
identity view of the clean one whose memory holds the faulty values, so
autograd's own view backward hands the gradient on; zero where the clean value
lies outside what the format stores, ``gradient_bounds``) or not at all
(``blocked``). ``remove()`` takes all of it off again.
"""

from __future__ import annotations

import fnmatch
import types
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from bitfault.formats import gradient_bounds
from bitfault.inject import InjectionStats, inject_with_stats
from bitfault.maps import FaultMap
from bitfault.memory import check_map_fits
from bitfault.spec import FaultSpec
from bitfault.torch.seam import DeviceFaults, check_float_dtype, faulty_group

DEFAULT_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Embedding)

FilterFn = Callable[[nn.Module, str], bool]

_Attrs = tuple[tuple[str, str], ...]  # (attribute, tensor name) of a module's faulted parameters
# module -> the live handle that injects into it (one handle per module)
_LIVE: weakref.WeakKeyDictionary[nn.Module, FaultHandle] = weakref.WeakKeyDictionary()
# module -> (handle, its name, (attribute, tensor name) of each faulted parameter): what its
# overridden forward needs when it is called on its own
_DIRECT: weakref.WeakKeyDictionary[nn.Module, tuple[FaultHandle, str, _Attrs]] = \
    weakref.WeakKeyDictionary()


class _StraightThrough(torch.autograd.Function):
    """Forward: the faulty tensors (fresh, computed without autograd). Backward: their
    gradients go to the clean tensors as they are ("ste"), or nowhere ("blocked", the
    seed program's ``stop_gradient``)."""

    @staticmethod
    def forward(ctx: Any, faulty: list[torch.Tensor], blocked: bool,
                *clean: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.blocked = blocked
        return tuple(faulty)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        if ctx.blocked:
            return (None, None, *(None for _ in grads))
        return (None, None, *grads)


def _zero_outside(clean: torch.Tensor, bounds: tuple[float, float]
                  ) -> Callable[[torch.Tensor], torch.Tensor]:
    """A gradient hook: the gradient where ``clean`` lies in ``bounds``, exactly 0 elsewhere."""
    lo, hi = bounds
    values = clean.detach()

    def hook(grad: torch.Tensor) -> torch.Tensor:
        return torch.where((values >= lo) & (values <= hi), grad, grad.new_zeros(()))

    return hook


def _through(clean: Sequence[torch.Tensor], faulty: Sequence[torch.Tensor],
             blocked: bool, kept: bool = False,
             bounds: tuple[float, float] | None = None) -> list[torch.Tensor]:
    """``faulty`` wired into autograd as functions of ``clean`` (when grad is on and needed).

    ``kept``: the faulty tensors are views the kernel keeps and writes again later; only
    fresh aliases of them are handed out (so their memory's use count shows who holds it).
    ``bounds``: the gradient is zero where a clean value lies outside (``gradient_bounds``).
    """
    if not faulty:
        return []
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in clean)
    if not grad or blocked:
        faulty = [f.detach() for f in faulty] if kept else list(faulty)
        return list(_StraightThrough.apply(faulty, True, *clean)) if grad else faulty
    out = []
    for c, f in zip(clean, faulty, strict=True):
        if c.requires_grad:  # an identity view of the clean tensor that holds the faulty values:
            view = c.view_as(c)  # autograd's own (C++) identity backward, and the gradient
            view.data = f  # reaches the clean tensor untouched (no Python node, no copy)
            if bounds is not None:  # ... but for values the format cannot store
                view.register_hook(_zero_outside(c, bounds))
            f = view
        elif kept:
            f = f.detach()
        out.append(f)
    return out


def batch_map(fmap: FaultMap, batch: int) -> FaultMap:
    """The map of a whole batch of activations: ``fmap`` (one sample) repeated ``batch`` times.

    ``inject(output, fmt, fault, batch_map(m, len(output)))`` is exactly what an
    activation target does to a module's output.
    """
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 0:
        raise ValueError(f"batch must be a non-negative integer, got {batch!r}")
    size = fmap.size
    idx = (np.arange(batch, dtype=np.int64)[:, None] * size + fmap.indices[None, :]).reshape(-1)
    return FaultMap((batch, *fmap.shape), idx, np.tile(fmap.masks, batch), fmap.name,
                    {**fmap.meta, "batch": batch})


def _join(module: str, leaf: str) -> str:
    """A tensor name in PyTorch's style: ``"fc1.weight"``, or ``"weight"`` on the model itself."""
    return f"{module}.{leaf}" if module else leaf


@dataclass(frozen=True)
class _Param:
    name: str  # "fc1.weight"
    module: str  # "fc1"
    attr: str  # "weight"
    shape: tuple[int, ...]


def _as_filter(filter_fn: Any) -> FilterFn:
    if filter_fn is None:
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


def _selected_params(module: nn.Module, targets: Sequence[str]) -> list[tuple[str, nn.Parameter]]:
    """The module's own parameters that the targets name: ``*weight`` and ``*bias``."""
    out = []
    for pname, p in module.named_parameters(recurse=False):
        if ("weights" in targets and pname.endswith("weight")) or (
                "biases" in targets and pname.endswith("bias")):
            out.append((pname, p))
    return out


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

    def __init__(self, model: nn.Module, spec: FaultSpec, params: list[_Param],
                 aliases: dict[tuple[str, str], str], activations: list[str],
                 modules: dict[str, nn.Module], maps: dict[str, FaultMap]) -> None:
        self.spec = spec
        self._model = model
        self._params = params
        self._aliases = aliases  # (module, attr) of a tied parameter -> the name it is mapped under
        self._activations = activations  # module names whose output is faulted
        self._modules = modules
        self._maps = maps
        self._act_maps: dict[str, dict[tuple[int, ...], FaultMap]] = {a: {} for a in activations}
        self._step = 0
        self._forwards = 0
        # transient resample="step" without attach(): a forward after the model's parameters
        # changed (updated in place or replaced) starts the next step
        self._watched = list(model.parameters())
        self._auto_step = spec.persistence == "transient" and spec.resample == "step"
        self._weights_seen: tuple | None = None
        self._faults: dict[tuple, DeviceFaults] = {}
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
        out = dict(self._maps)
        for module, by_shape in self._act_maps.items():
            if by_shape:
                out[_join(module, "output")] = next(reversed(by_shape.values()))
        return out

    @property
    def targets(self) -> list[str]:
        """Names of the faulted tensors: ``"<module>.weight"``, ``".bias"``, ``".output"``."""
        return [p.name for p in self._params] + [_join(a, "output") for a in self._activations]

    @property
    def step(self) -> int:
        """The step whose transient maps are in use (0 for permanent maps)."""
        return self._step

    @property
    def n_faults(self) -> int:
        """Faulty bits in the maps in use (activation maps: per sample)."""
        return sum(m.n_faults for m in self.maps.values())

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

    def remove(self) -> None:
        """Take every hook off; the modules are exactly as before ``inject_`` (idempotent)."""
        if self._removed:
            return
        for h in self._hooks + self._optimizer_hooks:
            h.remove()
        self._hooks.clear()
        self._optimizer_hooks.clear()
        for module in self._modules.values():
            for attr in ("weight", "bias", *(n for n, _ in module.named_parameters(recurse=False))):
                if isinstance(module.__dict__.get(attr), torch.Tensor):
                    del module.__dict__[attr]
            if _LIVE.get(module) is self:
                del _LIVE[module]
            if _DIRECT.get(module, (None,))[0] is self:
                del _DIRECT[module]
                module.__dict__.pop("forward", None)
                original = module.__dict__.pop("_bitfault_forward", None)
                if original is not None:
                    module.forward = original
        self._shadowed = []
        self._faults.clear()
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
        for by_shape in self._act_maps.values():
            by_shape.clear()
        self._faults.clear()

    def _device_faults(self, names: tuple[str, ...], maps: Sequence[FaultMap], batch: int,
                       device: torch.device) -> DeviceFaults:
        key = (names, batch, device, tuple(m.shape for m in maps))
        faults = self._faults.get(key)
        if faults is None:
            if len(self._faults) > 64:  # batch sizes and devices come and go
                self._faults.clear()
            if batch:
                maps = [batch_map(maps[0], batch)]
            faults = DeviceFaults.build(maps, self.spec.fault.eligible_mask(self.spec.format),
                                        device)
            self._faults[key] = faults
        return faults

    def _activation_map(self, module: str, shape: tuple[int, ...]) -> FaultMap:
        by_shape = self._act_maps[module]
        fmap = by_shape.get(shape)
        if fmap is None:
            name = _join(module, "output")
            fmap = self.spec.map_for(name, shape, self._step)
            check_map_fits(fmap, shape, self.spec.format, argument=f"maps[{name!r}]")
            by_shape[shape] = fmap
        return fmap

    # ---- forward-time machinery ----------------------------------------------------------------

    def _param_tensor(self, root: nn.Module, p: _Param) -> torch.Tensor:
        module = self._modules[p.module] if root is self._model else root.get_submodule(p.module)
        return module._parameters[p.attr]

    def _fault_params(self, params: Sequence[_Param], tensors: Sequence[torch.Tensor],
                      reuse_output: bool = False) -> dict[str, torch.Tensor]:
        first = tensors[0]
        kind = (first.dtype, first.device)
        if all(t.dtype == kind[0] and t.device == kind[1] for t in tensors):
            groups = {kind: range(len(tensors))}  # the usual case: one pass over all
        else:
            groups = {}
            for i, t in enumerate(tensors):
                groups.setdefault((t.dtype, t.device), []).append(i)
        out: dict[str, torch.Tensor] = {}
        spec = self.spec
        for (_, device), members in groups.items():
            names = tuple(params[i].name for i in members)
            faults = self._device_faults(names, [self._maps[n] for n in names], 0, device)
            clean = [tensors[i] for i in members]
            with torch.no_grad():
                faulty = faulty_group([c.detach() for c in clean], spec.format, spec.fault, faults,
                                      buffers=self._buffers, reuse_output=reuse_output)
            out.update(zip(names, _through(clean, faulty, spec.gradient == "blocked",
                                           kept=reuse_output,
                                           bounds=gradient_bounds(spec.format)), strict=True))
        return out

    def _slots(self, root: nn.Module) -> list[tuple[nn.Module, str, str]]:
        """(module, attribute, tensor name) of every faulted parameter of ``root``'s modules."""
        if root is self._model:
            return self._model_slots
        return [(root.get_submodule(fqn), attr, name) for fqn, attr, name in self._slot_names]

    def _root_pre(self, root: nn.Module, args: Any) -> None:
        if self._removed:  # hooks that a deepcopy of the model carried along
            return
        if self._depth == 0:
            if self.spec.persistence == "transient" and self.spec.resample == "forward":
                if self._forwards != self._step:
                    self._set_maps(self.spec, self._forwards)
                self._forwards += 1
            elif self._auto_step:
                self._next_step_if_updated()
            if self._params:
                tensors = ([m._parameters[a] for m, a in self._model_params] if root is self._model
                           else [self._param_tensor(root, p) for p in self._params])
                faulty = self._fault_params(self._params, tensors, reuse_output=True)
                slots = self._slots(root)
                for module, attr, name in slots:  # seen before _parameters by module.attr
                    module.__dict__[attr] = faulty[name]
                self._shadowed = slots
        self._depth += 1

    def _root_post(self, root: nn.Module, args: Any, output: Any) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth == 0:
            for module, attr, _ in self._shadowed:
                module.__dict__.pop(attr, None)
            self._shadowed = []

    @torch.compiler.disable
    def _direct_call(self, fqn: str, attrs: tuple[tuple[str, str], ...], module: nn.Module,
                     args: tuple, kwargs: dict) -> Any:
        """A module called on its own, outside a forward of the model: its tensors faulted for
        this call only (inside one, the model's pre-hook has already shadowed them)."""
        shadows = module.__dict__
        missing = [(attr, name) for attr, name in attrs if attr not in shadows]
        params = [_Param(name, fqn, attr, ()) for attr, name in missing]
        faulty = self._fault_params(params, [module._parameters[attr] for attr, _ in missing])
        try:
            for attr, name in missing:
                shadows[attr] = faulty[name]
            return _original_forward(module)(*args, **kwargs)
        finally:
            for attr, _ in missing:
                shadows.pop(attr, None)

    def _module_post(self, fqn: str, module: nn.Module, args: Any, output: Any) -> Any:
        if output is None or self._removed:
            return None
        return self._fault_activation(fqn, output)

    def _fault_activation(self, fqn: str, output: Any) -> torch.Tensor:
        name = _join(fqn, "output")
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
        return _through([output], [faulty], spec.gradient == "blocked",
                        bounds=gradient_bounds(spec.format))[0]


def _plan(model: nn.Module, spec: FaultSpec, chosen: list[tuple[str, nn.Module]]
          ) -> tuple[list[_Param], dict[tuple[str, str], str], list[str]]:
    params: list[_Param] = []
    aliases: dict[tuple[str, str], str] = {}
    seen: dict[int, str] = {}
    for fqn, module in chosen:
        for pname, p in _selected_params(module, spec.targets):
            name = _join(fqn, pname)
            check_float_dtype(p.dtype, f"parameter {name!r}")
            if id(p) in seen:  # a tied parameter is one memory: one map, under its first name
                aliases[(fqn, pname)] = seen[id(p)]
                continue
            seen[id(p)] = name
            params.append(_Param(name, fqn, pname, tuple(p.shape)))
    activations = [fqn for fqn, _ in chosen] if "activations" in spec.targets else []
    return params, aliases, activations


def inject_(model: nn.Module, spec: FaultSpec | Mapping[str, Any],
            filter_fn: FilterFn | str | Sequence[str] | None = None) -> FaultHandle:
    """Put ``model``'s tensors in faulty memory, in place; return the handle.

    ``filter_fn(module, fully_qualified_name) -> bool`` chooses modules (default:
    every Linear, Conv1d/2d/3d and Embedding; a glob string or list of globs
    matches module names). Of each chosen module, ``spec.targets`` picks its own
    parameters ending in ``weight`` / ``bias`` and its output (``"activations"``).
    Every argument is checked, and every map drawn, before the model is touched.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    spec = FaultSpec.coerce(spec)
    accept = _as_filter(filter_fn)
    chosen = [(fqn, m) for fqn, m in model.named_modules() if accept(m, fqn)]
    if not chosen:
        kinds = sorted({type(m).__name__ for m in model.modules()})
        raise ValueError(f"filter_fn matched no module of the model (its module types: {kinds}); "
                         "the default chooses Linear, Conv1d/2d/3d and Embedding")
    params, aliases, activations = _plan(model, spec, chosen)
    if not params and not activations:
        raise ValueError(f"targets={list(spec.targets)} name no tensor of the chosen modules "
                         f"{[f for f, _ in chosen][:8]}: they have no parameter ending in "
                         "'weight'/'bias' as targeted")
    for fqn, module in chosen:
        if module in _LIVE:
            raise ValueError(f"module {fqn or '<model>'!r} already has faults injected; "
                             "remove() that handle first")
    known = {p.name: p for p in params}
    known_acts = {_join(a, "output") for a in activations}
    if spec.maps is not None:
        unknown = sorted(set(spec.maps) - set(known) - known_acts)
        if unknown:
            raise ValueError(f"maps names tensor(s) {unknown} that this injection does not "
                             f"fault; its tensors are {sorted(set(known) | known_acts)}")
    for p in params:
        if hasattr(spec.format, "_reduce_axes"):
            spec.format._reduce_axes(len(p.shape))  # per_channel axis must exist
    maps = {}
    for p in params:
        fmap = spec.map_for(p.name, p.shape, 0)
        check_map_fits(fmap, p.shape, spec.format, argument=f"maps[{p.name!r}]")
        maps[p.name] = fmap
    # ---- from here on the model is changed (hooks only) ----
    modules = dict(chosen)
    handle = FaultHandle(model, spec, params, aliases, activations, modules, maps)
    by_module: dict[str, list[tuple[str, str]]] = {}
    for p in params:
        by_module.setdefault(p.module, []).append((p.attr, p.name))
    for (fqn, attr), name in aliases.items():
        by_module.setdefault(fqn, []).append((attr, name))
    handle._hooks.append(model.register_forward_pre_hook(_bind(handle._root_pre), prepend=True))
    for fqn, module in chosen:
        attrs = tuple(by_module.get(fqn, ()))
        if attrs:  # called on its own, the module faults its parameters itself
            _DIRECT[module] = (handle, fqn, attrs)
            if "forward" in module.__dict__:  # an instance's own forward, kept for remove()
                module.__dict__["_bitfault_forward"] = module.__dict__["forward"]
            module.forward = types.MethodType(_faulted_forward, module)
        if fqn in activations:
            handle._hooks.append(module.register_forward_hook(
                _bind(handle._module_post, fqn), always_call=True))
        if attrs or fqn in activations:
            _LIVE[module] = handle
    handle._hooks.append(model.register_forward_hook(_bind(handle._root_post), always_call=True))
    if handle._auto_step and not handle._watched:
        warnings.warn("inject_: a transient spec with resample='step' on a model without "
                      "parameters: no update can mark the end of a step, so the maps of step 0 "
                      "stay; call handle.resample(step) before each step or use "
                      "resample='forward'", UserWarning, stacklevel=2)
    return handle


def _original_forward(module: nn.Module) -> Callable[..., Any]:
    original = module.__dict__.get("_bitfault_forward")
    return original if original is not None else type(module).forward.__get__(module)


def _faulted_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A chosen module's ``forward`` while faults are injected (cheaper than a pre-hook, which
    sends every call through ``nn.Module``'s slow path): within a forward of the model its
    parameters are already shadowed; called on its own, it shadows them for the call."""
    entry = _DIRECT.get(module)
    if entry is not None and not entry[0]._removed:
        handle, fqn, attrs = entry
        for attr, _ in attrs:
            if attr not in module.__dict__:
                return handle._direct_call(fqn, attrs, module, args, kwargs)
    return _original_forward(module)(*args, **kwargs)


def _bind(fn: Callable[..., Any], *bound: Any) -> Callable[..., Any]:
    """A hook calling ``fn``: a plain function, which ``copy.deepcopy`` shares rather than
    copies, so a copied model's hooks still answer to this handle (and go inert with it).
    ``torch.compile`` runs it eagerly, between compiled graphs (it cannot trace Numba)."""
    def hook(*args: Any) -> Any:
        return fn(*bound, *args)
    return torch.compiler.disable(hook, recursive=True)
