"""``inject_``: put a model's tensors in faulty memory, in place; ``FaultHandle`` (in
``bitfault.torch.handle``) steers and removes them.

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
(``blocked``; ``bitfault.torch.gradient``). ``remove()`` takes all of it off again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from bitfault.errors import ArgumentError, ArgumentTypeError, check_int
from bitfault.formats import BlockFormat, plane_formats, plane_map_name
from bitfault.formats.blocks import CODES
from bitfault.memory.memory import check_map_fits
from bitfault.spec import FaultSpec
from bitfault.torch.handle import FaultedParam, FaultHandle
from bitfault.torch.hooks import LIVE
from bitfault.torch.seam import check_float_dtype
from bitfault.torch.storable import refuse_non_finite
from bitfault.torch.targets import FilterFn, Naming, Selected, select_modules, select_report


def _plan(spec: FaultSpec, selected: list[Selected]
          ) -> tuple[list[FaultedParam], dict[tuple[str, str], str], dict[str, str]]:
    params: list[FaultedParam] = []
    aliases: dict[tuple[str, str], str] = {}  # a tied parameter is one memory: one map
    activations: dict[str, str] = {}  # module path -> the name of its output
    for s in selected:
        if s.kind == "activations":
            activations[s.module] = s.name
            continue
        check_float_dtype(s.tensor.dtype, f"parameter {s.name!r}")
        params.append(FaultedParam(s.name, s.module, s.attr, tuple(s.tensor.shape),
                                   s.kind == "buffers"))
        for place in s.also:
            aliases[place] = s.name
    return params, aliases, activations


def inject_(model: nn.Module, spec: FaultSpec | Mapping[str, Any],
            filter_fn: FilterFn | str | Sequence[str] | None = None, *,
            root: nn.Module | None = None, name_prefix: str | None = None,
            activation_length: int | None = None, project: bool = True) -> FaultHandle:
    """Put ``model``'s tensors in faulty memory, in place; return the handle.

    ``spec.targets`` and ``filter_fn`` choose the tensors as ``select_tensors`` says: by
    default every float weight matrix the model computes with (whatever module holds it),
    the biases beside them, and with kind "buffers" its persistent float buffers;
    ``filter_fn(module, fully_qualified_name) -> bool`` (or glob patterns on module
    names) chooses modules instead. ``handle.report()`` lists what is faulted and what
    was left out, and why. Maps are seeded by tensor name: ``root=`` (a submodule) names
    tensors relative to it and faults only its tensors, ``name_prefix=`` strips a prefix,
    so wrapping a model keeps its chips. ``activation_length=L``: activations sit at
    fixed addresses, a buffer of ``L`` rows per sample (a text model's positions), so a
    position's faults do not depend on the length its batch was padded to (default: each
    per-sample shape draws its own map; ``bitfault.torch.activation_maps``). Every argument
    is checked, and every map drawn, before the model is touched.

    The clean tensors stay storable under any training loop and optimizer: ``project=True``
    (the default) clamps a tensor that a forward trains (grad enabled, the tensor requires
    grad) into the format's ``range`` (FixedPoint; the Float formats' largest finite value),
    in place, before that forward, whenever the check that comes with computing the faulty
    values finds one outside; forwards without gradients never change the model.
    ``project=False`` leaves such values where they are (they saturate when stored, and
    their gradient is zero). A NaN or inf in a faulted weight, bias or buffer is refused,
    naming the tensor and the first such index: here, and at any later forward.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    spec = FaultSpec.coerce(spec)
    naming = Naming.of(model, root, name_prefix)
    chosen = select_modules(model, spec.targets, filter_fn)
    if not chosen:
        kinds = sorted({type(m).__name__ for m in model.modules()})
        raise ValueError(f"filter_fn matched no module of the model (its module types: {kinds}); "
                         "the default chooses every module holding a float weight matrix")
    selected, left_out = select_report(model, spec.targets, filter_fn, modules=chosen,
                                       naming=naming)
    params, aliases, activations = _plan(spec, selected)
    if not isinstance(project, bool):
        raise ArgumentTypeError("project", project, "True or False")
    for s in selected:
        if s.kind != "activations":
            refuse_non_finite(s.tensor, s.name)
    if activation_length is not None and not activations:
        raise ArgumentError("activation_length", activation_length,
                            "None when no activation is targeted",
                            requirement="activation_length places activation maps; the "
                                        "targets choose no activation (add kind "
                                        "'activations')")
    if activation_length is not None:
        check_int(activation_length, "activation_length", 1)
    if not params and not activations:
        raise ValueError(f"targets={list(spec.targets.kinds)} name no tensor of the chosen "
                         f"modules {[f for f, _ in chosen][:8]}: they have no parameter of "
                         "those kinds (weights: *weight, biases: *bias) that the targets' "
                         "patterns keep")
    # the modules that hold a faulted tensor (a tied one in every module that uses it)
    used = {s.module for s in selected} | {f for f, _ in aliases}
    chosen = [(f, m) for f, m in model.named_modules() if f in used]
    if activations and isinstance(spec.format, BlockFormat) and spec.format.axis >= 0:
        raise ArgumentError("format.axis", spec.format.axis, "a negative axis for activation "
                            "targets", requirement=(
                                f"activations: an activation map covers one sample, so the "
                                f"blocks of {type(spec.format).__name__} must run along an axis "
                                f"counted from the end (axis={spec.format.axis} names another "
                                f"axis once the batch axis comes first); use a negative axis, "
                                f"such as -1"))
    for fqn, module in chosen:
        if module in LIVE:
            raise ValueError(f"module {fqn or '<model>'!r} already has faults injected; "
                             "remove() that handle first")
    known = {p.name: p for p in params}
    known_acts = set(activations.values())
    if spec.maps is not None:
        planes = [p for p in plane_formats(spec.format) if p != CODES]
        own = {plane_map_name(t, p) for t in (*known, *known_acts) for p in planes}
        unknown = sorted(set(spec.maps) - set(known) - known_acts - own)
        if unknown:
            raise ValueError(f"maps names tensor(s) {unknown} that this injection does not "
                             f"fault; its tensors are {sorted(set(known) | known_acts)}")
    for p in params:
        if hasattr(spec.format, "reduce_axes"):
            spec.format.reduce_axes(len(p.shape))  # per_channel axis must exist
    maps = {}
    for p in params:
        fmap = spec.map_for(p.name, p.shape, 0)
        check_map_fits(fmap, p.shape, spec.format, argument=f"maps[{p.name!r}]")
        maps[p.name] = fmap
    # ---- from here on the model is changed (hooks only) ----
    modules = dict(chosen)
    handle = FaultHandle(model, spec, params, aliases, list(activations), modules, maps,
                         act_names=activations, left_out=left_out, naming=naming.to_dict(),
                         activation_length=activation_length, project=project)
    by_module: dict[str, list[tuple[str, str]]] = {}
    for p in params:
        by_module.setdefault(p.module, []).append((p.attr, p.name))
    for (fqn, attr), name in aliases.items():
        by_module.setdefault(fqn, []).append((attr, name))
    handle.install(model, chosen, by_module)
    return handle

