"""An independent reference for the core: Python ints, ``fractions`` and ``struct`` only.

Nothing here calls bitfault or NumPy arithmetic: every stored word is computed
one value at a time from the format's definition (the issue's, not the
library's code), so a test that compares the two checks the library against
the specification rather than against itself.

Words are the *unsigned* ``bits``-bit patterns (Python ints in 0..2**bits-1);
compare them with the library's words through ``& (2**bits - 1)`` (``low_words``).
The two array helpers at the end only read arrays out into Python ints.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

FLOAT_LAYOUTS = {"float32": (32, 8, 23), "float16": (16, 5, 10), "bfloat16": (16, 8, 7)}


class OverflowPolicyError(ValueError):
    """What the reference raises where overflow='error' must raise."""


# ---- bits and fields ------------------------------------------------------------------


def pattern(value: int, bits: int) -> int:
    """The unsigned ``bits``-bit two's-complement pattern of a signed (or unsigned) int."""
    return value % (1 << bits)


def sign_extend(word: int, bits: int) -> int:
    """Read a ``bits``-bit pattern as two's complement."""
    word %= 1 << bits
    return word - (1 << bits) if word >> (bits - 1) else word


def field_positions(kind: str, bits: int, frac: int = 0, dtype: str = "") -> dict[str, list[int]]:
    """Bit positions of each named field (LSB is 0), written out from the formats' definitions."""
    if kind == "fixed_point":
        fields = {"sign": [bits - 1], "integer": list(range(frac, bits - 1)),
                  "fraction": list(range(frac))}
    elif kind == "int_quant":
        fields = {"sign": [bits - 1], "magnitude": list(range(bits - 1))}
    elif kind == "float":
        width, e, m = FLOAT_LAYOUTS[dtype]
        bits = width
        fields = {"sign": [width - 1], "exponent": list(range(m, m + e)),
                  "mantissa": list(range(m))}
    else:
        raise AssertionError(kind)
    return {**fields, "msb": [bits - 1], "lsb": [0], "all": list(range(bits))}


def fields_of(fmt: Any) -> dict[str, list[int]]:
    """``field_positions`` for a bitfault format object (only its parameters are read)."""
    kind = type(fmt).__name__
    if kind == "FixedPoint":
        return field_positions("fixed_point", fmt.bits, fmt.frac)
    if kind == "IntQuant":
        return field_positions("int_quant", fmt.bits)
    return field_positions("float", 0, dtype=fmt.dtype)


def positions_of(fmt: Any, selection: Any) -> list[int]:
    """The sorted positions a ``bits=`` selection (None, a position, a name, a list) names."""
    if selection is None:
        return list(range(fmt.bits))
    items = list(selection) if isinstance(selection, (list, tuple)) else [selection]
    fields = fields_of(fmt)
    found: set[int] = set()
    for item in items:
        found.update(fields[item] if isinstance(item, str) else [int(item)])
    return sorted(found)


def mask_of(positions: Iterable[int]) -> int:
    return sum(1 << p for p in set(positions))


def apply_fault(word: int, mask: int, kind: str, value: int = 0) -> int:
    """A fault on one unsigned pattern: flip (XOR), stuck-at-0 (AND NOT), stuck-at-1 (OR)."""
    if kind == "flip":
        return word ^ mask
    if kind == "stuck" and value == 0:
        return word & ~mask
    if kind == "stuck" and value == 1:
        return word | mask
    raise AssertionError((kind, value))


# ---- float32 / float16 / bfloat16 bit patterns --------------------------------------------


def f32(x: float) -> float:
    """Round a Python float to the nearest float32 (ties to even), inf on overflow."""
    return struct.unpack("<f", struct.pack("<I", float32_bits(x)))[0]


def float32_bits(x: float) -> int:
    """The IEEE binary32 pattern of ``x`` rounded to nearest-even (overflow gives +-inf)."""
    try:
        return struct.unpack("<I", struct.pack("<f", x))[0]
    except OverflowError:  # struct refuses values that round to infinity; IEEE gives inf
        return 0xFF800000 if x < 0 else 0x7F800000


def float16_bits(x: float) -> int:
    """The IEEE binary16 pattern of ``x`` rounded to nearest-even (overflow gives +-inf)."""
    try:
        return struct.unpack("<H", struct.pack("<e", x))[0]
    except OverflowError:
        return 0xFC00 if x < 0 else 0x7C00


def bfloat16_bits(x: float) -> int:
    """bfloat16: ``x`` rounded to float32, then the top 16 bits rounded to nearest-even.

    A NaN keeps its sign and top payload bits and is made quiet.
    """
    u = float32_bits(x)
    if math.isnan(x):
        return (u >> 16) | 0x0040
    high, low = u >> 16, u & 0xFFFF
    if low > 0x8000 or (low == 0x8000 and high & 1):
        high += 1  # carries into the exponent, up to infinity, as IEEE rounding does
    return high


def float_bits(x: float, dtype: str) -> int:
    return {"float32": float32_bits, "float16": float16_bits, "bfloat16": bfloat16_bits}[dtype](x)


