"""``TorchEvaluator``'s single-fault shortcut (one element of one Linear/Conv weight).

Only the changed column/channel of that module's output is computed, only for the
examples it changes, and the rest of the graph runs once for the changed examples of
many faults stacked together (dropping examples whose values come back to clean).
Conv channels are recomputed with the faulty weight; a Linear column is
``clean + x[:, j] * (w' - w)``, which can differ from a full matmul in the last bit of
that column (see docs/campaigns.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from bitfault.campaign.evaluator import predicted_labels, stores_elementwise
from bitfault.maps import FaultMap
from bitfault.memory import Memory
from bitfault.torch.channel_ops import channel_step
from bitfault.torch.conv_calls import ConvCall, captured, conv_call
from bitfault.torch.graph import TracedGraph, run_nodes

# Stacked rows per call, at most: larger stacks ran slower on the CPU (a MobileNetV2-style
# net, 64x64 inputs: 256 MiB stacks 5.5x slower than 16 MiB ones; docs/campaigns.md).
STACK_BYTES = 16 << 20


class SingleFaultPaths:
    """The single-fault paths of ``TorchEvaluator`` (a mixin of it: they use its model,
    traced graph, clean activations, stored tensors and golden runs)."""

    model: Any
    device: Any
    labels: np.ndarray
    max_bytes: int
    _clean: dict[str, Any]
    _owner: dict[str, tuple[str, str, str]]
    _aliases: dict[str, list[str]]

    def _single_ok(self, name: str) -> bool:
        from torch import nn

        module, _, attr = self._owner[name]
        mod = self.model.get_submodule(module) if module else self.model
        if attr != "weight" or name in self._aliases or self.graph() is None:
            return False
        if isinstance(mod, nn.Linear):
            seeds = self.graph().seeds(name)
            return (len(seeds) == 1 and seeds[0].op == "call_module" and seeds[0].target == module
                    and len(seeds[0].args) == 1 and not seeds[0].kwargs)
        return conv_call(self.graph(), self.model, name) is not None

    def _predict_singles(self, name: str, faults: list[tuple[int, int, int]],
                         memory: Memory) -> dict[int, np.ndarray]:
        """Single faults in one weight: (trial position, flat element, mask) each."""
        if self._clean_env(memory) is None:
            return {k: self._predict_full({name: self._single_map(name, e, m)}, memory)
                    for k, e, m in faults}
        golden = self.golden(memory)
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
            self._singles_group(name, grp, memory, preds)
        return preds

    def _single_map(self, name: str, element: int, mask: int) -> FaultMap:
        shape = tuple(self._clean[name].shape)
        return FaultMap(shape, np.array([element], np.int64), np.array([mask], np.uint32), name)

    def _singles_group(self, name: str, faults: list[tuple[int, int, int]], memory: Memory,
                       preds: dict[int, np.ndarray]) -> None:
        """Faults on distinct elements of one Linear/Conv weight, evaluated together, chunk
        of examples by chunk (``_env_chunks``: every node's clean value on them)."""
        import torch
        from torch import nn

        g = self.graph()
        shape = tuple(self._clean[name].shape)
        call = None if isinstance(self.model.get_submodule(self._owner[name][0]), nn.Linear) \
            else conv_call(g, self.model, name)
        node = g.seeds(name)[0] if call is None else call.node
        dirty = g.dependents(g.seeds(name))
        if g.output not in dirty:
            return
        elems = np.array([e for _, e, _ in faults], np.int64)
        order = np.argsort(elems)
        joint = FaultMap(shape, elems[order], np.array([m for _, _, m in faults],
                                                       np.uint32)[order], name)
        stored_all = self.stored(memory)
        stored = stored_all[name]
        idx_all = torch.as_tensor(elems, device=self.device)
        if stores_elementwise(memory.format):  # only the faulty elements change
            new_all = torch.empty(len(faults), dtype=stored.dtype, device=self.device)
            sorted_idx = torch.as_tensor(order, device=self.device)
            new_all[sorted_idx] = self._faulty_elements(name, idx_all[sorted_idx], joint, memory)
        else:
            new_all = self.faulty(name, joint, memory).reshape(-1)[idx_all]
        params: dict[str, Any] = {}  # the replica holds every stored tensor
        with torch.no_grad():
            for b, clean in self._env_chunks(memory):
                n = b.stop - b.start
                if call is None and clean[node.args[0]].ndim != 2:
                    self._layer_each(name, faults, memory, preds)  # (batch, ..., features)
                    return
                per_fault = len(faults)
                if call is not None:  # bytes per fault: its output channel and input group
                    per_out = clean[node][0].numel() // max(1, shape[0])
                    xin0 = clean[call.input if call.input is not None else node.args[0]]
                    per_in = xin0[0].numel() // max(1, xin0.shape[1]) * shape[1] \
                        if call.groups != 1 else 0
                    per_fault = max(1, (self.max_bytes // 4) // max(1, (per_out + per_in) * n))
                for c in range(0, len(faults), per_fault):
                    idx = idx_all[c:c + per_fault]
                    new_w, old_w = new_all[c:c + per_fault], stored.reshape(-1)[idx]
                    if call is None:  # nn.Linear: a column of the output, rank-one
                        xin, out = clean[node.args[0]], clean[node]
                        col = idx // shape[1]
                        new = out[:, col] + xin[:, idx % shape[1]] * (new_w - old_w)
                    else:
                        got = self._conv_inputs(call, clean, stored_all, name)
                        if got is None:  # not provably one convolution: the layer path
                            self._layer_each(name, faults, memory, preds)
                            return
                        conv, xin, bias = got
                        per = int(np.prod(shape[1:]))
                        col = idx // per
                        kernels = stored.reshape(shape[0], -1)[col].clone()
                        kernels[torch.arange(len(idx), device=kernels.device), idx % per] = new_w
                        kernels = kernels.reshape(len(idx), *shape[1:])
                        new = conv.channels(xin, kernels, None if bias is None else bias[col],
                                            col, shape[0])
                    self._suffix(g, node, dirty, clean, new, col, c, params, n, faults, preds,
                                 b.start)

    def _layer_each(self, name: str, faults: list[tuple[int, int, int]], memory: Memory,
                    preds: dict[int, np.ndarray]) -> None:
        for k, e, m in faults:
            preds[k] = self._predict_layer(name, self._single_map(name, e, m), memory)

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
            mod = self.model.get_submodule(call.bias.rpartition(".")[0])
            bias = stored_all.get(call.bias, mod.bias)
        elif bias is not None:
            bias = clean[bias]
        return call, clean[call.input], bias

    def _rank_one_linear(self, node: Any, prev: Any, clean: Mapping[Any, Any]) -> Any:
        """The nn.Linear that ``node`` calls on ``prev`` alone, with (N, features) input; or
        None. Then a change in one feature changes its output by a rank-one update."""
        from torch import nn

        if node.op != "call_module" or node.args != (prev,) or node.kwargs:
            return None
        mod = self.model.get_submodule(node.target)
        ok = isinstance(mod, nn.Linear) and clean[prev].ndim == 2
        return mod if ok else None

    def _suffix(self, g: TracedGraph, node: Any, dirty: set[Any], clean: dict[Any, Any],
                vals: Any, col: Any, first: int, params: Mapping[str, Any], n_batch: int,
                faults: list[tuple[int, int, int]], preds: dict[int, np.ndarray],
                offset: int) -> None:
        """Run the dirty nodes after ``node`` for faults ``first ...`` at once.

        ``vals[n, f]`` is channel ``col[f]`` (dim 1) of ``node``'s output for example ``n``
        under fault ``f``; every other channel is clean. Per-channel operations
        (``channel_ops``: activations, pooling, eval BatchNorm, depthwise convs, residual
        adds) run on these channels alone (``(N, F, ...)``); an example whose channel is
        back to clean is clean from there on. The first other operation gets whole rows,
        only for changed (example, fault) pairs, stacked along the batch dimension in
        memory-sized chunks: the same calls as the model's forward.
        """
        import torch

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
        linear = self._rank_one_linear(rest[0], prev, clean) \
            if rest and len(prev.users) == 1 else None
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
                full[torch.arange(len(rn), device=full.device), col[rf]] = vals[rn, rf]
                env = {prev: full}
                todo = rest
            for n in todo:
                for inp in n.all_input_nodes:
                    if inp not in env:
                        v = clean[inp]
                        env[inp] = (v[rn] if isinstance(v, torch.Tensor) and v.ndim
                                    and len(v) == n_batch else v)
                run_nodes(self.model, [n], env, params, None)
            labels = predicted_labels(env[g.output].float().cpu().numpy())
            rn_np, rf_np = rn.cpu().numpy(), rf.cpu().numpy() + first
            for f in np.unique(rf_np):
                sel = rf_np == f
                preds[faults[f][0]][offset + rn_np[sel]] = labels[sel]


def _changed(v: Any, ref: Any) -> Any:
    """(N, F) mask: example n's channel f differs from clean (NaN counts as different)."""
    return (v != ref).reshape(v.shape[0], v.shape[1], -1).any(2)


__all__ = ["SingleFaultPaths"]
