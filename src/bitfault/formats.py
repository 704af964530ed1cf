"""Number formats: how a float tensor is stored in memory, bit for bit, and back.

Every format turns floats into *words*: integers in a same-width signed
container (int8 / int16 / int32) whose low ``bits`` bits are the stored bit
pattern. Faults act on those bits; ``decode`` reads only the low ``bits`` bits,
so a fault on the top bit of a narrow word is interpreted the way the hardware
would (sign extension for two's complement, zero extension for unsigned codes).

No float->int cast ever sees NaN, an infinity or an out-of-range value: values
are mapped explicitly first, by each format's documented policy.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import numpy as np

Rounding = Literal["nearest", "trunc"]
Overflow = Literal["saturate", "wrap", "error"]

_ROUNDINGS = ("nearest", "trunc")
_OVERFLOWS = ("saturate", "wrap", "error")
_FLOAT_DTYPES = (np.float16, np.float32, np.float64)


def container_dtype(bits: int) -> np.dtype:
    """The narrowest signed integer dtype (int8/int16/int32) that holds ``bits`` bits."""
    if not 2 <= bits <= 32:
        raise ValueError(f"bits must be an integer in 2..32, got {bits!r}")
    return np.dtype(np.int8 if bits <= 8 else np.int16 if bits <= 16 else np.int32)


def _unsigned(dtype: np.dtype) -> np.dtype:
    return np.dtype(f"u{np.dtype(dtype).itemsize}")


def low_bits_signed(words: np.ndarray, bits: int) -> np.ndarray:
    """Sign-extend the low ``bits`` bits of each word (two's complement), as int64."""
    w = np.asarray(words).astype(np.int64)
    shift = 64 - bits
    return (w << shift) >> shift


def low_bits_unsigned(words: np.ndarray, bits: int) -> np.ndarray:
    """The low ``bits`` bits of each word as a non-negative int64."""
    return np.asarray(words).astype(np.int64) & ((1 << bits) - 1)


def to_container(values: np.ndarray, bits: int) -> np.ndarray:
    """Store int64 values (signed or unsigned ``bits``-bit patterns) in the signed container."""
    dt = container_dtype(bits)
    return (np.asarray(values, dtype=np.int64) & ((1 << (8 * dt.itemsize)) - 1)).astype(
        _unsigned(dt)).view(dt)


def check_float_input(x: Any, argument: str = "x") -> np.ndarray:
    """Return ``x`` as a float ndarray or raise ``TypeError`` naming the argument."""
    arr = np.asarray(x)
    if arr.dtype.kind != "f" or arr.dtype not in [np.dtype(d) for d in _FLOAT_DTYPES]:
        raise TypeError(
            f"{argument} must be a float16, float32 or float64 array, got dtype {arr.dtype}")
    return arr


def _first_bad(bad: np.ndarray, values: np.ndarray) -> tuple[tuple[int, ...], float]:
    flat = int(np.flatnonzero(bad.ravel())[0])
    index = tuple(int(i) for i in np.unravel_index(flat, bad.shape)) if bad.ndim else ()
    return index, float(np.asarray(values).ravel()[flat])


def _cast(values: np.ndarray, dtype: Any) -> np.ndarray:
    """Cast decoded values to ``dtype`` quietly: a faulty value too large for it becomes +-inf
    (IEEE rounding) and a signalling-NaN word stays a NaN; neither is an error."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(values).astype(dtype)


def _round(y: np.ndarray, rounding: str) -> np.ndarray:
    return np.rint(y) if rounding == "nearest" else np.trunc(y)


def _to_int_range(
    y: np.ndarray, lo: int, hi: int, overflow: str, source: np.ndarray, what: str
) -> tuple[np.ndarray, int]:
    """Map rounded float64 values into [lo, hi] by policy; return (int64 codes, n saturated).

    NaN becomes 0 and +-inf the end of the range, under "saturate" and "wrap"
    alike; "error" raises on the first NaN, inf or out-of-range value.
    """
    finite = np.isfinite(y)
    out_of_range = ~finite | (y < lo) | (y > hi)
    n_bad = int(np.count_nonzero(out_of_range))
    if n_bad == 0:
        return y.astype(np.int64), 0
    if overflow == "error":
        index, value = _first_bad(out_of_range, source)
        raise ValueError(
            f"{what}: value {value!r} at index {index} is NaN, infinite or outside the "
            f"representable range (overflow='error'; use 'saturate' or 'wrap' to map it)")
    y = np.where(np.isnan(y), 0.0, y)
    if overflow == "wrap":
        span = float(hi - lo + 1)
        finite_y = np.where(np.isfinite(y), y, 0.0)
        # fmod first (exact for any float); subtracting lo from a huge y would round
        wrapped = np.mod(np.fmod(finite_y, span) - lo, span) + lo
        y = np.where(np.isfinite(y), wrapped, y)
    y = np.clip(y, lo, hi)
    return y.astype(np.int64), n_bad


@runtime_checkable
class Format(Protocol):
    """What every format offers; see FixedPoint, IntQuant and Float."""

    bits: int

    @property
    def container(self) -> np.dtype: ...

    @property
    def bit_fields(self) -> dict[str, tuple[int, ...]]: ...

    def encode(self, x: Any, params: QuantParams | None = None) -> np.ndarray: ...

    def decode(
        self, words: Any, params: QuantParams | None = None, dtype: Any = np.float32
    ) -> np.ndarray: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True, eq=False)
class QuantParams:
    """Scale and zero point of an affine quantisation, from the clean tensor.

    ``scale`` and ``zero_point`` broadcast against the tensor (shape ``()`` per
    tensor, or size 1 on every axis but the channel axis).
    """

    scale: np.ndarray
    zero_point: np.ndarray


@dataclass(frozen=True)
class _FormatBase:
    kind: ClassVar[str] = ""

    @property
    def container(self) -> np.dtype:
        """The signed integer dtype that holds one word."""
        return container_dtype(self.bits)  # type: ignore[attr-defined]

    @property
    def word_mask(self) -> int:
        """An int with the low ``bits`` bits set: the bits a fault may touch."""
        return (1 << self.bits) - 1  # type: ignore[attr-defined]

    def quantize(self, x: Any) -> tuple[np.ndarray, QuantParams | None]:
        """Encode ``x`` and return the words with the parameters decoding needs."""
        params = self.calibrate(x)
        return self.encode(x, params), params

    def calibrate(self, x: Any) -> QuantParams | None:
        """Parameters computed from the clean tensor; None for formats that need none."""
        return None

    def encode_counting(
        self, x: Any, params: QuantParams | None = None
    ) -> tuple[np.ndarray, int]:
        """Like ``encode`` but also return how many values were saturated or mapped."""
        return self.encode(x, params), 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description; ``format_from_dict`` rebuilds it."""
        return {"kind": self.kind, **{f.name: getattr(self, f.name) for f in fields(self)}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Format:
        return format_from_dict(data)


@dataclass(frozen=True)
class FixedPoint(_FormatBase):
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
    kind: ClassVar[str] = "fixed_point"

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or not isinstance(self.bits, (int, np.integer)):
            raise TypeError(f"bits must be an integer in 2..32, got {self.bits!r}")
        if not 2 <= self.bits <= 32:
            raise ValueError(f"bits must be an integer in 2..32, got {self.bits!r}")
        if isinstance(self.frac, bool) or not isinstance(self.frac, (int, np.integer)):
            raise TypeError(f"frac must be an integer in 0..bits ({self.bits}), got {self.frac!r}")
        if not 0 <= self.frac <= self.bits:
            raise ValueError(
                f"frac must be an integer in 0..bits ({self.bits}), got {self.frac!r}")
        if self.rounding not in _ROUNDINGS:
            raise ValueError(f"rounding must be one of {_ROUNDINGS}, got {self.rounding!r}")
        if self.overflow not in _OVERFLOWS:
            raise ValueError(f"overflow must be one of {_OVERFLOWS}, got {self.overflow!r}")

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
        y = _round(arr.astype(np.float64) * 2.0**self.frac, self.rounding)
        lo, hi = self.code_range
        codes, n_bad = _to_int_range(y, lo, hi, self.overflow, arr, f"FixedPoint{self._q()}")
        return to_container(codes, self.bits), n_bad

    def encode(self, x: Any, params: QuantParams | None = None) -> np.ndarray:
        """Float array -> words in the signed container, same shape."""
        return self.encode_counting(x, params)[0]

    def decode(
        self, words: Any, params: QuantParams | None = None, dtype: Any = np.float32
    ) -> np.ndarray:
        """Words -> floats (``dtype``, float32 by default); reads only the low ``bits`` bits."""
        return _cast(low_bits_signed(words, self.bits) * 2.0**-self.frac, dtype)

    def _q(self) -> str:
        return f"(Q{self.bits - self.frac}.{self.frac})"


_SCHEMES = ("symmetric", "asymmetric")
_CODES = ("signed", "unsigned")


@dataclass(frozen=True)
class IntQuant(_FormatBase):
    """Affine integer quantisation into ``bits``-bit codes (2..32).

    symmetric: ``q = round(x / s)`` in [-(2**(b-1)-1), 2**(b-1)-1], ``s = max|x| / (2**(b-1)-1)``.
    asymmetric: ``q = round(x / s) + z`` in [0, 2**b - 1], ``s = (max - min) / (2**b - 1)``.
    ``s`` is at least ``min_scale`` (float32 eps, torch.ao's floor), so an all-zero
    tensor or channel gets ``s = 2**-23`` and a flipped code in it stays tiny.
    ``per_channel``: False (one scale per tensor), True (per slice along axis 0) or an
    axis. ``codes``: how a code is laid out in memory, "signed" two's complement or
    "unsigned" offset binary (a symmetric code is stored as ``q + 2**(b-1)``; an
    asymmetric one as ``q`` itself). Default: signed for symmetric, unsigned for
    asymmetric. Decoding faulty words uses the clean tensor's scale and zero point.
    ``range`` and ``resolution`` are in units of the scale (codes); NaN or inf in
    the clean tensor is an error.
    """

    bits: int = 8
    symmetric: bool = True
    per_channel: bool | int = False
    rounding: Rounding = "nearest"
    codes: Literal["signed", "unsigned"] | None = None
    kind: ClassVar[str] = "int_quant"
    min_scale: ClassVar[float] = float(np.finfo(np.float32).eps)

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or not isinstance(self.bits, (int, np.integer)):
            raise TypeError(f"bits must be an integer in 2..32, got {self.bits!r}")
        if not 2 <= self.bits <= 32:
            raise ValueError(f"bits must be an integer in 2..32, got {self.bits!r}")
        if not isinstance(self.symmetric, (bool, np.bool_)):
            raise TypeError(f"symmetric must be True or False, got {self.symmetric!r}")
        if not isinstance(self.per_channel, (bool, int, np.integer)):
            raise TypeError(f"per_channel must be False, True (axis 0) or an axis int, "
                            f"got {self.per_channel!r}")
        if self.rounding not in _ROUNDINGS:
            raise ValueError(f"rounding must be one of {_ROUNDINGS}, got {self.rounding!r}")
        if isinstance(self.per_channel, (np.integer, np.bool_)):  # keep to_dict() JSON-ready
            object.__setattr__(self, "per_channel", self.per_channel.item())
        if self.codes is None:
            object.__setattr__(self, "codes", "signed" if self.symmetric else "unsigned")
        if self.codes not in _CODES:
            raise ValueError(f"codes must be one of {_CODES} or None, got {self.codes!r}")

    @property
    def axis(self) -> int | None:
        """The channel axis, or None for one scale per tensor."""
        if self.per_channel is False:
            return None
        return 0 if self.per_channel is True else int(self.per_channel)

    @property
    def code_range(self) -> tuple[int, int]:
        if self.symmetric:
            return -((1 << (self.bits - 1)) - 1), (1 << (self.bits - 1)) - 1
        return 0, (1 << self.bits) - 1

    @property
    def range(self) -> tuple[float, float]:
        """The code range, in units of the scale (the real range is this times the scale)."""
        lo, hi = self.code_range
        return float(lo), float(hi)

    @property
    def resolution(self) -> float:
        """One code step, in units of the scale."""
        return 1.0

    @property
    def _offset(self) -> int:
        """What is added to a code to get its stored bit pattern (before two's complement)."""
        half = 1 << (self.bits - 1)
        if self.symmetric:
            return 0 if self.codes == "signed" else half
        return -half if self.codes == "signed" else 0

    @property
    def bit_fields(self) -> dict[str, tuple[int, ...]]:
        top = self.bits - 1
        return {"sign": (top,), "magnitude": tuple(range(top))}

    def _reduce_axes(self, ndim: int) -> tuple[int, ...] | None:
        axis = self.axis
        if axis is None:
            return None
        if not -ndim <= axis < ndim:
            raise ValueError(
                f"per_channel axis {axis} is out of range for a tensor with {ndim} dimensions")
        axis %= ndim
        return tuple(i for i in range(ndim) if i != axis)

    def calibrate(self, x: Any) -> QuantParams:
        """Scale and zero point from the clean tensor (per tensor or per channel)."""
        arr = check_float_input(x).astype(np.float64)
        bad = ~np.isfinite(arr)
        if bad.any():
            index, value = _first_bad(bad, arr)
            raise ValueError(f"IntQuant: value {value!r} at index {index} is not finite; "
                             "a scale cannot be computed from NaN or inf")
        axes = self._reduce_axes(arr.ndim)
        lo, hi = self.code_range
        if arr.size == 0:
            return QuantParams(np.asarray(1.0), np.asarray(0, dtype=np.int64))
        if self.symmetric:
            amax = np.max(np.abs(arr), axis=axes, keepdims=axes is not None)
            scale = np.maximum(amax / hi, self.min_scale)
            zero = np.zeros_like(scale, dtype=np.int64)
        else:
            xmin = np.minimum(np.min(arr, axis=axes, keepdims=axes is not None), 0.0)
            xmax = np.maximum(np.max(arr, axis=axes, keepdims=axes is not None), 0.0)
            scale = np.maximum((xmax - xmin) / (hi - lo), self.min_scale)
            zero = np.clip(np.rint(lo - xmin / scale), lo, hi).astype(np.int64)
        return QuantParams(np.asarray(scale, dtype=np.float64), np.asarray(zero))

    def encode_counting(
        self, x: Any, params: QuantParams | None = None
    ) -> tuple[np.ndarray, int]:
        arr = check_float_input(x)
        params = self.calibrate(arr) if params is None else params
        y = _round(arr.astype(np.float64) / params.scale, self.rounding) + params.zero_point
        lo, hi = self.code_range
        codes, n_sat = _to_int_range(y, lo, hi, "saturate", arr, "IntQuant")
        return to_container(codes + self._offset, self.bits), n_sat

    def encode(self, x: Any, params: QuantParams | None = None) -> np.ndarray:
        """Float array -> code words; the scale comes from ``params`` or from ``x`` itself."""
        return self.encode_counting(x, params)[0]

    def decode(
        self, words: Any, params: QuantParams | None = None, dtype: Any = np.float32
    ) -> np.ndarray:
        """Words -> floats with the clean tensor's ``params`` (required)."""
        if params is None:
            raise ValueError("IntQuant.decode needs params= (the clean tensor's scale and zero "
                             "point, from calibrate() or quantize())")
        if self.codes == "signed":
            stored = low_bits_signed(words, self.bits)
        else:
            stored = low_bits_unsigned(words, self.bits)
        q = stored - self._offset - params.zero_point
        return _cast(q * params.scale, dtype)

_FLOAT_LAYOUTS: dict[str, tuple[int, int, int]] = {
    # name: (bits, exponent bits, mantissa bits)
    "float32": (32, 8, 23),
    "float16": (16, 5, 10),
    "bfloat16": (16, 8, 7),
}


@dataclass(frozen=True)
class Float(_FormatBase):
    """An IEEE-754 layout ("float32", "float16", "bfloat16") seen through a same-width int.

    Encoding rounds to nearest-even into the format (overflow gives +-inf, as IEEE
    does; NaN stays NaN); faults then hit sign, exponent or mantissa bits.
    bfloat16 is rounded from float32 (float64 input is first rounded to float32).
    ``resolution`` is the spacing of values at 1.0 (machine epsilon).
    """

    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    kind: ClassVar[str] = "float"

    def __post_init__(self) -> None:
        if self.dtype not in _FLOAT_LAYOUTS:
            raise ValueError(f"dtype must be one of {tuple(_FLOAT_LAYOUTS)}, got {self.dtype!r}")

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
        return _cast(out, dtype)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "dtype": self.dtype}


_KINDS: dict[str, type] = {c.kind: c for c in (FixedPoint, IntQuant, Float)}


def is_format(obj: Any) -> bool:
    """``isinstance(obj, Format)``, answered at once for bitfault's own formats (a check
    against a runtime Protocol inspects the object's members: slow on hot paths)."""
    return isinstance(obj, _FormatBase) or isinstance(obj, Format)


def gradient_bounds(fmt: Any) -> tuple[float, float] | None:
    """The closed interval of clean values the straight-through gradient passes through
    (zero outside, as in torch.ao's fake quantisation); None: every value passes.

    FixedPoint: its ``range``; Float: plus or minus its largest finite value; IntQuant
    (and formats bitfault does not know): None, its scale comes from the tensor itself.
    """
    if isinstance(fmt, (FixedPoint, Float)):
        return fmt.range
    return None


def format_from_dict(data: dict[str, Any]) -> Format:
    """Rebuild a format from ``to_dict()`` output; unknown kinds or keys are errors."""
    if not isinstance(data, dict) or "kind" not in data:
        raise ValueError(f"a format dict needs a 'kind' key, one of {tuple(_KINDS)}; got {data!r}")
    kind = data["kind"]
    if kind not in _KINDS:
        raise ValueError(f"format kind must be one of {tuple(_KINDS)}, got {kind!r}")
    cls = _KINDS[kind]
    args = {k: v for k, v in data.items() if k != "kind"}
    allowed = {f for f in cls.__dataclass_fields__}
    unknown = sorted(set(args) - allowed)
    if unknown:
        raise ValueError(
            f"unknown key(s) {unknown} for format {kind!r}; allowed: {sorted(allowed)}")
    return cls(**args)


__all__ = [
    "FixedPoint",
    "Float",
    "Format",
    "IntQuant",
    "QuantParams",
    "container_dtype",
    "format_from_dict",
    "gradient_bounds",
]
