"""An independent reference of the OCP MX v1.0 and NVFP4 arithmetic, from the bit layouts
and the specifications' formulas, in exact rationals (``fractions.Fraction``) and Python
ints; it calls nothing of bitfault."""

from __future__ import annotations

import bisect
import functools
import math
import struct
from fractions import Fraction

import numpy as np

# name: (exponent bits, mantissa bits, specials): "e4m3" only S.1111.111 is NaN,
# "ieee" the top exponent holds inf and NaN, "none" every code is finite
LAYOUTS = {
    "float8_e4m3fn": (4, 3, "e4m3"),
    "float8_e5m2": (5, 2, "ieee"),
    "float6_e2m3fn": (2, 3, "none"),
    "float6_e3m2fn": (3, 2, "none"),
    "float4_e2m1fn": (2, 1, "none"),
}
EMAX = {"float8_e4m3fn": 8, "float8_e5m2": 15, "float6_e2m3fn": 2, "float6_e3m2fn": 4,
        "float4_e2m1fn": 2, "int8": 0}
NAN = "nan"


def element_value(name: str, code: int) -> Fraction | float | str:
    """The value of an element code read from its bit layout (NAN or +-inf for specials)."""
    e_bits, m_bits, specials = LAYOUTS[name]
    n = 1 + e_bits + m_bits
    sign = -1 if code >> (n - 1) & 1 else 1
    e = code >> m_bits & ((1 << e_bits) - 1)
    m = code & ((1 << m_bits) - 1)
    top = (1 << e_bits) - 1
    if specials == "e4m3" and e == top and m == (1 << m_bits) - 1:
        return NAN
    if specials == "ieee" and e == top:
        return NAN if m else sign * math.inf
    bias = (1 << (e_bits - 1)) - 1
    if e == 0:
        mag = Fraction(m, 1 << m_bits) * Fraction(2) ** (1 - bias)
    else:
        mag = (1 + Fraction(m, 1 << m_bits)) * Fraction(2) ** (e - bias)
    return sign * mag


@functools.cache
def finite_magnitudes(name: str) -> list[tuple[Fraction, int]]:
    """(value, code) of every non-negative finite code, in increasing value."""
    e_bits, m_bits, _ = LAYOUTS[name]
    out = []
    for code in range(1 << (e_bits + m_bits)):
        v = element_value(name, code)
        if isinstance(v, Fraction):
            out.append((v, code))
    return sorted(out)


def round_half_even(q: Fraction) -> int:
    n = math.floor(q)
    rest = q - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2):
        n += 1
    return n


def encode_element(name: str, v: Fraction, negative: bool) -> int:
    """Round |v| to the nearest finite magnitude (ties to the even code), saturating at the
    largest; the sign bit from ``negative`` (so -0 keeps its sign)."""
    e_bits, m_bits, _ = LAYOUTS[name]
    sign = (1 << (e_bits + m_bits)) if negative else 0
    a = abs(v)
    mags = finite_magnitudes(name)
    if a >= mags[-1][0]:
        return sign | mags[-1][1]
    i = bisect.bisect_right([v for v, _ in mags], a) - 1  # mags[i] <= a < mags[i + 1]
    (lo, lo_code), (hi, hi_code) = mags[i], mags[i + 1]
    mid = (lo + hi) / 2
    if a < mid or (a == mid and lo_code % 2 == 0):
        return sign | lo_code
    return sign | hi_code


def floor_log2(a: Fraction) -> int:
    """Exact floor(log2(a)) of a positive rational."""
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    return e


def mx_block(name: str, xs: list[float]) -> tuple[int, list[int]]:
    """(E8M0 scale code, element codes) of one block of float32 values, as MX v1.0 6.3:
    E = clamp(floor(log2(amax)) - emax, -127, 127), -127 for an all-zero block."""
    amax = max(abs(Fraction(x)) for x in xs)
    e = -127 if amax == 0 else floor_log2(amax) - EMAX[name]
    e = max(-127, min(127, e))
    scale = Fraction(2) ** e
    codes = []
    for x in xs:
        v = Fraction(x) / scale
        if name == "int8":
            codes.append(max(-127, min(127, round_half_even(v * 64))))
        else:
            codes.append(encode_element(name, v, math.copysign(1.0, x) < 0))
    return e + 127, codes


def f32(v: Fraction | float) -> float:
    """The exact rational ``v`` rounded to the nearest float32 (ties to even, subnormals,
    overflow to inf), as a Python float."""
    if not isinstance(v, Fraction):
        return float(v)
    if v == 0:
        return 0.0
    sign = -1.0 if v < 0 else 1.0
    a = abs(v)
    e = floor_log2(a)
    quantum = Fraction(2) ** (max(e, -126) - 23)
    r = round_half_even(a / quantum) * quantum
    if r >= Fraction(2) ** 128:
        return sign * math.inf
    return sign * float(r)


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def nvfp4_tensor(x: np.ndarray) -> tuple[int, list[tuple[int, list[int]]]]:
    """(tensor scale float32 bits, [(E4M3 scale code, E2M1 codes) per row of 16]) of a
    (blocks, 16) float32 array by the NVFP4 recipe, every float32 operation rounded once:
    t = amax / (6 * 448) (1 where 0), s = E4M3(amax_b / (6 * t)), q = E2M1(x / (s * t))."""
    rows = [[float(v) for v in row] for row in x]
    amax = max((abs(Fraction(v)) for row in rows for v in row), default=Fraction(0))
    t = f32(amax / 2688)
    t = 1.0 if t == 0 else t
    six_t = f32(6 * Fraction(t))
    out = []
    for row in rows:
        amax_b = max(abs(Fraction(v)) for v in row)
        s_code = encode_element("float8_e4m3fn", Fraction(f32(amax_b / Fraction(six_t))), False)
        s = element_value("float8_e4m3fn", s_code)
        denominator = f32(s * Fraction(t))
        codes = []
        for v in row:
            q = (Fraction(0) if denominator == 0
                 else Fraction(f32(Fraction(v) / Fraction(denominator))))
            codes.append(encode_element("float4_e2m1fn", q, math.copysign(1.0, v) < 0))
        out.append((s_code, codes))
    return f32_bits(t), out
