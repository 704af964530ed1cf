"""Float's kernels in TensorFlow: float32/float16/bfloat16 by their bits, small floats
with subnormals through the core's table, E8M0 by its exponent."""

from __future__ import annotations

from typing import Any

from bitfault.faults.models import FaultModel
from bitfault.formats import Float
from bitfault.keras.kernels.blocks import small_float_fault as small_float_lookup
from bitfault.keras.kernels.registry import register
from bitfault.keras.kernels.scalar import FaultFn, float_fault, small_float_fault


def float_kernel(fmt: Float, fault: FaultModel, axis: Any = None) -> FaultFn:
    """``(x, mask) -> faulty x`` for ``fmt`` (``axis`` unused)."""
    codec = fmt.codec
    if codec is not None and codec.subnormals:  # the core's float32 table: two gathers
        return small_float_lookup(fmt, fault)
    if codec is not None:  # E8M0 (its smallest value is a float32 subnormal)
        return small_float_fault(fmt, fault)
    return float_fault(fmt, fault)


def _check_float(fmt: Float) -> None:
    if fmt.codec is not None and fmt.overflow == "error":
        raise ValueError(
            f"spec.format Float({fmt.dtype!r}, overflow='error') is not supported by "
            "bitfault.keras: a compiled Keras graph cannot raise on a weight value; use "
            f"overflow='saturate'{' or ' + repr('nan') if fmt.codec.has_nan else ''} (or check "
            "the weights with bitfault.inject in NumPy)")


register(Float, fault=float_kernel, check=_check_float)

__all__ = ["float_kernel"]
