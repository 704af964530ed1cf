"""The stored tensors a worst-case search flips bits in, and what each flip would do.

``SearchedTensor`` keeps one tensor's clean stored words per plane (the format's
encoding of the clean values) and the flips chosen so far. ``values`` decodes the
tensor with those flips through ``StoredArray.faulty``, so a reported step is what
``bitfault.inject`` gives for the exported map, bit for bit. ``bit_deltas`` flips one bit
position in every word of a plane at once (each word's effect is its own: an element's
code changes that element, a block scale that block's elements) and returns, per word,
the value changes, from which the search ranks candidates by gradient times change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bitfault.faults.models import BitFlip
from bitfault.formats import is_block_format, plane_formats
from bitfault.formats.blocks import CODES, plane_map_name
from bitfault.maps import FaultMap
from bitfault.memory.memory import StoredArray


@dataclass(frozen=True, order=True)
class Flip:
    """One stored bit: ``tensor``'s ``plane``, flat ``element`` in that plane's own layout
    (for ``codes``: the tensor's flat element index), ``bit`` 0 the word's least
    significant bit. The fields a fault map records."""

    tensor: str
    plane: str
    element: int
    bit: int

    def to_dict(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "plane": self.plane, "element": self.element,
                "bit": self.bit}


@dataclass
class SearchedTensor:
    """One tensor of the searched model: its clean values, stored in ``fmt``."""

    name: str
    clean: np.ndarray
    fmt: Any
    stored: Any = field(init=False)
    words: dict[str, np.ndarray] = field(init=False)  # clean stored words per plane, flat
    shapes: dict[str, tuple[int, ...]] = field(init=False)
    flips: dict[str, dict[int, int]] = field(init=False)  # plane -> element -> XOR mask

    def __post_init__(self) -> None:
        self.stored = StoredArray.of(self.clean, self.fmt)
        if is_block_format(self.fmt):
            planes = self.fmt.encode(self.clean)
            self.words = {p: np.asarray(w).reshape(-1).astype(np.int64) for p, w in
                          planes.items()}
            self.shapes = dict(self.fmt.plane_shapes(self.clean.shape))
        else:
            words = np.asarray(self.stored.words)
            unsigned = words.view(f"u{words.dtype.itemsize}")
            self.words = {CODES: unsigned.astype(np.int64)}
            self.shapes = {CODES: tuple(self.clean.shape)}
        self.flips = {p: {} for p in self.words}

    @property
    def planes(self) -> dict[str, Any]:
        """Each plane's format (one plane, ``codes``, for a scalar format)."""
        return plane_formats(self.fmt)

    def add(self, flip: Flip) -> None:
        masks = self.flips[flip.plane]
        masks[flip.element] = masks.get(flip.element, 0) ^ (1 << flip.bit)
        if not masks[flip.element]:
            del masks[flip.element]

    def fault_map(self, extra: dict[str, np.ndarray] | None = None) -> FaultMap:
        """The flips so far as a fault map (block formats: other planes in ``planes``);
        ``extra``: dense XOR masks per plane applied on top (one candidate bit everywhere)."""
        maps = {}
        for plane, shape in self.shapes.items():
            masks = np.zeros(int(np.prod(shape)), np.uint64)
            chosen = self.flips[plane]
            if chosen:
                masks[list(chosen)] = list(chosen.values())
            if extra is not None and plane in extra:
                masks ^= extra[plane].astype(np.uint64)
            idx = np.flatnonzero(masks)
            maps[plane] = FaultMap(shape, idx, masks[idx].astype(np.uint32),
                                   plane_map_name(self.name, plane))
        codes = maps.pop(CODES)
        meta = {"source": "worst_case", "format": self.fmt.to_dict()}
        return FaultMap(codes.shape, codes.indices, codes.masks, self.name, meta, maps)

    def values(self, fmap: FaultMap | None = None) -> np.ndarray:
        """The tensor as stored and read back with the flips (or ``fmap``)."""
        return self.stored.faulty(BitFlip(), self.fault_map() if fmap is None else fmap)

    def current_bits(self, plane: str) -> np.ndarray:
        """The stored words of ``plane`` now (clean XOR the flips), flat int64."""
        words = self.words[plane].copy()
        for element, mask in self.flips[plane].items():
            words[element] ^= mask
        return words

    def word_of_element(self, plane: str) -> np.ndarray | None:
        """For each element of the tensor (flat), the word of ``plane`` holding what
        decodes it: None for the codes (an element is its own word), the block index for
        a per-block plane, 0 for a per-tensor plane."""
        if plane == CODES:
            return None
        if self.stored.__class__.__name__ != "StoredBlocks":
            return None
        per = {p.name: p.per for p in self.fmt.planes}[plane]
        if per == "tensor":
            return np.zeros(self.clean.size, np.int64)
        block_of_word = self.stored.plane_block[plane]  # plane word -> block
        word_of_block = np.empty(block_of_word.max() + 1, np.int64)
        word_of_block[block_of_word] = np.arange(block_of_word.size)
        return word_of_block[self.stored.element_block]

    def bit_deltas(self, plane: str, bit: int, now: np.ndarray) -> np.ndarray:
        """The value change of every element (flat, float64) when bit ``bit`` of every
        word of ``plane`` flips on top of the flips so far (``now``: the values now)."""
        if not is_block_format(self.fmt):  # one decode of every word with the bit flipped
            words = self.current_bits(plane) ^ (1 << bit)
            container = np.asarray(self.stored.words).dtype
            words = words.astype(f"u{container.itemsize}").view(container)
            after = self.fmt.decode(words, self.stored.params, dtype=self.clean.dtype)
            return after.reshape(-1).astype(np.float64) - now.reshape(-1).astype(np.float64)
        size = int(np.prod(self.shapes[plane]))
        extra = {plane: np.full(size, 1 << bit, np.uint64)}
        after = self.values(self.fault_map(extra)).reshape(-1).astype(np.float64)
        return after - now.reshape(-1).astype(np.float64)


__all__ = ["Flip", "SearchedTensor"]
