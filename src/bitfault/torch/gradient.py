"""Gradients through faulty tensors: straight through to the clean ones ("ste"), exactly zero
where a clean value lies outside what the format stores (``bitfault.formats.gradient_bounds``),
or not at all ("blocked", the seed program's ``stop_gradient``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch


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
        if values.numel() == 0:
            return grad
        low, high = torch.aminmax(values)  # one pass; NaN fails both tests below
        if low >= lo and high <= hi:  # the usual case: every clean value is storable
            return grad
        return torch.where((values >= lo) & (values <= hi), grad, grad.new_zeros(()))

    return hook


def straight_through(clean: Sequence[torch.Tensor], faulty: Sequence[torch.Tensor],
                     blocked: bool, kept: bool = False,
                     bounds: tuple[float, float] | None = None,
                     only: Collection[int] | None = None) -> list[torch.Tensor]:
    """``faulty`` wired into autograd as functions of ``clean`` (when grad is on and needed).

    ``kept``: the faulty tensors are views the kernel keeps and writes again later; only
    fresh aliases of them are handed out (so the kernel can tell when nothing holds them).
    ``bounds``: the gradient is zero where a clean value lies outside (``gradient_bounds``).
    ``only``: the positions in ``clean`` that may hold such values (a check found the others
    inside, so their gradient needs no hook); None: every position.
    """
    if not faulty:
        return []
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in clean)
    if not grad or blocked:
        faulty = [f.detach() for f in faulty] if kept else list(faulty)
        return list(_StraightThrough.apply(faulty, True, *clean)) if grad else faulty
    out = []
    for i, (c, f) in enumerate(zip(clean, faulty, strict=True)):
        if c.requires_grad:  # an identity view of the clean tensor that holds the faulty values:
            view = c.view_as(c)  # autograd's own (C++) identity backward, and the gradient
            view.data = f  # reaches the clean tensor untouched (no Python node, no copy)
            if bounds is not None and (only is None or i in only):  # ... but for values
                # the format cannot store
                view.register_hook(_zero_outside(c, bounds))
            f = view
        elif kept:
            f = f.detach()
        out.append(f)
    return out
