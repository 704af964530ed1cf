"""A stored memory's plane maps: physical draws decoded, for any data or for the stored data.

``plane_map`` draws a memory's pattern over one plane's physical words (data and check
bits), decodes it with the plane's code and returns the element-level ``FaultMap`` every
path applies as bit flips. Under policy ``"flag"`` (or without protection) and with a
pattern that ignores the stored bits, the decoded error depends on the error pattern
alone, so the map holds for any data (``protected.draw_decoded_map``): a weight that
trains keeps it. Two things depend on the stored data:

- policy ``"zero"``: a detected word reads back as 0, whatever it held;
- asymmetric cells (``Asymmetric``): which cells fail depends on the value each holds.

A memory with either is **data-dependent** (``Memory.data_dependent``): its maps exist
only for given clean values. ``plane_map(..., words=)`` then draws with the plane's clean
element words (the stored physical words for asymmetric cells), decodes them, and
returns ``decode_faults(...).xor``: the XOR map turning those clean words into the
decoded ones (its ``meta["data_dependent"]`` is True). Applied to the same values
(``bf.inject``, a campaign's evaluator) it gives exactly what the memory reads back.

``StoredWords`` holds one tensor's clean planes (``fmt.encode`` of its values, with its
own calibration), computed once, and the physical words asymmetric draws read;
``TensorWords`` caches them per tensor of an evaluator for a campaign (the evaluator's
``clean_tensor(name)`` gives the values).

A memory's asymmetric pattern takes its rate from the spec or the trial like every
pattern: ``p10`` and ``p01`` are relative, so at rate ``r`` a stored 1 fails with
probability ``r * p10`` and a stored 0 with ``r * p01`` (``p10=1, p01=0``: only 1 -> 0
errors, at the trial's rate).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.faults.patterns import Asymmetric
from bitfault.formats import BlockFormat, Format, check_float_input
from bitfault.formats.blocks import CODES
from bitfault.maps import FaultMap
from bitfault.memory.codes import Protection
from bitfault.memory.decode import decode_faults, draw_decoded_map, pattern_at, stored_words
from bitfault.memory.layout import WordLayout
from bitfault.memory.selective import Part

DATA_DEPENDENT = (
    "a memory with policy 'zero' or asymmetric cells is data-dependent: what it reads back "
    "depends on the stored values, so its maps are drawn with them (campaigns, "
    "Memory.random_map(values=), spec.map_for(values=), bitfault inject); fault-aware "
    "training and live injection refuse it, since the values change every step")
OUTCOME_KEYS = ("bit_errors", "words", "corrected", "due", "silent", "masked")


def rated(pattern: Any, rate: float) -> Any:
    """``pattern`` drawing at ``rate``: its rate field replaced, or for ``Asymmetric``
    both probabilities scaled by ``rate``."""
    if isinstance(pattern, Asymmetric):
        return dataclasses.replace(pattern, p10=rate * pattern.p10, p01=rate * pattern.p01)
    return pattern_at(pattern, rate)


def depends_on_data(protection: Protection, pattern: Any) -> bool:
    """Whether decoded faults depend on the stored data: policy "zero", asymmetric cells."""
    return getattr(protection, "policy", "flag") == "zero" or isinstance(pattern, Asymmetric)


@dataclass(frozen=True, eq=False)
class StoredWords:
    """One tensor's clean stored planes (``planes``: plane -> element words, as
    ``fmt.encode`` gives them) and, once computed, the physical words of its parts."""

    fmt: Format
    shape: tuple[int, ...]
    planes: dict[str, np.ndarray]
    _physical: dict[Any, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, values: Any, fmt: Format) -> StoredWords:
        """``values`` stored in ``fmt`` (its calibration from ``values``, as ``inject``)."""
        arr = check_float_input(values)
        if isinstance(fmt, BlockFormat):
            planes = {p: np.asarray(w) for p, w in fmt.encode(arr).items()}
        else:
            planes = {CODES: fmt.encode(arr, fmt.calibrate(arr))}  # type: ignore[attr-defined]
        for w in planes.values():
            w.flags.writeable = False
        return cls(fmt, tuple(arr.shape), planes)

    def check(self, shape: tuple[int, ...], fmt: Format) -> StoredWords:
        """Self, if it stores a tensor of ``shape`` in ``fmt``; else ArgumentError."""
        if tuple(shape) != self.shape or fmt != self.fmt:
            raise ArgumentError("words", f"{self.fmt} {self.shape}",
                                f"the stored words of a tensor of shape {tuple(shape)} in "
                                f"{fmt}", tail=f", got {self.fmt} {self.shape}")
        return self

    def physical(self, key: Any, compute: Callable[[], Any]) -> Any:
        """What ``compute`` gives (a part's clean fields, its (data, check) physical
        words), computed once under ``key``."""
        if key not in self._physical:
            self._physical[key] = compute()
        return self._physical[key]


class TensorWords:
    """The clean ``StoredWords`` of an evaluator's tensors in one memory's format, each
    encoded once (from ``evaluator.clean_tensor(name)``), for a campaign's trials."""

    def __init__(self, evaluator: Any, fmt: Format) -> None:
        if not callable(getattr(evaluator, "clean_tensor", None)):
            raise ArgumentError("memory", "data-dependent",
                                "a memory whose faults ignore the stored data, or an "
                                "evaluator with clean_tensor(name)",
                                requirement=f"a data-dependent memory (policy 'zero' or "
                                            f"asymmetric cells) draws each trial's faults "
                                            f"with the stored words, but "
                                            f"{type(evaluator).__name__} has no "
                                            f"clean_tensor(name) giving its clean tensors")
        self._evaluator, self._fmt = evaluator, fmt
        self._words: dict[str, StoredWords] = {}

    def __call__(self, name: str) -> StoredWords:
        if name not in self._words:
            self._words[name] = StoredWords.of(self._evaluator.clean_tensor(name), self._fmt)
        return self._words[name]


