"""``TorchEvaluator``: a PyTorch model + dataset as a campaign evaluator, evaluated fast.

What is computed (the reference every path must agree with): every targeted
tensor is stored in the memory's format (``bitfault.torch.inject_tensor`` with an empty
map, so an IntQuant tensor is quantised even where a trial has no fault there),
the trial's maps fault their tensors (``bitfault.torch.inject_tensor``, bit for bit the
NumPy core), and the model's own ``forward`` runs on the data in eval mode under
``torch.no_grad()``, in batches of ``batch_size``. That is what
``bitfault.torch.inject_`` + ``model(x)`` computes. What is reused:

* the golden (fault-free) run, once per format and fault model;
* one copy of the model (``bitfault.torch.evaluate.replica``): its targeted tensors hold their
  stored values, a trial writes its faulty ones in and the next puts them back; the
  clean values are read from the user's model;
* the clean activations of the model's ``torch.fx`` graph, per data batch within
  ``max_bytes`` (``bitfault.torch.evaluate.activations``): a trial whose faults sit in one tensor
  recomputes only the nodes that depend on it;
* single faults (one element of one Linear/Conv weight): only the changed
  column/channel and what follows from it (``bitfault.torch.evaluate.single_faults``).

Other trials (faults in several tensors) run the model once per map. Every cache shares
the one budget ``max_bytes`` (``bitfault.torch.evaluate.budget``). ``plan()`` says which path each
tensor's faults take and why; a fast path that fails at run time hands its tensor to the
exact path (one warning, recorded in ``fallbacks``). Imports torch lazily.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bitfault.campaign.evaluator import (
    GoldenRuns,
    Maps,
    MemoryKeys,
    check_max_bytes,
    digest_arrays,
    patch_faulty_elements,
)
from bitfault.formats import plane_formats
from bitfault.maps import FaultMap
from bitfault.memory.memory import Memory
from bitfault.torch.evaluate.activations import CleanActivations
from bitfault.torch.evaluate.budget import ByteBudget
from bitfault.torch.evaluate.planner import LAYER, SHORTCUT, Plan, evaluation_plan
from bitfault.torch.evaluate.replica import ReplicaWrites, _Patched
from bitfault.torch.evaluate.single_faults import SingleFaultPaths

EVALUATED_KINDS = ("weights", "biases", "buffers")  # stored tensors; activations: inject_
# what a pickled evaluator leaves behind (rebuilt on the worker by ``_fresh_caches``)
CACHES = ("_budget", "_views", "_patchable", "_envs", "_per_example", "_golden", "_graph",
          "_replica", "_single_calls", "_single_why", "_roles")


def faulty_in(fmap: FaultMap, plane: str, eligible: int) -> bool:
    """Whether ``fmap`` has a fault in ``plane`` at a bit of ``eligible``."""
    pmap = fmap.plane(plane)
    return pmap is not None and pmap.masks.size > 0 and \
        bool(np.any(pmap.masks & np.uint32(eligible)))


class TorchEvaluator(SingleFaultPaths, CleanActivations, ReplicaWrites):
    """A PyTorch model on a dataset, implementing the campaign ``Evaluator`` protocol.

    ``targets``: what ``bitfault.Targets.coerce`` takes, of kinds "weights", "biases"
    and "buffers" (default "weights": the weights of every Linear, Conv1d/2d/3d and
    Embedding; "weights+biases"; a list of tensor names such as ``"fc1.weight"``,
    kept in its order), chosen by ``select_tensors`` as ``inject_`` chooses them;
    ``filter_fn(module, name) -> bool`` (or globs on module names) chooses modules.
    ``batch_size``: examples per forward pass (None: all at once). ``device``: where the
    evaluator's one copy of the model runs.
    ``fast_paths=False`` turns off graph reuse and the single-fault shortcut
    (every trial then runs the whole model). ``max_bytes`` bounds what the evaluator
    keeps between trials (clean activations, stored arrays; one budget) and each
    working stack of the single-fault path. ``root=`` / ``name_prefix=`` name the tensors
    as ``inject_`` does (``naming`` records it; the names enter ``model_digest``). A tied
    tensor is one memory: one name, one map, every module using it sees its faults.
    The clean values are read from ``model``'s own tensors: changing them in place while
    the evaluator is in use is refused (``check_model_unchanged``).
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
               name_prefix: str | None, copy_model: bool = True) -> None:
        """Choose the tensors (public names, model paths, tied places), make the one copy
        of the model (the replica) and the caches. ``copy_model`` is kept for callers:
        the evaluator always works on its one copy."""
        from bitfault.torch.seam import check_float_dtype
        from bitfault.torch.slots import join_name
        from bitfault.torch.targets import Naming, select_tensors

        naming = Naming.of(model, root, name_prefix)
        self.naming = naming.to_dict()
        chosen = select_tensors(model, targets, filter_fn, kinds=EVALUATED_KINDS,
                                naming=naming)
        if not chosen:
            raise ValueError("targets selects no tensor of the model")
        for t in chosen:
            check_float_dtype(t.tensor.dtype, f"target tensor {t.name!r}")
        self.model = copy.deepcopy(model).to(self.device).eval()  # the replica
        self.names = [t.name for t in chosen]  # public names: the maps' names
        paths = [join_name(t.module, t.attr) for t in chosen]
        self._path = dict(zip(self.names, paths, strict=True))
        # model path -> the other paths of a tied tensor (one memory)
        self._aliases = {join_name(t.module, t.attr): [join_name(*p) for p in t.also]
                         for t in chosen if t.also}
        # the clean values: the user's tensors (copied once when on another device)
        self._clean = {p: t.tensor.detach().to(self.device)
                       for p, t in zip(paths, chosen, strict=True)}
        self._versions: dict[str, tuple[Any, int]] = {}  # path -> (user's tensor, version)
        for p, t in zip(paths, chosen, strict=True):
            c = self._clean[p]
            if c.device == t.tensor.device and c.data_ptr() == t.tensor.data_ptr():
                self._versions[p] = (c, c._version)
        self._owner = {p: (t.module, ".", t.attr) for p, t in zip(paths, chosen, strict=True)}
        self._key = MemoryKeys()  # the caches' key of a memory: its format and fault model
        self._holds: Any = None  # the memory key whose stored values the replica holds
        self._undo: dict[str, Any] = {}  # path -> what to put back (None: all of it)
        self.fallbacks: dict[str, str] = {}  # tensor -> the error a fast path failed with
        self._shortcut_faults: dict[str, int] = {}  # path -> single faults it evaluated
        self._full_only: set[str] = set()  # paths whose layer path failed: whole model
        self._fresh_caches()

    def _fresh_caches(self) -> None:
        """Empty caches (also what a pickled evaluator starts from)."""
        self._budget = ByteBudget(self.max_bytes)  # shared by every cache below
        self._views: dict[tuple[str, tuple[str, str]], tuple[np.ndarray, ...]] = {}
        self._patchable: dict[tuple[str, tuple[str, str]], Any] = {}
        self._envs: dict[Any, Any] = {}
        self._per_example: dict[Any, dict[int, int]] = {}  # memory -> start -> bytes
        self._single_calls: dict[str, Any] = {}  # tensor -> its single-fault call
        self._single_why: dict[str, str] = {}  # tensor -> why that path (``plan``)
        self._roles: Any = None  # how the graph's nodes follow the batch (batch_roles)
        self._golden = GoldenRuns()
        self._graph: Any = None  # None: not traced yet; False: untraceable
        self._replica: tuple[Any, dict[str, Any]] | None = None  # (model, its tensors)

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
        """The clean model's tensors (the replica's, with the clean values of its targets)
        and the target names."""
        clean = dict(self._clean)
        for path, others in self._aliases.items():
            clean.update(dict.fromkeys(others, self._clean[path]))
        arrays = {}
        for k, v in self.model.state_dict().items():
            v = clean.get(k, v).detach().cpu()
            arrays[k] = v.float().numpy() if v.is_floating_point() else v.numpy()
        arrays["__targets__"] = np.array(self.names + [f"{k}={v}" for k, v in
                                                       sorted(self.naming.items())])
        return digest_arrays(arrays)

    def data_digest(self) -> str:
        return digest_arrays({"x": self.x.detach().cpu().numpy(), "y": self.labels})

    def predict(self, batch_of_maps: Sequence[Maps], memory: Memory) -> list[np.ndarray]:
        """Predicted labels for each map set (dict of tensor name -> FaultMap)."""
        self.check_model_unchanged()
        planes = plane_formats(memory.format)
        eligible = {p: memory.fault.eligible_mask(memory.format, p) for p in planes}
        out: list[np.ndarray | None] = [None] * len(batch_of_maps)
        singles: dict[str, list[tuple[int, int, int]]] = {}
        try:
            for k, maps in enumerate(batch_of_maps):
                maps = self._by_path(maps)
                faulted = {n: [p for p in planes if faulty_in(m, p, eligible[p])]
                           for n, m in maps.items()}
                active = {n: m for n, m in maps.items() if faulted[n]}
                if not active:
                    out[k] = self.golden(memory)
                    continue
                path = self.trial_path(active, faulted)  # the planner's choice
                if path == SHORTCUT:
                    (name, fmap), = active.items()
                    singles.setdefault(name, []).append(
                        (k, int(fmap.indices[0]), int(fmap.masks[0])))
                elif path == LAYER:
                    (name, fmap), = active.items()
                    out[k] = self._layer_or_full(name, fmap, memory)
                else:
                    out[k] = self._predict_full(active, memory)
            if singles:  # one pass over the data for every tensor's single faults
                for k, pred in self._predict_singles(singles, memory).items():
                    out[k] = pred
        finally:
            if self._undo and self._holds == self._key(memory):
                self._put_back(memory)  # the replica holds its stored values again
        return [np.asarray(p) for p in out]

    def _layer_or_full(self, path: str, fmap: FaultMap, memory: Memory) -> np.ndarray:
        """The layer path; where it fails (an assumption of the traced graph), the whole
        model, said once per tensor and recorded in ``fallbacks``."""
        if path in self._full_only:
            return self._predict_full({path: fmap}, memory)
        try:
            return self._predict_layer(path, fmap, memory)
        except Exception as err:
            name = next(n for n, p in self._path.items() if p == path)
            self._full_only.add(path)
            self.fallbacks[name] = f"layer path: {type(err).__name__}: {err}"
            warnings.warn(f"TorchEvaluator: the layer path failed on tensor {name!r} "
                          f"({type(err).__name__}: {err}); its trials run the whole model",
                          RuntimeWarning, stacklevel=3)
            return self._predict_full({path: fmap}, memory)

    def plan(self, memory: Memory | None = None) -> Plan:
        """Which path each target tensor's faults take and why
        (``bitfault.torch.evaluate.planner``); with ``memory``, also whether the traced
        graph reproduces its golden run."""
        return evaluation_plan(self, memory)

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
        state = {k: v for k, v in self.__dict__.items() if k not in CACHES}
        state.update(_key=MemoryKeys(), _versions={})  # the worker holds its own copies
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # the replica as pickled, with what it holds (_undo)
        self._fresh_caches()

    # ---- shared pieces ---------------------------------------------------------------------

    def _batches(self) -> list[slice]:
        n = len(self.labels)
        size = self.batch_size or n
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def faulty(self, name: str, fmap: FaultMap, memory: Memory) -> Any:
        """The faulty tensor, a new one (``bitfault.torch.inject_tensor``'s bits): for
        formats that store each element on its own (FixedPoint, Float) and a sparse map,
        the stored tensor with only the faulty elements computed."""
        from bitfault.torch.seam import compiled_for, inject_tensor

        clean = self._clean[name]
        if compiled_for(clean, memory.format) or not patch_faulty_elements(memory.format,
                                                                            fmap):
            return inject_tensor(clean, memory.format, memory.fault, fmap)
        if self._holds != self._key(memory):
            self.stored(memory)
        if name in self._undo and self._undo[name] is None:  # holds another tensor now
            out = inject_tensor(clean, memory.format, memory.fault,
                                FaultMap.empty(tuple(clean.shape)))
        else:
            out = self._replica_tensors()[name].detach().clone()
            rec = self._undo.get(name)
            if isinstance(rec, _Patched):  # its stored values where a trial wrote
                out.view(-1)[rec.index] = rec.values
        idx = self._index(fmap, clean.device)
        out.view(-1)[idx] = self._faulty_elements(name, idx, fmap, memory)
        return out

    def golden(self, memory: Memory) -> np.ndarray:
        """Predictions with every target stored in the format and no fault (computed once)."""
        return self._golden.get(self._key(memory), lambda: self._forward(self.stored(memory)))

    def _predict_full(self, maps: Maps, memory: Memory) -> np.ndarray:
        """The whole model with the maps' faulty tensors written into the replica."""
        self.stored(memory)
        for name, fmap in maps.items():
            if fmap.n_faults:
                self._write_faulty(name, fmap, memory)
        return self._run_replica()
