"""Protection codes on memory words: none, even parity, SEC-DED (extended Hamming).

A memory word holds ``data_bits`` data bits (8..256: one NumPy ``uint64`` up to 64 bits,
arrays ``(n,)``; ``(n, lanes)`` uint64 lanes above, ``bitfault.memory.lanes``) and
``check_bits(data_bits)`` check bits (one ``uint64`` per word, check bit ``j`` at bit
``j``: at most 10 of them).
``encode`` computes the check bits of clean words; ``decode`` takes the received data and
check bits and returns the decoded data and a status per word: ``OK`` (0), ``CORRECTED``
(1) or ``DUE`` (2, detected but uncorrectable). What happens to a detected word is the
scheme's ``policy``: ``"flag"`` keeps the received data (the trial counts a DUE),
``"zero"`` makes the data word 0.

SEC-DED is the textbook extended Hamming code: Hamming(2^r - 1) shortened to the data
width plus an overall parity bit, (13,8), (22,16), (39,32), (72,64), (137,128),
(266,256). In the 1-based
codeword, Hamming check bit ``i`` sits at position ``2^i`` and the data bits, LSB first,
fill the other positions in order; check bit ``i`` is the even parity of the positions
with bit ``i`` set, and the overall parity bit (check bit ``r``) covers everything. The
decoder computes the real syndrome, so a triple error is miscorrected exactly as a
hardware decoder would (and reported ``CORRECTED``): a syndrome with odd overall parity
corrects the position it names, one with even overall parity is a DUE, and a syndrome
naming a position the shortened code lacks is a DUE.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError, check_choice, check_int
from bitfault.memory import lanes as ln

OK, CORRECTED, DUE = 0, 1, 2
POLICIES = ("flag", "zero")
MIN_DATA_BITS, MAX_DATA_BITS = 8, ln.MAX_WORD_BITS
_ONE = np.uint64(1)


def _data_bits(data_bits: Any) -> int:
    return check_int(data_bits, "data_bits", MIN_DATA_BITS, MAX_DATA_BITS)


def _low(bits: int) -> np.uint64:
    """The mask of the ``bits`` low bits (1..64) as a uint64."""
    return np.uint64((1 << bits) - 1)


def _words(values: Any, argument: str, bits: int) -> np.ndarray:
    """``values`` as a uint64 array whose words fit in ``bits`` bits (``(..., lanes)``
    above 64 bits); else ArgumentError."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "iu":
        raise ArgumentTypeError(argument, values, "an integer array",
                                tail=f", got dtype {arr.dtype}")
    if arr.dtype.kind == "i" and arr.size and int(arr.min()) < 0:
        raise ArgumentError(argument, values, f"unsigned words of {bits} bits",
                            tail=", got negative values")
    arr = arr.astype(np.uint64, copy=False)
    top = bits
    if ln.is_wide(bits):
        lanes = ln.lanes(bits)
        if arr.ndim < 1 or arr.shape[-1] != lanes:
            raise ArgumentError(argument, values, f"words of {bits} bits as (n, {lanes}) "
                                "uint64 lanes", tail=f", got shape {arr.shape}")
        top = bits - ln.LANE * (lanes - 1)
        high = arr[..., -1]
    else:
        high = arr
    if top < 64 and high.size and int(high.max()) >> top:
        raise ArgumentError(argument, values, f"words of at most {bits} bits",
                            tail=f", got a word above {bits} bits")
    return arr


def parity(words: np.ndarray) -> np.ndarray:
    """The even parity (0 or 1, uint64) of each uint64 word (of each row of lanes of a
    2-D array of wide words)."""
    return ln.parity(words)


def _checks_like(data: np.ndarray, bits: int) -> tuple[int, ...]:
    """The shape of the check words of ``data``: one per word."""
    return data.shape[:-1] if ln.is_wide(bits) else data.shape


def _apply_policy(data: np.ndarray, status: np.ndarray, policy: str) -> np.ndarray:
    if policy == "zero":
        due = status == DUE
        data = np.where(due[..., None] if data.ndim > status.ndim else due, np.uint64(0), data)
    return data


def _check_words(check: Any, data: np.ndarray, bits: int, check_bits: int) -> np.ndarray:
    c = _words(check, "check", check_bits)
    shape = _checks_like(data, bits)
    if c.shape != shape:
        raise ArgumentError("check", check, f"one check word per data word ({shape})",
                            tail=f", got shape {c.shape}")
    return c


