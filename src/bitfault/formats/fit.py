"""Pick a format's parameters from the values it must hold (NumPy only)."""

from __future__ import annotations

from typing import Any

import numpy as np

from bitfault.errors import ArgumentError, check_int
from bitfault.formats.fixed import FixedPoint


def fixed_point_for(values: Any, bits: int = 16, headroom: float = 1.0,
                    **options: Any) -> FixedPoint:
    """The ``FixedPoint(bits, frac)`` with the most fraction bits whose range holds every
    value of ``values`` times ``headroom`` (>= 1: room for larger values later, e.g. 2.0 for
    one spare integer bit); ``options`` go to FixedPoint (``rounding``, ``overflow``).
    Non-finite values are refused; an all-zero tensor gets ``frac = bits``."""
    bits = check_int(bits, "bits", 2, 32)
    if not isinstance(headroom, (int, float)) or not np.isfinite(headroom) or headroom < 1:
        raise ArgumentError("headroom", headroom, "a finite number >= 1")
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ArgumentError("values", arr.shape, "at least one value")
    if not np.all(np.isfinite(arr)):
        raise ArgumentError("values", "NaN/inf", "finite values",
                            requirement="values must be finite to size a fixed-point range")
    lo, hi = float(arr.min()) * headroom, float(arr.max()) * headroom
    for frac in range(bits, -1, -1):
        fmt = FixedPoint(bits, frac, **options)
        low, high = fmt.range
        if low <= lo and hi <= high:
            return fmt
    top = FixedPoint(bits, 0, **options).range
    raise ArgumentError("values", (lo, hi), f"values within {top} for {bits} bits",
                        requirement=f"[{lo}, {hi}] does not fit {bits}-bit fixed point even "
                                    "with no fraction bits: use more bits")


__all__ = ["fixed_point_for"]
