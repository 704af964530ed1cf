"""One-pass encode -> fault -> decode for float32 tensors on the CPU, compiled with Numba.

Eager PyTorch runs the float32 fast paths (``fast_f32`` of each family) as three to six separate
passes over the weights (round, check, decode).
A fault-aware MLP step at batch 100 spends as long on those passes as on its matmuls.
These kernels do the same arithmetic, in the same precision and order, element by
element in one loop: each weight is read once and its decoded value written once; then
the few faulty elements are encoded again from the clean input, faulted as words and
decoded over it.

Bit for bit what the PyTorch paths (and so ``bitfault.inject``) compute; the test suite
runs both. Numba is optional (the ``torch`` extra installs it); ``bitfault.torch.seam``
decides when these kernels run (not without Numba, nor with ``BITFAULT_NUMBA=0`` in the
environment). The first call compiles a kernel (about a second), cached on disk where
Numba can write.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable

import numpy as np

from bitfault.faults.models import BitFlip, FaultModel, StuckAt
from bitfault.formats import FixedPoint, IntQuant
from bitfault.maps import FaultMap
from bitfault.torch.kernels.registry import Compiled, kernels_for, register, registered

_MIN_SCALE32 = np.float32(IntQuant.min_scale)  # a global: a compile-time constant in the kernel
_HOW = {"after": 0, "fused": 1, "float32": 2}


def fault_op(fault: FaultModel) -> int:
    """The kernels' code for a fault model: 0 xor, 1 or, 2 and-not."""
    if isinstance(fault, BitFlip):
        return 0
    if isinstance(fault, StuckAt):
        return 1 if fault.value == 1 else 2
    raise TypeError(f"fault must be BitFlip() or StuckAt(0|1), got {fault!r}")


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


def _fixed_code(v, nearest, up, lo, hi32):  # pragma: no cover (compiled)
    """An element's code as a float32: rounded, clamped to [lo, float32(hi)], NaN -> 0."""
    t = np.rint(v * up) if nearest else np.trunc(v * up)
    if t < lo:
        t = lo
    if t > hi32:
        t = hi32
    if t != t:
        t = np.float32(0.0)
    return t


def _fixed_point_kernel(x, out, index, masks, op, nearest, up, down, lo, hi32, hi,
                        shift, check, x_lo, x_hi):  # pragma: no cover (compiled)
    """Encode, fault, decode; with ``check``, also whether every x lies in [x_lo, x_hi]
    (False for a NaN). Without it the loop is the same as before (Numba unswitches it)."""
    inside = True
    for i in range(x.size):
        v = x[i]
        if check:
            inside &= (v >= x_lo) & (v <= x_hi)
        out[i] = _fixed_code(v, nearest, up, lo, hi32) * down + np.float32(0.0)  # +0.0
    for k in range(index.size):
        j = index[k]
        code = min(np.int64(_fixed_code(x[j], nearest, up, lo, hi32)), hi)
        word = _fault_word(code, masks[k], op)
        word = (word << shift) >> shift  # two's complement of the low bits
        out[j] = np.float32(np.float64(word) * np.float64(down))
    return inside


def _sortable(bits: int) -> int:  # pragma: no cover (compiled)
    """float32 bits -> an int32 key ordered as the floats are (NaNs beyond the infinities)."""
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def _fused(p, z):  # pragma: no cover (compiled)
    """float32(p + z) with one rounding: the float64 sum rounded to odd (TwoSum's error)."""
    s = p + z
    bb = s - p
    err = (p - (s - bb)) + (z - bb)
    if err != 0 and math.isfinite(s):
        bits = np.array([s]).view(np.int64)[0]
        if bits & 1 == 0:
            s = np.nextafter(s, np.inf if err > 0 else -np.inf)
    return np.float32(s)


def _int_code(v, inv, z, how, nearest, lo, hi):  # pragma: no cover (compiled)
    """An element's code (a float32 integer, or float64 past 24 bits), clamped to [lo, hi]:
    ``t = v * inv`` in float32, the zero point added by ``how`` (0 after rounding, 1 fused
    into the product's rounding, 2 in float32 before rounding; see
    ``IntQuant.zero_point_add``). NaN -> 0."""
    t = v * inv
    if how == 1:
        y = np.float64(np.rint(_fused(np.float64(v) * np.float64(inv), z)))
    elif how == 2:
        y = np.float64(np.rint(t + np.float32(z)))
    else:
        y = np.float64(np.rint(t) if nearest else np.trunc(t)) + z
    if y < lo:
        y = lo
    if y > hi:
        y = hi
    if y != y:
        y = 0.0
    return y


