"""One-pass encode -> fault -> decode for float32 tensors on the CPU, compiled with Numba.

Eager PyTorch runs the float32 fast paths of ``_kernels`` as three to six
separate passes over the weights (round, check, decode; IntQuant in float64
adds conversions). A fault-aware MLP step at batch 100 spends as long on those
passes as on its matmuls. These kernels do the same arithmetic, in the same
precision and order, element by element in one loop: each weight is read once
and its decoded value written once; then the few faulty elements are encoded
again from the clean input, faulted as words and decoded over it.

Bit for bit what ``faulty_group``'s PyTorch paths (and so ``bitfault.inject``)
compute; the test suite runs both. Numba is optional (the ``torch`` extra
installs it): without it, or with ``BITFAULT_NUMBA=0`` in the environment, the
PyTorch paths run. The first call compiles a kernel (about a second), cached on
disk where Numba can write.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Callable

import numpy as np

from bitfault.faults import BitFlip, StuckAt, _FaultBase
from bitfault.formats import FixedPoint, IntQuant


def fault_op(fault: _FaultBase) -> int:
    """The kernels' code for a fault model: 0 xor, 1 or, 2 and-not."""
    if isinstance(fault, BitFlip):
        return 0
    if isinstance(fault, StuckAt):
        return 1 if fault.value == 1 else 2
    raise TypeError(f"fault must be BitFlip() or StuckAt(0|1), got {fault!r}")


@functools.cache
def available() -> bool:
    """Numba imports and ``BITFAULT_NUMBA`` is not ``0``."""
    if os.environ.get("BITFAULT_NUMBA", "1").strip() == "0":
        return False
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def int_quant_ok(fmt: IntQuant, ndim: int) -> bool:
    """Per tensor, or per channel along axis 0 (a weight's output channels)."""
    if fmt.axis is None:
        return True
    fmt._reduce_axes(ndim)  # ValueError for an axis the tensor does not have
    return fmt.axis % ndim == 0


def _jit(fn: Callable, **options: str) -> Callable:
    import numba

    try:
        return numba.njit(nogil=True, cache=True, boundscheck=False, **options)(fn)
    except Exception:  # no writable cache directory: compile in memory every process
        return numba.njit(nogil=True, boundscheck=False, **options)(fn)


def _fault_word(word: int, mask: int, op: int) -> int:  # pragma: no cover (compiled)
    if op == 0:
        return word ^ mask
    if op == 1:
        return word | mask
    return word & ~mask


def _fixed_point_kernel(x, out, index, masks, op, nearest, up, down, lo, hi32, hi,
                        shift):  # pragma: no cover (compiled)
    zero = np.float32(0.0)
    for i in range(x.size):
        t = np.rint(x[i] * up) if nearest else np.trunc(x[i] * up)
        if t < lo:
            t = lo
        if t > hi32:
            t = hi32
        if t != t:
            t = zero
        out[i] = t * down + zero  # code 0 decodes to +0.0
    for k in range(index.size):
        j = index[k]
        t = np.rint(x[j] * up) if nearest else np.trunc(x[j] * up)
        if t < lo:
            t = lo
        if t > hi32:
            t = hi32
        if t != t:
            t = zero
        word = _fault_word(min(np.int64(t), hi), masks[k], op)
        word = (word << shift) >> shift  # two's complement of the low bits
        out[j] = np.float32(np.float64(word) * np.float64(down))


def _int_quant_kernel(x, out, inner, scales, zeros, index, masks, op, nearest, lo, hi, offset,
                      word_mask, shift, signed):  # pragma: no cover (compiled)
    for c in range(scales.size):
        s = scales[c]
        z = np.float64(zeros[c])
        xc, oc = x[c * inner:(c + 1) * inner], out[c * inner:(c + 1) * inner]
        for i in range(inner):
            v = np.float64(xc[i]) / s
            y = (np.rint(v) if nearest else np.trunc(v)) + z
            if y < lo:
                y = lo
            if y > hi:
                y = hi
            oc[i] = np.float32((y - z) * s + 0.0)  # -0.0 -> +0.0, as the core's codes
    for k in range(index.size):
        j = index[k]
        c = j // inner
        s = scales[c]
        v = np.float64(x[j]) / s
        y = (np.rint(v) if nearest else np.trunc(v)) + np.float64(zeros[c])
        if y < lo:
            y = lo
        if y > hi:
            y = hi
        stored = _fault_word((np.int64(y) + offset) & word_mask, masks[k], op)
        if signed:
            stored = (stored << shift) >> shift
        else:
            stored = stored & word_mask
        out[j] = np.float32(np.float64(stored - offset - zeros[c]) * s)


