"""The float32 fast paths of the formats that training uses, bit for bit the generic path.

One dense pass rounds every element through the format and back (its clean value); then
the faulty elements only are computed exactly from their codes and written over it.
Everything about the map (flat indices, masks) comes prepared once per device
(``DeviceFaults``). Arithmetic only: ``bitfault.torch.seam`` chooses when these run.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from bitfault.faults.models import FaultModel
from bitfault.formats import FixedPoint, IntQuant
from bitfault.formats.intquant import calibrate_f32
from bitfault.torch.kernels.generic import (
    apply_fault,
    apply_fault_,
    sign_extend,
    sign_extend32,
)
from bitfault.torch.kernels.intquant import calibrate, fused_f32

if TYPE_CHECKING:
    from bitfault.torch.seam import DeviceFaults

_CONTAINERS = {8: torch.int8, 16: torch.int16, 32: torch.int32}
_ZEROS: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _zero(device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A cached 0-dim +0.0: ``torch.add(zero, t, alpha=a)`` scales and turns -0.0 into +0.0."""
    z = _ZEROS.get((device, dtype))
    if z is None:
        z = _ZEROS[(device, dtype)] = torch.zeros((), dtype=dtype, device=device)
    return z


def _scratch(buffers: dict | None, n: int, dtype: torch.dtype,
             device: torch.device) -> torch.Tensor:
    """A flat scratch tensor of ``n`` elements, kept in ``buffers`` between calls on the host.

    A fresh multi-megabyte host tensor is fresh pages from the OS, and faulting them
    in costs as much as the arithmetic. Only scratch that never leaves the kernel is
    kept: a tensor handed out may still be alive (autograd saves it) when the next
    call comes.
    """
    if buffers is None or device.type != "cpu":
        return torch.empty(n, dtype=dtype, device=device)
    key = ("scratch", n, dtype, device)
    b = buffers.get(key)
    if b is None:
        if len(buffers) > 16:  # sizes come and go
            buffers.clear()
        b = buffers[key] = torch.empty(n, dtype=dtype, device=device)
    return b


# ---- FixedPoint and Float("float32") ----------------------------------------------------

@functools.lru_cache(maxsize=64)
def _fixed_point_consts(fmt: FixedPoint) -> tuple[int, int, float, float, float, float]:
    """lo, hi, 2**frac, 2**-frac, float32(hi) (rounded to nearest), the largest float32 <= hi."""
    lo, hi = fmt.code_range
    hi32 = float(np.float32(hi))
    below = hi32 if hi32 <= hi else float(np.nextafter(np.float32(hi32), np.float32(0)))
    return lo, hi, 2.0**fmt.frac, 2.0**-fmt.frac, hi32, below


def faulty_fixed_point_f32(xs: Sequence[torch.Tensor], fmt: FixedPoint, fault: FaultModel,
                           faults: DeviceFaults) -> torch.Tensor:
    """FixedPoint (overflow "saturate") on float32 tensors, into one flat float32 tensor.

    Every element: ``t = clamp(round(x * 2**f), lo, float32(hi))`` in float32 is
    its code (exact: scaling by a power of two is exact and a rounded float32 is
    an integer; ``float32(hi) * 2**-f`` is what decoding ``hi`` gives). Faulty
    elements: their codes as integers, faulted, written back as float32 (one
    rounding, as the core's decode). Last, ``t = 0 + t * 2**-f`` decodes all at
    once and turns the -0.0 of rounding into the +0.0 that code 0 decodes to.
    """
    lo, hi, up, down, hi32, below = _fixed_point_consts(fmt)
    dev = xs[0].device
    t = torch.empty(sum(faults.sizes), dtype=torch.float32, device=dev)
    for x, o, n in zip(xs, faults.offsets, faults.sizes, strict=True):
        if fmt.rounding == "trunc":  # each tensor rounded straight into its slice
            torch.div(x.reshape(-1), down, rounding_mode="trunc", out=t[o:o + n])
        else:
            torch.mul(x.reshape(-1), up, out=t[o:o + n])
    if fmt.rounding == "nearest":
        t.round_()
    in_range = False
    if dev.type == "cpu" and t.numel():  # a free host check lets clean tensors skip clamping
        mn, mx = (float(v) for v in torch.aminmax(t))
        in_range = mn >= lo and mx <= below  # False for NaN
    if not in_range:
        t.clamp_(float(lo), hi32).nan_to_num_(0.0)
    index = faults.index
    if index.numel():
        codes = t.index_select(0, index)
        if in_range:  # codes fit int32
            words = sign_extend32(apply_fault_(codes.to(torch.int32), faults.masks32, fault),
                                   fmt.bits)
        else:
            words = codes.to(torch.int64)
            if hi32 > hi:
                words.clamp_(max=hi)
            words = sign_extend(apply_fault(words, faults.masks, fault), fmt.bits)
        t.scatter_(0, index, words.to(torch.float32))
    return torch.add(_zero(dev), t, alpha=down, out=t)


def faulty_float32_f32(x: torch.Tensor, fault: FaultModel, faults: DeviceFaults) -> torch.Tensor:
    """Float("float32") on a flat float32 tensor: only the faulty words change."""
    out = x.clone()
    if faults.index.numel():
        bits = out.view(torch.int32)
        words = bits.index_select(0, faults.index)
        bits.scatter_(0, faults.index, apply_fault(words, faults.masks32, fault))
    return out


# ---- IntQuant ---------------------------------------------------------------------------

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
    y = _scratch(buffers, n, torch.float64, dev) if wide else \
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
    zero_y = _zero(dev, y.dtype)
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
