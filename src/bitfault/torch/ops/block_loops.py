"""The compiled loops of ``ops.block_numba``: one pass over each block of a float32 tensor.

Every kernel takes the flat float32 tensor ``x`` (C order, the block axis last: ``rows`` x
``length``, each row ``nbpr`` blocks of ``k``, the last one short by the padding) and writes
``out`` in the same order; block ``b = r * nbpr + j``. Faults, sorted by block-form position
and walked block by block (nothing per block of the tensor is built for them): codes
``cpos/cmask`` (``b * k + slot``), the block planes ``b0pos/b0mask`` and ``b1pos/b1mask``
(block numbers), ``tmask`` for a tensor plane; ``op`` as ``ops.numba.fault_op``. Per
block: its statistics, its scale words, the faulty scale words, the codes of the clean
values, their decoded values, then the faulty codes again. The arithmetic is the core's:
float32 operations in its order (see the ``formats`` modules). Not imported by anything
but ``ops.block_numba``, which compiles these functions.
"""

from __future__ import annotations

import numpy as np

_EPS32 = np.float32(np.finfo(np.float32).eps)
_DIVISOR = np.float32(6.0 * 448.0)  # nvfp4.TENSOR_DIVISOR

def _fault(word, mask, op):  # pragma: no cover (compiled)
    if op == 0:
        return word ^ mask
    if op == 1:
        return word | mask
    return word & ~mask


def _block_mask(pos, masks, p, b):  # pragma: no cover (compiled)
    """(block ``b``'s mask in the sorted distinct block numbers ``pos`` from ``p`` on (0 when
    it has none), where the next block's search starts)."""
    if p < pos.size and pos[p] == b:
        return masks[p], p + 1
    return np.int64(0), p


def _code_end(cpos, f, stop):  # pragma: no cover (compiled)
    """The end of the run of sorted code positions below ``stop`` that starts at ``f``."""
    while f < cpos.size and cpos[f] < stop:
        f += 1
    return f


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
    if h >= 0x7C00:
        h = 0x7C00
    return sign | h


def _rint_code(y, lo, hi):  # pragma: no cover (compiled)
    """rint(y) clamped to [lo, hi] as an int (NaN -> 0)."""
    t = np.rint(y)
    if t < lo:
        t = lo
    if t > hi:
        t = hi
    if t != t:
        return 0
    return np.int64(t)




def _small_codes(yb, yu, cb, n, enc, shift, key_mask):  # pragma: no cover (compiled)
    """``cb[:n]``: the small float codes of ``yb[:n]`` (``yu``: its bits), by the key table."""
    low = np.uint32((1 << shift) - 1)
    sh = np.uint32(shift)
    km = np.uint32(key_mask)
    for s in range(n):
        u = yu[s]
        cb[s] = enc[((((u & low) + low) | u) >> sh) & km]


def _magnitude(xub, n):  # pragma: no cover (compiled)
    """The largest magnitude's bits (NaN above inf) of a block's float32 bits."""
    mag = np.uint32(0)
    for s in range(n):
        mag = max(mag, xub[s] & np.uint32(0x7FFFFFFF))
    return mag


def _first_nan(p, t):  # pragma: no cover (compiled)
    """``p * t``, ``p``'s NaN where ``p`` is NaN: NumPy's result (LLVM may swap the operands
    of a product, and x86 keeps the first operand's NaN)."""
    return p if p != p else p * t


def _mx_value(c, int8, dec, scale):  # pragma: no cover (compiled)
    if int8:
        return np.float32(c - 256 if c & 0x80 else c) * np.float32(2.0**-6) * scale
    return _first_nan(dec[c], scale)


