"""Apply a fault map to an array: encode, fault the stored words, decode."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.faults.models import FaultModel, check_fault_model
from bitfault.formats import BlockFormat, Format, QuantParams, check_float_input
from bitfault.formats.blocks import CODES
from bitfault.maps import FaultMap, popcount
from bitfault.memory.memory import (
    check_format,
    check_map_fits,
    eligible_faults,
    masks_as_words,
    plane_faults,
)


@dataclass(frozen=True)
class InjectionStats:
    """What one injection did.

    faults: faulty bits in the map that the fault model may touch;
    changed_bits: bits whose stored value actually changed (a stuck-at fault on a
    bit that already holds its value changes nothing);
    changed_values: elements whose stored word changed (for a block format: words of
    every plane);
    saturated: values mapped by the format's overflow policy while encoding
    (out of range, NaN or inf).
    """

    faults: int
    changed_bits: int
    changed_values: int
    saturated: int


def faults_at(words: np.ndarray, fmt: Format, fault: FaultModel, fmap: FaultMap,
              plane: str = CODES) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The words of ``words`` (one plane of a tensor in ``fmt``) that ``fmap`` faults with
    ``fault``: their flat indices, the words before and after, and the masks applied
    (uint32), at the cost of the faults alone; ``words`` is not changed. ``plane``: as
    ``fault_words``'s."""
    if plane == CODES:
        idx, masks = eligible_faults(fmap, words.shape, fmt, fault)
    else:
        check_fault_model(fault)
        idx, masks = plane_faults(fmap, fmt, fault, plane)
    before = np.asarray(words).reshape(-1)[idx]
    return idx, before, fault.apply(before, masks_as_words(masks, words.dtype)), masks


def fault_words(words: np.ndarray, fmt: Format, fault: FaultModel, fmap: FaultMap,
                plane: str = CODES) -> tuple[np.ndarray, InjectionStats]:
    """Apply ``fault`` at ``fmap``'s bits to a copy of ``words``; also return what changed.

    ``plane``: which plane ``words`` are of a block-format tensor (its codes: the map is
    checked against their shape; another plane: the caller has checked the map fits)."""
    idx, before, after, masks = faults_at(words, fmt, fault, fmap, plane)
    container = words.dtype
    out = np.array(words, copy=True, order="C")  # C order: reshape(-1) below is a view
    out.reshape(-1)[idx] = after
    changed = np.bitwise_xor(before, after).view(f"u{container.itemsize}")
    stats = InjectionStats(
        faults=int(popcount(masks).sum()),
        changed_bits=int(popcount(changed.astype(np.uint32)).sum()),
        changed_values=int(np.count_nonzero(changed)),
        saturated=0,
    )
    return out, stats


def inject_with_stats(x: Any, fmt: Format, fault: FaultModel,
                      fmap: FaultMap) -> tuple[np.ndarray, InjectionStats]:
    """``inject`` that also returns an ``InjectionStats``."""
    arr = check_float_input(x)
    check_format(fmt, "fmt")
    check_map_fits(fmap, arr.shape, fmt)
    if isinstance(fmt, BlockFormat):
        return _inject_planes(arr, fmt, fault, fmap)
    params: QuantParams | None = fmt.calibrate(arr)  # type: ignore[attr-defined]
    words, saturated = fmt.encode_counting(arr, params)  # type: ignore[attr-defined]
    faulty, stats = fault_words(words, fmt, fault, fmap)
    out = fmt.decode(faulty, params, dtype=arr.dtype)
    return out, InjectionStats(stats.faults, stats.changed_bits, stats.changed_values, saturated)


def _inject_planes(arr: np.ndarray, fmt: BlockFormat, fault: FaultModel,
                   fmap: FaultMap) -> tuple[np.ndarray, InjectionStats]:
    """Every plane of a block-format tensor faulted by its map, then decoded."""
    faulty, total = {}, InjectionStats(0, 0, 0, 0)
    for plane, words in fmt.encode(arr).items():
        faulty[plane], stats = fault_words(words, fmt, fault, fmap, plane)
        total = InjectionStats(*(a + b for a, b in zip(dataclasses.astuple(total),
                                                      dataclasses.astuple(stats), strict=True)))
    return fmt.decode(faulty, dtype=arr.dtype), total


def inject(x: Any, fmt: Format, fault: FaultModel, fmap: FaultMap) -> np.ndarray:
    """The faulty values of ``x``: encode in ``fmt``, apply ``fault`` at ``fmap``, decode.

    Returns a new array of ``x``'s shape and dtype; ``x`` is never modified.
    Every element goes through the format (a weight memory stores all of them);
    only the map's bits are faulted.
    """
    return inject_with_stats(x, fmt, fault, fmap)[0]


__all__ = ["InjectionStats", "fault_words", "faults_at", "inject", "inject_with_stats"]