def as_stored_words(words: Any, values: Any, shape: tuple[int, ...],
                    fmt: Format) -> StoredWords | None:
    """The ``StoredWords`` a map is drawn with: ``words`` as given, or those of
    ``values`` (of ``shape``), or None."""
    if words is not None:
        if not isinstance(words, StoredWords):
            raise ArgumentTypeError("words", words, "a bitfault.memory.plane_maps.StoredWords")
        return words.check(shape, fmt)
    if values is None:
        return None
    arr = check_float_input(values)
    if tuple(arr.shape) != tuple(shape):
        raise ArgumentError("values", arr.shape, f"an array of shape {tuple(shape)}",
                            tail=f", got shape {tuple(arr.shape)}")
    return StoredWords.of(arr, fmt)


def _draw_part(shape: tuple[int, ...], part: Part, fields: np.ndarray | None, *,
               rate: float, seed: int, name: str, step: int | None, pattern: Any,
               stored: StoredWords | None, key: Any) -> tuple[FaultMap, dict[str, int]]:
    """(map of the part's field masks, outcomes) of one part: drawn from the stream of
    ``name`` (a whole plane) or ``name`` NUL ``part.tag``, decoded by the part's code;
    with ``fields`` (its clean fields) the XOR map for them, else for any data."""
    stream = f"{name}\x00{part.tag}" if part.tag else name
    layout, protection, bits = part.layout, part.protection, part.bits
    if fields is None:
        fmap = draw_decoded_map(shape, bits, rate=rate, seed=seed, name=stream, step=step,
                                layout=layout, protection=protection, pattern=pattern)
        return fmap, dict(fmap.meta["outcomes"])
    physical = None
    if isinstance(pattern, Asymmetric):  # which cells fail depends on what they hold
        def compute() -> tuple[np.ndarray, np.ndarray]:
            return stored_words(fields, bits, layout, protection)
        physical = compute() if stored is None else stored.physical(key, compute)
    interleave = getattr(layout, "interleave", 1)  # passed only when the layout has it
    faults = rated(pattern, rate).draw(
        layout.n_words(math.prod(shape), bits), layout.word_bits,
        protection.check_bits(layout.word_bits), seed=seed, name=stream, step=step,
        row_words=layout.row_words, stored=physical,
        **({"interleave": interleave} if interleave != 1 else {}))
    decoded = decode_faults(fields, bits, layout, protection, faults, name)
    return decoded.xor, decoded.outcomes.to_dict()


def plane_map(shape: tuple[int, ...], bits: int, *, rate: float, seed: int, name: str,
              step: int | None, layout: WordLayout, protection: Protection, pattern: Any,
              parts: tuple[Part, Part] | None = None, words: np.ndarray | None = None,
              stored: StoredWords | None = None, plane: str = CODES) -> FaultMap:
    """The element map of one plane of ``shape`` (``bits``-bit words) named ``name``:
    ``pattern`` at ``rate`` over its physical words, decoded (see the module docstring).

    ``parts``: the plane split by bit position (``selective.split_parts``), each part
    drawn from its own stream and decoded by its own code, the masks merged. ``words``:
    the plane's clean element words, for a data-dependent memory (``stored`` caches their
    physical words); without them such a memory is refused."""
    dependent = depends_on_data(protection, pattern)
    if dependent and words is None:
        raise ArgumentError("storage", {"protection": protection.to_dict(),
                                        "pattern": pattern.to_dict()},
                            "a memory whose decoded faults ignore the stored data, or the "
                            "stored values", requirement=DATA_DEPENDENT)
    if parts is None and not dependent:  # the decoder's error, for any data
        return draw_decoded_map(shape, bits, rate=rate, seed=seed, name=name, step=step,
                                layout=layout, protection=protection, pattern=pattern)
    split = parts or (Part(tuple(range(bits)), layout, protection, ""),)
    indices, masks, total = [], [], dict.fromkeys(OUTCOME_KEYS, 0)
    for part in split:
        fields = None
        if dependent and not part.tag:
            fields = np.asarray(words)
        elif dependent:
            def split(p: Part = part) -> np.ndarray:
                return p.fields(words)
            fields = split() if stored is None else stored.physical(
                ("fields", plane, part.positions), split)
        fmap, outcomes = _draw_part(
            shape, part, fields, rate=rate, seed=seed, name=name, step=step,
            pattern=pattern, stored=stored,
            key=(plane, part.positions, repr(part.layout), repr(part.protection)))
        indices.append(fmap.indices)
        masks.append(part.scatter(fmap.masks) if part.tag else fmap.masks)
        for k in OUTCOME_KEYS:
            total[k] += int(outcomes[k])
    idx, inverse = np.unique(np.concatenate(indices), return_inverse=True)
    merged = np.zeros(idx.size, np.uint32)
    np.bitwise_or.at(merged, inverse, np.concatenate(masks).astype(np.uint32))
    meta = {"source": "protection", "protection": protection.to_dict(),
            "layout": layout.to_dict(), "seed": seed, "step": step, "rate": rate,
            "pattern": rated(pattern, rate).to_dict(), "outcomes": total}
    if parts:
        meta["protected_bits"] = list(parts[0].positions)
    if dependent:
        meta["data_dependent"] = True
    keep = merged != 0
    return FaultMap(shape, idx[keep], merged[keep], name, meta)


__all__ = ["DATA_DEPENDENT", "OUTCOME_KEYS", "StoredWords", "TensorWords", "as_stored_words",
           "depends_on_data", "plane_map", "rated"]
