"""The compiled loops of ``kernels.block_numba``: one pass over each block of a float32 tensor.

Every kernel takes the flat float32 ``x`` (C order, the block axis last: ``rows`` x ``length``,
each row ``nbpr`` blocks of ``k``, the last one short) and writes ``out`` in that order; block
``b = r * nbpr + j``. Faults, sorted, each list ending in a position past every block: codes
``cpos/cmask`` (``b * k + slot``), block planes ``b0pos/b0mask``, ``b1pos/b1mask`` (block
numbers), walked block by block inline (a helper returning (mask, next) made every loop 2x
slower); ``tmask`` for a tensor plane; ``op`` as ``kernels.numba.fault_op``. Per block:
statistics, scale words and their faulty forms, one loop encoding and decoding every
element, then the few faulty codes (clean codes recomputed from the same operands). For
LLVM's vectoriser: loops over a block's own slices, reductions by compare-and-select on
integers (the largest magnitude on the bits; float max / min on order-preserving keys, NaN
left out where the core's scan leaves it out), no builtin ``min`` / ``max`` in a loop. The
arithmetic and constants are the core's (float32 operations in its order; no fast-math).
"""

from __future__ import annotations

import numpy as np

from bitfault.formats.nvfp4 import TENSOR_DIVISOR

_EPS32 = np.float32(np.finfo(np.float32).eps)
_ABS = np.uint32(0x7FFFFFFF)


def _fault(word, mask, op):  # pragma: no cover (compiled)
    return word ^ mask if op == 0 else (word | mask if op == 1 else word & ~mask)


def _f16_bits(u):  # pragma: no cover (compiled)
    """float32 bits ``u`` -> the bits of its fp16 rounding (nearest even, inf past 65504)."""
    sign = (u >> 16) & 0x8000
    e = (u >> 23) & 0xFF
    m = u & 0x7FFFFF
    if e == 0xFF:
        return sign | 0x7C00 | (0x200 | (m >> 13) if m else 0)
    if e < 102:  # below half the smallest fp16 subnormal (2**-25): zero
        return sign
    if e < 113:  # an fp16 subnormal: 2**-24 units
        m |= 0x800000
        s = 126 - e  # bits dropped
        h = m >> s
        rest = m & ((np.int64(1) << s) - 1)
        half = np.int64(1) << (s - 1)
        if rest > half or (rest == half and h & 1):
            h += 1
        return sign | h
    h = ((e - 112) << 10) | (m >> 13)
    rest = m & 0x1FFF
    if rest > 0x1000 or (rest == 0x1000 and h & 1):
        h += 1  # a carry into the exponent is right; past 0x7BFF it is inf
    return sign | min(h, 0x7C00)


def _magnitude(xu):  # pragma: no cover (compiled)
    """The largest magnitude's bits (NaN above inf) of float32 bits ``xu`` (a block's slice:
    indexing the tensor from the block's start instead ran up to 10x slower)."""
    mag = np.uint32(0)
    for s in range(xu.size):
        v = xu[s] & _ABS
        mag = v if v > mag else mag
    return mag


def _key(i):  # pragma: no cover (compiled)
    """float32 bits (an int) -> an int of the same order (-0 below +0); its own inverse."""
    return i ^ ((i >> 31) & 0x7FFFFFFF)


def _key_extreme(xi, larger, start):  # pragma: no cover (compiled)
    """The key of the largest (``larger``) or smallest non-NaN value of float32 bits ``xi``
    and of ``start``'s key."""
    m = np.int64(start)
    for s in range(xi.size):
        i = np.int64(xi[s])
        nan = (i & 0x7FFFFFFF) > 0x7F800000
        key = _key(i)
        if larger:
            key = -(2**31) if nan else key  # below every key
            m = key if key > m else m
        else:
            key = 2**31 - 1 if nan else key
            m = key if key < m else m
    return m


