"""Block formats (MX, NVFP4, GGUF, group-wise integers) with TensorFlow ops, bit for bit the
core's float32 arithmetic (``bitfault.formats.mx``, ``nvfp4``, ``gguf``, ``groupwise``).

``block_fault(fmt, fault, axis)`` builds ``(x, masks) -> faulty x`` for a float32 tensor
whose blocks run along its ``axis``; ``masks`` holds one dense mask per plane (codes in
x's shape, block planes in the plane's shape, the tensor plane shape ``()``). Every step
is an XLA-compilable TensorFlow op with no branching on values: blocks, encode, fault,
decode, back. Three things about TensorFlow on the CPU shape the code:

* it flushes float32 subnormals to zero (inputs and results): decoders scale by powers of
  two in two exact steps and build subnormal results from integers, and a product that
  may round into the subnormal range is formed in float64 and rounded by hand;
* XLA turns ``a * b + c`` into a fused multiply-add: the GGUF encoders never add to a
  product; they compare it with the thresholds where ``fl(p + c)`` crosses an integer;
* XLA turns ``a / constant`` into ``a * (1 / constant)``: divisions by constants go
  through float64, whose correctly rounded result rounds to float32's exactly.

Encoders assume normal float32 inputs: a block whose values are all below about 1e-35
(or an NVFP4 tensor whose largest magnitude is) can differ from the core, which computes
its scale from subnormals.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from bitfault.faults.models import FaultModel
from bitfault.formats import BlockFormat, Float
from bitfault.formats.gguf import GGUF
from bitfault.formats.groupwise import EPS, GroupwiseInt
from bitfault.formats.minifloat import SMALL_FLOATS
from bitfault.formats.mx import EMAX_ELEM, MX
from bitfault.formats.nvfp4 import NVFP4
from bitfault.keras.kernels.minifloat import _decode_small, _encode_small
from bitfault.keras.kernels.registry import register
from bitfault.keras.kernels.scalar import (
    _apply_fault,
    _float16_to_float32,
    _float16_words,
    _sign_extend,
)

BlockFaultFn = Callable[[tf.Tensor, Sequence[tf.Tensor]], tf.Tensor]
Planes = dict[str, tf.Tensor]
KERNEL_FORMATS = (MX, NVFP4, GGUF, GroupwiseInt)


# ---- float32 exactly, despite flush-to-zero -----------------------------------------------


def _pow2(e: tf.Tensor) -> tf.Tensor:
    """``2**e`` in float32 for int32 ``e`` in -126..127 (a normal number, from its bits)."""
    return tf.bitcast(tf.bitwise.left_shift(e + 127, 23), tf.float32)


def _factors(e: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Two powers of two whose product is ``2**e`` (int32 ``e`` in -252..254; one pair for a
    whole block): ``v * f1 * f2`` is exact wherever the result is a normal float32."""
    half = tf.math.floordiv(e, 2)
    return _pow2(tf.clip_by_value(half, -126, 127)), _pow2(tf.clip_by_value(e - half, -126, 127))


def _times_pow2(v: tf.Tensor, e: tf.Tensor) -> tf.Tensor:
    """``v * 2**e`` rounded to float32 as IEEE arithmetic (subnormal results included), for
    int32 ``e`` in -254..254 (one per block: it broadcasts against v) and ``v`` normal or
    zero: two exact power-of-two steps, and a result below 2**-126 (flushed by TensorFlow)
    rebuilt from its integer multiple of 2**-149."""
    f1, f2 = _factors(e)
    r = v * f1 * f2
    tiny = tf.equal(r, 0.0) & tf.not_equal(v, 0.0) & tf.math.is_finite(v)
    g1, g2 = _factors(e + 149)
    scaled = tf.abs(v) * g1 * g2
    units = tf.cast(tf.math.round(tf.minimum(scaled, 2.0**23)), tf.int32)
    sign = tf.bitwise.bitwise_and(tf.bitcast(v, tf.int32), tf.constant(-(1 << 31), tf.int32))
    return tf.where(tiny, tf.bitcast(tf.bitwise.bitwise_or(sign, units), tf.float32), r)


