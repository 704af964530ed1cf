"""FaultyLayer: a Keras wrapper whose inner layer computes with faulty weights.

The wrapper keeps the inner layer's clean float32 variables (what the
optimizer updates and what is saved) and, per call, computes their faulty
values in one fused XLA pass, then runs the inner layer with those values
substituted for the variables (``keras.StatelessScope``: nothing is assigned).
Under ``gradient="ste"`` the faulty values pass their gradient straight to
the clean variables (zero where a clean value lies outside what the format
stores, ``bitfault.formats.gradient_bounds``); under ``"blocked"`` they pass
none, as the seed program's ``tf.stop_gradient`` did. A zero gradient does not
stop one large step (or momentum) from carrying a value out of the range, so
each faulted trainable variable of a bounded format also gets a constraint
(its own first, then ``KeepStorable``) that every Keras optimizer applies after
each update: ``model.fit``, ``train_on_batch`` and ``optimizer.apply`` loops
alike. Fault masks are non-trainable integer variables in Keras layout, drawn
from the NumPy core in PyTorch layout.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from bitfault.formats import Format, gradient_bounds
from bitfault.formats.planes import is_block_format
from bitfault.keras.layouts import (
    SUPPORTED_NAMES,
    Slot,
    dense_masks,
    draw_maps,
    is_supported,
)
from bitfault.keras.recipes import ClipToRange, ClipWeights
from bitfault.keras.seam import (
    channel_axis,
    check_supported,
    fused,
    fused_checked,
    straight_through,
)
from bitfault.keras.targets import layer_slots
from bitfault.maps import FaultMap
from bitfault.spec import FaultSpec

as_spec = FaultSpec.coerce


def _check_step(step: Any) -> int | None:
    if step is None:
        return None
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"step must be None or a non-negative integer, got {step!r}")
    return int(step)


@contextmanager
def _substituted(pairs: Iterable[tuple[Any, Any]]) -> Iterator[keras.StatelessScope]:
    """Inside: reading each variable gives its paired value (nothing is assigned)."""
    scope = keras.StatelessScope(list(pairs), collect_losses=True, initialize_variables=False)
    with scope:
        outer = scope.original_scope  # the scope it was entered in (set by __enter__)
        if outer is not None:  # keep what an enclosing scope substitutes
            scope.state_mapping = {**outer.state_mapping, **scope.state_mapping}
        yield scope


class _StoredValues(keras.layers.Layer):
    """Calls ``read()`` with no autocast scope: a float32 layer that does not autocast
    clears an enclosing scope in its ``__call__``, so mixed-precision policies leave the
    float32 values read unchanged. Not tracked by any model (one for the module)."""

    def __init__(self) -> None:
        super().__init__(dtype="float32", autocast=False, trainable=False,
                         name="bitfault_stored_values")

    def call(self, anchor: Any, read: Any = None) -> Any:
        return read()


_stored_values: _StoredValues | None = None


def _mask_values(masks: tuple[Any, ...]) -> Any:
    """A slot's mask variables as the fault function takes them: one tensor, or (a block
    format) a tuple with one per plane."""
    tensors = tuple(tf.convert_to_tensor(m.value) for m in masks)
    return tensors[0] if len(tensors) == 1 else tensors


def _read(params: list[tuple[Slot, Any]], compute_dtype: str | None = None
          ) -> tuple[list[tf.Tensor], list[Any]]:
    """The clean float32 values (never autocast, e.g. to float16) and the masks.

    ``compute_dtype``: that of the layer whose call reads them. Inside a layer's call
    Keras autocasts to its compute dtype or not at all, so under "float32" the values
    are read directly (the reading layer costs ~0.2 ms per eager call)."""
    global _stored_values

    def read() -> list[tf.Tensor]:
        return [tf.convert_to_tensor(s.variable.value) for s, _ in params]

    if compute_dtype == "float32":
        values = read()
    else:
        if _stored_values is None:
            _stored_values = _StoredValues()
        values = list(_stored_values(tf.zeros(()), read=read))
    return values, [_mask_values(m) for _, m in params]


def storable_range(fmt: Format) -> tuple[float, float] | None:
    """The float32 interval a clean value of ``fmt`` is projected into, or None (unbounded):
    ``gradient_bounds`` rounded inward to float32, so that a projected value never rounds
    past the end (FixedPoint(32, 28)'s top, 8 - 2**-28, is 8.0 in float32)."""
    bounds = gradient_bounds(fmt)
    if bounds is None:
        return None
    lo, hi = (np.float32(b) for b in bounds)
    if float(lo) < bounds[0]:
        lo = np.nextafter(lo, np.float32(np.inf))
    if float(hi) > bounds[1]:
        hi = np.nextafter(hi, np.float32(-np.inf))
    return float(lo), float(hi)


class KeepStorable(keras.constraints.Constraint):
    """``first`` (a variable's own constraint, or None), then a projection into ``[lo, hi]``:
    what a FaultyLayer sets on each clean variable it faults. The projection is one
    ``ClipByValue`` pass whose result the optimizer's assign adopts without a copy."""

    def __init__(self, first: Any, lo: float, hi: float) -> None:
        if not lo < hi:
            raise ValueError(f"KeepStorable needs lo < hi, got {lo!r}, {hi!r}")
        self.first, self.lo, self.hi = first, float(lo), float(hi)

    def __call__(self, w: Any) -> Any:
        w = tf.convert_to_tensor(w if self.first is None else self.first(w))
        return tf.raw_ops.ClipByValue(t=w, clip_value_min=tf.constant(self.lo, w.dtype),
                                      clip_value_max=tf.constant(self.hi, w.dtype))


def keep_storable(constraint: Any, bounds: tuple[float, float]) -> KeepStorable:
    """``constraint`` followed by the projection into ``bounds``; a clip (``ClipToRange``,
    ``ClipWeights``, an earlier ``KeepStorable``) is merged into the one projection."""
    lo, hi = bounds
    first = constraint
    if isinstance(constraint, KeepStorable):
        first, lo, hi = constraint.first, max(lo, constraint.lo), min(hi, constraint.hi)
    if isinstance(first, ClipWeights):
        first, lo, hi = None, max(lo, -first.w_max), min(hi, first.w_max)
    elif isinstance(first, ClipToRange):
        first, lo, hi = None, max(lo, first.lo), min(hi, first.hi)
    return KeepStorable(first, lo, hi) if lo < hi else KeepStorable(constraint, *bounds)


@keras.saving.register_keras_serializable(package="bitfault")
class FaultyLayer(keras.layers.Wrapper):
    """Run ``layer`` (a kind of ``bitfault.keras.kinds``: Dense, convolutions, Embedding,
    MultiHeadAttention, recurrent layers, norms' statistics) through faulty memory.

    ``spec`` says what is faulted and how; tensors are named
    ``"<tensor_prefix>.weight"``, ``".bias"``, ``".output"`` (prefix: the
    layer's name unless given). ``step`` picks the maps of a transient spec
    (default 0; ``resample`` changes it). The wrapper takes the inner layer's
    name and dtype policy.
    """

    def __init__(self, layer: keras.layers.Layer, spec: FaultSpec | dict[str, Any],
                 tensor_prefix: str | None = None, step: int | None = None,
                 **kwargs: Any) -> None:
        spec = as_spec(spec)
        check_supported(spec.format, spec.fault)
        if isinstance(layer, FaultyLayer):
            raise TypeError(f"layer {layer.name!r} is already a FaultyLayer")
        if not is_supported(layer):
            raise TypeError(f"layer must be one of {SUPPORTED_NAMES}, got "
                            f"{type(layer).__name__} ({getattr(layer, 'name', '?')!r})")
        if tensor_prefix is not None and (not isinstance(tensor_prefix, str) or not tensor_prefix):
            raise ValueError(f"tensor_prefix must be a non-empty string, got {tensor_prefix!r}")
        kwargs.setdefault("name", layer.name)
        kwargs.setdefault("dtype", layer.dtype_policy)  # no casts around the inner layer
        super().__init__(layer, **kwargs)
        self.spec = spec
        self.tensor_prefix = tensor_prefix or layer.name
        self.step = _check_step(step)
        if self.step is None and spec.persistence == "transient":
            self.step = 0  # transient maps start at step 0, as in bitfault.torch
        self._slots: list[Slot] = []
        self._mask_variables: list[tuple[Any, ...]] = []  # per slot: one per plane
        self._maps: dict[str, FaultMap] = {}
        self._preset_maps: dict[str, FaultMap] | None = None
        self._resampled = False  # resample() was called: something steers the steps
        self._warned = False

    # ---- building -------------------------------------------------------------------------

    def use_maps(self, maps: dict[str, FaultMap]) -> None:
        """Build with these maps (by tensor name) instead of drawing them (``inject`` draws
        every layer's maps before cloning)."""
        self._preset_maps = maps

    def build(self, input_shape: Any = None) -> None:
        super().build(input_shape)
        output_shape = None
        if "activations" in self.spec.targets:
            output_shape = tuple(self.layer.compute_output_shape(input_shape))
        slots = layer_slots(self.layer, self.tensor_prefix, self.spec, output_shape)
        maps = self._preset_maps or draw_maps(slots, self.spec, self.step)
        masks = []
        fmt = self.spec.format
        planes = [p.name for p in fmt.planes] if is_block_format(fmt) else ["codes"]
        for slot in slots:
            variables = []
            short = slot.name[len(self.tensor_prefix) + 1:].replace(".", "_")
            for plane, mask in zip(planes, dense_masks(slot, maps[slot.name], self.spec.memory),
                                   strict=True):
                suffix = "" if plane == "codes" else f"_{plane}"
                var = self.add_weight(name=f"{short}{suffix}_fault_mask", shape=mask.shape,
                                      dtype=str(mask.dtype), initializer="zeros",
                                      trainable=False, autocast=False)
                var.assign(mask)
                variables.append(var)
            masks.append(tuple(variables))
        self._slots, self._mask_variables = slots, masks
        self._maps = {s.name: maps[s.name] for s in slots}
        self._preset_maps = None
        bounds = storable_range(self.spec.format)
        for slot in slots if bounds is not None else ():
            if slot.variable is not None and slot.variable.trainable:
                slot.variable.constraint = keep_storable(slot.variable.constraint, bounds)

    def compute_output_shape(self, input_shape: Any) -> Any:
        return self.layer.compute_output_shape(input_shape)

    def compute_output_spec(self, *args: Any, **kwargs: Any) -> Any:
        """The inner layer's (MultiHeadAttention's takes the query and the value)."""
        return self.layer.compute_output_spec(*args, **kwargs)

    # ---- forward --------------------------------------------------------------------------

    def _fused_for(self, slots: list[Slot]) -> Any:
        axes = tuple(channel_axis(s, self.spec.format) for s in slots)
        return fused(self.spec.format, self.spec.fault, axes)

    def call(self, inputs: Any, *args: Any, training: Any = None, **kwargs: Any) -> Any:
        if training and self.spec.persistence == "transient" and not self._resampled:
            self._warn_fixed_map()
        pairs = [(s, m) for s, m in zip(self._slots, self._mask_variables, strict=True)]
        # buffers (moving statistics) are read in inference; training updates the clean ones
        params = [(s, m) for s, m in pairs if s.variable is not None
                  and not (training and s.target == "buffers")]
        if params:
            values, masks = _read(params, self.compute_dtype)
            values = [s.to_work(v) for (s, _), v in zip(params, values, strict=True)]
            slots = [s for s, _ in params]
            bounds = gradient_bounds(self.spec.format)
            checked = None if bounds is None else fused_checked(
                self.spec.format, self.spec.fault,
                tuple(channel_axis(s, self.spec.format) for s in slots), bounds)
            faulty = straight_through(self._fused_for(slots), values, masks,
                                      self.spec.gradient, bounds, checked)
            substitutes = [(s.variable, s.from_work(f))
                           for (s, _), f in zip(params, faulty, strict=True)]
            with _substituted(substitutes) as scope:
                given = dict(scope.state_mapping)
                outputs = self.layer(inputs, *args, **kwargs)
            for loss in scope.losses:
                self.add_loss(loss)
            for variable in self.layer.non_trainable_variables:  # moving statistics
                new = scope.state_mapping.get(id(variable))
                if new is not None and new is not given.get(id(variable)):
                    variable.assign(new)
        else:
            outputs = self.layer(inputs, *args, **kwargs)
        for slot, mask in pairs:
            if slot.variable is None:
                outputs = self._fault_outputs(slot, outputs, mask)
        return outputs

    def _fault_outputs(self, slot: Slot, outputs: Any, mask: Any) -> Any:
        x = tf.convert_to_tensor(outputs)
        if x.dtype != tf.float32:
            raise TypeError(f"activation faults on {slot.name!r} need float32 outputs, got "
                            f"{x.dtype.name} (mixed precision is supported for weights only)")
        return straight_through(self._fused_for([slot]), [x], [_mask_values(mask)],
                                self.spec.gradient, gradient_bounds(self.spec.format))[0]

    def _warn_fixed_map(self) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"FaultyLayer {self.name!r} has a transient spec but nothing resamples its "
                f"maps, so training uses the maps of step {self.step} throughout; pass "
                "callbacks=[bitfault.keras.ResampleFaults()] to fit (models from "
                "bitfault.keras.inject add it themselves) or call "
                "bitfault.keras.resample(model, step) before each step", UserWarning,
                stacklevel=2)

    # ---- maps -----------------------------------------------------------------------------

    @property
    def maps(self) -> dict[str, FaultMap]:
        """The fault map of each faulted tensor (PyTorch layout), by tensor name."""
        return dict(self._maps)

    @property
    def tensor_names(self) -> list[str]:
        """The names of the faulted tensors, e.g. ``["fc1.weight", "fc1.bias"]``."""
        return [s.name for s in self._slots]

    def faulty_weights(self) -> dict[str, Any]:
        """The faulty value of each faulted variable (Keras layout, NumPy) as calls use it now."""
        params = [(s, m) for s, m in zip(self._slots, self._mask_variables, strict=True)
                  if s.variable is not None]
        if not params:
            return {}
        values, masks = _read(params)
        values = [s.to_work(v) for (s, _), v in zip(params, values, strict=True)]
        out = self._fused_for([s for s, _ in params])(values, masks)
        return {s.name: keras.ops.convert_to_numpy(s.from_work(v))
                for (s, _), v in zip(params, out, strict=True)}

    def resample(self, step: int) -> None:
        """Use the transient maps of ``step``, drawn from (seed, tensor name, step)."""
        if self.spec.persistence != "transient":
            raise ValueError(f"resample(step) needs a spec with persistence='transient'; the maps "
                             f"of {self.name!r} are permanent")
        step = _check_step(step)
        self._resampled = True
        if self.built and step != self.step:
            maps = draw_maps(self._slots, self.spec, step)
            for slot, variables in zip(self._slots, self._mask_variables, strict=True):
                dense = dense_masks(slot, maps[slot.name], self.spec.memory)
                for var, mask in zip(variables, dense, strict=True):
                    # the TensorFlow variable itself: Keras's assign adds a copy and checks
                    var.value.assign(mask, read_value=False)
            self._maps = maps
        self.step = step

    def get_build_config(self) -> dict[str, Any]:
        """Also the inner layer's (MultiHeadAttention builds from several input shapes)."""
        return {**(super().get_build_config() or {}),
                "layer": self.layer.get_build_config()}

    def build_from_config(self, config: dict[str, Any]) -> None:
        if config.get("layer") and not self.layer.built:
            self.layer.build_from_config(config["layer"])
        super().build_from_config({k: v for k, v in config.items() if k != "layer"})

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "spec": self.spec.to_dict(),
                "tensor_prefix": self.tensor_prefix, "step": self.step}


