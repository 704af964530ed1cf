"""Selective protection by bit position: chosen bits of a plane in their own protected words.

A plane of ``b``-bit elements with protected bits ``P`` (``m`` positions, e.g. the sign
and top bits ``(7, 6)`` of int8 codes) is stored as two parts, each a plane of fields:

- the **protected** part: each element's bits at ``P`` as one ``m``-bit field (the
  lowest chosen position in field bit 0, in ascending order), packed densely into memory
  words under the plane's protection scheme;
- the **unprotected** part: the other ``b - m`` bits, likewise, in words without check
  bits.

A part packs ``word_bits // width`` whole fields into a memory word, in the order of
``bitfault.memory.layout``. When the width does not divide ``word_bits`` the part's words are
``(word_bits // width) * width`` bits wide and the leftover bits are not stored, so they
are neither faulted nor covered by the code: 7-bit fields fill 63 of 64 bits, nine to a
word, under SEC-DED (71,63) (8 check bits, as (72,64)); 6-bit fields 60 of 64. Both parts
draw the memory's pattern at the plane's rate, independently: each from its own stream
(the plane map's name NUL ``"protected"`` / ``"unprotected"``, with the seed and step),
so both are reproducible from (seed, name). Each part is decoded by its code, and its
field masks are scattered back to the bits they came from.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.formats.blocks import CODES
from bitfault.memory.codes import NoProtection, Protection
from bitfault.memory.layout import WordLayout

PROTECTED, UNPROTECTED = "protected", "unprotected"
_ALLOWED = "bit positions (a sequence of ints: the codes plane's) or {plane: bit positions}"


def check_protected_bits(value: Any) -> dict[str, tuple[int, ...]] | None:
    """``protected_bits`` as ``{plane: sorted positions}`` (a sequence names the codes
    plane); ArgumentError for empty, duplicate or negative positions."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        if not value:
            raise ArgumentError("protected_bits", value, f"None or {_ALLOWED}",
                                tail=", got an empty mapping")
        items = [(k, v, f"protected_bits[{k!r}]") for k, v in value.items()]
    else:
        items = [(CODES, value, "protected_bits")]
    out = {}
    for plane, bits, argument in items:
        if not isinstance(plane, str):
            raise ArgumentTypeError("protected_bits", value, _ALLOWED,
                                    tail=f", got plane key {plane!r}")
        if isinstance(bits, (str, bytes)) or not isinstance(bits, (Sequence, np.ndarray)):
            raise ArgumentTypeError(argument, bits, "a sequence of bit positions (ints)")
        positions = list(bits)
        if not all(isinstance(b, numbers.Integral) and not isinstance(b, bool)
                   for b in positions):
            raise ArgumentTypeError(argument, bits, "a sequence of bit positions (ints)")
        positions = [int(b) for b in positions]
        if not positions:
            raise ArgumentError(argument, bits, "at least one bit position",
                                requirement=f"{argument} is empty: give the bits to protect, "
                                            "or leave the plane out to store it whole")
        repeated = sorted({b for b in positions if positions.count(b) > 1})
        if repeated:
            raise ArgumentError(argument, bits, "distinct bit positions",
                                tail=f", got {repeated} more than once")
        if min(positions) < 0:
            raise ArgumentError(argument, bits, "bit positions >= 0")
        out[plane] = tuple(sorted(positions))
    return out


@dataclass(frozen=True)
class Part:
    """One part of a split plane: its element ``positions`` (ascending), the ``layout``
    of its fields' words, its ``protection`` and the ``tag`` of its stream."""

    positions: tuple[int, ...]
    layout: WordLayout
    protection: Protection
    tag: str

    @property
    def bits(self) -> int:
        return len(self.positions)

    def fields(self, words: np.ndarray) -> np.ndarray:
        """The part's field (int64, field bit ``i`` = element bit ``positions[i]``) of
        every element word."""
        flat = np.asarray(words).astype(np.int64, copy=False)
        out = np.zeros(flat.shape, np.int64)
        for i, p in enumerate(self.positions):
            out |= ((flat >> p) & 1) << i
        return out

    def scatter(self, masks: np.ndarray) -> np.ndarray:
        """Field masks as element masks (uint32): field bit ``i`` to ``positions[i]``."""
        m = np.asarray(masks, dtype=np.uint32)
        out = np.zeros(m.shape, np.uint32)
        for i, p in enumerate(self.positions):
            out |= ((m >> np.uint32(i)) & np.uint32(1)) << np.uint32(p)
        return out


def part_layout(layout: WordLayout, width: int, argument: str) -> WordLayout:
    """``layout`` with words of ``(word_bits // width) * width`` bits: whole fields only."""
    used = (layout.word_bits // width) * width
    try:
        return dataclasses.replace(layout, word_bits=used)
    except ArgumentError as exc:
        raise ArgumentError(argument, width, f"fields that fill a storable word of "
                            f"{layout.word_bits} bits",
                            requirement=f"{argument}: {width}-bit fields fill {used} of "
                                        f"{layout.word_bits} bits, not a storable word "
                                        f"({exc})") from None


def split_parts(bits: int, positions: tuple[int, ...], layout: WordLayout,
                protection: Protection, plane: str) -> tuple[Part, Part]:
    """The protected and unprotected parts of a plane of ``bits``-bit elements;
    ArgumentError (naming ``protected_bits``) for positions outside the element, all of
    its bits, or a plane without protection."""
    argument = f"protected_bits[{plane!r}]"
    if max(positions) >= bits:
        raise ArgumentError(argument, list(positions), f"bit positions in 0..{bits - 1}",
                            requirement=f"{argument} names bits outside the {bits}-bit "
                                        f"elements of plane {plane!r} (0..{bits - 1})",
                            tail=f", got {list(positions)}")
    if len(positions) == bits:
        raise ArgumentError(argument, list(positions), f"some but not all of 0..{bits - 1}",
                            requirement=f"{argument} names every bit of the element: leave "
                                        "it out to protect the whole plane")
    if isinstance(protection, NoProtection):
        raise ArgumentError(argument, list(positions), "bits of a protected plane",
                            requirement=f"{argument}: plane {plane!r} has no protection "
                                        "scheme, so no bit of it can be protected (give "
                                        "protection= for it)")
    rest = tuple(b for b in range(bits) if b not in positions)
    return (Part(positions, part_layout(layout, len(positions), argument), protection,
                 PROTECTED),
            Part(rest, part_layout(layout, len(rest), argument), NoProtection(), UNPROTECTED))


def split_overhead(bits: int, positions: tuple[int, ...], layout: WordLayout,
                   protection: Protection) -> float:
    """Check bits per data bit of a split plane: the protected part's check bits per
    element over the element's ``bits`` (whole words; the last word's padding aside)."""
    per_word = layout.word_bits // len(positions)
    used = per_word * len(positions)
    return protection.check_bits(used) / per_word / bits


__all__ = ["PROTECTED", "UNPROTECTED", "Part", "check_protected_bits", "part_layout",
           "split_overhead", "split_parts"]
