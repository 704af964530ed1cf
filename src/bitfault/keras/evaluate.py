"""KerasEvaluator: the ``Evaluator`` of campaigns for a Keras model, one forward pass per map.

Tensors are named and mapped in PyTorch layout, as everywhere in bitfault
(``"fc1.weight"`` is a Dense kernel transposed), so a campaign's chips are the same
in Keras and PyTorch. Each trial's faulty kernels are computed by the NumPy core and
run through a private clone of the model; the caller's model is never touched. What
does not change between trials is computed once: each kernel stored in the format
(its words, its calibration, its fault-free values in Keras layout), so a map costs
its faulty elements alone (``seam.faulty_elements``: the same bits as
``bitfault.inject``), patched into a Keras-layout copy whose previous map's elements
are put back; and the forward pass, traced once with ``tf.function``, takes the
kernels as arguments (substituted for the variables, nothing assigned). On other
backends a variable is assigned when its value changes. Imports keras.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import keras
import numpy as np

from bitfault.campaign.evaluator import (
    BoundedCache,
    GoldenRuns,
    check_max_bytes,
    digest_arrays,
    memory_key,
    predicted_labels,
)
from bitfault.keras.layouts import Slot
from bitfault.keras.seam import faulty_elements, stored
from bitfault.keras.targets import select_report, select_tensors, walk_layers
from bitfault.maps import FaultMap
from bitfault.memory.memory import Memory, StoredArray


class KerasEvaluator:
    """Evaluate a Keras model under fault maps (the ``Evaluator`` protocol of ``run``).

    ``targets``: what ``bitfault.Targets.coerce`` takes, of kind "weights" (default: the
    kernel of every Dense, EinsumDense, ConvND and Embedding layer; a list of tensor names
    such as ``"<layer>.weight"``, kept in its order), chosen by ``select_tensors`` as
    ``inject`` chooses them; ``filter_fn(layer, path) -> bool`` (or globs on layer paths)
    chooses layers. With ``fast_paths`` (TensorFlow
    backend, a functional or Sequential model) the golden run is computed once, and a
    trial whose faults sit in one layer's kernel runs the model from that layer on, from
    the cached fault-free activations at its input (the same operations on the same
    values: the tests compare with whole-model runs bit for bit); ``max_bytes`` bounds
    the cached activations.
    """

    def __init__(self, model: keras.Model, x: Any, y: Any,
                 targets: Any = "weights", filter_fn: Any = None,
                 batch_size: int = 1000, fast_paths: bool = True,
                 max_bytes: int = 256 << 20) -> None:
        self.x = np.asarray(x)
        self.labels = np.asarray(y)
        if len(self.x) != len(self.labels):
            raise ValueError(f"x and y must have the same length, got {len(self.x)} and "
                             f"{len(self.labels)}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = batch_size
        self.max_bytes = check_max_bytes(max_bytes)
        self._model = keras.models.clone_model(model)
        self._model.set_weights(model.get_weights())
        chosen, self.left_out = select_report(self._model, targets, filter_fn,
                                              kinds=("weights",))
        slots = {s.name: s for s in chosen}  # left_out: the variables not faulted, and why
        if not slots:
            raise ValueError(f"targets chose no tensor (left out: "
                             f"{[(t.name, t.reason) for t in self.left_out][:8]})")
        self._slots = slots
        self._clean = {n: s.to_torch(np.asarray(s.variable)) for n, s in slots.items()}
        self._memories: dict[tuple[str, str], dict[str, _Memory]] = {}
        self._holds: dict[str, Any] = {}  # (backends but TensorFlow) what each variable holds
        self.fast_paths = bool(fast_paths)
        self._on_tf = keras.backend.backend() == "tensorflow"  # fixed for the process
        self._forward: Any = None
        self._batches: list[Any] | None = None
        self._tails: dict[str, Any] = {}  # name -> traced run from its layer on (None: none)
        self._inputs = _input_cache(self.max_bytes)  # fault-free activations at their inputs
        self._golden = GoldenRuns()

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: tuple(a.shape) for n, a in self._clean.items()}

    def clean_tensor(self, name: str) -> np.ndarray:
        """The clean values of tensor ``name`` (PyTorch layout): what a data-dependent
        memory's maps are drawn with."""
        return np.asarray(self._clean[name])

    def predict(self, batch_of_maps: Sequence[Mapping[str, FaultMap]],
                memory: Memory) -> list[np.ndarray]:
        out = []
        for maps in batch_of_maps:
            unknown = sorted(set(maps) - set(self._slots))
            if unknown:
                raise ValueError(f"fault maps name unknown tensor(s) {unknown}; this "
                                 f"evaluator's tensors are {sorted(self._slots)}")
            key, memories = self._memories_for(memory)
            kernels, faulty = [], []
            for name, slot in self._slots.items():
                kernel, fmap = memories[name], maps.get(name)
                idx, values = (None, None) if fmap is None else \
                    faulty_elements(kernel.stored, memory.fault, fmap)
                if idx is not None and idx.size:
                    kernels.append(kernel.patched(slot.keras_indices(idx), values))
                    faulty.append(name)
                else:
                    kernels.append(kernel)
            out.append(self._predict_fast(key, kernels, faulty) if self._fast() else
                       self._predict_labels(kernels))
        return out

    def _fast(self) -> bool:
        return self.fast_paths and self._on_tf

    def _predict_fast(self, key: tuple[str, str], kernels: list[Any],
                      faulty: list[str]) -> np.ndarray:
        """The golden run once; faults in one layer from that layer on; else the whole model."""
        if not faulty:
            return self._golden.get(key, lambda: self._predict_labels(kernels))
        if len(faulty) == 1 and (tail := self._tail(faulty[0])) is not None:
            name, values = faulty[0], self._values(kernels)
            inputs = self._inputs.get((key, name), lambda: [tail[0](b, values)
                                                            for b in self._batches])
            if inputs is not None:
                return _labels([tail[1](h, values) for h in inputs])
        return self._predict_labels(kernels)

    def _tail(self, name: str) -> tuple[Any, Any] | None:
        """Traced (head, tail) of the model split at the input of ``name``'s layer; None
        where the model is not a graph of layers that splits there."""
        if name not in self._tails:
            self._tails[name] = None
            if self._forward is None:
                self._trace()
            path = name.rsplit(".", 1)[0]
            layer = next((la for la, p in walk_layers(self._model) if p == path), None)
            try:
                if any(layer.input is i for i in self._model.inputs):
                    return None  # nothing before it to reuse
                head = keras.Model(self._model.inputs, layer.input)
                tail = keras.Model(layer.input, self._model.outputs)
            except Exception:  # nested, shared or subclassed: the whole model runs
                return None
            self._tails[name] = (self._traced(head), self._traced(tail))
        return self._tails[name]

    def _values(self, kernels: list[Any]) -> list[Any]:
        return [k.tensor() if isinstance(k, _Memory) else k for k in kernels]

    def _traced(self, model: keras.Model) -> Any:
        """``model`` traced once with ``tf.function``, the targets' kernels as arguments
        (substituted for the variables in a StatelessScope: nothing is assigned)."""
        import tensorflow as tf

        variables = [slot.variable for slot in self._slots.values()]

        def forward(x: Any, kernels: list[Any]) -> Any:
            with keras.StatelessScope(list(zip(variables, kernels, strict=True))):
                out = model(x, training=False)
            return out[0] if isinstance(out, (list, tuple)) and len(out) == 1 else out

        return tf.function(forward, reduce_retracing=True)

    def __getstate__(self) -> dict[str, Any]:
        """Pickling (Ray): the model travels (as Keras pickles it); the slots are found
        again in the copy, and the traced forward pass is rebuilt there."""
        state = dict(self.__dict__)
        state.update(_slots=list(self._slots), _forward=None, _batches=None, _holds={},
                     _memories={}, _tails={}, _inputs=_input_cache(self.max_bytes),
                     _golden=GoldenRuns())
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        names = state["_slots"]
        self.__dict__.update(state)
        found = {s.name: s for s in select_tensors(self._model)}
        self._slots = {n: found[n] for n in names}

    def _memories_for(self, memory: Memory) -> tuple[tuple[str, str], dict[str, _Memory]]:
        """Every target stored in the format (computed once per format and fault model)."""
        key = memory_key(memory)
        if key not in self._memories:
            self._memories[key] = {n: _Memory(stored(c, memory.format), self._slots[n])
                                   for n, c in self._clean.items()}
        return key, self._memories[key]

    def _predict_labels(self, kernels: list[Any]) -> np.ndarray:
        """Predictions with each target's kernel given as a Keras-layout array, or as a
        ``_Memory`` (its fault-free values). On TensorFlow the traced forward pass takes
        the kernels as arguments (the variables' values are substituted, nothing is
        assigned: an eager assign costs ~0.2 ms per variable); elsewhere a variable is
        assigned when its value changes."""
        if self._forward is None:
            self._trace()
        if self._on_tf:
            values = self._values(kernels)
            logits = [self._forward(b, values) for b in self._batches]
        else:
            for (name, slot), k in zip(self._slots.items(), kernels, strict=True):
                if isinstance(k, np.ndarray) or self._holds.get(name) is not k:
                    slot.variable.assign(k if isinstance(k, np.ndarray) else k.keras_values)
                    self._holds[name] = None if isinstance(k, np.ndarray) else k
            logits = [self._forward(b) for b in self._batches]
        return _labels(logits)

    def _trace(self) -> None:
        model = self._model
        batches = [self.x[i:i + self.batch_size] for i in range(0, len(self.x), self.batch_size)]
        if not self._on_tf:
            self._forward = lambda x: model(x, training=False)
            self._batches = batches
            return
        import tensorflow as tf

        self._forward = self._traced(model)
        self._batches = [tf.constant(b) for b in batches]

    def model_digest(self) -> str:
        """The targets (names, clean values) and every weight of the model, in order."""
        weights = {f"weights[{i}]": w for i, w in enumerate(self._model.get_weights())}
        return digest_arrays({**self._clean, **weights})

    def data_digest(self) -> str:
        return digest_arrays({"x": self.x, "y": self.labels})


