"""The Keras evaluator for campaigns: correct first, one forward pass per fault map.

Tensors are named and mapped in PyTorch layout, as everywhere in bitfault
(``"fc1.weight"`` is a Dense kernel transposed), so a campaign's chips are the same
in Keras and PyTorch. Each trial's faulty kernels are computed by the NumPy core
(``bitfault.inject``) on the clean kernels and written into a private clone of the
model; the caller's model is never touched. Imports keras.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import numpy as np

from bitfault.campaign.runner import digest_arrays, predicted_labels
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
        slots: dict[str, Slot] = {}
        for layer, path in walk_layers(self._model):
            if is_supported(layer) and (not callable(targets) or targets(layer, path)):
                for slot in plan_slots(layer, path, _WEIGHTS_ONLY, None):
                    slots[slot.name] = slot
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
            for name, slot in self._slots.items():
                clean = self._clean[name]
                fmap = maps.get(name) or FaultMap.empty(clean.shape, name)
                slot.variable.assign(slot.to_keras(inject(clean, spec.format, spec.fault,
                                                          fmap)))
            out.append(self._predict_labels())
        return out

    def _predict_labels(self) -> np.ndarray:
        preds = []
        for start in range(0, len(self.x), self.batch_size):
            preds.append(predicted_labels(np.asarray(
                self._model(self.x[start:start + self.batch_size], training=False))))
        return np.concatenate(preds)

    def model_digest(self) -> str:
        """The targets (names, clean values) and every weight of the model, in order."""
        weights = {f"weights[{i}]": w for i, w in enumerate(self._model.get_weights())}
        return digest_arrays({**self._clean, **weights})

    def data_digest(self) -> str:
        return digest_arrays({"x": self.x, "y": self.labels})


__all__ = ["KerasEvaluator"]
