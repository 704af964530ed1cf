"""Float: IEEE float32 / float16 / bfloat16 and the small floats (``formats.minifloat``)
seen through a same-width signed integer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from bitfault.errors import ArgumentError, check_choice
from bitfault.formats.base import (
    FormatBase,
    QuantParams,
    cast_quietly,
    check_float_input,
    low_bits_signed,
    low_bits_unsigned,
    to_container,
)
from bitfault.formats.minifloat import SMALL_FLOAT_OVERFLOWS, SMALL_FLOATS, MiniFloat

_FLOAT_LAYOUTS: dict[str, tuple[int, int, int]] = {
    # name: (bits, exponent bits, mantissa bits)
    "float32": (32, 8, 23),
    "float16": (16, 5, 10),
    "bfloat16": (16, 8, 7),
}
FLOAT_DTYPES = (*_FLOAT_LAYOUTS, *SMALL_FLOATS)
"""Every dtype name ``Float`` takes: the IEEE ones, then the small floats."""

FloatDType = Literal["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
                     "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn", "float8_e8m0fnu"]


@dataclass(frozen=True)
class Float(FormatBase, kind="float"):
    """A float layout seen through a same-width int: IEEE "float32", "float16", "bfloat16",
    or a small float ("float8_e4m3fn", "float8_e5m2", "float6_e2m3fn", "float6_e3m2fn",
    "float4_e2m1fn", "float8_e8m0fnu"; words in int8, see ``formats.minifloat``).

    Encoding rounds to nearest-even into the format; faults then hit sign, exponent or
    mantissa bits. The IEEE layouts overflow to +-inf as IEEE does (NaN stays NaN) and
    take no other ``overflow`` than the default, which their ``to_dict`` leaves out; the
    small floats follow ``overflow``: "saturate" (default), "nan" or "error" (float6 and
    float4 store neither NaN nor inf, so not "nan"). bfloat16 is rounded from float32
    (float64 input is first rounded to float32); the small floats round once from the
    input. ``resolution`` is the spacing of values at 1.0 (machine epsilon).
    """

    dtype: FloatDType = "float32"
    overflow: Literal["saturate", "nan", "error"] = "saturate"

    def __post_init__(self) -> None:
        check_choice(self.dtype, FLOAT_DTYPES, "dtype")
        check_choice(self.overflow, SMALL_FLOAT_OVERFLOWS, "overflow")
        codec = self.codec
        if codec is None and self.overflow != "saturate":
            raise ArgumentError("overflow", self.overflow, "'saturate'", requirement=(
                f"overflow applies to the small floats only: {self.dtype} overflows to "
                f"+-inf as IEEE does; leave overflow at 'saturate'"))
        if codec is not None and self.overflow == "nan" and not codec.has_nan:
            raise ArgumentError("overflow", self.overflow, "'saturate' or 'error'", requirement=(
                f"{self.dtype} stores neither NaN nor inf: overflow must be 'saturate' or "
                f"'error'"))

    @property
    def codec(self) -> MiniFloat | None:
        """The small float's layout and codec; None for float32/float16/bfloat16."""
        return SMALL_FLOATS.get(self.dtype)

    @property
    def bits(self) -> int:  # type: ignore[override]
        codec = self.codec
        return codec.bits if codec is not None else _FLOAT_LAYOUTS[self.dtype][0]

    @property
    def _layout(self) -> tuple[int, int, int]:
        codec = self.codec
        if codec is not None:
            return codec.bits, codec.exponent, codec.mantissa
        return _FLOAT_LAYOUTS[self.dtype]

    @property
    def range(self) -> tuple[float, float]:
        codec = self.codec
        if codec is not None:
            return codec.min, codec.max
        _, e, m = self._layout
        bias = (1 << (e - 1)) - 1
        largest = (2.0 - 2.0**-m) * 2.0**bias
        return -largest, largest

    @property
    def resolution(self) -> float:
        return 2.0 ** -self._layout[2]

    def gradient_range(self) -> tuple[float, float] | None:
        """Its ``range``: plus or minus the largest finite value (E8M0: its smallest and
        largest); beyond it a value is stored as +-inf or mapped by ``overflow``."""
        return self.range

    @property
    def bit_fields(self) -> dict[str, tuple[int, ...]]:
        n, e, m = self._layout
        fields = {"sign": (n - 1,), "exponent": tuple(range(m, m + e)),
                  "mantissa": tuple(range(m))}
        codec = self.codec
        if codec is not None and not codec.signed:  # E8M0: exponent bits only
            del fields["sign"]
        if m == 0:
            del fields["mantissa"]
        return fields

    def encode_counting(
        self, x: Any, params: QuantParams | None = None
    ) -> tuple[np.ndarray, int]:
        """Like ``encode``; the count is of finite values that overflowed to +-inf (IEEE
        layouts) or of the values the overflow policy mapped (small floats)."""
        arr = check_float_input(x)
        codec = self.codec
        if codec is not None:
            codes, n = codec.encode(arr, self.overflow)
            if codes.dtype == np.uint8:  # the lookup's codes: already the int8 container's bits
                return codes.view(np.int8), n
            return to_container(codes, codec.bits), n
        words = self.encode(arr, params)
        overflowed = np.isinf(self.decode(words)) & np.isfinite(arr)
        return words, int(np.count_nonzero(overflowed))

    def encode(self, x: Any, params: QuantParams | None = None) -> np.ndarray:
        """Float array -> the format's bit patterns in int32 (float32), int16 or int8."""
        arr = check_float_input(x)
        if self.codec is not None:
            return self.encode_counting(arr, params)[0]
        with np.errstate(over="ignore"):  # overflow to +-inf is IEEE rounding, not an error
            if self.dtype == "float16":
                return arr.astype(np.float16).view(np.int16)
            f32 = arr.astype(np.float32)
        if self.dtype == "float32":
            return f32.view(np.int32)
        u = f32.view(np.uint32).astype(np.uint64)
        rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        nan = np.isnan(f32)
        quiet_nan = (u >> 16) | 0x0040
        top = np.where(nan, quiet_nan, rounded)
        return top.astype(np.uint16).view(np.int16)

    def decode(
        self, words: Any, params: QuantParams | None = None, dtype: Any = np.float32
    ) -> np.ndarray:
        """Bit patterns -> floats of ``dtype`` (exact widening from the stored format)."""
        w = np.asarray(words)
        codec = self.codec
        if codec is not None:
            table = codec.decode_table(np.dtype(dtype) if _is_float(dtype) else np.float32)
            return cast_quietly(table[low_bits_unsigned(w, codec.bits)], dtype)
        if self.dtype == "float32":
            out = low_bits_signed(w, 32).astype(np.int32).view(np.float32)
        elif self.dtype == "float16":
            out = low_bits_signed(w, 16).astype(np.int16).view(np.float16)
        else:
            u = low_bits_unsigned(w, 16).astype(np.uint32) << np.uint32(16)
            out = u.view(np.float32)
        return cast_quietly(out, dtype)

    def to_dict(self) -> dict[str, Any]:
        if self.codec is None:
            return {"kind": self.kind, "dtype": self.dtype}
        return {"kind": self.kind, "dtype": self.dtype, "overflow": self.overflow}


def _is_float(dtype: Any) -> bool:
    return np.dtype(dtype) in (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


__all__ = ["FLOAT_DTYPES", "Float", "FloatDType"]