def _to_float64(x: tf.Tensor) -> tf.Tensor:
    """float32 -> float64 exactly, subnormals included (TensorFlow reads them as zero)."""
    bits = tf.bitcast(x, tf.int32)
    mantissa = tf.cast(tf.bitwise.bitwise_and(bits, 0x7FFFFF), tf.float64) * 2.0**-149
    sub = tf.equal(tf.bitwise.bitwise_and(bits, 0x7F800000), 0)
    return tf.where(sub, tf.where(bits < 0, -mantissa, mantissa), tf.cast(x, tf.float64))


def _to_float32(y: tf.Tensor) -> tf.Tensor:
    """float64 -> float32 rounded to nearest even, subnormal results included."""
    units = tf.cast(tf.math.round(tf.minimum(tf.abs(y), 2.0**-126) * 2.0**149), tf.int32)
    sign = tf.where(tf.bitcast(y, tf.int64) < 0, tf.constant(-(1 << 31), tf.int32), 0)
    small = tf.bitcast(tf.bitwise.bitwise_or(sign, units), tf.float32)
    return tf.where(tf.abs(y) < 2.0**-126, small, tf.cast(y, tf.float32))


def _divide(a: tf.Tensor, c: float) -> tf.Tensor:
    """``a / c`` as float32 division rounds it (a normal result), ``c`` a constant."""
    return tf.cast(tf.cast(a, tf.float64) / c, tf.float32)


# ---- small floats by the core's float32 tables ---------------------------------------------


