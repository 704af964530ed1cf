"""IntQuant in PyTorch tensor ops on any device, bit for bit ``IntQuant.calibrate`` and
``IntQuant.encode``: float32 arithmetic as torch.ao's MinMaxObserver and torch's CPU
quantisers compute it (``docs/formats.md``).

Every division is tensor by tensor on x's device: a CUDA tensor divided by a Python
number is computed as a multiplication by its reciprocal, which rounds differently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from bitfault.formats import IntQuant


@dataclass(frozen=True)
class Calibration:
    """IntQuant scale (float32) and zero point (int64), shaped to broadcast against x."""

    scale: torch.Tensor
    zero: torch.Tensor
    finite: torch.Tensor  # 0-dim bool: the clean tensor had no NaN or inf (in float32)


def _f32(value: float, device: torch.device) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=device)


def calibrate(x: torch.Tensor, fmt: IntQuant) -> Calibration:
    """``IntQuant.calibrate`` on x's device (non-finite input or an overflowing range: see
    ``finite``)."""
    lo, hi = fmt.code_range
    dims = fmt.reduce_axes(x.ndim)  # raises for an axis out of range
    dev = x.device
    if x.numel() == 0:
        return Calibration(torch.ones((), dtype=torch.float32, device=dev),
                           torch.zeros((), dtype=torch.int64, device=dev),
                           torch.ones((), dtype=torch.bool, device=dev))
    x32 = x.to(torch.float32)
    if dims is None:
        mn, mx = torch.aminmax(x32)
    else:
        axis = next(d for d in range(x.ndim) if d not in dims)
        mn, mx = torch.aminmax(x32.movedim(axis, 0).reshape(x.shape[axis], -1), dim=1)
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        mn, mx = mn.reshape(shape), mx.reshape(shape)
    finite = torch.isfinite(mn).all() & torch.isfinite(mx).all()
    mn, mx = torch.clamp(mn, max=0.0), torch.clamp(mx, min=0.0)
    if fmt.symmetric:
        scale = torch.maximum(mn.neg(), mx) / _f32((hi - lo) / 2, dev)
        scale = torch.clamp(scale, min=fmt.min_scale)
        return Calibration(scale, torch.zeros_like(scale, dtype=torch.int64), finite)
    scale = torch.clamp((mx - mn) / _f32(hi - lo, dev), min=fmt.min_scale)
    finite = finite & torch.isfinite(scale).all()
    zero = (lo - torch.round(mn / scale).to(torch.float64)).clamp_(lo, hi).to(torch.int64)
    return Calibration(scale, zero, finite)


def fused_f32(p: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """float32(p + zero) with one rounding (``bitfault.formats.intquant.fused_f32``): the
    float64 sum rounded to odd by TwoSum's error, then to float32."""
    z = zero.to(torch.float64)
    s = p + z
    bb = s - p
    err = (p - (s - bb)) + (z - bb)
    fix = (err != 0) & torch.isfinite(s) & ((s.view(torch.int64) & 1) == 0)
    toward = torch.where(err > 0, s.new_tensor(math.inf), s.new_tensor(-math.inf))
    return torch.where(fix, torch.nextafter(s, toward), s).to(torch.float32)


def codes(x: torch.Tensor, fmt: IntQuant, calib: Calibration) -> torch.Tensor:
    """Unclamped codes as float64 integers (NaN for NaN): ``t = x * float32(1 / s)`` in
    float32, the zero point added as ``fmt.zero_point_add`` says."""
    x32 = x.to(torch.float32)
    inv = torch.div(_f32(1.0, x.device), calib.scale)
    how = fmt.zero_point_add
    if how == "fused":
        t = fused_f32(x32.to(torch.float64) * inv.to(torch.float64), calib.zero).round_()
    elif how == "float32":
        t = (x32 * inv + calib.zero.to(torch.float32)).round_()
    else:
        t = x32 * inv
        t = t.round_() if fmt.rounding == "nearest" else t.trunc_()
        return t.to(torch.float64) + calib.zero
    return t.to(torch.float64)


__all__ = ["Calibration", "calibrate", "codes", "fused_f32"]
