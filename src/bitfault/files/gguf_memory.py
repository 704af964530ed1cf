"""GGUF files as stored memory: every tensor in the layout the file stores, faulted there.

``GGUFMemory.open(path)`` reads a GGUF file through the ``gguf`` package and holds each
tensor as bitfault planes: Q8_0 / Q4_0 / Q4_1 as ``GGUF(type)`` planes (codes, fp16
scales and, for Q4_1, fp16 minimums; blocks of 32 along ggml's first dimension ``ne0``,
numpy's last axis: ggml's shape ``(ne0, ne1)`` is numpy's ``(ne1, ne0)``), F32 / F16 /
BF16 as ``Float`` words. Fault maps are named by the GGUF tensor name
(``"blk.0.attn_q.weight"``, its scales ``"blk.0.attn_q.weight:scale"``) and shaped as the
numpy view of the stored tensor. ``faulty_planes`` applies a fault model at a map's bits;
``dequantize`` decodes planes as llama.cpp does (``gguf.quants.dequantize`` of the same
bytes); ``write`` copies the file with only the faulted bytes changed. Nothing is ever
re-quantised. The ``gguf`` package is imported when a file is opened.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.faults.models import BitFlip, FaultModel, as_fault_model
from bitfault.formats import GGUF, BlockFormat, Float, Format, plane_formats
from bitfault.formats.blocks import CODES, PLANE_SEPARATOR
from bitfault.inject import InjectionStats, fault_words
from bitfault.maps import FaultMap
from bitfault.memory.memory import check_map_fits
from bitfault.targets import Targets

STORED_TYPES: dict[str, Format] = {
    "Q8_0": GGUF("q8_0"), "Q4_0": GGUF("q4_0"), "Q4_1": GGUF("q4_1"),
    "F32": Float("float32"), "F16": Float("float16"), "BF16": Float("bfloat16"),
}
GGUF_PLANES = ("codes", "scale", "min")


@dataclass(frozen=True, eq=False)
class StoredGGUF:
    """One tensor of a GGUF file: its ``name``, ggml ``type`` ("Q4_1"), bitfault ``format``,
    numpy ``shape`` (ggml's dimensions reversed), the byte ``offset`` and ``nbytes`` of its
    data in the file, and its clean ``planes`` (read-only words by plane name; a float
    tensor has one plane, ``codes``: its words)."""

    name: str
    type: str
    format: Format
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    planes: Mapping[str, np.ndarray]

    def words_of(self, data: np.ndarray) -> dict[str, np.ndarray]:
        """The stored data (as ``gguf.GGUFReader`` gives it) -> planes."""
        if isinstance(self.format, BlockFormat):
            return self.format.from_bytes(np.asarray(data).reshape(-1), self.shape)
        container = self.format.container
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        return {CODES: raw.view(container.newbyteorder("<")).astype(container)
                .reshape(self.shape)}

    def to_bytes(self, planes: Mapping[str, np.ndarray]) -> np.ndarray:
        """Planes -> the bytes the file stores for this tensor (uint8, flat)."""
        if isinstance(self.format, BlockFormat):
            return self.format.to_bytes(planes).reshape(-1)
        words = np.asarray(planes[CODES]).astype(self.format.container)
        return words.astype(words.dtype.newbyteorder("<")).reshape(-1).view(np.uint8)

    def decode(self, planes: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """Planes (default: the clean ones) -> float32 values, as llama.cpp dequantises."""
        planes = self.planes if planes is None else planes
        if isinstance(self.format, BlockFormat):
            return self.format.decode(planes)
        return self.format.decode(planes[CODES])


def _plane_rate(ber: Any, fmt: Format) -> Any:
    """The part of a rate for a tensor stored in ``fmt``: a number as is; a mapping keyed
    by plane (``codes``, ``scale``, ``min``, or ``<plane>.<field>``) keeps the planes
    ``fmt`` has (a float tensor's words are its ``codes``); None when none is left."""
    if not isinstance(ber, Mapping):
        return ber
    have = tuple(plane_formats(fmt))
    out: dict[Any, Any] = {}
    for key, value in ber.items():
        plane, _, sub = str(key).partition(".")
        if plane not in GGUF_PLANES:
            raise ArgumentError("ber", dict(ber), f"rates keyed by plane {GGUF_PLANES} or "
                                "'<plane>.<field>'", requirement=(
                                    f"ber for a GGUF file names planes, each tensor taking "
                                    f"those it stores; {key!r} names none of {GGUF_PLANES}"))
        if plane not in have:
            continue
        if len(have) == 1:  # a float tensor: its words are the codes plane
            out[int(sub) if sub.isdigit() else (sub or "all")] = value
        else:
            out[key] = value
    return out or None


class GGUFMemory:
    """The tensors of a GGUF file in their stored layout (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], tensors: Mapping[str, StoredGGUF],
                 architecture: str) -> None:
        self.path = os.fspath(path)
        self.tensors = dict(tensors)
        self.architecture = architecture

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> GGUFMemory:
        """Read ``path``; ArgumentError naming every tensor of a type bitfault cannot hold
        (its planes unknown), before anything is decoded."""
        import gguf

        if not os.path.isfile(path):
            raise ArgumentError("path", os.fspath(path), "an existing GGUF file",
                                requirement=f"{os.fspath(path)}: no such GGUF file")
        try:
            reader = gguf.GGUFReader(path)
        except Exception as exc:
            raise ArgumentError("path", os.fspath(path), "a GGUF file gguf.GGUFReader reads",
                                requirement=f"{os.fspath(path)}: not a readable GGUF file "
                                            f"({type(exc).__name__}: {exc})") from None
        if reader.byte_order != "I":
            raise ArgumentError("path", os.fspath(path), "a little-endian GGUF file",
                                requirement=f"{os.fspath(path)}: a byte-swapped (big-endian) "
                                            "GGUF file; bitfault reads little-endian files")
        bad = [f"{t.name} ({t.tensor_type.name})" for t in reader.tensors
               if t.tensor_type.name not in STORED_TYPES]
        if bad:
            raise ArgumentError("tensor type", bad, f"one of {tuple(STORED_TYPES)}",
                                requirement=f"{os.fspath(path)}: tensor(s) of a type bitfault "
                                            f"cannot decode: {', '.join(bad[:8])}"
                                            f"{' ...' if len(bad) > 8 else ''}; allowed "
                                            f"types: {', '.join(STORED_TYPES)}")
        tensors = {}
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            stored = StoredGGUF(t.name, t.tensor_type.name, STORED_TYPES[t.tensor_type.name],
                                shape, int(t.data_offset), int(t.n_bytes), {})
            planes = stored.words_of(t.data)
            for words in planes.values():
                words.flags.writeable = False
            object.__setattr__(stored, "planes", planes)
            tensors[t.name] = stored
        arch = reader.fields.get("general.architecture")
        name = bytes(arch.parts[arch.data[0]]).decode() if arch is not None else ""
        return cls(path, tensors, name)

    # ---- what is stored ---------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return list(self.tensors)

    @property
    def formats(self) -> dict[str, Format]:
        return {n: t.format for n, t in self.tensors.items()}

    def tensor(self, name: str) -> StoredGGUF:
        """The stored tensor ``name``; ArgumentError listing some names otherwise."""
        if name not in self.tensors:
            raise ArgumentError("name", name, "a tensor of the file", requirement=(
                f"{self.path} has no tensor {name!r}; its tensors: "
                f"{', '.join(self.names[:6])}{' ...' if len(self.names) > 6 else ''}"))
        return self.tensors[name]

    def select(self, targets: Any = "weights") -> list[str]:
        """The tensor names ``targets`` choose (``bitfault.Targets``: ``*.weight`` are
        weights, ``*.bias`` biases; include / exclude patterns on GGUF names)."""
        found = Targets.coerce(targets, kinds=("weights", "biases"))
        return [n for n in self.tensors if found.selects(n)]

    # ---- fault maps ---------------------------------------------------------------------------

    def random_maps(self, *, ber: Any = None, count: int | None = None, seed: int = 0,
                    targets: Any = "weights", fault: FaultModel | None = None,
                    step: int | None = None) -> dict[str, FaultMap]:
        """One chip: a map per chosen tensor, drawn in its stored format (``FaultMap.random``
        with ``name`` the GGUF name). ``ber``: one rate, or rates by plane
        (``{"codes": 1e-4}``, ``{"scale": 1e-4, "min": 1e-4}``: a tensor gets the planes
        it stores; F32 words are ``codes``)."""
        fault = as_fault_model(BitFlip() if fault is None else fault)
        if (ber is None) == (count is None):
            raise ArgumentError("ber", ber, "exactly one of ber= or count=",
                                requirement="give exactly one of ber= or count=")
        names = self.select(targets)
        if isinstance(ber, Mapping):  # validate the keys once, before any draw
            _plane_rate(ber, GGUF("q4_1"))
        maps = {}
        for name in names:
            t = self.tensors[name]
            rate = None if ber is None else _plane_rate(ber, t.format)
            if ber is not None and rate is None:
                maps[name] = FaultMap.empty(t.shape, name)
                continue
            maps[name] = FaultMap.random(t.shape, t.format, ber=rate, count=count, seed=seed,
                                         name=name, bits=fault.bits, step=step, fault=fault)
        return maps

    def maps_for(self, spec: Any) -> dict[str, FaultMap]:
        """The maps of a ``FaultSpec`` (or its dict): its rate or count by ``random_maps``
        with the spec's seed, targets and fault model, or its explicit maps by GGUF name
        (``"<name>:scale"`` entries join their tensor's map). The spec's ``format`` is not
        used: each tensor is faulted in the format the file stores."""
        from bitfault.spec import FaultSpec

        spec = FaultSpec.coerce(spec)
        if spec.maps is None:
            return self.random_maps(ber=spec.ber, count=spec.count, seed=spec.seed,
                                    targets=spec.targets, fault=spec.fault)
        return self.group_maps(spec.maps)

    def group_maps(self, maps: Mapping[str, FaultMap]) -> dict[str, FaultMap]:
        """Maps by name (a plane's map as ``"<tensor>:<plane>"``) -> one map per tensor with
        its planes, checked against the stored shapes and formats."""
        if not isinstance(maps, Mapping):
            raise ArgumentTypeError("maps", maps, "a mapping from GGUF tensor names to FaultMaps")
        by_tensor: dict[str, dict[str, FaultMap]] = {}
        for key, fmap in maps.items():
            tensor, _, plane = str(key).partition(PLANE_SEPARATOR)
            self.tensor(tensor)
            by_tensor.setdefault(tensor, {})[plane or CODES] = fmap
        out = {}
        for tensor, parts in by_tensor.items():
            t = self.tensors[tensor]
            codes = parts.pop(CODES, None) or FaultMap.empty(t.shape, tensor)
            fmap = FaultMap(codes.shape, codes.indices, codes.masks, tensor, codes.meta,
                            {**codes.planes, **parts})
            check_map_fits(fmap, t.shape, t.format, f"maps[{tensor!r}]")
            out[tensor] = fmap
        return out

    # ---- faulting ----------------------------------------------------------------------------

    def faulty_planes(self, name: str, fmap: FaultMap, fault: FaultModel | None = None
                      ) -> tuple[dict[str, np.ndarray], InjectionStats]:
        """Tensor ``name``'s planes with ``fault`` (default: bit flips) at ``fmap``'s bits,
        and what changed (summed over planes)."""
        t = self.tensor(name)
        fault = as_fault_model(BitFlip() if fault is None else fault)
        check_map_fits(fmap, t.shape, t.format, f"maps[{name!r}]")
        out, totals = {}, np.zeros(4, np.int64)
        for plane, words in t.planes.items():
            out[plane], stats = fault_words(words, t.format, fault, fmap, plane)
            totals += (stats.faults, stats.changed_bits, stats.changed_values, 0)
        return out, InjectionStats(*(int(v) for v in totals))

    def dequantize(self, name: str, planes: Mapping[str, np.ndarray] | None = None
                   ) -> np.ndarray:
        """float32 values of tensor ``name`` from ``planes`` (default: its clean planes)."""
        return self.tensor(name).decode(planes)

    def write(self, output: str | os.PathLike[str], maps: Mapping[str, FaultMap],
              fault: FaultModel | None = None, *, overwrite: bool = False) -> dict[str, Any]:
        """Write a copy of the file with ``fault`` at ``maps``' bits and nothing else changed
        (the copy goes to a temporary file beside ``output``, then is renamed). Refuses an
        existing ``output`` unless ``overwrite``, and the input file always."""
        fault = as_fault_model(BitFlip() if fault is None else fault)
        target = Path(output)
        if target.is_dir():
            raise ArgumentError("output", os.fspath(output), "a file path",
                                requirement=f"--output {os.fspath(output)}: is a directory; "
                                            "give the file to write")
        if target.exists() and os.path.samefile(self.path, target):
            raise ArgumentError("output", os.fspath(output), "a path other than the input",
                                requirement=f"--output {os.fspath(output)}: is the input model "
                                            f"{self.path}; writing the faulty copy there would "
                                            "replace the clean weights")
        if target.exists() and not overwrite:
            raise ArgumentError("output", os.fspath(output), "a path that does not exist",
                                requirement=f"--output {os.fspath(output)}: exists; pass "
                                            "--overwrite (overwrite=True) to replace it")
        grouped = self.group_maps(maps)
        patches, summary = [], {}
        for name, fmap in grouped.items():  # everything is computed before the first write
            planes, stats = self.faulty_planes(name, fmap, fault)
            t = self.tensors[name]
            summary[name] = {"shape": list(t.shape), "type": t.type, "faults": stats.faults,
                             "changed_values": stats.changed_values}
            if stats.changed_bits:
                patches.append((t.offset, t.to_bytes(planes)))
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            shutil.copyfile(self.path, tmp)
            with open(tmp, "r+b") as fh:
                for offset, data in patches:
                    fh.seek(offset)
                    fh.write(data.tobytes())
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return summary


__all__ = ["GGUF_PLANES", "STORED_TYPES", "GGUFMemory", "StoredGGUF"]
