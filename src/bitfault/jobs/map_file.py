"""``draw_map_file``: draw a random fault map and save it as ``.npz`` (``bitfault map``).

Everything is checked before the file is written: the tensor name, the output path (not a
directory, its folder exists, nothing there unless ``overwrite``, and even then only a
bitfault fault map is replaced) and the map's size (``bitfault.maps.limits``).
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

from bitfault.errors import ArgumentError
from bitfault.faults.models import BitFlip
from bitfault.maps import FaultMap
from bitfault.maps.files import read_map_file


def check_map_output(output: str | os.PathLike[str], overwrite: bool = False) -> str:
    """``output`` as a path a map may be written to; else an error naming it: a directory,
    a missing folder, an existing file without ``overwrite``, or a file that is not a
    bitfault fault map (never replaced: it may be a model, data or notes)."""
    path = os.fspath(output)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a directory; give the .npz file to write, e.g. "
                                f"{os.path.join(path, 'map.npz')}")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{path}: the folder {folder} does not exist")
    if os.path.lexists(path):
        if not overwrite:
            raise ArgumentError("output", path, "a path that does not exist, or --overwrite",
                                requirement=f"{path}: exists; pass --overwrite "
                                            "(overwrite=True) to replace it")
        why = None if zipfile.is_zipfile(path) else "not an .npz file"
        if why is None:
            try:
                read_map_file(path)
            except (ValueError, OSError) as exc:
                why = str(exc).removeprefix(f"{path}: ")
        if why is not None:
            raise ValueError(f"{path}: exists and is not a bitfault fault map ({why}), so it "
                             "is not replaced, even with --overwrite; choose another path")
    return path


def draw_map_file(output: str | os.PathLike[str], shape: Any, fmt: Any, *, name: str,
                  ber: Any = None, count: int | None = None, seed: int = 0, bits: Any = None,
                  overwrite: bool = False) -> dict[str, Any]:
    """Draw ``FaultMap.random(shape, fmt, ...)`` for tensor ``name`` (bit flips) and save it
    to ``output``; returns what was written (output, name, shape, faults, elements, digest,
    planes)."""
    if not isinstance(name, str) or not name.strip():
        raise ArgumentError("name", name, "a tensor name, e.g. 'fc1.weight' (a map applies "
                            "to the tensor it names)")
    path = check_map_output(output, overwrite)
    fmap = FaultMap.random(shape, fmt, ber=ber, count=count, seed=seed, name=name, bits=bits,
                           fault=BitFlip())
    try:
        fmap.save(path)
    except OSError as exc:
        raise OSError(f"{path}: not written ({exc.strerror or exc})") from None
    return {"output": path, "name": fmap.name, "shape": list(fmap.shape),
            "faults": fmap.n_faults, "elements": fmap.n_elements, "digest": fmap.digest(),
            "planes": {p: {"name": m.name, "shape": list(m.shape), "faults": m.n_faults}
                       for p, m in fmap.planes.items()}}


__all__ = ["check_map_output", "draw_map_file"]
