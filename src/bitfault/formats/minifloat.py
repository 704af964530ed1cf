"""The small floats (8, 6 and 4 bits, and the E8M0 scale): one generic codec for any layout.

A ``MiniFloat`` is a bit layout (sign?, exponent bits, mantissa bits, which codes are
infinities and NaNs). Decoding is a lookup table of its ``2**bits`` values; encoding
rounds to nearest against the sorted finite magnitudes (ties to the even code, or up for
``float8_e8m0fnu`` as ml_dtypes and PyTorch cast), then applies the overflow policy:

* "saturate": every value that is not NaN is stored finite, infinities too (PyTorch's
  ``float8_e4m3fn`` cast; ml_dtypes' float6/float4 casts);
* "nan": a value past the largest finite one becomes the format's infinity where it has
  one (``float8_e5m2``), else its NaN, as ml_dtypes casts (and PyTorch for e5m2);
* "error": ValueError on the first value the format cannot store.

NaN input becomes the format's NaN (sign kept; payloads are not); formats without NaN
(float6/float4) store it as +0 under "saturate" and refuse it under "error".
``float8_e8m0fnu`` has no sign and no zero: zero and negative values are stored as its
smallest value 2**-127 under "saturate", as NaN under "nan".
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from bitfault.formats.base import cast_quietly, first_bad

SMALL_FLOAT_OVERFLOWS = ("saturate", "nan", "error")


_CHUNK = 1 << 16  # elements per step of the float32 encoder: temporaries stay in cache


@dataclass(frozen=True)
class MiniFloat:
    """A small float layout: ``exponent``/``mantissa`` bit counts, a sign bit or not, what
    the all-ones codes mean (``specials``: "ieee": the top exponent holds +-inf and NaNs;
    "nan": only the all-ones magnitude is NaN; "none": every code is finite), and whether
    exponent 0 holds zero and subnormals (``subnormals``; E8M0 has neither)."""

    name: str
    exponent: int
    mantissa: int
    signed: bool = True
    specials: Literal["ieee", "nan", "none"] = "nan"
    subnormals: bool = True

    @property
    def bits(self) -> int:
        return self.exponent + self.mantissa + int(self.signed)

    @property
    def bias(self) -> int:
        return (1 << (self.exponent - 1)) - 1

    @property
    def n_finite(self) -> int:
        """How many non-negative finite magnitudes: codes 0 .. n_finite-1, in value order."""
        magnitudes = 1 << (self.exponent + self.mantissa)
        return magnitudes - {"ieee": 1 << self.mantissa, "nan": 1, "none": 0}[self.specials]

    @property
    def has_infinity(self) -> bool:
        return self.specials == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.specials != "none"

    @property
    def sign_bit(self) -> int:
        """The sign bit's mask (0 for an unsigned layout)."""
        return 1 << (self.bits - 1) if self.signed else 0

    @property
    def nan_code(self) -> int | None:
        """The code NaN input is stored as (before its sign): the quiet NaN of an IEEE
        layout, the all-ones magnitude of the others; None where there is none."""
        if self.specials == "ieee":
            return self.n_finite | (1 << (self.mantissa - 1))
        return self.n_finite if self.specials == "nan" else None

    @property
    def inf_code(self) -> int | None:
        return self.n_finite if self.has_infinity else None

    @property
    def ties(self) -> Literal["even", "up"]:
        """How an exact midpoint rounds: to the even code, or (E8M0) to the larger value."""
        return "even" if self.subnormals else "up"

    @property
    def max(self) -> float:
        return float(self.magnitudes[-2])

    @property
    def min(self) -> float:
        """The smallest value: -max for a signed layout, the smallest magnitude otherwise."""
        return -self.max if self.signed else float(self.magnitudes[0])

    def magnitude(self, code: int) -> float:
        """The value of magnitude ``code`` read as an ordinary number (no specials)."""
        if not self.subnormals:
            return float(np.ldexp(1.0, code - self.bias))
        e, f = code >> self.mantissa, code & ((1 << self.mantissa) - 1)
        if e == 0:
            return float(np.ldexp(float(f), 1 - self.bias - self.mantissa))
        return float(np.ldexp(float((1 << self.mantissa) | f), e - self.bias - self.mantissa))

    @functools.cached_property
    def magnitudes(self) -> np.ndarray:
        """float64 magnitudes of codes 0..n_finite: the finite ones and, last, the value the
        next code would have (a value rounding to it overflows)."""
        return np.array([self.magnitude(c) for c in range(self.n_finite + 1)], np.float64)

    @functools.cached_property
    def midpoints(self) -> np.ndarray:
        """float64 midpoints between consecutive ``magnitudes`` (exact)."""
        m = self.magnitudes
        return (m[:-1] + m[1:]) / 2

    @functools.cached_property
    def tie_up(self) -> np.ndarray:
        """bool per midpoint: an exact tie there rounds to the larger magnitude."""
        codes = np.arange(1, self.n_finite + 1)
        return np.ones(self.n_finite, bool) if self.ties == "up" else codes % 2 == 0

    @functools.cache  # noqa: B019 (a handful of layouts, each alive for the whole process)
    def decode_table(self, dtype: Any = np.float32) -> np.ndarray:
        """The value of every code in ``dtype`` (float16/32/64); NaN codes decode to the
        quiet NaN with the code's sign (float32 0x7FC00000 | sign, then widened/narrowed)."""
        values = np.full(1 << self.bits, np.nan, np.float64)
        n = self.n_finite
        for sign in ((0, 1) if self.signed else (0,)):
            base = sign * self.sign_bit
            mags = self.magnitudes[:n] * (-1.0 if sign else 1.0)
            values[base:base + n] = mags
            if self.has_infinity:
                values[base + n] = -np.inf if sign else np.inf
        f32 = values.astype(np.float32)
        nan = np.isnan(values)
        negative = (np.arange(1 << self.bits) & self.sign_bit) != 0
        bits = np.where(negative, np.uint32(0xFFC00000), np.uint32(0x7FC00000))
        f32 = np.where(nan, bits.view(np.float32), f32)
        table = cast_quietly(f32, dtype)
        table.setflags(write=False)
        return table

    def encode(self, x: np.ndarray, overflow: str) -> tuple[np.ndarray, int]:
        """float16/32/64 array -> (codes, how many values the overflow policy mapped),
        rounded once from the input's exact value. float32 goes by table lookup (the same
        codes, as uint8: ``float32_tables``), other dtypes and overflow='error' the exact
        way (int64 codes)."""
        x = np.asarray(x)
        if x.dtype == np.float32 and overflow != "error":
            return self._encode_float32(x, overflow)
        codes, mapped = self.encode_exact(x, overflow)
        return codes, int(np.count_nonzero(mapped))

    @functools.cache  # noqa: B019 (a handful of layouts and policies, alive for the process)
    def float32_tables(self, overflow: str) -> tuple[np.ndarray, np.ndarray]:
        """The code of every float32 (and whether the policy mapped it), indexed by its sign,
        exponent and top ``mantissa + 1`` mantissa bits, then by whether any lower bit is
        set: rounding to ``mantissa`` bits reads nothing else (the round bit and a sticky
        bit). Built once from the exact encoder, so the codes are its codes."""
        shift = 22 - self.mantissa
        keys = np.arange(1 << (32 - shift), dtype=np.uint32) << np.uint32(shift)
        reps = np.concatenate([keys, keys | np.uint32(1)]).view(np.float32)
        with np.errstate(invalid="ignore"):  # signalling NaN patterns among them
            codes, mapped = self.encode_exact(reps, overflow)
        codes = codes.astype(np.uint8)
        codes.setflags(write=False)
        mapped.setflags(write=False)
        return codes, mapped

    def _encode_float32(self, x: np.ndarray, overflow: str) -> tuple[np.ndarray, int]:
        codes_t, mapped_t = self.float32_tables(overflow)
        shift = 22 - self.mantissa
        bits = np.ascontiguousarray(x).view(np.uint32)
        flat = bits.reshape(-1)
        codes = np.empty(flat.size, np.uint8)
        n_mapped = 0
        # in chunks that stay in the CPU's cache: index = top bits | (any lower bit) << top
        index = np.empty(min(flat.size, _CHUNK), np.uint32)
        sticky = np.empty(index.size, np.uint32)
        low, top = np.uint32((1 << shift) - 1), np.uint32(32 - shift)
        for start in range(0, flat.size, _CHUNK):
            part = flat[start:start + _CHUNK]
            k, t = index[:part.size], sticky[:part.size]
            np.bitwise_and(part, low, out=t)
            np.minimum(t, np.uint32(1), out=t)
            np.left_shift(t, top, out=t)
            np.right_shift(part, np.uint32(shift), out=k)
            k |= t
            np.take(codes_t, k, out=codes[start:start + _CHUNK])
            n_mapped += int(np.count_nonzero(mapped_t.take(k)))
        codes = codes.reshape(bits.shape)
        if not self.subnormals:  # E8M0's smallest value 2**-127 is a float32 subnormal:
            tiny = ((bits & np.uint32(0x7F800000)) == 0) & ((bits & np.uint32(0x7FFFFF)) != 0)
            if tiny.any():  # those few go the exact way
                exact, flagged = self.encode_exact(x[tiny], overflow)
                b = bits[tiny]
                t = (b >> np.uint32(shift)) | (np.minimum(b & low, np.uint32(1)) << top)
                n_mapped += int(np.count_nonzero(flagged)) - int(np.count_nonzero(
                    mapped_t.take(t)))
                codes[tiny] = exact.astype(np.uint8)
        return codes, n_mapped

    def encode_exact(self, x: np.ndarray, overflow: str) -> tuple[np.ndarray, np.ndarray]:
        """(int64 codes, bool: the overflow policy mapped this value) from exact values."""
        x64 = np.asarray(x).astype(np.float64)
        a = np.abs(x64)
        n = self.n_finite
        idx = np.searchsorted(self.midpoints, a, side="left")
        at = np.minimum(idx, n - 1)
        idx = idx + ((idx < n) & (a == self.midpoints[at]) & self.tie_up[at])
        sign = np.where(np.signbit(x64), self.sign_bit, 0) if self.signed else 0
        codes = idx.astype(np.int64) | sign
        nan = np.isnan(x64)
        low = ~nan & (x64 <= 0) if not self.signed else np.zeros(x64.shape, bool)
        over = ~nan & ~low & (idx >= n)  # finite overflow and infinities
        keep_inf = over & np.isinf(x64) & self.has_infinity & (overflow != "saturate")
        mapped = over & ~keep_inf
        if overflow == "error":
            self.check_storable(mapped | low | (nan & (self.nan_code is None)), x64)
        if mapped.any():
            to_inf = self.has_infinity and overflow == "nan"
            target = (self.inf_code if to_inf else self.nan_code if overflow == "nan"
                      else n - 1)
            codes = np.where(mapped, sign | target, codes)
        if keep_inf.any():
            codes = np.where(keep_inf, sign | n, codes)
        if low.any():
            codes = np.where(low, self.nan_code if overflow == "nan" else 0, codes)
        if nan.any():
            stored = 0 if self.nan_code is None else sign | self.nan_code
            codes = np.where(nan, stored, codes)
        flagged = mapped | low
        if self.nan_code is None:
            flagged = flagged | nan
        return codes, flagged

    def check_storable(self, bad: np.ndarray, x: np.ndarray) -> None:
        """Raise overflow='error''s ValueError at the first ``bad`` value of ``x`` (the
        backends raise the core's message through it)."""
        if not bad.any():
            return
        index, value = first_bad(bad, x)
        lo, hi = self.min, self.max
        others = "'saturate' or 'nan'" if self.has_nan else "'saturate'"
        raise ValueError(
            f"Float({self.name!r}): value {value!r} at index {index} is outside what the "
            f"format stores (finite values in [{lo!r}, {hi!r}]"
            f"{'' if self.has_nan else ', no NaN'}; overflow='error'; use {others} to map it)")


SMALL_FLOATS: dict[str, MiniFloat] = {
    f.name: f for f in (
        MiniFloat("float8_e4m3fn", 4, 3),
        MiniFloat("float8_e5m2", 5, 2, specials="ieee"),
        MiniFloat("float6_e2m3fn", 2, 3, specials="none"),
        MiniFloat("float6_e3m2fn", 3, 2, specials="none"),
        MiniFloat("float4_e2m1fn", 2, 1, specials="none"),
        MiniFloat("float8_e8m0fnu", 8, 0, signed=False, subnormals=False),
    )
}
"""The small float layouts by their standard (ml_dtypes) names."""

__all__ = ["SMALL_FLOATS", "SMALL_FLOAT_OVERFLOWS", "MiniFloat"]
