"""``fit``: train a PyTorch model for bit-error robustness as a :class:`Recipe` says.

Stutz, Chandramoorthy, Hein, Schiele, "Bit Error Robustness for Energy-Efficient
DNN Accelerators" (MLSys 2021): quantisation-aware training, weight clipping,
random bit error training (RandBET), optionally bounded ReLUs. The quantised and
faulted tensors are the weights of Linear, Conv1d/2d/3d and Embedding modules:
exactly what ``inject_(model, FaultSpec(...))`` faults by default, so a trained
model is evaluated under faults with the same spec. Biases and norm-layer
parameters train in float. See docs/recipes.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from bitfault.errors import check_int
from bitfault.faults.models import BitFlip, FaultModel
from bitfault.formats import Format, gradient_bounds
from bitfault.maps import FaultMap
from bitfault.recipes import (
    CALIBRATION_SAMPLES,
    OPTIMIZERS,
    EpochRecord,
    Recipe,
    check_fit_settings,
    check_training_loss,
)
from bitfault.torch.gradient import straight_through
from bitfault.torch.hooks import injected
from bitfault.torch.inject import inject_
from bitfault.torch.recipes import (
    ClipHandle,
    bound_relus_,
    calibrate_relu_thresholds,
    clip_weights_,
)
from bitfault.torch.seam import DeviceFaults, faulty_group
from bitfault.torch.storable import storable_bounds
from bitfault.torch.targets import select_tensors


def stored_weights(model: nn.Module) -> dict[str, nn.Parameter]:
    """The tensors the recipes quantise and fault: ``select_tensors(model, "weights")``,
    the ``weight`` of every Linear, Conv and Embedding module, by name (a tied weight
    once, under its first name): what ``inject_`` faults for ``targets="weights"``."""
    return {s.name: s.tensor for s in select_tensors(model, "weights")}


def quantised_weights(model: nn.Module, format: Format, maps: Mapping[str, FaultMap] | None = None,
                      fault: FaultModel | None = None) -> dict[str, torch.Tensor]:
    """The weights a recipe's forward pass uses: each of ``stored_weights(model)`` encoded
    in ``format``, faulted by ``fault`` (bit flips) at ``maps[name]`` (none by default),
    decoded. Bit for bit ``bitfault.inject``; wired straight through to the float
    weights when gradients are on."""
    fault = fault or BitFlip()
    params = stored_weights(model)
    maps = maps or {}
    groups: dict[tuple, list[str]] = {}
    for name, p in params.items():
        groups.setdefault((p.dtype, p.device), []).append(name)
    out: dict[str, torch.Tensor] = {}
    for (_, device), names in groups.items():
        fmaps = [maps[n] if maps.get(n) is not None else FaultMap.empty(tuple(params[n].shape), n)
                 for n in names]
        faults = DeviceFaults.of(fmaps, format, fault, device)
        clean = [params[n] for n in names]
        with torch.no_grad():
            faulty = faulty_group([c.detach() for c in clean], format, fault, faults)
        out.update(zip(names, straight_through(clean, faulty, False,
                                               bounds=gradient_bounds(format)), strict=True))
    return out


def _loss_and_correct(out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
    return F.cross_entropy(out, y), int((out.detach().argmax(1) == y).sum())


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
          recipe: Recipe, step: int, perturb: bool | None) -> tuple[float, float, int]:
    """One optimizer step; returns (clean loss, perturbed loss or NaN, correct predictions)."""
    fmt = recipe.format
    optimizer.zero_grad(set_to_none=True)
    out = model(x) if fmt is None else functional_call(model, quantised_weights(model, fmt), (x,))
    loss_c, correct = _loss_and_correct(out, y)
    clean = float(loss_c.detach())
    rb = recipe.randbet
    on = rb is not None and (perturb if perturb is not None
                             else rb.start_below is None or clean < rb.start_below)
    perturbed = math.nan
    if on:
        spec = rb.spec(fmt)
        maps = {n: spec.map_for(n, tuple(p.shape), step) for n, p in stored_weights(model).items()}
        params = [p for p in model.parameters() if p.requires_grad]
        # copies of the buffers take the perturbed forward's updates: BN statistics stay clean
        scratch = {n: b.clone() for n, b in model.named_buffers()}
        out_p = functional_call(model, {**scratch, **quantised_weights(model, fmt, maps, rb.fault)},
                                (x,))
        loss_p = F.cross_entropy(out_p, y)
        perturbed = float(loss_p.detach())
        grads = torch.autograd.grad(loss_p, params, allow_unused=True)
        loss_c.backward()
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                if g is None:
                    continue
                if rb.grad_clamp is not None:
                    g = g.clamp(-rb.grad_clamp, rb.grad_clamp)
                p.grad = g if p.grad is None else p.grad + g
    else:
        loss_c.backward()
    optimizer.step()
    return clean, perturbed, correct


def randbet_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                 y: torch.Tensor, recipe: Recipe, step: int,
                 perturb: bool | None = None) -> tuple[float, float]:
    """One training step of ``recipe``: loss on the clean quantised weights plus, with
    ``recipe.randbet``, the loss on weights with step ``step``'s random bit errors.

    The perturbed term's gradient (clamped elementwise to ``grad_clamp`` if set) is
    added to the clean term's, both straight through to the float weights, then
    ``optimizer.step()``; ``.grad`` keeps the summed gradient. ``perturb``: True/False
    forces the perturbed term on/off; None turns it on unless ``start_below`` is set
    and this step's clean loss is not below it. Returns (clean loss, perturbed loss or
    NaN when off). BatchNorm running statistics follow the clean forward only.
    """
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a bitfault.recipes.Recipe, got {type(recipe).__name__}")
    if recipe.fault_aware is not None:
        raise ValueError("recipe: randbet_step runs format/randbet recipes; fault_aware recipes "
                         "train through inject_ (use fit)")
    if recipe.format is not None and injected(model):
        raise ValueError("model has faults injected (a live inject_ handle); remove() it first: "
                         "its hooks would replace the recipe's weights")
    clean, perturbed, _ = _step(model, optimizer, x, y, recipe, step, perturb)
    return clean, perturbed


# ---- validation ------------------------------------------------------------------------------

def _data(x: Any, y: Any, xname: str, yname: str,
          dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples (cast to the model's ``dtype``) and integer labels, checked."""
    arrays = []
    for value, name in ((x, xname), (y, yname)):
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.array(value, copy=not value.flags.writeable))
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch tensor or a numpy array, got "
                            f"{type(value).__name__}")
        arrays.append(value)
    x, y = arrays
    if not x.is_floating_point():
        raise TypeError(f"{xname} must hold floats (images), got dtype {x.dtype}")
    if y.ndim != 1 or y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"{yname} must be a 1-D array of integer class labels, got dtype "
                         f"{y.dtype} and shape {tuple(y.shape)}")
    if x.ndim < 1 or len(x) != len(y) or len(x) == 0:
        raise ValueError(f"{xname} and {yname} must hold the same, non-zero number of samples; "
                         f"got {tuple(x.shape)} and {tuple(y.shape)}")
    if dtype is not None and dtype.is_floating_point and x.dtype != dtype:
        x = x.to(dtype)
    return x, y.long()


