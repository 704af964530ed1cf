"""The convolution behind a weight, for the single-fault shortcut (``single_faults``).

A fault in one element of a convolution's weight changes one output channel. To compute
that channel alone, the shortcut must know the exact call that uses the weight: its
input, bias, stride, padding, dilation and groups. ``conv_call`` finds it, and refuses
(None) what it cannot prove:

* a stock ``nn.Conv1d/2d/3d`` (its class's ``forward`` is torch's own), zero padding,
  any groups, called on one input: the call is read from the module;
* a ``torch.conv1d/2d/3d`` call in the traced graph whose weight is the tensor, read
  (``get_attr``) by nothing else, with constant stride/padding/dilation/groups: what a
  traced-through ``Conv2d`` subclass with its own forward looks like (pad, then conv);
* a ``Conv*`` module with its own forward (or a padding mode other than zeros), traced
  as a leaf: ``conv_call`` says
  "module" and ``captured`` proves it on each batch, by running the forward under a
  ``TorchFunctionMode``: exactly one convolution uses the weight, nothing else reads it
  but shape queries, and the forward returns that convolution's output as is, equal to
  the clean output bit for bit. Otherwise the shortcut runs the layer path instead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from bitfault.torch.evaluate.graph import submodule

_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_DEFAULTS = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}


@dataclass(frozen=True)
class ConvCall:
    """One convolution call: ``fn(input, weight, bias, stride, padding, dilation, groups)``.

    ``node``: the graph node holding its output; ``input``: the node holding its input
    (None: captured per batch); ``bias``: None, a graph node, or a parameter path;
    ``module``: the module path whose forward must be captured (``captured``), or None.
    """

    node: Any
    input: Any
    fn: Any
    bias: Any
    stride: Any
    padding: Any
    dilation: Any
    groups: int
    module: str | None = None

    def channels(self, xin: Any, kernels: Any, bias: Any, col: Any, out: int) -> Any:
        """Output channels ``col[f]`` (dim 1; ``out`` channels in all), each computed with
        its own kernel ``kernels[f]`` (``(F, C_in / groups, *k)``) and ``bias[f]``:
        ``(N, F, ...)``."""
        import torch

        groups = 1
        if self.groups != 1:  # gather each fault's input group; one group per fault
            cin_g = kernels.shape[1]
            out_g = out // self.groups
            first = (col // out_g) * cin_g
            chans = (first[:, None] + torch.arange(cin_g, device=col.device)).reshape(-1)
            xin, groups = xin.index_select(1, chans), len(col)
        return self.fn(xin, kernels, bias, self.stride, self.padding, self.dilation, groups)


def _conv_fns() -> tuple[Any, ...]:
    import torch

    return (torch.conv1d, torch.conv2d, torch.conv3d)


def _has_node(value: Any) -> bool:
    from torch.fx import Node
    from torch.fx.node import map_arg

    found: list[Any] = []
    map_arg(value, found.append)
    return bool(found) or isinstance(value, Node)


def conv_call(g: Any, model: Any, name: str) -> ConvCall | None:
    """The one convolution call that uses weight ``name`` in graph ``g``, or None."""
    from torch import nn
    from torch.fx import Node

    seeds = g.seeds(name)
    if len(seeds) != 1:
        return None
    node = seeds[0]
    module = name.rpartition(".")[0]
    if node.op == "call_module" and node.target == module:
        mod = model.get_submodule(module)
        stock = {1: nn.Conv1d.forward, 2: nn.Conv2d.forward, 3: nn.Conv3d.forward}
        if not isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) or len(node.args) != 1 \
                or node.kwargs or not isinstance(node.args[0], Node):
            return None
        dim = mod.weight.ndim - 2
        if type(mod).forward is not stock[dim] or mod.padding_mode != "zeros":
            # its own forward, or a padding mode (F.pad first): proven per batch (captured)
            return ConvCall(node, None, None, None, None, None, None, mod.groups,
                            module=module)
        return ConvCall(node, node.args[0], _conv_fns()[dim - 1], f"{module}.bias",
                        mod.stride, mod.padding, mod.dilation, mod.groups)
    if node.op != "get_attr" or node.target != name or len(node.users) != 1:
        return None
    conv = next(iter(node.users))
    if conv.op != "call_function" or conv.target not in _conv_fns() or len(conv.args) > 7:
        return None
    bound = dict(zip(_ARGS[:len(conv.args)], conv.args, strict=True))
    for k, v in conv.kwargs.items():
        if k not in _ARGS or k in bound:
            return None
        bound[k] = v
    bound = {**_DEFAULTS, **bound}
    if bound["weight"] is not node or not isinstance(bound["input"], Node) or \
            (bound["bias"] is not None and not isinstance(bound["bias"], Node)) or \
            any(_has_node(bound[k]) for k in ("stride", "padding", "dilation", "groups")) \
            or not isinstance(bound["groups"], int):
        return None
    return ConvCall(conv, bound["input"], conv.target, bound["bias"], bound["stride"],
                    bound["padding"], bound["dilation"], bound["groups"])


def captured(call: ConvCall, model: Any, xin: Any, clean_out: Any,
             own: dict[str, Any]) -> tuple[ConvCall, Any, Any] | None:
    """For a ``module`` call: run its forward on ``xin`` with tensors ``own`` under a
    ``TorchFunctionMode``; (the call with its arguments, its input, its bias) when the
    forward is provably one convolution with ``own["weight"]``, else None."""
    import torch
    from torch.func import functional_call
    from torch.overrides import TorchFunctionMode

    weight = own["weight"]
    meta = [torch.Tensor.shape.__get__, torch.Tensor.size, torch.Tensor.dim,
            torch.Tensor.ndim.__get__, torch.Tensor.dtype.__get__,
            torch.Tensor.device.__get__, torch.Tensor.numel]
    calls: list[tuple[Any, dict[str, Any], Any]] = []
    other = []

    class Record(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            uses = any(a is weight for a in (*args, *kwargs.values()))
            if func in _conv_fns() and 2 <= len(args) <= 7 and args[1] is weight:
                calls.append((func, {**_DEFAULTS, **dict(zip(_ARGS[:len(args)], args, strict=True)),
                                     **kwargs}, out))
            elif uses and func not in meta:
                other.append(func)
            return out

    with torch.no_grad(), Record():
        out = functional_call(submodule(model, call.module), own, (xin,))
    if len(calls) != 1 or other or out is not calls[0][2]:
        return None
    fn, bound, conv_out = calls[0]
    if not isinstance(bound["groups"], int) or not torch.equal(conv_out, clean_out):
        return None
    done = replace(call, fn=fn, stride=bound["stride"], padding=bound["padding"],
                   dilation=bound["dilation"], groups=bound["groups"], module=None)
    return done, bound["input"], bound["bias"]


__all__ = ["ConvCall", "captured", "conv_call"]
