"""Encode -> fault -> decode on torch tensors, bit for bit what ``bitfault.inject`` does.

Two ways to the same bits:

* ``faulty_generic``: the core's pipeline written in float64/int64 tensor ops
  (every format, overflow policy and float dtype; NumPy's NaN and rounding rules
  through ``_convert``).
* float32 fast paths for the formats that training uses: one dense pass that
  rounds every element through the format and back (its clean value), then the
  faulty elements only, computed exactly from their codes and written over it.
  Everything about the map (flat indices, masks) is prepared once per device.

Words are int64 tensors holding the stored bit pattern (two's complement codes
in the fast paths); a fault is one ``xor``/``and``/``or`` with the mask, which
touches only the low ``bits`` bits, so the container width never matters.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bitfault.faults import BitFlip, FaultModel, StuckAt
from bitfault.formats import FixedPoint, Float, IntQuant
from bitfault.maps import FaultMap
from bitfault.torch import _fused
from bitfault.torch._convert import f16_to, f32_to, f64_to, to_f16, to_f32

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_CONTAINERS = {8: torch.int8, 16: torch.int16, 32: torch.int32}
_ZEROS: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def check_float_dtype(dtype: torch.dtype, argument: str) -> None:
    """Raise TypeError unless ``dtype`` is one the adapter can store and fault."""
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{argument} has dtype {dtype}; fault injection needs a floating tensor: "
                        f"one of float16, bfloat16, float32, float64")


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


def _sign_extend(words: torch.Tensor, bits: int) -> torch.Tensor:
    """Two's complement value of the low ``bits`` bits of int64 words."""
    shift = 64 - bits
    return (words << shift) >> shift if shift else words


def _sign_extend32(words: torch.Tensor, bits: int) -> torch.Tensor:
    """The same for int32 words."""
    shift = 32 - bits
    return (words << shift) >> shift if shift else words


# ---- fault positions on a device ----------------------------------------------------------

