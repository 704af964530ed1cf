"""``TorchEvaluator``'s single-fault shortcut (one element of one Linear/Conv weight).

Only the changed column/channel of that module's output is computed, only for the
examples it changes, and the rest of the graph runs once for the changed examples of
many faults stacked together (dropping examples whose values come back to clean).
Conv channels are recomputed with the faulty weight; a Linear column is
``clean + x[:, j] * (w' - w)``, which can differ from a full matmul in the last bit of
that column; the first Linear or 1x1 convolution after the one changed channel is
updated the same way, by ``delta * W[:, c]``, and that form carried on through linear
layers (``bitfault.torch.evaluate.rank_one``; see docs/campaigns.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from bitfault.campaign.evaluator import predicted_labels, stores_elementwise
from bitfault.maps import FaultMap
from bitfault.memory.memory import Memory
from bitfault.torch.evaluate.batch_roles import BatchRoles
from bitfault.torch.evaluate.channel_ops import channel_step
from bitfault.torch.evaluate.conv_calls import ConvCall, captured
from bitfault.torch.evaluate.graph import TracedGraph, run_nodes, submodule
from bitfault.torch.evaluate.planner import PathPlanner
from bitfault.torch.evaluate.rank_one import carry, channel_map, materialize

# Stacked rows per call, at most: larger stacks ran slower on the CPU (a MobileNetV2-style
# net, 64x64 inputs: 256 MiB stacks 5.5x slower than 16 MiB ones; docs/campaigns.md).
STACK_BYTES = 16 << 20
Fault = tuple[int, int, int]  # (trial position, flat element, bit mask)


@dataclass
class SinglesJob:
    """Faults on distinct elements of one weight (one injection), with what every chunk of
    examples needs: the call using the weight (None: an ``nn.Linear``), the node holding
    its output, the nodes they change, the position of the first node reading the
    weight, the flat elements and their faulty values; ``layer_path`` once the shortcut
    was found not to apply."""

    name: str
    faults: list[Fault]
    call: ConvCall | None
    node: Any
    dirty: set[Any]
    start: int
    idx: Any
    new: Any
    layer_path: bool = False


def _groups(faults: list[Fault]) -> list[list[Fault]]:
    """Faults on distinct elements share one injection (the format acts per element): an
    element's k-th fault goes to group k."""
    groups: list[list[Fault]] = []
    seen: dict[int, int] = {}  # element -> faults on it so far
    for f in faults:
        k = seen.get(f[1], 0)
        seen[f[1]] = k + 1
        if k == len(groups):
            groups.append([])
        groups[k].append(f)
    return groups


