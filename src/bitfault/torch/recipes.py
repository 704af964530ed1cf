"""Building blocks of the bit-error-robustness recipes: weight clipping, bounded ReLUs.

``clip_weights_`` projects weights to ``[-w_max, w_max]`` after every optimizer
step; ``bound_relus_`` swaps ``nn.ReLU`` modules for :class:`BoundedReLU` ones, at
thresholds given or found by ``calibrate_relu_thresholds``. ``fit`` in
``bitfault.torch.train`` combines them as a :class:`bitfault.recipes.Recipe` says.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from bitfault.errors import check_positive
from bitfault.recipes import thresholds_from_activations


class ClipHandle:
    """Weights projected into ``[lo, hi]`` after every step of an optimizer
    (``clip_weights_``: ``[-w_max, w_max]``; ``fit``: the format's range); ``remove()`` it."""

    def __init__(self, params: list[torch.Tensor], lo: float, hi: float) -> None:
        self.params = params
        self.lo, self.hi = lo, hi
        self._hook: Any = None

    @classmethod
    def after_steps(cls, optimizer: torch.optim.Optimizer, params: list[torch.Tensor],
                    lo: float, hi: float) -> ClipHandle:
        """Project ``params`` into ``[lo, hi]`` after every ``optimizer.step()``."""
        handle = cls(params, lo, hi)
        handle._hook = optimizer.register_step_post_hook(lambda opt, args, kwargs: handle.apply())
        return handle

    def apply(self) -> None:
        """Project every clipped tensor into ``[lo, hi]`` now, in place."""
        with torch.no_grad():
            for p in self.params:
                p.clamp_(self.lo, self.hi)

    def remove(self) -> None:
        """Stop clipping after optimizer steps (idempotent)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def __enter__(self) -> ClipHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "removed" if self._hook is None else "active"
        return f"ClipHandle({len(self.params)} tensors, [{self.lo:g}, {self.hi:g}], {state})"


def clip_weights_(optimizer: torch.optim.Optimizer, w_max: float,
                  params: Iterable[torch.Tensor] | None = None) -> ClipHandle:
    """After every ``optimizer.step()``, project weights to ``[-w_max, w_max]`` in place.

    ``params``: the tensors to clip; by default every parameter of the optimizer's
    groups with two or more dimensions: weight matrices, conv kernels and
    embeddings, the tensors ``inject_`` faults by default. Biases and norm-layer
    scales (1-D) are left alone: a GroupNorm/BatchNorm scale starts at 1, clipping it
    to 0.1 would only rescale activations. Weights are not clipped until the first
    step; ``handle.apply()`` clips at once.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    w_max = check_positive(w_max, "w_max")
    owned = [p for g in optimizer.param_groups for p in g["params"]]
    if params is None:
        chosen = [p for p in owned if p.ndim >= 2]
    else:
        if isinstance(params, torch.Tensor):
            params = [params]
        chosen = list(params)
        ids = {id(p) for p in owned}
        for i, p in enumerate(chosen):
            if not isinstance(p, torch.Tensor) or id(p) not in ids:
                raise ValueError(f"params[{i}] is not a parameter of the optimizer's param groups")
    if not chosen:
        raise ValueError("params: nothing to clip (the optimizer has no parameter with two or "
                         "more dimensions; pass params= explicitly)")
    return ClipHandle.after_steps(optimizer, chosen, -w_max, w_max)


class BoundedReLU(nn.Hardtanh):
    """``min(max(x, 0), threshold)``: a ReLU clipped at ``threshold`` (Hardtanh(0, t))."""

    def __init__(self, threshold: float, inplace: bool = False) -> None:
        super().__init__(0.0, check_positive(threshold, "threshold"), inplace=inplace)

    @property
    def threshold(self) -> float:
        return float(self.max_val)

    def extra_repr(self) -> str:
        return f"threshold={self.threshold:g}"


def _relus(model: nn.Module) -> dict[str, nn.ReLU]:
    return {name: m for name, m in model.named_modules() if type(m) is nn.ReLU}


def bound_relus_(model: nn.Module, thresholds: float | Mapping[str, float]) -> list[str]:
    """Replace ``nn.ReLU`` modules by :class:`BoundedReLU`, in place; return their names.

    ``thresholds``: one bound for every ReLU, or ``{module name: bound}`` for the
    ReLUs named (the others stay). ReLUs called as functions (``torch.relu``) cannot
    be found; use modules.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    relus = _relus(model)
    if isinstance(thresholds, Mapping):
        unknown = sorted(set(thresholds) - set(relus))
        if unknown:
            raise ValueError(f"thresholds names {unknown}, which are not nn.ReLU modules of the "
                             f"model; its ReLUs are {sorted(relus)}")
        chosen = {name: check_positive(t, f"thresholds[{name!r}]")
                  for name, t in thresholds.items()}
    else:
        t = check_positive(thresholds, "thresholds")
        if not relus:
            raise ValueError("thresholds: the model has no nn.ReLU module to bound (functional "
                             "torch.relu calls cannot be replaced)")
        chosen = dict.fromkeys(relus, t)
    for name, t in chosen.items():
        parent, _, leaf = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, leaf, BoundedReLU(t, inplace=relus[name].inplace))
    return list(chosen)


def relu_bounds(model: nn.Module) -> dict[str, float]:
    """The thresholds of a model's bounded ReLUs (not in its state_dict), by module name."""
    return {n: m.threshold for n, m in model.named_modules() if isinstance(m, BoundedReLU)}


def calibrate_relu_thresholds(model: nn.Module, x: Any, quantile: float = 0.999,
                              batch_size: int = 1000,
                              forward: Callable[[torch.Tensor], Any] | None = None
                              ) -> dict[str, float]:
    """The ``quantile`` of every ``nn.ReLU``'s output over data ``x``: ``{module name: bound}``.

    Runs without gradients, in eval mode (the mode is restored after). ``forward``
    replaces ``model(batch)`` (e.g. a forward through quantised weights). A ReLU whose
    quantile is 0 gets the smallest positive float32, so the result always suits
    ``bound_relus_``. Keeps every output in memory: pass a sample of a large data set.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(quantile, bool) or not isinstance(quantile, (int, float, np.floating)) \
            or not 0.0 < float(quantile) <= 1.0:
        raise ValueError(f"quantile must be in (0, 1], got {quantile!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    x = torch.as_tensor(x)
    if x.ndim < 1 or len(x) == 0:
        raise ValueError(f"x must hold at least one sample, got shape {tuple(x.shape)}")
    relus = _relus(model)
    if not relus:
        raise ValueError("model has no nn.ReLU module to calibrate")
    seen: dict[str, list[np.ndarray]] = {name: [] for name in relus}

    def hook(name: str) -> Callable[..., None]:
        def record(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            seen[name].append(output.detach().float().reshape(-1).cpu().numpy())
        return record

    hooks = [m.register_forward_hook(hook(n)) for n, m in relus.items()]
    was_training = model.training
    run = forward or model
    try:
        model.eval()
        with torch.no_grad():
            for i in range(0, len(x), batch_size):
                run(x[i:i + batch_size])
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return thresholds_from_activations(seen, quantile, "ReLU module(s)")


__all__ = [
    "BoundedReLU",
    "ClipHandle",
    "bound_relus_",
    "calibrate_relu_thresholds",
    "clip_weights_",
    "relu_bounds",
]
