"""IntQuant in PyTorch tensor ops on any device, bit for bit ``IntQuant.calibrate`` and
``IntQuant.encode``: float32 arithmetic as torch.ao's MinMaxObserver and torch's CPU
quantisers compute it (``docs/formats.md``).

Every division is tensor by tensor on x's device: a CUDA tensor divided by a Python
number is computed as a multiplication by its reciprocal, which rounds differently.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from bitfault.faults.models import FaultModel
from bitfault.formats import IntQuant
from bitfault.formats.intquant import calibrate_f32
from bitfault.torch.kernels.generic import (
    apply_fault,
    apply_fault_,
    f64_to,
    positive_zero,
    scratch,
    sign_extend,
    to_int_range,
)
from bitfault.torch.kernels.registry import register

if TYPE_CHECKING:
    from bitfault.torch.kernels.device import DeviceFaults

_CONTAINERS = {8: torch.int8, 16: torch.int16, 32: torch.int32}


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


def encode(x: torch.Tensor, fmt: IntQuant, calib: Calibration | None = None) -> torch.Tensor:
    """The words of ``x`` under ``calib``: offset codes in the low ``fmt.bits`` bits."""
    if calib is None:
        raise ValueError("IntQuant needs a calibration (scale and zero point)")
    lo, hi = fmt.code_range
    q = to_int_range(codes(x, fmt, calib), lo, hi, "saturate", x, "IntQuant")
    return (q + fmt.code_offset) & fmt.word_mask


def decode(words: torch.Tensor, fmt: IntQuant, calib: Calibration | None, dtype: torch.dtype
           ) -> torch.Tensor:
    """Floats of ``dtype`` from words, reading only the low ``fmt.bits`` bits."""
    if calib is None:
        raise ValueError("IntQuant needs a calibration (scale and zero point)")
    low = words & fmt.word_mask
    stored = sign_extend(low, fmt.bits) if fmt.codes == "signed" else low
    q = stored - fmt.code_offset - calib.zero  # (q - z) * s rounded once, as the core
    return f64_to(q.to(torch.float64) * calib.scale.to(torch.float64), dtype)


# ---- the float32 fast path ----------------------------------------------------------------

def _host_calibration(x: torch.Tensor, fmt: IntQuant
                      ) -> tuple[float | torch.Tensor, int | torch.Tensor, bool]:
    """``IntQuant.calibrate`` for a CPU tensor: its extremes from one ``aminmax`` pass, then
    the core's own float32 arithmetic (``calibrate_f32``) on them.

    Returns (scale, zero, finite): Python numbers (a float holding the float32 scale) for one
    scale per tensor, broadcastable tensors per channel; finite is False for NaN or inf in
    x, or a range float32 cannot scale.
    """
    dims = fmt.reduce_axes(x.ndim)
    if dims is None:
        ext = np.stack([t.numpy() for t in torch.aminmax(x)]).reshape(2)
        axes, axis = None, None
    else:
        axis = next(d for d in range(x.ndim) if d not in dims)
        mn, mx = torch.aminmax(x.movedim(axis, 0).reshape(x.shape[axis], -1), dim=1)
        ext, axes = np.stack([mn.numpy(), mx.numpy()], axis=1), (1,)
    if not np.isfinite(ext).all():
        return 1.0, 0, False
    try:
        params = calibrate_f32(fmt, ext, axes)
    except ValueError:  # a range wider than float32 can scale
        return 1.0, 0, False
    if axis is None:
        return float(params.scale), int(params.zero_point), True
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    return (torch.from_numpy(params.scale.reshape(shape)),
            torch.from_numpy(params.zero_point.reshape(shape)), True)


def _fault_codes_(y: torch.Tensor, fmt: IntQuant, fault: FaultModel,
                  faults: DeviceFaults) -> None:
    """Replace the codes (integers in float ``y``, flat) at the faulty elements by their
    faulted codes."""
    index = faults.index
    codes = y.index_select(0, index)
    container = _CONTAINERS.get(fmt.bits)
    if container is not None and fmt.code_offset == 0 and fmt.codes == "signed":
        # the stored word is the code's two's complement in a container of exactly
        # ``bits``: the wrapping cast is the sign extension
        words = apply_fault_(codes.to(container), faults.masks_as(container), fault)
        y.scatter_(0, index, words.to(y.dtype))
        return
    words = (codes.to(torch.int64) + fmt.code_offset) & fmt.word_mask
    stored = apply_fault(words, faults.masks, fault)
    stored = sign_extend(stored, fmt.bits) if fmt.codes == "signed" else stored & fmt.word_mask
    y.scatter_(0, index, (stored - fmt.code_offset).to(y.dtype))


def _codes_into(part: torch.Tensor, x: torch.Tensor, fmt: IntQuant,
                scale: float | torch.Tensor, zero: int | torch.Tensor) -> None:
    """``part`` = the unclamped codes of float32 ``x`` (``IntQuant.encode``'s arithmetic)."""
    inv = np.float32(1) / np.float32(scale) if isinstance(scale, float) \
        else torch.div(torch.ones((), dtype=torch.float32, device=x.device), scale)
    inv = float(inv) if isinstance(inv, np.floating) else inv  # a float32 value, exactly
    how = fmt.zero_point_add
    if how == "fused":  # float64 ``part``: the exact product, rounded once with z
        part.copy_(x).mul_(inv)
        z = torch.as_tensor(zero, dtype=torch.int64, device=x.device)
        part.copy_(fused_f32(part, z)).round_()
        return
    t = part if part.dtype == torch.float32 else torch.empty_like(x)
    torch.mul(x, inv, out=t)
    if how == "float32":
        t.add_(zero if isinstance(zero, int) else zero.to(torch.float32))
    if fmt.rounding == "nearest":
        t.round_()
    else:
        t.trunc_()
    if t is not part:
        part.copy_(t)
    if how == "after" and not fmt.symmetric:
        part.add_(zero)


def faulty_int_quant_f32(xs: Sequence[torch.Tensor], fmt: IntQuant, fault: FaultModel,
                         faults: DeviceFaults, buffers: dict | None = None
                         ) -> list[torch.Tensor]:
    """IntQuant on float32 tensors, in the core's float32 arithmetic, as one flat pass.

    Per tensor (its own scale ``s`` and zero point ``z``): ``t = x * float32(1 / s)``
    rounded (the zero point added as ``fmt.zero_point_add`` says), clamped, is every
    element's code. The faulty elements' codes are faulted as words and written back;
    then ``(t - z) * s`` decodes all at once, one rounding: in float32 (exact integers
    up to 24 bits), or in float64 where codes are wider or the zero point is fused.
    A tensor with NaN or inf comes out all NaN.
    """
    lo, hi = fmt.code_range
    dev = xs[0].device
    on_cpu = dev.type == "cpu"
    wide = fmt.bits > 24 or fmt.zero_point_add == "fused"
    n = sum(faults.sizes)  # float32 codes become the output: never kept scratch
    y = scratch(buffers, n, torch.float64, dev) if wide else \
        torch.empty(n, dtype=torch.float32, device=dev)
    parts, calibs, poisoned = [], [], []
    clamp = not fmt.symmetric or not on_cpu
    for i, x in enumerate(xs):
        part = y[faults.offsets[i]:faults.offsets[i] + faults.sizes[i]].view(x.shape)
        parts.append(part)
        if x.numel() == 0:
            calibs.append((1.0, 0, None))
            continue
        if on_cpu:
            scale, zero, finite = _host_calibration(x, fmt)
            if not finite:
                poisoned.append(i)
                clamp = True
            calibs.append((scale, zero, None))
        else:
            c = calibrate(x, fmt)
            scale, zero = c.scale, c.zero
            calibs.append((scale, zero, c.finite))
        _codes_into(part, x, fmt, scale, zero)
    if clamp:  # symmetric and finite: |rint(x * (1 / s))| <= hi already
        y.clamp_(lo, hi).nan_to_num_(0.0)
    if faults.index.numel():
        _fault_codes_(y, fmt, fault, faults)
    zero_y = positive_zero(dev, y.dtype)
    for part, (scale, zero, _) in zip(parts, calibs, strict=True):
        if wide and not isinstance(scale, float):
            scale = scale.to(torch.float64)
        if not fmt.symmetric:
            part.add_(-zero).mul_(scale)  # t + (-z): exact, and -0.0 + 0 is +0.0
        elif isinstance(scale, float):
            torch.add(zero_y, part, alpha=scale, out=part)  # -0.0 -> +0.0
        else:
            part.mul_(scale).add_(0.0)  # round() leaves -0.0 where code 0 decodes to +0.0
    out = y.to(torch.float32) if wide else y
    outs = []
    for i, (x, (_, _, finite)) in enumerate(zip(xs, calibs, strict=True)):
        o = out[faults.offsets[i]:faults.offsets[i] + faults.sizes[i]].view(x.shape)
        if i in poisoned:
            o.fill_(math.nan)
        elif finite is not None:
            o = torch.where(finite, o, math.nan)
        outs.append(o)
    return outs


def fast_f32(xs: Sequence[torch.Tensor], fmt: IntQuant, fault: FaultModel,
             faults: DeviceFaults, buffers: dict | None = None,
             strict: bool = False) -> list[torch.Tensor] | None:
    """``faulty_int_quant_f32`` where NaN and inf may come out as NaN (not ``strict``)."""
    if strict:
        return None
    return faulty_int_quant_f32(xs, fmt, fault, faults, buffers)


register(IntQuant, encode=encode, decode=decode, calibrate=calibrate, fast_f32=fast_f32)

__all__ = ["Calibration", "calibrate", "codes", "decode", "encode", "fast_f32",
           "faulty_int_quant_f32", "fused_f32"]
