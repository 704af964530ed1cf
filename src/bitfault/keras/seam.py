"""The seam of bitfault.keras: (tensor, format, fault model, map) -> faulty values.

The only module of the adapter that chooses a kernel. Dense masks in a TensorFlow
graph (``FaultyLayer``, ``inject``, the recipes and ``fit``): ``fault_function``
picks the format's TensorFlow arithmetic (registered by format type in
``bitfault.keras.kernels``), ``fused`` runs the tensors of a layer as one
XLA-compiled pass (plain TensorFlow ops with ``BITFAULT_KERAS_XLA=0``),
``straight_through`` wires the gradient. Sparse maps on a tensor stored once
(``KerasEvaluator``): ``stored`` and ``faulty_elements``, the NumPy core, so a map
costs its faulty elements alone. Every path is bit for bit ``bitfault.inject``.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from bitfault.errors import ArgumentTypeError
from bitfault.faults.models import BitFlip, FaultModel, StuckAt
from bitfault.formats import Format
from bitfault.formats.planes import channel_axis as format_channel_axis
from bitfault.keras.kernels import floats  # noqa: F401  (registers every family's kernels)
from bitfault.keras.kernels.registry import kernels_for, registered
from bitfault.keras.kernels.scalar import FaultFn
from bitfault.keras.layouts import Slot
from bitfault.maps import FaultMap
from bitfault.memory.memory import StoredArray, check_map_fits

#: Set ``BITFAULT_KERAS_XLA=0`` to run the transform as plain TensorFlow ops (slower).
USE_XLA = os.environ.get("BITFAULT_KERAS_XLA", "1") != "0"


def check_supported(fmt: Format, fault: FaultModel) -> None:
    """Raise a clear error for a format or fault model this adapter cannot run in a graph."""
    kernels = kernels_for(fmt)
    if kernels.fault is None:
        blocks = registered(blocks=True)
        if kernels.blocks:
            raise TypeError(f"spec.format {fmt!r}: bitfault.keras runs the block formats "
                            f"{', '.join(blocks[:-1])} and {blocks[-1]} in a graph "
                            "(KerasEvaluator, on the NumPy core, takes any block format)")
        raise TypeError(f"spec.format must be {', '.join(registered(blocks=False))} or a "
                        f"block format ({', '.join(blocks)}), got {fmt!r}")
    if kernels.check is not None:
        kernels.check(fmt)
    if not isinstance(fault, (BitFlip, StuckAt)):
        raise TypeError(f"spec.fault must be BitFlip() or StuckAt(0|1), got {fault!r}")


def fault_function(fmt: Format, fault: FaultModel, axis: int | None = None) -> FaultFn:
    """``(x, mask) -> faulty x`` for one tensor; ``axis``: IntQuant's channel axis in x, or
    the axis of x a block format's blocks run along (then ``mask`` is one mask per plane)."""
    check_supported(fmt, fault)
    kernels = kernels_for(fmt)
    if kernels.blocks and axis is None:
        raise ValueError(f"a block format ({fmt!r}) needs the axis its blocks run along")
    return kernels.fault(fmt, fault, axis)  # type: ignore[misc]


