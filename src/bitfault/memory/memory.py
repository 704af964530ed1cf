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

from bitfault.errors import ArgumentError, ArgumentTypeError, check_choice
from bitfault.faults.models import BitFlip, FaultModel, as_fault_model, check_fault_model
from bitfault.formats import (
    BlockFormat,
    Format,
    QuantParams,
    check_float_input,
    format_from_dict,
    is_format,
    plane_formats,
)
from bitfault.formats.base import cast_quietly
from bitfault.formats.blocks import CODES
from bitfault.maps import FaultMap, check_map_format

_KEYS = ("format", "fault")


def check_format(fmt: Any, argument: str = "format") -> Format:
    """``fmt`` if it is a bitfault format; TypeError naming ``argument`` otherwise."""
    if not is_format(fmt):
        raise ArgumentTypeError(argument, fmt, "a bitfault format (FixedPoint, IntQuant, Float "
                                "or a block format: MX, NVFP4, GGUF)")
    return fmt


@dataclass(frozen=True)
class Memory:
    """A tensor memory: its number ``format`` and the ``fault`` model of its bits.

    Either may be given in its ``to_dict()`` form. The fault's eligible bits must exist in
    the format (``BitFlip(bits="exponent")`` needs a Float). ``plane_rates``: for a block
    format, each plane's bit error rate relative to the rate a campaign trial draws at
    (``{"scale": 0.1}``: scale words fail ten times less often, as a better-protected scale
    memory would; ``{"codes": 0}``: only the scales fail); planes left out: 1.
    ``storage``: how the planes sit in physical memory words (layout, protection, fault
    pattern; ``bitfault.memory.storage.Storage`` or its dict form); None: the format's words
    themselves fail, bit by bit.
    """

    format: Format
    fault: FaultModel
    plane_rates: Mapping[str, float] | None = None
    storage: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.format, Mapping):
            object.__setattr__(self, "format", format_from_dict(dict(self.format)))
        check_format(self.format)
        object.__setattr__(self, "fault", as_fault_model(self.fault))
        self.fault.eligible_planes(self.format)  # validates bit names against the format
        if self.plane_rates is not None:
            object.__setattr__(self, "plane_rates", self._checked_plane_rates())
        if self.storage is not None:
            from bitfault.memory.storage import Storage  # storage builds on this module's maps

            storage = self.storage
            if isinstance(storage, Mapping):
                storage = Storage.from_dict(storage)
            if not isinstance(storage, Storage):
                raise ArgumentTypeError("storage", storage, "a bitfault.memory.storage.Storage, "
                                        "its dict form or None")
            if not isinstance(self.fault, BitFlip):
                raise ArgumentError("fault", self.fault.to_dict(), "BitFlip()",
                                    requirement="a stored memory's faults are its pattern's "
                                                "bit flips (fault=BitFlip())")
            storage.check_for(self.format)
            object.__setattr__(self, "storage", storage)

    @property
    def data_dependent(self) -> bool:
        """Whether its faults depend on the stored data (a ``storage`` with policy "zero"
        or asymmetric cells): maps are drawn with the tensor's clean values or words."""
        return self.storage is not None and self.storage.data_dependent

    def random_map(self, shape: tuple[int, ...], *, ber: Any = None, count: int | None = None,
                   seed: int = 0, name: str = "", bits: Any = None, step: int | None = None,
                   values: Any = None, words: Any = None) -> FaultMap:
        """The random map of a tensor of ``shape`` stored in this memory: ``FaultMap.random``
        in the format, or with ``storage`` the pattern's physical faults, decoded.

        ``values`` (the clean tensor) or ``words`` (its ``stored_faults.StoredWords``):
        what a ``data_dependent`` memory draws with; its map is then the XOR map for them
        (ArgumentError without). Other memories ignore them."""
        if self.storage is None:
            return FaultMap.random(shape, self.format, ber=ber, count=count, seed=seed,
                                   name=name, bits=bits, step=step, fault=self.fault)
        if ber is None:
            raise ArgumentError("count", count, "None for a stored memory (give ber=)",
                                requirement="count= cannot place a stored memory's faults: "
                                            "its pattern draws at a rate (give ber=)")
        stored = None
        if self.storage.data_dependent:
            from bitfault.memory.plane_maps import as_stored_words

            stored = as_stored_words(words, values, tuple(shape), self.format)
        return self.storage.random_map(tuple(shape), self.format, ber=ber, seed=seed,
                                       name=name, bits=bits, step=step, words=stored)

    def _checked_plane_rates(self) -> dict[str, float]:
        planes = tuple(plane_formats(self.format))
        rates = self.plane_rates
        if not isinstance(self.format, BlockFormat):
            raise ArgumentError("plane_rates", rates, "None for a format with one plane",
                                requirement=f"plane_rates apply to block formats; "
                                            f"{type(self.format).__name__} stores one plane")
        if not isinstance(rates, Mapping) or not rates:
            raise ArgumentError("plane_rates", rates, f"a non-empty mapping from planes of "
                                f"{planes} to relative rates >= 0, or None")
        out = {}
        for plane, value in rates.items():
            check_choice(plane, planes, "plane_rates key")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    0 <= value < float("inf")):
                raise ArgumentError(f"plane_rates[{plane!r}]", value, "a finite number >= 0")
            out[plane] = float(value)
        return {p: out[p] for p in planes if p in out}

    def plane_ber(self, ber: float) -> float | dict[str, float]:
        """The rate to draw a trial's maps at: ``ber`` itself, or with ``plane_rates`` one
        rate per plane (``FaultMap.random``'s mapping by plane)."""
        if self.plane_rates is None:
            return ber
        return {p: ber * self.plane_rates.get(p, 1.0) for p in plane_formats(self.format)}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``Memory.from_dict`` rebuilds an equal memory."""
        out = {"format": self.format.to_dict(), "fault": self.fault.to_dict()}
        if self.plane_rates is not None:  # only then: older memories keep their digests
            out["plane_rates"] = dict(self.plane_rates)
        if self.storage is not None:
            out["storage"] = self.storage.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Memory:
        if not isinstance(data, Mapping):
            raise ArgumentTypeError("data", data, "a mapping", requirement="a memory must be a "
                                    "mapping", tail=f", got {type(data).__name__}")
        unknown = sorted(set(data) - {*_KEYS, "plane_rates", "storage"})
        missing = [k for k in _KEYS if k not in data]
        if unknown or missing:
            raise ArgumentError("data", data, f"a mapping with the keys {list(_KEYS)} (and "
                                "optionally plane_rates, storage)",
                                requirement=f"a memory dict has the keys {list(_KEYS)} and "
                                            f"optionally plane_rates, storage; unknown: "
                                            f"{unknown}, missing: {missing}")
        return cls(data["format"], data["fault"], data.get("plane_rates"),
                   data.get("storage"))

    def to_json(self) -> str:
        """The stable JSON form (sorted keys, no spaces): what ``digest`` hashes."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """SHA-256 of the stable JSON form: equal memories have equal digests."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()