def _as_float(key, sc, sci):  # pragma: no cover (compiled)
    """The float32 whose key is ``key`` (``sc``/``sci``: a scratch word)."""
    sci[0] = np.int32(_key(key))
    return sc[0]


def _small_code(u, enc, shift, key_mask):  # pragma: no cover (compiled)
    """The small float code of float32 bits ``u`` by the core's key table (uint32 keys)."""
    low = (np.uint32(1) << shift) - np.uint32(1)
    return enc[((((u & low) + low) | u) >> shift) & key_mask]


def _first_nan(p, t):  # pragma: no cover (compiled)
    """``p * t``, ``p``'s NaN where ``p`` is NaN: NumPy's result (LLVM may swap the operands
    of a product, and x86 keeps the first operand's NaN)."""
    return p if p != p else p * t


def _int8_code(y):  # pragma: no cover (compiled)
    """MXINT8: rint(y * 64) clamped to [-127, 127] (NaN -> 0), as a byte."""
    t = np.rint(y * np.float32(64.0))
    t = np.float32(-127.0) if t < -127 else (np.float32(127.0) if t > 127 else t)
    return np.int64(np.float32(0.0) if t != t else t) & 0xFF


def _mx_value(c, int8, dec, scale):  # pragma: no cover (compiled)
    if int8:
        return np.float32(c - 256 if c & 0x80 else c) * np.float32(2.0**-6) * scale
    return _first_nan(dec[c], scale)


def mx_kernel(x, out, rows, length, k, nbpr, cpos, cmask, b0pos, b0mask, b1pos, b1mask,
              tmask, op, int8, emax, enc, shift, key_mask, dec, code_mask,
              e8m0):  # pragma: no cover (compiled)
    xu = x.view(np.uint32)
    yb = np.zeros(k, np.float32)
    yu = yb.view(np.uint32)
    f = p0 = 0
    for r in range(rows):
        for j in range(nbpr):
            b = r * nbpr + j
            m0 = b0mask[p0] if b0pos[p0] == b else np.int64(0)
            p0 += b0pos[p0] == b
            a0 = r * length + j * k
            n = min(k, length - j * k)
            xb, ob = x[a0:a0 + n], out[a0:a0 + n]
            biased = np.int64(_magnitude(xu[a0:a0 + n]) >> np.uint32(23))
            e = min(max((-127 if biased == 0 else biased - 127) - emax, -127), 127)
            inv = e8m0[127 - e]  # 2**-E, exact
            scale = e8m0[_fault(e + 127, m0, op) & 0xFF]
            for s in range(n):
                yb[s] = xb[s] * inv
            if int8:
                for s in range(n):
                    ob[s] = _mx_value(_int8_code(yb[s]), True, dec, scale)
            else:
                for s in range(n):
                    ob[s] = _first_nan(dec[_small_code(yu[s], enc, shift, key_mask)], scale)
            while cpos[f] < b * k + k:  # the block's faulty codes
                s = cpos[f] - b * k
                c = _int8_code(yb[s]) if int8 else \
                    np.int64(_small_code(yu[s], enc, shift, key_mask))
                ob[s] = _mx_value(_fault(c, cmask[f], op) & code_mask, int8, dec, scale)
                f += 1
    return True