def float_from_bits(word: int, dtype: str) -> float:
    """The value of a float32 / float16 / bfloat16 pattern, as a Python float (exact)."""
    if dtype == "float32":
        return struct.unpack("<f", struct.pack("<I", word % (1 << 32)))[0]
    if dtype == "float16":
        return struct.unpack("<e", struct.pack("<H", word % (1 << 16)))[0]
    if dtype == "bfloat16":
        return struct.unpack("<f", struct.pack("<I", (word % (1 << 16)) << 16))[0]
    raise AssertionError(dtype)


# ---- fixed point ---------------------------------------------------------------------------


def round_fraction(v: Fraction, rounding: str) -> int:
    if rounding == "nearest":
        return round(v)  # Fraction.__round__ rounds half to even
    if rounding == "trunc":
        return math.trunc(v)
    raise AssertionError(rounding)


def fixed_point_code(x: float, bits: int, frac: int, rounding: str = "nearest",
                     overflow: str = "saturate") -> tuple[int, bool]:
    """(signed code, saturated?) of ``x`` in two's-complement Q(bits-frac).frac, exactly.

    NaN -> 0 and +-inf -> the ends of the range under "saturate" and "wrap";
    finite values beyond the range clamp ("saturate") or keep their low ``bits``
    bits ("wrap"); "error" raises OverflowPolicyError.
    """
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if math.isnan(x) or math.isinf(x):
        if overflow == "error":
            raise OverflowPolicyError(x)
        return (0 if math.isnan(x) else hi if x > 0 else lo), True
    code = round_fraction(Fraction(x) * 2**frac, rounding)
    if lo <= code <= hi:
        return code, False
    if overflow == "error":
        raise OverflowPolicyError(x)
    if overflow == "saturate":
        return max(lo, min(hi, code)), True
    return sign_extend(code, bits), True


def fixed_point_value(word: int, bits: int, frac: int) -> float:
    """The exact value of a stored pattern (sign-extended, times 2**-frac)."""
    return math.ldexp(sign_extend(word, bits), -frac)


# ---- integer quantisation --------------------------------------------------------------------


INT_QUANT_MIN_SCALE = 2.0 ** -23  # float32 eps: torch.ao's floor on a scale


def int_quant_params(values: Sequence[float], bits: int, symmetric: bool) -> tuple[float, int]:
    """(scale, zero point) of a clean slice of values, by the formulas of the issue; the
    scale is floored at float32 eps (an all-zero slice: scale 2**-23, zero point 0)."""
    if symmetric:
        qmax = (1 << (bits - 1)) - 1
        amax = max((abs(v) for v in values), default=0.0)
        return max(amax / qmax, INT_QUANT_MIN_SCALE), 0
    qmax = (1 << bits) - 1
    xmin = min(min(values, default=0.0), 0.0)
    xmax = max(max(values, default=0.0), 0.0)
    scale = max((xmax - xmin) / qmax, INT_QUANT_MIN_SCALE)
    zero = round(0 - xmin / scale)  # round(): ties to even, like the hardware's rint
    return scale, max(0, min(qmax, zero))


def int_quant_word(x: float, scale: float, zero: int, bits: int, symmetric: bool,
                   codes: str, rounding: str = "nearest") -> tuple[int, bool]:
    """(unsigned stored pattern, saturated?) of one value with the clean scale and zero point."""
    ratio = x / scale
    q = (round(ratio) if rounding == "nearest" else math.trunc(ratio)) + zero
    half = 1 << (bits - 1)
    lo, hi = (-(half - 1), half - 1) if symmetric else (0, (1 << bits) - 1)
    saturated = not lo <= q <= hi
    q = max(lo, min(hi, q))
    if symmetric:
        stored = q if codes == "signed" else q + half
    else:
        stored = q - half if codes == "signed" else q
    return pattern(stored, bits), saturated


def int_quant_value(word: int, scale: float, zero: int, bits: int, symmetric: bool,
                    codes: str) -> float:
    """Dequantise a (possibly faulty) pattern with the clean scale: (stored-offset-zp)*scale."""
    half = 1 << (bits - 1)
    stored = sign_extend(word, bits) if codes == "signed" else word % (1 << bits)
    if symmetric:
        offset = 0 if codes == "signed" else half
    else:
        offset = -half if codes == "signed" else 0
    return float(stored - offset - zero) * scale


# ---- reading arrays out (no arithmetic) ------------------------------------------------------


def low_words(words: Any, bits: int) -> list[int]:
    """The library's words as unsigned ``bits``-bit Python ints, flattened in C order."""
    return [int(w) % (1 << bits) for w in np.asarray(words).reshape(-1).tolist()]


def float_bits_of(values: Any) -> list[int]:
    """Bit patterns of a float16/float32/float64 array, as unsigned Python ints (C order)."""
    arr = np.ascontiguousarray(values)
    return arr.view(f"u{arr.dtype.itemsize}").reshape(-1).tolist()
