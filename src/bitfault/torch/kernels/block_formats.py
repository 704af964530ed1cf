"""Native tensor kernels of the block formats: MX, NVFP4, GGUF Q8_0/Q4_0/Q4_1, GroupwiseInt.

Each is the core's ``encode_blocks`` / ``decode_blocks`` written again in torch ops on a
``(n_blocks, k)`` float32 tensor, with the same float32 operations in the same order
(division where the core divides, a reciprocal where it multiplies by one, the operand
order of every product, NaN operands included). Small floats are encoded by the core's
own rounding table (``formats.mx.round_to_element`` on one representative per key) and
decoded by the core's decode of every word; maxima and minima whose zero sign reaches a
stored word (GGUF Q4_1) are reduced as the core reduces them, pairwise, with NumPy's
choice between equal operands. Words are int32 tensors holding the bit patterns of the
block form (``BlockFormat.encode_blocks``) in int32 (every plane has 32 bits or fewer).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from bitfault.faults.models import FaultModel
from bitfault.formats import BlockFormat, Float
from bitfault.formats.gguf import GGUF
from bitfault.formats.groupwise import GroupwiseInt
from bitfault.formats.minifloat import SMALL_FLOATS
from bitfault.formats.mx import EMAX_ELEM, MX, round_to_element
from bitfault.formats.nvfp4 import NVFP4, TENSOR_DIVISOR
from bitfault.torch.kernels.generic import apply_fault, f16_to_f32, sign_extend32
from bitfault.torch.kernels.registry import kernels_for, register

Planes = dict[str, torch.Tensor]


# ---- tables, once per device ----------------------------------------------------------------

@functools.cache
def _encode_table(name: str, device: torch.device) -> tuple[torch.Tensor, int, int]:
    """(the saturating code of every key, the key's shift, its mask) of small float
    ``name``: the table ``round_to_element`` reads, rebuilt from it."""
    shift = 21 - SMALL_FLOATS[name].mantissa
    reps = (np.arange(1 << (32 - shift), dtype=np.uint32) << np.uint32(shift)).view(np.float32)
    with np.errstate(invalid="ignore"):
        table = round_to_element(reps, name).astype(np.int32)
    return torch.from_numpy(table).to(device), shift, (1 << (32 - shift)) - 1


@functools.cache
def _decode_table(name: str, device: torch.device) -> torch.Tensor:
    """The float32 value of every word of small float ``name``, as the core decodes it."""
    fmt = Float(name)
    with np.errstate(all="ignore"):
        values = np.asarray(fmt.decode(np.arange(1 << fmt.bits)), dtype=np.float32)
    return torch.from_numpy(values.copy()).to(device)


def encode_small(y: torch.Tensor, name: str) -> torch.Tensor:
    """float32 ``y`` rounded to small float ``name`` (nearest even, saturating): int32 codes,
    bit for bit ``round_to_element`` (the key: sign, exponent, top mantissa bits and one
    sticky bit, the OR of every lower bit)."""
    table, shift, key_mask = _encode_table(name, y.device)
    low = (1 << shift) - 1
    bits = y.view(torch.int32)
    key = ((((bits & low) + low) | bits) >> shift) & key_mask  # arithmetic shift, masked
    return _lookup(table, key)


def _lookup(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` (``index_select`` on the flat index: several times faster on the CPU
    than advanced indexing with an int32 index)."""
    return table.index_select(0, index.reshape(-1)).view(index.shape)


def decode_small(words: torch.Tensor, name: str) -> torch.Tensor:
    """The float32 values of small float words (the core's decode of every word, looked up)."""
    return _lookup(_decode_table(name, words.device), words)


def _fp16_bits(v: torch.Tensor) -> torch.Tensor:
    """float32 (finite or inf) -> the int32 bit pattern of its fp16 rounding (nearest even)."""
    return v.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF


def _fp16_value(words: torch.Tensor) -> torch.Tensor:
    """fp16 bit patterns (low 16 bits of int32) -> float32, NaN payloads kept as NumPy does."""
    return f16_to_f32(words.to(torch.int16).view(torch.float16))  # the cast keeps the low bits


def faulty_small_float(x: torch.Tensor, name: str, fault: FaultModel, index: torch.Tensor,
                       masks: torch.Tensor) -> torch.Tensor:
    """float32 ``x`` stored as small float ``name`` (``Float(name)``, overflow "saturate"),
    faulted at flat ``index`` by int64 ``masks``, decoded: three table passes."""
    codes = encode_small(x.contiguous(), name).reshape(-1)
    if index.numel():
        codes.index_copy_(0, index, apply_fault(codes.index_select(0, index),
                                                masks.to(torch.int32), fault))
    return decode_small(codes, name).view(x.shape)


def _pairwise(b: torch.Tensor, larger: bool) -> torch.Tensor:
    """The core's pairwise max / min of each row (``gguf._reduce``), NumPy's ``maximum`` /
    ``minimum`` choosing the second operand between equal ones (so the zero signs agree)."""
    m = b.reshape(-1)
    while m.numel() > b.shape[0]:
        pairs = m.reshape(-1, 2)
        a, c = pairs[:, 0], pairs[:, 1]
        m = torch.where(a > c if larger else a < c, a, c)
    return m


def _extreme(b: torch.Tensor, larger: bool) -> torch.Tensor:
    """``_pairwise`` at the cost of ``amax`` / ``amin``: a nonzero extreme has one value
    whatever the order; only blocks whose extreme is a zero (whose sign the order picks)
    are reduced pairwise."""
    m = b.amax(dim=1) if larger else b.amin(dim=1)
    zero = m == 0
    if bool(zero.any()):
        rows = zero.nonzero()[:, 0]
        m = m.index_copy(0, rows, _pairwise(b.index_select(0, rows), larger))
    return m


# ---- the kernels ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Kernel:
    """A format's block arithmetic in torch: ``encode(fmt, blocks) -> planes`` and
    ``decode(fmt, planes) -> values``; ``storable`` says whether the clean planes hold
    what the core would store (else the core raises)."""

    encode: Callable[[BlockFormat, torch.Tensor], Planes]
    decode: Callable[[BlockFormat, Planes], torch.Tensor]
    storable: Callable[[BlockFormat, Planes], bool] = lambda fmt, planes: True


def _mx_encode(fmt: MX, b: torch.Tensor) -> Planes:
    biased = (b.view(torch.int32) & 0x7FFFFFFF).amax(dim=1) >> 23
    unbiased = torch.where(biased == 0, -127, biased - 127)
    exponent = (unbiased - EMAX_ELEM[fmt.element]).clamp_(-127, 127)
    y = b * decode_small(127 - exponent, "float8_e8m0fnu")[:, None]  # 2**-E, exact
    if fmt.element == "int8":
        y *= 64.0
        codes = torch.round(y).clamp_(-127, 127).to(torch.int32) & 0xFF
    else:
        codes = encode_small(y, fmt.element)
    return {"codes": codes, "scale": exponent + 127}


def _mx_decode(fmt: MX, planes: Planes) -> torch.Tensor:
    scale = decode_small(planes["scale"], "float8_e8m0fnu")
    codes = planes["codes"]
    if fmt.element == "int8":
        values = sign_extend32(codes & 0xFF, 8).to(torch.float32) * (2.0 ** -6)
    else:
        values = decode_small(codes, fmt.element)
    return values * scale[:, None]


def _nvfp4_encode(fmt: NVFP4, b: torch.Tensor) -> Planes:
    amax_block = b.abs().amax(dim=1)
    t = amax_block.amax() / float(TENSOR_DIVISOR)
    t = torch.where(t == 0, torch.ones_like(t), t)
    scale = encode_small(amax_block / (t * 6.0), "float8_e4m3fn")
    denominator = decode_small(scale, "float8_e4m3fn") * t
    denominator = torch.where(denominator == 0, torch.inf, denominator)
    codes = encode_small(b / denominator[:, None], "float4_e2m1fn")
    return {"codes": codes, "scale": scale,
            "tensor_scale": t.view(torch.int32)}


def _nvfp4_decode(fmt: NVFP4, planes: Planes) -> torch.Tensor:
    q = decode_small(planes["codes"], "float4_e2m1fn")
    s = decode_small(planes["scale"], "float8_e4m3fn")
    t = planes["tensor_scale"].view(torch.float32)
    return (q * s[:, None]) * t


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """``1 / d``, 0 where ``d == 0`` (llama.cpp's ``id = d ? 1.0f/d : 0.0f``)."""
    return torch.where(d == 0, torch.zeros_like(d), 1.0 / d)


def _gguf_encode(fmt: GGUF, b: torch.Tensor) -> Planes:
    if fmt.type == "q8_0":
        d = b.abs().amax(dim=1) / 127.0
        y = b * _inverse(d)[:, None]
        y = torch.nan_to_num_(y.clamp_(-127, 127), nan=0.0)  # 1/d overflowed: as the core
        t = torch.trunc(y)
        f = y - t
        q = t.to(torch.int32) + (f >= 0.5).to(torch.int32) - (f <= -0.5).to(torch.int32)
        return {"codes": q & 0xFF, "scale": _fp16_bits(d)}
    if fmt.type == "q4_0":
        signed_max = b.gather(1, b.abs().argmax(dim=1, keepdim=True))[:, 0]  # the first
        d = signed_max / -8.0
        y = b * _inverse(d)[:, None] + 8.5
        zero, mn = 8.5, None
    else:
        mx, mn = _extreme(b, True), _extreme(b, False)
        d = (mx - mn) / 15.0
        y = (b - mn[:, None]) * _inverse(d)[:, None] + 0.5
        zero = 0.0
    y = torch.nan_to_num_(y.clamp_(0, 15), nan=zero)
    out = {"codes": torch.trunc(y).to(torch.int32).clamp_(max=15), "scale": _fp16_bits(d)}
    if mn is not None:
        out["min"] = _fp16_bits(mn)
    return out


def _gguf_decode(fmt: GGUF, planes: Planes) -> torch.Tensor:
    q = planes["codes"]
    d = _fp16_value(planes["scale"])[:, None]
    if fmt.type == "q8_0":
        return d * sign_extend32(q & 0xFF, 8).to(torch.float32)
    if fmt.type == "q4_0":
        return d * ((q & 0xF) - 8).to(torch.float32)
    scaled = d * (q & 0xF).to(torch.float32)
    total = scaled + _fp16_value(planes["min"])[:, None]
    # NaN + NaN: NumPy keeps the first operand's NaN; PyTorch's add (a fused multiply-add
    # by alpha) may keep the second. ``scaled`` is the quiet NaN of a product.
    return torch.where(torch.isnan(scaled), scaled, total)


def _groupwise_encode(fmt: GroupwiseInt, b: torch.Tensor) -> Planes:
    lo_code, hi_code = fmt.code_range
    lo = b.amin(dim=1).clamp_(max=0.0)
    hi = b.amax(dim=1).clamp_(min=0.0)
    s = torch.maximum(-lo, hi) / float(hi_code) if fmt.symmetric else \
        (hi - lo) / float(hi_code - lo_code)
    s16 = s.clamp_(min=float(np.finfo(np.float32).eps)).to(torch.float16)
    scale = s16.to(torch.float32)
    q = torch.round(b * (1.0 / scale)[:, None])
    out = {"scale": s16.view(torch.int16).to(torch.int32) & 0xFFFF}
    if not fmt.symmetric:
        zp = torch.round(lo / scale).neg_().clamp_(lo_code, hi_code)
        q += zp[:, None]
        out["zero_point"] = zp.to(torch.int32)
    mask = (1 << fmt.bits) - 1
    out["codes"] = q.clamp_(lo_code, hi_code).to(torch.int32) & mask
    return out


def _groupwise_decode(fmt: GroupwiseInt, planes: Planes) -> torch.Tensor:
    mask = (1 << fmt.bits) - 1
    s = _fp16_value(planes["scale"])
    if fmt.symmetric:
        q = sign_extend32(planes["codes"] & mask, fmt.bits)
    else:
        q = (planes["codes"] & mask) - (planes["zero_point"] & mask)[:, None]
    return q.to(torch.float32) * s[:, None]


def _groupwise_storable(fmt: GroupwiseInt, planes: Planes) -> bool:
    return not bool(((planes["scale"] & 0x7C00) == 0x7C00).any())  # an fp16 inf: too large


register(MX, exact=True, block=Kernel(_mx_encode, _mx_decode))  # type: ignore[arg-type]
register(NVFP4, exact=True, block=Kernel(_nvfp4_encode, _nvfp4_decode))  # type: ignore[arg-type]
register(GGUF, exact=True, block=Kernel(_gguf_encode, _gguf_decode))  # type: ignore[arg-type]
register(GroupwiseInt, exact=True,  # type: ignore[arg-type]
         block=Kernel(_groupwise_encode, _groupwise_decode, _groupwise_storable))  # type: ignore[arg-type]


def kernel_for(fmt: BlockFormat) -> Kernel | None:
    """The native kernel of ``fmt``'s exact type (a subclass may change the arithmetic: it
    gets the host fallback), or None."""
    return kernels_for(fmt).block


__all__ = ["Kernel", "decode_small", "encode_small", "faulty_small_float",
           "kernel_for"]
