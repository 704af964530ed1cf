"""Rank-one changes through the linear stretch after a single fault's changed channel.

After a single fault only channel ``c`` of a value differs from clean, by ``delta``
(per changed row: a number for (N, features), a map for (N, C, H, W)). A layer linear
over channels that reads it alone (``nn.Linear``, a plain 1x1 ``nn.Conv2d``) then
changes by ``u * delta`` with ``u = W[:, c]``: every channel, but still one vector times
one map. Operations that keep that form carry it on without computing whole rows:

* eval-mode BatchNorm scales ``u`` by ``weight / sqrt(running_var + eps)``;
* add / sub with a tensor the fault does not reach keeps (or negates) ``u``;
* another Linear / plain 1x1 convolution maps ``u`` by its weight.

A value in this form is ``clean + u * delta`` (``materialize``) where anything else reads
it. The results equal whole-row computation to rounding, not bit for bit (as the Linear
column of ``single_faults``): the single-fault shortcut compares predictions.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from bitfault.torch.evaluate.channel_ops import untouched_operand
from bitfault.torch.evaluate.graph import submodule

_SIGN = {operator.add: 1.0, operator.iadd: 1.0, operator.sub: -1.0, operator.isub: -1.0}


def channel_map(model: Any, node: Any, prev: Any, clean: Mapping[Any, Any],
                params: Mapping[str, Any]) -> Any:
    """The (out, in) weight of ``node`` when it is an ``nn.Linear`` on (N, features) or a
    plain 1x1 ``nn.Conv2d`` (stride 1, no padding, one group, zero padding mode) on
    (N, C, H, W), reading ``prev`` alone; else None."""
    from torch import nn

    if node.op != "call_module" or node.args != (prev,) or node.kwargs:
        return None
    mod = submodule(model, node.target)
    ndim = clean[prev].ndim
    weight = params.get(f"{node.target}.weight", getattr(mod, "weight", None))
    if isinstance(mod, nn.Linear) and ndim == 2:
        return weight
    if type(mod) is nn.Conv2d and ndim == 4 and mod.kernel_size == (1, 1) and \
            mod.stride == (1, 1) and mod.padding in ((0, 0), "valid") and \
            mod.groups == 1 and mod.padding_mode == "zeros":
        return weight[:, :, 0, 0]
    return None


def carry(model: Any, node: Any, low: Mapping[Any, Any], dirty: set[Any],
          clean: Mapping[Any, Any], params: Mapping[str, Any]) -> Any:
    """``node``'s ``u`` when it keeps the rank-one form of the value it reads (the
    operations above), else None; ``low``: node -> ``u`` of the values in that form,
    ``dirty``: the nodes the fault reaches."""
    from torch import nn
    from torch.fx import Node

    if node.kwargs:
        return None
    if node.op == "call_function" and node.target in _SIGN and len(node.args) == 2:
        a, b = node.args
        mine = [x for x in (a, b) if isinstance(x, Node) and x in low]
        if len(mine) != 1 or clean[mine[0]].shape != clean[node].shape:
            return None
        src = mine[0]
        if not untouched_operand(b if src is a else a, clean[src], clean, dirty):
            return None
        return low[src] if src is a or _SIGN[node.target] > 0 else -low[src]
    if node.op != "call_module" or len(node.args) != 1 or \
            not isinstance(node.args[0], Node) or node.args[0] not in low:
        return None
    src = node.args[0]
    weight = channel_map(model, node, src, clean, params)
    if weight is not None:
        return low[src] @ weight.T
    mod = submodule(model, node.target)
    bns = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
    if type(mod) in bns and not mod.training and mod.running_var is not None:
        var = params.get(f"{node.target}.running_var", mod.running_var)
        scale = (var + mod.eps).rsqrt()
        w = params.get(f"{node.target}.weight", mod.weight)
        return low[src] * (scale if w is None else w * scale)
    return None


def materialize(clean_rows: Any, u: Any, delta: Any) -> Any:
    """``clean + u * delta`` on changed rows: ``u`` (rows, channels), ``delta`` (rows,) for
    (rows, features) values or (rows, H, W) for (rows, C, H, W) ones."""
    import torch

    if clean_rows.ndim == 2:
        return torch.addcmul(clean_rows, delta[:, None], u)
    return torch.addcmul(clean_rows, u[:, :, None, None], delta[:, None])


__all__ = ["carry", "channel_map", "materialize"]
