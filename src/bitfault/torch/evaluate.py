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
from bitfault.memory import Memory
from bitfault.torch.graph import TracedGraph, run_nodes
from bitfault.torch.replica import ReplicaWrites, _Patched  # noqa: F401 (tests read it)
from bitfault.torch.single_faults import SingleFaultPaths

EVALUATED_KINDS = ("weights", "biases", "buffers")  # stored tensors; activations: inject_


def faulty_in(fmap: FaultMap, plane: str, eligible: int) -> bool:
    """Whether ``fmap`` has a fault in ``plane`` at a bit of ``eligible``."""
    pmap = fmap.plane(plane)
    return pmap is not None and bool(np.any(pmap.masks & np.uint32(eligible)))


class TorchEvaluator(SingleFaultPaths, ReplicaWrites):
    """A PyTorch model on a dataset, implementing the campaign ``Evaluator`` protocol.

    ``targets``: what ``bitfault.Targets.coerce`` takes, of kinds "weights", "biases"
    and "buffers" (default "weights": the weights of every Linear, Conv1d/2d/3d and
    Embedding; "weights+biases"; a list of tensor names such as ``"fc1.weight"``,
    kept in its order), chosen by ``select_tensors`` as ``inject_`` chooses them;
    ``filter_fn(module, name) -> bool`` (or globs on module names) chooses modules.
    ``batch_size``: examples per forward pass (None: all at once).
    ``fast_paths=False`` turns off graph reuse and the single-fault shortcut
    (every trial then runs the whole model). ``max_bytes`` bounds the stacked
    activations of the single-fault path. ``root=`` / ``name_prefix=`` name the tensors
    as ``inject_`` does (``naming`` records it; the names enter ``model_digest``). A tied
    tensor is one memory: one name, one map, every module using it sees its faults.
    """

    def __init__(self, model: Any, x: Any, y: Any, targets: Any = "weights", *,
                 filter_fn: Any = None, batch_size: int | None = None, device: str = "cpu",
                 fast_paths: bool = True, max_bytes: int = 256 << 20, root: Any = None,
                 name_prefix: str | None = None) -> None:
        import torch
        from torch import nn

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
        self.batch_size = batch_size
        self.fast_paths = bool(fast_paths)
        self.max_bytes = max_bytes
        self._setup(model, targets, filter_fn, root, name_prefix, copy_model=True)

    def _setup(self, model: Any, targets: Any, filter_fn: Any, root: Any,
               name_prefix: str | None, copy_model: bool) -> None:
        """Choose the tensors (public names, model paths, tied places) and the caches."""
        from bitfault.torch.seam import check_float_dtype
        from bitfault.torch.slots import join_name
        from bitfault.torch.targets import Naming, select_tensors

        naming = Naming.of(model, root, name_prefix)
        self.naming = naming.to_dict()
        self.model = (copy.deepcopy(model) if copy_model else model).to(self.device).eval()
        chosen = select_tensors(self.model, targets, filter_fn, kinds=EVALUATED_KINDS,
                                naming=naming)
        if not chosen:
            raise ValueError("targets selects no tensor of the model")
        for t in chosen:
            check_float_dtype(t.tensor.dtype, f"target tensor {t.name!r}")
        self.names = [t.name for t in chosen]  # public names: the maps' names
        paths = [join_name(t.module, t.attr) for t in chosen]
        self._path = dict(zip(self.names, paths, strict=True))
        # model path -> the other paths of a tied tensor (one memory)
        self._aliases = {join_name(t.module, t.attr): [join_name(*p) for p in t.also]
                         for t in chosen if t.also}
        self._clean = {p: t.tensor.detach() if copy_model else t.tensor.detach().clone()
                       for p, t in zip(paths, chosen, strict=True)}
        self._owner = {p: (t.module, ".", t.attr) for p, t in zip(paths, chosen, strict=True)}
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
        return {n: tuple(self._clean[self._path[n]].shape) for n in self.names}

    def clean_tensor(self, name: str) -> np.ndarray:
        """The clean values of tensor ``name`` in NumPy (bfloat16 as float32, the same
        values): what a data-dependent memory's maps are drawn with."""
        import torch

        t = self._clean[self._path[name]].detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()

    def model_digest(self) -> str:
        arrays = {k: v.detach().cpu().float().numpy() if v.is_floating_point() else
                  v.detach().cpu().numpy() for k, v in self.model.state_dict().items()}
        arrays["__targets__"] = np.array(self.names + [f"{k}={v}" for k, v in
                                                       sorted(self.naming.items())])
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
            maps = self._by_path(maps)
            faulted = {n: [p for p in planes if faulty_in(m, p, eligible[p])]
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

    def _by_path(self, maps: Maps) -> Maps:
        """``maps`` keyed by model path (they come keyed by public name)."""
        unknown = sorted(set(maps) - set(self.names))
        if unknown:
            raise ValueError(f"fault maps name unknown tensor(s) {unknown}; this evaluator's "
                             f"tensors are {self.names}")
        return {self._path[n]: m for n, m in maps.items()}

    def _with_aliases(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` also under every other path of a tied tensor (for ``run_nodes``)."""
        out = dict(params)
        for path, others in self._aliases.items():
            if path in params:
                out.update(dict.fromkeys(others, params[path]))
        return out

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
                    run_nodes(self.model, g.nodes, env, self._with_aliases(
                        self.stored(memory)), self.x[b])
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
        seeds = self.graph().seeds(name, *self._aliases.get(name, ())) \
            if envs is not None else []
        if not seeds:
            return self._predict_full({name: fmap}, memory)
        g = self.graph()
        dirty = g.dependents(seeds)
        start = g.position[seeds[0]]
        if g.output not in dirty:
            return self.golden(memory)
        params = dict(self.stored(memory))
        params[name] = self.faulty(name, fmap, memory)
        params = self._with_aliases(params)
        preds = []
        with torch.no_grad():
            for b, clean in zip(self._batches(), envs, strict=True):
                env = dict(clean)
                run_nodes(self.model, g.nodes[start:], env, params, self.x[b], only=dirty)
                preds.append(predicted_labels(env[g.output].float().cpu().numpy()))
        return np.concatenate(preds)