def check_map_fits(fmap: FaultMap, shape: tuple[int, ...], fmt: Format,
                   argument: str = "fmap") -> None:
    """Raise ArgumentError unless ``fmap`` is for a tensor of ``shape`` stored in ``fmt``
    (for a block format: its codes, and every plane in ``fmap.planes`` a plane of ``fmt``
    with that plane's shape and bits)."""
    _check_plane_fits(fmap, shape, fmt, argument)
    formats = plane_formats(fmt)
    if fmap.planes:
        allowed = tuple(p for p in formats if p != CODES)
        shapes = fmt.plane_shapes(shape) if isinstance(fmt, BlockFormat) else {}
        for plane, pmap in fmap.planes.items():
            if plane not in allowed:
                raise ArgumentError(f"{argument}.planes", plane, f"one of {allowed}",
                                    requirement=f"{argument} {fmap.name!r} has a map of plane "
                                                f"{plane!r}; {type(fmt).__name__} stores "
                                                f"the planes {tuple(formats)}")
            _check_plane_fits(pmap, shapes[plane], formats[plane], f"{argument}.planes[{plane!r}]")


def _check_plane_fits(fmap: FaultMap, shape: tuple[int, ...], fmt: Format,
                      argument: str) -> None:
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
    check_map_format(fmap, fmt, argument)


