"""encode -> fault -> decode with TensorFlow ops, bit for bit what ``bitfault.inject`` computes.

The arithmetic only: one function per format family builds ``(x, mask) -> faulty
x`` for a float32 tensor and a same-shape (or broadcastable) integer mask in the
format's container dtype (int8/int16/int32, as ``FaultMap.to_dense(fmt.container)``
gives it). Which of them runs, fused and compiled or not, is chosen in
``bitfault.keras.seam``. Values are clamped, rounded and NaN-mapped *before* any
float->int cast (TensorFlow's cast of NaN or out-of-range values is undefined).
Masks are already restricted to the fault model's eligible bits; a mask
sign-extended to a wider word only sets bits that decoding never reads.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from bitfault.faults.models import BitFlip, FaultModel
from bitfault.formats import FixedPoint, Float, IntQuant
from bitfault.keras.kernels.registry import register

FaultFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def _apply_fault(words: tf.Tensor, mask: tf.Tensor, fault: FaultModel) -> tf.Tensor:
    mask = tf.cast(mask, words.dtype)  # sign extension only sets bits decode never reads
    if isinstance(fault, BitFlip):
        return tf.bitwise.bitwise_xor(words, mask)
    if fault.value == 0:
        return tf.bitwise.bitwise_and(words, tf.bitwise.invert(mask))
    return tf.bitwise.bitwise_or(words, mask)


def _sign_extend(words: tf.Tensor, bits: int) -> tf.Tensor:
    """The low ``bits`` bits of each word read as two's complement (same dtype)."""
    width = words.dtype.size * 8
    if bits == width:
        return words
    shift = tf.constant(width - bits, words.dtype)
    return tf.bitwise.right_shift(tf.bitwise.left_shift(words, shift), shift)


def _round(y: tf.Tensor, rounding: str) -> tf.Tensor:
    if rounding == "nearest":
        return tf.math.round(y)  # half to even, like np.rint
    return tf.where(y < 0, tf.math.ceil(y), tf.math.floor(y))


def _largest_float32_at_most(value: int) -> float:
    f = np.float32(value)
    if float(f) > value:
        f = np.nextafter(f, np.float32(-np.inf))
    return float(f)


def _encode_fixed_saturate(x: tf.Tensor, fmt: FixedPoint) -> tf.Tensor:
    """float32 -> int32 codes. x * 2**frac is exact in float32 (or overflows to inf)."""
    lo, hi = fmt.code_range
    y = x * tf.constant(2.0**fmt.frac, tf.float32)
    if fmt.rounding == "nearest":
        y = tf.math.round(y)
    y = tf.where(tf.math.is_nan(y), tf.zeros_like(y), y)
    hi_f = _largest_float32_at_most(hi)
    # Clamped values are finite and in range, so the cast is defined; it truncates
    # toward zero, which is the "trunc" rounding itself.
    codes = tf.cast(tf.clip_by_value(y, float(lo), hi_f), tf.int32)
    if hi_f != hi:  # no float32 lies between hi_f and 2**(bits-1)
        codes = tf.where(y >= 2.0 ** (fmt.bits - 1), tf.constant(hi, tf.int32), codes)
    return codes


def _encode_fixed_wrap(x: tf.Tensor, fmt: FixedPoint) -> tf.Tensor:
    """float32 -> int32 codes keeping the low bits, in float64 exactly as the core does."""
    lo, hi = fmt.code_range
    y = _round(tf.cast(x, tf.float64) * (2.0**fmt.frac), fmt.rounding)
    finite = tf.math.is_finite(y)
    span = float(hi - lo + 1)
    # fmod first (exact for any float), then the floored modulo of a small value
    rem = tf.truncatemod(tf.where(finite, y, tf.zeros_like(y)), span)
    wrapped = tf.math.floormod(rem - lo, span) + lo
    y = tf.where(finite, wrapped, tf.where(tf.math.is_nan(y), tf.zeros_like(y), y))
    return tf.cast(tf.clip_by_value(y, float(lo), float(hi)), tf.int32)