def mx_kernel(x, out, rows, length, k, nbpr, cpos, cmask, b0pos, b0mask, b1pos, b1mask,
              tmask, op, int8,
              emax, enc, shift, key_mask, dec, code_mask, e8m0):  # pragma: no cover
    xu = x.view(np.uint32)
    yb = np.zeros(k, np.float32)
    yu = yb.view(np.uint32)
    cb = np.zeros(k, np.int64)
    f = p0 = p1 = 0
    for r in range(rows):
        for j in range(nbpr):
            b = r * nbpr + j
            m0, p0 = _block_mask(b0pos, b0mask, p0, b)
            m1, p1 = _block_mask(b1pos, b1mask, p1, b)
            a0 = r * length + j * k
            n = min(k, length - j * k)
            xb, ob = x[a0:a0 + n], out[a0:a0 + n]
            biased = np.int64(_magnitude(xu[a0:a0 + n], n) >> np.uint32(23))
            e = min(max((-127 if biased == 0 else biased - 127) - emax, -127), 127)
            inv = e8m0[127 - e]  # 2**-E, exact
            scale = e8m0[_fault(e + 127, m0, op) & 0xFF]
            for s in range(n):
                yb[s] = xb[s] * inv
            if int8:
                for s in range(n):
                    cb[s] = _rint_code(yb[s] * np.float32(64.0), -127, 127) & 0xFF
            else:
                _small_codes(yb, yu, cb, n, enc, shift, key_mask)
            for s in range(n):
                ob[s] = _mx_value(cb[s], int8, dec, scale)
            end = _code_end(cpos, f, b * k + k)
            for g in range(f, end):
                s = cpos[g] - b * k
                ob[s] = _mx_value(_fault(cb[s], cmask[g], op) & code_mask, int8, dec, scale)
            f = end
    return True


def nvfp4_kernel(x, out, rows, length, k, nbpr, cpos, cmask, b0pos, b0mask, b1pos, b1mask,
              tmask, op,
                 e2m1_enc, e2m1_shift, e2m1_keys, e2m1_dec, e4m3_enc, e4m3_shift, e4m3_keys,
                 e4m3_dec):  # pragma: no cover (compiled)
    xu = x.view(np.uint32)
    yb = np.zeros(max(k, 1), np.float32)
    yu = yb.view(np.uint32)
    cb = np.zeros(max(k, 1), np.int64)
    yu[0] = _magnitude(xu, x.size)
    t = yb[0] / _DIVISOR
    if t == 0:
        t = np.float32(1.0)
    yb[0] = t
    yu[0] = np.uint32(_fault(np.int64(yu[0]), tmask, op) & 0xFFFFFFFF)
    t_faulty = yb[0]
    t_nan = t_faulty != t_faulty  # NumPy's product by a 0-d NaN gives that NaN, quieted:
    yu[0] |= np.uint32(0x400000)  # every value is it
    t_quiet = yb[0]
    f = p0 = p1 = 0
    for r in range(rows):
        for j in range(nbpr):
            b = r * nbpr + j
            m0, p0 = _block_mask(b0pos, b0mask, p0, b)
            m1, p1 = _block_mask(b1pos, b1mask, p1, b)
            a0 = r * length + j * k
            n = min(k, length - j * k)
            xb, ob = x[a0:a0 + n], out[a0:a0 + n]
            yu[0] = _magnitude(xu[a0:a0 + n], n)
            yb[0] = yb[0] / (np.float32(6.0) * t)
            _small_codes(yb, yu, cb, 1, e4m3_enc, e4m3_shift, e4m3_keys)
            word = cb[0]
            denominator = e4m3_dec[word] * t
            if denominator == 0:
                denominator = np.float32(np.inf)  # x / inf: a zero of x's sign
            scale = e4m3_dec[_fault(word, m0, op) & 0xFF]
            for s in range(n):
                yb[s] = xb[s] / denominator
            _small_codes(yb, yu, cb, n, e2m1_enc, e2m1_shift, e2m1_keys)
            for s in range(n):
                ob[s] = t_quiet if t_nan else _first_nan(e2m1_dec[cb[s]] * scale, t_faulty)
            end = _code_end(cpos, f, b * k + k)
            for g in range(f, end):
                s = cpos[g] - b * k
                q = e2m1_dec[_fault(cb[s], cmask[g], op) & 0xF]
                ob[s] = t_quiet if t_nan else _first_nan(q * scale, t_faulty)
            f = end
    return True


def _f16(v, sc, scu):  # pragma: no cover (compiled)
    """float32 ``v`` -> the bits of its fp16 rounding (``sc``/``scu``: a scratch word)."""
    sc[0] = v
    return _f16_bits(np.int64(scu[0]))


