"""IntQuant: affine integer codes computed as PyTorch's quantisation computes them."""

from __future__ import annotations

import dataclasses
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
    min_scale: ClassVar[float] = float(np.finfo(np.float32).eps)

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

    def calibrate(self, x: Any) -> QuantParams:
        """Scale and zero point from the clean tensor (per tensor or per channel)."""
        arr = check_float_input(x).astype(np.float64)
        bad = ~np.isfinite(arr)
        if bad.any():
            index, value = first_bad(bad, arr)
            raise ValueError(f"IntQuant: value {value!r} at index {index} is not finite; "
                             "a scale cannot be computed from NaN or inf")
        axes = self.reduce_axes(arr.ndim)
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
        y = round_by(arr.astype(np.float64) / params.scale, self.rounding) + params.zero_point
        lo, hi = self.code_range
        codes, n_sat = to_int_range(y, lo, hi, "saturate", arr, "IntQuant")
        return to_container(codes + self.code_offset, self.bits), n_sat

    def encode(self, x: Any, params: QuantParams | None = None) -> np.ndarray:
        """Float array -> code words; the scale comes from ``params`` or from ``x`` itself."""
        return self.encode_counting(x, params)[0]

    def decode(
        self, words: Any, params: QuantParams | None = None, dtype: Any = np.float32
    ) -> np.ndarray:
        """Words -> floats with the clean tensor's ``params`` (required)."""
        if params is None:
            raise ArgumentError("params", params, "the clean tensor's QuantParams",
                                requirement="IntQuant.decode needs params= (the clean tensor's "
                                            "scale and zero point, from calibrate() or "
                                            "quantize())")
        if self.codes == "signed":
            stored = low_bits_signed(words, self.bits)
        else:
            stored = low_bits_unsigned(words, self.bits)
        q = stored - self.code_offset - params.zero_point
        return cast_quietly(q * params.scale, dtype)


__all__ = ["IntQuant"]