def _policy(policy: Any) -> str:
    return check_choice(policy, POLICIES, "policy")


class _Scheme:
    """What every scheme shares: its overhead and its dict form."""

    kind: ClassVar[str]

    def check_bits(self, data_bits: int) -> int:
        raise NotImplementedError

    def overhead(self, data_bits: int) -> float:
        """Check bits per data bit (storage overhead): 7/32 for SEC-DED (39,32)."""
        return self.check_bits(data_bits) / _data_bits(data_bits)

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": ...}`` plus the policy of a scheme that detects."""
        policy = getattr(self, "policy", None)
        return {"kind": self.kind} if policy is None else {"kind": self.kind, "policy": policy}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | str) -> Protection:
        """The scheme ``to_dict`` wrote (of any kind: ``protection_from_dict``)."""
        return protection_from_dict(d)


@dataclass(frozen=True)
class NoProtection(_Scheme):
    """No check bits: every fault reaches the data, nothing is detected."""

    kind: ClassVar[str] = "none"

    def check_bits(self, data_bits: int) -> int:
        """0: no check bit is stored."""
        _data_bits(data_bits)
        return 0


    def encode(self, data: Any, data_bits: int) -> np.ndarray:
        """Zero check words, one per data word."""
        bits = _data_bits(data_bits)
        d = _words(data, "data", bits)
        return np.zeros(_checks_like(d, bits), np.uint64)

    def decode(self, data: Any, check: Any, data_bits: int) -> tuple[np.ndarray, np.ndarray]:
        """The received data as is, every status ``OK``."""
        bits = _data_bits(data_bits)
        d = _words(data, "data", bits)
        return d.copy(), np.zeros(_checks_like(d, bits), np.uint8)



@dataclass(frozen=True)
class Parity(_Scheme):
    """One even-parity bit per word: detects every odd-weight error, misses every even one."""

    policy: str = "flag"
    kind: ClassVar[str] = "parity"

    def __post_init__(self) -> None:
        _policy(self.policy)

    def check_bits(self, data_bits: int) -> int:
        """1: the parity bit."""
        _data_bits(data_bits)
        return 1


    def encode(self, data: Any, data_bits: int) -> np.ndarray:
        """The parity bit of each data word (the stored word then has even weight)."""
        return parity(_words(data, "data", _data_bits(data_bits)))

    def decode(self, data: Any, check: Any, data_bits: int) -> tuple[np.ndarray, np.ndarray]:
        """``DUE`` where the received word has odd weight; the data is never changed but
        by the ``"zero"`` policy."""
        bits = _data_bits(data_bits)
        d = _words(data, "data", bits)
        c = _check_words(check, d, bits, 1)
        status = np.where(parity(d) ^ c, DUE, OK).astype(np.uint8)
        return _apply_policy(d.copy(), status, self.policy), status



@dataclass(frozen=True)
class _Hamming:
    """The tables of one SEC-DED code: check bits, data masks, syndrome -> data bit."""

    r: int
    masks: tuple[Any, ...]  # masks[i]: the data bits check bit i covers (a (lanes,) row wide)
    data_of: np.ndarray  # syndrome -> data bit; -1: a check bit (0: the parity); -2: none
    wide: bool  # words of more than 64 bits: (n, lanes) arrays


_HAMMING: dict[int, _Hamming] = {}


def hamming_positions(data_bits: int) -> tuple[int, list[int]]:
    """``r`` and the 1-based codeword position of each data bit (LSB first)."""
    r = 0
    while (1 << r) < data_bits + r + 1:
        r += 1
    positions = [p for p in range(1, data_bits + r + 1) if p & (p - 1)]
    return r, positions


def _hamming(data_bits: int) -> _Hamming:
    code = _HAMMING.get(data_bits)
    if code is None:
        r, positions = hamming_positions(data_bits)
        ints = [sum(1 << j for j, p in enumerate(positions) if p >> i & 1) for i in range(r)]
        masks = (tuple(ln.from_ints(ints, data_bits)) if ln.is_wide(data_bits)
                 else tuple(np.uint64(m) for m in ints))
        data_of = np.full(1 << r, -2, np.int64)
        data_of[[0, *(1 << i for i in range(r))]] = -1  # 0: the overall parity bit
        data_of[positions] = np.arange(data_bits)
        code = _HAMMING[data_bits] = _Hamming(r, masks, data_of, ln.is_wide(data_bits))
    return code


