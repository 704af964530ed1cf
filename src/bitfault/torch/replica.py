"""The replica of ``TorchEvaluator``'s model that trials write their faulty tensors into.

One deep copy, written in place: the compiled kernel writes a faulty tensor straight into
it; elsewhere ``bitfault.StoredArray`` puts the previous map's elements back and writes
this map's faulty ones (a cost in proportion to the faults).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.campaign.evaluator import predicted_labels
from bitfault.maps import FaultMap
from bitfault.memory import Memory, StoredArray


@dataclass(frozen=True)
class _Patched:
    """What a replica tensor holds: its stored values but at ``index`` (under ``key``)."""

    key: tuple[str, tuple[str, str]]
    index: np.ndarray


class ReplicaWrites:
    """The replica ``TorchEvaluator`` writes each trial's tensors into (a mixin of it: it
    uses its model, clean and stored tensors and caches). Keys are tensor paths in the
    model; a tied tensor is one tensor of the replica under each of its paths."""

    model: Any
    x: Any
    _clean: dict[str, Any]
    _replica: tuple[Any, dict[str, Any]] | None
    _loaded: dict[str, Any]
    _views: dict[Any, tuple[np.ndarray, ...]]
    _patchable: dict[Any, tuple[Any, ...]]
    _key: Any

    def _replica_tensors(self) -> dict[str, Any]:
        """A replica of the model that trials write their tensors into, by name (cheaper
        than ``functional_call``'s reparametrisation, and no copy for compiled formats)."""
        if self._replica is None:
            replica = copy.deepcopy(self.model)
            tensors = dict(replica.named_parameters(remove_duplicate=False))
            tensors.update(replica.named_buffers(remove_duplicate=False))
            self._replica = (replica, tensors)
        return self._replica[1]

    def _forward(self, params: Mapping[str, Any]) -> np.ndarray:
        """Predictions of the whole model with ``params`` in place of its tensors."""
        self._load(params)
        return self._run_replica()

    def _load(self, params: Mapping[str, Any]) -> None:
        """Write ``params`` (path -> tensor) into the replica, skipping what it holds."""
        import torch

        tensors = self._replica_tensors()
        with torch.no_grad():
            for name, t in params.items():
                if self._loaded.get(name) is not t:  # what the replica holds already stays
                    tensors[name].copy_(t)
                    self._loaded[name] = t

    def _run_replica(self) -> np.ndarray:
        import torch

        replica = self._replica[0]
        preds = []
        with torch.no_grad():
            for b in self._batches():
                logits = replica(self.x[b])
                preds.append(predicted_labels(logits.float().cpu().numpy()))
        return np.concatenate(preds)

    def _write_faulty(self, name: str, fmap: FaultMap, memory: Memory) -> bool:
        """Write the faulty tensor straight into the replica with the compiled kernel; False
        where that does not apply (another device or dtype, a format it lacks, NaN or inf
        in an IntQuant tensor), and the replica is then untouched or to be overwritten."""
        from bitfault.torch.seam import compiled_for, compiled_pass

        key = (name, self._key(memory))
        views = self._views.get(key)
        if views is None:  # flat NumPy views of the clean tensor and the replica's, kept
            clean, dst = self._clean[name], self._replica_tensors()[name]
            views = (clean.reshape(-1).numpy(), dst.detach().view(-1).numpy()) if (
                compiled_for(clean, memory.format) and dst.is_contiguous()) else ()
            self._views[key] = views
        if not views:
            return self._patch_stored(name, fmap, memory)
        self._loaded[name] = None
        return compiled_pass(memory.format, memory.fault, fmap)(*views)

    def _patch_stored(self, name: str, fmap: FaultMap, memory: Memory) -> bool:
        """Where the compiled pass does not apply (a Float format, FixedPoint "wrap", a
        float64 tensor...) on the CPU: the replica's tensor keeps the stored values, the
        elements the previous map faulted are put back and this map's faulty ones written,
        computed by ``bitfault.StoredArray`` (the same bits as injecting the tensor, at a
        cost in proportion to the faults). False where it does not apply either."""
        key = (name, self._key(memory))
        cached = self._patchable.get(key)
        if cached is None:
            clean, dst = self._clean[name], self._replica_tensors()[name]
            ok = (clean.device.type == "cpu" and dst.is_contiguous() and
                  str(clean.dtype) in ("torch.float32", "torch.float64", "torch.float16"))
            stored = self.stored(memory)[name]
            cached = self._patchable[key] = (
                StoredArray.of(clean.numpy(), memory.format), stored,
                stored.reshape(-1).numpy(), dst.detach().view(-1).numpy()) if ok else ()
        if not cached:
            return False
        array, stored, stored_flat, dst = cached
        idx, values = array.faulty_elements(memory.fault, fmap)
        held = self._loaded.get(name)
        self._loaded[name] = None  # while writing: a failure leaves it unknown
        if isinstance(held, _Patched) and held.key == key:
            dst[held.index] = stored_flat[held.index]
        elif held is not stored:
            np.copyto(dst, stored_flat)
        dst[idx] = values
        self._loaded[name] = _Patched(key, idx)
        return True



__all__ = ["ReplicaWrites"]
