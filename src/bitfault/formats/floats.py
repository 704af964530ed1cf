"""Float: IEEE float32 / float16 / bfloat16 seen through a same-width signed integer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from bitfault.errors import check_choice
from bitfault.formats.base import (
    FormatBase,
    QuantParams,
    cast_quietly,
    check_float_input,
    low_bits_signed,
    low_bits_unsigned,
)

_FLOAT_LAYOUTS: dict[str, tuple[int, int, int]] = {
    # name: (bits, exponent bits, mantissa bits)
    "float32": (32, 8, 23),
    "float16": (16, 5, 10),
    "bfloat16": (16, 8, 7),
}


@dataclass(frozen=True)
class Float(FormatBase, kind="float"):
    """An IEEE-754 layout ("float32", "float16", "bfloat16") seen through a same-width int.

    Encoding rounds to nearest-even into the format (overflow gives +-inf, as IEEE
    does; NaN stays NaN); faults then hit sign, exponent or mantissa bits.
    bfloat16 is rounded from float32 (float64 input is first rounded to float32).
    ``resolution`` is the spacing of values at 1.0 (machine epsilon).
    """

    dtype: Literal["float32", "float16", "bfloat16"] = "float32"

    def __post_init__(self) -> None:
        check_choice(self.dtype, tuple(_FLOAT_LAYOUTS), "dtype")

    @property
    def bits(self) -> int:  # type: ignore[override]
        return _FLOAT_LAYOUTS[self.dtype][0]

    @property
    def _layout(self) -> tuple[int, int, int]:
        return _FLOAT_LAYOUTS[self.dtype]

    @property
    def range(self) -> tuple[float, float]:
        _, e, m = self._layout
        bias = (1 << (e - 1)) - 1
        largest = (2.0 - 2.0**-m) * 2.0**bias
        return -largest, largest

    @property
    def resolution(self) -> float:
        return 2.0 ** -self._layout[2]

    def gradient_range(self) -> tuple[float, float] | None:
        """Plus or minus its largest finite value (beyond it a value is stored as +-inf)."""
        return self.range

    @property
    def bit_fields(self) -> dict[str, tuple[int, ...]]:
        n, e, m = self._layout
        return {"sign": (n - 1,), "exponent": tuple(range(m, m + e)),
                "mantissa": tuple(range(m))}

    def encode_counting(
        self, x: Any, params: QuantParams | None = None
    ) -> tuple[np.ndarray, int]:
        """Like ``encode``; the count is of finite values that overflowed to +-inf."""
        arr = check_float_input(x)
        words = self.encode(arr, params)
        overflowed = np.isinf(self.decode(words)) & np.isfinite(arr)
        return words, int(np.count_nonzero(overflowed))

    def encode(self, x: Any, params: QuantParams | None = None) -> np.ndarray:
        """Float array -> the format's bit patterns in int32 (float32) or int16."""
        arr = check_float_input(x)
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
        if self.dtype == "float32":
            out = low_bits_signed(w, 32).astype(np.int32).view(np.float32)
        elif self.dtype == "float16":
            out = low_bits_signed(w, 16).astype(np.int16).view(np.float16)
        else:
            u = low_bits_unsigned(w, 16).astype(np.uint32) << np.uint32(16)
            out = u.view(np.float32)
        return cast_quietly(out, dtype)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "dtype": self.dtype}


__all__ = ["Float"]
