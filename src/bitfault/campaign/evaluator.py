"""What the engine asks of a model + dataset, and the pieces every evaluator shares.

The ``Evaluator`` protocol, ``NumpyEvaluator`` (a NumPy forward function), and the
framework-free caches and helpers that the adapters' evaluators (``TorchEvaluator``,
``KerasEvaluator``) share: keys per memory (format and fault model), golden runs, a
byte-bounded cache, digests and predicted labels.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from bitfault.formats import FixedPoint, Float
from bitfault.inject import inject
from bitfault.maps import FaultMap
from bitfault.memory.memory import Memory

Maps = dict[str, FaultMap]
MemoryKey = tuple[str, str]
T = TypeVar("T")


class Evaluator(Protocol):
    """What the engine needs from a model + dataset: predictions per set of fault maps,
    every tensor stored in ``memory`` (its format, faulted by its fault model). A
    data-dependent memory (``Memory.data_dependent``) also needs ``clean_tensor(name)``:
    the tensor's clean float values (NumPy, PyTorch layout), from which its maps are
    drawn. An evaluator with fast paths may hold ``fallbacks`` (tensor -> the error a fast
    path failed with, after which it took the exact path): ``run`` stores it beside the
    trials and returns it in ``CampaignResult.fallbacks``."""

    labels: np.ndarray

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]: ...

    def predict(self, batch_of_maps: Sequence[Maps], memory: Memory) -> list[np.ndarray]: ...

    def model_digest(self) -> str: ...

    def data_digest(self) -> str: ...


def digest_arrays(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over the arrays' names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(name.encode())
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def predicted_labels(logits: np.ndarray) -> np.ndarray:
    """Argmax per row; a NaN logit (a flipped exponent can make one) never wins."""
    logits = np.asarray(logits, dtype=np.float64)
    logits = np.where(np.isnan(logits), -np.inf, logits)
    return np.argmax(logits, axis=1)


@dataclass
class NumpyEvaluator:
    """A NumPy model: ``forward(params, x) -> logits`` with named float parameters."""

    forward: Callable[[Mapping[str, np.ndarray], np.ndarray], np.ndarray]
    params: Mapping[str, np.ndarray]
    x: np.ndarray
    labels: np.ndarray
    targets: Sequence[str] | None = None

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        names = self.targets if self.targets is not None else list(self.params)
        return {n: tuple(np.shape(self.params[n])) for n in names}

    def predict(self, batch_of_maps: Sequence[Maps], memory: Memory) -> list[np.ndarray]:
        out = []
        for maps in batch_of_maps:
            params = dict(self.params)
            for name, fmap in maps.items():
                params[name] = inject(np.asarray(self.params[name]), memory.format,
                                      memory.fault, fmap)
            with np.errstate(all="ignore"):
                logits = self.forward(params, self.x)
            out.append(predicted_labels(logits))
        return out

    def clean_tensor(self, name: str) -> np.ndarray:
        """The clean values of tensor ``name`` (for data-dependent memories)."""
        return np.asarray(self.params[name])

    def model_digest(self) -> str:
        return digest_arrays(dict(self.params))

    def data_digest(self) -> str:
        return digest_arrays({"x": self.x, "y": self.labels})


def check_max_bytes(max_bytes: Any) -> int:
    """An evaluator's cache bound: a non-negative integer of bytes."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, np.integer)) or \
            max_bytes < 0:
        raise ValueError(f"max_bytes must be a non-negative integer (bytes), got {max_bytes!r}")
    return int(max_bytes)


def memory_key(memory: Memory) -> MemoryKey:
    """The caches' key for a memory's format and fault model: their reprs (a Memory's
    ``==`` and hash would equate ``per_channel=True``, axis 0, and ``per_channel=1``)."""
    return (repr(memory.format), repr(memory.fault))


class MemoryKeys:
    """``memory_key`` remembered per Memory object (a campaign passes the same memory to
    every call), for evaluators that look it up on every trial."""

    def __init__(self) -> None:
        self._keys: dict[int, tuple[Memory, MemoryKey]] = {}

    def __call__(self, memory: Memory) -> MemoryKey:
        hit = self._keys.get(id(memory))
        if hit is None or hit[0] is not memory:
            if len(self._keys) > 64:
                self._keys.clear()
            hit = self._keys[id(memory)] = (memory, memory_key(memory))
        return hit[1]


class GoldenRuns:
    """The golden (fault-free) predictions, computed once per memory (format and fault
    model); every call returns a copy, so a caller may write into it."""

    def __init__(self) -> None:
        self._runs: dict[MemoryKey, np.ndarray] = {}

    def get(self, key: MemoryKey, compute: Callable[[], np.ndarray]) -> np.ndarray:
        if key not in self._runs:
            self._runs[key] = compute()
        return self._runs[key].copy()


class BoundedCache(Generic[T]):
    """Values kept while all of them together fit in ``max_bytes`` (``nbytes`` measures
    one); a value that would not fit is not kept, and its key remembers that (None)."""

    def __init__(self, max_bytes: int, nbytes: Callable[[T], int]) -> None:
        self.max_bytes = check_max_bytes(max_bytes)
        self._nbytes = nbytes
        self._values: dict[Hashable, T | None] = {}

    def get(self, key: Hashable, compute: Callable[[], T]) -> T | None:
        """The value under ``key`` (computed on the first call), or None where it did not fit."""
        if key not in self._values:
            value = compute()
            used = sum(self._nbytes(v) for v in self._values.values() if v is not None)
            self._values[key] = value if used + self._nbytes(value) <= self.max_bytes else None
        return self._values[key]


def stores_elementwise(fmt: Any) -> bool:
    """The format stores each element on its own (FixedPoint, Float: no calibration across
    the tensor), so a map's faulty values can be computed for its faulty elements alone."""
    return isinstance(fmt, (FixedPoint, Float))


def patch_faulty_elements(fmt: Any, fmap: FaultMap) -> bool:
    """Whether evaluators compute ``fmap``'s tensor as the cached stored tensor with only the
    faulty elements recomputed: a format that ``stores_elementwise`` and a map touching at
    most an eighth of the elements (beyond that one pass over the tensor is cheaper)."""
    return stores_elementwise(fmt) and fmap.indices.size * 8 <= fmap.size


def gathered_map(fmap: FaultMap) -> FaultMap:
    """``fmap`` for the 1-D gather of its faulty elements (element k is ``fmap.indices[k]``)."""
    n = int(fmap.indices.size)
    return FaultMap((n,), np.arange(n, dtype=np.int64), fmap.masks, fmap.name)


__all__ = ["BoundedCache", "Evaluator", "GoldenRuns", "Maps", "MemoryKey", "MemoryKeys",
           "NumpyEvaluator", "check_max_bytes", "digest_arrays", "gathered_map", "memory_key",
           "patch_faulty_elements", "predicted_labels", "stores_elementwise"]
