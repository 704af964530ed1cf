"""Apply a fault map to an array: encode, fault the stored words, decode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.faults import FaultModel, _FaultBase
from bitfault.formats import Format, QuantParams, check_float_input, is_format
from bitfault.maps import FaultMap, popcount


@dataclass(frozen=True)
class InjectionStats:
    """What one injection did.

    faults: faulty bits in the map that the fault model may touch;
    changed_bits: bits whose stored value actually changed (a stuck-at fault on a
    bit that already holds its value changes nothing);
    changed_values: elements whose stored word changed;
    saturated: values mapped by the format's overflow policy while encoding
    (out of range, NaN or inf).
    """

    faults: int
    changed_bits: int
    changed_values: int
    saturated: int


def check_map_fits(fmap: FaultMap, shape: tuple[int, ...], fmt: Format,
                   argument: str = "fmap") -> None:
    """Raise ValueError unless ``fmap`` is for a tensor of ``shape`` stored in ``fmt``."""
    if not isinstance(fmap, FaultMap):
        raise TypeError(f"{argument} must be a bitfault.FaultMap, got {type(fmap).__name__}")
    if tuple(fmap.shape) != tuple(shape):
        raise ValueError(f"{argument} {fmap.name!r} is for shape {tuple(fmap.shape)}, the tensor "
                         f"has shape {tuple(shape)}")
    if fmap.masks.size and int(np.bitwise_or.reduce(fmap.masks)) >> fmt.bits:
        raise ValueError(f"{argument} {fmap.name!r} has faults above bit {fmt.bits - 1}, the top "
                         f"bit of a {fmt.bits}-bit word of {type(fmt).__name__}")


def _eligible_faults(fmap: FaultMap, shape: tuple[int, ...], fmt: Format, fault: FaultModel,
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The flat indices of ``fmap``'s elements with a bit ``fault`` may touch, and those bits
    (uint32); checks the fault model and that the map fits ``shape`` in ``fmt``."""
    if not isinstance(fault, _FaultBase):
        raise TypeError(f"fault must be BitFlip() or StuckAt(0|1), got {fault!r}")
    check_map_fits(fmap, shape, fmt)
    masks = fmap.masks & np.uint32(fault.eligible_mask(fmt))
    keep = masks != 0
    return fmap.indices[keep], masks[keep]


def _as_words(masks: np.ndarray, container: np.dtype) -> np.ndarray:
    """uint32 bit masks as words of ``container`` (the same bits)."""
    return masks.astype(f"u{container.itemsize}").view(container)


def fault_words(words: np.ndarray, fmt: Format, fault: FaultModel,
                fmap: FaultMap) -> tuple[np.ndarray, InjectionStats]:
    """Apply ``fault`` at ``fmap``'s bits to a copy of ``words``; also return what changed."""
    idx, masks = _eligible_faults(fmap, words.shape, fmt, fault)
    container = words.dtype
    out = np.array(words, copy=True, order="C")  # C order: reshape(-1) below is a view
    flat = out.reshape(-1)
    before = flat[idx]
    after = fault.apply(before, _as_words(masks, container))
    flat[idx] = after
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
    if not is_format(fmt):
        raise TypeError(f"fmt must be a bitfault format (FixedPoint, IntQuant, Float), got {fmt!r}")
    check_map_fits(fmap, arr.shape, fmt)
    params: QuantParams | None = fmt.calibrate(arr)  # type: ignore[attr-defined]
    words, saturated = fmt.encode_counting(arr, params)  # type: ignore[attr-defined]
    faulty, stats = fault_words(words, fmt, fault, fmap)
    out = fmt.decode(faulty, params, dtype=arr.dtype)
    return out, InjectionStats(stats.faults, stats.changed_bits, stats.changed_values, saturated)


def inject(x: Any, fmt: Format, fault: FaultModel, fmap: FaultMap) -> np.ndarray:
    """The faulty values of ``x``: encode in ``fmt``, apply ``fault`` at ``fmap``, decode.

    Returns a new array of ``x``'s shape and dtype; ``x`` is never modified.
    Every element goes through the format (a weight memory stores all of them);
    only the map's bits are faulted.
    """
    return inject_with_stats(x, fmt, fault, fmap)[0]


@dataclass(frozen=True, eq=False)
class StoredArray:
    """An array stored in a format once, to be faulted by many maps (a campaign's chips).

    ``words`` (flat, the format's container) and ``values`` (flat, decoded, the input's
    dtype) are the fault-free memory; IntQuant's calibration comes from the whole clean
    array, as in ``inject``, and is kept per element. ``faulty_elements`` then costs in
    proportion to a map's faults, with the same bits ``inject`` gives.
    """

    fmt: Format
    shape: tuple[int, ...]
    words: np.ndarray
    values: np.ndarray
    params: QuantParams | None

    @classmethod
    def of(cls, x: Any, fmt: Format) -> StoredArray:
        arr = check_float_input(x)
        if not is_format(fmt):
            raise TypeError(f"fmt must be a bitfault format (FixedPoint, IntQuant, Float), "
                            f"got {fmt!r}")
        params: QuantParams | None = fmt.calibrate(arr)  # type: ignore[attr-defined]
        words = fmt.encode(arr, params).reshape(-1)
        values = fmt.decode(words.reshape(arr.shape), params, dtype=arr.dtype).reshape(-1)
        if params is not None and np.ndim(params.scale):  # per channel: one per element
            params = QuantParams(np.broadcast_to(params.scale, arr.shape).reshape(-1),
                                 np.broadcast_to(params.zero_point, arr.shape).reshape(-1))
        words.flags.writeable = values.flags.writeable = False  # shared by every map
        return cls(fmt, arr.shape, words, values, params)

    def faulty_elements(self, fault: FaultModel,
                        fmap: FaultMap) -> tuple[np.ndarray, np.ndarray]:
        """Flat indices of the elements ``fmap`` faults (bits ``fault`` may touch) and their
        faulty values; every other element keeps its value in ``values``."""
        idx, masks = _eligible_faults(fmap, self.shape, self.fmt, fault)
        words = fault.apply(self.words[idx], _as_words(masks, self.words.dtype))
        params = self.params
        if params is not None and np.ndim(params.scale):
            params = QuantParams(params.scale[idx], params.zero_point[idx])
        return idx, self.fmt.decode(words, params, dtype=self.values.dtype)

    def faulty(self, fault: FaultModel, fmap: FaultMap) -> np.ndarray:
        """``inject(x, fmt, fault, fmap)`` of the stored ``x``, bit for bit."""
        idx, faulty = self.faulty_elements(fault, fmap)
        out = self.values.copy()
        out[idx] = faulty
        return out.reshape(self.shape)


__all__ = ["InjectionStats", "StoredArray", "check_map_fits", "fault_words", "inject",
           "inject_with_stats"]
