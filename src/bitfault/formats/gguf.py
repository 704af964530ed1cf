"""GGUF block formats Q8_0, Q4_0 and Q4_1: llama.cpp's reference quantiser, bit for bit.

32 consecutive values along ``axis`` share an fp16 scale ``d`` (and, in Q4_1, an fp16
minimum ``m``). The arithmetic is float32, as in ``ggml-quants.c`` and the ``gguf``
package's ``quants.py``:

* Q8_0: ``d = amax / 127``, ``q = roundf(x * (1 / d))`` (half away from zero), int8;
* Q4_0: ``d = max / -8`` (``max``: the signed value of largest magnitude, the first one
  on a tie), ``q = min(15, trunc(x * (1 / d) + 8.5))``, an unsigned nibble;
* Q4_1: ``d = (max - min) / 15``, ``q = min(15, trunc((x - min) * (1 / d) + 0.5))``;

``1 / d`` is 0 where ``d == 0``; codes use the float32 ``d`` and ``min``, the stored words
are their fp16 roundings (to nearest even, +-inf beyond 65504). Decoding: ``q * d``,
``(q - 8) * d``, ``q * d + m`` with the fp16 words as float32. ``to_bytes`` / ``from_bytes``
give llama.cpp's block bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError, check_choice
from bitfault.formats.base import QuantParams, check_float_input, low_bits_unsigned
from bitfault.formats.blocks import BlockFormat, IntCodes, Plane, check_axis, row_reduce
from bitfault.formats.floats import Float

GGUFType = Literal["q8_0", "q4_0", "q4_1"]
GGUF_TYPES = ("q8_0", "q4_0", "q4_1")
QK = 32
TYPE_SIZE = {"q8_0": 2 + QK, "q4_0": 2 + QK // 2, "q4_1": 4 + QK // 2}
CHUNK_BLOCKS = 4096  # blocks per pass of the fast encoder: a few hundred KiB, in cache


def _fp16_bits(v: np.ndarray) -> np.ndarray:
    """float32 -> the int16 bit pattern of its fp16 rounding (to nearest even, IEEE inf)."""
    with np.errstate(over="ignore"):
        return v.astype(np.float16).view(np.int16)


def _fp16_value(words: np.ndarray) -> np.ndarray:
    """fp16 bit patterns (any int dtype, low 16 bits) -> their values as float32."""
    return np.asarray(words).astype(np.uint16).view(np.float16).astype(np.float32)


def _inverse(d: np.ndarray) -> np.ndarray:
    """``1 / d`` in float32, 0 where ``d == 0`` (llama.cpp's ``id = d ? 1.0f/d : 0.0f``)."""
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _roundf_int8(y: np.ndarray) -> np.ndarray:
    """C ``roundf`` (half away from zero) of float32 values in int8 range, as int8."""
    t = np.trunc(y)
    f = y - t  # exact
    q = t.astype(np.int8)
    q += f >= 0.5
    q -= f <= -0.5
    return q


def _signed_absmax(b: np.ndarray) -> np.ndarray:
    """Per block, the value of largest magnitude, the first one where several share it (as
    llama.cpp's strict ``amax < fabsf(v)`` loop and numpy's ``argmax`` pick)."""
    hi, lo = row_reduce(b, np.maximum), row_reduce(b, np.minimum)
    out = np.where(hi > -lo, hi, lo)
    tie = np.flatnonzero(hi == -lo)  # both signs reach the magnitude (or all zeros)
    if tie.size:
        first = np.abs(b[tie]).argmax(axis=1)
        out[tie] = b[tie, first]
    return out


def _finite_codes(y: np.ndarray, lo: float, hi: float, zero: float) -> np.ndarray:
    """``y`` clipped to [lo, hi], NaN (0 * inf) -> ``zero``: for blocks whose ``1 / d``
    overflowed float32 (a block maximum below ~1e-37), before any float->int cast."""
    return np.where(np.isnan(y), np.float32(zero), np.clip(y, lo, hi)).astype(np.float32)


@dataclass(frozen=True)
class GGUF(BlockFormat, kind="gguf"):
    """llama.cpp's GGUF block format ``type`` ("q8_0", "q4_0" or "q4_1"): 32 values along
    ``axis`` share an fp16 scale (Q4_1: and an fp16 minimum). Planes: ``codes`` (int8
    for Q8_0, the unsigned nibble for Q4_*), ``scale`` and, for Q4_1, ``min``."""

    type: GGUFType = "q8_0"
    axis: int = -1

    def __post_init__(self) -> None:
        check_choice(self.type, GGUF_TYPES, "type")
        object.__setattr__(self, "axis", check_axis(self.axis))

    @property
    def block_size(self) -> int:
        return QK

    @cached_property  # built once per format: a trial asks per plane of every tensor
    def planes(self) -> tuple[Plane, ...]:
        codes = IntCodes(8, True) if self.type == "q8_0" else IntCodes(4, False)
        out = [Plane("codes", codes, "element"), Plane("scale", Float("float16"), "block")]
        if self.type == "q4_1":
            out.append(Plane("min", Float("float16"), "block"))
        return tuple(out)

    @property
    def type_size(self) -> int:
        """Bytes of one block in llama.cpp's layout."""
        return TYPE_SIZE[self.type]

    # ---- the arithmetic, once, on (n, 32) float32 blocks --------------------------------

    def _quantize(self, b: np.ndarray) -> dict[str, np.ndarray]:
        """float32 ``(n, 32)`` blocks -> codes (int8 / uint8 nibbles) and int16 fp16 words."""
        if self.type == "q8_0":
            d = row_reduce(np.abs(b), np.maximum) / np.float32(127)
            inv = _inverse(d)
            y = b * inv[:, None]
            if np.isinf(inv).any():
                y = _finite_codes(y, -127, 127, 0)
            return {"codes": _roundf_int8(y), "scale": _fp16_bits(d)}
        if self.type == "q4_0":
            d = _signed_absmax(b) / np.float32(-8)
            inv = _inverse(d)
            y = b * inv[:, None] + np.float32(8.5)
            mn = None
        else:
            mx, mn = row_reduce(b, np.maximum), row_reduce(b, np.minimum)
            d = (mx - mn) / np.float32(15)
            inv = _inverse(d)
            y = (b - mn[:, None]) * inv[:, None] + np.float32(0.5)
        if np.isinf(inv).any():
            y = _finite_codes(y, 0, 15, 8.5 if mn is None else 0)
        codes = np.minimum(np.trunc(y).astype(np.uint8), np.uint8(15))
        out = {"codes": codes, "scale": _fp16_bits(d)}
        if mn is not None:
            out["min"] = _fp16_bits(mn)
        return out

    def encode_blocks(self, blocks: np.ndarray) -> dict[str, np.ndarray]:
        b = np.asarray(blocks, dtype=np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            words = self._quantize(b)
        return {p.name: low_bits_unsigned(words[p.name], p.format.bits) for p in self.planes}

    def decode_blocks(self, planes: Mapping[str, np.ndarray]) -> np.ndarray:
        q = np.asarray(planes["codes"], dtype=np.int64)
        d = _fp16_value(planes["scale"])[:, None]
        with np.errstate(over="ignore", invalid="ignore"):
            if self.type == "q8_0":
                return d * q.astype(np.int8).astype(np.float32)
            if self.type == "q4_0":
                return d * (q - 8).astype(np.float32)
            return d * q.astype(np.float32) + _fp16_value(planes["min"])[:, None]

    # ---- a fast path for the common case: blocks along the contiguous last axis ---------

    def encode(self, x: Any, params: QuantParams | None = None) -> dict[str, np.ndarray]:
        """Float array -> ``{"codes", "scale"[, "min"]}`` words (see ``BlockFormat``)."""
        arr = check_float_input(x)
        lay = self.layout(arr.shape)
        if lay.axis != arr.ndim - 1 or lay.length % QK or not arr.size:
            return super().encode(arr)
        rows = np.ascontiguousarray(arr).reshape(-1, QK)
        n = rows.shape[0]
        out = {p.name: np.empty(n * QK if p.per == "element" else n, p.format.container)
               for p in self.planes}
        codes = out["codes"].reshape(n, QK)
        with np.errstate(over="ignore", invalid="ignore"):
            for s in range(0, n, CHUNK_BLOCKS):
                b = rows[s:s + CHUNK_BLOCKS].astype(np.float32, copy=False)
                if not np.isfinite(b).all():
                    return super().encode(arr)  # raises, naming the first bad value
                words = self._quantize(b)
                codes[s:s + len(b)] = words["codes"].view(codes.dtype)
                for name in self.plane_names[1:]:
                    out[name][s:s + len(b)] = words[name]
        return {name: out[name].reshape(shape)
                for name, shape in self.plane_shapes(arr.shape).items()}

    # ---- llama.cpp's bytes --------------------------------------------------------------

    def _check_byte_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        shape = tuple(int(s) for s in shape)
        lay = self.layout(shape)
        if lay.axis != len(shape) - 1:
            raise ArgumentError("axis", self.axis, f"-1 or {len(shape) - 1}", requirement=(
                f"GGUF bytes hold blocks along the last axis; this format's axis is "
                f"{self.axis} for a tensor of shape {shape}"))
        if shape[-1] % QK:
            raise ArgumentError("shape", shape, f"a last dimension that is a multiple of {QK}",
                                requirement=f"llama.cpp's {self.type.upper()} rows hold whole "
                                            f"blocks: the last dimension must be a multiple "
                                            f"of {QK}; got shape {shape}")
        return shape

    def to_bytes(self, planes: Mapping[str, np.ndarray]) -> np.ndarray:
        """Planes (as ``encode`` gives them) -> llama.cpp's blocks as uint8, shaped
        ``(*shape[:-1], shape[-1] // 32 * type_size)`` as ``gguf.quants.quantize`` gives."""
        if not isinstance(planes, Mapping):
            raise ArgumentTypeError("planes", planes, f"a mapping of the planes "
                                                      f"{self.plane_names}")
        missing = [n for n in self.plane_names if n not in planes]
        if missing:
            raise ArgumentError("planes", sorted(planes), f"the planes {self.plane_names}",
                                requirement=f"missing plane(s) {missing}")
        shape = self._check_byte_shape(np.shape(planes["codes"]))
        codes = np.asarray(planes["codes"]).astype(np.uint8).reshape(-1, QK)
        n = codes.shape[0]
        parts = []
        for name in self.plane_names[1:]:
            words = np.asarray(planes[name])
            if words.size != n:
                raise ArgumentError(f"planes[{name!r}]", words.shape, f"{n} words "
                                    f"(one per block of {QK} codes)")
            parts.append(words.astype(np.uint16).astype("<u2").reshape(n, 1).view(np.uint8))
        if self.type == "q8_0":
            parts.append(codes)
        else:
            low = codes[:, :QK // 2] & np.uint8(0x0F)
            parts.append(low | ((codes[:, QK // 2:] & np.uint8(0x0F)) << np.uint8(4)))
        return np.concatenate(parts, axis=1).reshape(*shape[:-1],
                                                     shape[-1] // QK * self.type_size)

    def from_bytes(self, data: Any, shape: Sequence[int]) -> dict[str, np.ndarray]:
        """llama.cpp's blocks (uint8) of a tensor of ``shape`` -> its planes (as ``encode``
        gives them)."""
        shape = self._check_byte_shape(shape)
        raw = np.asarray(data)
        n = int(np.prod(shape)) // QK
        if raw.dtype != np.uint8 or raw.size != n * self.type_size:
            raise ArgumentError("data", f"{raw.dtype} of {raw.size} bytes",
                                f"{n * self.type_size} uint8 bytes ({n} blocks of "
                                f"{self.type_size}) for shape {shape}")
        blocks = np.ascontiguousarray(raw).reshape(n, self.type_size)
        head = 4 if self.type == "q4_1" else 2
        words = np.ascontiguousarray(blocks[:, :head]).view("<u2").astype(np.uint16)
        if self.type == "q8_0":
            codes = blocks[:, head:].view(np.int8)
        else:
            qs = blocks[:, head:]
            codes = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1)
            codes = codes.view(np.int8)
        block_shape = self.plane_shapes(shape)["scale"]
        out = {"codes": np.ascontiguousarray(codes).reshape(shape),
               "scale": words[:, 0].view(np.int16).reshape(block_shape)}
        if self.type == "q4_1":
            out["min"] = np.ascontiguousarray(words[:, 1]).view(np.int16).reshape(block_shape)
        return out


__all__ = ["GGUF", "GGUF_TYPES"]