def _calibrate(mn, mx, symmetric, lo, hi):  # pragma: no cover (compiled)
    """``calibrate_f32`` on one channel's float32 extremes: (scale, zero), or scale 0 when
    float32 cannot scale the range."""
    mn = min(mn, np.float32(0.0))
    mx = max(mx, np.float32(0.0))
    if symmetric:
        return max(max(-mn, mx) / np.float32((hi - lo) / 2), _MIN_SCALE32), 0.0
    scale = max((mx - mn) / np.float32(hi - lo), _MIN_SCALE32)
    if not math.isfinite(scale):
        return np.float32(0.0), 0.0
    return scale, min(max(lo - np.float64(np.rint(mn / scale)), lo), hi)


def _int_quant_kernel(x, out, channels, index, masks, op, nearest, symmetric, how, lo, hi,
                      offset, word_mask, shift, signed):  # pragma: no cover (compiled)
    """Calibrate (per channel, or one channel), quantise, fault, decode. False, with ``out``
    untouched, when ``x`` holds NaN or inf (or a range float32 cannot scale)."""
    inner = x.size // channels
    keys = x.view(np.int32)
    pos_inf, neg_inf = _sortable(0x7F800000), _sortable(-0x800000)
    scales = np.empty(channels, np.float32)
    zeros = np.empty(channels)
    extremes = np.zeros(2, np.int32)  # the bits of one channel's min and max
    for c in range(channels):  # min and max through integer keys: one vectorised pass
        kc = keys[c * inner:(c + 1) * inner]
        if symmetric:  # only max |x| matters: the largest magnitude bits
            kabs = np.int32(0)
            for i in range(inner):
                kabs = max(kabs, kc[i] & 0x7FFFFFFF)
            if kabs >= 0x7F800000:  # +-inf or a NaN
                return False
            extremes[0], extremes[1] = kabs | -0x80000000, kabs  # -max|x|, max|x|
        else:
            kmin, kmax = pos_inf, neg_inf
            for i in range(inner):
                k = _sortable(kc[i])
                kmin = min(kmin, k)
                kmax = max(kmax, k)
            if inner and (kmin <= neg_inf or kmax >= pos_inf):  # -inf, +inf or a NaN
                return False
            if inner:
                extremes[0], extremes[1] = _sortable(kmin), _sortable(kmax)  # an involution
        ext = extremes.view(np.float32)
        scale, zero = _calibrate(ext[0], ext[1], symmetric, lo, hi)
        if scale == 0:
            return False
        scales[c] = scale
        zeros[c] = zero
    narrow = hi - lo < 2.0**24  # codes and code - z exact in float32: decode in float32
    for c in range(channels):
        s = scales[c]
        inv = np.float32(1.0) / s
        z = zeros[c]
        z32 = np.float32(z)
        xc, oc = x[c * inner:(c + 1) * inner], out[c * inner:(c + 1) * inner]
        if symmetric and nearest and hi < 2.0**22:  # |rint(x * inv)| <= hi: no clamp
            for i in range(inner):
                oc[i] = np.rint(xc[i] * inv) * s + np.float32(0.0)  # -0.0 -> +0.0
        elif narrow:
            for i in range(inner):
                y = np.float32(_int_code(xc[i], inv, z, how, nearest, lo, hi))
                oc[i] = (y - z32) * s + np.float32(0.0)  # -0.0 -> +0.0, as the core's codes
        else:
            for i in range(inner):
                y = _int_code(xc[i], inv, z, how, nearest, lo, hi)
                oc[i] = np.float32((y - z) * np.float64(s) + 0.0)
    for k in range(index.size):
        j = index[k]
        c = j // inner
        s = scales[c]
        y = _int_code(x[j], np.float32(1.0) / s, zeros[c], how, nearest, lo, hi)
        stored = _fault_word((np.int64(y) + offset) & word_mask, masks[k], op)
        if signed:
            stored = (stored << shift) >> shift
        else:
            stored = stored & word_mask
        out[j] = np.float32(np.float64(stored - offset - np.int64(zeros[c])) * np.float64(s))
    return True


@functools.cache
def _kernels() -> dict[str, Callable]:
    """Compile on first use: the helpers first (inlined, so the loops still vectorise)."""
    global _fault_word, _sortable, _fixed_code, _fused, _int_code, _calibrate
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Numba's notes on caching
        _fault_word = _jit(_fault_word, inline="always")
        _sortable = _jit(_sortable, inline="always")
        _fixed_code = _jit(_fixed_code, inline="always")
        _fused = _jit(_fused)
        _int_code = _jit(_int_code, inline="always")
        _calibrate = _jit(_calibrate, inline="always")
        return {"fixed": _jit(_fixed_point_kernel), "int": _jit(_int_quant_kernel)}


def inward_f32(lo: float, hi: float) -> tuple[np.float32, np.float32]:
    """The float32 interval inside the closed interval [lo, hi]: each end rounded toward
    the other (a float32 value lies in it exactly when it lies in [lo, hi])."""
    a, b = np.float32(lo), np.float32(hi)
    if float(a) < lo:  # compared in float64: NumPy would round lo to float32 first
        a = np.nextafter(a, np.float32(np.inf))
    if float(b) > hi:
        b = np.nextafter(b, np.float32(-np.inf))
    return a, b