def _syndrome(code: _Hamming, data: np.ndarray) -> np.ndarray:
    """The Hamming check bits of ``data`` (bit ``i`` = check bit ``i``)."""
    out = np.zeros(data.shape[:-1] if code.wide else data.shape, np.uint64)
    for i, mask in enumerate(code.masks):
        out |= parity(data & mask) << np.uint64(i)
    return out


@dataclass(frozen=True)
class SecDed(_Scheme):
    """Single-error-correcting, double-error-detecting extended Hamming code.

    Check bits ``0..r-1`` are the Hamming check bits (codeword positions 1, 2, 4, ...),
    check bit ``r`` the overall parity: (39,32) stores 7 check bits, (72,64) 8.
    """

    policy: str = "flag"
    kind: ClassVar[str] = "secded"

    def __post_init__(self) -> None:
        _policy(self.policy)

    def check_bits(self, data_bits: int) -> int:
        """``r + 1``: the Hamming check bits and the overall parity bit."""
        return _hamming(_data_bits(data_bits)).r + 1


    def encode(self, data: Any, data_bits: int) -> np.ndarray:
        """The check bits of each data word."""
        bits = _data_bits(data_bits)
        d = _words(data, "data", bits)
        code = _hamming(bits)
        hamming = _syndrome(code, d)
        return hamming | ((parity(d) ^ parity(hamming)) << np.uint64(code.r))

    def decode(self, data: Any, check: Any, data_bits: int) -> tuple[np.ndarray, np.ndarray]:
        """Syndrome decoding: a single error corrected, a double one a ``DUE``, three or
        more whatever the syndrome says (possibly a miscorrection, reported ``CORRECTED``)."""
        bits = _data_bits(data_bits)
        code = _hamming(bits)
        d = _words(data, "data", bits)
        c = _check_words(check, d, bits, code.r + 1)
        syndrome = _syndrome(code, d) ^ (c & _low(code.r))
        odd = (parity(d) ^ parity(c)).astype(bool)
        target = code.data_of[syndrome.astype(np.int64)]
        status = np.full(c.shape, OK, np.uint8)
        status[odd] = CORRECTED  # a single error: in a data bit, a check bit or the parity
        status[odd & (target == -2)] = DUE  # the syndrome names no position of the code
        status[~odd & (syndrome != 0)] = DUE  # an even number of errors
        fix = odd & (target >= 0)
        out = d.copy()
        if ln.is_wide(bits):
            rows = np.flatnonzero(fix.reshape(-1))
            lane, shift = np.divmod(target.reshape(-1)[rows], ln.LANE)
            flat = out.reshape(-1, out.shape[-1])
            flat[rows, lane] ^= _ONE << shift.astype(np.uint64)
        else:
            out[fix] ^= _ONE << target[fix].astype(np.uint64)
        return _apply_policy(out, status, self.policy), status



Protection = NoProtection | Parity | SecDed
SCHEMES: dict[str, type] = {"none": NoProtection, "parity": Parity, "secded": SecDed}


def protection_from_dict(d: Mapping[str, Any] | str) -> Protection:
    """A scheme from its ``to_dict`` form (or its kind name alone)."""
    if isinstance(d, str):
        d = {"kind": d}
    if not isinstance(d, Mapping):
        raise ArgumentTypeError("protection", d, "a mapping with a 'kind' or a kind name")
    kind = check_choice(d.get("kind"), tuple(SCHEMES), "protection.kind")
    keys = ("kind",) if kind == "none" else ("kind", "policy")
    extra = sorted(set(d) - set(keys))
    if extra:
        raise ArgumentError("protection", dict(d), f"a mapping with keys {keys}",
                            tail=f", got unknown keys {extra}")
    return SCHEMES[kind](**{k: v for k, v in d.items() if k != "kind"})


__all__ = ["CORRECTED", "DUE", "OK", "POLICIES", "SCHEMES", "NoProtection", "Parity",
           "Protection", "SecDed", "hamming_positions", "parity", "protection_from_dict"]
