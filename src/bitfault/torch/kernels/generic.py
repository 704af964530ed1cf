"""Encode -> fault -> decode in generic tensor ops: every format, overflow policy and float
dtype, bit for bit what ``bitfault.inject`` does.

The core's pipeline written in float64/int64 tensor ops; each format's own encode and
decode register in its family module (``kernels.fixed``, ``kernels.intquant``,
``kernels.floats``) and are found through ``kernels.registry``. Words are int64 tensors holding
the stored bit pattern in their low ``fmt.bits`` bits; a fault is one ``xor``/``and``/``or``
with the mask, which touches only those bits, so the container width never matters.

Float conversions round and carry NaN payloads as NumPy does: PyTorch agrees with NumPy
on every finite value and infinity for float32 <-> float64 and float32 -> float16, but
not on NaNs (PyTorch quiets signalling NaNs) and not on float64 -> float16 (PyTorch
rounds twice, through float32). Faulty words decode to NaNs of every kind, so the
pipeline converts through the helpers below wherever a NaN or a double rounding could
reach the result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from bitfault.faults.models import BitFlip, FaultModel, StuckAt
from bitfault.formats import Format
from bitfault.torch.kernels.registry import kernels_for, registered

_F16_EXP = 0x7C00
_F32_EXP = 0x7F800000
_SIGN64 = -(1 << 63)  # 0x8000000000000000 as an int64


# ---- float conversions with NumPy's rounding and NaN payloads ----------------------------

def _none(mask: torch.Tensor) -> bool:
    """True when no element is set, checked only where it is free (on the CPU); elsewhere
    the callers just apply their fix to every element instead of syncing the device."""
    return mask.device.type == "cpu" and not bool(mask.any())


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


# ---- words and faults --------------------------------------------------------------------

def sign_extend(words: torch.Tensor, bits: int) -> torch.Tensor:
    """Two's complement value of the low ``bits`` bits of int64 words."""
    shift = 64 - bits
    return (words << shift) >> shift if shift else words


def sign_extend32(words: torch.Tensor, bits: int) -> torch.Tensor:
    """The same for int32 words."""
    shift = 32 - bits
    return (words << shift) >> shift if shift else words


def apply_fault_(words: torch.Tensor, masks: torch.Tensor, fault: FaultModel) -> torch.Tensor:
    """``apply_fault`` in place on ``words`` (a scratch tensor of the caller's)."""
    if isinstance(fault, BitFlip):
        return words.bitwise_xor_(masks)
    if isinstance(fault, StuckAt):
        return words.bitwise_or_(masks) if fault.value == 1 else words.bitwise_and_(~masks)
    raise TypeError(f"fault must be BitFlip() or StuckAt(0|1), got {fault!r}")


def apply_fault(words: torch.Tensor, masks: torch.Tensor, fault: FaultModel) -> torch.Tensor:
    """Words (int64) with ``fault`` applied at ``masks``; a new tensor."""
    if isinstance(fault, BitFlip):
        return words ^ masks
    if isinstance(fault, StuckAt):
        return words | masks if fault.value == 1 else words & ~masks
    raise TypeError(f"fault must be BitFlip() or StuckAt(0|1), got {fault!r}")


# ---- the pipeline ------------------------------------------------------------------------

def round_codes(y: torch.Tensor, rounding: str) -> torch.Tensor:
    if rounding == "nearest":
        return torch.round(y)  # half to even, as np.rint
    return torch.div(y, 1.0, rounding_mode="trunc")


def _first_bad(bad: torch.Tensor, x: torch.Tensor) -> tuple[tuple[int, ...], float]:
    flat = int(torch.nonzero(bad.reshape(-1))[0])
    index = tuple(int(i) for i in np.unravel_index(flat, tuple(bad.shape))) if bad.ndim else ()
    return index, float(x.reshape(-1)[flat])


