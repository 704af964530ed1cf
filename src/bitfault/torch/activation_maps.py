"""The fault maps of activations, one sample's map per output shape.

An activation map covers one sample, ``output.shape[1:]``. By default every new shape
(a text batch padded to another length) draws its own map: the spec's map for that shape,
so the faulty cells of a position depend on the length the batch was padded to. With a
fixed ``length`` the memory holding an activation is addressed as a buffer of ``length``
rows: the map is drawn once for ``(length, *shape[1:])`` and a shorter output takes its
first rows (in C order, the first ``rows * prod(shape[1:])`` elements), so the element at
position ``t`` has the same faults at every length; a longer output is refused.
"""

from __future__ import annotations

import math
from typing import Any

from bitfault.errors import ArgumentError, check_int
from bitfault.maps import FaultMap
from bitfault.memory.memory import check_map_fits


def leading_rows(fmap: FaultMap, rows: int) -> FaultMap:
    """The map of the first ``rows`` rows (axis 0) of ``fmap``'s tensor, and of its
    planes with a leading row axis (a block format's plane maps along a later axis)."""
    shape = tuple(fmap.shape)
    if not shape or rows == shape[0]:
        return fmap
    keep = fmap.indices < rows * math.prod(shape[1:])
    planes = {p: leading_rows(m, rows) if m.shape and m.shape[0] == shape[0] else m
              for p, m in fmap.planes.items()}
    return FaultMap((rows, *shape[1:]), fmap.indices[keep], fmap.masks[keep], fmap.name,
                    fmap.meta, planes)


class ActivationMaps:
    """Per faulted module, its one-sample maps by shape (``length``: see the module
    docstring); ``clear()`` when the spec or step changes."""

    def __init__(self, names: dict[str, str], length: int | None = None) -> None:
        self.names = names
        self.length = None if length is None else check_int(length, "activation_length", 1)
        self.by_shape: dict[str, dict[tuple[int, ...], FaultMap]] = {a: {} for a in names}

    def get(self, module: str, shape: tuple[int, ...], spec: Any, step: int) -> FaultMap:
        """The map of ``module``'s output of per-sample ``shape`` at ``step``."""
        by_shape = self.by_shape[module]
        fmap = by_shape.get(shape)
        if fmap is not None:
            return fmap
        name = self.names[module]
        if self.length is None:
            fmap = spec.map_for(name, shape, step)
        else:
            if not shape or shape[0] > self.length:
                raise ArgumentError("activation_length", self.length,
                                    "at least the first per-sample dimension of every output",
                                    requirement=f"activations of {module!r} have per-sample "
                                                f"shape {shape}: longer than "
                                                f"activation_length={self.length} rows")
            full = (self.length, *shape[1:])
            fmap = leading_rows(spec.map_for(name, full, step), shape[0])
        check_map_fits(fmap, shape, spec.format, argument=f"maps[{name!r}]")
        by_shape[shape] = fmap
        return fmap

    def latest(self) -> dict[str, FaultMap]:
        """Tensor name -> the map of the latest shape of each module."""
        return {self.names[m]: next(reversed(v.values())) for m, v in self.by_shape.items()
                if v}

    def clear(self) -> None:
        for by_shape in self.by_shape.values():
            by_shape.clear()


__all__ = ["ActivationMaps", "leading_rows"]