def _input_cache(max_bytes: int) -> BoundedCache[list[Any]]:
    """The fault-free activations at a layer's input, per batch, within ``max_bytes``."""
    return BoundedCache(max_bytes, _nbytes)


def _nbytes(tensors: list[Any]) -> int:
    return sum(h.shape.num_elements() * h.dtype.size for h in tensors)


def _labels(logits: list[Any]) -> np.ndarray:
    """Predicted labels of the batches' logits, in order."""
    return np.concatenate([predicted_labels(np.asarray(z)) for z in logits])


class _Memory:
    """One target stored in a format: the StoredArray (PyTorch layout), its fault-free values
    in Keras layout, and a Keras-layout copy holding them except at the elements the last
    map faulted (put back before the next map's are written)."""

    def __init__(self, stored: StoredArray, slot: Slot) -> None:
        self.stored = stored
        self.keras_values = slot.to_keras(stored.values.reshape(stored.shape))
        self._faulty = self.keras_values.copy()
        self._changed = np.zeros(0, np.int64)
        self._tensor: Any = None

    def tensor(self) -> Any:
        """The fault-free values as a TensorFlow constant (made once)."""
        if self._tensor is None:
            import tensorflow as tf

            self._tensor = tf.constant(self.keras_values)
        return self._tensor

    def patched(self, keras_index: np.ndarray, values: np.ndarray) -> np.ndarray:
        """The fault-free values with ``values`` at the flat Keras-layout ``keras_index``."""
        flat, clean = self._faulty.reshape(-1), self.keras_values.reshape(-1)
        flat[self._changed] = clean[self._changed]
        flat[keras_index] = values
        self._changed = keras_index
        return self._faulty


__all__ = ["KerasEvaluator"]
