"""IntQuant: affine integer codes computed as PyTorch's quantisation computes them."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError, check_choice
from bitfault.formats.base import (
    ROUNDINGS,
    FormatBase,
    QuantParams,
    Rounding,
    cast_quietly,
    check_bits,
    check_float_input,
    first_bad,
    low_bits_signed,
    low_bits_unsigned,
    round_by,
    to_container,
    to_int_range,
)

_CODES = ("signed", "unsigned")


@dataclass(frozen=True)
class IntQuant(FormatBase, kind="int_quant"):
    """Affine integer quantisation into ``bits``-bit codes (2..32), in float32 as PyTorch's
    CPU quantisation computes it (``docs/formats.md``).

    symmetric: ``q = rint(x * float32(1/s))`` in [-(2**(b-1)-1), 2**(b-1)-1],
    ``s = max|x| / (2**(b-1)-1)``; asymmetric: ``q = rint(x * float32(1/s)) + z`` (the
    zero point added as torch adds it, ``zero_point_add``) in [0, 2**b - 1], ``s = (max(mx,
    0) - min(mn, 0)) / (2**b - 1)``, ``z = -rint(min(mn, 0) / s)``: torch.ao's
    MinMaxObserver in float32, so the codes are those ``torch.quantize_per_tensor`` /
    ``quantize_per_channel`` store. ``s`` is at least ``min_scale`` (float32 eps, torch.ao's
    floor), so an all-zero tensor or channel gets ``s = 2**-23`` and a flipped code in it
    stays tiny. float64 input is rounded to float32 first (torch quantises float32 only).
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
    min_scale: ClassVar[float] = float(np.finfo(np.float32).eps)
    extra_keys: ClassVar[tuple[str, ...]] = ("group_size", "axis")

    def __new__(cls, *args: Any, group_size: int | None = None, axis: int | None = None,
                **kwargs: Any) -> Any:
        """``IntQuant(bits, group_size=g, symmetric=..., axis=-1)`` is the group-wise block
        format (``formats.groupwise.GroupwiseInt``: one fp16 scale, and zero point, per
        group of ``g`` inputs); without ``group_size`` an IntQuant."""
        if group_size is None:
            if axis is not None:
                raise ArgumentError("axis", axis, "None without group_size (per_channel= is "
                                    "IntQuant's channel axis)")
            return super().__new__(cls)
        return _grouped(*args, group_size=group_size, axis=-1 if axis is None else axis,
                        **kwargs)

    def __post_init__(self) -> None:
        check_bits(self.bits)
        if not isinstance(self.symmetric, (bool, np.bool_)):
            raise ArgumentTypeError("symmetric", self.symmetric, "True or False")
        if not isinstance(self.per_channel, (bool, int, np.integer)):
            raise ArgumentTypeError("per_channel", self.per_channel,
                                    "False, True (axis 0) or an axis int")
        check_choice(self.rounding, ROUNDINGS, "rounding")
        if isinstance(self.per_channel, (np.integer, np.bool_)):  # keep to_dict() JSON-ready
            object.__setattr__(self, "per_channel", self.per_channel.item())
        if self.codes is None:
            object.__setattr__(self, "codes", "signed" if self.symmetric else "unsigned")
        if self.codes not in _CODES:
            raise ArgumentError("codes", self.codes, f"one of {_CODES} or None")

    def _identity(self) -> tuple:
        # per_channel=False / 0 and True / 1 differ (per tensor vs axis 0; axis 0 vs axis 1),
        # though Python's bool == int makes the generated __eq__ call them equal
        return tuple((type(v) is bool, v) for v in dataclasses.astuple(self))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IntQuant):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

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
    def code_offset(self) -> int:
        """What is added to a code to get its stored bit pattern (before two's complement)."""
        half = 1 << (self.bits - 1)
        if self.symmetric:
            return 0 if self.codes == "signed" else half
        return -half if self.codes == "signed" else 0

    @property
    def bit_fields(self) -> dict[str, tuple[int, ...]]:
        top = self.bits - 1
        return {"sign": (top,), "magnitude": tuple(range(top))}

    def reduce_axes(self, ndim: int) -> tuple[int, ...] | None:
        """The axes a per-channel calibration reduces over (None: per tensor); checks the axis."""
        axis = self.axis
        if axis is None:
            return None
        if not -ndim <= axis < ndim:
            raise ArgumentError("per_channel", axis, f"an axis in {-ndim}..{ndim - 1}",
                                requirement=f"per_channel axis {axis} is out of range for a "
                                            f"tensor with {ndim} dimensions")
        axis %= ndim
        return tuple(i for i in range(ndim) if i != axis)

    @property
    def zero_point_add(self) -> Literal["after", "fused", "float32"]:
        """How the zero point enters a code, as torch's CPU quantisers add it (``t = x *
        float32(1 / s)``, rounded to float32): "after" ``round(t) + z`` (symmetric, z = 0,
        and rounding "trunc"); "fused" ``rint(float32(x * inv + z))`` with one rounding
        (``torch.quantize_per_tensor`` into 8-bit codes: a fused multiply-add); "float32"
        ``rint(float32(t + float32(z)))`` (``torch.quantize_per_channel``, and per tensor
        beyond 8 bits, torch's qint32 path)."""
        if self.symmetric or self.rounding == "trunc":
            return "after"
        return "fused" if self.axis is None and self.bits <= 8 else "float32"

    def calibrate(self, x: Any) -> QuantParams:
        """float32 scale and int64 zero point from the clean tensor, as torch.ao's
        MinMaxObserver computes them (per tensor or per channel)."""
        arr = check_float_input(x)
        x32 = to_f32(arr)
        bad = ~np.isfinite(x32)
        if bad.any():
            index, value = first_bad(bad, arr)
            what = "beyond float32's range" if math.isfinite(value) else "not finite"
            raise ValueError(f"IntQuant: value {value!r} at index {index} is {what}; "
                             "a scale cannot be computed from NaN or inf")
        axes = self.reduce_axes(arr.ndim)
        if arr.size == 0:
            return QuantParams(np.asarray(1.0, np.float32), np.asarray(0, dtype=np.int64))
        return calibrate_f32(self, x32, axes)

    def encode_counting(
        self, x: Any, params: QuantParams | None = None
    ) -> tuple[np.ndarray, int]:
        arr = check_float_input(x)
        params = self.calibrate(arr) if params is None else params
        y = codes_f32(self, to_f32(arr), params)
        lo, hi = self.code_range
        codes, n_sat = to_int_range(y, lo, hi, "saturate", arr, "IntQuant")
        return to_container(codes + self.code_offset, self.bits), n_sat

    def encode(self, x: Any, params: QuantParams | None = None) -> np.ndarray:
        """Float array -> code words; the scale comes from ``params`` or from ``x`` itself."""
        return self.encode_counting(x, params)[0]

    def decode(
        self, words: Any, params: QuantParams | None = None, dtype: Any = np.float32
    ) -> np.ndarray:
        """Words -> floats with the clean tensor's ``params`` (required):
        ``(q - z) * s`` with one rounding into ``dtype``, as torch's dequantise computes it."""
        if params is None:
            raise ArgumentError("params", params, "the clean tensor's QuantParams",
                                requirement="IntQuant.decode needs params= (the clean tensor's "
                                            "scale and zero point, from calibrate() or "
                                            "quantize())")
        if self.codes == "signed":
            stored = low_bits_signed(words, self.bits)
        else:
            stored = low_bits_unsigned(words, self.bits)
        q = stored - self.code_offset - np.asarray(params.zero_point, np.int64)
        scale = np.asarray(params.scale, np.float32).astype(np.float64)
        return cast_quietly(q.astype(np.float64) * scale, dtype)


