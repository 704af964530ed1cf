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

import bisect
import functools
import math
import struct
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

FLOAT_LAYOUTS = {"float32": (32, 8, 23), "float16": (16, 5, 10), "bfloat16": (16, 8, 7)}

SMALL_FLOAT_LAYOUTS = {
    # name: (exponent bits, mantissa bits, sign bit?, what the top codes mean), from the OCP
    # 8-bit float and MX specifications: "ieee": the top exponent is +-inf (mantissa 0) and
    # NaN; "fn": only exponent and mantissa all ones is NaN; "none": all codes finite;
    # "fnu": unsigned, no zero or subnormals, 0xFF is NaN
    "float8_e4m3fn": (4, 3, True, "fn"),
    "float8_e5m2": (5, 2, True, "ieee"),
    "float6_e2m3fn": (2, 3, True, "none"),
    "float6_e3m2fn": (3, 2, True, "none"),
    "float4_e2m1fn": (2, 1, True, "none"),
    "float8_e8m0fnu": (8, 0, False, "fnu"),
}


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
    elif kind == "float" and dtype in SMALL_FLOAT_LAYOUTS:
        e, m, signed, _ = SMALL_FLOAT_LAYOUTS[dtype]
        bits = e + m + signed
        fields = {"exponent": list(range(m, m + e))}
        if signed:
            fields["sign"] = [bits - 1]
        if m:
            fields["mantissa"] = list(range(m))
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


# ---- the small floats (float8 / float6 / float4, E8M0) -------------------------------------


def small_float_width(name: str) -> int:
    e, m, signed, _ = SMALL_FLOAT_LAYOUTS[name]
    return e + m + signed


def small_float_exact(word: int, name: str) -> Fraction | str:
    """The exact value of a small-float pattern: a Fraction, or "nan" / "+inf" / "-inf"."""
    e_bits, m_bits, signed, specials = SMALL_FLOAT_LAYOUTS[name]
    width = e_bits + m_bits + signed
    word %= 1 << width
    negative = signed and word >> (width - 1) == 1
    e = (word >> m_bits) % (1 << e_bits)
    m = word % (1 << m_bits)
    top_e, top_m = (1 << e_bits) - 1, (1 << m_bits) - 1
    bias = 2 ** (e_bits - 1) - 1
    if specials == "ieee" and e == top_e:
        return "nan" if m else ("-inf" if negative else "+inf")
    if specials in ("fn", "fnu") and e == top_e and m == top_m:
        return "nan"
    if specials == "fnu":  # no zero, no subnormals: 2**(e - bias)
        value = Fraction(2) ** (e - bias)
    elif e == 0:
        value = Fraction(m, 2**m_bits) * Fraction(2) ** (1 - bias)
    else:
        value = (1 + Fraction(m, 2**m_bits)) * Fraction(2) ** (e - bias)
    return -value if negative else value


def small_float_value(word: int, name: str) -> float:
    """``small_float_exact`` as a Python float (exact: every value fits a float64); -0.0 kept."""
    v = small_float_exact(word, name)
    if isinstance(v, str):
        return {"nan": math.nan, "+inf": math.inf, "-inf": -math.inf}[v]
    _, _, signed, _ = SMALL_FLOAT_LAYOUTS[name]
    width = small_float_width(name)
    if v == 0 and signed and (word % (1 << width)) >> (width - 1):
        return -0.0
    return float(v)


@functools.cache
def _small_float_magnitudes(name: str) -> list[tuple[Fraction, int | None]]:
    """(value, code) of every finite non-negative code, ascending, then the value one step
    past the largest (code None): what a value that overflows rounds to."""
    e_bits, m_bits, signed, _ = SMALL_FLOAT_LAYOUTS[name]
    codes = range(1 << (e_bits + m_bits))  # the sign bit clear
    finite = sorted((v, c) for c in codes
                    if not isinstance(v := small_float_exact(c, name), str))
    largest = finite[-1][0]
    step = Fraction(2) ** (math.floor(math.log2(largest)) - m_bits)  # its spacing (exact here)
    return [*finite, (largest + step, None)]


def small_float_bits(x: float, name: str, overflow: str = "saturate") -> int:
    """The pattern of ``x``: nearest value, exact ties to the even code (E8M0: to the larger
    value), then the overflow policy of bitfault's docs ("saturate": everything but NaN
    becomes finite; "nan": overflow is inf where the format has it, else NaN; "error":
    OverflowPolicyError for what it cannot store). NaN: the format's NaN with x's sign
    (E5M2: its quiet NaN S.11111.10), or +0 under "saturate" where there is none."""
    e_bits, m_bits, signed, specials = SMALL_FLOAT_LAYOUTS[name]
    width = e_bits + m_bits + signed
    sign = (1 << (width - 1)) if signed and math.copysign(1.0, x) < 0 else 0
    mags = _small_float_magnitudes(name)
    largest_code = mags[-2][1]
    nan_code = {"fn": (1 << (width - 1)) - 1, "ieee": (((1 << e_bits) - 1) << m_bits)
                | (1 << (m_bits - 1)) if m_bits else 0, "fnu": 0xFF, "none": None}[specials]
    inf_code = ((1 << e_bits) - 1) << m_bits if specials == "ieee" else None

    def out_of_range() -> int:
        if overflow == "error":
            raise OverflowPolicyError(x)
        if overflow == "saturate":
            return sign | largest_code
        return sign | (inf_code if inf_code is not None else nan_code)

    if math.isnan(x):
        if nan_code is not None:
            return sign | nan_code
        if overflow == "error":
            raise OverflowPolicyError(x)
        return 0
    if not signed and x <= 0:  # no zero, no negatives: the smallest value or NaN
        if overflow == "error":
            raise OverflowPolicyError(x)
        return 0 if overflow == "saturate" else nan_code
    if math.isinf(x):
        if inf_code is not None and overflow != "saturate":
            return sign | inf_code
        return out_of_range()
    target = abs(Fraction(x))
    at = bisect.bisect_left([v for v, _ in mags], target)
    if at == len(mags):  # beyond even the value past the largest
        return out_of_range()
    neighbours = mags[max(at - 1, 0):at + 1]  # the nearest value below and the one above
    best = min(neighbours, key=lambda vc: abs(vc[0] - target))
    tied = [vc for vc in neighbours if abs(vc[0] - target) == abs(best[0] - target)]
    if len(tied) == 2:
        low, high = tied
        if specials == "fnu":
            best = high
        else:  # the even code; the value past the largest has the code after it
            high_code = high[1] if high[1] is not None else largest_code + 1
            best = high if high_code % 2 == 0 else low
    if best[1] is None:
        return out_of_range()
    return sign | best[1]


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