def nvfp4_kernel(x, out, rows, length, k, nbpr, cpos, cmask, b0pos, b0mask, b1pos, b1mask,
                 tmask, op, e2m1_enc, e2m1_shift, e2m1_keys, e2m1_dec, e4m3_enc, e4m3_shift,
                 e4m3_keys, e4m3_dec):  # pragma: no cover (compiled)
    xu = x.view(np.uint32)
    yb = np.zeros(max(k, 1), np.float32)
    yu = yb.view(np.uint32)
    yu[0] = _magnitude(xu)
    t = yb[0] / TENSOR_DIVISOR
    t = np.float32(1.0) if t == 0 else t
    yb[0] = t
    yu[0] = np.uint32(_fault(np.int64(yu[0]), tmask, op) & 0xFFFFFFFF)
    t_faulty = yb[0]
    t_nan = t_faulty != t_faulty  # NumPy's product by a 0-d NaN gives that NaN, quieted:
    yu[0] |= np.uint32(0x400000)  # every value is it
    t_quiet = yb[0]
    f = p0 = 0
    for r in range(rows):
        for j in range(nbpr):
            b = r * nbpr + j
            m0 = b0mask[p0] if b0pos[p0] == b else np.int64(0)
            p0 += b0pos[p0] == b
            a0 = r * length + j * k
            n = min(k, length - j * k)
            xb, ob = x[a0:a0 + n], out[a0:a0 + n]
            yu[0] = _magnitude(xu[a0:a0 + n])
            yb[0] = yb[0] / (np.float32(6.0) * t)
            word = np.int64(_small_code(yu[0], e4m3_enc, e4m3_shift, e4m3_keys))
            denominator = e4m3_dec[word] * t
            if denominator == 0:
                denominator = np.float32(np.inf)  # x / inf: a zero of x's sign
            scale = e4m3_dec[_fault(word, m0, op) & 0xFF]
            for s in range(n):
                yb[s] = xb[s] / denominator
            if t_nan:
                for s in range(n):
                    ob[s] = t_quiet
            else:
                for s in range(n):
                    q = e2m1_dec[_small_code(yu[s], e2m1_enc, e2m1_shift, e2m1_keys)]
                    ob[s] = _first_nan(q * scale, t_faulty)
            while cpos[f] < b * k + k:  # the block's faulty codes
                s = cpos[f] - b * k
                c = np.int64(_small_code(yu[s], e2m1_enc, e2m1_shift, e2m1_keys))
                q = e2m1_dec[_fault(c, cmask[f], op) & 0xF]
                ob[s] = t_quiet if t_nan else _first_nan(q * scale, t_faulty)
                f += 1
    return True


def _f16(v, sc, scu):  # pragma: no cover (compiled)
    """float32 ``v`` -> the bits of its fp16 rounding (``sc``/``scu``: a scratch word)."""
    sc[0] = v
    return _f16_bits(np.int64(scu[0]))


