"""The layer kinds bitfault.keras faults: which variables of a layer it stores, and how.

Each kind says, for a built layer, which of its variables are stored tensors, their
PyTorch names (after the layer path), their kind ("weights" | "biases" | "buffers") and
their PyTorch layout: ``perm`` (the Keras tensor is the PyTorch tensor, its merged axes
split, transposed by ``perm``) and ``shape`` (the PyTorch shape where axes merge, e.g. a
depthwise kernel's ``(in, multiplier)`` into ``in * multiplier`` output channels). A
layer of a kind not listed here is left out, with the reason (``left_out_reason``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import keras


@dataclass(frozen=True)
class Planned:
    """One stored tensor of a layer: ``attr`` follows the layer path in its name
    (``"weight"``, ``"depthwise.weight"``, ``"weight_hh_l0"``); ``default``: a candidate
    without include patterns (a norm's scale and shift are not, as in bitfault.torch)."""

    attr: str
    kind: str
    variable: Any
    perm: tuple[int, ...]
    shape: tuple[int, ...] | None = None
    default: bool = True


Planner = Callable[[Any], list[Planned]]


def _shape(variable: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in variable.shape)


def _same(attr: str, kind: str, variable: Any, default: bool = True) -> Planned:
    return Planned(attr, kind, variable, tuple(range(len(variable.shape))), None, default)


def _transposed(attr: str, variable: Any) -> Planned:
    """A ``(in, out)`` matrix stored as PyTorch's ``(out, in)``."""
    return Planned(attr, "weights", variable, (1, 0))


def _conv(attr: str, variable: Any) -> Planned:
    """A conv kernel ``(*k, in, out)`` as ``(out, in, *k)``; a transposed conv's ``(*k, out,
    in)`` as ConvTranspose's ``(in, out, *k)``: the same permutation."""
    n = len(variable.shape) - 2
    return Planned(attr, "weights", variable, (*range(2, n + 2), 1, 0))


def _depthwise(attr: str, variable: Any) -> Planned:
    """A depthwise kernel ``(*k, in, multiplier)`` as the weight of a PyTorch conv with
    ``groups=in``: ``(in * multiplier, 1, *k)`` (output channel ``c * multiplier + m``)."""
    *k, cin, mult = _shape(variable)
    return Planned(attr, "weights", variable, (*range(2, len(k) + 2), 0, 1),
                   (cin * mult, 1, *k))


def _bias(attr: str, variable: Any | None) -> list[Planned]:
    return [] if variable is None else [_same(attr, "biases", variable)]


def _dense(layer: Any) -> list[Planned]:
    return [_transposed("weight", layer.kernel), *_bias("bias", layer.bias)]


def _einsum(layer: Any) -> list[Planned]:
    return [_same("weight", "weights", layer.kernel), *_bias("bias", layer.bias)]


def _convolution(layer: Any) -> list[Planned]:
    return [_conv("weight", layer.kernel), *_bias("bias", layer.bias)]


def _depthwise_conv(layer: Any) -> list[Planned]:
    return [_depthwise("weight", layer.kernel), *_bias("bias", layer.bias)]


def _separable_conv(layer: Any) -> list[Planned]:
    """As PyTorch writes it: a depthwise conv, then a pointwise (1x1) conv with the bias."""
    return [_depthwise("depthwise.weight", layer.depthwise_kernel),
            _conv("pointwise.weight", layer.pointwise_kernel),
            *_bias("pointwise.bias", layer.bias)]


def _embedding(layer: Any) -> list[Planned]:
    return [_same("weight", "weights", layer.embeddings)]


def _heads_last(variable: Any, attr: str) -> Planned:
    """A query/key/value kernel ``(in, heads, head_dim)`` as ``(heads * head_dim, in)``."""
    d, heads, hd = _shape(variable)
    return Planned(attr, "weights", variable, (2, 0, 1), (heads * hd, d))


def _heads_first(variable: Any, attr: str) -> Planned:
    """The output kernel ``(heads, head_dim, *out)`` as ``(prod(out), heads * head_dim)``."""
    heads, hd, *out = _shape(variable)
    m = len(out)
    return Planned(attr, "weights", variable, (m, m + 1, *range(m)),
                   (math.prod(out), heads * hd))


def _flat_bias(variable: Any | None, attr: str) -> list[Planned]:
    if variable is None:
        return []
    shape = _shape(variable)
    return [Planned(attr, "biases", variable, tuple(range(len(shape))), (math.prod(shape),))]


def _attention(layer: Any) -> list[Planned]:
    """MultiHeadAttention as ``torch.nn.MultiheadAttention`` with separate projections:
    ``q_proj_weight`` / ``k_proj_weight`` / ``v_proj_weight`` ``(heads * head_dim, in)``,
    their biases, ``out_proj.weight`` ``(out, heads * head_dim)`` and ``out_proj.bias``."""
    out: list[Planned] = []
    for short, dense in (("q", layer.query_dense), ("k", layer.key_dense),
                         ("v", layer.value_dense)):
        out.append(_heads_last(dense.kernel, f"{short}_proj_weight"))
        out += _flat_bias(dense.bias, f"{short}_proj_bias")
    dense = layer.output_dense
    return [*out, _heads_first(dense.kernel, "out_proj.weight"),
            *_flat_bias(dense.bias, "out_proj.bias")]


def _cells(layer: Any) -> list[Any]:
    cell = layer.cell
    return list(cell.cells) if isinstance(cell, keras.layers.StackedRNNCells) else [cell]


def _recurrent(layer: Any, suffix: str = "") -> list[Planned]:
    """An RNN as ``torch.nn.LSTM`` / ``GRU`` / ``RNN`` names it: ``weight_ih_l{k}`` (``(gates *
    units, in)``), ``weight_hh_l{k}`` (``(gates * units, units)``), and Keras's own bias (one
    tensor: ``bias_l{k}``, its Keras shape). Gates keep Keras's order (LSTM i, f, c, o is
    PyTorch's; GRU z, r, h is not)."""
    out: list[Planned] = []
    for k, cell in enumerate(_cells(layer)):
        kernel, recurrent = getattr(cell, "kernel", None), getattr(cell, "recurrent_kernel", None)
        if kernel is None or recurrent is None:
            raise TypeError(f"an RNN cell of type {type(cell).__name__} (no kernel and "
                            "recurrent_kernel)")
        out += [_transposed(f"weight_ih_l{k}{suffix}", kernel),
                _transposed(f"weight_hh_l{k}{suffix}", recurrent),
                *_bias(f"bias_l{k}{suffix}", getattr(cell, "bias", None))]
    return out


def _bidirectional(layer: Any) -> list[Planned]:
    """Both directions, the backward one's names ending in ``_reverse`` (as in PyTorch)."""
    return _recurrent(layer.forward_layer) + _recurrent(layer.backward_layer, "_reverse")


def _batch_norm(layer: Any) -> list[Planned]:
    """The moving statistics as PyTorch's ``running_mean`` / ``running_var`` buffers; the
    scale and shift (``weight`` / ``bias``) only when include patterns name them."""
    out = [_same("weight", "weights", layer.gamma, False)] if layer.scale else []
    out += [_same("bias", "biases", layer.beta, False)] if layer.center else []
    return [*out, _same("running_mean", "buffers", layer.moving_mean),
            _same("running_var", "buffers", layer.moving_variance)]


def _norm(layer: Any) -> list[Planned]:
    out = [_same("weight", "weights", layer.gamma, False)] if getattr(layer, "scale", False) \
        else []
    return out + ([_same("bias", "biases", layer.beta, False)]
                  if getattr(layer, "center", False) else [])


def _time_distributed(layer: Any) -> list[Planned]:
    inner = planner(layer.layer)
    if inner is None:
        raise TypeError(f"TimeDistributed around a {type(layer.layer).__name__}")
    return inner(layer.layer)


L = keras.layers
PLANNERS: dict[type, Planner] = {
    L.Dense: _dense, L.EinsumDense: _einsum,
    L.Conv1D: _convolution, L.Conv2D: _convolution, L.Conv3D: _convolution,
    L.Conv1DTranspose: _convolution, L.Conv2DTranspose: _convolution,
    L.Conv3DTranspose: _convolution,
    L.DepthwiseConv1D: _depthwise_conv, L.DepthwiseConv2D: _depthwise_conv,
    L.SeparableConv1D: _separable_conv, L.SeparableConv2D: _separable_conv,
    L.Embedding: _embedding, L.MultiHeadAttention: _attention,
    L.RNN: _recurrent, L.Bidirectional: _bidirectional,
    L.BatchNormalization: _batch_norm, L.LayerNormalization: _norm,
    L.GroupNormalization: _norm, L.TimeDistributed: _time_distributed,
}
#: Kinds whose output is one tensor a per-example activation map can cover.
NO_ACTIVATIONS: tuple[type, ...] = (L.MultiHeadAttention, L.RNN, L.Bidirectional)
#: Kinds whose output is channels last (``(N, *spatial, C)``, mapped as ``(C, *spatial)``).
CHANNELS_LAST: tuple[type, ...] = (
    L.Conv1D, L.Conv2D, L.Conv3D, L.Conv1DTranspose, L.Conv2DTranspose, L.Conv3DTranspose,
    L.DepthwiseConv1D, L.DepthwiseConv2D, L.SeparableConv1D, L.SeparableConv2D)
SUPPORTED_NAMES = ("Dense, EinsumDense, Conv1D/2D/3D, Conv1D/2D/3DTranspose, "
                   "DepthwiseConv1D/2D, SeparableConv1D/2D, Embedding, MultiHeadAttention, "
                   "RNN (LSTM, GRU, SimpleRNN, stacked cells), Bidirectional, TimeDistributed, "
                   "BatchNormalization, LayerNormalization and GroupNormalization")


def planner(layer: Any) -> Planner | None:
    """The planner of ``layer``'s kind (its class or the nearest listed base), or None."""
    for cls in type(layer).__mro__:
        if cls in PLANNERS:
            return PLANNERS[cls]
    return None


def plan_layer(layer: Any, path: str) -> list[Planned]:
    """The stored tensors of a built layer of a listed kind (TypeError for another kind)."""
    plan = planner(layer)
    if plan is None:
        raise TypeError(f"layer {path!r} is a {type(layer).__name__}; bitfault.keras faults "
                        f"{SUPPORTED_NAMES} layers")
    try:
        return plan(layer)
    except TypeError as exc:
        raise TypeError(f"layer {path!r}: bitfault.keras cannot fault {exc}; it faults "
                        f"{SUPPORTED_NAMES} layers") from None


def left_out_reason(layer: Any) -> str:
    """Why the variables of ``layer`` that its kind does not store are left out."""
    kind = type(layer).__name__
    if planner(layer) is None:
        return (f"a variable of a {kind} layer, a kind bitfault.keras does not fault (it "
                f"faults {SUPPORTED_NAMES} layers)")
    return f"a variable of {kind} that is not one of its stored tensors"


def default_reason(layer: Any, ndim: int) -> str:
    """Why a non-default tensor (a norm's scale or shift) is left out by default."""
    return (f"a {ndim}-D parameter of {type(layer).__name__}, not a weight matrix or its "
            "bias (a norm's scale, say); name it in targets.include to fault it")


__all__ = ["CHANNELS_LAST", "NO_ACTIVATIONS", "PLANNERS", "SUPPORTED_NAMES", "Planned",
           "default_reason", "left_out_reason", "plan_layer", "planner"]