@dataclass(frozen=True)
class DeviceFaults:
    """Fault positions of one or more tensors laid end to end, on one device.

    ``index``: flat element indices (int64) into the concatenation; ``masks``: the
    faulty bits of each (int64, restricted to the bits the fault model may touch;
    entries left without any are dropped); ``offsets``/``sizes``: where each
    tensor starts and how many elements it has; ``spans[i]``: the slice of
    ``index``/``masks`` that belongs to tensor ``i``.
    """

    index: torch.Tensor
    masks: torch.Tensor
    masks32: torch.Tensor  # the same bits in int32 (bit 31 as the sign)
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]

    @classmethod
    def build(cls, maps: Sequence[FaultMap], eligible_mask: int,
              device: torch.device | str) -> DeviceFaults:
        idx_parts, mask_parts, offsets, sizes, spans = [], [], [], [], []
        offset = start = 0
        for fmap in maps:
            masks = fmap.masks & np.uint32(eligible_mask)
            keep = masks != 0
            idx_parts.append(fmap.indices[keep] + offset)
            mask_parts.append(masks[keep].astype(np.int64))
            offsets.append(offset)
            sizes.append(fmap.size)
            spans.append((start, start + int(keep.sum())))
            start = spans[-1][1]
            offset += fmap.size
        index = np.concatenate(idx_parts) if idx_parts else np.zeros(0, np.int64)
        masks = np.concatenate(mask_parts) if mask_parts else np.zeros(0, np.int64)
        return cls(torch.from_numpy(index.astype(np.int64, copy=False)).to(device),
                   torch.from_numpy(masks).to(device),
                   torch.from_numpy(masks.astype(np.uint32).view(np.int32)).to(device),
                   tuple(offsets), tuple(sizes), tuple(spans))

    def masks_as(self, dtype: torch.dtype) -> torch.Tensor:
        """The masks in a narrower signed container (same low bits), cached."""
        if dtype == torch.int32:
            return self.masks32
        cache = self.__dict__.setdefault("_narrow", {})
        if dtype not in cache:
            cache[dtype] = self.masks32.to(dtype)  # wraps: keeps the low bits
        return cache[dtype]

    def host_parts(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per tensor: (flat indices relative to it, int64 masks) as NumPy arrays, cached
        (the fused CPU kernels' form; the tensors must be on the CPU)."""
        parts = self.__dict__.get("_host_parts")
        if parts is None:
            index, masks = self.index.numpy(), self.masks.numpy()
            parts = self.__dict__["_host_parts"] = [
                (np.ascontiguousarray(index[a:b] - o), np.ascontiguousarray(masks[a:b]))
                for (a, b), o in zip(self.spans, self.offsets, strict=True)]
        return parts

    def part(self, i: int) -> DeviceFaults:
        """The faults of tensor ``i`` alone (indices relative to it)."""
        if len(self.sizes) == 1:
            return self
        a, b = self.spans[i]
        index = self.index[a:b]
        return DeviceFaults(index - self.offsets[i] if self.offsets[i] else index,
                            self.masks[a:b], self.masks32[a:b], (0,), (self.sizes[i],),
                            ((0, b - a),))


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


# ---- the exact generic path (any format, any float dtype) --------------------------------

@dataclass(frozen=True)
class Calibration:
    """IntQuant scale (float64) and zero point (int64), shaped to broadcast against x."""

    scale: torch.Tensor
    zero: torch.Tensor
    finite: torch.Tensor  # 0-dim bool: the clean tensor had no NaN or inf


def calibrate(x: torch.Tensor, fmt: IntQuant) -> Calibration:
    """``IntQuant.calibrate`` in float64 on x's device (non-finite input: see ``finite``)."""
    lo, hi = fmt.code_range
    dims = fmt._reduce_axes(x.ndim)  # raises ValueError for an axis out of range
    dev = x.device
    if x.numel() == 0:
        return Calibration(torch.ones((), dtype=torch.float64, device=dev),
                           torch.zeros((), dtype=torch.int64, device=dev),
                           torch.ones((), dtype=torch.bool, device=dev))
    if dims is None:
        mn, mx = torch.aminmax(x)
    else:
        axis = next(d for d in range(x.ndim) if d not in dims)
        mn, mx = torch.aminmax(x.movedim(axis, 0).reshape(x.shape[axis], -1), dim=1)
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        mn, mx = mn.reshape(shape), mx.reshape(shape)
    mn, mx = mn.to(torch.float64), mx.to(torch.float64)
    finite = torch.isfinite(mn).all() & torch.isfinite(mx).all()
    if fmt.symmetric:
        scale = torch.clamp(torch.maximum(mn.neg(), mx) / hi, min=fmt.min_scale)
        zero = torch.zeros_like(scale, dtype=torch.int64)
    else:
        xmin = torch.clamp(mn, max=0.0)
        xmax = torch.clamp(mx, min=0.0)
        scale = torch.clamp((xmax - xmin) / (hi - lo), min=fmt.min_scale)
        zero = torch.round(lo - xmin / scale).clamp_(lo, hi).to(torch.int64)
    return Calibration(scale, zero, finite)


def _round(y: torch.Tensor, rounding: str) -> torch.Tensor:
    if rounding == "nearest":
        return torch.round(y)  # half to even, as np.rint
    return torch.div(y, 1.0, rounding_mode="trunc")


def _first_bad(bad: torch.Tensor, x: torch.Tensor) -> tuple[tuple[int, ...], float]:
    flat = int(torch.nonzero(bad.reshape(-1))[0])
    index = tuple(int(i) for i in np.unravel_index(flat, tuple(bad.shape))) if bad.ndim else ()
    return index, float(x.reshape(-1)[flat])


def _to_int_range(y: torch.Tensor, lo: int, hi: int, overflow: str, x: torch.Tensor,
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


def encode(x: torch.Tensor, fmt, calib: Calibration | None = None) -> torch.Tensor:
    """Words: int64 tensors holding the stored bit patterns in the low ``fmt.bits`` bits."""
    if isinstance(fmt, FixedPoint):
        y = _round(x.to(torch.float64) * 2.0**fmt.frac, fmt.rounding)
        lo, hi = fmt.code_range
        return _to_int_range(y, lo, hi, fmt.overflow, x, f"FixedPoint{fmt._q()}") & fmt.word_mask
    if isinstance(fmt, IntQuant):
        if calib is None:
            raise ValueError("IntQuant needs a calibration (scale and zero point)")
        y = _round(x.to(torch.float64) / calib.scale, fmt.rounding) + calib.zero
        lo, hi = fmt.code_range
        codes = _to_int_range(y, lo, hi, "saturate", x, "IntQuant")
        return (codes + fmt._offset) & fmt.word_mask
    if isinstance(fmt, Float):
        if fmt.dtype == "float16":
            return to_f16(x).view(torch.int16).to(torch.int64) & 0xFFFF
        f = to_f32(x)
        u = f.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        if fmt.dtype == "float32":
            return u
        rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        top = torch.where(torch.isnan(f), (u >> 16) | 0x0040, rounded)
        return top & 0xFFFF
    raise TypeError(f"fmt must be FixedPoint, IntQuant or Float, got {fmt!r}")


def decode(words: torch.Tensor, fmt, calib: Calibration | None, dtype: torch.dtype
           ) -> torch.Tensor:
    """Floats of ``dtype`` from words, reading only the low ``fmt.bits`` bits."""
    if isinstance(fmt, FixedPoint):
        codes = _sign_extend(words & fmt.word_mask, fmt.bits)
        return f64_to(codes.to(torch.float64) * 2.0**-fmt.frac, dtype)
    if isinstance(fmt, IntQuant):
        if calib is None:
            raise ValueError("IntQuant needs a calibration (scale and zero point)")
        low = words & fmt.word_mask
        stored = _sign_extend(low, fmt.bits) if fmt.codes == "signed" else low
        q = stored - fmt._offset - calib.zero
        return f64_to(q.to(torch.float64) * calib.scale, dtype)
    if isinstance(fmt, Float):
        if fmt.dtype == "float16":
            h = _sign_extend(words & 0xFFFF, 16).to(torch.int16).view(torch.float16)
            return f16_to(h, dtype)
        low = words & 0xFFFFFFFF if fmt.dtype == "float32" else (words & 0xFFFF) << 16
        f = _sign_extend(low, 32).to(torch.int32).view(torch.float32)
        return f32_to(f, dtype)
    raise TypeError(f"fmt must be FixedPoint, IntQuant or Float, got {fmt!r}")


def faulty_generic(x: torch.Tensor, fmt, fault: FaultModel, index: torch.Tensor,
                   masks: torch.Tensor, strict: bool = False) -> torch.Tensor:
    """Encode all of ``x``, fault the words at ``index``, decode: a new tensor like ``x``.

    ``x`` is float16, float32 or float64. An IntQuant tensor with NaN or inf
    raises ValueError when ``strict`` (as the core does) and comes out all NaN
    otherwise.
    """
    calib = calibrate(x, fmt) if isinstance(fmt, IntQuant) else None
    if calib is not None and strict and not bool(calib.finite):
        index_, value = _first_bad(~torch.isfinite(x), x)
        raise ValueError(f"IntQuant: value {value!r} at index {index_} is not finite; "
                         "a scale cannot be computed from NaN or inf")
    words = encode(x, fmt, calib)
    flat = words.reshape(-1)
    if index.numel():
        flat.scatter_(0, index, apply_fault(flat.index_select(0, index), masks, fault))
    out = decode(words, fmt, calib, x.dtype)
    if calib is not None and not strict:
        out = torch.where(calib.finite, out, torch.nan)
    return out


# ---- float32 fast paths --------------------------------------------------------------------

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
            words = _sign_extend32(apply_fault_(codes.to(torch.int32), faults.masks32, fault),
                                   fmt.bits)
        else:
            words = codes.to(torch.int64)
            if hi32 > hi:
                words.clamp_(max=hi)
            words = _sign_extend(apply_fault(words, faults.masks, fault), fmt.bits)
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


def _host_calibration(x: torch.Tensor, fmt: IntQuant
                      ) -> tuple[float | torch.Tensor, int | torch.Tensor, bool]:
    """``IntQuant.calibrate`` for a CPU tensor: the same float64 arithmetic, on the host.

    Returns (scale, zero, finite): Python numbers for one scale per tensor (Python
    floats are IEEE doubles, ``round`` is half to even like ``np.rint``),
    broadcastable tensors per channel.
    """
    lo, hi = fmt.code_range
    dims = fmt._reduce_axes(x.ndim)
    if dims is None:
        mn_t, mx_t = torch.aminmax(x)
        mn, mx = mn_t.item(), mx_t.item()
        if not (math.isfinite(mn) and math.isfinite(mx)):
            return 1.0, 0, False
        if fmt.symmetric:
            scale, zero = max(max(-mn, mx) / hi, fmt.min_scale), 0
        else:
            xmin, xmax = min(mn, 0.0), max(mx, 0.0)
            scale = max((xmax - xmin) / (hi - lo), fmt.min_scale)
            zero = min(max(round(lo - xmin / scale), lo), hi)
        return scale, zero, True
    axis = next(d for d in range(x.ndim) if d not in dims)
    mn_t, mx_t = torch.aminmax(x.movedim(axis, 0).reshape(x.shape[axis], -1), dim=1)
    mn, mx = mn_t.numpy().astype(np.float64), mx_t.numpy().astype(np.float64)
    if not (np.isfinite(mn).all() and np.isfinite(mx).all()):
        return 1.0, 0, False
    if fmt.symmetric:  # the core's formulas, on the per-channel extremes
        scale = np.maximum(np.maximum(-mn, mx) / hi, fmt.min_scale)
        zero = np.zeros_like(scale, dtype=np.int64)
    else:
        xmin, xmax = np.minimum(mn, 0.0), np.maximum(mx, 0.0)
        scale = np.maximum((xmax - xmin) / (hi - lo), fmt.min_scale)
        zero = np.clip(np.rint(lo - xmin / scale), lo, hi).astype(np.int64)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    scale = scale.reshape(shape)
    return torch.from_numpy(scale), torch.from_numpy(zero.reshape(shape)), True


def _fault_codes_(y: torch.Tensor, fmt: IntQuant, fault: FaultModel,
                  faults: DeviceFaults) -> None:
    """Replace the codes (float64, flat ``y``) at the faulty elements by their faulted codes."""
    index = faults.index
    codes = y.index_select(0, index)
    container = _CONTAINERS.get(fmt.bits)
    if container is not None and fmt._offset == 0 and fmt.codes == "signed":
        # the stored word is the code's two's complement in a container of exactly
        # ``bits``: the wrapping cast is the sign extension
        words = apply_fault_(codes.to(container), faults.masks_as(container), fault)
        y.scatter_(0, index, words.to(torch.float64))
        return
    words = (codes.to(torch.int64) + fmt._offset) & fmt.word_mask
    stored = apply_fault(words, faults.masks, fault)
    stored = _sign_extend(stored, fmt.bits) if fmt.codes == "signed" else stored & fmt.word_mask
    y.scatter_(0, index, (stored - fmt._offset).to(torch.float64))


def faulty_int_quant_f32(xs: Sequence[torch.Tensor], fmt: IntQuant, fault: FaultModel,
                         faults: DeviceFaults, buffers: dict | None = None
                         ) -> list[torch.Tensor]:
    """IntQuant on float32 tensors, in float64 as the core computes it, as one flat pass.

    Per tensor (its own scale ``s`` and zero point ``z``): ``y = round(x / s) + z``,
    clamped, is every element's code. The faulty elements' codes are faulted as
    words and written back into ``y``; then ``(y - z) * s`` decodes all at once.
    A tensor with NaN or inf comes out all NaN.
    """
    lo, hi = fmt.code_range
    dev = xs[0].device
    on_cpu = dev.type == "cpu"
    y = _scratch(buffers, sum(faults.sizes), torch.float64, dev)
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
        part.copy_(x)
        if fmt.rounding == "trunc":
            torch.div(part, scale, rounding_mode="trunc", out=part)
        else:
            part.div_(scale)
        if not fmt.symmetric:  # round first, then add z, as the core does
            if fmt.rounding == "nearest":
                part.round_()
            part.add_(zero)
    if fmt.rounding == "nearest" and fmt.symmetric:
        y.round_()
    if clamp:  # symmetric and finite: |round(x / s)| <= hi already
        y.clamp_(lo, hi).nan_to_num_(0.0)
    if faults.index.numel():
        _fault_codes_(y, fmt, fault, faults)
    zero64 = _zero(dev, torch.float64)
    for part, (scale, zero, _) in zip(parts, calibs, strict=True):
        if not fmt.symmetric:
            part.sub_(zero).mul_(scale)  # a code minus z is an exact integer: never -0.0
        elif isinstance(scale, float):
            torch.add(zero64, part, alpha=scale, out=part)  # -0.0 -> +0.0
        else:
            part.mul_(scale).add_(0.0)  # round() leaves -0.0 where code 0 decodes to +0.0
    out = y.to(torch.float32)
    outs = []
    for i, (x, (_, _, finite)) in enumerate(zip(xs, calibs, strict=True)):
        o = out[faults.offsets[i]:faults.offsets[i] + faults.sizes[i]].view(x.shape)
        if i in poisoned:
            o.fill_(math.nan)
        elif finite is not None:
            o = torch.where(finite, o, math.nan)
        outs.append(o)
    return outs


# ---- the fused CPU kernels (Numba) ---------------------------------------------------------

def compiled_for(x: torch.Tensor, fmt: object) -> bool:
    """Whether the compiled CPU kernels (``_fused``) compute ``x`` in ``fmt``: float32 on the
    CPU, Numba available, a format they support."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and _fused.available() and \
        _fused.supports(fmt, x.ndim)


def _storage_users(t: torch.Tensor) -> int:
    """How many tensors share ``t``'s memory (-1 where this PyTorch cannot tell)."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    return -1 if use_count is None else int(use_count(t.untyped_storage()._cdata))


class _FusedPass:
    """The compiled CPU pass over one group of tensors, bound once per map (``_fused``):
    each tensor's kernel, and the last output (with its views), written again once nothing
    else holds it."""

    def __init__(self, fmt: FixedPoint | IntQuant, fault: FaultModel, faults: DeviceFaults,
                 shapes: Sequence[tuple[int, ...]]) -> None:
        self.calls = [_fused.bind(fmt, fault, index, masks, shape)
                      for (index, masks), shape in zip(faults.host_parts(), shapes, strict=True)]
        self.spans = [(o, o + n, shape) for o, n, shape in
                      zip(faults.offsets, faults.sizes, shapes, strict=True)]
        self.total = sum(faults.sizes)
        # the kept output: (flat tensor, its users while only this holds it, numpy slices,
        # tensor views); callers hand out only fresh aliases of the views
        self.kept: tuple[torch.Tensor, int, list[np.ndarray], list[torch.Tensor]] | None = None

    def _output(self, reuse: bool) -> tuple[list[np.ndarray], list[torch.Tensor]]:
        """Where to write: the kept output when nothing else holds it any more (no graph
        saved it, no caller kept it): warm memory, not fresh pages to fault in."""
        kept = self.kept
        if reuse and kept is not None and _storage_users(kept[0]) == kept[1] != -1:
            return kept[2], kept[3]
        out = torch.empty(self.total, dtype=torch.float32)
        flat = out.numpy()
        dsts = [flat[a:b] for a, b, _ in self.spans]
        views = [out[a:b].view(shape) for a, b, shape in self.spans]
        if reuse:
            self.kept = (out, _storage_users(out), dsts, views)
        return dsts, views

    def __call__(self, xs: Sequence[torch.Tensor], reuse: bool) -> list[torch.Tensor]:
        dsts, views = self._output(reuse)
        for x, call, dst in zip(xs, self.calls, dsts, strict=True):
            call(x.reshape(-1).numpy(), dst)
        return views


def _fused_group(xs: Sequence[torch.Tensor], fmt: FixedPoint | IntQuant, fault: FaultModel,
                 faults: DeviceFaults, reuse_output: bool) -> list[torch.Tensor]:
    """FixedPoint "saturate" or IntQuant (per tensor / per channel on axis 0) on float32 CPU
    tensors: one compiled pass per tensor into one flat output, its plan kept with
    ``faults``."""
    kept = faults.__dict__.get("_fused")  # (fmt, fault, plan): the same objects call after call
    if kept is None or kept[0] is not fmt or kept[1] is not fault:
        if kept is None or kept[0] != fmt or kept[1] != fault:
            kept = (fmt, fault, _FusedPass(fmt, fault, faults, [x.shape for x in xs]))
        faults.__dict__["_fused"] = kept = (fmt, fault, kept[2])
    return kept[2](xs, reuse_output)


# ---- entry point --------------------------------------------------------------------------

def _fast_elementwise(fmt) -> bool:
    return (isinstance(fmt, FixedPoint) and fmt.overflow == "saturate") or (
        isinstance(fmt, Float) and fmt.dtype == "float32")


def faulty_group(xs: Sequence[torch.Tensor], fmt, fault: FaultModel, faults: DeviceFaults,
                 strict: bool = False, buffers: dict | None = None,
                 reuse_output: bool = False) -> list[torch.Tensor]:
    """Faulty copies of tensors ``xs`` (one dtype, one device) under ``faults``.

    Elementwise formats on float32 run as one flat pass over all the tensors;
    bfloat16 goes through float32 and is rounded back by PyTorch's cast.
    ``buffers``: a dict the caller keeps between calls, where host scratch is reused.
    ``reuse_output``: the fused CPU kernels may write into the output of the previous call
    with the same ``faults`` once nothing else holds it; the tensors returned are then that
    output's own views, to be handed on only as fresh aliases (``detach()``, ``view_as``).
    """
    if not xs:
        return []
    dtype = xs[0].dtype
    if dtype == torch.bfloat16:
        outs = faulty_group([x.to(torch.float32) for x in xs], fmt, fault, faults, strict,
                            buffers)
        return [o.to(torch.bfloat16) for o in outs]
    if (not strict or not isinstance(fmt, IntQuant)) and all(compiled_for(x, fmt) for x in xs):
        return _fused_group(xs, fmt, fault, faults, reuse_output)
    if dtype == torch.float32 and _fast_elementwise(fmt):
        if isinstance(fmt, FixedPoint):
            out = faulty_fixed_point_f32(xs, fmt, fault, faults)
        else:
            flat = torch.cat([x.reshape(-1) for x in xs]) if len(xs) > 1 else xs[0].reshape(-1)
            out = faulty_float32_f32(flat, fault, faults)
        spans = zip(xs, faults.offsets, faults.sizes, strict=True)
        return [out[o:o + n].view(x.shape) for x, o, n in spans]
    if dtype == torch.float32 and isinstance(fmt, IntQuant) and not strict:
        return faulty_int_quant_f32(xs, fmt, fault, faults, buffers)
    outs = []
    for i, x in enumerate(xs):
        part = faults.part(i)
        outs.append(faulty_generic(x, fmt, fault, part.index, part.masks, strict=strict))
    return outs
