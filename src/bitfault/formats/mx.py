"""OCP Microscaling (MX v1.0) block formats: 32 element codes share one E8M0 scale.

MXFP8 (E4M3, E5M2), MXFP6 (E2M3, E3M2), MXFP4 (E2M1) and MXINT8, as section 6.3 of the
OCP MX v1.0 specification computes them (docs/formats.md, "Block formats"):

* shared exponent ``E = clamp(floor(log2(amax)) - emax_elem, -127, 127)`` with ``amax``
  the largest magnitude in the block, ``floor(log2)`` exact (read from the float32
  exponent field) and ``emax_elem`` the exponent of the element type's largest normal;
  a block whose ``amax`` is 0 or a float32 subnormal gets ``E = -127`` (the clamp);
* scale ``X = 2**E``, stored as the E8M0 code ``E + 127`` (0xFF, NaN, only by a fault);
* elements ``x / X`` rounded to nearest, ties to even, saturating at the element type's
  largest finite magnitude (MXINT8: ``clamp(rint(64 * x / X), -127, 127)``, value
  ``code * 2**-6``);
* decoding is the float32 product ``element value * X``: exact for every clean word.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np

from bitfault.errors import check_choice
from bitfault.formats.blocks import (
    BlockFormat,
    IntCodes,
    Plane,
    check_axis,
    check_block_size,
    row_reduce,
)
from bitfault.formats.floats import Float
from bitfault.formats.minifloat import SMALL_FLOATS

MX_ELEMENTS = ("float8_e4m3fn", "float8_e5m2", "float6_e2m3fn", "float6_e3m2fn",
               "float4_e2m1fn", "int8")
"""The element types of MX v1.0 by their ml_dtypes names ("int8": MXINT8)."""

MX_BLOCK_SIZES = (32,)
"""MX v1.0 fixes k = 32 for every concrete format (section 5)."""

EMAX_ELEM = {"float8_e4m3fn": 8, "float8_e5m2": 15, "float6_e2m3fn": 2,
             "float6_e3m2fn": 4, "float4_e2m1fn": 2, "int8": 0}
"""The exponent of each element type's largest normal number (MX v1.0, table 1)."""

E8M0 = Float("float8_e8m0fnu")
SCALE_EMIN, SCALE_EMAX = -127, 127
INT8_SCALE = np.float32(2.0**-6)
CHUNK = 1 << 16
"""Elements per step of the encoders: their temporaries stay in the CPU's cache."""

MXElement = Literal["float8_e4m3fn", "float8_e5m2", "float6_e2m3fn", "float6_e3m2fn",
                    "float4_e2m1fn", "int8"]


@functools.cache
def _element_table(name: str) -> np.ndarray:
    """The saturating code of every float32 key ``(bits | sticky) >> shift`` (see
    ``round_to_element``), from the small float's exact encoder on one representative
    float32 per key."""
    codec = SMALL_FLOATS[name]
    shift = 21 - codec.mantissa
    reps = (np.arange(1 << (32 - shift), dtype=np.uint32) << np.uint32(shift)).view(np.float32)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns among the keys
        codes, _ = codec.encode_exact(reps, "saturate")
    table = codes.astype(np.uint8)
    table.setflags(write=False)
    return table


def round_to_element(y: np.ndarray, name: str, out: np.ndarray | None = None) -> np.ndarray:
    """float32 ``y`` rounded to the small float ``name`` (nearest, ties to even,
    saturating; NaN as the codec maps it): its codes as uint8 (into ``out`` when given),
    bit for bit ``Float(name).encode(y)``.

    One key per value indexes a table: the sign, exponent and top ``mantissa + 1``
    mantissa bits, then one bit that is the OR of every lower bit (the guard and sticky
    bits together; round to nearest even reads nothing else of a float32). The work goes
    in chunks that stay in the CPU's cache.
    """
    shift = 21 - SMALL_FLOATS[name].mantissa
    low = np.uint32((1 << shift) - 1)
    table = _element_table(name)
    bits = np.ascontiguousarray(y, dtype=np.float32).reshape(-1).view(np.uint32)
    codes = np.empty(bits.size, np.uint8) if out is None else out.reshape(-1)
    key = np.empty(min(bits.size, CHUNK), np.uint32)
    for start in range(0, bits.size, CHUNK):
        part = bits[start:start + CHUNK]
        k = key[:part.size]
        np.bitwise_and(part, low, out=k)
        k += low  # bit ``shift`` is now set exactly where some lower bit was
        k |= part
        k >>= np.uint32(shift)
        np.take(table, k, out=codes[start:start + CHUNK])
    return codes.reshape(np.shape(y)) if out is None else out


