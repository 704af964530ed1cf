"""How each node of a traced graph follows the batch, for the single-fault shortcut.

The shortcut runs the rest of the graph on the changed (example, fault) pairs stacked
along the batch dimension, a row count that is not the clean batch's. A clean value it
reads must then be taken as that many rows, and a value computed from the batch size
(``bs = x.size(0)`` read from the input, then ``y.view(bs, -1)``) must be computed again
for that row count. ``BatchRoles.probe`` finds out which is which by running the graph
on 2 and on 3 examples, node by node (each value dropped after its last use):

* ``ROWS``: a tensor whose dim 0 is the batch (2, then 3; the other dims equal): the
  shortcut takes the clean value's changed rows;
* ``SIZED``: anything else that changes with the batch size (a size, a shape, a tensor
  with the batch in another dim): computed again from its inputs on the changed rows;
* ``FIXED``: the same at both sizes (a constant, a weight, a reduction over the batch of
  a clean value): the clean value as it is.

A node ``mixes`` examples when the shortcut's computation of it disagrees with the
batch's: computed again for rows 0 and 1 alone (its inputs taken as above from the
3-example run), it differs from those rows of the 3-example value (a softmax over the
batch, ``x / x.size(0)``), or, for a ``FIXED`` tensor, from that value (a mean over the
batch). A fault before such a node changes other examples' values, so the shortcut does
not apply to it (the layer path does, on whole batches).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bitfault.torch.evaluate.graph import TracedGraph, run_nodes, submodule

ROWS, SIZED, FIXED = "rows", "sized", "fixed"
# metadata reads: a node that only asks its input's shape gets an expanded view of one
# row (no copy) instead of the changed rows themselves
_META_METHODS = frozenset({"size", "dim", "ndimension"})
_META_ATTRS = frozenset({"shape", "ndim", "dtype", "device"})


def _close(a: Any, b: Any) -> bool:
    """Equal values: bit for bit, or floats to 1e-3 of their largest finite magnitude (a
    convolution's rows may differ in the last bits between batch sizes), NaN equal."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    if not a.is_floating_point() or a.numel() == 0:
        return False
    scale = float(a.abs().nan_to_num(0.0, 0.0, 0.0).max())
    return bool(torch.isclose(a, b, rtol=0.0, atol=1e-3 * scale + 1e-12,
                              equal_nan=True).all())


def _rowwise(model: Any, node: Any) -> bool:
    """Whether ``node`` is an operation known to compute each example's rows from that
    example's alone (torch's own convolution, Linear, eval-mode BatchNorm, activation and
    pooling modules and functions): not checked again in ``probe``."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    if node.op == "call_module":
        mod = submodule(model, node.target)
        kinds = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear, nn.BatchNorm1d, nn.BatchNorm2d,
                 nn.BatchNorm3d, nn.ReLU, nn.ReLU6, nn.Hardtanh, nn.Hardswish, nn.SiLU,
                 nn.GELU, nn.Sigmoid, nn.Tanh, nn.Identity, nn.Dropout, nn.MaxPool1d,
                 nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
                 nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)
        return type(mod) in kinds and not mod.training
    return node.op == "call_function" and node.target in (
        torch.relu, F.relu, F.relu6, F.hardtanh, F.hardswish, F.silu, F.gelu, torch.sigmoid,
        torch.tanh, F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d,
        F.avg_pool1d, F.avg_pool2d, F.avg_pool3d, F.max_pool1d, F.max_pool2d, F.max_pool3d)


def _classify(two: Any, three: Any) -> str:
    """A node's role from its values on 2 and on 3 examples."""
    import torch

    if isinstance(two, torch.Tensor) and isinstance(three, torch.Tensor):
        if two.shape == three.shape:
            return FIXED
        if two.ndim and three.ndim == two.ndim and len(two) == 2 and len(three) == 3 and \
                two.shape[1:] == three.shape[1:]:
            return ROWS
        return SIZED
    if isinstance(two, (tuple, list)) and isinstance(three, (tuple, list)) and \
            type(two) is type(three) and len(two) == len(three):
        parts = [_classify(a, b) for a, b in zip(two, three, strict=True)]
        return FIXED if all(r == FIXED for r in parts) else SIZED
    try:
        same = bool(type(two) is type(three) and two == three)
    except Exception:  # values that cannot be compared: computed again
        same = False
    return FIXED if same else SIZED


@dataclass(frozen=True)
class BatchRoles:
    """Each node's role (``ROWS`` / ``SIZED`` / ``FIXED``) and the nodes that mix
    examples, found by ``probe``."""

    role: Mapping[Any, str]
    mixing: frozenset[Any]

    @classmethod
    def probe(cls, g: TracedGraph, model: Any, x: Any) -> BatchRoles:
        """Run ``g`` on the first 2 and the first 3 examples of ``x`` (repeated where it
        has fewer) side by side, classifying each node as it is computed; then compute
        each tensor node again as the shortcut would for rows 0 and 1 alone (``fill``
        from the 3-example values) and compare it with those rows."""
        import torch

        n = len(x)
        xs = [x[torch.arange(k, device=x.device) % n] for k in (2, 3)]
        envs: list[dict[Any, Any]] = [{}, {}]
        role: dict[Any, str] = {}
        found = cls(role, frozenset())
        mixing = set()
        keep: set[Any] = set()  # what computing a SIZED node again reads
        rows = torch.arange(2, device=x.device)
        with torch.no_grad():
            for pos, node in enumerate(g.nodes):
                for env, xk in zip(envs, xs, strict=True):
                    run_nodes(model, [node], env, {}, xk)
                role[node] = _classify(envs[0][node], envs[1][node])
                if role[node] == SIZED:
                    keep.update(node.all_input_nodes)
                three = envs[1][node]
                if role[node] != SIZED and isinstance(three, torch.Tensor) \
                        and node.op not in ("placeholder", "get_attr") \
                        and not _rowwise(model, node):
                    local: dict[Any, Any] = {}
                    for inp in node.all_input_nodes:
                        found.fill(inp, local, envs[1], rows, model, {})
                    run_nodes(model, [node], local, {}, None)
                    if not _close(local[node], three[:2] if role[node] == ROWS else three):
                        mixing.add(node)
                for env in envs:
                    g.drop_dead(env, pos, keep, [*node.all_input_nodes, node])
        return cls(role, frozenset(mixing))

    def first_mixing(self, g: TracedGraph, dirty: Iterable[Any]) -> Any:
        """The first node of ``dirty`` (in graph order) that mixes examples, or None."""
        found = [n for n in dirty if n in self.mixing]
        return min(found, key=g.position.__getitem__) if found else None

    def sources(self, nodes: Iterable[Any]) -> set[Any]:
        """What computing the ``SIZED`` nodes among ``nodes`` again reads: their inputs,
        and through ``SIZED`` inputs theirs, on to ``ROWS`` and ``FIXED`` values."""
        out: set[Any] = set()
        todo = [n for n in nodes if self.role.get(n) == SIZED]
        while todo:
            for inp in todo.pop().all_input_nodes:
                if inp not in out:
                    out.add(inp)
                    if self.role.get(inp) == SIZED:
                        todo.append(inp)
        return out

    def fill(self, node: Any, env: dict[Any, Any], clean: Mapping[Any, Any], rows: Any,
             model: Any, params: Mapping[str, Any]) -> None:
        """Put into ``env`` the value of clean node ``node`` on the changed rows ``rows``
        (indices into the clean batch): its rows, or computed again from its inputs'
        (``SIZED``), or the clean value (``FIXED``)."""
        role = self.role.get(node, FIXED)
        if role == ROWS:
            env[node] = clean[node][rows]
        elif role == SIZED and node.op not in ("placeholder", "get_attr"):
            views = []  # inputs whose shape alone is read: one row expanded, no copy
            for inp in node.all_input_nodes:
                if inp in env:
                    continue
                if _meta(node) and self.role.get(inp) == ROWS:
                    v = clean[inp]
                    env[inp] = v[:1].expand(len(rows), *v.shape[1:])
                    views.append(inp)
                else:
                    self.fill(inp, env, clean, rows, model, params)
            run_nodes(model, [node], env, params, None)
            for inp in views:  # never taken for the rows themselves
                del env[inp]
        else:
            env[node] = clean[node]


def _meta(node: Any) -> bool:
    """Whether ``node`` reads only its first input's metadata (``x.size(0)``, ``x.shape``)."""
    if node.op == "call_method":
        return node.target in _META_METHODS
    return node.op == "call_function" and node.target is getattr and len(node.args) == 2 \
        and node.args[1] in _META_ATTRS


__all__ = ["FIXED", "ROWS", "SIZED", "BatchRoles"]