_EPS32 = np.float32(np.finfo(np.float32).eps)


def to_f32(x: np.ndarray) -> np.ndarray:
    """``x`` as float32 (rounded to nearest from float64, +-inf beyond float32's range)."""
    with np.errstate(over="ignore"):
        return np.asarray(x).astype(np.float32, copy=False)


def calibrate_f32(fmt: IntQuant, x: np.ndarray, axes: tuple[int, ...] | None) -> QuantParams:
    """MinMaxObserver's ``_calculate_qparams`` in float32 on a finite non-empty float32 ``x``:
    symmetric ``s = max(-min(mn, 0), max(mx, 0)) / float32((qmax - qmin) / 2)``;
    asymmetric ``s = (max(mx, 0) - min(mn, 0)) / float32(qmax - qmin)``, ``z = qmin -
    rint(min(mn, 0) / s)`` clamped; ``s`` at least float32 eps."""
    keep = axes is not None
    lo, hi = fmt.code_range
    mn = np.minimum(np.min(x, axis=axes, keepdims=keep), np.float32(0))
    mx = np.maximum(np.max(x, axis=axes, keepdims=keep), np.float32(0))
    if fmt.symmetric:
        scale = np.maximum(np.maximum(-mn, mx) / np.float32((hi - lo) / 2), _EPS32)
        return QuantParams(np.asarray(scale, np.float32), np.zeros(scale.shape, np.int64))
    with np.errstate(over="ignore"):
        scale = np.maximum((mx - mn) / np.float32(hi - lo), _EPS32)
    if not np.isfinite(scale).all():
        raise ValueError(f"IntQuant: the clean range {float(np.max(mx))!r} - "
                         f"({float(np.min(mn))!r}) overflows float32; no float32 scale spans it")
    zero = np.clip(lo - np.rint(mn / scale).astype(np.float64), lo, hi).astype(np.int64)
    return QuantParams(np.asarray(scale, np.float32), np.asarray(zero))