def shared_exponents(blocks: np.ndarray, emax_elem: int) -> np.ndarray:
    """The MX shared exponent of each float32 block (rows of ``blocks``), int64:
    ``clamp(floor(log2(amax)) - emax_elem, -127, 127)``, floor(log2) exact from the
    exponent field (a zero or subnormal ``amax`` reads as exponent -127: the clamp)."""
    bits = np.ascontiguousarray(blocks, dtype=np.float32).view(np.uint32)
    magnitude = bits << np.uint32(1)  # drop the sign; the order of magnitudes is kept
    biased = (row_reduce(magnitude) >> np.uint32(24)).astype(np.int64)
    return np.clip(biased - 127 - emax_elem, SCALE_EMIN, SCALE_EMAX)


def power_of_two(exponent: np.ndarray) -> np.ndarray:
    """``2**exponent`` in float32 (exponents in -149..127, subnormals included)."""
    return np.ldexp(np.float32(1.0), np.asarray(exponent, dtype=np.int32)).astype(np.float32)


@dataclass(frozen=True)
class MX(BlockFormat, kind="mx"):
    """OCP MX v1.0: blocks of ``block_size`` (32) ``element`` codes along ``axis`` share an
    E8M0 power-of-two scale (``element``: float8_e4m3fn / float8_e5m2 (MXFP8),
    float6_e2m3fn / float6_e3m2fn (MXFP6), float4_e2m1fn (MXFP4) or int8 (MXINT8)).

    Planes: ``codes`` (the element's own float format, or for int8 ``IntCodes(8)`` whose
    value is ``code * 2**-6``) and ``scale`` (``Float("float8_e8m0fnu")``, one per block).
    """

    element: MXElement = "float8_e4m3fn"
    block_size: int = 32  # type: ignore[assignment]
    axis: int = -1

    def __post_init__(self) -> None:
        check_choice(self.element, MX_ELEMENTS, "element")
        object.__setattr__(self, "block_size", check_block_size(self.block_size, MX_BLOCK_SIZES))
        object.__setattr__(self, "axis", check_axis(self.axis))

    @property
    def element_format(self) -> Float | IntCodes:
        """The word format of one element code."""
        return IntCodes(8, signed=True) if self.element == "int8" else Float(self.element)

    @cached_property  # built once per format: a trial asks per plane of every tensor
    def planes(self) -> tuple[Plane, ...]:
        return (Plane("codes", self.element_format, "element"), Plane("scale", E8M0, "block"))

    @property
    def element_max(self) -> float:
        """The largest finite element value (MXINT8: 127 * 2**-6)."""
        return 127 / 64 if self.element == "int8" else Float(self.element).range[1]

    def encode_blocks(self, blocks: np.ndarray) -> dict[str, np.ndarray]:
        """Shared exponents, then every element scaled by ``2**-E`` (exact in float32: a
        power of two) and rounded to the element type."""
        blocks = np.asarray(blocks, dtype=np.float32)
        emax, step = EMAX_ELEM[self.element], CHUNK // self.block_size
        exponent = np.empty(blocks.shape[0], np.int64)
        codes = np.empty(blocks.shape, np.int8 if self.element == "int8" else np.uint8)
        for start in range(0, blocks.shape[0], step):
            part = blocks[start:start + step]
            e = exponent[start:start + step] = shared_exponents(part, emax)
            y = part * power_of_two(-e)[:, None]
            if self.element == "int8":
                y *= np.float32(64.0)
                codes[start:start + step] = np.clip(np.rint(y, out=y), -127, 127, out=y)
            else:
                round_to_element(y, self.element, out=codes[start:start + step])
        return {"codes": codes, "scale": exponent - SCALE_EMIN}

    def decode_blocks(self, planes: Mapping[str, np.ndarray]) -> np.ndarray:
        """``element value * X`` in float32; a scale word 0xFF (NaN) makes its block NaN."""
        scale = E8M0.decode(planes["scale"])
        codes = planes["codes"]
        if self.element == "int8":
            values = IntCodes(8, signed=True).integers(codes).astype(np.float32) * INT8_SCALE
        else:
            values = Float(self.element).decode(codes)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            return values * scale[:, None]


__all__ = ["EMAX_ELEM", "MX", "MX_BLOCK_SIZES", "MX_ELEMENTS", "power_of_two",
           "round_to_element", "shared_exponents"]