def _extreme(buf, tmp, k, larger):  # pragma: no cover (compiled)
    """The core's max / min of a block: any order for a nonzero extreme; a zero one (whose
    sign the order picks) by the core's pairwise tree, the second operand between equals."""
    m = buf[0]
    for s in range(1, k):
        v = buf[s]
        m = v if ((v > m) if larger else (v < m)) else m
    if m != 0:
        return m
    for s in range(k):
        tmp[s] = buf[s]
    n = k
    while n > 1:
        for s in range(n // 2):
            a, c = tmp[2 * s], tmp[2 * s + 1]
            tmp[s] = a if ((a > c) if larger else (a < c)) else c
        n //= 2
    return tmp[0]


def _gguf_code(v, kind, inv, mn):  # pragma: no cover (compiled)
    """An element's code: Q8_0 roundf (half away from zero) of the clamped product; Q4_*
    min(15, trunc(y)) of y clamped to [0, 15] (NaN: 0 for Q8_0 and Q4_1, 8.5 for Q4_0)."""
    if kind == 0:
        y = v * inv
        y = min(max(y, np.float32(-127.0)), np.float32(127.0)) if y == y else np.float32(0.0)
        t = np.trunc(y)
        f = y - t
        return (np.int64(t) + (f >= 0.5) - (f <= -0.5)) & 0xFF
    if kind == 1:
        y = v * inv + np.float32(8.5)
        zero = np.float32(8.5)
    else:
        y = (v - mn) * inv + np.float32(0.5)
        zero = np.float32(0.0)
    y = min(max(y, np.float32(0.0)), np.float32(15.0)) if y == y else zero
    return min(np.int64(np.trunc(y)), 15)


def _gguf_value(q, kind, d, m):  # pragma: no cover (compiled)
    if kind == 0:
        return d * np.float32(q - 256 if q & 0x80 else q)
    if kind == 1:
        return d * np.float32((q & 0xF) - 8)
    scaled = d * np.float32(q & 0xF)
    return scaled if scaled != scaled else scaled + m  # NaN + NaN: the first, as NumPy


def gguf_kernel(x, out, rows, length, k, nbpr, cpos, cmask, b0pos, b0mask, b1pos, b1mask,
              tmask, op, kind,
                f16_dec):  # pragma: no cover (compiled)
    xu = x.view(np.uint32)
    sc = np.zeros(1, np.float32)
    scu = sc.view(np.uint32)
    buf = np.zeros(k, np.float32)  # the block, padded with zeros
    tmp = np.zeros(k, np.float32)
    cb = np.zeros(k, np.int64)
    f = p0 = p1 = 0
    for r in range(rows):
        for j in range(nbpr):
            b = r * nbpr + j
            m0, p0 = _block_mask(b0pos, b0mask, p0, b)
            m1, p1 = _block_mask(b1pos, b1mask, p1, b)
            a0 = r * length + j * k
            n = min(k, length - j * k)
            xb, ob = x[a0:a0 + n], out[a0:a0 + n]
            mn = np.float32(0.0)
            if kind == 0:
                scu[0] = _magnitude(xu[a0:a0 + n], n)
                d = sc[0] / np.float32(127.0)
            elif kind == 1:  # the value of largest magnitude, the first of equals
                xub = xu[a0:a0 + n]
                mag, first = np.int64(-1), 0
                for s in range(n):
                    m = np.int64(xub[s] & np.uint32(0x7FFFFFFF))
                    if m > mag:
                        mag, first = m, s
                d = xb[first] / np.float32(-8.0)
            else:
                for s in range(n):
                    buf[s] = xb[s]
                for s in range(n, k):
                    buf[s] = 0.0
                mx = _extreme(buf, tmp, k, True)
                mn = _extreme(buf, tmp, k, False)
                d = (mx - mn) / np.float32(15.0)
            inv = np.float32(0.0) if d == 0 else np.float32(1.0) / d
            dq = f16_dec[_fault(_f16(d, sc, scu), m0, op) & 0xFFFF]
            mq = f16_dec[_fault(_f16(mn, sc, scu), m1, op) & 0xFFFF] if kind == 2 \
                else np.float32(0.0)
            for s in range(n):
                cb[s] = _gguf_code(xb[s], kind, inv, mn)
            for s in range(n):
                ob[s] = _gguf_value(cb[s], kind, dq, mq)
            end = _code_end(cpos, f, b * k + k)
            for g in range(f, end):
                s = cpos[g] - b * k
                q = _fault(cb[s], cmask[g], op) & (0xFF if kind == 0 else 0xF)
                ob[s] = _gguf_value(q, kind, dq, mq)
            f = end
    return True


def _gw_code(v, inv, zp, lo, hi):  # pragma: no cover (compiled)
    """rint(v * inv) + zp, clamped to [lo, hi], as an int (NaN -> 0)."""
    t = np.rint(v * inv) + np.float32(zp)
    if t != t:
        return 0
    return np.int64(min(max(t, np.float32(lo)), np.float32(hi)))


def _gw_value(q, symmetric, top, zp):  # pragma: no cover (compiled)
    """A code's integer: two's complement (symmetric) or minus the zero point, as float32."""
    if symmetric:
        return np.float32(q - 2 * top if q & top else q)
    return np.float32(q - zp)


def groupwise_kernel(x, out, rows, length, k, nbpr, cpos, cmask, b0pos, b0mask, b1pos, b1mask,
              tmask, op,
                     symmetric, bits, lo_code, hi_code, f16_dec):  # pragma: no cover
    sc = np.zeros(1, np.float32)
    scu = sc.view(np.uint32)
    cb = np.zeros(k, np.int64)
    mask = (1 << bits) - 1
    top = 1 << (bits - 1)
    storable = True
    f = p0 = p1 = 0
    for r in range(rows):
        for j in range(nbpr):
            b = r * nbpr + j
            m0, p0 = _block_mask(b0pos, b0mask, p0, b)
            m1, p1 = _block_mask(b1pos, b1mask, p1, b)
            a0 = r * length + j * k
            n = min(k, length - j * k)
            xb, ob = x[a0:a0 + n], out[a0:a0 + n]
            lo = np.float32(0.0)  # min(min x, 0), max(max x, 0): the padding's zeros too
            hi = np.float32(0.0)
            for s in range(n):
                v = xb[s]
                lo = v if v < lo else lo
                hi = v if v > hi else hi
            if symmetric:
                s32 = max(-lo, hi) / np.float32(hi_code)
            else:
                s32 = (hi - lo) / np.float32(hi_code - lo_code)
            word = _f16(max(s32, _EPS32), sc, scu)
            if word & 0x7C00 == 0x7C00:
                storable = False  # an fp16 inf: the core raises
            scale = f16_dec[word]
            inv = np.float32(1.0) / scale
            zp = 0
            if not symmetric:
                z = -np.rint(lo / scale)
                zp = np.int64(min(max(z, np.float32(lo_code)), np.float32(hi_code)))
            s_faulty = f16_dec[_fault(word, m0, op) & 0xFFFF]
            zp_faulty = (_fault(zp, m1, op) & mask) if not symmetric else 0
            for s in range(n):
                cb[s] = _gw_code(xb[s], inv, zp, lo_code, hi_code) & mask
            for s in range(n):
                ob[s] = _gw_value(cb[s], symmetric, top, zp_faulty) * s_faulty
            end = _code_end(cpos, f, b * k + k)
            for g in range(f, end):
                s = cpos[g] - b * k
                q = _fault(cb[s], cmask[g], op) & mask
                ob[s] = _gw_value(q, symmetric, top, zp_faulty) * s_faulty
            f = end
    return storable


HELPERS = ("_block_mask", "_code_end", "_fault", "_f16_bits", "_rint_code", "_small_codes",
           "_magnitude", "_first_nan", "_mx_value", "_f16", "_extreme", "_gguf_code", "_gguf_value",
           "_gw_code", "_gw_value")
KERNELS = ("mx_kernel", "nvfp4_kernel", "gguf_kernel", "groupwise_kernel")