def to_int_range(y: torch.Tensor, lo: int, hi: int, overflow: str, x: torch.Tensor,
                  what: str) -> torch.Tensor:
    """The core's ``_to_int_range`` on float64 tensors: int64 codes in [lo, hi]."""
    if overflow == "error":
        bad = ~torch.isfinite(y) | (y < lo) | (y > hi)
        if bool(bad.any()):
            index, value = _first_bad(bad, x)
            raise ValueError(
                f"{what}: value {value!r} at index {index} is NaN, infinite or outside the "
                f"representable range (overflow='error'; use 'saturate' or 'wrap' to map it)")
        return y.to(torch.int64)
    y = torch.nan_to_num(y, nan=0.0, posinf=math.inf, neginf=-math.inf)
    if overflow == "wrap":
        span = float(hi - lo + 1)
        fin = torch.isfinite(y)
        wrapped = torch.fmod(torch.where(fin, y, 0.0) - lo, span)
        wrapped = torch.where(wrapped < 0, wrapped + span, wrapped) + lo
        y = torch.where(fin, wrapped, y)
    return y.clamp(lo, hi).to(torch.int64)



_ZEROS: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def positive_zero(device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A cached 0-dim +0.0: ``torch.add(zero, t, alpha=a)`` scales and turns -0.0 into +0.0."""
    z = _ZEROS.get((device, dtype))
    if z is None:
        z = _ZEROS[(device, dtype)] = torch.zeros((), dtype=dtype, device=device)
    return z


def scratch(buffers: dict | None, n: int, dtype: torch.dtype,
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


def split(out: torch.Tensor, xs: Sequence[torch.Tensor], offsets: Sequence[int],
          sizes: Sequence[int]) -> list[torch.Tensor]:
    """The views of flat ``out`` that hold each tensor of ``xs`` (at ``offsets``, ``sizes``
    elements), shaped like it."""
    spans = zip(xs, offsets, sizes, strict=True)
    return [out[o:o + n].view(x.shape) for x, o, n in spans]


def encode(x: torch.Tensor, fmt: Format, calib: object = None) -> torch.Tensor:
    """Words: int64 tensors holding the stored bit patterns in the low ``fmt.bits`` bits."""
    kernel = kernels_for(fmt).encode
    if kernel is None:
        raise TypeError(f"fmt must be one of {', '.join(registered('encode'))}, got {fmt!r}")
    return kernel(x, fmt, calib)


def decode(words: torch.Tensor, fmt: Format, calib: object, dtype: torch.dtype
           ) -> torch.Tensor:
    """Floats of ``dtype`` from words, reading only the low ``fmt.bits`` bits."""
    kernel = kernels_for(fmt).decode
    if kernel is None:
        raise TypeError(f"fmt must be one of {', '.join(registered('decode'))}, got {fmt!r}")
    return kernel(words, fmt, calib, dtype)


def faulty_generic(x: torch.Tensor, fmt: Format, fault: FaultModel, index: torch.Tensor,
                   masks: torch.Tensor, strict: bool = False) -> torch.Tensor:
    """Encode all of ``x``, fault the words at ``index``, decode: a new tensor like ``x``.

    ``x`` is float16, float32 or float64. An IntQuant tensor with NaN or inf
    raises ValueError when ``strict`` (as the core does) and comes out all NaN
    otherwise.
    """
    calibrate = kernels_for(fmt).calibrate
    calib = calibrate(x, fmt) if calibrate is not None else None
    if calib is not None and strict and not bool(calib.finite):
        fmt.calibrate(x.detach().cpu().numpy())  # raises the core's error, word for word
        raise AssertionError("IntQuant: a calibration the core accepts came out non-finite")
    words = encode(x, fmt, calib)
    flat = words.reshape(-1)
    if index.numel():
        flat.scatter_(0, index, apply_fault(flat.index_select(0, index), masks, fault))
    out = decode(words, fmt, calib, x.dtype)
    if calib is not None and not strict:
        out = torch.where(calib.finite, out, torch.nan)
    return out
