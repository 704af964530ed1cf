"""FixedPoint: two's-complement fixed point Qm.n in 2..32 bits (the seed's format)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError, check_choice
from bitfault.formats.base import (
    OVERFLOWS,
    ROUNDINGS,
    FormatBase,
    Overflow,
    QuantParams,
    Rounding,
    cast_quietly,
    check_bits,
    check_float_input,
    low_bits_signed,
    round_by,
    to_container,
    to_int_range,
)


@dataclass(frozen=True)
class FixedPoint(FormatBase, kind="fixed_point"):
    """Two's-complement fixed point Qm.n: ``bits`` in 2..32 of which ``frac`` are fraction.

    ``FixedPoint(32, 28, rounding="trunc")`` is the seed program's
    ``int32(w * 2**28)``. Rounding "nearest" is ties-to-even; "trunc" is toward
    zero (a C cast). Overflow "saturate" clamps (NaN -> 0, +-inf -> the ends),
    "wrap" keeps the low bits of the integer (NaN -> 0, +-inf saturate),
    "error" raises naming the first offending index and value.
    """

    bits: int = 32
    frac: int = 28
    rounding: Rounding = "nearest"
    overflow: Overflow = "saturate"

    def __post_init__(self) -> None:
        check_bits(self.bits)
        allowed = f"an integer in 0..bits ({self.bits})"
        if isinstance(self.frac, bool) or not isinstance(self.frac, (int, np.integer)):
            raise ArgumentTypeError("frac", self.frac, allowed)
        if not 0 <= self.frac <= self.bits:
            raise ArgumentError("frac", self.frac, allowed)
        check_choice(self.rounding, ROUNDINGS, "rounding")
        check_choice(self.overflow, OVERFLOWS, "overflow")

    @property
    def code_range(self) -> tuple[int, int]:
        return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1

    @property
    def range(self) -> tuple[float, float]:
        """The smallest and largest representable values."""
        lo, hi = self.code_range
        return lo * 2.0**-self.frac, hi * 2.0**-self.frac

    @property
    def resolution(self) -> float:
        """The step between adjacent representable values, ``2**-frac``."""
        return 2.0**-self.frac

    def gradient_range(self) -> tuple[float, float] | None:
        """Its ``range``: a clean value outside is not stored as it is."""
        return self.range

    @property
    def bit_fields(self) -> dict[str, tuple[int, ...]]:
        top = self.bits - 1
        return {
            "sign": (top,),
            "integer": tuple(range(self.frac, top)),
            "fraction": tuple(range(self.frac)),
        }

    def encode_counting(
        self, x: Any, params: QuantParams | None = None
    ) -> tuple[np.ndarray, int]:
        arr = check_float_input(x)
        y = round_by(arr.astype(np.float64) * 2.0**self.frac, self.rounding)
        lo, hi = self.code_range
        codes, n_bad = to_int_range(y, lo, hi, self.overflow, arr, f"FixedPoint{self.q_name}")
        return to_container(codes, self.bits), n_bad

    def encode(self, x: Any, params: QuantParams | None = None) -> np.ndarray:
        """Float array -> words in the signed container, same shape."""
        return self.encode_counting(x, params)[0]

    def decode(
        self, words: Any, params: QuantParams | None = None, dtype: Any = np.float32
    ) -> np.ndarray:
        """Words -> floats (``dtype``, float32 by default); reads only the low ``bits`` bits."""
        return cast_quietly(low_bits_signed(words, self.bits) * 2.0**-self.frac, dtype)

    @property
    def q_name(self) -> str:
        """The Qm.n name of the layout, e.g. "(Q4.28)"."""
        return f"(Q{self.bits - self.frac}.{self.frac})"


__all__ = ["FixedPoint"]
