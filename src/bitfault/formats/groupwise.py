"""Group-wise integers: ``group_size`` consecutive inputs of an output channel share an fp16
scale (and, asymmetric, a ``bits``-bit zero point), as GPTQ / AWQ checkpoints store them.

The arithmetic is PyTorch's fake quantisation with that scale, in float32
(``torch.fake_quantize_per_channel_affine`` on the tensor reshaped to one row per group):

* symmetric: ``s = fp16(max(amax / (2^(b-1) - 1), eps))``, codes
  ``clamp(rint(x * (1 / s)), -(2^(b-1) - 1), 2^(b-1) - 1)`` in ``b``-bit two's complement;
* asymmetric: ``lo = min(min x, 0)``, ``hi = max(max x, 0)``,
  ``s = fp16(max((hi - lo) / (2^b - 1), eps))``, ``z = clamp(-rint(lo / s), 0, 2^b - 1)``,
  codes ``clamp(rint(x * (1 / s)) + z, 0, 2^b - 1)``;

``eps`` is float32's (torch.ao's floor), ``rint`` rounds half to even, ``1 / s`` is the
float32 reciprocal PyTorch multiplies by, and ``s`` is used as float32 after its fp16
rounding. Decoding: ``(q - z) * s``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError, check_int
from bitfault.formats.base import low_bits_signed, low_bits_unsigned
from bitfault.formats.blocks import BlockFormat, IntCodes, Plane, check_axis, check_block_size
from bitfault.formats.floats import Float

EPS = np.float32(np.finfo(np.float32).eps)
FP16_MAX = float(np.finfo(np.float16).max)


@dataclass(frozen=True)
class GroupwiseInt(BlockFormat):
    """``bits``-bit integer codes (2..8), one fp16 scale per ``group_size`` consecutive
    values along ``axis`` (default -1: the input dimension of a Linear weight (out, in));
    asymmetric adds an unsigned ``bits``-bit zero point per group. Planes: ``codes``,
    ``scale`` and, when not ``symmetric``, ``zero_point``. Described as the ``int_quant``
    kind with a ``group_size`` (``to_dict``)."""

    bits: int = 4
    group_size: int = 128
    symmetric: bool = True
    axis: int = -1
    kind: ClassVar[str] = "int_quant"

    def __post_init__(self) -> None:
        check_int(self.bits, "bits", 2, 8)
        check_block_size(self.group_size, argument="group_size")
        if not isinstance(self.symmetric, (bool, np.bool_)):
            raise ArgumentTypeError("symmetric", self.symmetric, "True or False")
        object.__setattr__(self, "bits", int(self.bits))
        object.__setattr__(self, "group_size", int(self.group_size))
        object.__setattr__(self, "symmetric", bool(self.symmetric))
        object.__setattr__(self, "axis", check_axis(self.axis))

    @property
    def block_size(self) -> int:
        return self.group_size

    @cached_property  # built once per format: a trial asks per plane of every tensor
    def planes(self) -> tuple[Plane, ...]:
        out = [Plane("codes", IntCodes(self.bits, self.symmetric), "element"),
               Plane("scale", Float("float16"), "block")]
        if not self.symmetric:
            out.append(Plane("zero_point", IntCodes(self.bits, False), "block"))
        return tuple(out)

    @property
    def code_range(self) -> tuple[int, int]:
        """The codes quantisation produces (symmetric: the restricted, balanced range)."""
        if self.symmetric:
            top = (1 << (self.bits - 1)) - 1
            return -top, top
        return 0, (1 << self.bits) - 1

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "int_quant", "bits": self.bits, "symmetric": self.symmetric,
                "group_size": self.group_size, "axis": self.axis}

    def scales(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """float32 ``(n, group_size)`` groups -> (fp16 scales as float32, zero points)."""
        b = np.asarray(blocks, dtype=np.float32)
        lo_code, hi_code = self.code_range
        lo = np.minimum(b.min(axis=1), np.float32(0))
        hi = np.maximum(b.max(axis=1), np.float32(0))
        with np.errstate(over="ignore"):
            if self.symmetric:
                s = np.maximum(-lo, hi) / np.float32(hi_code)
            else:
                s = (hi - lo) / np.float32(hi_code - lo_code)
            s16 = np.maximum(s, EPS).astype(np.float16)
        if not np.isfinite(s16).all():
            i = int(np.flatnonzero(~np.isfinite(s16))[0])
            raise ArgumentError("x", float(max(-lo[i], hi[i])), "values whose group scale "
                                "fits float16", requirement=(
                                    f"group {i} spans [{lo[i]}, {hi[i]}]: its scale {s[i]} "
                                    f"exceeds float16's largest value {FP16_MAX}"))
        scale = s16.astype(np.float32)
        if self.symmetric:
            return scale, np.zeros(len(b), np.int64)
        zp = np.clip(-np.rint(lo / scale), lo_code, hi_code).astype(np.int64)
        return scale, zp

    def encode_blocks(self, blocks: np.ndarray) -> dict[str, np.ndarray]:
        b = np.asarray(blocks, dtype=np.float32)
        scale, zp = self.scales(b)
        lo_code, hi_code = self.code_range
        inv = np.float32(1) / scale
        q = np.rint(b * inv[:, None]) + zp[:, None].astype(np.float32)
        codes = np.clip(q, lo_code, hi_code).astype(np.int64)
        out = {"codes": low_bits_unsigned(codes, self.bits),
               "scale": low_bits_unsigned(scale.astype(np.float16).view(np.int16), 16)}
        if not self.symmetric:
            out["zero_point"] = zp
        return out

    def decode_blocks(self, planes: Mapping[str, np.ndarray]) -> np.ndarray:
        if self.symmetric:
            q = low_bits_signed(planes["codes"], self.bits)
            zp = np.zeros(q.shape[0], np.int64)
        else:
            q = low_bits_unsigned(planes["codes"], self.bits)
            zp = low_bits_unsigned(planes["zero_point"], self.bits)
        s = np.asarray(planes["scale"]).astype(np.uint16).view(np.float16).astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            return (q - zp[:, None]).astype(np.float32) * s[:, None]


__all__ = ["GroupwiseInt"]
