"""Small floats (float4/6/8) to codes and back with TensorFlow ops, bit for bit the core's
float32 tables (``MiniFloat.float32_tables``, ``decode_table``): where a short ladder of
comparisons on the magnitude bits reproduces a table for every one of its indices (checked
exhaustively when first built), the ladder, which XLA fuses into the surrounding pass; else
a gather from the table."""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from bitfault.formats.minifloat import MiniFloat


def _table_index(bits: tf.Tensor, shift: int) -> tf.Tensor:
    high = tf.bitwise.bitwise_and(tf.bitwise.right_shift(bits, shift), (1 << (32 - shift)) - 1)
    sticky = tf.cast(tf.not_equal(tf.bitwise.bitwise_and(bits, (1 << shift) - 1), 0), tf.int32)
    return tf.bitwise.bitwise_or(high, tf.bitwise.left_shift(sticky, 32 - shift))


@functools.cache
def _encode_ladder(codec: MiniFloat, overflow: str) -> tuple[np.ndarray, int, int] | None:
    """The core's float32 table as a ladder on magnitude bits, where one reproduces it for
    every table index (checked exhaustively here): (thresholds, NaN code, sign bit). A
    magnitude's code is the count of thresholds at most its bits; None where no short ladder
    (at most 31 steps) does. Takes an overflow the codec's table takes."""
    table = codec.float32_tables(overflow)[0].astype(np.int64)
    shift = 22 - codec.mantissa
    index = np.arange(table.size, dtype=np.int64)
    high, sticky = index & ((1 << (32 - shift)) - 1), index >> (32 - shift)
    bits = ((high << shift) | sticky).astype(np.uint32)  # one float32 of each class
    mag = (bits & 0x7FFFFFFF).astype(np.int64)
    finite = mag <= 0x7F800000
    order = np.argsort(mag[finite & (bits < 2**31)], kind="stable")
    pos_mag, pos_code = mag[finite & (bits < 2**31)][order], table[finite & (bits < 2**31)][order]
    steps = np.flatnonzero(np.diff(pos_code)) + 1
    if pos_code[0] != 0 or steps.size > 31 or np.any(np.diff(pos_code)[steps - 1] != 1):
        return None
    thresholds = pos_mag[steps].astype(np.int32)
    nan_codes = np.unique(table[~finite])  # a NaN's code, whatever its sign
    sign = 1 << (codec.bits - 1)
    if nan_codes.size != 1:
        return None
    nan_code = int(nan_codes[0])
    magnitude = np.searchsorted(thresholds, mag, side="right")
    signed = np.where(bits >= 2**31, magnitude | sign, magnitude)
    if not np.array_equal(np.where(finite, signed, nan_code), table):
        return None
    return thresholds, nan_code, sign


def _encode_small(y: tf.Tensor, codec: MiniFloat, overflow: str = "saturate") -> tf.Tensor:
    """float32 -> codes (int32) under ``overflow``, the core's ``float32_tables`` lookup (as
    a ladder of comparisons where one reproduces the table, else a gather)."""
    bits = tf.bitcast(y, tf.int32)
    ladder = _encode_ladder(codec, overflow)
    if ladder is None:
        table = tf.constant(codec.float32_tables(overflow)[0].astype(np.int32))
        return tf.gather(table, _table_index(bits, 22 - codec.mantissa))
    thresholds, nan_code, sign = ladder
    mag = tf.bitwise.bitwise_and(bits, 0x7FFFFFFF)
    code = tf.add_n([tf.cast(mag >= int(t), tf.int32) for t in thresholds])
    code = tf.where(bits < 0, tf.bitwise.bitwise_or(code, sign), code)
    return tf.where(mag > 0x7F800000, nan_code, code)


@functools.cache
def _decode_ladder(codec: MiniFloat) -> tuple[np.ndarray, int] | None:
    """The decode table as (magnitude values' bits, sign bit) where a code's value is its
    magnitude's with the sign bit set (checked for every code); None past 16 magnitudes."""
    table = codec.decode_table(np.float32).view(np.int32).astype(np.int64)
    sign = 1 << (codec.bits - 1)
    if sign > 16 or table.size != 2 * sign:
        return None
    mags = table[:sign]
    if not np.array_equal(table[sign:], mags | -(1 << 31)) or np.any(mags < 0):
        return None
    return mags.astype(np.int32), sign


def _decode_small(codes: tf.Tensor, codec: MiniFloat) -> tf.Tensor:
    ladder = _decode_ladder(codec)
    codes = tf.bitwise.bitwise_and(codes, (1 << codec.bits) - 1)
    if ladder is None:
        table = tf.constant(codec.decode_table(np.float32).view(np.int32))
        return tf.bitcast(tf.gather(table, codes), tf.float32)
    mags, sign = ladder
    m = tf.bitwise.bitwise_and(codes, sign - 1)
    out = tf.fill(tf.shape(codes), int(mags[0]))
    for j in range(1, sign):
        out = tf.where(tf.equal(m, j), int(mags[j]), out)
    out = tf.where(codes >= sign, tf.bitwise.bitwise_or(out, tf.constant(-(1 << 31), tf.int32)),
                   out)
    return tf.bitcast(out, tf.float32)