def fixed_point_fault(fmt: FixedPoint, fault: FaultModel) -> FaultFn:
    """FixedPoint: int32 two's-complement codes (saturating or wrapping), faulted, decoded."""
    encode = _encode_fixed_wrap if fmt.overflow == "wrap" else _encode_fixed_saturate

    def run(x: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        words = _apply_fault(encode(x, fmt), mask, fault)
        return tf.cast(_sign_extend(words, fmt.bits), tf.float32) * tf.constant(
            2.0**-fmt.frac, tf.float32)

    return run


def _fused_f32(p: tf.Tensor, z: tf.Tensor) -> tf.Tensor:
    """float32(p + z) with one rounding, for float64 ``p`` (an exact float32 product) and
    integer-valued float64 ``z``: the sum rounded to odd by TwoSum's error, then to float32
    (``bitfault.formats.intquant.fused_f32``)."""
    s = p + z
    bb = s - p
    err = (p - (s - bb)) + (z - bb)
    bits = tf.bitcast(s, tf.int64)
    even = tf.equal(tf.bitwise.bitwise_and(bits, tf.constant(1, tf.int64)), 0)
    fix = tf.logical_and(tf.logical_and(tf.not_equal(err, 0.0), tf.math.is_finite(s)), even)
    # one ulp toward err: the magnitude grows when err has s's sign
    step = tf.where(tf.equal(err > 0, s > 0), tf.constant(1, tf.int64), tf.constant(-1, tf.int64))
    return tf.cast(tf.where(fix, tf.bitcast(bits + step, tf.float64), s), tf.float32)


def _div_f32(a: tf.Tensor, d: np.float32) -> tf.Tensor:
    """float32 ``a / d`` correctly rounded, also under XLA, which turns a division by a
    constant into a multiplication by its rounded reciprocal: in float64 that product is
    within 2**-52 of ``a / d``, and for a divisor below 2**27 (or a power of two) no
    float32 quotient lies that close to a float32 midpoint, so rounding it to float32
    gives the correctly rounded quotient (eager float64 division as well)."""
    return tf.cast(tf.cast(a, tf.float64) / float(d), tf.float32)


def int_quant_fault(fmt: IntQuant, fault: FaultModel, axis: int | None) -> FaultFn:
    """IntQuant in float32 as the core computes it (torch.ao's observer and torch's CPU
    quantisers); ``axis`` is the channel axis of x."""
    lo, hi = fmt.code_range
    offset = fmt.code_offset
    word = tf.int32 if fmt.bits <= 30 else tf.int64  # int32 runs twice as wide, no overflow
    narrow = fmt.bits <= 24  # codes and code - z are exact in float32
    how = fmt.zero_point_add
    half_range = np.float32((hi - lo) / 2) if fmt.symmetric else np.float32(hi - lo)
    eps = np.float32(fmt.min_scale)

    def run(x: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        if axis is None:
            axes, keep = None, False
        else:
            axes, keep = [i for i in range(x.shape.rank) if i != axis], True
        if fmt.symmetric:  # max(-min(x, 0), max(x, 0)) is max|x|: one reduction, not two
            top = tf.maximum(tf.reduce_max(tf.abs(x), axis=axes, keepdims=keep), 0.0)
            scale = tf.maximum(_div_f32(top, half_range), eps)
            zero = tf.zeros_like(scale, tf.float64)
        else:
            mn = tf.minimum(tf.reduce_min(x, axis=axes, keepdims=keep), 0.0)
            mx = tf.maximum(tf.reduce_max(x, axis=axes, keepdims=keep), 0.0)
            scale = tf.maximum(_div_f32(mx - mn, half_range), eps)
            zero = tf.clip_by_value(lo - tf.cast(tf.math.round(mn / scale), tf.float64),
                                    float(lo), float(hi))
        inv = tf.constant(1.0, tf.float32) / scale
        if how == "fused":
            p = tf.cast(x, tf.float64) * tf.cast(inv, tf.float64)  # exact
            y = tf.math.round(_fused_f32(p, zero))
        elif how == "float32":  # float32(t + z) rounded once, in float64: XLA would fuse a
            # float32 ``x * inv + z`` into one multiply-add (and sees through casts and bitcasts)
            z32 = tf.cast(tf.cast(zero, tf.float32), tf.float64)  # torch adds float32(z)
            y = tf.math.round(_fused_f32(tf.cast(x * inv, tf.float64), z32))
        else:
            y = _round(x * inv, fmt.rounding)
            if not fmt.symmetric:
                y = y + tf.cast(zero, tf.float32) if narrow else tf.cast(y, tf.float64) + zero
        if not narrow:
            y = tf.cast(y, tf.float64)
        y = tf.where(tf.math.is_nan(y), tf.zeros_like(y), y)
        codes = tf.cast(tf.clip_by_value(y, float(lo), float(hi)), word) + offset
        words = _apply_fault(codes, mask, fault)
        if fmt.codes == "signed":
            stored = _sign_extend(words, fmt.bits)
        else:
            stored = tf.bitwise.bitwise_and(words, tf.constant(fmt.word_mask, word))
        if narrow:  # (q - z) * s in float32: one rounding of the exact product
            return (tf.cast(stored - offset, tf.float32) - tf.cast(zero, tf.float32)) * scale
        q = tf.cast(stored - offset, tf.float64) - zero  # integers: exact in float64
        return tf.cast(q * tf.cast(scale, tf.float64), tf.float32)

    return run


def _float16_words(x: tf.Tensor) -> tf.Tensor:
    """float32 -> float16 bit patterns (int16), NaN payloads as NumPy keeps them."""
    words = tf.bitcast(tf.cast(x, tf.float16), tf.int16)
    u = tf.bitwise.bitwise_and(tf.cast(tf.bitcast(x, tf.int32), tf.int64), 0xFFFFFFFF)
    sign = tf.bitwise.bitwise_and(tf.bitwise.right_shift(u, 16), 0x8000)
    payload = tf.maximum(tf.bitwise.bitwise_and(tf.bitwise.right_shift(u, 13), 0x3FF), 1)
    nan = tf.bitwise.bitwise_or(sign, tf.bitwise.bitwise_or(payload, 0x7C00))
    return tf.where(tf.math.is_nan(x), _int64_to_int16(nan), words)


def _int64_to_int16(u: tf.Tensor) -> tf.Tensor:
    """Values 0..0xFFFF -> the int16 with that bit pattern (no wrapping cast)."""
    return tf.cast(tf.where(u >= 0x8000, u - 0x10000, u), tf.int16)


def _float16_to_float32(words: tf.Tensor) -> tf.Tensor:
    """float16 bit patterns -> float32, keeping NaN payloads (a hardware cast may quiet them)."""
    widened = tf.cast(tf.bitcast(words, tf.float16), tf.float32)
    h = tf.bitwise.bitwise_and(tf.cast(words, tf.int32), 0xFFFF)
    sign = tf.bitwise.left_shift(tf.bitwise.right_shift(h, 15), 31)
    payload = tf.bitwise.left_shift(tf.bitwise.bitwise_and(h, 0x3FF), 13)
    nan = tf.bitcast(tf.bitwise.bitwise_or(sign, tf.bitwise.bitwise_or(payload, 0x7F800000)),
                     tf.float32)
    return tf.where(tf.math.is_nan(widened), nan, widened)


def _bfloat16_words(x: tf.Tensor) -> tf.Tensor:
    """float32 -> bfloat16 bit patterns (int16), round to nearest even as the core does."""
    u = tf.bitwise.bitwise_and(tf.cast(tf.bitcast(x, tf.int32), tf.int64), 0xFFFFFFFF)
    lsb = tf.bitwise.bitwise_and(tf.bitwise.right_shift(u, 16), 1)
    rounded = tf.bitwise.right_shift(u + 0x7FFF + lsb, 16)
    quiet_nan = tf.bitwise.bitwise_or(tf.bitwise.right_shift(u, 16), 0x0040)
    return _int64_to_int16(tf.where(tf.math.is_nan(x), quiet_nan, rounded))


def float_fault(fmt: Float, fault: FaultModel) -> FaultFn:
    """Float: the IEEE bit pattern (float32, float16 or bfloat16 words), faulted, widened."""

    def run(x: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        if fmt.dtype == "float32":
            return tf.bitcast(_apply_fault(tf.bitcast(x, tf.int32), mask, fault), tf.float32)
        if fmt.dtype == "float16":
            return _float16_to_float32(_apply_fault(_float16_words(x), mask, fault))
        words = _apply_fault(_bfloat16_words(x), mask, fault)
        high = tf.bitwise.left_shift(tf.cast(words, tf.int32), 16)  # low 16 bits end up zero
        return tf.bitcast(high, tf.float32)

    return run


def small_float_fault(fmt: Float, fault: FaultModel) -> FaultFn:
    """A small float (``Float("float8_e4m3fn")`` ...): ``MiniFloat.encode`` on float32 bit
    patterns (a non-negative float's bits order as its value, so the rounding compares
    integers and no denormal flushing can touch it), faulted, decoded by table lookup."""
    codec = fmt.codec
    if codec is None:
        raise TypeError(f"small_float_fault needs a small float, got {fmt!r}")
    n = codec.n_finite
    # NumPy here, tensors in ``run``: the function may be built in one graph and run in another
    mid_bits = codec.midpoints.astype(np.float32).view(np.int32)
    table_bits = codec.decode_table(np.float32).view(np.int32)
    saturate, to_nan = fmt.overflow == "saturate", fmt.overflow == "nan"
    target = (codec.inf_code if codec.has_infinity else codec.nan_code) if to_nan else n - 1
    nan_code = 0 if codec.nan_code is None else codec.nan_code

    def run(x: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        mid, tie_up, table = (tf.constant(mid_bits), tf.constant(codec.tie_up),
                              tf.constant(table_bits))
        bits = tf.bitcast(x, tf.int32)
        mag = tf.bitwise.bitwise_and(bits, 0x7FFFFFFF)
        idx = tf.reshape(tf.searchsorted(mid, tf.reshape(mag, [-1]), side="left"),
                         tf.shape(mag))
        at = tf.minimum(idx, n - 1)
        tie = (idx < n) & tf.equal(mag, tf.gather(mid, at)) & tf.gather(tie_up, at)
        idx = idx + tf.cast(tie, tf.int32)
        none = tf.zeros_like(bits, tf.bool)
        sign = tf.where(bits < 0, codec.sign_bit, 0) if codec.signed else tf.zeros_like(bits)
        nan = mag > 0x7F800000
        low = none if codec.signed else ~nan & ((bits < 0) | tf.equal(mag, 0))
        over = ~nan & ~low & (idx >= n)
        keep_inf = over & tf.equal(mag, 0x7F800000) if codec.has_infinity and not saturate \
            else none
        codes = tf.bitwise.bitwise_or(idx, sign)
        codes = tf.where(over & ~keep_inf, tf.bitwise.bitwise_or(sign, target), codes)
        codes = tf.where(keep_inf, tf.bitwise.bitwise_or(sign, n), codes)
        codes = tf.where(low, codec.nan_code if to_nan else 0, codes)
        codes = tf.where(nan, tf.bitwise.bitwise_or(sign, nan_code) if codec.nan_code is not None
                         else tf.zeros_like(codes), codes)
        words = tf.bitwise.bitwise_and(_apply_fault(codes, mask, fault), fmt.word_mask)
        return tf.bitcast(tf.gather(table, words), tf.float32)

    return run



def _check_fixed(fmt: FixedPoint) -> None:
    if fmt.overflow == "error":
        raise ValueError(
            "spec.format FixedPoint(overflow='error') is not supported by bitfault.keras: a "
            "compiled Keras graph cannot raise on a weight value; use overflow='saturate' or "
            "'wrap' (or check the weights with bitfault.inject in NumPy)")


register(FixedPoint, fault=lambda fmt, fault, axis: fixed_point_fault(fmt, fault),
         check=_check_fixed)
register(IntQuant, fault=int_quant_fault)


__all__ = ["FaultFn", "fixed_point_fault", "float_fault", "int_quant_fault", "small_float_fault"]
