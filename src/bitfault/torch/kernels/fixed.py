"""FixedPoint in PyTorch: the generic encode and decode (float64/int64 tensor ops, every
overflow policy and float dtype) and the float32 fast path of overflow "saturate". The
compiled CPU loops register beside them (``kernels.numba``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from bitfault.faults.models import FaultModel
from bitfault.formats import FixedPoint
from bitfault.torch.kernels.generic import (
    apply_fault,
    apply_fault_,
    f64_to,
    positive_zero,
    round_codes,
    sign_extend,
    sign_extend32,
    split,
    to_int_range,
)
from bitfault.torch.kernels.registry import register

if TYPE_CHECKING:
    from bitfault.torch.kernels.device import DeviceFaults


def encode(x: torch.Tensor, fmt: FixedPoint, calib: object = None) -> torch.Tensor:
    """The words of ``x``: its codes, in the low ``fmt.bits`` bits of int64."""
    y = round_codes(x.to(torch.float64) * 2.0**fmt.frac, fmt.rounding)
    lo, hi = fmt.code_range
    return to_int_range(y, lo, hi, fmt.overflow, x, f"FixedPoint{fmt.q_name}") & fmt.word_mask


def decode(words: torch.Tensor, fmt: FixedPoint, calib: object, dtype: torch.dtype
           ) -> torch.Tensor:
    """Floats of ``dtype`` from words, reading only the low ``fmt.bits`` bits."""
    codes = sign_extend(words & fmt.word_mask, fmt.bits)
    return f64_to(codes.to(torch.float64) * 2.0**-fmt.frac, dtype)


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
    return torch.add(positive_zero(dev), t, alpha=down, out=t)


def fast_f32(xs: Sequence[torch.Tensor], fmt: FixedPoint, fault: FaultModel,
             faults: DeviceFaults, buffers: dict | None = None,
             strict: bool = False) -> list[torch.Tensor] | None:
    """``faulty_fixed_point_f32`` for overflow "saturate"; None for the other policies."""
    if fmt.overflow != "saturate":
        return None
    return split(faulty_fixed_point_f32(xs, fmt, fault, faults), xs, faults.offsets, faults.sizes)


register(FixedPoint, encode=encode, decode=decode, fast_f32=fast_f32)

__all__ = ["decode", "encode", "fast_f32", "faulty_fixed_point_f32"]
