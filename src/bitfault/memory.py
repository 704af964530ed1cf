"""Memory: how a tensor is stored (format) and what a fault does to its bits (fault model).

A ``Memory`` is what evaluators, campaigns and stored tensors take where a whole
``FaultSpec`` would carry fields they ignore (rates, seeds, targets); its digest
hashes only what changes a faulty value. ``StoredArray`` is one array stored in a
format once, to be faulted by many maps at the cost of their faults.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.faults import FaultModel, as_fault_model, check_fault_model
from bitfault.formats import Format, QuantParams, check_float_input, format_from_dict, is_format
from bitfault.maps import FaultMap

_KEYS = ("format", "fault")


def check_format(fmt: Any, argument: str = "format") -> Format:
    """``fmt`` if it is a bitfault format; TypeError naming ``argument`` otherwise."""
    if not is_format(fmt):
        raise ArgumentTypeError(argument, fmt, "FixedPoint, IntQuant or Float")
    return fmt


@dataclass(frozen=True)
class Memory:
    """A tensor memory: its number ``format`` and the ``fault`` model of its bits.

    Either may be given in its ``to_dict()`` form. The fault's eligible bits must exist in
    the format (``BitFlip(bits="exponent")`` needs a Float).
    """

    format: Format
    fault: FaultModel

    def __post_init__(self) -> None:
        if isinstance(self.format, Mapping):
            object.__setattr__(self, "format", format_from_dict(dict(self.format)))
        check_format(self.format)
        object.__setattr__(self, "fault", as_fault_model(self.fault))
        self.fault.eligible_bits(self.format)  # validates bit names against the format

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``Memory.from_dict`` rebuilds an equal memory."""
        return {"format": self.format.to_dict(), "fault": self.fault.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Memory:
        if not isinstance(data, Mapping):
            raise ArgumentTypeError("data", data, "a mapping", requirement="a memory must be a "
                                    "mapping", tail=f", got {type(data).__name__}")
        unknown = sorted(set(data) - set(_KEYS))
        missing = [k for k in _KEYS if k not in data]
        if unknown or missing:
            raise ArgumentError("data", data, f"a mapping with exactly the keys {list(_KEYS)}",
                                requirement=f"a memory dict has exactly the keys {list(_KEYS)}; "
                                            f"unknown: {unknown}, missing: {missing}")
        return cls(data["format"], data["fault"])

    def to_json(self) -> str:
        """The stable JSON form (sorted keys, no spaces): what ``digest`` hashes."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """SHA-256 of the stable JSON form: equal memories have equal digests."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()


def check_map_fits(fmap: FaultMap, shape: tuple[int, ...], fmt: Format,
                   argument: str = "fmap") -> None:
    """Raise ArgumentError unless ``fmap`` is for a tensor of ``shape`` stored in ``fmt``."""
    if not isinstance(fmap, FaultMap):
        raise ArgumentTypeError(argument, fmap, "a bitfault.FaultMap",
                                tail=f", got {type(fmap).__name__}")
    if tuple(fmap.shape) != tuple(shape):
        raise ArgumentError(argument, fmap, f"a map for shape {tuple(shape)}",
                            requirement=f"{argument} {fmap.name!r} is for shape "
                                        f"{tuple(fmap.shape)}, the tensor has shape "
                                        f"{tuple(shape)}")
    if fmap.masks.size and int(np.bitwise_or.reduce(fmap.masks)) >> fmt.bits:
        raise ArgumentError(argument, fmap, f"a map of bits 0..{fmt.bits - 1}",
                            requirement=f"{argument} {fmap.name!r} has faults above bit "
                                        f"{fmt.bits - 1}, the top bit of a {fmt.bits}-bit word "
                                        f"of {type(fmt).__name__}")


def eligible_faults(fmap: FaultMap, shape: tuple[int, ...], fmt: Format, fault: FaultModel,
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The flat indices of ``fmap``'s elements with a bit ``fault`` may touch, and those bits
    (uint32); checks the fault model and that the map fits ``shape`` in ``fmt``."""
    check_fault_model(fault)
    check_map_fits(fmap, shape, fmt)
    masks = fmap.masks & np.uint32(fault.eligible_mask(fmt))
    keep = masks != 0
    return fmap.indices[keep], masks[keep]


def masks_as_words(masks: np.ndarray, container: np.dtype) -> np.ndarray:
    """uint32 bit masks as words of ``container`` (the same bits)."""
    return masks.astype(f"u{container.itemsize}").view(container)


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
            raise ArgumentTypeError("fmt", fmt, "a bitfault format (FixedPoint, IntQuant, Float)")
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
        idx, masks = eligible_faults(fmap, self.shape, self.fmt, fault)
        words = fault.apply(self.words[idx], masks_as_words(masks, self.words.dtype))
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


__all__ = ["Memory", "StoredArray", "check_format", "check_map_fits", "eligible_faults",
           "masks_as_words"]
