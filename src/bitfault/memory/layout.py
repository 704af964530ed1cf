"""WordLayout: how one plane's element words pack into memory words and rows.

A plane's elements (each one word of ``bits`` bits of its format, ``bits`` <= 32) are
taken flat, in C order, ``word_bits // bits`` to a memory word: element ``j`` of the
plane is element ``i = j % per_word`` of memory word ``j // per_word`` and sits in bits
``[i * bits, (i + 1) * bits)`` of it, LSB first (eight int8 codes or two float32 values
per 64-bit word; element 0 in the low bits). A word width that does not hold a whole
number of elements is refused. The last word of a plane is padded with zero elements
that no tensor element uses. Memory words form rows of ``row_words`` words (``None``:
the whole plane is one row); rows matter to column and row fault patterns.

The memory word here is the data part (``word_bits`` 8..256 bits): up to 64 bits one
``uint64`` (arrays ``(n,)``), wider words ``(n, lanes)`` uint64 lanes, LSB first
(``bitfault.memory.lanes``: 16 int8 codes or 4 float32 values per 128-bit word, two lanes); a
protection code adds its check bits beside it (``bitfault.memory.codes``).

Interleaving (``interleave=d``, default 1): ``d`` consecutive code words (a group:
words ``g*d .. g*d+d-1``) share one physical segment bit by bit, so physical bit ``q``
of group ``g`` is physical bit ``q // d`` of word ``g*d + q % d`` (a code word's physical
bits: its data bits, then its check bits). Physically adjacent bits then belong to
different code words. Patterns that are physical in extent (multi-bit upsets, columns)
read ``d``; a plane whose last group is short leaves its missing words empty (faults
there hit no word of the plane). ``row_words`` must be a multiple of ``d``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError, check_int
from bitfault.memory import lanes as ln

MAX_ELEMENT_BITS = 32
_KEYS = ("word_bits", "row_words", "interleave")


@dataclass(frozen=True)
class WordLayout:
    """Memory words of ``word_bits`` data bits (8..256) in rows of ``row_words`` words,
    ``interleave`` code words bit-interleaved per physical segment."""

    word_bits: int = 64
    row_words: int | None = None
    interleave: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "word_bits",
                           check_int(self.word_bits, "word_bits", 8, ln.MAX_WORD_BITS))
        if self.row_words is not None:
            object.__setattr__(self, "row_words", check_int(self.row_words, "row_words", 1))
        object.__setattr__(self, "interleave",
                           check_interleave(self.interleave, self.row_words))

    @property
    def lanes(self) -> int:
        """uint64 lanes per memory word (1 up to 64 bits: then arrays are ``(n,)``)."""
        return ln.lanes(self.word_bits)

    # ---- sizes --------------------------------------------------------------------------

    def per_word(self, bits: int) -> int:
        """How many ``bits``-bit elements one memory word holds; ArgumentError (naming
        ``word_bits``) if the word does not hold a whole number of them."""
        bits = check_int(bits, "bits", 1, MAX_ELEMENT_BITS)
        if self.word_bits % bits:
            raise ArgumentError(
                "word_bits", self.word_bits, f"a multiple of the element width ({bits} bits)",
                requirement=f"word_bits must hold a whole number of {bits}-bit elements "
                            f"(a multiple of {bits})", tail=f", got {self.word_bits}")
        return self.word_bits // bits

    def n_words(self, n: int, bits: int) -> int:
        """Memory words a plane of ``n`` elements of ``bits`` bits takes (the last padded)."""
        k = self.per_word(bits)
        return -(-check_int(n, "n", 0) // k)

    def n_rows(self, n_words: int) -> int:
        """Rows ``n_words`` memory words take (the last one may be short)."""
        n_words = check_int(n_words, "n_words", 0)
        if self.row_words is None:
            return 1 if n_words else 0
        return -(-n_words // self.row_words)

    def row_length(self, n_words: int) -> int:
        """Words in a (full) row of a plane of ``n_words`` words."""
        return max(n_words, 1) if self.row_words is None else self.row_words

    def used_mask(self, word: int, n: int, bits: int) -> int:
        """The bits of memory word ``word`` that hold elements of a plane of ``n`` elements
        (all ``word_bits`` but in the padded last word)."""
        k = self.per_word(bits)
        used = min(max(n - word * k, 0), k)
        return (1 << (used * bits)) - 1

    # ---- data -----------------------------------------------------------------------------

    def pack(self, words: Any, bits: int, which: Any = None) -> np.ndarray:
        """The memory words of a plane (uint64 ``(n,)``; ``(n, lanes)`` above 64 bits): its
        elements' low ``bits`` bits, flat in C order, ``per_word(bits)`` to a word, element
        0 in the low bits. ``which``: only the memory words at these indices (at the cost
        of those words alone)."""
        k = self.per_word(bits)
        arr = np.asarray(words)
        if arr.dtype.kind not in "iu":
            raise ArgumentTypeError("words", words, "an integer array (a format's words)",
                                    tail=f", got dtype {arr.dtype}")
        flat = arr.reshape(-1)
        n_words = -(-flat.size // k)
        if which is None:  # every word: the elements in order, zero padding at the end
            values = np.zeros(n_words * k, np.uint64)
            values[:flat.size] = flat.astype(np.int64).view(np.uint64)
            values = values.reshape(n_words, k)
        else:
            w = np.asarray(which, dtype=np.int64).reshape(-1)
            if w.size and (w.min() < 0 or w.max() >= n_words):
                raise ArgumentError("which", which, f"memory word indices in 0..{n_words - 1}")
            elements = w[:, None] * k + np.arange(k)
            inside = elements < flat.size  # the last word's padding elements are zero
            values = np.zeros(elements.shape, np.uint64)
            values[inside] = flat[elements[inside]].astype(np.int64).view(np.uint64)
        values &= np.uint64((1 << bits) - 1)
        if ln.is_wide(self.word_bits):
            return ln.join_fields(values, bits, self.lanes)
        shifts = np.arange(k, dtype=np.uint64) * np.uint64(bits)
        return np.bitwise_or.reduce(values << shifts, axis=1)

    def unpack(self, memory_words: Any, bits: int, n: int) -> np.ndarray:
        """The first ``n`` element patterns (uint64, the unsigned ``bits``-bit words) held
        in ``memory_words``; the inverse of ``pack`` up to the container's sign."""
        parts = self.fields(memory_words, bits)
        n = check_int(n, "n", 0, parts.size)
        return parts.reshape(-1)[:n]

    def fields(self, memory_words: Any, bits: int) -> np.ndarray:
        """The ``(n_words, per_word(bits))`` element patterns (uint64) of memory words
        (``(n,)`` uint64, or ``(n, lanes)`` for words wider than 64 bits)."""
        k = self.per_word(bits)
        mem = np.asarray(memory_words, dtype=np.uint64)
        if ln.is_wide(self.word_bits):
            if mem.ndim != 2 or mem.shape[1] != self.lanes:
                raise ArgumentError("memory_words", memory_words,
                                    f"an (n, {self.lanes}) uint64 array of "
                                    f"{self.word_bits}-bit words", tail=f", got {mem.shape}")
            return ln.split_fields(mem, bits, k)
        mem = mem.reshape(-1)
        shifts = np.arange(k, dtype=np.uint64) * np.uint64(bits)
        return (mem[:, None] >> shifts) & np.uint64((1 << bits) - 1)

    # ---- index maps -------------------------------------------------------------------------

    def element_bit(self, word: Any, bit: Any, bits: int) -> tuple[np.ndarray, np.ndarray]:
        """(element, bit of the element) of data bit ``bit`` of memory word ``word``."""
        k = self.per_word(bits)
        w = np.asarray(word, dtype=np.int64)
        b = np.asarray(bit, dtype=np.int64)
        if b.size and (b.min() < 0 or b.max() >= self.word_bits):
            raise ArgumentError("bit", bit, f"data bits 0..{self.word_bits - 1} of a word")
        return w * k + b // bits, b % bits

    def memory_bit(self, element: Any, bit: Any, bits: int) -> tuple[np.ndarray, np.ndarray]:
        """(memory word, bit of the word) of bit ``bit`` of element ``element``."""
        k = self.per_word(bits)
        e = np.asarray(element, dtype=np.int64)
        b = np.asarray(bit, dtype=np.int64)
        if b.size and (b.min() < 0 or b.max() >= bits):
            raise ArgumentError("bit", bit, f"element bits 0..{bits - 1}")
        return e // k, (e % k) * bits + b

    def row_of(self, word: Any) -> np.ndarray:
        """The row of each memory word."""
        w = np.asarray(word, dtype=np.int64)
        return np.zeros_like(w) if self.row_words is None else w // self.row_words

    # ---- dict form -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """``word_bits``, ``row_words`` and ``interleave`` (left out when 1, so layouts
        from before interleaving keep their digests)."""
        out: dict[str, Any] = {"word_bits": self.word_bits, "row_words": self.row_words}
        if self.interleave != 1:
            out["interleave"] = self.interleave
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WordLayout:
        """The layout ``to_dict`` wrote."""
        if not isinstance(d, Mapping):
            raise ArgumentTypeError("layout", d, f"a mapping with keys of {_KEYS}")
        extra = sorted(set(d) - set(_KEYS))
        if extra:
            raise ArgumentError("layout", dict(d), f"a mapping with keys of {_KEYS}",
                                tail=f", got unknown keys {extra}")
        return cls(**d)


def check_interleave(interleave: Any, row_words: int | None) -> int:
    """``interleave`` as an int >= 1 that divides ``row_words`` (when rows are given)."""
    d = check_int(interleave, "interleave", 1)
    if row_words is not None and row_words % d:
        raise ArgumentError("interleave", interleave, f"a divisor of row_words ({row_words})",
                            requirement=f"interleave must divide row_words: a row of "
                                        f"{row_words} words holds whole groups of "
                                        f"interleaved words", tail=f", got {interleave}")
    return d


__all__ = ["WordLayout", "check_interleave"]
