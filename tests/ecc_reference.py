"""An independent SEC-DED / parity reference with Python ints, from the textbook construction.

The extended Hamming codeword is built position by position (1-based, check bit i at
position 2^i, data bits LSB first at the other positions, the overall parity bit over
everything) and decoded by XOR-ing the positions of its set bits (the syndrome).
Status: 0 ok, 1 corrected, 2 detected-uncorrectable.
"""

from __future__ import annotations

import numpy as np

OK, CORRECTED, DUE = 0, 1, 2


def ref_r(k: int) -> int:
    r = 0
    while 2 ** r < k + r + 1:
        r += 1
    return r


def ref_codeword(d: int, k: int) -> dict[int, int]:
    """Positions 1..n of the Hamming codeword of data ``d`` (``k`` bits), 0 for the overall."""
    r = ref_r(k)
    n = k + r
    word = {}
    data = iter(range(k))
    for pos in range(1, n + 1):
        word[pos] = 0 if pos in {2 ** i for i in range(r)} else (d >> next(data)) & 1
    for i in range(r):
        word[2 ** i] = sum(b for p, b in word.items() if p & 2 ** i) % 2
    word[0] = sum(word.values()) % 2
    return word


def ref_encode(d: int, k: int) -> int:
    """Check word: bit i = the check bit at position 2^i, bit r = the overall parity."""
    r = ref_r(k)
    word = ref_codeword(d, k)
    return sum(word[2 ** i] << i for i in range(r)) | word[0] << r


def ref_decode(d: int, c: int, k: int) -> tuple[int, int]:
    """(data, status) from the received data and check words."""
    r = ref_r(k)
    n = k + r
    checks = {2 ** i for i in range(r)}
    data_pos = [p for p in range(1, n + 1) if p not in checks]
    word = {p: (d >> j) & 1 for j, p in enumerate(data_pos)}
    word.update({2 ** i: (c >> i) & 1 for i in range(r)})
    word[0] = (c >> r) & 1
    syndrome = 0
    for p in range(1, n + 1):
        if word[p]:
            syndrome ^= p
    overall = sum(word.values()) % 2
    if syndrome == 0 and overall == 0:
        status = OK
    elif overall == 1 and syndrome == 0:
        status = CORRECTED  # the overall parity bit itself
    elif overall == 1 and syndrome <= n:
        word[syndrome] ^= 1
        status = CORRECTED
    else:
        status = DUE
    out = sum(word[p] << j for j, p in enumerate(data_pos))
    return out, status


def random_words(k: int, count: int, seed: int) -> list[int]:
    """0, all ones and ``count`` random ``k``-bit words (any ``k``: 64-bit draws joined)."""
    rng = np.random.default_rng(seed)
    chunks = -(-k // 64)
    draws = rng.integers(0, 2 ** 64, (count, chunks), dtype=np.uint64)
    words = [sum(int(x) << (64 * j) for j, x in enumerate(row)) >> (64 * chunks - k)
             for row in draws]
    return [0, 2 ** k - 1, *words]


def to_array(values: list[int], k: int) -> np.ndarray:
    """Python ints as the library's words: uint64 up to 64 bits, else rows of 64-bit
    lanes, least significant lane first."""
    if k <= 64:
        return np.array(values, np.uint64)
    lanes = -(-k // 64)
    return np.array([[(v >> (64 * j)) % 2 ** 64 for j in range(lanes)] for v in values],
                    np.uint64).reshape(len(values), lanes)


def from_array(words: np.ndarray) -> list[int]:
    """The inverse of ``to_array``."""
    if words.ndim == 1:
        return [int(x) for x in words]
    return [sum(int(x) << (64 * j) for j, x in enumerate(row)) for row in words]


def flip(d: int, c: int, k: int, positions: tuple[int, ...]) -> tuple[int, int]:
    """Flip physical bits: 0..k-1 are data bits, k.. check bits."""
    for p in positions:
        if p < k:
            d ^= 1 << p
        else:
            c ^= 1 << (p - k)
    return d, c


def ref_parity(d: int) -> int:
    return bin(d).count("1") % 2


def ref_scheme(kind: str, d: int, c: int, k: int, policy: str = "flag") -> tuple[int, int]:
    """(decoded data, status) of received data ``d`` and check ``c`` under scheme ``kind``."""
    if kind == "none":
        out, status = d, OK
    elif kind == "parity":
        out, status = d, DUE if (ref_parity(d) ^ c) else OK
    else:
        out, status = ref_decode(d, c, k)
    return (0 if policy == "zero" and status == DUE else out), status


def ref_check(kind: str, d: int, k: int) -> int:
    return 0 if kind == "none" else ref_parity(d) if kind == "parity" else ref_encode(d, k)


def ref_check_bits(kind: str, k: int) -> int:
    return 0 if kind == "none" else 1 if kind == "parity" else ref_r(k) + 1