def _zero_extreme(x, a0, n, k, larger, tmp):  # pragma: no cover (compiled)
    """A zero max / min of a block padded to ``k`` (the order picks its sign): the core's
    pairwise tree, the second operand between equals."""
    for s in range(n):
        tmp[s] = x[a0 + s]
    tmp[n:k] = 0.0
    w = k
    while w > 1:
        for s in range(w // 2):
            a, c = tmp[2 * s], tmp[2 * s + 1]
            tmp[s] = a if ((a > c) if larger else (a < c)) else c
        w //= 2
    return tmp[0]


def _q8_code(v, inv):  # pragma: no cover (compiled)
    """Q8_0: roundf (half away from zero) of v * inv clamped to [-127, 127] (NaN: 0)."""
    y = v * inv
    y = np.float32(-127.0) if y < -127 else (np.float32(127.0) if y > 127 else y)
    y = np.float32(0.0) if y != y else y
    t = np.trunc(y)
    fr = y - t
    return (np.int64(t) + (fr >= 0.5) - (fr <= -0.5)) & 0xFF


def _q4_code(y, zero):  # pragma: no cover (compiled)
    """Q4_*: min(15, trunc(y)) of y clamped to [0, 15] (NaN: ``zero``)."""
    y = np.float32(0.0) if y < 0 else (np.float32(15.0) if y > 15 else y)
    y = zero if y != y else y
    t = np.int64(np.trunc(y))
    return 15 if t > 15 else t


def _gguf_code(v, kind, inv, mn):  # pragma: no cover (compiled)
    """An element's code (NaN: 0 for Q8_0 and Q4_1, 8.5 -> 8 for Q4_0)."""
    if kind == 0:
        return _q8_code(v, inv)
    if kind == 1:
        return _q4_code(v * inv + np.float32(8.5), np.float32(8.5))
    return _q4_code((v - mn) * inv + np.float32(0.5), np.float32(0.0))


def _gguf_value(q, kind, d, m):  # pragma: no cover (compiled)
    if kind == 0:
        return d * np.float32(q - 256 if q & 0x80 else q)
    if kind == 1:
        return d * np.float32((q & 0xF) - 8)
    scaled = d * np.float32(q & 0xF)
    return scaled if scaled != scaled else scaled + m  # NaN + NaN: the first, as NumPy


def gguf_kernel(x, out, rows, length, k, nbpr, cpos, cmask, b0pos, b0mask, b1pos, b1mask,
                tmask, op, kind, f16_dec):  # pragma: no cover (compiled)
    xu = x.view(np.uint32)
    xi = x.view(np.int32)
    sc = np.zeros(1, np.float32)
    scu = sc.view(np.uint32)
    sci = sc.view(np.int32)
    tmp = np.zeros(k, np.float32)
    f = p0 = p1 = 0
    for r in range(rows):
        for j in range(nbpr):
            b = r * nbpr + j
            m0 = b0mask[p0] if b0pos[p0] == b else np.int64(0)
            p0 += b0pos[p0] == b
            m1 = b1mask[p1] if b1pos[p1] == b else np.int64(0)
            p1 += b1pos[p1] == b
            a0 = r * length + j * k
            n = min(k, length - j * k)
            xb, ob = x[a0:a0 + n], out[a0:a0 + n]
            mn = np.float32(0.0)
            if kind == 0:
                scu[0] = _magnitude(xu[a0:a0 + n])
                d = sc[0] / np.float32(127.0)
            elif kind == 1:  # the value of largest magnitude, the first of equals
                mag = _magnitude(xu[a0:a0 + n])
                first = a0
                while (xu[first] & _ABS) != mag:
                    first += 1
                d = x[first] / np.float32(-8.0)
            elif xb[0] != xb[0]:  # the core's scans start at the first value: NaN stays
                d = mn = xb[0]
            else:  # the others' extremes, NaN left out: any order for a nonzero one
                xib = xi[a0:a0 + n]
                start = 0 if n < k else _key(xib[0])  # the padding's zeros
                mx = _as_float(_key_extreme(xib, True, start), sc, sci)
                mn = _as_float(_key_extreme(xib, False, start), sc, sci)
                if mx == 0:
                    mx = _zero_extreme(x, a0, n, k, True, tmp)
                if mn == 0:
                    mn = _zero_extreme(x, a0, n, k, False, tmp)
                d = (mx - mn) / np.float32(15.0)
            inv = np.float32(0.0) if d == 0 else np.float32(1.0) / d
            dq = f16_dec[_fault(_f16(d, sc, scu), m0, op) & 0xFFFF]
            mq = f16_dec[_fault(_f16(mn, sc, scu), m1, op) & 0xFFFF] if kind == 2 \
                else np.float32(0.0)
            if kind == 0:
                for s in range(n):
                    q = _q8_code(xb[s], inv)
                    ob[s] = dq * np.float32(q - 256 if q & 0x80 else q)
            elif kind == 1:
                for s in range(n):
                    q = _q4_code(xb[s] * inv + np.float32(8.5), np.float32(8.5))
                    ob[s] = dq * np.float32(q - 8)
            else:
                for s in range(n):
                    q = _q4_code((xb[s] - mn) * inv + np.float32(0.5), np.float32(0.0))
                    ob[s] = _gguf_value(q, 2, dq, mq)
            while cpos[f] < b * k + k:  # the block's faulty codes
                s = cpos[f] - b * k
                q = _fault(_gguf_code(xb[s], kind, inv, mn), cmask[f], op) & \
                    (0xFF if kind == 0 else 0xF)
                ob[s] = _gguf_value(q, kind, dq, mq)
                f += 1
    return True


def _gw_code(v, inv, zp, lo, hi):  # pragma: no cover (compiled)
    """rint(v * inv) + zp, clamped to [lo, hi], as an int (NaN -> 0)."""
    t = np.rint(v * inv) + np.float32(zp)
    t = np.float32(lo) if t < lo else (np.float32(hi) if t > hi else t)
    return np.int64(np.float32(0.0) if t != t else t)


def _gw_value(q, symmetric, top, zp):  # pragma: no cover (compiled)
    # a code's integer: two's complement (symmetric) or minus the zero point, as float32
    if symmetric:
        return np.float32(q - 2 * top if q & top else q)
    return np.float32(q - zp)


def groupwise_kernel(x, out, rows, length, k, nbpr, cpos, cmask, b0pos, b0mask, b1pos,
                     b1mask, tmask, op, symmetric, bits, lo_code, hi_code,
                     f16_dec):  # pragma: no cover (compiled)
    xi = x.view(np.int32)
    sc = np.zeros(1, np.float32)
    scu = sc.view(np.uint32)
    sci = sc.view(np.int32)
    mask = (1 << bits) - 1
    top = 1 << (bits - 1)
    storable = True
    f = p0 = p1 = 0
    for r in range(rows):
        for j in range(nbpr):
            b = r * nbpr + j
            m0 = b0mask[p0] if b0pos[p0] == b else np.int64(0)
            p0 += b0pos[p0] == b
            m1 = b1mask[p1] if b1pos[p1] == b else np.int64(0)
            p1 += b1pos[p1] == b
            a0 = r * length + j * k
            n = min(k, length - j * k)
            xb, ob = x[a0:a0 + n], out[a0:a0 + n]
            # min(min x, 0), max(max x, 0) (NaN left out, the padding's zeros in): a zero
            # is +0, the start of the core's scan
            xib = xi[a0:a0 + n]
            lo = _as_float(_key_extreme(xib, False, 0), sc, sci)
            lo = np.float32(0.0) if lo == 0 else lo
            hi = _as_float(_key_extreme(xib, True, 0), sc, sci)
            if symmetric:
                s32 = max(-lo, hi) / np.float32(hi_code)
            else:
                s32 = (hi - lo) / np.float32(hi_code - lo_code)
            word = _f16(max(s32, _EPS32), sc, scu)
            storable &= (word & 0x7C00) != 0x7C00  # an fp16 inf: the core raises
            scale = f16_dec[word]
            inv = np.float32(1.0) / scale
            zp = 0
            if not symmetric:
                z = -np.rint(lo / scale)
                zp = np.int64(min(max(z, np.float32(lo_code)), np.float32(hi_code)))
            s_faulty = f16_dec[_fault(word, m0, op) & 0xFFFF]
            zp_faulty = (_fault(zp, m1, op) & mask) if not symmetric else 0
            if symmetric:
                for s in range(n):
                    q = _gw_code(xb[s], inv, 0, lo_code, hi_code) & mask
                    ob[s] = np.float32(q - 2 * top if q & top else q) * s_faulty
            else:
                for s in range(n):
                    q = _gw_code(xb[s], inv, zp, lo_code, hi_code) & mask
                    ob[s] = np.float32(q - zp_faulty) * s_faulty
            while cpos[f] < b * k + k:  # the block's faulty codes
                s = cpos[f] - b * k
                q = _fault(_gw_code(xb[s], inv, zp, lo_code, hi_code) & mask, cmask[f], op) & mask
                ob[s] = _gw_value(q, symmetric, top, zp_faulty) * s_faulty
                f += 1
    return storable


HELPERS = tuple(name for name, fn in list(globals().items())  # every helper above
                if name.startswith("_") and not name.startswith("__") and callable(fn))
KERNELS = ("mx_kernel", "nvfp4_kernel", "gguf_kernel", "groupwise_kernel")