def _faulty(layer_class: Any) -> Any:
    def make(*args: Any, spec: FaultSpec | dict[str, Any], tensor_prefix: str | None = None,
             **kwargs: Any) -> FaultyLayer:
        return FaultyLayer(layer_class(*args, **kwargs), spec, tensor_prefix=tensor_prefix)

    make.__name__ = make.__qualname__ = f"Faulty{layer_class.__name__}"
    make.__doc__ = (f"``FaultyLayer(keras.layers.{layer_class.__name__}(*args, **kwargs), spec)``"
                    f"; saved and reloaded as a FaultyLayer.")
    return make


FaultyDense = _faulty(keras.layers.Dense)
FaultyEinsumDense = _faulty(keras.layers.EinsumDense)
FaultyConv1D = _faulty(keras.layers.Conv1D)
FaultyConv2D = _faulty(keras.layers.Conv2D)
FaultyConv3D = _faulty(keras.layers.Conv3D)
FaultyEmbedding = _faulty(keras.layers.Embedding)

__all__ = ["FaultyConv1D", "FaultyConv2D", "FaultyConv3D", "FaultyDense", "FaultyEinsumDense",
           "FaultyEmbedding", "FaultyLayer", "KeepStorable", "as_spec", "keep_storable",
           "storable_range"]