def inject_tensor(x: Any, fmt: Format, fault: FaultModel, fmap: FaultMap) -> tf.Tensor:
    """``bitfault.inject`` for one float32 TensorFlow tensor, on its device, bit for bit.

    The map is in the tensor's own layout (the layers map a Dense kernel as PyTorch's
    ``(out, in)``; here an ``(in, out)`` kernel takes an ``(in, out)`` map), and an IntQuant
    channel axis is the tensor's own. The twin of ``bitfault.torch.inject_tensor``.
    """
    x = tf.convert_to_tensor(x)
    if x.dtype != tf.float32:
        raise ArgumentTypeError("x", x, "a float32 tensor", tail=f", got dtype {x.dtype.name}")
    shape = tuple(int(d) for d in x.shape)
    check_map_fits(fmap, shape, fmt)
    if kernels_for(fmt).blocks:
        check_supported(fmt, fault)
        lay = fmt.layout(shape)  # the block axis must exist
        shapes = fmt.plane_shapes(shape)
        masks = []
        for plane in fmt.planes:
            dtype = np.dtype(plane.format.container)
            dense = np.zeros(math.prod(shapes[plane.name]), f"u{dtype.itemsize}")
            pmap = fmap.plane(plane.name)
            if pmap is not None and pmap.indices.size:
                bits = np.uint32(fault.eligible_mask(fmt, plane.name))
                dense[pmap.indices] = (pmap.masks & bits).astype(dense.dtype)
            masks.append(tf.constant(dense.view(dtype).reshape(shapes[plane.name])))
        return fault_function(fmt, fault, lay.axis)(x, masks)
    axis = format_channel_axis(fmt)
    if axis is not None:
        fmt.reduce_axes(len(shape))  # the axis must exist
        axis = axis % len(shape)
    dtype = np.dtype(fmt.container)
    dense = np.zeros(math.prod(shape), f"u{dtype.itemsize}")
    dense[fmap.indices] = (fmap.masks & np.uint32(fault.eligible_mask(fmt))).astype(dense.dtype)
    mask = tf.constant(dense.view(dtype).reshape(shape))
    return fault_function(fmt, fault, axis)(x, mask)


def fused_fault_function(fns: Sequence[FaultFn], jit: bool = True,
                         static_shapes: bool = False) -> Any:
    """One function faulting several tensors: ``(values, masks) -> faulty values``.

    With ``jit`` it is an XLA-compiled ``tf.function``: one fused pass per tensor;
    ``static_shapes``: traced once per shape (block formats cut tensors into blocks by
    their static shapes), else shapes are relaxed on retracing.
    """

    def run(values: list[tf.Tensor], masks: list[Any]) -> list[tf.Tensor]:
        return [fn(v, m) for fn, v, m in zip(fns, values, masks, strict=True)]

    if not jit:
        return run
    return tf.function(run, jit_compile=True, autograph=False,
                       reduce_retracing=not static_shapes)


@functools.lru_cache(maxsize=256)
def _fused(fmt: Format, fault: FaultModel, axes: tuple[int | None, ...], jit: bool,
           ranks: tuple[int | None, ...] = ()) -> Any:
    return fused_fault_function([fault_function(fmt, fault, a) for a in axes], jit=jit,
                                static_shapes=kernels_for(fmt).blocks)


def fused(fmt: Format, fault: FaultModel, axes: tuple[int | None, ...]) -> Any:
    """The fused transform of tensors in ``fmt`` with channel ``axes`` (see ``channel_axis``),
    XLA-compiled unless ``BITFAULT_KERAS_XLA=0``; made once per (format, fault, axes) and
    the tensors' ranks (a retrace relaxing shapes must keep each rank: a channel axis needs
    it)."""

    def run(values: list[tf.Tensor], masks: list[Any]) -> list[tf.Tensor]:
        ranks = tuple(v.shape.rank for v in values)
        return _fused(fmt, fault, axes, USE_XLA, ranks)(values, masks)

    return run


def channel_axis(slot: Slot, fmt: Format) -> int | None:
    """The axis of ``slot``'s work layout (``Slot.work_axis``) that IntQuant(per_channel=...)
    calibrates along, or that a block format's blocks run along (its ``axis`` is in PyTorch
    layout), or None."""
    if kernels_for(fmt).blocks:
        return slot.work_axis(fmt.axis)  # type: ignore[attr-defined]
    axis = format_channel_axis(fmt)
    if axis is not None and slot.variable is not None:
        return slot.work_axis(axis)
    return None


@functools.lru_cache(maxsize=256)
def _fused_checked(fmt: Format, fault: FaultModel, axes: tuple[int | None, ...],
                   bounds: tuple[float, float], jit: bool,
                   ranks: tuple[int | None, ...] = ()) -> Any:
    fns = [fault_function(fmt, fault, a) for a in axes]
    lo, hi = bounds

    def run(values: list[tf.Tensor], masks: list[Any]) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
        out = [fn(v, m) for fn, v, m in zip(fns, values, masks, strict=True)]
        return out, [tf.reduce_all((v >= lo) & (v <= hi)) for v in values]

    if not jit:
        return run
    return tf.function(run, jit_compile=True, autograph=False,
                       reduce_retracing=not kernels_for(fmt).blocks)


