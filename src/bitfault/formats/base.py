"""What every number format shares: the Format protocol, the registry of format kinds,
QuantParams, and the helpers that store integer codes in same-width signed containers.

Every format turns floats into *words*: integers in a same-width signed
container (int8 / int16 / int32) whose low ``bits`` bits are the stored bit
pattern. Faults act on those bits; ``decode`` reads only the low ``bits`` bits,
so a fault on the top bit of a narrow word is interpreted the way the hardware
would (sign extension for two's complement, zero extension for unsigned codes).

No float->int cast ever sees NaN, an infinity or an out-of-range value: values
are mapped explicitly first, by each format's documented policy.

A new format is one frozen dataclass subclassing ``FormatBase`` with its kind,
``class MyFormat(FormatBase, kind="my_format")``: that registers it, so
``format_from_dict`` rebuilds it from its ``to_dict()``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError, check_choice

Rounding = Literal["nearest", "trunc"]
Overflow = Literal["saturate", "wrap", "error"]

ROUNDINGS = ("nearest", "trunc")
OVERFLOWS = ("saturate", "wrap", "error")
_FLOAT_DTYPES = (np.float16, np.float32, np.float64)


def check_bits(bits: Any) -> int:
    """``bits`` if it is an integer in 2..32 (the widths a container holds); else an error."""
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)):
        raise ArgumentTypeError("bits", bits, "an integer in 2..32")
    if not 2 <= bits <= 32:
        raise ArgumentError("bits", bits, "an integer in 2..32")
    return bits


def container_dtype(bits: int) -> np.dtype:
    """The narrowest signed integer dtype (int8/int16/int32) that holds ``bits`` bits."""
    if not 2 <= bits <= 32:
        raise ArgumentError("bits", bits, "an integer in 2..32")
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
    """Return ``x`` as a float ndarray or raise ArgumentTypeError naming the argument."""
    arr = np.asarray(x)
    if arr.dtype.kind != "f" or arr.dtype not in [np.dtype(d) for d in _FLOAT_DTYPES]:
        raise ArgumentTypeError(argument, arr.dtype, "a float16, float32 or float64 array",
                                tail=f", got dtype {arr.dtype}")
    return arr


def first_bad(bad: np.ndarray, values: np.ndarray) -> tuple[tuple[int, ...], float]:
    """The index and value of the first element where ``bad`` is true (for error messages)."""
    flat = int(np.flatnonzero(bad.ravel())[0])
    index = tuple(int(i) for i in np.unravel_index(flat, bad.shape)) if bad.ndim else ()
    return index, float(np.asarray(values).ravel()[flat])


def cast_quietly(values: np.ndarray, dtype: Any) -> np.ndarray:
    """Cast decoded values to ``dtype`` quietly: a faulty value too large for it becomes +-inf
    (IEEE rounding) and a signalling-NaN word stays a NaN; neither is an error."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(values).astype(dtype)


def round_by(y: np.ndarray, rounding: str) -> np.ndarray:
    """``y`` rounded by ``rounding``: "nearest" (ties to even) or "trunc" (toward zero)."""
    return np.rint(y) if rounding == "nearest" else np.trunc(y)


def to_int_range(
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
        index, value = first_bad(out_of_range, source)
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


FORMATS: dict[str, type[FormatBase]] = {}
"""The registered formats by kind, in the order they were defined."""


@dataclass(frozen=True)
class FormatBase:
    """The base of bitfault's formats; ``class F(FormatBase, kind="f")`` registers ``F``."""

    kind: ClassVar[str] = ""
    extra_keys: ClassVar[tuple[str, ...]] = ()  # keys the constructor takes besides fields

    def __init_subclass__(cls, kind: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if kind:
            if kind in FORMATS:
                raise ArgumentError("kind", kind, "a kind no other format has",
                                    requirement=f"format kind {kind!r} is registered already, "
                                                f"by {FORMATS[kind].__name__}")
            cls.kind = kind
            FORMATS[kind] = cls

    def gradient_range(self) -> tuple[float, float] | None:
        """See ``gradient_bounds``; None: every clean value passes the gradient."""
        return None

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


def is_format(obj: Any) -> bool:
    """``isinstance(obj, Format)``, answered at once for bitfault's own formats (a check
    against a runtime Protocol inspects the object's members: slow on hot paths)."""
    return isinstance(obj, FormatBase) or isinstance(obj, Format)


def gradient_bounds(fmt: Any) -> tuple[float, float] | None:
    """The closed interval of clean values the straight-through gradient passes through
    (zero outside, as in torch.ao's fake quantisation); None: every value passes.

    FixedPoint: its ``range``; Float: plus or minus its largest finite value; IntQuant
    (and formats bitfault does not know): None, its scale comes from the tensor itself.
    """
    return fmt.gradient_range() if isinstance(fmt, FormatBase) else None


def format_from_dict(data: dict[str, Any]) -> Format:
    """Rebuild a format from ``to_dict()`` output; unknown kinds or keys are errors."""
    if not isinstance(data, dict) or "kind" not in data:
        raise ArgumentError("kind", data, f"one of {tuple(FORMATS)}",
                            requirement=f"a format dict needs a 'kind' key, one of "
                                        f"{tuple(FORMATS)}", tail=f"; got {data!r}")
    cls = FORMATS[check_choice(data["kind"], tuple(FORMATS), "format kind")]
    kind = cls.kind
    args = {k: v for k, v in data.items() if k != "kind"}
    allowed = {*(f.name for f in fields(cls)), "kind", *cls.extra_keys}
    unknown = sorted(set(args) - allowed)
    if unknown:
        raise ArgumentError("data", unknown, f"keys of {sorted(allowed)}",
                            requirement=f"unknown key(s) {unknown} for format {kind!r}; "
                                        f"allowed: {sorted(allowed)}")
    return cls(**args)


__all__ = [
    "FORMATS",
    "OVERFLOWS",
    "ROUNDINGS",
    "Format",
    "FormatBase",
    "Overflow",
    "QuantParams",
    "Rounding",
    "cast_quietly",
    "check_bits",
    "check_float_input",
    "container_dtype",
    "first_bad",
    "format_from_dict",
    "gradient_bounds",
    "is_format",
    "low_bits_signed",
    "low_bits_unsigned",
    "round_by",
    "to_container",
    "to_int_range",
]
