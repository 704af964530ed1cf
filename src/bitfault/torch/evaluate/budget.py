"""The one byte budget (``max_bytes``) that ``TorchEvaluator``'s caches share, and exact
byte counts of what they hold.

What is counted: the bytes a cache keeps alive, in tensor storages (a view counts its
whole storage once, however many views share it) and NumPy buffers. Not counted: the
replica's own tensors and the evaluator's data, which a cache entry may reference but
which exist anyway.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields, is_dataclass
from typing import Any

import numpy as np


class ByteBudget:
    """``max_bytes`` shared by caches: ``take(n)`` keeps ``n`` more bytes if they fit;
    ``used`` is what is kept now, ``peak`` the most ever kept."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self.used = 0
        self.peak = 0

    def fits(self, n: int) -> bool:
        return self.used + n <= self.max_bytes

    def take(self, n: int) -> bool:
        """Keep ``n`` bytes more (True) or, where they would not fit, nothing (False)."""
        if not self.fits(n):
            return False
        self.used += n
        self.peak = max(self.peak, self.used)
        return True

    def give(self, n: int) -> None:
        self.used -= n


def tensors_in(value: Any) -> list[Any]:
    """The tensors in a node's value (a tensor, or tuples/lists/dicts of them)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def storages(values: Iterable[Any]) -> dict[tuple[str, int], int]:
    """(device, data pointer) -> bytes of every tensor storage in ``values``."""
    out: dict[tuple[str, int], int] = {}
    for v in values:
        for t in tensors_in(v):
            s = t.untyped_storage()
            out[(str(t.device), s.data_ptr())] = s.nbytes()
    return out


def held_bytes(values: Iterable[Any], exclude: Any = ()) -> int:
    """Bytes of the distinct storages of ``values``, leaving out the keys in ``exclude``."""
    return sum(n for k, n in storages(values).items() if k not in exclude)


def array_bytes(obj: Any) -> int:
    """Bytes of the distinct NumPy buffers an object holds (dataclass fields, dicts, tuples:
    e.g. a ``StoredArray``)."""
    seen: dict[int, int] = {}

    def walk(v: Any) -> None:
        if isinstance(v, np.ndarray):
            base = v
            while isinstance(base.base, np.ndarray):
                base = base.base
            seen[id(base)] = base.nbytes
        elif is_dataclass(v) and not isinstance(v, type):
            for f in fields(v):
                walk(getattr(v, f.name))
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (tuple, list)):
            for x in v:
                walk(x)

    walk(obj)
    return sum(seen.values())


__all__ = ["ByteBudget", "array_bytes", "held_bytes", "storages", "tensors_in"]
