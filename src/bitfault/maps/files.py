"""Fault map files: an ``.npz`` of indices and masks under a JSON header.

The header holds the file version, the map's name, shape and ``meta`` (its
provenance), the faults' digest and a checksum over all of the header, so an edited
name, shape or meta does not load silently. Files are written through a temporary file
renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

MAP_FILE_VERSION = 2  # 2: a checksum over the whole header (1: over the faults only)


def header_checksum(header: Mapping[str, Any]) -> str:
    """SHA-256 of a map file's header (all of it but the checksum; its ``digest`` covers the
    faults), so an edited name, shape or meta does not load silently."""
    body = {k: v for k, v in header.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def write_map_file(path: str | os.PathLike[str], *, name: str, shape: tuple[int, ...],
                   meta: Mapping[str, Any], digest: str, indices: np.ndarray,
                   masks: np.ndarray, planes: Mapping[str, Any] | None = None) -> None:
    """Write a map file (the current version, with its checksum) through a temporary file.

    ``planes``: a block-format tensor's other planes, ``{plane: (name, shape, meta,
    indices, masks)}``, kept in the header (name, shape, meta) and as arrays
    ``<plane>.indices`` / ``<plane>.masks``."""
    header = {"version": MAP_FILE_VERSION, "name": name, "shape": list(shape),
              "meta": meta, "digest": digest}
    arrays: dict[str, np.ndarray] = {}
    if planes:
        header["planes"] = {}
        for plane, (pname, pshape, pmeta, pidx, pmasks) in planes.items():
            header["planes"][plane] = {"name": pname, "shape": list(pshape), "meta": pmeta}
            arrays[f"{plane}.indices"], arrays[f"{plane}.masks"] = pidx, pmasks
    header["checksum"] = header_checksum(header)
    path = os.fspath(path)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, header=np.array(json.dumps(header)),
                                indices=indices, masks=masks, **arrays)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_map_file(path: str | os.PathLike[str]
                  ) -> tuple[dict[str, Any], np.ndarray, np.ndarray, dict[str, Any]]:
    """The header, indices, masks and other planes' arrays (``{plane: (indices, masks)}``)
    of a map file, its version and header checksum checked (a ValueError naming the file
    otherwise; FileNotFoundError as is)."""
    try:
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as data:
            header = json.loads(str(data["header"]))
            indices, masks = data["indices"], data["masks"]
            planes = {p: (data[f"{p}.indices"], data[f"{p}.masks"])
                      for p in (header.get("planes") or {} if isinstance(header, dict) else {})}
    except FileNotFoundError:
        raise
    except Exception as exc:  # zipfile, KeyError, JSON, ...
        raise ValueError(f"{os.fspath(path)}: not a bitfault fault map file "
                         f"({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict) or header.get("version") not in (1, MAP_FILE_VERSION):
        found = header.get("version") if isinstance(header, dict) else header
        raise ValueError(f"{os.fspath(path)}: fault map file version {found!r}, expected "
                         f"{MAP_FILE_VERSION} (or 1)")
    if header["version"] >= 2 and header.get("checksum") != header_checksum(header):
        raise ValueError(f"{os.fspath(path)}: corrupted fault map (its header's checksum "
                         "does not match: the name, shape or metadata were changed)")
    return header, indices, masks, planes


__all__ = ["MAP_FILE_VERSION", "header_checksum", "read_map_file", "write_map_file"]