class SingleFaultPaths(PathPlanner):
    """The single-fault paths of ``TorchEvaluator`` (a mixin of it: they use its model,
    traced graph, clean activations, stored tensors and golden runs)."""

    model: Any
    device: Any
    x: Any
    labels: np.ndarray
    max_bytes: int
    _clean: dict[str, Any]
    _path: dict[str, str]
    _owner: dict[str, tuple[str, str, str]]
    _aliases: dict[str, list[str]]
    _single_calls: dict[str, ConvCall | bool | None]
    _single_why: dict[str, str]  # tensor -> why its single faults take the path they take
    _roles: BatchRoles | bool | None  # None: not probed yet; False: the probe failed
    _shortcut_faults: dict[str, int]  # tensor -> single faults the shortcut evaluated
    fallbacks: dict[str, str]  # tensor -> the error its shortcut failed with at run time
    _layer_or_full: Any

    def _predict_singles(self, singles: Mapping[str, list[tuple[int, int, int]]],
                         memory: Memory) -> dict[int, np.ndarray]:
        """Single faults, tensor name -> (trial position, flat element, mask) each, all
        evaluated in one pass over the data: each chunk of examples' clean values (from the
        earliest faulted node on) are computed once and used by every tensor's faults."""
        import torch

        if self._clean_env(memory) is None:
            return {k: self._predict_full({name: self._single_map(name, e, m)}, memory)
                    for name, faults in singles.items() for k, e, m in faults}
        golden = self.golden(memory)
        preds = {k: golden.copy() for faults in singles.values() for k, _, _ in faults}
        jobs = [job for name, faults in singles.items() for grp in _groups(faults)
                if (job := self._singles_job(name, grp, memory)) is not None]
        if jobs:
            stored_all = self.stored(memory)
            params: dict[str, Any] = {}  # the replica holds every stored tensor
            with torch.no_grad():
                for b, clean in self._env_chunks(memory, min(j.start for j in jobs)):
                    for job in jobs:
                        if job.layer_path:
                            continue
                        try:
                            why = self._singles_chunk(job, b, clean, stored_all, params, preds)
                        except Exception as err:  # an assumption failed: the exact path
                            self._fall_back(job.name, err)
                            why = self._single_why[job.name]
                        if why is not None:
                            job.layer_path = True
                            self._single_why[job.name] = why
                        elif b.stop == len(self.labels):
                            self._shortcut_faults[job.name] = \
                                self._shortcut_faults.get(job.name, 0) + len(job.faults)
        for job in jobs:
            if job.layer_path:  # not provably the shortcut's computation: the layer path
                self._layer_each(job.name, job.faults, memory, preds)
        return preds

    def _single_map(self, name: str, element: int, mask: int) -> FaultMap:
        shape = tuple(self._clean[name].shape)
        return FaultMap(shape, np.array([element], np.int64), np.array([mask], np.uint32), name)

    def _singles_job(self, name: str, faults: list[tuple[int, int, int]],
                     memory: Memory) -> SinglesJob | None:
        """Faults on distinct elements of one Linear/Conv weight, ready to be evaluated
        chunk by chunk; None when they cannot change the output."""
        import torch

        g = self.graph()
        shape = tuple(self._clean[name].shape)
        call = self._single_calls[name]
        seeds = g.seeds(name)
        node = seeds[0] if call is None else call.node
        dirty = g.dependents(seeds)
        if g.output not in dirty:
            return None
        elems = np.array([e for _, e, _ in faults], np.int64)
        order = np.argsort(elems)
        joint = FaultMap(shape, elems[order], np.array([m for _, _, m in faults],
                                                       np.uint32)[order], name)
        stored = self.stored(memory)[name]
        idx_all = torch.as_tensor(elems, device=self.device)
        if stores_elementwise(memory.format):  # only the faulty elements change
            new_all = torch.empty(len(faults), dtype=stored.dtype, device=self.device)
            sorted_idx = torch.as_tensor(order, device=self.device)
            new_all[sorted_idx] = self._faulty_elements(name, idx_all[sorted_idx], joint, memory)
        else:
            new_all = self.faulty(name, joint, memory).reshape(-1)[idx_all]
        return SinglesJob(name, faults, call, node, dirty, g.position[seeds[0]], idx_all,
                          new_all)

    def _singles_chunk(self, job: SinglesJob, b: slice, clean: dict[Any, Any],
                       stored_all: Mapping[str, Any], params: Mapping[str, Any],
                       preds: dict[int, np.ndarray]) -> str | None:
        """Evaluate ``job``'s faults on examples ``b`` (``clean``: their clean values);
        why not (and nothing done) when the shortcut does not provably apply."""
        import torch

        g, call, node, faults = self.graph(), job.call, job.node, job.faults
        stored = stored_all[job.name]
        shape = tuple(stored.shape)
        n = b.stop - b.start
        if call is None and clean[node.args[0]].ndim != 2:
            return "nn.Linear on (batch, ..., features), not (batch, features)"
        conv = xin = bias = None
        per_fault = len(faults)
        if call is not None:
            got = self._conv_inputs(call, clean, stored_all, job.name)
            if got is None:
                return "its module's forward is not provably one convolution"
            conv, xin, bias = got
            # bytes per fault: its output channel and input group
            per_out = clean[node][0].numel() // max(1, shape[0])
            xin0 = clean[call.input if call.input is not None else node.args[0]]
            per_in = xin0[0].numel() // max(1, xin0.shape[1]) * shape[1] \
                if call.groups != 1 else 0
            per_fault = max(1, (self.max_bytes // 4) // max(1, (per_out + per_in) * n))
        for c in range(0, len(faults), per_fault):
            idx = job.idx[c:c + per_fault]
            new_w, old_w = job.new[c:c + per_fault], stored.reshape(-1)[idx]
            if call is None:  # nn.Linear: a column of the output, rank-one
                x_lin, out = clean[node.args[0]], clean[node]
                col = idx // shape[1]
                new = out[:, col] + x_lin[:, idx % shape[1]] * (new_w - old_w)
            else:
                per = int(np.prod(shape[1:]))
                col = idx // per
                kernels = stored.reshape(shape[0], -1)[col].clone()
                kernels[torch.arange(len(idx), device=kernels.device), idx % per] = new_w
                kernels = kernels.reshape(len(idx), *shape[1:])
                new = conv.channels(xin, kernels, None if bias is None else bias[col],
                                    col, shape[0])
            self._suffix(g, node, job.dirty, clean, new, col, c, params, faults, preds,
                         b.start)
        return None

    def _layer_each(self, name: str, faults: list[tuple[int, int, int]], memory: Memory,
                    preds: dict[int, np.ndarray]) -> None:
        for k, e, m in faults:
            preds[k] = self._layer_or_full(name, self._single_map(name, e, m), memory)

    def _conv_inputs(self, call: ConvCall, clean: Mapping[Any, Any],
                     stored_all: Mapping[str, Any], name: str) -> tuple[ConvCall, Any, Any] | None:
        """(the call, its input, its bias) on this batch; None if the module's forward is
        not provably that one convolution (``conv_calls.captured``)."""
        if call.module is not None:
            prefix = call.module + "."
            own = {k[len(prefix):]: v for k, v in stored_all.items() if k.startswith(prefix)}
            if "weight" not in own:
                own["weight"] = stored_all[name]
            return captured(call, self.model, clean[call.node.args[0]], clean[call.node], own)
        bias = call.bias
        if isinstance(bias, str):
            mod = submodule(self.model, call.bias.rpartition(".")[0])
            bias = stored_all.get(call.bias, mod.bias)
        elif bias is not None:
            bias = clean[bias]
        return call, clean[call.input], bias

    def _suffix(self, g: TracedGraph, node: Any, dirty: set[Any], clean: dict[Any, Any],
                vals: Any, col: Any, first: int, params: Mapping[str, Any],
                faults: list[tuple[int, int, int]], preds: dict[int, np.ndarray],
                offset: int) -> None:
        """Run the dirty nodes after ``node`` for faults ``first ...`` at once.

        ``vals[n, f]`` is channel ``col[f]`` (dim 1) of ``node``'s output for example ``n``
        under fault ``f``; every other channel is clean. Per-channel operations
        (``channel_ops``: activations, pooling, eval BatchNorm, depthwise convs, residual
        adds) run on these channels alone (``(N, F, ...)``); an example whose channel is
        back to clean is clean from there on. The first other operation gets whole rows,
        only for changed (example, fault) pairs, stacked along the batch dimension in
        memory-sized chunks: the same calls as the model's forward, with the clean values
        they read taken as those rows (``batch_roles``: a size read from the batch is
        computed again for the stacked rows); when it is a Linear or
        a plain 1x1 convolution (``rank_one.channel_map``) and every change is finite, its
        output is the clean one plus ``delta * W[:, c]`` instead, carried on in that form
        as far as ``rank_one.carry`` goes (equal to whole rows to rounding).
        """
        import torch

        roles = self.batch_roles()
        after = [n for n in g.nodes[g.position[node] + 1:] if n in dirty]
        prev, k = node, 0
        changed = _changed(vals, clean[node].index_select(1, col))
        while k < len(after):
            step = channel_step(after[k], prev, self.model, params, col, clean, dirty)
            if step is None:
                break
            vals, prev = step(vals), after[k]
            changed &= _changed(vals, clean[prev].index_select(1, col))
            k += 1
        rows_n, rows_f = torch.nonzero(changed, as_tuple=True)
        if not len(rows_n):
            return
        row_bytes = max(1, clean[prev][0].numel() * clean[prev].element_size() * 4)
        step = max(1, min(self.max_bytes, STACK_BYTES) // row_bytes)
        rest = after[k:]
        weight = channel_map(self.model, rest[0], prev, clean, params) if rest else None
        for a in range(0, len(rows_n), step):
            rn, rf = rows_n[a:a + step], rows_f[a:a + step]
            delta = vals[rn, rf] - clean[prev][rn, col[rf]] if weight is not None else None
            env: dict[Any, Any] = {}
            low: dict[Any, Any] = {}  # nodes whose rows are clean + u * delta: their u
            todo = rest
            if delta is not None and bool(torch.isfinite(delta).all()):
                # one input channel changed: the layer's output moves by delta * W[:, channel]
                low[rest[0]] = weight[:, col[rf]].T
                j = 1
                while j < len(rest) and (u := carry(self.model, rest[j], low, dirty, clean,
                                                    params)) is not None:
                    low[rest[j]] = u
                    j += 1
                todo = rest[j:]
            if not low or len(prev.users) > 1:  # whole rows (also where a change is not
                full = clean[prev][rn].clone()  # finite: inf - inf, NaN) for its readers
                full[torch.arange(len(rn), device=full.device), col[rf]] = vals[rn, rf]
                env[prev] = full
            for n in todo:  # ends with the graph's output node (never carried)
                for inp in n.all_input_nodes:
                    if inp in env:
                        continue
                    if inp in low:
                        env[inp] = materialize(clean[inp][rn], low[inp], delta)
                    else:
                        roles.fill(inp, env, clean, rn, self.model, params)
                run_nodes(self.model, [n], env, params, None)
            out = env[g.output]
            if not isinstance(out, torch.Tensor) or out.ndim == 0 or len(out) != len(rn):
                raise RuntimeError(f"the graph's output on {len(rn)} stacked rows has shape "
                                   f"{tuple(getattr(out, 'shape', ()))}, not {len(rn)} rows")
            labels = predicted_labels(out.float().cpu().numpy())
            rn_np, rf_np = rn.cpu().numpy(), rf.cpu().numpy() + first
            for f in np.unique(rf_np):
                sel = rf_np == f
                preds[faults[f][0]][offset + rn_np[sel]] = labels[sel]


def _changed(v: Any, ref: Any) -> Any:
    """(N, F) mask: example n's channel f differs from clean (NaN counts as different)."""
    return (v != ref).reshape(v.shape[0], v.shape[1], -1).any(2)


__all__ = ["SingleFaultPaths", "SinglesJob"]
