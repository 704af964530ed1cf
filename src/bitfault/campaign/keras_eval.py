"""The Keras evaluator for campaigns: one forward pass per fault map.

Tensors are named and mapped in PyTorch layout, as everywhere in bitfault
(``"fc1.weight"`` is a Dense kernel transposed), so a campaign's chips are the same
in Keras and PyTorch. Each trial's faulty kernels are computed by the NumPy core
(``bitfault.inject``) and written into a private clone of the model; the caller's
model is never touched. What does not change between trials is computed once:
each kernel stored in the format without faults (FixedPoint and Float maps then
recompute only their faulty elements: those formats store each element on its
own), and the forward pass is traced once (``tf.function`` on the TensorFlow
backend). A variable is written only when its value changes. Imports keras.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import numpy as np

from bitfault.campaign.runner import (
    digest_arrays,
    gathered_map,
    patch_faulty_elements,
    predicted_labels,
)
from bitfault.inject import inject
from bitfault.keras.inject import walk_layers
from bitfault.keras.layouts import Slot, is_supported, plan_slots
from bitfault.maps import FaultMap
from bitfault.spec import FaultSpec

_WEIGHTS_ONLY = FaultSpec(ber=0.0)


class KerasEvaluator:
    """Evaluate a Keras model under fault maps (the ``Evaluator`` protocol of ``run``).

    ``targets``: None (the kernel of every Dense, EinsumDense, ConvND and Embedding
    layer), a list of tensor names (``"<layer>.weight"``), or
    ``filter(layer, path) -> bool`` choosing layers.
    """

    def __init__(self, model: keras.Model, x: Any, y: Any,
                 targets: Sequence[str] | Callable[[Any, str], bool] | None = None,
                 batch_size: int = 1000) -> None:
        self.x = np.asarray(x)
        self.labels = np.asarray(y)
        if len(self.x) != len(self.labels):
            raise ValueError(f"x and y must have the same length, got {len(self.x)} and "
                             f"{len(self.labels)}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = batch_size
        self._model = keras.models.clone_model(model)
        self._model.set_weights(model.get_weights())
        slots = _slots_of(self._model, targets if callable(targets) else None)
        if isinstance(targets, Sequence) and not isinstance(targets, str):
            unknown = sorted(set(targets) - set(slots))
            if unknown:
                raise ValueError(f"targets name unknown tensor(s) {unknown}; this model's "
                                 f"tensors are {sorted(slots)}")
            slots = {n: slots[n] for n in targets}
        if not slots:
            raise ValueError("targets chose no tensor: the model has no Dense, EinsumDense, "
                             "ConvND or Embedding layer (or the filter matched none)")
        self._slots = slots
        self._clean = {n: s.to_torch(np.asarray(s.variable)) for n, s in slots.items()}
        self._stored_cache: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        self._holds: dict[str, np.ndarray | None] = {}  # what each variable holds now
        self._forward: Any = None
        self._batches: list[Any] | None = None

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: tuple(a.shape) for n, a in self._clean.items()}

    def predict(self, batch_of_maps: Sequence[Mapping[str, FaultMap]],
                spec: FaultSpec) -> list[np.ndarray]:
        out = []
        for maps in batch_of_maps:
            unknown = sorted(set(maps) - set(self._slots))
            if unknown:
                raise ValueError(f"fault maps name unknown tensor(s) {unknown}; this "
                                 f"evaluator's tensors are {sorted(self._slots)}")
            stored = self._stored(spec)
            for name, slot in self._slots.items():
                fmap = maps.get(name)
                value = stored[name] if fmap is None or not fmap.indices.size else \
                    self._faulty(name, fmap, spec)
                if self._holds.get(name) is not value:  # a fresh faulty value, or back
                    slot.variable.assign(slot.to_keras(value))
                    self._holds[name] = value
            out.append(self._predict_labels())
        return out

    def __getstate__(self) -> dict[str, Any]:
        """Pickling (Ray): the model travels (as Keras pickles it); the slots are found
        again in the copy, and the traced forward pass is rebuilt there."""
        state = dict(self.__dict__)
        state.update(_slots=list(self._slots), _forward=None, _batches=None, _holds={})
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        names = state["_slots"]
        self.__dict__.update(state)
        found = _slots_of(self._model, None)
        self._slots = {n: found[n] for n in names}

    def _stored(self, spec: FaultSpec) -> dict[str, np.ndarray]:
        """Every target stored in the format, no fault (computed once per format and fault)."""
        key = (repr(spec.format), repr(spec.fault))
        if key not in self._stored_cache:
            self._stored_cache[key] = {
                n: inject(c, spec.format, spec.fault, FaultMap.empty(c.shape, n))
                for n, c in self._clean.items()}
        return self._stored_cache[key]

    def _faulty(self, name: str, fmap: FaultMap, spec: FaultSpec) -> np.ndarray:
        """The tensor under ``fmap``: for a sparse map in a format that stores each element
        on its own, the stored tensor with only the faulty elements recomputed (the same
        bits as injecting the whole tensor)."""
        clean = self._clean[name]
        if not patch_faulty_elements(spec.format, fmap):
            return inject(clean, spec.format, spec.fault, fmap)
        out = self._stored(spec)[name].copy()
        out.reshape(-1)[fmap.indices] = inject(clean.reshape(-1)[fmap.indices], spec.format,
                                               spec.fault, gathered_map(fmap))
        return out

    def _predict_labels(self) -> np.ndarray:
        if self._forward is None:
            model = self._model
            if keras.backend.backend() == "tensorflow":  # trace once: no per-call Python
                import tensorflow as tf

                self._forward = tf.function(lambda x: model(x, training=False),
                                            reduce_retracing=True)
                self._batches = [tf.constant(self.x[i:i + self.batch_size])
                                 for i in range(0, len(self.x), self.batch_size)]
            else:
                self._forward = lambda x: model(x, training=False)
                self._batches = [self.x[i:i + self.batch_size]
                                 for i in range(0, len(self.x), self.batch_size)]
        return np.concatenate([predicted_labels(np.asarray(self._forward(b)))
                               for b in self._batches])

    def model_digest(self) -> str:
        """The targets (names, clean values) and every weight of the model, in order."""
        weights = {f"weights[{i}]": w for i, w in enumerate(self._model.get_weights())}
        return digest_arrays({**self._clean, **weights})

    def data_digest(self) -> str:
        return digest_arrays({"x": self.x, "y": self.labels})


def _slots_of(model: keras.Model, accept: Callable[[Any, str], bool] | None) -> dict[str, Slot]:
    """The kernel slot of every supported layer of ``model`` (that ``accept`` chooses)."""
    slots: dict[str, Slot] = {}
    for layer, path in walk_layers(model):
        if is_supported(layer) and (accept is None or accept(layer, path)):
            for slot in plan_slots(layer, path, _WEIGHTS_ONLY, None):
                slots[slot.name] = slot
    return slots


__all__ = ["KerasEvaluator"]
