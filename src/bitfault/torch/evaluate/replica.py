"""The one copy of the model that ``TorchEvaluator`` keeps, and how trials write into it.

The evaluator deep-copies the user's model once, onto its device: that replica is the
only copy. Between trials its targeted tensors hold their *stored* values (the memory's
fault-free values, computed once per format and fault model); the clean float values
the faults start from are read from the user's own tensors (no copy where the model
lives on the evaluator's device; else its targeted tensors are copied there once).
A trial writes its faulty tensors into the replica and remembers what it overwrote; the
next ``stored`` call puts those elements back (a cost in proportion to the faults). The
compiled kernel writes a faulty tensor straight into it; for formats that store each
element on its own, ``bitfault.StoredArray`` (kept within ``max_bytes``) gives the
faulty elements alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.campaign.evaluator import predicted_labels
from bitfault.errors import ArgumentError
from bitfault.formats import plane_formats
from bitfault.formats.blocks import CODES
from bitfault.maps import FaultMap
from bitfault.memory.memory import Memory, StoredArray
from bitfault.torch.evaluate.budget import ByteBudget, array_bytes

WHOLE = None  # an undo record: the whole tensor is to be stored again


@dataclass(frozen=True)
class _Patched:
    """An undo record: the replica tensor holds its stored values but at ``index`` (flat),
    whose stored values are ``values``."""

    index: Any
    values: Any


def confined(fmap: FaultMap, memory: Memory) -> bool:
    """Whether ``fmap`` changes no element outside ``fmap.indices``: faults in the codes
    plane alone (a fault in a scale or minimum word changes its whole block)."""
    return all(p == CODES or fmap.plane(p) is None or not fmap.plane(p).n_faults
               for p in plane_formats(memory.format))


class ReplicaWrites:
    """The replica ``TorchEvaluator`` writes each trial's tensors into (a mixin of it: it
    uses its model, clean tensors and caches). Keys are tensor paths in the model; a
    tied tensor is one tensor of the replica under each of its paths."""

    model: Any
    x: Any
    _clean: dict[str, Any]
    _replica: tuple[Any, dict[str, Any]] | None
    _holds: Any
    _undo: dict[str, _Patched | None]
    _versions: dict[str, tuple[Any, int]]
    _views: dict[Any, tuple[np.ndarray, ...]]
    _patchable: dict[Any, StoredArray | None]
    _budget: ByteBudget
    _envs: dict[Any, Any]
    _per_example: dict[Any, int]
    _key: Any
    _batches: Any

    def _replica_tensors(self) -> dict[str, Any]:
        """The replica's tensors by path (every path of a tied tensor)."""
        if self._replica is None:
            tensors = dict(self.model.named_parameters(remove_duplicate=False))
            tensors.update(self.model.named_buffers(remove_duplicate=False))
            self._replica = (self.model, tensors)
        return self._replica[1]

    def check_model_unchanged(self) -> None:
        """Refuse to go on when one of the user's tensors this evaluator reads its clean
        values from was changed in place since it was built (PyTorch's version counter:
        an optimiser step, ``load_state_dict``, ``copy_``; not writes through ``.data``)."""
        for path, (t, version) in self._versions.items():
            if self._clean.get(path) is t and t._version != version:
                raise ArgumentError(
                    "model", path, "left unchanged while its evaluator is used",
                    requirement=f"the model's tensor {path!r} was changed in place after the "
                                "evaluator was built; the evaluator reads the clean values "
                                "from the model (it keeps no copy): build a new evaluator")

    def stored(self, memory: Memory) -> dict[str, Any]:
        """Every target tensor stored in the format, no fault: the replica's own tensors,
        with the last trial's faulty elements put back (its state for ``memory``)."""
        from bitfault.torch.seam import inject_tensor

        self.check_model_unchanged()
        key = self._key(memory)
        tensors = self._replica_tensors()
        if self._holds != key:
            self._holds = None  # while writing: unknown
            self._undo.clear()
            self._forget_other(key)
            for path, clean in self._clean.items():
                self._write_whole(path, inject_tensor(clean, memory.format, memory.fault,
                                                      FaultMap.empty(tuple(clean.shape), path)))
            self._holds = key
        elif self._undo:
            self._put_back(memory)
        return {p: tensors[p] for p in self._clean}

    def _forget_other(self, key: Any) -> None:
        """What the caches hold for memories other than ``key`` goes: the replica holds one
        memory's stored values at a time, and the budget is for that memory."""
        for cache in (self._patchable, self._views):
            for k in [k for k in cache if k[1] != key]:
                value = cache.pop(k)
                if cache is self._patchable and value is not None:
                    self._budget.give(array_bytes(value))
        for k in [k for k in self._envs if k != key]:
            for env in self._envs.pop(k):
                if env is not None:
                    self._budget.give(env.nbytes)
        self._per_example = {k: v for k, v in self._per_example.items() if k == key}

    def _write_whole(self, path: str, value: Any) -> None:
        import torch

        with torch.no_grad():
            self._replica_tensors()[path].copy_(value)

    def _put_back(self, memory: Memory) -> None:
        """Undo the writes of the trials since the replica last held its stored values."""
        import torch

        from bitfault.torch.seam import inject_tensor

        tensors = self._replica_tensors()
        with torch.no_grad():
            for path, rec in list(self._undo.items()):
                if rec is WHOLE:
                    clean = self._clean[path]
                    self._write_whole(path, inject_tensor(
                        clean, memory.format, memory.fault, FaultMap.empty(tuple(clean.shape))))
                else:
                    tensors[path].view(-1)[rec.index] = rec.values
                del self._undo[path]

    def _remember(self, path: str, fmap: FaultMap | None, memory: Memory) -> Any:
        """Record what a write of ``fmap``'s faulty tensor overwrites (the stored values at
        its indices, or the whole tensor); returns the flat indices (or None)."""
        if path in self._undo:  # written twice in one trial: the whole tensor goes back
            self._undo[path] = WHOLE
            return None
        if fmap is None or not confined(fmap, memory):
            self._undo[path] = WHOLE
            return None
        dst = self._replica_tensors()[path]
        idx = self._index(fmap, dst.device)
        self._undo[path] = _Patched(idx, dst.detach().reshape(-1)[idx].clone())
        return idx

    @staticmethod
    def _index(fmap: FaultMap, device: Any) -> Any:
        """The map's flat element indices as a tensor on ``device``."""
        import torch

        return torch.from_numpy(np.array(fmap.indices, np.int64)).to(device)

    def _forward(self, params: Mapping[str, Any]) -> np.ndarray:
        """Predictions of the whole model with ``params`` in place of its tensors."""
        self._load(params)
        return self._run_replica()

    def _load(self, params: Mapping[str, Any]) -> None:
        """Write ``params`` (path -> tensor) into the replica, skipping its own tensors; a
        tensor written so is stored again whole by the next ``stored`` call."""
        tensors = self._replica_tensors()
        for name, t in params.items():
            if t is not tensors[name]:
                self._undo[name] = WHOLE
                self._write_whole(name, t)

    def _run_replica(self) -> np.ndarray:
        import torch

        preds = []
        with torch.no_grad():
            for b in self._batches():
                logits = self.model(self.x[b])
                preds.append(predicted_labels(logits.float().cpu().numpy()))
        return np.concatenate(preds)

    def _write_faulty(self, name: str, fmap: FaultMap, memory: Memory) -> bool:
        """Write ``fmap``'s faulty tensor into the replica (which holds ``stored(memory)``):
        the compiled kernel straight into it where it applies; else the faulty elements
        alone (``_patch_stored``); else the whole faulty tensor (``inject_tensor``).
        Returns True: the replica then holds it (the signature callers test)."""
        from bitfault.torch.seam import compiled_for, compiled_pass, inject_tensor

        key = (name, self._key(memory))
        views = self._views.get(key)
        if views is None:  # flat NumPy views of the clean tensor and the replica's, kept
            clean, dst = self._clean[name], self._replica_tensors()[name]
            views = (clean.reshape(-1).numpy(), dst.detach().view(-1).numpy()) if (
                compiled_for(clean, memory.format) and clean.is_contiguous()
                and dst.is_contiguous()) else ()
            self._views[key] = views
        if views:
            self._remember(name, fmap, memory)
            if compiled_pass(memory.format, memory.fault, fmap)(*views):
                return True
            self._undo[name] = WHOLE  # NaN/inf in an IntQuant tensor: the kernel wrote NaN
        elif self._patch_stored(name, fmap, memory):
            return True
        else:  # the whole tensor, equal to the stored one outside the map's elements
            self._remember(name, fmap, memory)  # when the map is ``confined``
        self._write_whole(name, inject_tensor(self._clean[name], memory.format, memory.fault,
                                              fmap))
        return True

    def _stored_array(self, name: str, memory: Memory) -> StoredArray | None:
        """``bitfault.StoredArray`` of a CPU tensor in a format that stores each element on
        its own (kept while the evaluator's ``max_bytes`` allows; else None)."""
        key = (name, self._key(memory))
        if key not in self._patchable:
            clean = self._clean[name]
            array = None
            ok = clean.device.type == "cpu" and str(clean.dtype) in (
                "torch.float32", "torch.float64", "torch.float16")
            if ok and self._budget.fits(clean.numel() * (clean.element_size() + 4)):
                array = StoredArray.of(clean.numpy(), memory.format)
                if not self._budget.take(array_bytes(array)):
                    array = None
            self._patchable[key] = array
        return self._patchable[key]

    def _patch_stored(self, name: str, fmap: FaultMap, memory: Memory) -> bool:
        """A format that stores each element on its own (FixedPoint, Float) and a sparse
        map: only the map's elements are written, computed by ``bitfault.StoredArray`` on
        the CPU (kept within ``max_bytes``) or else by ``inject_tensor`` on them alone (the
        same bits as injecting the tensor). False where it does not apply."""
        import torch

        from bitfault.campaign.evaluator import patch_faulty_elements

        dst = self._replica_tensors()[name]
        if not patch_faulty_elements(memory.format, fmap) or not dst.is_contiguous():
            return False
        array = self._stored_array(name, memory)
        idx = self._remember(name, fmap, memory)
        if idx is None:  # written before in this trial
            self._write_whole(name, self._faulty_tensor(name, fmap, memory))
            return True
        with torch.no_grad():
            if array is not None:
                where, values = array.faulty_elements(memory.fault, fmap)
                dst.view(-1)[torch.from_numpy(where)] = torch.from_numpy(values)
            else:
                dst.view(-1)[idx] = self._faulty_elements(name, idx, fmap, memory)
        return True

    def _faulty_tensor(self, name: str, fmap: FaultMap, memory: Memory) -> Any:
        from bitfault.torch.seam import inject_tensor

        return inject_tensor(self._clean[name], memory.format, memory.fault, fmap)

    def _faulty_elements(self, name: str, idx: Any, fmap: FaultMap, memory: Memory) -> Any:
        """The faulty values of the map's elements alone (flat ``idx`` = its indices), for a
        format that stores each element on its own (FixedPoint, Float)."""
        from bitfault.campaign.evaluator import gathered_map
        from bitfault.torch.seam import inject_tensor

        return inject_tensor(self._clean[name].reshape(-1)[idx], memory.format, memory.fault,
                             gathered_map(fmap))


__all__ = ["ReplicaWrites", "confined"]
