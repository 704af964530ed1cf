"""Which clean values a format stores as they are, for PyTorch tensors: the bounds in each
dtype, a one-pass check (range, NaN and inf), the projection into the range, and the error
for a tensor that holds NaN or inf.

``inject_`` keeps the clean tensors a model trains storable (``project=True``): a zero
gradient outside the range does not stop momentum or one large step from carrying a weight
past it, so the weights are projected back before the forward that would use them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import torch

from bitfault.formats import Format, gradient_bounds


@functools.lru_cache(maxsize=256)
def storable_bounds(fmt: Format, dtype: torch.dtype) -> tuple[float, float] | None:
    """``gradient_bounds(fmt)`` with each end rounded inward to a value of ``dtype``: a value
    of ``dtype`` lies in it exactly when ``fmt`` stores it without saturating. None: the
    format has no bound (IntQuant and the block formats take their scale from the tensor).
    """
    bounds = gradient_bounds(fmt)
    if bounds is None:
        return None
    lo, hi = bounds
    ends = torch.tensor([lo, hi], dtype=torch.float64).to(dtype)  # beyond dtype's range: inf
    a, b = ends[0], ends[1]
    if float(a) < lo:
        a = torch.nextafter(a, torch.tensor(math.inf, dtype=dtype))
    if float(b) > hi:
        b = torch.nextafter(b, torch.tensor(-math.inf, dtype=dtype))
    return float(a), float(b)


def outside(xs: Sequence[torch.Tensor], bounds: tuple[float, float] | None) -> list[int]:
    """Positions in ``xs`` of the tensors that hold a value outside the closed ``bounds`` or
    a NaN (``bounds`` None: a NaN or an inf): one ``aminmax`` pass per tensor and one
    transfer of the extremes to the host."""
    live = [i for i, x in enumerate(xs) if x.numel()]
    if not live:
        return []
    pairs = [torch.aminmax(xs[i].detach()) for i in live]  # NaN propagates to both
    ext = torch.stack([torch.stack([mn, mx]).to(torch.float64) for mn, mx in pairs])
    ext = ext.cpu().numpy()
    if bounds is None:
        ok = np.isfinite(ext).all(axis=1)
    else:
        with np.errstate(invalid="ignore"):
            ok = (ext[:, 0] >= bounds[0]) & (ext[:, 1] <= bounds[1])
    return [i for i, good in zip(live, ok, strict=True) if not good]


def first_non_finite(x: torch.Tensor) -> tuple[tuple[int, ...], float] | None:
    """The index and value of ``x``'s first NaN or inf (row-major order), or None."""
    if not x.numel() or all(math.isfinite(float(v)) for v in torch.aminmax(x.detach())):
        return None  # one pass, no mask: the usual answer
    bad = ~torch.isfinite(x.detach())
    if not bool(bad.any()):
        return None
    flat = int(bad.reshape(-1).nonzero()[0, 0])
    index = tuple(int(i) for i in np.unravel_index(flat, tuple(x.shape))) if x.ndim else ()
    return index, float(x.detach().reshape(-1)[flat])


def refuse_non_finite(x: torch.Tensor, name: str, after_inject: bool = False) -> None:
    """Raise ValueError naming ``name`` and the first NaN or inf of ``x``, if it holds one:
    a non-finite value has no stored form to fault (IntQuant could not even compute the
    tensor's scale: every value would come out NaN)."""
    found = first_non_finite(x)
    if found is None:
        return
    index, value = found
    why = (" (it was finite when inject_ was called: the training diverged; lower the "
           "learning rate or find the step that made it)") if after_inject else ""
    raise ValueError(f"tensor {name!r}: value {value!r} at index {index} is not finite; "
                     f"inject_ faults finite tensors only{why}")


def project_(xs: Sequence[torch.Tensor], bounds: tuple[float, float]) -> None:
    """Clamp each of ``xs`` into ``bounds`` in place (no autograd; each tensor's version
    counter moves on, as after an optimizer step)."""
    with torch.no_grad():
        for x in xs:
            x.clamp_(bounds[0], bounds[1])


def settle(names: Sequence[str], clean: Sequence[torch.Tensor], values: Sequence[torch.Tensor],
           bad: Sequence[int], fmt: Format, project: bool) -> tuple[list[int], list[int]]:
    """What ``inject_`` does with the tensors a check found unstorable (positions ``bad``
    of ``clean``; ``values``: the same tensors detached): a NaN or inf is an error naming
    the tensor; values outside the range are projected into it (``project_``) where this
    forward trains the tensor (grad on, the tensor requires grad) and ``project`` is on.
    Returns (the positions projected, the positions still outside)."""
    for i in bad:
        refuse_non_finite(values[i], names[i], after_inject=True)
    bounds = storable_bounds(fmt, values[bad[0]].dtype) if bad else None
    if not project or bounds is None or not torch.is_grad_enabled():
        return [], list(bad)
    fix = [i for i in bad if clean[i].requires_grad]
    project_([values[i] for i in fix], bounds)
    return fix, [i for i in bad if i not in fix]


__all__ = ["first_non_finite", "outside", "project_", "refuse_non_finite", "settle",
           "storable_bounds"]
