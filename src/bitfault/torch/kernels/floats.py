"""Float in PyTorch: float16, bfloat16 and float32 words by bit casts, the small floats
(float8, float6, float4) through their codec's tables; the float32 fast paths of
Float("float32") and of the saturating small floats."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from bitfault.faults.models import FaultModel
from bitfault.formats import Float
from bitfault.formats.minifloat import MiniFloat
from bitfault.torch.kernels.block_formats import faulty_small_float
from bitfault.torch.kernels.generic import (
    apply_fault,
    f16_to,
    f32_to,
    sign_extend,
    split,
    to_f16,
    to_f32,
)
from bitfault.torch.kernels.registry import register

if TYPE_CHECKING:
    from bitfault.torch.kernels.device import DeviceFaults

_NUMPY_FLOATS = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}


@functools.cache
def _small_float_tables(codec: MiniFloat, device: torch.device
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.from_numpy(codec.midpoints).to(device),
            torch.from_numpy(codec.tie_up).to(device))


@functools.cache
def _decode_table(codec: MiniFloat, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(codec.decode_table(_NUMPY_FLOATS[dtype]).copy()).to(device)


def encode_small_float(x: torch.Tensor, fmt: Float) -> torch.Tensor:
    """The small float codes of ``x`` (``MiniFloat.encode`` on the device): round against
    the midpoints (``searchsorted``), exact ties by the codec's rule, then the policy."""
    codec = fmt.codec
    assert codec is not None
    n = codec.n_finite
    x64 = x.to(torch.float64)  # exact from float16/float32
    a = x64.abs()
    mid, tie_up = _small_float_tables(codec, x.device)
    idx = torch.searchsorted(mid, a.reshape(-1), side="left").reshape(a.shape)
    at = idx.clamp(max=n - 1)
    idx = idx + ((idx < n) & (a == mid[at]) & tie_up[at]).to(torch.int64)
    sign = torch.where(torch.signbit(x64), codec.sign_bit, 0) if codec.signed else 0
    codes = idx | sign
    nan = torch.isnan(x64)
    low = ~nan & (x64 <= 0) if not codec.signed else torch.zeros_like(nan)
    over = ~nan & ~low & (idx >= n)
    keep_inf = over & torch.isinf(x64) if codec.has_infinity and fmt.overflow != "saturate" \
        else torch.zeros_like(nan)
    mapped = over & ~keep_inf
    if fmt.overflow == "error":
        bad = mapped | low | (nan if codec.nan_code is None else torch.zeros_like(nan))
        if bool(bad.any()):
            codec.check_storable(bad.cpu().numpy(), x64.cpu().numpy())
    if fmt.overflow == "nan":
        target = codec.inf_code if codec.has_infinity else codec.nan_code
    else:
        target = n - 1
    codes = torch.where(mapped, sign | target, codes)
    codes = torch.where(keep_inf, sign | n, codes)
    codes = torch.where(low, codec.nan_code if fmt.overflow == "nan" else 0, codes)
    nan_stored = 0 if codec.nan_code is None else sign | codec.nan_code
    return torch.where(nan, nan_stored, codes)


def decode_small_float(words: torch.Tensor, fmt: Float, dtype: torch.dtype) -> torch.Tensor:
    """Floats of ``dtype`` from small float words: the codec's decode table, looked up."""
    codec = fmt.codec
    assert codec is not None
    return _decode_table(codec, dtype, words.device)[words & fmt.word_mask]


def encode(x: torch.Tensor, fmt: Float, calib: object = None) -> torch.Tensor:
    """The words of ``x`` in the low ``fmt.bits`` bits of int64."""
    if fmt.codec is not None:
        return encode_small_float(x, fmt)
    if fmt.dtype == "float16":
        return to_f16(x).view(torch.int16).to(torch.int64) & 0xFFFF
    f = to_f32(x)
    u = f.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    if fmt.dtype == "float32":
        return u
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    top = torch.where(torch.isnan(f), (u >> 16) | 0x0040, rounded)
    return top & 0xFFFF


def decode(words: torch.Tensor, fmt: Float, calib: object, dtype: torch.dtype
           ) -> torch.Tensor:
    """Floats of ``dtype`` from words, reading only the low ``fmt.bits`` bits."""
    if fmt.codec is not None:
        return decode_small_float(words, fmt, dtype)
    if fmt.dtype == "float16":
        h = sign_extend(words & 0xFFFF, 16).to(torch.int16).view(torch.float16)
        return f16_to(h, dtype)
    low = words & 0xFFFFFFFF if fmt.dtype == "float32" else (words & 0xFFFF) << 16
    f = sign_extend(low, 32).to(torch.int32).view(torch.float32)
    return f32_to(f, dtype)


def faulty_float32_f32(x: torch.Tensor, fault: FaultModel, faults: DeviceFaults) -> torch.Tensor:
    """Float("float32") on a flat float32 tensor: only the faulty words change."""
    out = x.clone()
    if faults.index.numel():
        bits = out.view(torch.int32)
        words = bits.index_select(0, faults.index)
        bits.scatter_(0, faults.index, apply_fault(words, faults.masks32, fault))
    return out


def fast_f32(xs: Sequence[torch.Tensor], fmt: Float, fault: FaultModel, faults: DeviceFaults,
             buffers: dict | None = None, strict: bool = False) -> list[torch.Tensor] | None:
    """Float("float32"): one flat pass; a saturating small float: the core's rounding table
    per tensor; None for the others."""
    if fmt.dtype == "float32":
        flat = torch.cat([x.reshape(-1) for x in xs]) if len(xs) > 1 else xs[0].reshape(-1)
        return split(faulty_float32_f32(flat, fault, faults), xs, faults.offsets, faults.sizes)
    if fmt.codec is not None and fmt.overflow == "saturate":
        return [faulty_small_float(x, fmt.dtype, fault, p.index, p.masks)
                for x, p in ((x, faults.part(i)) for i, x in enumerate(xs))]
    return None


register(Float, encode=encode, decode=decode, fast_f32=fast_f32)

__all__ = ["decode", "decode_small_float", "encode", "encode_small_float", "fast_f32",
           "faulty_float32_f32"]
