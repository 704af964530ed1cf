"""Which tensors of a Keras layer are faulted, their names, and their PyTorch layouts.

Fault maps are drawn in PyTorch layout so one seed gives the same faulty
weights in every framework: a Dense kernel ``(in, out)`` is the transpose of a
Linear weight ``(out, in)``; a ConvNd kernel ``(*k, in, out)`` is the Conv
weight ``(out, in, *k)`` permuted; a depthwise kernel ``(*k, in, mult)`` is a grouped
Conv weight ``(in * mult, 1, *k)`` (axes permuted, then merged); an Embedding table is
the same in both. ``bitfault.keras.kinds`` lists every layer kind and its layouts
(EinsumDense keeps its own Keras layout). Channels-last activations ``(N, *spatial,
C)`` are mapped per example as ``(C, *spatial)``.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from bitfault.formats import Format
from bitfault.formats.planes import channel_axis, is_block_format
from bitfault.keras.kinds import CHANNELS_LAST, NO_ACTIVATIONS, SUPPORTED_NAMES, plan_layer, planner
from bitfault.maps import FaultMap
from bitfault.memory.memory import Memory
from bitfault.spec import FaultSpec

#: The kinds whose kernels the recipes (``stored_weights``, clipping, ``fit``) store.
SUPPORTED_LAYERS: tuple[type, ...] = (
    keras.layers.Dense, keras.layers.EinsumDense, keras.layers.Conv1D, keras.layers.Conv2D,
    keras.layers.Conv3D, keras.layers.Embedding)


@dataclass(frozen=True, eq=False)
class Slot:
    """One faulted tensor of a layer.

    ``perm``: the Keras tensor is ``np.transpose(torch_tensor, perm)`` (per
    example for activations), where ``merged`` (the PyTorch shape, when it merges
    axes: a depthwise kernel's ``in * mult``) is first split back into the permuted
    Keras axes. ``variable`` is None for activations. A merged slot is faulted in its
    PyTorch layout (its masks are; ``work_*``), any other in its Keras layout.
    """

    target: str
    name: str
    keras_shape: tuple[int, ...]
    perm: tuple[int, ...]
    variable: Any = None
    merged: tuple[int, ...] | None = None
    layer: str = ""  # the path of the layer it belongs to (its name's prefix)

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """The Keras shape in PyTorch axis order (the PyTorch shape, axes not merged)."""
        shape = [0] * len(self.perm)
        for keras_axis, torch_axis in enumerate(self.perm):
            shape[torch_axis] = self.keras_shape[keras_axis]
        return tuple(shape)

    @property
    def torch_shape(self) -> tuple[int, ...]:
        return self.merged if self.merged is not None else self.grid_shape

    @property
    def in_torch_layout(self) -> bool:
        """Whether this slot is faulted in its PyTorch layout (its axes merge)."""
        return self.merged is not None and self.merged != self.grid_shape

    def to_keras(self, torch_array: np.ndarray) -> np.ndarray:
        grid = np.reshape(torch_array, self.grid_shape)
        return np.ascontiguousarray(np.transpose(grid, self.perm))

    def keras_indices(self, torch_indices: np.ndarray) -> np.ndarray:
        """Flat indices into the Keras tensor of flat indices into the PyTorch-layout one."""
        if self.perm == tuple(range(len(self.perm))):
            return torch_indices
        coords = np.unravel_index(torch_indices, self.grid_shape)  # merging keeps flat order
        return np.ravel_multi_index(tuple(coords[a] for a in self.perm), self.keras_shape)

    def to_torch(self, keras_array: np.ndarray) -> np.ndarray:
        grid = np.transpose(keras_array, np.argsort(self.perm))
        return np.ascontiguousarray(grid).reshape(self.torch_shape)

    def keras_plane_shape(self, torch_plane_shape: tuple[int, ...]) -> tuple[int, ...]:
        """A plane of this tensor (PyTorch-layout shape, ``()`` for a tensor plane) in Keras
        layout: permuted as the tensor is."""
        if not torch_plane_shape:
            return ()
        return tuple(int(torch_plane_shape[a]) for a in self.perm)

    def keras_plane_indices(self, torch_plane_shape: tuple[int, ...],
                            torch_indices: np.ndarray) -> np.ndarray:
        """``keras_indices`` for a plane of this tensor (block planes permute as codes do)."""
        if not torch_plane_shape or self.perm == tuple(range(len(self.perm))):
            return torch_indices
        coords = np.unravel_index(torch_indices, torch_plane_shape)
        return np.ravel_multi_index(tuple(coords[a] for a in self.perm),
                                    self.keras_plane_shape(torch_plane_shape))

    def keras_axis(self, torch_axis: int) -> int:
        """The Keras axis holding PyTorch axis ``torch_axis`` (IntQuant's channel axis)."""
        ndim = len(self.torch_shape)
        if not -ndim <= torch_axis < ndim:
            raise ValueError(f"per_channel axis {torch_axis} is out of range for tensor "
                             f"{self.name!r} with {ndim} dimensions")
        if self.in_torch_layout:
            raise ValueError(f"tensor {self.name!r} merges Keras axes into PyTorch axes; it "
                             "has no Keras axis per PyTorch axis (see work_axis)")
        return self.perm.index(torch_axis % ndim)

    # ---- the layout the fault transform runs in: Keras, or PyTorch for a merged slot ----

    def work_axis(self, torch_axis: int) -> int:
        """The axis of the work layout holding PyTorch axis ``torch_axis``."""
        if not self.in_torch_layout:
            return self.keras_axis(torch_axis)
        ndim = len(self.torch_shape)
        if not -ndim <= torch_axis < ndim:
            raise ValueError(f"per_channel axis {torch_axis} is out of range for tensor "
                             f"{self.name!r} with {ndim} dimensions")
        return torch_axis % ndim

    def work_shape(self, torch_plane_shape: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """The tensor's (or a plane's, given its PyTorch shape) shape in the work layout."""
        if torch_plane_shape is None:
            return self.torch_shape if self.in_torch_layout else self.keras_shape
        return tuple(torch_plane_shape) if self.in_torch_layout else \
            self.keras_plane_shape(torch_plane_shape)

    def work_indices(self, torch_indices: np.ndarray,
                     torch_plane_shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Flat work-layout indices of flat PyTorch-layout ones (of a plane, given its shape)."""
        if self.in_torch_layout:
            return torch_indices
        if torch_plane_shape is None:
            return self.keras_indices(torch_indices)
        return self.keras_plane_indices(torch_plane_shape, torch_indices)

    def to_work(self, x: Any) -> Any:
        """A Keras-layout tensor (TensorFlow) in the work layout."""
        if not self.in_torch_layout:
            return x
        grid = keras.ops.transpose(x, tuple(int(a) for a in np.argsort(self.perm)))
        return keras.ops.reshape(grid, self.torch_shape)

    def from_work(self, x: Any) -> Any:
        """A work-layout tensor (TensorFlow) in Keras layout."""
        if not self.in_torch_layout:
            return x
        return keras.ops.transpose(keras.ops.reshape(x, self.grid_shape), self.perm)


def is_supported(layer: Any) -> bool:
    """Whether ``layer`` is of a kind bitfault.keras faults (``bitfault.keras.kinds``)."""
    return planner(layer) is not None


def _output_perm(layer: Any, ndim: int) -> tuple[int, ...]:
    conv = isinstance(layer, CHANNELS_LAST)
    if conv and getattr(layer, "data_format", "channels_last") == "channels_last" and ndim >= 2:
        return (*range(1, ndim), 0)  # (C, *spatial) -> (*spatial, C)
    return tuple(range(ndim))


def _check_float32(variable: Any, name: str) -> None:
    dtype = str(variable.dtype)
    if "int" in dtype or "bool" in dtype:
        raise TypeError(f"tensor {name!r} ({variable.path}) has dtype {dtype}: bitfault faults "
                        "float weights (a quantized or integer variable is already words; fault "
                        "the float model instead)")
    if dtype != "float32":
        raise TypeError(f"tensor {name!r} ({variable.path}) has dtype {dtype}: bitfault.keras "
                        "supports float32 variables (mixed-precision policies keep float32 "
                        "variables and are supported)")


def plan_slots(layer: Any, prefix: str, kinds: Collection[str], fmt: Format | None,
               output_shape: tuple[Any, ...] | None, every: bool = False) -> list[Slot]:
    """The tensors of a built ``layer`` of ``kinds`` (a Targets or kind names), named
    ``prefix.*``, to be stored in ``fmt`` (an IntQuant's channel axis must exist in each;
    None: no format to check). ``every``: also the tensors that are candidates only when
    include patterns name them (a norm's scale and shift)."""
    if not layer.built:
        raise ValueError(f"layer {prefix!r} is not built; build the model (call it on data or "
                         "give it an Input) first")
    slots = []
    for t in plan_layer(layer, prefix):
        if t.kind not in kinds or not (t.default or every):
            continue
        name = f"{prefix}.{t.attr}"
        _check_float32(t.variable, name)
        shape = tuple(int(d) for d in t.variable.shape)
        slots.append(Slot(t.kind, name, shape, t.perm, t.variable, t.shape, prefix))
    if "activations" in kinds and not isinstance(layer, NO_ACTIVATIONS):
        if output_shape is None or any(d is None for d in output_shape[1:]):
            raise ValueError(f"activation faults on {prefix!r} need a fixed per-example output "
                             f"shape; the layer's output shape is {output_shape}")
        shape = tuple(int(d) for d in output_shape[1:])
        if channel_axis(fmt) is not None:
            raise ValueError("spec.format IntQuant(per_channel=...) is not supported for "
                             "activation faults in bitfault.keras; use per_channel=False")
        slots.append(Slot("activations", f"{prefix}.output", shape,
                          _output_perm(layer, len(shape)), layer=prefix))
    if is_block_format(fmt) and any(s.variable is None for s in slots):
        raise ValueError(f"spec.format {fmt!r} is a block format: bitfault.keras faults "
                         "weights and biases stored in it, not activations (use an element "
                         "format for activation faults)")
    axis = channel_axis(fmt)
    if axis is not None:
        for slot in slots:
            if slot.variable is not None:
                slot.work_axis(axis)  # the channel axis must exist
    if is_block_format(fmt):
        for slot in slots:
            fmt.layout(slot.torch_shape)  # the block axis must exist (ArgumentError)
    return slots


def draw_maps(slots: list[Slot], spec: FaultSpec, step: int | None) -> dict[str, FaultMap]:
    """The map of every slot at ``step``, validated against its PyTorch-layout shape."""
    from bitfault.memory.memory import check_map_fits

    maps = {}
    for slot in slots:
        fmap = spec.map_for(slot.name, slot.torch_shape, step)
        check_map_fits(fmap, slot.torch_shape, spec.format, argument=f"spec.maps[{slot.name!r}]")
        maps[slot.name] = fmap
    return maps


def dense_mask(slot: Slot, fmap: FaultMap, memory: Memory) -> np.ndarray:
    """The map as a dense mask in the slot's work layout (Keras, or PyTorch where axes
    merge) and the memory format's container dtype (its
    faults restricted to the bits the fault model may touch, which all lie in the container)."""
    dtype = np.dtype(memory.format.container)
    masks = fmap.masks & np.uint32(memory.fault.eligible_mask(memory.format))
    out = np.zeros(math.prod(slot.keras_shape), f"u{dtype.itemsize}")
    out[slot.work_indices(fmap.indices)] = masks.astype(out.dtype)
    return out.view(dtype).reshape(slot.work_shape())


def dense_masks(slot: Slot, fmap: FaultMap, memory: Memory) -> tuple[np.ndarray, ...]:
    """The map as dense masks in the slot's work layout, one per plane of the memory's format (codes
    first; a block plane in its permuted plane shape, a tensor plane shape ``()``), each in
    its plane's container dtype with the faults the fault model may touch there."""
    fmt = memory.format
    if not is_block_format(fmt):
        return (dense_mask(slot, fmap, memory),)
    shapes = fmt.plane_shapes(slot.torch_shape)
    out = []
    for plane in fmt.planes:
        dtype = np.dtype(plane.format.container)
        shape = shapes[plane.name]
        dense = np.zeros(math.prod(shape), f"u{dtype.itemsize}")
        pmap = fmap.plane(plane.name)
        if pmap is not None and pmap.indices.size:
            masks = pmap.masks & np.uint32(memory.fault.eligible_mask(fmt, plane.name))
            dense[slot.work_indices(pmap.indices, shape)] = masks.astype(dense.dtype)
        out.append(dense.view(dtype).reshape(slot.work_shape(shape)))
    return tuple(out)


__all__ = ["SUPPORTED_LAYERS", "SUPPORTED_NAMES", "Slot", "dense_mask", "dense_masks", "draw_maps",
           "is_supported", "plan_slots"]