def float32_of(v: Fraction | int | float) -> float:
    """The exact value ``v`` rounded once to the nearest float32 (ties to even, subnormals,
    +-inf beyond the largest finite value), as a Python float (which holds it exactly)."""
    v = Fraction(v)
    if v == 0:
        return 0.0
    a = abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2**(e-1) < a < 2**(e+1)
    if Fraction(2) ** (e + 1) <= a:
        e += 1
    if a < Fraction(2) ** e:
        e -= 1
    quantum = Fraction(2) ** (max(e, -126) - 23)
    r = round(a / quantum) * quantum  # Fraction.__round__: half to even
    if r >= Fraction(2) ** 128 - Fraction(2) ** 103:
        return math.copysign(math.inf, v)
    return math.copysign(float(r), v)


def int_quant_params(values: Sequence[float], bits: int, symmetric: bool) -> tuple[float, int]:
    """(scale, zero point) of a clean slice of values, as torch.ao's MinMaxObserver
    computes them in float32 (each operation rounded once to float32): symmetric
    ``max(|x|) / float32(qmax)``, asymmetric ``(max(x, 0) - min(x, 0)) / float32(qmax)`` and
    ``zp = -rint(min(x, 0) / scale)`` clamped; the scale is at least float32 eps (an
    all-zero slice: scale 2**-23, zero point 0). float64 values are rounded to float32 first."""
    values = [f32(v) for v in values]
    if symmetric:
        qmax = (1 << (bits - 1)) - 1  # (qmax - qmin) / 2 with qmin = -qmax
        amax = max((abs(v) for v in values), default=0.0)
        return max(float32_of(Fraction(amax) / Fraction(float32_of(qmax))),
                   INT_QUANT_MIN_SCALE), 0
    qmax = (1 << bits) - 1
    xmin = min(min(values, default=0.0), 0.0)
    xmax = max(max(values, default=0.0), 0.0)
    span = float32_of(Fraction(xmax) - Fraction(xmin))
    scale = max(float32_of(Fraction(span) / Fraction(float32_of(qmax))), INT_QUANT_MIN_SCALE)
    zero = 0 - round(Fraction(float32_of(Fraction(xmin) / Fraction(scale))))
    return scale, max(0, min(qmax, zero))


def _round_code(t: float, rounding: str) -> float:
    """A float32 ratio rounded to an integer (+-inf kept: they saturate)."""
    if math.isinf(t):
        return t
    return round_fraction(Fraction(t), rounding)


def int_quant_word(x: float, scale: float, zero: int, bits: int, symmetric: bool,
                   codes: str, rounding: str = "nearest", per_tensor: bool = True
                   ) -> tuple[int, bool]:
    """(unsigned stored pattern, saturated?) of one value with the clean scale and zero point,
    as PyTorch's CPU quantisers compute it: ``x`` rounded to float32, ``inv = float32(1 /
    scale)``; symmetric (and rounding "trunc"): ``round(float32(x * inv)) + zp``;
    asymmetric per tensor in at most 8 bits (torch.quantize_per_tensor's fused multiply-add):
    ``rint(float32(x * inv + zp))``, one rounding; else (torch.quantize_per_channel, and the
    qint32 path): ``rint(float32(float32(x * inv) + float32(zp)))``. NaN -> code 0."""
    half = 1 << (bits - 1)
    lo, hi = (-(half - 1), half - 1) if symmetric else (0, (1 << bits) - 1)
    x = f32(x)
    if math.isnan(x):
        q: float = 0
        saturated = True
    else:
        inv = Fraction(float32_of(1 / Fraction(scale)))
        if symmetric or rounding == "trunc":
            q = _round_code(float32_of(Fraction(x) * inv), rounding) + zero
        elif per_tensor and bits <= 8:
            q = _round_code(float32_of(Fraction(x) * inv + zero), rounding)
        else:
            t = float32_of(Fraction(x) * inv)
            q = t if math.isinf(t) else _round_code(
                float32_of(Fraction(t) + Fraction(float32_of(zero))), rounding)
        saturated = not lo <= q <= hi
    q = int(max(lo, min(hi, q)))
    if symmetric:
        stored = q if codes == "signed" else q + half
    else:
        stored = q - half if codes == "signed" else q
    return pattern(stored, bits), saturated


def int_quant_value(word: int, scale: float, zero: int, bits: int, symmetric: bool,
                    codes: str) -> float:
    """Dequantise a (possibly faulty) pattern with the clean scale: ``(stored - offset - zp) *
    scale`` rounded once into a Python float (torch's fake quantisation multiplies in double)."""
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
