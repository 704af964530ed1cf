"""``TorchEvaluator``: a PyTorch model + dataset as a campaign evaluator, evaluated fast.

What is computed (the reference every path must agree with): every targeted
tensor is stored in the memory's format (``bitfault.torch.inject_tensor`` with an empty
map, so an IntQuant tensor is quantised even where a trial has no fault there),
the trial's maps fault their tensors (``bitfault.torch.inject_tensor``, bit for bit the
NumPy core), and the model's own ``forward`` runs on the data in eval mode under
``torch.no_grad()``, in batches of ``batch_size``. That is what
``bitfault.torch.inject_`` + ``model(x)`` computes. What is reused:

* the golden (fault-free) run, once per format and fault model;
* the clean activations of every node of the model's ``torch.fx`` graph: a
  trial whose faults sit in one tensor recomputes only the nodes that depend on
  it (``bitfault.torch.graph``);
* single faults (one element of one Linear/Conv weight): only the changed
  column/channel and what follows from it (``bitfault.torch.single_faults``).

Other trials (faults in several tensors) run the model once per map. Imports torch
lazily.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.campaign.evaluator import (
    GoldenRuns,
    Maps,
    MemoryKeys,
    check_max_bytes,
    digest_arrays,
    gathered_map,
    patch_faulty_elements,
    predicted_labels,
)
from bitfault.formats import plane_formats
from bitfault.formats.blocks import CODES
from bitfault.maps import FaultMap
from bitfault.memory import Memory, StoredArray
from bitfault.torch.graph import TracedGraph, run_nodes
from bitfault.torch.single_faults import SingleFaultPaths

EVALUATED_KINDS = ("weights", "biases", "buffers")  # stored tensors; activations: inject_


def _faulty_in(fmap: FaultMap, plane: str, eligible: int) -> bool:
    """Whether ``fmap`` has a fault in ``plane`` at a bit of ``eligible``."""
    pmap = fmap.plane(plane)
    return pmap is not None and bool(np.any(pmap.masks & np.uint32(eligible)))


@dataclass(frozen=True)
class _Patched:
    """What a replica tensor holds: its stored values but at ``index`` (under ``key``)."""

    key: tuple[str, tuple[str, str]]
    index: np.ndarray


class TorchEvaluator(SingleFaultPaths):
    """A PyTorch model on a dataset, implementing the campaign ``Evaluator`` protocol.

    ``targets``: what ``bitfault.Targets.coerce`` takes, of kinds "weights", "biases"
    and "buffers" (default "weights": the weights of every Linear, Conv1d/2d/3d and
    Embedding; "weights+biases"; a list of tensor names such as ``"fc1.weight"``,
    kept in its order), chosen by ``select_tensors`` as ``inject_`` chooses them;
    ``filter_fn(module, name) -> bool`` (or globs on module names) chooses modules.
    ``batch_size``: examples per forward pass (None: all at once).
    ``fast_paths=False`` turns off graph reuse and the single-fault shortcut
    (every trial then runs the whole model). ``max_bytes`` bounds the stacked
    activations of the single-fault path.
    """

    def __init__(self, model: Any, x: Any, y: Any, targets: Any = "weights", *,
                 filter_fn: Any = None, batch_size: int | None = None, device: str = "cpu",
                 fast_paths: bool = True, max_bytes: int = 256 << 20) -> None:
        import torch
        from torch import nn

        from bitfault.torch.seam import check_float_dtype
        from bitfault.torch.targets import select_tensors

        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(
                batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        max_bytes = check_max_bytes(max_bytes)
        self.device = torch.device(device)
        xt = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
        labels = np.asarray(y.cpu().numpy() if isinstance(y, torch.Tensor) else y)
        if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"y must be a 1-D array of integer class labels, got shape "
                             f"{labels.shape} and dtype {labels.dtype}")
        if xt.ndim == 0 or len(xt) != len(labels):
            raise ValueError(f"x and y must hold the same number of examples: x has "
                             f"{len(xt) if xt.ndim else 0}, y has {len(labels)}")
        if len(labels) == 0:
            raise ValueError("x and y must hold at least one example")
        self.x = xt.detach().to(self.device)
        self.labels = labels.astype(np.int64)
        self.model = copy.deepcopy(model).to(self.device).eval()
        self.batch_size = batch_size
        self.fast_paths = bool(fast_paths)
        self.max_bytes = max_bytes
        chosen = select_tensors(self.model, targets, filter_fn, kinds=EVALUATED_KINDS)
        if not chosen:
            raise ValueError("targets selects no tensor of the model")
        tensors = {t.name: t.tensor for t in chosen}
        names = list(tensors)
        for n in names:
            check_float_dtype(tensors[n].dtype, f"target tensor {n!r}")
        self.names = list(dict.fromkeys(names))
        self._clean = {n: tensors[n].detach() for n in self.names}
        self._owner = {n: n.rpartition(".") for n in self.names}  # name -> (module, ".", attr)
        self._key = MemoryKeys()  # the caches' key of a memory: its format and fault model
        self._views: dict[tuple[str, tuple[str, str]], tuple[np.ndarray, ...]] = {}
        self._patchable: dict[tuple[str, tuple[str, str]], tuple[Any, ...]] = {}
        self._stored_cache: dict[tuple[str, str], dict[str, Any]] = {}
        self._golden = GoldenRuns()
        self._graph: TracedGraph | bool | None = None  # None: not traced yet; False: untraceable
        self._replica: tuple[Any, dict[str, Any]] | None = None  # (model, its tensors by name)
        self._loaded: dict[str, Any] = {}  # name -> the tensor the replica holds (None: faulty)

    # ---- the Evaluator protocol ------------------------------------------------------------

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: tuple(self._clean[n].shape) for n in self.names}

    def model_digest(self) -> str:
        arrays = {k: v.detach().cpu().float().numpy() if v.is_floating_point() else
                  v.detach().cpu().numpy() for k, v in self.model.state_dict().items()}
        arrays["__targets__"] = np.array(self.names)
        return digest_arrays(arrays)

    def data_digest(self) -> str:
        return digest_arrays({"x": self.x.detach().cpu().numpy(), "y": self.labels})

    def predict(self, batch_of_maps: Sequence[Maps], memory: Memory) -> list[np.ndarray]:
        """Predicted labels for each map set (dict of tensor name -> FaultMap)."""
        planes = plane_formats(memory.format)
        eligible = {p: memory.fault.eligible_mask(memory.format, p) for p in planes}
        out: list[np.ndarray | None] = [None] * len(batch_of_maps)
        singles: dict[str, list[tuple[int, int, int]]] = {}
        for k, maps in enumerate(batch_of_maps):
            unknown = sorted(set(maps) - set(self.names))
            if unknown:
                raise ValueError(f"fault maps name unknown tensor(s) {unknown}; this evaluator's "
                                 f"tensors are {self.names}")
            faulted = {n: [p for p in planes if _faulty_in(m, p, eligible[p])]
                       for n, m in maps.items()}
            active = {n: m for n, m in maps.items() if faulted[n]}
            if not active:
                out[k] = self.golden(memory)
                continue
            if len(active) == 1 and self.fast_paths:
                (name, fmap), = active.items()
                if fmap.indices.size == 1 and faulted[name] == [CODES] and \
                        self._single_ok(name):
                    singles.setdefault(name, []).append(
                        (k, int(fmap.indices[0]), int(fmap.masks[0])))
                    continue
                if self.graph() is not None:
                    out[k] = self._predict_layer(name, fmap, memory)
                    continue
            out[k] = self._predict_full(active, memory)
        for name, faults in singles.items():
            for k, pred in self._predict_singles(name, faults, memory).items():
                out[k] = pred
        return [np.asarray(p) for p in out]

    # ---- pickling (Ray): caches are rebuilt on the worker ------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_key=MemoryKeys(), _views={}, _stored_cache={}, _golden=GoldenRuns(),
                     _graph=None, _patchable={}, _loaded={})
        return state

    # ---- shared pieces ---------------------------------------------------------------------

    def _batches(self) -> list[slice]:
        n = len(self.labels)
        size = self.batch_size or n
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def stored(self, memory: Memory) -> dict[str, Any]:
        """Every target tensor stored in the format, no fault (cached per format and fault)."""
        from bitfault.torch.seam import inject_tensor

        key = self._key(memory)
        if key not in self._stored_cache:
            self._stored_cache[key] = {
                n: inject_tensor(t, memory.format, memory.fault, FaultMap.empty(tuple(t.shape), n))
                for n, t in self._clean.items()}
        return self._stored_cache[key]

    def faulty(self, name: str, fmap: FaultMap, memory: Memory) -> Any:
        """``bitfault.torch.inject_tensor`` of the tensor (the compiled one-pass kernel where it
        applies); otherwise, for formats that store each element on its own (FixedPoint,
        Float), only the faulty elements are computed and written over the cached stored
        tensor (the same bits, at a cost proportional to the faults)."""
        import torch

        from bitfault.torch.seam import compiled_for, inject_tensor

        clean = self._clean[name]
        compiled = compiled_for(clean, memory.format)  # one fast pass
        if compiled or not patch_faulty_elements(memory.format, fmap):
            return inject_tensor(clean, memory.format, memory.fault, fmap)
        idx = torch.from_numpy(np.array(fmap.indices, np.int64)).to(clean.device)
        out = self.stored(memory)[name].clone()
        out.view(-1)[idx] = self._faulty_elements(name, idx, fmap, memory)
        return out

    def _faulty_elements(self, name: str, idx: Any, fmap: FaultMap, memory: Memory) -> Any:
        """The faulty values of the map's elements alone (flat ``idx`` = its indices), for a
        format that stores each element on its own (FixedPoint, Float)."""
        from bitfault.torch.seam import inject_tensor

        return inject_tensor(self._clean[name].reshape(-1)[idx], memory.format, memory.fault,
                      gathered_map(fmap))

    def _replica_tensors(self) -> dict[str, Any]:
        """A replica of the model that trials write their tensors into, by name (cheaper
        than ``functional_call``'s reparametrisation, and no copy for compiled formats)."""
        if self._replica is None:
            replica = copy.deepcopy(self.model)
            tensors = dict(replica.named_parameters())
            tensors.update(replica.named_buffers())
            self._replica = (replica, tensors)
        return self._replica[1]

    def _forward(self, params: Mapping[str, Any]) -> np.ndarray:
        """Predictions of the whole model with ``params`` in place of its tensors."""
        import torch

        tensors = self._replica_tensors()
        with torch.no_grad():
            for name, t in params.items():
                if self._loaded.get(name) is not t:  # what the replica holds already stays
                    tensors[name].copy_(t)
                    self._loaded[name] = t
        return self._run_replica()

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

    def golden(self, memory: Memory) -> np.ndarray:
        """Predictions with every target stored in the format and no fault (computed once)."""
        return self._golden.get(self._key(memory), lambda: self._forward(self.stored(memory)))

    def _predict_full(self, maps: Maps, memory: Memory) -> np.ndarray:
        params = dict(self.stored(memory))
        for name, fmap in maps.items():
            if fmap.n_faults and self._write_faulty(name, fmap, memory):
                del params[name]  # the replica holds its faulty values already
            elif fmap.n_faults:
                params[name] = self.faulty(name, fmap, memory)
        return self._forward(params)

    # ---- the traced graph --------------------------------------------------------------------

    def graph(self) -> TracedGraph | None:
        """The model's fx graph, or None when it cannot be traced (then every trial runs
        the whole model)."""
        if self._graph is None:
            self._graph = TracedGraph.trace(self.model) or False
        return self._graph or None

    def _clean_env(self, memory: Memory) -> list[dict[Any, Any]] | None:
        """Clean values of every node per data batch; None if the graph is not the model."""
        import torch

        g = self.graph()
        if g is None:
            return None
        key = self._key(memory)
        if key not in g.clean:
            envs = []
            with torch.no_grad():
                for b in self._batches():
                    env: dict[Any, Any] = {}
                    run_nodes(self.model, g.nodes, env, self.stored(memory), self.x[b])
                    envs.append(env)
            preds = np.concatenate([predicted_labels(e[g.output].float().cpu().numpy())
                                    for e in envs])
            if not isinstance(envs[0][g.output], torch.Tensor) or not np.array_equal(
                    preds, self.golden(memory)):
                self._graph = False  # the trace does not reproduce the model: no reuse
                return None
            g.clean[key] = envs
        return g.clean[key]

    def _predict_layer(self, name: str, fmap: FaultMap, memory: Memory) -> np.ndarray:
        """Faults in one tensor: recompute only the nodes that depend on it."""
        import torch

        envs = self._clean_env(memory)
        seeds = self.graph().seeds(name) if envs is not None else []
        if not seeds:
            return self._predict_full({name: fmap}, memory)
        g = self.graph()
        dirty = g.dependents(seeds)
        start = g.position[seeds[0]]
        if g.output not in dirty:
            return self.golden(memory)
        params = dict(self.stored(memory))
        params[name] = self.faulty(name, fmap, memory)
        preds = []
        with torch.no_grad():
            for b, clean in zip(self._batches(), envs, strict=True):
                env = dict(clean)
                run_nodes(self.model, g.nodes[start:], env, params, self.x[b], only=dirty)
                preds.append(predicted_labels(env[g.output].float().cpu().numpy()))
        return np.concatenate(preds)