def plane_faults(fmap: FaultMap, fmt: Format, fault: FaultModel, plane: str = CODES,
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The flat indices into ``plane`` of the words ``fmap`` faults with a bit ``fault`` may
    touch, and those bits (uint32); the map is taken to fit (``check_map_fits``)."""
    pmap = fmap.plane(plane)
    if pmap is None:
        return np.zeros(0, np.int64), np.zeros(0, np.uint32)
    masks = pmap.masks & np.uint32(fault.eligible_mask(fmt, plane))
    keep = masks != 0
    return pmap.indices[keep], masks[keep]


def eligible_faults(fmap: FaultMap, shape: tuple[int, ...], fmt: Format, fault: FaultModel,
                    plane: str = CODES) -> tuple[np.ndarray, np.ndarray]:
    """``plane_faults`` after checking the fault model and that the map fits ``shape`` in
    ``fmt``."""
    check_fault_model(fault)
    check_map_fits(fmap, shape, fmt)
    return plane_faults(fmap, fmt, fault, plane)


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
        """``x`` stored in ``fmt`` (a ``StoredBlocks`` for a block format)."""
        arr = check_float_input(x)
        check_format(fmt, "fmt")
        if isinstance(fmt, BlockFormat):
            return StoredBlocks.of(arr, fmt)  # type: ignore[return-value]
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


@dataclass(frozen=True, eq=False)
class StoredBlocks:
    """An array stored in a block format once (``StoredArray.of`` makes it): the planes in
    block form, and which block every element and every plane word belongs to, so a map
    costs the blocks it touches: a faulty code re-decodes its block, a faulty scale (or
    minimum) word every element of its block, a faulty tensor scale the whole tensor."""

    fmt: BlockFormat
    shape: tuple[int, ...]
    values: np.ndarray
    blocks: dict[str, np.ndarray]  # block form, int64 bit patterns (encode_blocks' output)
    element_block: np.ndarray  # flat element -> its block
    element_slot: np.ndarray  # flat element -> its place in the block
    block_elements: np.ndarray  # (n_blocks, k): flat element of each slot, -1 for padding
    plane_block: dict[str, np.ndarray]  # per block plane: flat word -> its block

    @classmethod
    def of(cls, x: Any, fmt: BlockFormat) -> StoredBlocks:
        arr = check_float_input(x)
        lay = fmt.layout(arr.shape)
        planes = fmt.encode(arr)
        values = fmt.decode(planes, dtype=arr.dtype).reshape(-1)
        blocks = {k: np.array(v) for k, v in fmt.to_block_form(lay, planes).items()}
        elements = lay.to_blocks(np.arange(arr.size, dtype=np.int64).reshape(arr.shape), -1)
        valid = elements >= 0
        element_block = np.empty(arr.size, np.int64)
        element_slot = np.empty(arr.size, np.int64)
        rows, slots = np.nonzero(valid)
        element_block[elements[valid]] = rows
        element_slot[elements[valid]] = slots
        plane_block = {p.name: lay.block_of_plane_index() for p in fmt.planes if p.per == "block"}
        for a in (values, element_block, element_slot, elements, *blocks.values()):
            a.flags.writeable = False
        return cls(fmt, arr.shape, values, blocks, element_block, element_slot, elements,
                   plane_block)

    def faulty_elements(self, fault: FaultModel,
                        fmap: FaultMap) -> tuple[np.ndarray, np.ndarray]:
        """Sorted flat indices of the elements whose block ``fmap`` faults (bits ``fault``
        may touch) and their faulty values; every other element keeps ``values``."""
        check_fault_model(fault)
        check_map_fits(fmap, self.shape, self.fmt)
        hit: list[np.ndarray] = []
        faults: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for plane in self.fmt.planes:
            idx, masks = plane_faults(fmap, self.fmt, fault, plane.name)
            if not idx.size:
                continue
            faults[plane.name] = (idx, masks)
            if plane.per == "element":
                hit.append(self.element_block[idx])
            elif plane.per == "block":
                hit.append(self.plane_block[plane.name][idx])
            else:
                hit.append(np.arange(self.block_elements.shape[0]))
        if not hit:
            return np.zeros(0, np.int64), np.zeros(0, self.values.dtype)
        blocks = np.unique(np.concatenate(hit))
        sub = {}
        for plane in self.fmt.planes:
            words = self.blocks[plane.name]
            words = words.copy() if plane.per == "tensor" else words[blocks]
            if plane.name in faults:
                idx, masks = faults[plane.name]
                if plane.per == "element":
                    where = (np.searchsorted(blocks, self.element_block[idx]),
                             self.element_slot[idx])
                elif plane.per == "block":
                    where = (np.searchsorted(blocks, self.plane_block[plane.name][idx]),)
                else:
                    where, masks = (), masks.reshape(())
                words[where] = fault.apply(words[where], masks.astype(np.int64))
            sub[plane.name] = words
        decoded = self.fmt.decode_blocks(sub)
        elements = self.block_elements[blocks]
        valid = elements >= 0
        order = np.argsort(elements[valid], kind="stable")
        values = cast_quietly(decoded[valid], self.values.dtype)
        return elements[valid][order], values[order]

    def faulty(self, fault: FaultModel, fmap: FaultMap) -> np.ndarray:
        """``inject(x, fmt, fault, fmap)`` of the stored ``x``, bit for bit."""
        idx, faulty = self.faulty_elements(fault, fmap)
        out = self.values.copy()
        out[idx] = faulty
        return out.reshape(self.shape)


__all__ = ["Memory", "StoredArray", "StoredBlocks", "check_format", "check_map_fits",
           "eligible_faults", "masks_as_words", "plane_faults"]