def _check_model(model: Any, fmt: Format | None) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if fmt is None:
        return
    if injected(model):
        raise ValueError("model has faults injected (a live inject_ handle); remove() it first")
    if not stored_weights(model):
        raise ValueError("model has no Linear, Conv or Embedding weight to store in the format")
    try:
        with torch.no_grad():
            quantised_weights(model, fmt)
    except ValueError as exc:
        raise ValueError(f"format {fmt} cannot store the model's weights: {exc}") from exc


# ---- fit and evaluate ------------------------------------------------------------------------

def evaluate(model: nn.Module, x: Any, y: Any, recipe_or_format: Recipe | Format | None = None,
             batch_size: int = 1000) -> float:
    """Accuracy of ``model`` on (x, y), in eval mode; with a recipe or format, through the
    clean quantised weights. Without one, the model runs as it is (faults injected with
    ``inject_`` included)."""
    fmt = recipe_or_format.stored_format if isinstance(recipe_or_format, Recipe) \
        else recipe_or_format
    if fmt is not None and not isinstance(fmt, Format):
        raise TypeError(f"recipe_or_format must be a Recipe, a format or None, got "
                        f"{recipe_or_format!r}")
    _check_model(model, fmt)
    batch_size = check_int(batch_size, "batch_size", 1)
    first = next(model.parameters(), None)
    x, y = _data(x, y, "x", "y", None if first is None else first.dtype)
    device = torch.device("cpu") if first is None else first.device
    was_training = model.training
    model.eval()
    correct = 0
    try:
        with torch.no_grad():
            params = None if fmt is None else quantised_weights(model, fmt)
            for i in range(0, len(x), batch_size):
                xb = x[i:i + batch_size].to(device)
                out = model(xb) if params is None else functional_call(model, params, (xb,))
                correct += int((out.argmax(1).cpu() == y[i:i + batch_size]).sum())
    finally:
        model.train(was_training)
    return correct / len(x)