def small_float_fault(fmt: Float, fault: FaultModel) -> Callable[[tf.Tensor, tf.Tensor],
                                                                  tf.Tensor]:
    """A small float with subnormals (float8/6/4; not E8M0, whose subnormal inputs the core
    encodes the exact way) by the core's own float32 lookup: one gather to encode, one to
    decode, the codes ``Float.encode`` gives for every float32 (NaN payloads included)."""
    codec = fmt.codec
    if codec is None or not codec.subnormals or fmt.overflow == "error":
        raise TypeError(f"small_float_fault takes a small float with subnormals and overflow "
                        f"'saturate' or 'nan', got {fmt!r}")

    def run(x: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        words = _apply_fault(_encode_small(x, codec, fmt.overflow), mask, fault)
        return _decode_small(words, codec)

    return run


def _low(words: tf.Tensor, bits: int) -> tf.Tensor:
    return tf.bitwise.bitwise_and(words, (1 << bits) - 1) if bits < 32 else words


def _fp16_bits(v: tf.Tensor) -> tf.Tensor:
    return tf.bitwise.bitwise_and(tf.cast(_float16_words(v), tf.int32), 0xFFFF)


def _fp16_value(words: tf.Tensor) -> tf.Tensor:
    """fp16 bit patterns (the low 16 bits of int32 words) -> float32."""
    u = tf.bitwise.bitwise_and(words, 0xFFFF)
    return _float16_to_float32(tf.cast(u - tf.where(u >= 0x8000, 0x10000, 0), tf.int16))


# ---- the formats: encode (n, k, c) float32 blocks (along axis 1) -> int32 words; back -----


def _mx(fmt: MX) -> tuple[Callable[[tf.Tensor], Planes], Callable[[Planes], tf.Tensor]]:
    codec = None if fmt.element == "int8" else SMALL_FLOATS[fmt.element]
    emax = EMAX_ELEM[fmt.element]

    def encode(b: tf.Tensor) -> Planes:
        mag = tf.bitwise.bitwise_and(tf.bitcast(b, tf.int32), 0x7FFFFFFF)
        biased = tf.bitwise.right_shift(tf.reduce_max(mag, axis=1, keepdims=True), 23)
        e = tf.clip_by_value(tf.where(tf.equal(biased, 0), -127, biased - 127) - emax, -127, 127)
        f1, f2 = _factors(-e)
        y = b * f1 * f2  # a subnormal y flushed to +-0 gets the same code, +-0
        if codec is None:
            codes = tf.cast(tf.clip_by_value(tf.math.round(y * 64.0), -127.0, 127.0), tf.int32)
        else:
            codes = _encode_small(y, codec)
        return {"codes": _low(codes, 8), "scale": e + 127}

    def decode(p: Planes) -> tf.Tensor:
        if codec is None:
            v = tf.cast(_sign_extend(p["codes"], 8), tf.float32) * 2.0**-6
        else:
            v = _decode_small(p["codes"], codec)
        scale = p["scale"]
        out = _times_pow2(v, scale - 127)
        return tf.where(tf.equal(scale, 255), np.float32(np.nan), out)

    return encode, decode


def _nvfp4(fmt: NVFP4) -> tuple[Callable[[tf.Tensor], Planes], Callable[[Planes], tf.Tensor]]:
    e2m1, e4m3 = SMALL_FLOATS["float4_e2m1fn"], SMALL_FLOATS["float8_e4m3fn"]

    def encode(b: tf.Tensor) -> Planes:
        amax_block = tf.reduce_max(tf.abs(b), axis=1, keepdims=True)
        t = _divide(tf.reduce_max(amax_block), 6.0 * 448.0)
        t = tf.where(tf.equal(t, 0.0), 1.0, t)
        scale = _encode_small(amax_block / (6.0 * t), e4m3)
        denominator = _decode_small(scale, e4m3) * t
        denominator = tf.where(tf.equal(denominator, 0.0), np.float32(np.inf), denominator)
        codes = _encode_small(b / denominator, e2m1)
        return {"codes": codes, "scale": scale, "tensor_scale": tf.bitcast(t, tf.int32)}

    def decode(p: Planes) -> tf.Tensor:
        qs = _decode_small(p["codes"], e2m1) * _decode_small(p["scale"], e4m3)
        t = _to_float64(tf.bitcast(p["tensor_scale"], tf.float32))
        return _to_float32(_to_float64(qs) * t)

    return encode, decode


@functools.cache
def _thresholds(c: float, top: int) -> np.ndarray:
    """For m = 1..top the least float32 p with ``fl32(p + c) >= m`` (bisection on the
    ordered float32 bit patterns, with NumPy's float32 addition): the count of thresholds
    at most p is ``trunc(fl32(p + c))`` for every p with ``p + c`` in [0, top + 1)."""

    def ordered(i: int) -> np.float32:  # the float32 at position i of the ordered patterns
        bits = i if i >= 0 else (-i) | (1 << 31)
        return np.array([bits], np.uint32).view(np.float32)[0]

    out = []
    c32 = np.float32(c)
    for m in range(1, top + 1):
        lo, hi = -0x7F800000, 0x7F800000  # fl(lo + c) < m <= fl(hi + c)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if np.float32(ordered(mid) + c32) >= m:
                hi = mid
            else:
                lo = mid
        out.append(ordered(hi))
    return np.array(out, np.float32)


def _count_at_most(p: tf.Tensor, thresholds: np.ndarray) -> tf.Tensor:
    """How many of the sorted ``thresholds`` are <= each value of p (int32; 0 for NaN)."""
    return tf.add_n([tf.cast(p >= float(t), tf.int32) for t in thresholds])


def _gguf(fmt: GGUF) -> tuple[Callable[[tf.Tensor], Planes], Callable[[Planes], tf.Tensor]]:
    kind = fmt.type

    def inverse(d: tf.Tensor) -> tf.Tensor:
        return tf.where(tf.equal(d, 0.0), 0.0, 1.0 / tf.where(tf.equal(d, 0.0), 1.0, d))

    def encode(b: tf.Tensor) -> Planes:
        if kind == "q8_0":
            d = _divide(tf.reduce_max(tf.abs(b), axis=1, keepdims=True), 127.0)
            y = b * inverse(d)
            t = tf.math.floor(tf.abs(y)) * tf.sign(y)  # trunc; y - t may fuse: compare instead
            q = t + tf.cast(y >= t + 0.5, tf.float32) - tf.cast(y <= t - 0.5, tf.float32)
            q = tf.where(tf.math.is_nan(y), 0.0, tf.clip_by_value(q, -127.0, 127.0))
            return {"codes": _low(tf.cast(q, tf.int32), 8), "scale": _fp16_bits(d)}
        if kind == "q4_0":
            a = tf.abs(b)
            amax = tf.reduce_max(a, axis=1, keepdims=True)
            k = b.shape[1]
            idx = tf.range(k)[None, :, None]
            first = tf.reduce_min(tf.where(tf.equal(a, amax), idx, k), axis=1, keepdims=True)
            first = tf.minimum(first, k - 1)  # XLA's gather clamps an index past the end
            words = tf.where(tf.equal(idx, first), tf.bitcast(b, tf.int32), 0)  # one nonzero
            d = tf.bitcast(tf.reduce_sum(words, axis=1, keepdims=True), tf.float32) * -0.125
            p = b * inverse(d)
            codes = tf.minimum(_count_at_most(p, _thresholds(8.5, 16)), 15)
            return {"codes": tf.where(tf.math.is_nan(p), 8, codes), "scale": _fp16_bits(d)}
        mx, mn = tf.reduce_max(b, axis=1, keepdims=True), tf.reduce_min(b, axis=1, keepdims=True)
        d = _divide(mx - mn, 15.0)
        p = (b - mn) * inverse(d)
        codes = tf.minimum(_count_at_most(p, _thresholds(0.5, 15)), 15)
        return {"codes": tf.where(tf.math.is_nan(p), 0, codes), "scale": _fp16_bits(d),
                "min": _fp16_bits(mn)}

    def decode(p: Planes) -> tf.Tensor:
        d = _fp16_value(p["scale"])
        if kind == "q8_0":
            return d * tf.cast(_sign_extend(p["codes"], 8), tf.float32)
        if kind == "q4_0":
            return d * tf.cast(p["codes"] - 8, tf.float32)
        return d * tf.cast(p["codes"], tf.float32) + _fp16_value(p["min"])

    return encode, decode


def _groupwise(fmt: GroupwiseInt) -> tuple[Callable[[tf.Tensor], Planes],
                                           Callable[[Planes], tf.Tensor]]:
    lo_code, hi_code = fmt.code_range
    bits = fmt.bits

    def encode(b: tf.Tensor) -> Planes:
        lo = tf.minimum(tf.reduce_min(b, axis=1, keepdims=True), 0.0)
        hi = tf.maximum(tf.reduce_max(b, axis=1, keepdims=True), 0.0)
        if fmt.symmetric:
            s = _divide(tf.maximum(-lo, hi), float(hi_code))
        else:
            s = _divide(hi - lo, float(hi_code - lo_code))
        words = _fp16_bits(tf.maximum(s, float(EPS)))
        scale = _fp16_value(words)
        q = tf.math.round(b * (1.0 / scale))
        out = {"scale": words}
        if not fmt.symmetric:
            zp = tf.clip_by_value(-tf.math.round(lo / scale), float(lo_code), float(hi_code))
            q = q + zp
            out["zero_point"] = tf.cast(zp, tf.int32)
        q = tf.where(tf.math.is_nan(q), 0.0, tf.clip_by_value(q, float(lo_code), float(hi_code)))
        out["codes"] = _low(tf.cast(q, tf.int32), bits)
        return out

    def decode(p: Planes) -> tf.Tensor:
        if fmt.symmetric:
            q = _sign_extend(p["codes"], bits)
        else:
            q = p["codes"] - p["zero_point"]
        return tf.cast(q, tf.float32) * _fp16_value(p["scale"])

    return encode, decode


_KERNELS = {MX: _mx, NVFP4: _nvfp4, GGUF: _gguf, GroupwiseInt: _groupwise}


def has_kernel(fmt: object) -> bool:
    """Whether ``block_fault`` has TensorFlow arithmetic for the block format ``fmt``."""
    return type(fmt) in _KERNELS


# ---- tensors to blocks and back ----------------------------------------------------------


def block_fault(fmt: BlockFormat, fault: FaultModel, axis: int) -> BlockFaultFn:
    """``(x, masks) -> faulty x`` for ``fmt`` with its blocks along ``axis`` of x; masks in
    plane order, each already restricted to the fault model's eligible bits.

    No transposes: x is viewed as ``(before, length, after)`` (its axes before and after
    ``axis`` flattened), padded along ``length`` to whole blocks and reshaped to
    ``(before * blocks, k, after)``; a block plane in x's layout (``blocks`` at ``axis``)
    is ``(before * blocks, 1, after)`` of the same memory."""
    if not has_kernel(fmt):
        raise TypeError(f"bitfault.keras has no TensorFlow kernel for {fmt!r}; it runs MX, "
                        "NVFP4, GGUF and GroupwiseInt (KerasEvaluator runs any block format)")
    encode, decode = _KERNELS[type(fmt)](fmt)
    k = fmt.block_size
    planes = fmt.planes

    # a partial last block: whole blocks and the padded tail go separately (padding the
    # whole tensor costs XLA a copy); a tensor plane (NVFP4) needs them together
    split = all(plane.per != "tensor" for plane in planes)

    def faulted(words: Planes, masks: Sequence[tf.Tensor], cut: Callable[[tf.Tensor], tf.Tensor],
              cut_block: Callable[[tf.Tensor], tf.Tensor]) -> Planes:
        out = {}
        for plane, mask in zip(planes, masks, strict=True):
            m = tf.cast(mask, tf.int32)
            m = cut(m) if plane.per == "element" else cut_block(m) if plane.per == "block" else m
            out[plane.name] = _low(_apply_fault(words[plane.name], m, fault),
                                   plane.format.bits)
        return out

    def run(x: tf.Tensor, masks: Sequence[tf.Tensor]) -> tf.Tensor:
        shape = [int(d) for d in x.shape]
        length = shape[axis]
        before, after = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:]))
        nb = max(1, -(-length // k)) if length else 0
        pad = nb * k - length
        head = (nb - 1) * k if pad and split and nb > 1 else 0  # whole blocks cut off

        def blocks(t: tf.Tensor, start: int = 0) -> tf.Tensor:
            t = tf.reshape(t, [before, length, after])[:, start:]
            n = -(-(length - start) // k)
            if n * k > length - start:
                t = tf.pad(t, [[0, 0], [0, n * k - length + start], [0, 0]])
            return tf.reshape(t, [before * n, k, after])

        def whole(t: tf.Tensor) -> tf.Tensor:
            return tf.reshape(tf.reshape(t, [before, length, after])[:, :head],
                              [before * (nb - 1), k, after])

        def plane_part(lo: int, hi: int) -> Callable[[tf.Tensor], tf.Tensor]:
            return lambda m: tf.reshape(tf.reshape(m, [before, nb, after])[:, lo:hi],
                                        [before * (hi - lo), 1, after])

        if not head:
            values = decode(faulted(encode(blocks(x)), masks, blocks, plane_part(0, nb)))
            values = tf.reshape(values, [before, nb * k, after])
        else:
            first = decode(faulted(encode(whole(x)), masks, whole, plane_part(0, nb - 1)))
            tail = decode(faulted(encode(blocks(x, head)), masks, lambda m: blocks(m, head),
                                plane_part(nb - 1, nb)))
            values = tf.concat([tf.reshape(first, [before, head, after]),
                                tf.reshape(tail, [before, k, after])], axis=1)
        if pad:
            values = values[:, :length, :]
        return tf.reshape(values, shape)

    return run


def plane_dtypes(fmt: BlockFormat) -> list[np.dtype]:
    """The container dtype of each plane's mask, in plane order."""
    return [np.dtype(p.format.container) for p in fmt.planes]



register(BlockFormat, blocks=True)  # planes in blocks; kernels for the types below alone
for _format_type in _KERNELS:
    register(_format_type, exact=True, fault=block_fault)


__all__ = ["KERNEL_FORMATS", "BlockFaultFn", "block_fault", "has_kernel", "plane_dtypes",
           "small_float_fault"]
