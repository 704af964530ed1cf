"""``TorchEvaluator``: a PyTorch model + dataset as a campaign evaluator, evaluated fast.

What is computed (the reference every path must agree with): every targeted
tensor is stored in the spec's format (``bitfault.torch.inject`` with an empty
map, so an IntQuant tensor is quantised even where a trial has no fault there),
the trial's maps fault their tensors (``bitfault.torch.inject``, bit for bit the
NumPy core), and the model's own ``forward`` runs on the data in eval mode under
``torch.no_grad()``, in batches of ``batch_size``. That is what
``bitfault.torch.inject_`` + ``model(x)`` computes. What is reused:

* the golden (fault-free) run, once per format and fault model;
* the clean activations of every node of the model's ``torch.fx`` graph (one
  traced clean run, checked to equal ``model(x)`` bit for bit): a trial whose
  faults sit in one tensor recomputes only the graph nodes that depend on that
  tensor, starting at the module that owns it (exact: the same operations on
  the same values);
* single faults (one element of one Linear/Conv weight): only the changed
  column/channel of that module's output is computed, only for the examples it
  changes, and the rest of the graph runs once for the changed examples of many
  faults stacked together (dropping examples whose values come back to clean).
  Conv channels are recomputed with the faulty weight; a Linear column is
  ``clean + x[:, j] * (w' - w)``, which can differ from a full matmul in the last
  bit of that column (see docs/campaigns.md).

Other trials (faults in several tensors) run the model once per map. Imports torch
lazily (``bitfault.campaign`` works without it).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.campaign.evaluator import (
    Maps,
    check_max_bytes,
    digest_arrays,
    gathered_map,
    patch_faulty_elements,
    predicted_labels,
    stores_elementwise,
)
from bitfault.memory import StoredArray
from bitfault.maps import FaultMap
from bitfault.spec import FaultSpec

TargetSpec = Sequence[str] | Callable[[Any, str], bool] | None


@dataclass(frozen=True)
class _Patched:
    """What a replica tensor holds: its stored values but at ``index`` (under ``key``)."""

    key: tuple[str, tuple[str, str]]
    index: np.ndarray


class _Graph:
    """The traced model: nodes in order and, per data batch, the clean value of every node."""

    def __init__(self, gm: Any) -> None:
        self.nodes = [n for n in gm.graph.nodes]
        self.position = {n: i for i, n in enumerate(self.nodes)}
        self.output = next(n for n in self.nodes if n.op == "output")
        self.clean: dict[str, list[dict[Any, Any]]] = {}  # spec key -> per batch: node -> value


class TorchEvaluator:
    """A PyTorch model on a dataset, implementing the campaign ``Evaluator`` protocol.

    ``targets``: None (the weights of every Linear, Conv1d/2d/3d and Embedding,
    plus their biases when ``biases=True``), a list of tensor names
    (``"fc1.weight"``), or ``filter(module, name) -> bool`` choosing modules.
    ``batch_size``: examples per forward pass (None: all at once).
    ``fast_paths=False`` turns off graph reuse and the single-fault shortcut
    (every trial then runs the whole model). ``max_bytes`` bounds the stacked
    activations of the single-fault path.
    """

    def __init__(self, model: Any, x: Any, y: Any, targets: TargetSpec = None, *,
                 biases: bool = False, batch_size: int | None = None, device: str = "cpu",
                 fast_paths: bool = True, max_bytes: int = 256 << 20) -> None:
        import torch
        from torch import nn

        from bitfault.torch import DEFAULT_MODULES
        from bitfault.torch._kernels import check_float_dtype

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
        tensors = dict(self.model.named_parameters())
        tensors.update(self.model.named_buffers())
        if targets is None or callable(targets):
            accept = targets or (lambda m, fqn: isinstance(m, DEFAULT_MODULES))
            names = []
            for fqn, mod in self.model.named_modules():
                if accept(mod, fqn):
                    for leaf in ("weight",) + (("bias",) if biases else ()):
                        if isinstance(getattr(mod, leaf, None), torch.Tensor):
                            names.append(f"{fqn}.{leaf}" if fqn else leaf)
        elif isinstance(targets, str):
            raise TypeError("targets must be a list of tensor names, a filter function or None; "
                            f"got the string {targets!r} (wrap it in a list)")
        else:
            names = list(targets)
            unknown = [n for n in names if n not in tensors]
            if unknown:
                raise ValueError(f"targets names unknown tensor(s) {unknown}; the model's tensors "
                                 f"are {sorted(tensors)}")
        if not names:
            raise ValueError("targets selects no tensor of the model")
        for n in names:
            check_float_dtype(tensors[n].dtype, f"target tensor {n!r}")
        self.names = list(dict.fromkeys(names))
        self._clean = {n: tensors[n].detach() for n in self.names}
        self._owner = {n: n.rpartition(".") for n in self.names}  # name -> (module, ".", attr)
        self._keys: dict[int, tuple[FaultSpec, tuple[str, str]]] = {}
        self._views: dict[tuple[str, tuple[str, str]], tuple[np.ndarray, ...]] = {}
        self._memories: dict[tuple[str, tuple[str, str]], tuple[Any, ...]] = {}
        self._stored_cache: dict[tuple[str, str], dict[str, Any]] = {}
        self._golden: dict[tuple[str, str], np.ndarray] = {}
        self._graph: _Graph | bool | None = None  # None: not traced yet; False: untraceable
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

    def predict(self, batch_of_maps: Sequence[Maps], spec: FaultSpec) -> list[np.ndarray]:
        """Predicted labels for each map set (dict of tensor name -> FaultMap)."""
        eligible = spec.fault.eligible_mask(spec.format)
        out: list[np.ndarray | None] = [None] * len(batch_of_maps)
        singles: dict[str, list[tuple[int, int, int]]] = {}
        for k, maps in enumerate(batch_of_maps):
            unknown = sorted(set(maps) - set(self.names))
            if unknown:
                raise ValueError(f"fault maps name unknown tensor(s) {unknown}; this evaluator's "
                                 f"tensors are {self.names}")
            active = {n: m for n, m in maps.items()
                      if np.any(m.masks & np.uint32(eligible))}
            if not active:
                out[k] = self.golden(spec)
                continue
            if len(active) == 1 and self.fast_paths:
                (name, fmap), = active.items()
                if fmap.indices.size == 1 and self._single_ok(name):
                    singles.setdefault(name, []).append(
                        (k, int(fmap.indices[0]), int(fmap.masks[0])))
                    continue
                if self.graph() is not None:
                    out[k] = self._predict_layer(name, fmap, spec)
                    continue
            out[k] = self._predict_full(active, spec)
        for name, faults in singles.items():
            for k, pred in self._predict_singles(name, faults, spec).items():
                out[k] = pred
        return [np.asarray(p) for p in out]

    # ---- pickling (Ray): caches are rebuilt on the worker ------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_keys={}, _views={}, _stored_cache={}, _golden={}, _graph=None,
                     _memories={}, _loaded={})
        return state

    # ---- shared pieces ---------------------------------------------------------------------

    def _batches(self) -> list[slice]:
        n = len(self.labels)
        size = self.batch_size or n
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def stored(self, spec: FaultSpec) -> dict[str, Any]:
        """Every target tensor stored in the format, no fault (cached per format and fault)."""
        from bitfault.torch import inject

        key = self._key(spec)
        if key not in self._stored_cache:
            self._stored_cache[key] = {
                n: inject(t, spec.format, spec.fault, FaultMap.empty(tuple(t.shape), n))
                for n, t in self._clean.items()}
        return self._stored_cache[key]

    def _key(self, spec: FaultSpec) -> tuple[str, str]:
        """The caches' key for a spec's format and fault model (their reprs: ``==`` would
        equate ``per_channel=True`` and ``per_channel=1``); remembered per spec object."""
        hit = self._keys.get(id(spec))
        if hit is None or hit[0] is not spec:
            if len(self._keys) > 64:
                self._keys.clear()
            hit = self._keys[id(spec)] = (spec, (repr(spec.format), repr(spec.fault)))
        return hit[1]

    def faulty(self, name: str, fmap: FaultMap, spec: FaultSpec) -> Any:
        """``bitfault.torch.inject`` of the tensor (the compiled one-pass kernel where it
        applies); otherwise, for formats that store each element on its own (FixedPoint,
        Float), only the faulty elements are computed and written over the cached stored
        tensor (the same bits, at a cost proportional to the faults)."""
        import torch

        from bitfault.torch import inject
        from bitfault.torch._kernels import compiled_for

        clean = self._clean[name]
        compiled = compiled_for(clean, spec.format)  # one fast pass
        if compiled or not patch_faulty_elements(spec.format, fmap):
            return inject(clean, spec.format, spec.fault, fmap)
        idx = torch.from_numpy(np.array(fmap.indices, np.int64)).to(clean.device)
        out = self.stored(spec)[name].clone()
        out.view(-1)[idx] = self._faulty_elements(name, idx, fmap, spec)
        return out

    def _faulty_elements(self, name: str, idx: Any, fmap: FaultMap, spec: FaultSpec) -> Any:
        """The faulty values of the map's elements alone (flat ``idx`` = its indices), for a
        format that stores each element on its own (FixedPoint, Float)."""
        from bitfault.torch import inject

        return inject(self._clean[name].reshape(-1)[idx], spec.format, spec.fault,
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

    def _write_faulty(self, name: str, fmap: FaultMap, spec: FaultSpec) -> bool:
        """Write the faulty tensor straight into the replica with the compiled kernel; False
        where that does not apply (another device or dtype, a format it lacks, NaN or inf
        in an IntQuant tensor), and the replica is then untouched or to be overwritten."""
        from bitfault.torch import _fused
        from bitfault.torch._kernels import compiled_for

        key = (name, self._key(spec))
        views = self._views.get(key)
        if views is None:  # flat NumPy views of the clean tensor and the replica's, kept
            clean, dst = self._clean[name], self._replica_tensors()[name]
            views = (clean.reshape(-1).numpy(), dst.detach().view(-1).numpy()) if (
                compiled_for(clean, spec.format) and dst.is_contiguous()) else ()
            self._views[key] = views
        if not views:
            return self._patch_stored(name, fmap, spec)
        self._loaded[name] = None
        return _fused.bind_map(spec.format, spec.fault, fmap)(*views)

    def _patch_stored(self, name: str, fmap: FaultMap, spec: FaultSpec) -> bool:
        """Where the compiled pass does not apply (a Float format, FixedPoint "wrap", a
        float64 tensor...) on the CPU: the replica's tensor keeps the stored values, the
        elements the previous map faulted are put back and this map's faulty ones written,
        computed by ``bitfault.StoredArray`` (the same bits as injecting the tensor, at a
        cost in proportion to the faults). False where it does not apply either."""
        key = (name, self._key(spec))
        memory = self._memories.get(key)
        if memory is None:
            clean, dst = self._clean[name], self._replica_tensors()[name]
            ok = (clean.device.type == "cpu" and dst.is_contiguous() and
                  str(clean.dtype) in ("torch.float32", "torch.float64", "torch.float16"))
            stored = self.stored(spec)[name]
            memory = self._memories[key] = (
                StoredArray.of(clean.numpy(), spec.format), stored,
                stored.reshape(-1).numpy(), dst.detach().view(-1).numpy()) if ok else ()
        if not memory:
            return False
        array, stored, stored_flat, dst = memory
        idx, values = array.faulty_elements(spec.fault, fmap)
        held = self._loaded.get(name)
        self._loaded[name] = None  # while writing: a failure leaves it unknown
        if isinstance(held, _Patched) and held.key == key:
            dst[held.index] = stored_flat[held.index]
        elif held is not stored:
            np.copyto(dst, stored_flat)
        dst[idx] = values
        self._loaded[name] = _Patched(key, idx)
        return True

    def golden(self, spec: FaultSpec) -> np.ndarray:
        """Predictions with every target stored in the format and no fault (computed once)."""
        key = self._key(spec)
        if key not in self._golden:
            self._golden[key] = self._forward(self.stored(spec))
        return self._golden[key].copy()

    def _predict_full(self, maps: Maps, spec: FaultSpec) -> np.ndarray:
        params = dict(self.stored(spec))
        for name, fmap in maps.items():
            if fmap.n_faults and self._write_faulty(name, fmap, spec):
                del params[name]  # the replica holds its faulty values already
            elif fmap.n_faults:
                params[name] = self.faulty(name, fmap, spec)
        return self._forward(params)

    # ---- the traced graph --------------------------------------------------------------------

    def graph(self) -> _Graph | None:
        """The model's fx graph, or None when it cannot be traced (then every trial runs
        the whole model)."""
        if self._graph is None:
            import torch.fx

            try:
                self._graph = _Graph(torch.fx.symbolic_trace(self.model))
            except Exception:  # data-dependent control flow etc.: no reuse, still correct
                self._graph = False
        return self._graph or None

    def _attr(self, target: str) -> Any:
        return functools.reduce(getattr, target.split("."), self.model)

    def _run(self, nodes: Sequence[Any], env: dict[Any, Any], params: Mapping[str, Any],
             x: Any, only: set[Any] | None = None) -> None:
        """Evaluate ``nodes`` in order into ``env`` (the same calls the model's forward makes),
        with ``params`` (tensor name -> value) in place of the module's own tensors."""
        from torch.func import functional_call
        from torch.fx.node import map_arg

        for node in nodes:
            if only is not None and node not in only:
                continue
            op = node.op
            if op == "placeholder":
                env[node] = x
            elif op == "get_attr":
                env[node] = params.get(node.target, None)
                if env[node] is None:
                    env[node] = self._attr(node.target)
            elif op == "output":
                env[node] = map_arg(node.args[0], lambda n: env[n])
            else:
                args = map_arg(node.args, lambda n: env[n])
                kwargs = map_arg(node.kwargs, lambda n: env[n])
                if op == "call_function":
                    env[node] = node.target(*args, **kwargs)
                elif op == "call_method":
                    env[node] = getattr(args[0], node.target)(*args[1:], **kwargs)
                else:  # call_module
                    prefix = node.target + "."
                    own = {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)
                           and "." not in k[len(prefix):]}
                    mod = self.model.get_submodule(node.target)
                    env[node] = functional_call(mod, own, args, kwargs) if own else mod(*args,
                                                                                       **kwargs)

    def _clean_env(self, spec: FaultSpec) -> list[dict[Any, Any]] | None:
        """Clean values of every node per data batch; None if the graph is not the model."""
        import torch

        g = self.graph()
        if g is None:
            return None
        key = self._key(spec)
        if key not in g.clean:
            envs = []
            with torch.no_grad():
                for b in self._batches():
                    env: dict[Any, Any] = {}
                    self._run(g.nodes, env, self.stored(spec), self.x[b])
                    envs.append(env)
            preds = np.concatenate([predicted_labels(e[g.output].float().cpu().numpy())
                                    for e in envs])
            if not isinstance(envs[0][g.output], torch.Tensor) or not np.array_equal(
                    preds, self.golden(spec)):
                self._graph = False  # the trace does not reproduce the model: no reuse
                return None
            g.clean[key] = envs
        return g.clean[key]

    def _seeds(self, name: str) -> list[Any]:
        module, _, attr = self._owner[name]
        g = self.graph()
        return [n for n in g.nodes if (n.op == "call_module" and n.target == module)
                or (n.op == "get_attr" and n.target == name)]

    def _predict_layer(self, name: str, fmap: FaultMap, spec: FaultSpec) -> np.ndarray:
        """Faults in one tensor: recompute only the nodes that depend on it."""
        import torch

        envs = self._clean_env(spec)
        seeds = self._seeds(name) if envs is not None else []
        if not seeds:
            return self._predict_full({name: fmap}, spec)
        g = self.graph()
        dirty = set(seeds)
        start = g.position[seeds[0]]
        for node in g.nodes[start:]:
            if any(a in dirty for a in node.all_input_nodes):
                dirty.add(node)
        if g.output not in dirty:
            return self.golden(spec)
        params = dict(self.stored(spec))
        params[name] = self.faulty(name, fmap, spec)
        preds = []
        with torch.no_grad():
            for b, clean in zip(self._batches(), envs, strict=True):
                env = dict(clean)
                self._run(g.nodes[start:], env, params, self.x[b], only=dirty)
                preds.append(predicted_labels(env[g.output].float().cpu().numpy()))
        return np.concatenate(preds)

    # ---- single faults ---------------------------------------------------------------------

    def _single_ok(self, name: str) -> bool:
        from torch import nn

        module, _, attr = self._owner[name]
        mod = self.model.get_submodule(module) if module else self.model
        if attr != "weight" or self.graph() is None:
            return False
        if isinstance(mod, nn.Linear):
            pass
        elif isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            if mod.groups != 1 or mod.padding_mode != "zeros":
                return False
        else:
            return False
        seeds = self._seeds(name)
        return (len(seeds) == 1 and seeds[0].op == "call_module" and len(seeds[0].args) == 1
                and not seeds[0].kwargs)

    def _predict_singles(self, name: str, faults: list[tuple[int, int, int]],
                         spec: FaultSpec) -> dict[int, np.ndarray]:
        """Single faults in one weight: (trial position, flat element, mask) each."""
        envs = self._clean_env(spec)
        if envs is None:
            return {k: self._predict_full({name: self._single_map(name, e, m)}, spec)
                    for k, e, m in faults}
        golden = self.golden(spec)
        preds = {k: golden.copy() for k, _, _ in faults}
        # faults on distinct elements can share one injection (the format acts per element)
        groups: list[list[tuple[int, int, int]]] = []
        seen: dict[int, int] = {}  # element -> faults on it so far: its k-th goes to group k
        for f in faults:
            k = seen.get(f[1], 0)
            seen[f[1]] = k + 1
            if k == len(groups):
                groups.append([])
            groups[k].append(f)
        for grp in groups:
            self._singles_group(name, grp, spec, envs, preds)
        return preds

    def _single_map(self, name: str, element: int, mask: int) -> FaultMap:
        shape = tuple(self._clean[name].shape)
        return FaultMap(shape, np.array([element], np.int64), np.array([mask], np.uint32), name)

    def _singles_group(self, name: str, faults: list[tuple[int, int, int]], spec: FaultSpec,
                       envs: list[dict[Any, Any]], preds: dict[int, np.ndarray]) -> None:
        """Faults on distinct elements of one Linear/Conv weight, evaluated together."""
        import torch
        from torch import nn

        g = self.graph()
        shape = tuple(self._clean[name].shape)
        node = self._seeds(name)[0]
        module = self.model.get_submodule(node.target)
        if isinstance(module, nn.Linear) and envs[0][node.args[0]].ndim != 2:
            for k, e, m in faults:  # (batch, ..., features) inputs: no column shortcut
                preds[k] = self._predict_layer(name, self._single_map(name, e, m), spec)
            return
        dirty = {node}
        start = g.position[node]
        for n in g.nodes[start + 1:]:
            if any(a in dirty for a in n.all_input_nodes):
                dirty.add(n)
        if g.output not in dirty:
            return
        elems = np.array([e for _, e, _ in faults], np.int64)
        order = np.argsort(elems)
        joint = FaultMap(shape, elems[order], np.array([m for _, _, m in faults],
                                                       np.uint32)[order], name)
        stored_all = self.stored(spec)
        stored = stored_all[name]
        idx_all = torch.as_tensor(elems, device=self.device)
        if stores_elementwise(spec.format):  # only the faulty elements change
            new_all = torch.empty(len(faults), dtype=stored.dtype, device=self.device)
            sorted_idx = torch.as_tensor(order, device=self.device)
            new_all[sorted_idx] = self._faulty_elements(name, idx_all[sorted_idx], joint, spec)
        else:
            new_all = self.faulty(name, joint, spec).reshape(-1)[idx_all]
        params = {k: v for k, v in stored_all.items() if k != name}
        bias = stored_all.get(f"{node.target}.bias", module.bias)
        out_numel = envs[0][node][0].numel()
        per_fault = max(1, (self.max_bytes // 4) // max(1, out_numel // max(1, shape[0])
                                                       * len(self.labels)))
        if isinstance(module, nn.Linear):
            per_fault = len(faults)
        with torch.no_grad():
            for c in range(0, len(faults), per_fault):
                idx = idx_all[c:c + per_fault]
                new_w, old_w = new_all[c:c + per_fault], stored.reshape(-1)[idx]
                offset = 0
                for b, clean in zip(self._batches(), envs, strict=True):
                    xin, out = clean[node.args[0]], clean[node]
                    if isinstance(module, nn.Linear):
                        col = idx // shape[1]
                        old = out[:, col]  # (N, F)
                        new = old + xin[:, idx % shape[1]] * (new_w - old_w)
                    else:
                        per = int(np.prod(shape[1:]))
                        col = idx // per
                        kernels = stored.reshape(shape[0], -1)[col].clone()
                        kernels[torch.arange(len(idx)), idx % per] = new_w
                        kernels = kernels.reshape(len(idx), *shape[1:])
                        new = module._conv_forward(xin, kernels,
                                                   None if bias is None else bias[col])
                    self._suffix(g, node, dirty, clean, new, col, c, params, len(xin), faults,
                                 preds, offset)
                    offset += b.stop - b.start

    def _rank_one_linear(self, node: Any, prev: Any, clean: Mapping[Any, Any]) -> Any:
        """The nn.Linear that ``node`` calls on ``prev`` alone, with (N, features) input; or
        None. Then a change in one feature changes its output by a rank-one update."""
        from torch import nn

        if node.op != "call_module" or node.args != (prev,) or node.kwargs:
            return None
        mod = self.model.get_submodule(node.target)
        ok = isinstance(mod, nn.Linear) and clean[prev].ndim == 2
        return mod if ok else None

    def _suffix(self, g: _Graph, node: Any, dirty: set[Any], clean: dict[Any, Any],
                vals: Any, col: Any, first: int, params: Mapping[str, Any], n_batch: int,
                faults: list[tuple[int, int, int]], preds: dict[int, np.ndarray],
                offset: int) -> None:
        """Run the dirty nodes after ``node`` for faults ``first ...`` at once.

        ``vals[n, f]`` is channel ``col[f]`` (dim 1) of ``node``'s output for example ``n``
        under fault ``f``; every other channel is clean. Per-channel operations (ReLU, max
        pooling) run on these channels alone (``(N, F, ...)``, as if F were channels:
        exact); an example whose channel is back to clean is clean from there on. The
        first other operation gets whole rows, only for changed (example, fault) pairs,
        stacked along the batch dimension in memory-sized chunks: the same calls as the
        model's forward.
        """
        import torch

        after = [n for n in g.nodes[g.position[node] + 1:] if n in dirty]
        prev, k = node, 0
        changed = _changed(vals, clean[node].index_select(1, col))
        while k < len(after) and _per_channel(after[k], prev, self.model):
            tmp = {prev: vals}
            self._run([after[k]], tmp, params, None)
            vals, prev = tmp[after[k]], after[k]
            changed &= _changed(vals, clean[prev].index_select(1, col))
            k += 1
        rows_n, rows_f = torch.nonzero(changed, as_tuple=True)
        if not len(rows_n):
            return
        row_bytes = max(1, clean[prev][0].numel() * clean[prev].element_size() * 4)
        step = max(1, self.max_bytes // row_bytes)
        rest = after[k:]
        linear = self._rank_one_linear(rest[0], prev, clean) if rest else None
        for a in range(0, len(rows_n), step):
            rn, rf = rows_n[a:a + step], rows_f[a:a + step]
            if linear is not None:
                # one input feature changed: the Linear's output moves by delta * W[:, feature]
                weight = params.get(f"{rest[0].target}.weight", linear.weight)
                delta = vals[rn, rf] - clean[prev][rn, col[rf]]
                env: dict[Any, Any] = {rest[0]: torch.addcmul(
                    clean[rest[0]][rn], delta[:, None], weight[:, col[rf]].T)}
                todo = rest[1:]
            else:
                full = clean[prev][rn].clone()
                full[torch.arange(len(rn)), col[rf]] = vals[rn, rf]
                env = {prev: full}
                todo = rest
            for n in todo:
                for inp in n.all_input_nodes:
                    if inp not in env:
                        v = clean[inp]
                        env[inp] = (v[rn] if isinstance(v, torch.Tensor) and v.ndim
                                    and len(v) == n_batch else v)
                self._run([n], env, params, None)
            labels = predicted_labels(env[g.output].float().cpu().numpy())
            rn_np, rf_np = rn.cpu().numpy(), rf.cpu().numpy() + first
            for f in np.unique(rf_np):
                sel = rf_np == f
                preds[faults[f][0]][offset + rn_np[sel]] = labels[sel]


def _changed(v: Any, ref: Any) -> Any:
    """(N, F) mask: example n's channel f differs from clean (NaN counts as different)."""
    return (v != ref).reshape(v.shape[0], v.shape[1], -1).any(2)


def _per_channel(node: Any, prev: Any, model: Any) -> bool:
    """Whether ``node`` acts on each channel (dim 1) of ``prev`` alone: ReLU or max pooling
    of it, with no other tensor input (then it can run on one channel, exactly)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    if node.all_input_nodes != [prev] or not node.args or node.args[0] is not prev:
        return False
    if node.op == "call_function":
        fns = (torch.relu, F.relu, torch.max_pool1d, torch.max_pool2d, torch.max_pool3d,
               F.max_pool1d, F.max_pool2d, F.max_pool3d)
        return node.target in fns and not node.kwargs.get("return_indices", False)
    if node.op == "call_method":
        return node.target == "relu"
    if node.op == "call_module":
        mod = model.get_submodule(node.target)
        return (isinstance(mod, (nn.ReLU, nn.Identity)) or (isinstance(
            mod, (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)) and not mod.return_indices))
    return False


__all__ = ["TorchEvaluator"]
