"""Faults through a protected memory: from physical bit flips to an element-level map.

``decode_faults`` takes a plane's clean element words (its format's words), a
``WordLayout``, a protection scheme and a physical fault draw (``WordFaults``: bit flips
over the data and check bits of memory words). It encodes the check bits of the clean
memory words the faults touch, applies the flips, decodes, and returns the element-level
``FaultMap`` of XOR masks that turns the clean element words into the decoded ones, with
the outcome counts. bitfault's pipeline then applies that map as a ``BitFlip`` map.

Data dependence: every code here is linear, so under the ``"flag"`` policy (and with no
protection) the decoded error depends on the error pattern alone, not on the data: the
map ``flips`` is valid for any data stored in the plane (a weight that trains keeps its
map). The ``"zero"`` policy makes a detected word 0, which depends on the data: those
elements are listed in ``zeroed`` (masks of all their bits, to apply as stuck-at-0) and
left out of ``flips``; ``xor`` folds them in for the clean words given (its mask there is
the clean element itself). For other data, apply ``flips`` then clear ``zeroed``.

The cost is that of the faulty words alone: only they are packed, encoded and decoded.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.faults.patterns import WordFaults
from bitfault.maps.faultmap import FaultMap
from bitfault.memory import lanes as ln
from bitfault.memory.codes import CORRECTED, DUE, NoProtection, Parity, Protection, SecDed
from bitfault.memory.layout import WordLayout


@dataclass(frozen=True)
class Outcomes:
    """What happened to the faulty words of one draw.

    ``bit_errors``: raw physical bits flipped (data and check); ``words``: memory words
    with at least one; of those, ``corrected`` decode to the clean data after a correction,
    ``due`` were detected but not corrected, ``silent`` decode to wrong data without a
    detection (miscorrections included), and ``masked`` to the clean data with nothing
    to correct (flips in padding bits only).
    """

    bit_errors: int
    words: int
    corrected: int
    due: int
    silent: int

    @property
    def masked(self) -> int:
        return self.words - self.corrected - self.due - self.silent

    def to_dict(self) -> dict[str, int]:
        return {"bit_errors": self.bit_errors, "words": self.words,
                "corrected": self.corrected, "due": self.due, "silent": self.silent,
                "masked": self.masked}


@dataclass(frozen=True, eq=False)
class DecodedFaults:
    """Element-level maps of a decoded draw and its outcomes (see the module docstring)."""

    xor: FaultMap
    flips: FaultMap
    zeroed: FaultMap
    outcomes: Outcomes


def _scheme(protection: Any) -> Protection:
    if not isinstance(protection, (NoProtection, Parity, SecDed)):
        raise ArgumentTypeError("protection", protection,
                                "a protection scheme (NoProtection, Parity, SecDed)")
    return protection


def stored_words(words: Any, bits: int, layout: WordLayout, protection: Protection,
                 which: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """The clean physical words of a plane: (data, check) uint64 memory words (only those
    at ``which`` if given; data ``(n, lanes)`` above 64 bits), e.g. for ``Asymmetric``
    patterns, which need the stored bits."""
    data = layout.pack(words, bits, which)
    return data, _scheme(protection).encode(data, layout.word_bits)


def _check_faults(faults: Any, n_words: int, data_bits: int, check_bits: int) -> WordFaults:
    if not isinstance(faults, WordFaults):
        raise ArgumentTypeError("faults", faults, "a WordFaults (a pattern's draw)")
    if len(faults) and faults.indices[-1] >= n_words:
        raise ArgumentError("faults", faults, f"word indices in 0..{n_words - 1}",
                            tail=f", got {int(faults.indices[-1])}")
    lanes = ln.lanes(data_bits)
    if faults.lanes != lanes and len(faults):
        raise ArgumentError("faults", faults, f"data masks of {lanes} uint64 lane(s) "
                            f"({data_bits}-bit words)", tail=f", got {faults.lanes}")
    for part, width in (("data", data_bits), ("check", check_bits)):
        masks = getattr(faults, part)
        if masks.ndim == 2:  # wide: the top lane holds the last bits
            masks, width = masks[:, -1], data_bits - ln.LANE * (lanes - 1)
        if width < 64 and masks.size and int(masks.max()) >> width:
            raise ArgumentError("faults", faults, f"{part} masks of {width} bits",
                                tail=f", got {int(masks.max()):#x}")
    return faults


def _element_map(shape: tuple[int, ...], words: np.ndarray, errors: np.ndarray,
                 layout: WordLayout, bits: int, name: str, meta: dict[str, Any]) -> FaultMap:
    """The FaultMap of the elements that ``errors`` (one per memory word) touch."""
    k = layout.per_word(bits)
    masks = layout.fields(errors, bits)
    elements = words[:, None] * k + np.arange(k, dtype=np.int64)
    keep = masks != 0
    return FaultMap(shape, elements[keep], masks[keep].astype(np.uint32), name, meta)


def decode_faults(words: Any, bits: int, layout: WordLayout, protection: Protection,
                  faults: WordFaults, name: str = "") -> DecodedFaults:
    """Encode, fault (flip), decode: the element maps and outcomes of one fault draw.

    ``words``: the plane's clean element words (any shape, flat in C order); ``bits``:
    the element width of its format; ``faults``: bit flips over memory words of
    ``layout.word_bits`` data bits and ``protection.check_bits(layout.word_bits)`` check
    bits. Nothing given is changed.
    """
    if not isinstance(layout, WordLayout):
        raise ArgumentTypeError("layout", layout, "a WordLayout")
    scheme = _scheme(protection)
    arr = np.asarray(words)
    k = layout.per_word(bits)
    data_bits = layout.word_bits
    n_words = -(-arr.size // k)
    faults = _check_faults(faults, n_words, data_bits, scheme.check_bits(data_bits))
    clean, check = stored_words(arr, bits, layout, scheme, faults.indices)
    return _decoded(arr.shape, bits, layout, scheme, faults, name, clean, check)


def _decoded(shape: tuple[int, ...], bits: int, layout: WordLayout, scheme: Protection,
             faults: WordFaults, name: str, clean: np.ndarray, check: np.ndarray,
             more_meta: dict[str, Any] | None = None) -> DecodedFaults:
    """``decode_faults`` once the clean physical words of the faulty words are known
    (``more_meta``: added to the maps' meta, with the outcomes)."""
    data_bits = layout.word_bits
    n = math.prod(shape)
    n_words = layout.n_words(n, bits)
    which = faults.indices
    decoded, status = scheme.decode(clean ^ faults.data, check ^ faults.check, data_bits)
    wide = ln.is_wide(data_bits)
    full = ln.low_mask(data_bits)
    used = np.broadcast_to(full, (which.size, *np.shape(full))).copy()
    if which.size and which[-1] == n_words - 1:  # the padded last word
        last = layout.used_mask(n_words - 1, n, bits)
        used[-1] = ln.from_ints([last], data_bits)[0] if wide else np.uint64(last)
    errors = (decoded ^ clean) & used
    wrong = errors.any(axis=1) if wide else errors != 0
    due = status == DUE
    outcomes = Outcomes(bit_errors=faults.bit_errors(), words=int(which.size),
                        corrected=int(((status == CORRECTED) & ~wrong).sum()),
                        due=int(due.sum()), silent=int((~due & wrong).sum()))
    meta = {"source": "protection", "protection": scheme.to_dict(),
            "layout": layout.to_dict()}
    if more_meta is not None:
        meta.update(more_meta, outcomes=outcomes.to_dict())
    xor = _element_map(shape, which, errors, layout, bits, name, meta)
    zero = due if getattr(scheme, "policy", "flag") == "zero" else None
    if zero is None or not zero.any():  # nothing zeroed: flips are the XOR map
        empty = np.zeros(0, np.int64)
        return DecodedFaults(xor, xor, FaultMap(shape, empty, empty.astype(np.uint32), name,
                                                meta), outcomes)
    flips = _element_map(shape, which[~zero], errors[~zero], layout, bits, name, meta)
    zeroed = _element_map(shape, which[zero], used[zero], layout, bits, name, meta)
    return DecodedFaults(xor, flips, zeroed, outcomes)


# ---- a memory's maps: physical faults, decoded, as element-level flip maps ---------------

RATE_FIELDS = {"independent": "ber", "mbu": "rate", "column": "rate", "row": "rate"}
"""The field of each pattern kind that a spec's or a campaign trial's rate sets."""


def pattern_at(pattern: Any, rate: float) -> Any:
    """``pattern`` drawing at ``rate`` (its rate field replaced)."""
    field = RATE_FIELDS.get(getattr(pattern, "kind", None))
    if field is None:
        raise ArgumentError("pattern", pattern, f"a pattern of kind {tuple(RATE_FIELDS)}",
                            requirement="a memory's pattern takes its rate from the spec or "
                                        "the trial; 'asymmetric' needs the stored bits and "
                                        "is drawn with decode_faults directly")
    return dataclasses.replace(pattern, **{field: rate})


def draw_decoded_map(shape: tuple[int, ...], bits: int, *, rate: float, seed: int, name: str,
                     step: int | None, layout: WordLayout, protection: Protection,
                     pattern: Any) -> FaultMap:
    """The element-level flip map of one plane of ``shape`` (``bits``-bit words) stored in
    ``layout`` under ``protection``: ``pattern`` drawn at ``rate`` over the physical words
    (data and check bits), decoded by the real decoder; its ``meta["outcomes"]`` counts
    what the decoder did. Data-independent (policy "flag"): valid for any stored data."""
    scheme = _scheme(protection)
    if getattr(scheme, "policy", "flag") != "flag":
        raise ArgumentError("protection.policy", scheme.policy, "'flag'",
                            requirement="a detected word zeroed (policy 'zero') depends on the "
                                        "stored data; memories take policy 'flag' (use "
                                        "decode_faults for 'zero')")
    n_words = layout.n_words(math.prod(shape), bits)
    drawn = pattern_at(pattern, rate)
    faults = drawn.draw(
        n_words, layout.word_bits, scheme.check_bits(layout.word_bits), seed=seed, name=name,
        step=step, row_words=layout.row_words, interleave=layout.interleave)
    # every code is linear: the clean words may be 0 (whose check bits are 0), unpacked
    clean = np.zeros(faults.data.shape, np.uint64)
    more = {"seed": seed, "step": step, "rate": rate, "pattern": drawn.to_dict()}
    return _decoded(tuple(shape), bits, layout, scheme, faults, name, clean,
                    np.zeros(len(faults), np.uint64), more).flips


__all__ = ["RATE_FIELDS", "DecodedFaults", "Outcomes", "decode_faults", "draw_decoded_map",
           "pattern_at", "stored_words"]