def fused_checked(fmt: Format, fault: FaultModel, axes: tuple[int | None, ...],
                  bounds: tuple[float, float]) -> Any:
    """``fused`` that also returns, per tensor, whether every value lies in ``bounds`` (a
    scalar bool), found by the same fused pass: ``straight_through``'s backward then passes
    the gradient through as it is in the usual case, and runs the zeroing pass only for a
    tensor with a value outside (or a NaN). Made once per tensors' ranks, as ``fused``."""

    def run(values: list[tf.Tensor], masks: list[Any]) -> Any:
        ranks = tuple(v.shape.rank for v in values)
        return _fused_checked(fmt, fault, axes, bounds, USE_XLA, ranks)(values, masks)

    return run


@functools.cache
def _zero_outside(lo: float, hi: float, jit: bool) -> Any:
    """``(v, dy) -> dy`` where ``lo <= v <= hi``, exactly 0 elsewhere: one fused pass (XLA)."""

    def run(v: tf.Tensor, dy: tf.Tensor) -> tf.Tensor:
        return tf.where((v >= lo) & (v <= hi), dy, tf.zeros_like(dy))

    return tf.function(run, jit_compile=True) if jit else run


def _unless(inside: tf.Tensor, zero_outside: Any, v: tf.Tensor, dy: tf.Tensor) -> tf.Tensor:
    """``dy`` itself where every value of ``v`` was ``inside`` the bounds, else the zeroing."""
    return tf.cond(inside, lambda: tf.identity(dy), lambda: zero_outside(v, dy))


def straight_through(fused: Any, values: list[tf.Tensor], masks: list[Any],
                     gradient: str, bounds: tuple[float, float] | None = None,
                     checked: Any = None) -> list[tf.Tensor]:
    """The faulty values; "ste": gradient passes to ``values`` unchanged (exactly zero
    where a value lies outside ``bounds``, see ``gradient_bounds``); "blocked": none.
    ``masks``: one per value, a tensor or (block formats) a tuple of plane masks.
    ``checked``: ``fused_checked`` for the same tensors and ``bounds``, used instead of
    ``fused``: the zeroing pass runs only for a tensor with a value outside ``bounds``."""
    if gradient == "blocked":
        return [tf.stop_gradient(v) for v in fused(values, masks)]
    n = len(values)
    flat = tf.nest.flatten(masks)
    if bounds is None:
        checked = None

    @tf.custom_gradient
    def identity_grad(*args: tf.Tensor) -> Any:
        pack = tf.nest.pack_sequence_as(masks, list(args[n:]))
        if checked is not None:
            out, keep = checked(list(args[:n]), pack)
        else:
            out, keep = fused(list(args[:n]), pack), [None] * n

        def grad(*dys: tf.Tensor) -> list[Any]:
            if bounds is not None:
                zero_outside = _zero_outside(*bounds, USE_XLA)
                dys = tuple(zero_outside(v, dy) if k is None else _unless(k, zero_outside, v, dy)
                            for v, dy, k in zip(args[:n], dys, keep, strict=True))
            return [*dys, *([None] * len(flat))]

        return out, grad

    out = identity_grad(*values, *flat)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def stored(x: np.ndarray, fmt: Format) -> StoredArray:
    """``x`` (PyTorch layout) stored once in ``fmt``, for ``faulty_elements``."""
    return StoredArray.of(x, fmt)


def faulty_elements(memory: StoredArray, fault: FaultModel,
                    fmap: FaultMap) -> tuple[np.ndarray, np.ndarray]:
    """Flat PyTorch-layout indices of the elements ``fmap`` faults and their faulty values
    (the NumPy core: the cost of the faults alone, the bits of ``bitfault.inject``)."""
    return memory.faulty_elements(fault, fmap)


__all__ = [
    "USE_XLA",
    "channel_axis",
    "check_supported",
    "fault_function",
    "faulty_elements",
    "fused",
    "fused_checked",
    "fused_fault_function",
    "inject_tensor",
    "stored",
    "straight_through",
]
