"""Which tensors of a Keras layer are faulted, their names, and their PyTorch layouts.

Fault maps are drawn in PyTorch layout so one seed gives the same faulty
weights in every framework: a Dense kernel ``(in, out)`` is the transpose of a
Linear weight ``(out, in)``; a ConvNd kernel ``(*k, in, out)`` is the Conv
weight ``(out, in, *k)`` permuted; an Embedding table is the same in both.
EinsumDense has no PyTorch counterpart: its kernel is mapped in its own layout.
Channels-last activations ``(N, *spatial, C)`` are mapped per example as
``(C, *spatial)``.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from bitfault.formats import BlockFormat, Format, IntQuant
from bitfault.maps import FaultMap
from bitfault.memory import Memory
from bitfault.spec import FaultSpec

SUPPORTED_LAYERS: tuple[type, ...] = (
    keras.layers.Dense, keras.layers.EinsumDense, keras.layers.Conv1D, keras.layers.Conv2D,
    keras.layers.Conv3D, keras.layers.Embedding)
SUPPORTED_NAMES = "Dense, EinsumDense, Conv1D, Conv2D, Conv3D and Embedding"
_WEIGHT_VARIABLES = ("kernel", "embeddings")


@dataclass(frozen=True, eq=False)
class Slot:
    """One faulted tensor of a layer.

    ``perm``: the Keras tensor is ``np.transpose(torch_tensor, perm)`` (per
    example for activations). ``variable`` is None for activations.
    """

    target: str
    name: str
    keras_shape: tuple[int, ...]
    perm: tuple[int, ...]
    variable: Any = None

    @property
    def torch_shape(self) -> tuple[int, ...]:
        shape = [0] * len(self.perm)
        for keras_axis, torch_axis in enumerate(self.perm):
            shape[torch_axis] = self.keras_shape[keras_axis]
        return tuple(shape)

    def to_keras(self, torch_array: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.transpose(torch_array, self.perm))

    def keras_indices(self, torch_indices: np.ndarray) -> np.ndarray:
        """Flat indices into the Keras tensor of flat indices into the PyTorch-layout one."""
        if self.perm == tuple(range(len(self.perm))):
            return torch_indices
        coords = np.unravel_index(torch_indices, self.torch_shape)
        return np.ravel_multi_index(tuple(coords[a] for a in self.perm), self.keras_shape)

    def to_torch(self, keras_array: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.transpose(keras_array, np.argsort(self.perm)))

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
        ndim = len(self.perm)
        if not -ndim <= torch_axis < ndim:
            raise ValueError(f"per_channel axis {torch_axis} is out of range for tensor "
                             f"{self.name!r} with {ndim} dimensions")
        return self.perm.index(torch_axis % ndim)


def is_supported(layer: Any) -> bool:
    return isinstance(layer, SUPPORTED_LAYERS)


def _kernel_perm(layer: Any, ndim: int) -> tuple[int, ...]:
    if isinstance(layer, (keras.layers.Dense, keras.layers.Conv1D, keras.layers.Conv2D,
                          keras.layers.Conv3D)):
        return (*range(2, ndim), 1, 0)  # (out, in, *k) -> (*k, in, out); (out, in) -> (in, out)
    return tuple(range(ndim))


def _output_perm(layer: Any, ndim: int) -> tuple[int, ...]:
    conv = isinstance(layer, (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D))
    if conv and getattr(layer, "data_format", "channels_last") == "channels_last" and ndim >= 2:
        return (*range(1, ndim), 0)  # (C, *spatial) -> (*spatial, C)
    return tuple(range(ndim))


def _own_variable(layer: Any, names: tuple[str, ...]) -> Any:
    return next((v for v in layer.weights if v.name in names), None)


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
               output_shape: tuple[Any, ...] | None) -> list[Slot]:
    """The tensors of a built ``layer`` of ``kinds`` (a Targets or kind names), named
    ``prefix.*``, to be stored in ``fmt`` (an IntQuant's channel axis must exist in each;
    None: no format to check)."""
    if not is_supported(layer):
        raise TypeError(f"layer {prefix!r} is a {type(layer).__name__}; bitfault.keras faults "
                        f"{SUPPORTED_NAMES} layers")
    slots = []
    if "weights" in kinds:
        kernel = _own_variable(layer, _WEIGHT_VARIABLES)
        if kernel is None:
            raise ValueError(f"layer {prefix!r} has no kernel or embeddings variable (is it "
                             "built?)")
        _check_float32(kernel, f"{prefix}.weight")
        shape = tuple(int(d) for d in kernel.shape)
        slots.append(Slot("weights", f"{prefix}.weight", shape,
                          _kernel_perm(layer, len(shape)), kernel))
    if "biases" in kinds:
        bias = _own_variable(layer, ("bias",))
        if bias is not None:
            _check_float32(bias, f"{prefix}.bias")
            shape = tuple(int(d) for d in bias.shape)
            slots.append(Slot("biases", f"{prefix}.bias", shape, tuple(range(len(shape))), bias))
    if "activations" in kinds:
        if output_shape is None or any(d is None for d in output_shape[1:]):
            raise ValueError(f"activation faults on {prefix!r} need a fixed per-example output "
                             f"shape; the layer's output shape is {output_shape}")
        shape = tuple(int(d) for d in output_shape[1:])
        if isinstance(fmt, IntQuant) and fmt.axis is not None:
            raise ValueError("spec.format IntQuant(per_channel=...) is not supported for "
                             "activation faults in bitfault.keras; use per_channel=False")
        slots.append(Slot("activations", f"{prefix}.output", shape,
                          _output_perm(layer, len(shape))))
    if isinstance(fmt, BlockFormat) and any(s.variable is None for s in slots):
        raise ValueError(f"spec.format {fmt!r} is a block format: bitfault.keras faults "
                         "weights and biases stored in it, not activations (use an element "
                         "format for activation faults)")
    if isinstance(fmt, IntQuant) and fmt.axis is not None:
        for slot in slots:
            if slot.variable is not None:
                slot.keras_axis(fmt.axis)  # the channel axis must exist
    if isinstance(fmt, BlockFormat):
        for slot in slots:
            fmt.layout(slot.torch_shape)  # the block axis must exist (ArgumentError)
    return slots


def draw_maps(slots: list[Slot], spec: FaultSpec, step: int | None) -> dict[str, FaultMap]:
    """The map of every slot at ``step``, validated against its PyTorch-layout shape."""
    from bitfault.memory import check_map_fits

    maps = {}
    for slot in slots:
        fmap = spec.map_for(slot.name, slot.torch_shape, step)
        check_map_fits(fmap, slot.torch_shape, spec.format, argument=f"spec.maps[{slot.name!r}]")
        maps[slot.name] = fmap
    return maps


def dense_mask(slot: Slot, fmap: FaultMap, memory: Memory) -> np.ndarray:
    """The map as a dense mask in Keras layout and the memory format's container dtype (its
    faults restricted to the bits the fault model may touch, which all lie in the container)."""
    dtype = np.dtype(memory.format.container)
    masks = fmap.masks & np.uint32(memory.fault.eligible_mask(memory.format))
    out = np.zeros(math.prod(slot.keras_shape), f"u{dtype.itemsize}")
    out[slot.keras_indices(fmap.indices)] = masks.astype(out.dtype)
    return out.view(dtype).reshape(slot.keras_shape)


def dense_masks(slot: Slot, fmap: FaultMap, memory: Memory) -> tuple[np.ndarray, ...]:
    """The map as dense masks in Keras layout, one per plane of the memory's format (codes
    first; a block plane in its permuted plane shape, a tensor plane shape ``()``), each in
    its plane's container dtype with the faults the fault model may touch there."""
    fmt = memory.format
    if not isinstance(fmt, BlockFormat):
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
            dense[slot.keras_plane_indices(shape, pmap.indices)] = masks.astype(dense.dtype)
        out.append(dense.view(dtype).reshape(slot.keras_plane_shape(shape)))
    return tuple(out)


__all__ = ["SUPPORTED_LAYERS", "Slot", "dense_mask", "dense_masks", "draw_maps",
           "is_supported", "plan_slots"]