@functools.cache
def _kernels() -> dict[str, Callable]:
    """Compile on first use: the helper first, so the kernels call it compiled."""
    global _fault_word
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Numba's notes on caching
        _fault_word = _jit(_fault_word, inline="always")
        return {"fixed": _jit(_fixed_point_kernel), "int": _jit(_int_quant_kernel)}


def bind(fmt: FixedPoint | IntQuant, fault: _FaultBase, index: np.ndarray, masks: np.ndarray,
         shape: tuple[int, ...]) -> Callable[[np.ndarray, np.ndarray], None]:
    """One tensor's kernel with all but its data bound: ``call(x, out)`` sets the flat float32
    ``out`` to decode(fault(encode(x))) of the flat float32 ``x``.

    ``index``: flat int64 positions of the faulty elements; ``masks``: their int64 bit masks
    (already restricted to the eligible bits). FixedPoint needs overflow "saturate";
    IntQuant takes its scale and zero point from ``x`` (one, or one per slice along axis 0
    of the tensor's ``shape``; float64 arithmetic as the core's) and fills ``out`` with NaN
    when ``x`` holds NaN or inf.
    """
    op, nearest, shift = fault_op(fault), fmt.rounding == "nearest", 64 - fmt.bits
    lo, hi = fmt.code_range
    if isinstance(fmt, FixedPoint):
        kernel = _kernels()["fixed"]
        consts = (op, nearest, np.float32(2.0**fmt.frac), np.float32(2.0**-fmt.frac),
                  np.float32(lo), np.float32(hi), hi, shift)

        def fixed_point(x: np.ndarray, out: np.ndarray) -> None:
            kernel(x, out, index, masks, *consts)

        return fixed_point
    kernel = _kernels()["int"]
    consts = (op, nearest, float(lo), float(hi), fmt._offset, fmt.word_mask, shift,
              fmt.codes == "signed")

    def int_quant(x: np.ndarray, out: np.ndarray) -> None:
        if not x.size:
            return
        calib = host_calibration(x.reshape(shape), fmt)
        if calib is None:  # NaN or inf: no scale, the whole tensor is NaN
            out.fill(math.nan)
            return
        scales, zeros = calib
        kernel(x, out, x.size // scales.size, scales, zeros, index, masks, *consts)

    return int_quant


def host_calibration(x: np.ndarray, fmt: IntQuant) -> tuple[np.ndarray, np.ndarray] | None:
    """``IntQuant.calibrate`` of a float32 array as flat float64 scales and int64 zeros (one
    per channel along axis 0, or one); None when ``x`` has NaN or inf."""
    lo, hi = fmt.code_range
    if fmt.axis is None or not x.ndim:  # Python floats are IEEE doubles; round() is half-even
        mn, mx = float(x.min()), float(x.max())
        if not (math.isfinite(mn) and math.isfinite(mx)):
            return None
        if fmt.symmetric:
            scale, zero = max(-mn, mx) / hi, 0
        else:
            xmin, xmax = min(mn, 0.0), max(mx, 0.0)
            scale = (xmax - xmin) / (hi - lo)
            zero = min(max(round(lo - xmin / (scale if scale > 0 else 1.0)), lo), hi)
        return np.array([scale if scale > 0 else 1.0]), np.array([zero], np.int64)
    rows = x.reshape(x.shape[0], -1)
    mn = rows.min(axis=1).astype(np.float64)
    mx = rows.max(axis=1).astype(np.float64)
    if not (np.isfinite(mn).all() and np.isfinite(mx).all()):
        return None
    if fmt.symmetric:
        scale = np.maximum(-mn, mx) / hi
        zero = np.zeros(scale.shape, np.int64)
    else:
        xmin, xmax = np.minimum(mn, 0.0), np.maximum(mx, 0.0)
        scale = (xmax - xmin) / (hi - lo)
        safe = np.where(scale > 0, scale, 1.0)
        zero = np.clip(np.rint(lo - xmin / safe), lo, hi).astype(np.int64)
    return np.where(scale > 0, scale, 1.0), zero
