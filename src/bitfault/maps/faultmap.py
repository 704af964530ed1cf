"""FaultMap: the faulty bits of one named tensor, as sorted element indices and masks.

``FaultMap.random`` draws a map with the sampler (``bitfault.maps.sampling``);
``save``/``load`` keep it in an ``.npz`` file with its provenance
(``bitfault.maps.files``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bitfault.errors import ArgumentError, check_rate, check_seed
from bitfault.faults.models import BitSelection, resolve_bits
from bitfault.formats import (
    Format,
    format_from_dict,
    is_block_format,
    is_format,
    plane_formats,
    plane_map_name,
    split_by_plane,
)
from bitfault.formats.blocks import CODES
from bitfault.maps.files import read_map_file, write_map_file
from bitfault.maps.limits import check_map_size
from bitfault.maps.sampling import count_faults, rate_faults


def popcount(x: np.ndarray) -> np.ndarray:
    """The set bits of each element of ``x`` (taken as uint32)."""
    x = np.asarray(x, dtype=np.uint32)
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(x)
    return np.unpackbits(x.view(np.uint8).reshape(*x.shape, 4), axis=-1).sum(-1)


def _rates_by_position(ber: Any, fmt: Format, positions: tuple[int, ...]) -> dict[int, float]:
    """One rate per eligible bit position, from a scalar, a sequence or a mapping."""
    if isinstance(ber, Mapping):
        rates: dict[int, float] = {}
        for key, value in ber.items():
            for pos in resolve_bits(key, fmt, argument="ber"):
                rates[pos] = check_rate(value, f"ber[{key!r}]")
        return {p: rates.get(p, 0.0) for p in positions}
    if isinstance(ber, (Sequence, np.ndarray)) and not isinstance(ber, str):
        values = list(ber)
        if len(values) != fmt.bits:
            need = f"one rate per bit position ({fmt.bits} for this format, LSB first)"
            raise ArgumentError("ber", ber, need, requirement=f"ber as a sequence needs {need}",
                                tail=f", got {len(values)}")
        return {p: check_rate(values[p], f"ber[{p}]") for p in positions}
    rate = check_rate(ber, "ber")
    return dict.fromkeys(positions, rate)


def _shape_tuple(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        dims = tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError(f"shape must be a tuple of non-negative ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"shape must be a tuple of non-negative ints, got {shape!r}")
    return dims


@dataclass(frozen=True, eq=False)
class FaultMap:
    """Faulty bits of one tensor: sorted flat ``indices`` and a uint32 ``masks`` entry each.

    ``meta`` records where the map came from (source, format, fault model, seed,
    rate or count, bit positions, step) and travels with ``save``/``load``. A map records
    the format it was drawn for (``format``), and applying it to a tensor stored in
    another format is an error; ``for_format`` relabels it explicitly. For a tensor
    in a block format the map is that of its codes plane, and ``planes`` holds the maps
    of its other planes by plane name (``"scale"``: a map named ``"<name>:scale"`` of the
    scale plane's shape); a plane without an entry has no fault.
    """

    shape: tuple[int, ...]
    indices: np.ndarray
    masks: np.ndarray
    name: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    planes: Mapping[str, FaultMap] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _shape_tuple(self.shape))
        idx = np.asarray(self.indices, dtype=np.int64).reshape(-1)
        masks = np.asarray(self.masks).reshape(-1)
        if masks.dtype.kind not in "iu":
            raise TypeError(f"masks must be an integer array, got dtype {masks.dtype}")
        if idx.shape != masks.shape:
            raise ValueError(f"indices and masks must have the same length, got {idx.size} "
                             f"and {masks.size}")
        size = math.prod(self.shape)
        if idx.size and (idx[0] < 0 or idx[-1] >= size or np.any(np.diff(idx) <= 0)):
            raise ValueError(f"indices must be sorted, distinct and in 0..{size - 1} "
                             f"for shape {self.shape}")
        if masks.dtype.kind == "i" and masks.size and masks.min() < 0:
            masks = masks.view(f"u{masks.dtype.itemsize}")
        if masks.size and int(masks.max()) >= 1 << 32:
            raise ValueError("masks must fit in 32 bits")
        idx.flags.writeable = False
        masks = masks.astype(np.uint32, copy=False)
        masks.flags.writeable = False
        object.__setattr__(self, "indices", idx)
        object.__setattr__(self, "masks", masks)
        if not isinstance(self.planes, Mapping) or not all(
                isinstance(k, str) and isinstance(v, FaultMap) for k, v in self.planes.items()):
            raise TypeError(f"planes must map plane names to FaultMaps, got {self.planes!r}")
        object.__setattr__(self, "planes", dict(self.planes))

    # ---- constructors -------------------------------------------------------------------

    @classmethod
    def _checked(cls, shape: tuple[int, ...], indices: np.ndarray, masks: np.ndarray,
                 name: str, meta: dict[str, Any],
                 planes: Mapping[str, FaultMap] | None = None) -> FaultMap:
        """A map from arrays this module built: sorted distinct int64 ``indices`` in range
        and uint32 ``masks`` (validating them again costs more than drawing a small map)."""
        fmap = object.__new__(cls)
        indices.flags.writeable = False
        masks.flags.writeable = False
        for key, value in (("shape", shape), ("indices", indices), ("masks", masks),
                           ("name", name), ("meta", meta), ("planes", dict(planes or {}))):
            object.__setattr__(fmap, key, value)
        return fmap

    @classmethod
    def empty(cls, shape: Any, name: str = "") -> FaultMap:
        """A map with no fault: the tensor is stored in its format and read back as stored."""
        return cls(shape, np.zeros(0, np.int64), np.zeros(0, np.uint32), name, {"source": "none"})

    @classmethod
    def from_mask(cls, mask: Any, name: str = "", fmt: Format | None = None,
                  fault: Any = None) -> FaultMap:
        """A map from a dense integer mask (a 1 bit wherever a fault is), like the seed's fmap."""
        arr = np.asarray(mask)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"mask must be an integer array, got dtype {arr.dtype}")
        flat = arr.reshape(-1)
        if arr.dtype.kind == "i":
            flat = flat.view(f"u{arr.dtype.itemsize}")
        if flat.size and int(flat.max()) >= 1 << 32:
            raise ValueError("mask values must fit in 32 bits")
        idx = np.flatnonzero(flat)
        meta: dict[str, Any] = {"source": "mask"}
        if fmt is not None:
            meta["format"] = fmt.to_dict()
        if fault is not None:
            meta["fault"] = fault.to_dict()
        return cls(arr.shape, idx, flat[idx].astype(np.uint32), name, meta)

    @classmethod
    def random(
        cls,
        shape: Any,
        fmt: Format,
        *,
        ber: float | Sequence[float] | Mapping[Any, float] | None = None,
        count: int | None = None,
        seed: int = 0,
        name: str = "",
        bits: BitSelection = None,
        step: int | None = None,
        fault: Any = None,
    ) -> FaultMap:
        """Random faulty bits: each eligible bit with probability ``ber``, or exactly ``count``.

        ``ber`` may be one rate, one rate per bit position (LSB first) or a mapping
        from positions / field names to rates. ``bits`` limits the eligible
        positions (ints or field names). ``step`` gives transient maps a fresh,
        replayable draw per step. Reproducible from (seed, name, step), nested in
        ``ber`` and in ``count``.
        """
        dims = _shape_tuple(shape)
        if not is_format(fmt):
            raise TypeError(f"fmt must be a bitfault format (FixedPoint, IntQuant, Float), "
                            f"got {fmt!r}")
        seed = check_seed(seed)
        if not isinstance(name, str):
            raise TypeError(f"name must be a string, got {name!r}")
        if step is not None and (isinstance(step, bool) or not isinstance(step, (int, np.integer))
                                 or step < 0):
            raise ValueError(f"step must be None or a non-negative integer, got {step!r}")
        if (ber is None) == (count is None):
            raise ValueError("give exactly one of ber= (a bit error rate) or count= (a number "
                             "of faulty bits)")
        if is_block_format(fmt):
            return cls._random_planes(dims, fmt, ber=ber, count=count, seed=seed, name=name,
                                      bits=bits, step=step, fault=fault)
        positions = resolve_bits(bits, fmt)
        n = math.prod(dims)
        meta: dict[str, Any] = {"source": "random", "format": fmt.to_dict(), "seed": seed,
                                "bits": list(positions), "step": step}
        if fault is not None:
            meta["fault"] = fault.to_dict()
        if ber is not None:
            rates = _rates_by_position(ber, fmt, positions)
            check_map_size(dims, fmt.bits, n * sum(rates.values()), "ber", ber)
            meta["ber"] = ber if isinstance(ber, (int, float)) else [
                rates.get(p, 0.0) for p in range(fmt.bits)]
            idx, masks = rate_faults(n, fmt.bits, rates, seed, name, step)
        else:
            if isinstance(count, (int, np.integer)) and not isinstance(count, bool):
                check_map_size(dims, fmt.bits, min(int(count), n * len(positions)), "count",
                               count)
            idx, masks = count_faults(n, fmt.bits, positions, count, seed, name, step)
            meta["count"] = int(count)  # type: ignore[arg-type]
        return cls._checked(dims, idx, masks.astype(np.uint32, copy=False), name, meta)

    @classmethod
    def _random_planes(cls, dims: tuple[int, ...], fmt: Any, *, ber: Any, count: int | None,
                       seed: int, name: str, bits: BitSelection, step: int | None,
                       fault: Any) -> FaultMap:
        """The map of a block-format tensor: each plane drawn as a map of its own, named
        ``plane_map_name(name, plane)``, with its part of ``bits`` and of ``ber`` (a rate
        mapping may name planes: ``{"codes": 1e-3, "scale": 1e-5}``); ``count`` faulty
        bits in each selected plane. The codes map carries the others in ``planes``."""
        if isinstance(ber, (Sequence, np.ndarray)) and not isinstance(ber, (str, Mapping)):
            raise ArgumentError("ber", ber, "one rate or a mapping by plane / field",
                                requirement=f"ber for the block format {type(fmt).__name__} "
                                            "is one rate or a mapping such as {'codes': 1e-3, "
                                            "'scale': 1e-5, 'scale.exponent': 1e-4}")
        selected = split_by_plane(bits, fmt)
        rates = split_by_plane(ber, fmt, "ber") if isinstance(ber, Mapping) else None
        shapes = fmt.plane_shapes(dims)
        maps: dict[str, FaultMap] = {}
        for plane in fmt.planes:
            pname, pshape = plane_map_name(name, plane.name), shapes[plane.name]
            rate = ber if rates is None else rates.get(plane.name)
            if plane.name not in selected or (ber is not None and rate is None):
                maps[plane.name] = cls.empty(pshape, pname)
                continue
            maps[plane.name] = cls.random(pshape, plane.format, ber=rate, count=count,
                                          seed=seed, name=pname, bits=selected[plane.name],
                                          step=step, fault=fault)
        codes = maps.pop(CODES)
        meta = {**codes.meta, "format": fmt.to_dict()}
        return cls._checked(dims, codes.indices, codes.masks, name, meta, maps)

    @property
    def format(self) -> Format | None:
        """The format the map was drawn for (``meta["format"]``); None for a map that records
        none (``from_mask`` without one, ``empty``, maps built from arrays): such a map fits
        any format whose words hold its bits."""
        found = self.__dict__.get("_format", False)
        if found is False:
            recorded = self.meta.get("format") if isinstance(self.meta, Mapping) else None
            try:
                found = None if recorded is None else format_from_dict(dict(recorded))
            except (TypeError, ValueError, KeyError) as exc:
                raise ValueError(f"fault map {self.name!r}: meta['format'] is not a format "
                                 f"({exc})") from None
            self.__dict__["_format"] = found
        return found

    def for_format(self, fmt: Format) -> FaultMap:
        """The same faults (element indices and bit positions) recorded as drawn for
        ``fmt``: the explicit way to apply a map drawn for one format to a tensor stored in
        another (a bit position may mean something else there: the sign of an 8-bit code
        is a fraction bit of a 16-bit fixed-point word). A block format's planes are
        relabelled with its plane formats."""
        if not is_format(fmt):
            raise TypeError(f"fmt must be a bitfault format, got {fmt!r}")
        formats = plane_formats(fmt)
        unknown = sorted(set(self.planes) - set(formats))
        if unknown:
            raise ArgumentError("fmt", fmt, f"a format with the planes {sorted(self.planes)}",
                                requirement=f"fault map {self.name!r} has maps of the planes "
                                            f"{unknown}, which {fmt} does not store")
        meta = {**self.meta, "format": fmt.to_dict()}
        if self.meta.get("format") not in (None, meta["format"]):
            meta["converted_from"] = self.meta["format"]
        planes = {p: m.for_format(formats[p]) for p, m in self.planes.items()}
        return FaultMap(self.shape, self.indices, self.masks, self.name, meta, planes)

    def plane(self, name: str) -> FaultMap | None:
        """The map of plane ``name`` (``"codes"``: this map itself), None when absent."""
        return self if name == CODES else self.planes.get(name)

    # ---- views --------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Elements in the tensor the map is for."""
        return math.prod(self.shape)

    @property
    def n_faults(self) -> int:
        """Faulty bits in the map, in every plane."""
        return int(popcount(self.masks).sum()) + sum(m.n_faults for m in self.planes.values())

    @property
    def n_elements(self) -> int:
        """Elements with at least one faulty bit."""
        return int(self.indices.size)

    def bit_counts(self, width: int = 32) -> np.ndarray:
        """Faulty bits per bit position (LSB first)."""
        return np.array([int(np.count_nonzero(self.masks & np.uint32(1 << b)))
                         for b in range(width)])

    def to_dense(self, dtype: Any = np.uint32) -> np.ndarray:
        """The dense mask, shape ``self.shape``; signed dtypes hold the same bit patterns."""
        dt = np.dtype(dtype)
        out = np.zeros(self.size, dtype=f"u{dt.itemsize}")
        if self.masks.size and dt.itemsize < 4 and int(self.masks.max()) >= 1 << (8 * dt.itemsize):
            raise ValueError(f"masks use bits beyond a {dt} container")
        out[self.indices] = self.masks.astype(out.dtype)
        return out.view(dt).reshape(self.shape)

    def restricted(self, bits: int) -> FaultMap:
        """The same map with only the faults whose positions are set in mask ``bits`` (in
        the codes plane; the other planes as they are)."""
        masks = self.masks & np.uint32(bits)
        keep = masks != 0
        return FaultMap(self.shape, self.indices[keep], masks[keep], self.name, dict(self.meta),
                        self.planes)

    def digest(self) -> str:
        """SHA-256 of shape, indices and masks: the faults (the chip), what campaigns record
        per trial; equal faults have equal digests (computed once: the arrays are read-only).
        A map file also checks its name and ``meta`` (``save``)."""
        found = self.__dict__.get("_digest")
        if found is None:
            h = hashlib.sha256(json.dumps(list(self.shape)).encode())
            h.update(self.indices.tobytes())
            h.update(self.masks.tobytes())
            for plane in sorted(self.planes):
                h.update(f"{plane}:{self.planes[plane].digest()}".encode())
            found = self.__dict__["_digest"] = h.hexdigest()
        return found

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FaultMap):
            return NotImplemented
        return (self.shape == other.shape and self.name == other.name
                and np.array_equal(self.indices, other.indices)
                and np.array_equal(self.masks, other.masks) and self.planes == other.planes)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        planes = f", planes={sorted(self.planes)}" if self.planes else ""
        return (f"FaultMap(name={self.name!r}, shape={self.shape}, faults={self.n_faults}, "
                f"elements={self.n_elements}{planes}, meta={self.meta})")

    # ---- files ----------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the map to an ``.npz`` file with its provenance and a checksum over all of
        it (name, shape, meta, faults), through a temporary file renamed into place."""
        planes = {p: (m.name, m.shape, m.meta, m.indices, m.masks)
                  for p, m in self.planes.items()}
        write_map_file(path, name=self.name, shape=self.shape, meta=self.meta,
                       digest=self.digest(), indices=self.indices, masks=self.masks,
                       planes=planes)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, shape: Any = None,
             name: str | None = None) -> FaultMap:
        """Read a map written by ``save``; ``shape``/``name`` check it fits its tensor."""
        header, indices, masks, arrays = read_map_file(path)
        try:
            planes = {p: cls(tuple(h["shape"]), *arrays[p], h["name"], h["meta"])
                      for p, h in (header.get("planes") or {}).items()}
            fmap = cls(tuple(header["shape"]), indices, masks, header["name"], header["meta"],
                       planes)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{os.fspath(path)}: corrupted fault map ({exc})") from None
        if fmap.digest() != header.get("digest"):
            raise ValueError(f"{os.fspath(path)}: corrupted fault map (digest mismatch)")
        if shape is not None and fmap.shape != _shape_tuple(shape):
            raise ValueError(f"{os.fspath(path)}: map is for shape {fmap.shape}, "
                             f"the tensor has shape {_shape_tuple(shape)}")
        if name is not None and fmap.name != name:
            raise ValueError(f"{os.fspath(path)}: map is for tensor {fmap.name!r}, not {name!r}")
        return fmap


__all__ = ["FaultMap", "popcount"]
