"""Operations that act on each channel (dim 1) alone, for the single-fault shortcut.

After a single fault only channel ``col[f]`` of a layer's output differs (fault ``f``).
``channel_step`` says whether the next graph node can run on those channels alone, as an
``(N, F, ...)`` tensor whose channel ``f`` is channel ``col[f]``, and returns that step:

* elementwise functions and modules (ReLU, ReLU6, hardtanh, hardswish, SiLU, GELU,
  sigmoid, tanh, identity, eval-mode dropout) and max pooling: the same call;
* eval-mode BatchNorm: ``F.batch_norm`` with channel ``col[f]``'s statistics and affine;
* a stock depthwise convolution (groups = in = out channels): ``conv`` with channel
  ``col[f]``'s kernel and bias, one group per fault;
* add / sub / mul with a tensor the fault does not reach (a residual, of the same
  shape) or a number: that tensor's channel ``col[f]``.

Each is the per-channel computation of the full operation (the same formula on the same
values); anything else returns None and the shortcut goes on with whole rows.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

from bitfault.torch.evaluate.graph import submodule

_BINARY = {operator.add: operator.add, operator.iadd: operator.add, operator.sub: operator.sub,
           operator.isub: operator.sub, operator.mul: operator.mul,
           operator.imul: operator.mul}


def _unary(model: Any, node: Any) -> bool:
    import torch
    import torch.nn.functional as F
    from torch import nn

    if node.op == "call_function":
        fns = (torch.relu, F.relu, F.relu6, F.hardtanh, F.hardswish, F.silu, F.gelu,
               torch.sigmoid, torch.tanh, F.sigmoid, F.tanh, torch.max_pool1d,
               torch.max_pool2d, torch.max_pool3d, F.max_pool1d, F.max_pool2d, F.max_pool3d)
        return node.target in fns and not node.kwargs.get("return_indices", False)
    if node.op == "call_method":
        return node.target in ("relu", "sigmoid", "tanh")
    if node.op == "call_module":
        mod = submodule(model, node.target)
        return not mod.training and (isinstance(mod, (
            nn.ReLU, nn.ReLU6, nn.Hardtanh, nn.Hardswish, nn.SiLU, nn.GELU, nn.Sigmoid,
            nn.Tanh, nn.Identity, nn.Dropout)) or (isinstance(
                mod, (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)) and not mod.return_indices))
    return False


def channel_step(node: Any, prev: Any, model: Any, params: Mapping[str, Any], col: Any,
                 clean: Mapping[Any, Any], dirty: set[Any]) -> Callable[[Any], Any] | None:
    """The step that computes ``node``'s channels ``col`` from ``prev``'s, or None."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from bitfault.torch.evaluate.graph import run_nodes

    if not node.args or len(prev.users) != 1:
        return None
    if node.op == "call_function" and node.target in _BINARY and len(node.args) == 2 and \
            not node.kwargs and prev in node.args and node.args[0] is not node.args[1]:
        return _binary(node, prev, clean, dirty, col)
    if node.args[0] is not prev:
        return None
    if node.all_input_nodes == [prev] and _unary(model, node):
        def unary(v: Any) -> Any:
            env = {prev: v}
            run_nodes(model, [node], env, params, None)
            return env[node]
        return unary
    if node.op == "call_module" and node.all_input_nodes == [prev] and len(node.args) == 1 \
            and not node.kwargs:
        mod = submodule(model, node.target)
        got = {k: params.get(f"{node.target}.{k}", t) for k, t in
               (*mod.named_parameters(recurse=False), *mod.named_buffers(recurse=False))}
        bns = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
        if type(mod) in bns and not mod.training and got.get("running_mean") is not None:
            def take(k: str) -> Any:
                return None if got.get(k) is None else got[k][col]
            return lambda v: F.batch_norm(v, take("running_mean"), take("running_var"),
                                          take("weight"), take("bias"), False, 0.0, mod.eps)
        stock = {nn.Conv1d: nn.Conv1d.forward, nn.Conv2d: nn.Conv2d.forward,
                 nn.Conv3d: nn.Conv3d.forward}
        if type(mod) in stock and type(mod).forward is stock[type(mod)] and \
                mod.padding_mode == "zeros" and mod.groups == mod.in_channels == \
                mod.out_channels:
            fn = (torch.conv1d, torch.conv2d, torch.conv3d)[mod.weight.ndim - 3]
            w, b = got["weight"][col], None if got.get("bias") is None else got["bias"][col]
            return lambda v: fn(v, w, b, mod.stride, mod.padding, mod.dilation, len(col))
    return None


def _binary(node: Any, prev: Any, clean: Mapping[Any, Any], dirty: set[Any],
            col: Any) -> Callable[[Any], Any] | None:
    """add / sub / mul of ``prev`` with a number or a tensor the fault does not reach."""
    fn = _BINARY[node.target]
    i = node.args.index(prev)
    other = node.args[1 - i]
    if not untouched_operand(other, clean[prev], clean, dirty):
        return None
    side = other if _is_number(other) else clean[other].index_select(1, col)
    return (lambda v: fn(v, side)) if i == 0 else (lambda v: fn(side, v))


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def untouched_operand(other: Any, like: Any, clean: Mapping[Any, Any],
                      dirty: set[Any]) -> bool:
    """Whether ``other``, the second operand of an elementwise operation on a changed value
    ``like`` (its clean tensor), is a number or a value the fault does not reach (not in
    ``dirty``) whose clean tensor has ``like``'s shape and dtype."""
    import torch

    if _is_number(other):
        return True
    return other not in dirty and isinstance(clean.get(other), torch.Tensor) and \
        clean[other].shape == like.shape and clean[other].dtype == like.dtype


__all__ = ["channel_step", "untouched_operand"]