def fit(model: nn.Module, x: Any, y: Any, recipe: Recipe, *, epochs: int, batch_size: int = 100,
        lr: float = 0.05, optimizer: str = "sgd", weight_decay: float = 0.0, seed: int = 0,
        x_val: Any = None, y_val: Any = None,
        progress: Callable[[int, int], None] | None = None,
        on_step: Callable[[int, float], Any] | None = None) -> list[EpochRecord]:
    """Train ``model`` in place as ``recipe`` says; one :class:`EpochRecord` per epoch.

    Cross-entropy on mini-batches shuffled by ``torch.Generator().manual_seed(seed)``;
    ``optimizer``: "sgd" (momentum 0.9) or "adam". ``activation_clip="calibrate"``
    bounds the ReLUs after the first epoch at the ``activation_quantile`` of their
    outputs on the first 1,000 training samples; later epochs train bounded.
    ``progress(epoch, epochs)`` is called after each epoch, ``on_step(steps, loss)`` after
    each mini-batch (steps so far, the epoch's running mean loss). Afterwards the model holds
    plain float weights (trained, clipped) and no hooks; it is left in the training
    mode it came in.
    """
    if isinstance(recipe, Mapping):
        recipe = Recipe.from_dict(recipe)
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a bitfault.recipes.Recipe, got {type(recipe).__name__}")
    _check_model(model, recipe.stored_format)
    if injected(model):
        raise ValueError("model has faults injected (a live inject_ handle); remove() it first")
    epochs, batch_size, lr, weight_decay, seed = check_fit_settings(
        epochs, batch_size, lr, optimizer, weight_decay, seed, progress)
    if on_step is not None and not callable(on_step):
        raise TypeError(f"on_step must be a callable (steps, loss) or None, got {on_step!r}")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no trainable parameter")
    x, y = _data(x, y, "x", "y", params[0].dtype)
    if (x_val is None) != (y_val is None):
        raise ValueError("give both x_val and y_val, or neither")
    if x_val is not None:
        x_val, y_val = _data(x_val, y_val, "x_val", "y_val", params[0].dtype)
    relu_bound = recipe.activation_clip
    if relu_bound is not None and not any(type(m) is nn.ReLU for m in model.modules()):
        raise ValueError("recipe.activation_clip: the model has no nn.ReLU module to bound")
    fmt = recipe.stored_format
    weights = stored_weights(model)
    if recipe.randbet is not None:
        try:  # the fault model's bit positions must exist in the format
            recipe.randbet.spec(fmt)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"recipe.randbet does not fit format {fmt}: {exc}") from exc
    device = params[0].device
    was_training = model.training
    try:  # the model and the labels must fit each other before anything changes
        model.eval()
        with torch.no_grad():
            classes = model(x[:1].to(device)).shape[-1]
    except RuntimeError as exc:
        raise ValueError(f"x: the model cannot run on samples of shape {tuple(x.shape[1:])}: "
                         f"{exc}") from exc
    finally:
        model.train(was_training)
    for labels, name in ((y, "y"), (y_val, "y_val")):
        if labels is not None and (int(labels.min()) < 0 or int(labels.max()) >= classes):
            raise ValueError(f"{name} must hold class labels in [0, {classes - 1}] (the model "
                             f"has {classes} outputs), got [{int(labels.min())}, "
                             f"{int(labels.max())}]")
    # ---- from here on the model changes ----
    handle = inject_(model, recipe.fault_aware) if recipe.fault_aware is not None else None
    if isinstance(relu_bound, float):
        bound_relus_(model, relu_bound)
    opt = (torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
           if optimizer == "sgd" else torch.optim.Adam(params, lr=lr, weight_decay=weight_decay))
    clip = None
    if recipe.weight_clip is not None:
        clip = clip_weights_(opt, recipe.weight_clip, params=list(weights.values()))
        clip.apply()
    # the range in the weights' own dtype(s), as inject_ projects (storable_bounds)
    ends = [] if fmt is None else [storable_bounds(fmt, d) for d in
                                   {w.dtype for w in weights.values()}]
    bounds = None if not ends or ends[0] is None else (
        max(e[0] for e in ends), min(e[1] for e in ends))  # type: ignore[index]
    in_range = None  # the clean weights stay storable (a zero gradient outside the range is
    if bounds is not None:  # not enough: momentum or one large step carries a weight past it)
        in_range = ClipHandle.after_steps(opt, list(weights.values()), *bounds)
        in_range.apply()
    # fault_aware: inject_'s hooks fault the forward; the step then runs the plain model
    step_recipe = recipe.replace(format=None) if handle is not None else recipe
    g = torch.Generator().manual_seed(seed)
    history: list[EpochRecord] = []
    step, started = 0, False
    try:
        for epoch in range(epochs):
            start = time.perf_counter()
            model.train()
            sums = np.zeros(5)  # samples, clean, perturbed, perturbed samples, correct
            for idx in torch.randperm(len(x), generator=g).split(batch_size):
                xb, yb = x[idx].to(device), y[idx].to(device)
                if handle is not None and handle.spec.persistence == "transient":
                    handle.resample(step)
                clean, pert, correct = _step(model, opt, xb, yb, step_recipe, step,
                                             True if started else None)
                check_training_loss(clean, pert, epoch + 1, step)
                started = started or not math.isnan(pert)
                n = len(idx)
                sums += (n, clean * n, 0.0 if math.isnan(pert) else pert * n,
                         0 if math.isnan(pert) else n, correct)
                step += 1
                if on_step is not None:
                    on_step(step, float((sums[1] + sums[2]) / sums[0]))
            if handle is not None:  # clean quantised weights for calibration and validation
                handle.remove()
            if relu_bound == "calibrate" and epoch == 0:
                run = None if fmt is None else (
                    lambda xb: functional_call(model, quantised_weights(model, fmt), (xb,)))
                bound_relus_(model, calibrate_relu_thresholds(
                    model, x[:CALIBRATION_SAMPLES].to(device), recipe.activation_quantile,
                    forward=run))
            val = math.nan if x_val is None else evaluate(model, x_val, y_val, fmt)
            if handle is not None and epoch + 1 < epochs:
                handle = inject_(model, recipe.fault_aware)
            pert_mean = sums[2] / sums[3] if sums[3] else math.nan
            history.append(EpochRecord(
                epoch=epoch + 1, loss=float((sums[1] + sums[2]) / sums[0]),
                clean_loss=float(sums[1] / sums[0]),
                perturbed_loss=float(pert_mean), train_accuracy=float(sums[4] / sums[0]),
                val_accuracy=float(val),
                seconds=time.perf_counter() - start))
            if progress is not None:
                progress(epoch + 1, epochs)
    finally:
        if handle is not None:
            handle.remove()
        if clip is not None:
            clip.remove()
        if in_range is not None:
            in_range.remove()
        model.train(was_training)
    return history


__all__ = ["OPTIMIZERS", "evaluate", "fit", "quantised_weights", "randbet_step",
           "stored_weights"]