def fused_f32(p: np.ndarray, z: np.ndarray) -> np.ndarray:
    """float32(p + z) with one rounding, for float64 ``p`` (an exact float32 product) and
    integer ``z``: the float64 sum is rounded to odd (TwoSum's error decides), so that
    rounding it to float32 is the single rounding of the exact sum."""
    z = np.asarray(z, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + z
        bb = s - p
        err = (p - (s - bb)) + (z - bb)
        inexact = (err != 0) & np.isfinite(s) & ((s.view(np.int64) & 1) == 0)
        if inexact.any():
            s = np.where(inexact, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        return s.astype(np.float32)


def codes_f32(fmt: IntQuant, x: np.ndarray, params: QuantParams) -> np.ndarray:
    """Unclamped codes (float64 integers, NaN for NaN) of float32 ``x``, as torch's CPU
    quantisers compute them: ``t = x * float32(1 / s)`` in float32, then the zero point
    as ``fmt.zero_point_add`` says."""
    scale = np.asarray(params.scale, np.float32)
    zero = np.asarray(params.zero_point, np.int64)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.float32(1) / scale
        how = fmt.zero_point_add
        if how == "fused":
            t = np.rint(fused_f32(x.astype(np.float64) * inv.astype(np.float64), zero))
        elif how == "float32":
            t = np.rint(x * inv + zero.astype(np.float32))
        else:
            return round_by(x * inv, fmt.rounding).astype(np.float64) + zero
    return t.astype(np.float64)


_dataclass_init = IntQuant.__init__


def _init(self: IntQuant, *args: Any, group_size: None = None, axis: None = None,
          **kwargs: Any) -> None:
    _dataclass_init(self, *args, **kwargs)  # group_size / axis: taken by __new__


IntQuant.__init__ = _init  # type: ignore[method-assign]


def _grouped(bits: int = 8, symmetric: bool = True, per_channel: bool | int = False,
             rounding: str = "nearest", codes: str | None = None, *, group_size: int,
             axis: int) -> Any:
    # imported here: importing floats first would register "float" before "int_quant"
    from bitfault.formats.groupwise import GroupwiseInt

    if per_channel is not False:
        raise ArgumentError("per_channel", per_channel, "False with group_size (the groups "
                            "of an output channel replace per-channel scales)")
    if rounding != "nearest":
        raise ArgumentError("rounding", rounding, "'nearest' with group_size")
    if codes not in (None, "signed" if symmetric else "unsigned"):
        raise ArgumentError("codes", codes, f"None with group_size (codes are "
                            f"{'signed' if symmetric else 'unsigned'})")
    return GroupwiseInt(bits, group_size, symmetric, axis)


__all__ = ["IntQuant", "calibrate_f32", "codes_f32", "fused_f32", "to_f32"]
