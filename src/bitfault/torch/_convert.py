"""Float conversions that round and carry NaN payloads exactly as NumPy does.

PyTorch agrees with NumPy on every finite value and infinity for float32 <-> float64
and float32 -> float16, but not on NaNs (PyTorch quiets signalling NaNs) and
not on float64 -> float16 (PyTorch rounds twice, through float32). Faulty words
decode to NaNs of every kind, so the adapter converts through these helpers
wherever a NaN or a double rounding could reach the result.
"""

from __future__ import annotations

import torch

_F16_EXP = 0x7C00


def _none(mask: torch.Tensor) -> bool:
    """True when no element is set, checked only where it is free (on the CPU); elsewhere
    the callers just apply their fix to every element instead of syncing the device."""
    return mask.device.type == "cpu" and not bool(mask.any())
_F32_EXP = 0x7F800000
_SIGN64 = -(1 << 63)  # 0x8000000000000000 as an int64


def f16_nan_from_sig(sign: torch.Tensor, sig_top: torch.Tensor) -> torch.Tensor:
    """float16 bits of a NaN with ``sig_top`` (its 10 mantissa bits), never an infinity."""
    ret = sig_top + _F16_EXP
    ret = ret + (ret == _F16_EXP).to(ret.dtype)
    return sign | ret


def f32_to_f16(x: torch.Tensor) -> torch.Tensor:
    """float32 -> float16, round to nearest even; NaNs keep their top payload bits."""
    out = x.to(torch.float16)
    nan = torch.isnan(x)
    if _none(nan):
        return out
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    h = f16_nan_from_sig((bits >> 16) & 0x8000, (bits & 0x7FFFFF) >> 13)
    return torch.where(nan, h.to(torch.int16), out.view(torch.int16)).view(torch.float16)


def f16_to_f32(h: torch.Tensor) -> torch.Tensor:
    """float16 -> float32, exact; signalling NaNs stay signalling."""
    out = h.to(torch.float32)
    nan = torch.isnan(h)
    if _none(nan):
        return out
    hb = h.view(torch.int16).to(torch.int64) & 0xFFFF
    fb = ((hb & 0x8000) << 16) | _F32_EXP | ((hb & 0x3FF) << 13)
    fb = ((fb << 32) >> 32).to(torch.int32)  # the same 32 bits as a signed int32
    return torch.where(nan, fb, out.view(torch.int32)).view(torch.float32)


def f16_to_f64(h: torch.Tensor) -> torch.Tensor:
    """float16 -> float64, exact; signalling NaNs stay signalling."""
    out = h.to(torch.float64)
    nan = torch.isnan(h)
    if _none(nan):
        return out
    hb = h.view(torch.int16).to(torch.int64) & 0xFFFF
    sign = torch.where((hb & 0x8000) != 0, _SIGN64, 0)
    db = sign | 0x7FF0000000000000 | ((hb & 0x3FF) << 42)
    return torch.where(nan, db, out.view(torch.int64)).view(torch.float64)


def f64_to_f16(d: torch.Tensor) -> torch.Tensor:
    """float64 -> float16 with one rounding (to nearest even), as NumPy does.

    Rounds to float32 with round-to-odd first (float32 keeps 13 more bits than
    float16, so the second rounding is then exact), NaNs by NumPy's rule.
    """
    f = d.to(torch.float32)
    back = f.to(torch.float64)
    inexact = (back != d) & torch.isfinite(back)
    if not _none(inexact):
        bits = f.view(torch.int32)
        toward_zero = bits - (back.abs() > d.abs()).to(torch.int32)  # magnitude down one ulp
        f = torch.where(inexact, toward_zero | 1, bits).view(torch.float32)
    out = f.to(torch.float16)
    nan = torch.isnan(d)
    if _none(nan):
        return out
    db = d.view(torch.int64)
    sign = torch.where(db < 0, 0x8000, 0)
    h = f16_nan_from_sig(sign, (db & 0xFFFFFFFFFFFFF) >> 42)
    return torch.where(nan, h.to(torch.int16), out.view(torch.int16)).view(torch.float16)


def f64_to(d: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 -> ``dtype`` (float16/32/64) with NumPy's single rounding."""
    if dtype == torch.float64:
        return d
    if dtype == torch.float16:
        return f64_to_f16(d)
    return d.to(dtype)


def f32_to(f: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 -> ``dtype`` (float16/32/64) as NumPy's ``astype``."""
    if dtype == torch.float16:
        return f32_to_f16(f)
    return f.to(dtype)


def f16_to(h: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float16 -> ``dtype`` (float16/32/64) as NumPy's ``astype``."""
    if dtype == torch.float32:
        return f16_to_f32(h)
    if dtype == torch.float64:
        return f16_to_f64(h)
    return h


def to_f32(x: torch.Tensor) -> torch.Tensor:
    """float16/32/64 -> float32 as NumPy's ``astype(float32)``."""
    if x.dtype == torch.float16:
        return f16_to_f32(x)
    return x.to(torch.float32)


def to_f16(x: torch.Tensor) -> torch.Tensor:
    """float16/32/64 -> float16 as NumPy's ``astype(float16)``."""
    if x.dtype == torch.float32:
        return f32_to_f16(x)
    if x.dtype == torch.float64:
        return f64_to_f16(x)
    return x