def bind(fmt: FixedPoint | IntQuant, fault: FaultModel, index: np.ndarray, masks: np.ndarray,
         shape: tuple[int, ...]) -> Callable[..., bool]:
    """One tensor's kernel with all but its data bound: ``call(x, out, check=False)`` sets
    the flat float32 ``out`` to decode(fault(encode(x))) of the flat float32 ``x`` (a
    format that ``seam.compiled_for`` accepts); it returns False when an IntQuant ``x``
    holds NaN or inf (``out`` is then all NaN) and, with ``check``, when a FixedPoint ``x``
    holds a value outside the format's ``range`` or a NaN (``out`` is computed all the
    same, saturated): the storability check costs no pass of its own.

    ``index``: flat int64 positions of the faulty elements; ``masks``: their int64 bit masks
    (already restricted to the eligible bits). FixedPoint needs overflow "saturate";
    IntQuant takes its scale and zero point from ``x`` (one, or one per slice along axis 0
    of the tensor's ``shape``; float32 arithmetic as the core's).
    """
    compiled = kernels_for(fmt).compiled
    if compiled is None:
        raise TypeError(f"no compiled kernel for {fmt!r}; formats with one: "
                        f"{', '.join(registered('compiled'))}")
    return compiled.bind(fmt, fault, index, masks, shape)


def _bind_fixed_point(fmt: FixedPoint, fault: FaultModel, index: np.ndarray,
                      masks: np.ndarray, shape: tuple[int, ...]) -> Callable[..., bool]:
    op, nearest, shift = fault_op(fault), fmt.rounding == "nearest", 64 - fmt.bits
    lo, hi = fmt.code_range
    kernel = _kernels()["fixed"]
    consts = (op, nearest, np.float32(2.0**fmt.frac), np.float32(2.0**-fmt.frac),
              np.float32(lo), np.float32(hi), hi, shift)
    x_lo, x_hi = inward_f32(*fmt.range)

    def fixed_point(x: np.ndarray, out: np.ndarray, check: bool = False) -> bool:
        return kernel(x, out, index, masks, *consts, check, x_lo, x_hi)

    return fixed_point


def _bind_int_quant(fmt: IntQuant, fault: FaultModel, index: np.ndarray, masks: np.ndarray,
                    shape: tuple[int, ...]) -> Callable[..., bool]:
    op, nearest, shift = fault_op(fault), fmt.rounding == "nearest", 64 - fmt.bits
    lo, hi = fmt.code_range
    kernel = _kernels()["int"]
    channels = shape[0] if fmt.axis is not None and shape else 1
    consts = (op, nearest, fmt.symmetric, _HOW[fmt.zero_point_add], float(lo), float(hi),
              fmt.code_offset, fmt.word_mask, shift, fmt.codes == "signed")

    def int_quant(x: np.ndarray, out: np.ndarray, check: bool = False) -> bool:
        if x.size and not kernel(x, out, channels, index, masks, *consts):
            out.fill(math.nan)  # NaN or inf: no scale, the whole tensor is NaN
            return False
        return True

    return int_quant


def _fixed_point_accepts(fmt: FixedPoint, ndim: int) -> bool:
    """Overflow "saturate" only."""
    return fmt.overflow == "saturate"


def _int_quant_accepts(fmt: IntQuant, ndim: int) -> bool:
    """Per tensor, or per channel along axis 0 (a weight's output channels); ValueError for
    an axis the tensor lacks."""
    if fmt.axis is None:
        return True
    fmt.reduce_axes(ndim)
    return fmt.axis % ndim == 0


def bind_map(fmt: FixedPoint | IntQuant, fault: FaultModel,
             fmap: FaultMap) -> Callable[[np.ndarray, np.ndarray], bool]:
    """``bind`` for one map: its faults restricted to the bits ``fault`` may touch."""
    eligible = fault.eligible_mask(fmt)
    index, masks = fmap.indices, fmap.masks
    if eligible != fmt.word_mask:  # else nothing to drop: kernels ignore bits beyond the word
        masks = masks & np.uint32(eligible)
        index, masks = index[masks != 0], masks[masks != 0]
    # writable copies: Numba compiles read-only arrays separately
    return bind(fmt, fault, index.astype(np.int64), masks.astype(np.int64), fmap.shape)


# beside the plain kernels: IntQuant's loops return False on NaN or inf instead of the
# core's error, so they run only where no error is due (``strict=False``)
register(FixedPoint, compiled=Compiled(_fixed_point_accepts, _bind_fixed_point))
register(IntQuant, compiled=Compiled(_int_quant_accepts, _bind_int_quant, strict=False))
