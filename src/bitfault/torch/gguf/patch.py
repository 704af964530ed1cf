"""Writing a GGUF tensor's faulty elements alone into a transformers model's parameter.

A fault in a stored block (a code, a block's fp16 scale or minimum) changes the values of
that block only, and a fault in an F32/F16 word changes that element only; so a trial needs
only those blocks decoded and only those elements written, at a cost in proportion to the
faults, not to the model. Where a value lands in the parameter comes from transformers'
own GGUF processing: ``ElementPlaces.of`` runs the processor once on the tensor's element
indices (float64, exact), so a processor that only moves values (llama's q/k row
un-permutation, GPT-2's transposes) gives each parameter the GGUF index each of its
elements comes from. A processor that computes on the values (e.g. adds a constant to a
norm) gives no such index map: those tensors take the whole-tensor path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.faults.models import FaultModel
from bitfault.files.gguf_memory import StoredGGUF
from bitfault.formats import BlockFormat, plane_formats
from bitfault.formats.blocks import CODES
from bitfault.inject import faults_at
from bitfault.maps import FaultMap


@dataclass(frozen=True, eq=False)
class ElementPlaces:
    """Per parameter, where GGUF element ``s`` (flat) lands: ``None`` (at ``s`` itself) or
    an int array ``at`` with ``at[s]`` the flat parameter position."""

    places: dict[str, np.ndarray | None]

    @classmethod
    def of(cls, values: Callable[[np.ndarray], Mapping[str, np.ndarray]],
           shape: tuple[int, ...]) -> ElementPlaces | None:
        """The places ``values`` (GGUF values -> parameter values) gives a tensor of
        ``shape``; None when it does more than move each value to one place."""
        n = int(np.prod(shape))
        source = np.arange(n, dtype=np.float64)
        places: dict[str, np.ndarray | None] = {}
        for hf_name, out in values(source.reshape(shape)).items():
            got = np.asarray(out).reshape(-1)
            if got.dtype != np.float64 or got.size != n:
                return None
            if np.array_equal(got, source):  # where it was: no index map to keep
                places[hf_name] = None
                continue
            index = got.astype(np.int64)
            if not np.array_equal(index, got) or index.min(initial=0) < 0 or \
                    index.max(initial=0) >= n or np.unique(index).size != n:
                return None  # computed on the values, or not one place each
            at = np.empty(n, np.int32 if n < 2**31 else np.int64)
            at[index] = np.arange(n, dtype=at.dtype)
            places[hf_name] = at
        return cls(places)

    def positions(self, hf_name: str, elements: np.ndarray) -> np.ndarray:
        at = self.places[hf_name]
        return elements if at is None else at[elements].astype(np.int64)


def faulty_elements(t: StoredGGUF, fmap: FaultMap, fault: FaultModel
                    ) -> tuple[np.ndarray, np.ndarray, int, int] | None:
    """(flat GGUF elements, their faulty float32 values, faults, changed words) of
    ``t`` under ``fmap``, decoding only the blocks the faults touch; None when ``t``'s
    blocks do not lie along its last axis (the whole-tensor path then applies)."""
    fmt = t.format
    formats = plane_formats(fmt)
    changed: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    faults = changes = 0
    for plane, words in t.planes.items():
        idx, before, after, masks = faults_at(words, fmt, fault, fmap, plane)
        differ = before != after
        faults += int(np.bitwise_count(masks).sum())
        changes += int(differ.sum())
        changed[plane] = (idx[differ], after[differ])
    if not isinstance(fmt, BlockFormat):
        idx, after = changed[CODES]
        return idx, fmt.decode(after).astype(np.float32).reshape(-1), faults, changes
    k = fmt.block_size
    if fmt.axis not in (-1, len(t.shape) - 1) or t.shape[-1] % k:
        return None
    blocks = np.unique(np.concatenate([changed[CODES][0] // k] + [
        changed[p][0] for p in changed if p != CODES]))
    elements = (blocks[:, None] * k + np.arange(k)).reshape(-1)
    planes = {}
    for plane, words in t.planes.items():
        flat = words.reshape(-1)
        if plane == CODES:
            part = flat[elements].astype(np.int64)
            idx, after = changed[plane]
            part[np.searchsorted(elements, idx)] = after.astype(np.int64)
            planes[plane] = part.reshape(-1, k)
        else:
            part = flat[blocks].astype(np.int64)
            idx, after = changed[plane]
            part[np.searchsorted(blocks, idx)] = after.astype(np.int64)
            planes[plane] = part
    for plane, pf in formats.items():  # bit patterns as encode_blocks gives them
        planes[plane] &= (1 << pf.bits) - 1
    values = fmt.decode_blocks(planes).astype(np.float32).reshape(-1)
    return elements, values, faults, changes


@dataclass
class Written:
    """What a trial wrote into one parameter: flat ``positions`` and the ``clean`` values
    there before (to put back)."""

    parameter: Any
    positions: Any
    clean: Any


__all__ = ["ElementPlaces", "Written", "faulty_elements"]
