"""The FaultyLayers of a model and their transient maps: ``faulty_layers``, ``fault_maps``,
``resample`` and ``ResampleFaults`` (new maps every batch, replayable from (seed, name, step))."""

from __future__ import annotations

from typing import Any

import keras

from bitfault.keras.layers import FaultyLayer
from bitfault.keras.targets import sublayers
from bitfault.maps import FaultMap


def faulty_layers(model: keras.Model) -> list[FaultyLayer]:
    """The FaultyLayers of a model (searched recursively, in order)."""
    found: list[FaultyLayer] = []

    def visit(layer: Any) -> None:
        for sub in sublayers(layer):
            if isinstance(sub, FaultyLayer):
                if sub not in found:
                    found.append(sub)
            else:
                visit(sub)

    visit(model)
    return found


def fault_maps(model: keras.Model) -> dict[str, FaultMap]:
    """The fault map of every faulted tensor of the model (PyTorch layout), by tensor name."""
    maps: dict[str, FaultMap] = {}
    for layer in faulty_layers(model):
        maps.update(layer.maps)
    return maps


def resample(model: keras.Model, step: int) -> None:
    """Use the transient maps of ``step`` in every transient FaultyLayer of the model."""
    layers = [la for la in faulty_layers(model) if la.spec.persistence == "transient"]
    if not layers:
        raise ValueError("resample(model, step) needs FaultyLayers with a transient spec; this "
                         "model has none (permanent maps never change)")
    for layer in layers:
        layer.resample(step)


class ResampleFaults(keras.callbacks.Callback):
    """Redraw the maps of every transient FaultyLayer of the model before each batch.

    resample="step" specs take the optimizer's iteration count as the step, so a
    run replays exactly and a second ``fit`` continues where the first stopped.
    resample="forward" specs count every batch (train, test and predict) from
    ``first_step``. Permanent specs are left alone. With ``steps_per_execution``
    above 1, Keras calls this once per execution, so maps change per execution.
    """

    def __init__(self, first_step: int = 0) -> None:
        super().__init__()
        if isinstance(first_step, bool) or not isinstance(first_step, int) or first_step < 0:
            raise ValueError(f"first_step must be a non-negative integer, got {first_step!r}")
        self.forward_step = first_step

    def _resample(self, training: bool) -> None:
        step_of_optimizer = None
        for layer in faulty_layers(self.model):
            if layer.spec.persistence != "transient":
                continue
            if layer.spec.resample == "forward":
                layer.resample(self.forward_step)
            elif training:
                if step_of_optimizer is None:
                    step_of_optimizer = int(self.model.optimizer.iterations.numpy())
                layer.resample(step_of_optimizer)
        self.forward_step += 1

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._resample(training=True)

    def on_test_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._resample(training=False)

    def on_predict_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._resample(training=False)





class _ResamplesItself:
    """fit, evaluate and predict add the model's own ``ResampleFaults`` (one per model, so
    forward counts carry on across calls) unless the call passes one."""

    def _with_resampling(self, callbacks: Any) -> Any:
        mine = getattr(self, "_resample_faults", None)
        if mine is None:
            mine = ResampleFaults()
            self._resample_faults = mine
        if isinstance(callbacks, keras.callbacks.CallbackList):
            if not any(isinstance(c, ResampleFaults) for c in callbacks.callbacks):
                mine.set_model(self)
                callbacks.callbacks.append(mine)
            return callbacks
        callbacks = list(callbacks or [])
        if not any(isinstance(c, ResampleFaults) for c in callbacks):
            callbacks.append(mine)
        return callbacks

    def fit(self, *args: Any, callbacks: Any = None, **kwargs: Any) -> Any:
        return super().fit(*args, callbacks=self._with_resampling(callbacks), **kwargs)

    def evaluate(self, *args: Any, callbacks: Any = None, **kwargs: Any) -> Any:
        return super().evaluate(*args, callbacks=self._with_resampling(callbacks), **kwargs)

    def predict(self, *args: Any, callbacks: Any = None, **kwargs: Any) -> Any:
        return super().predict(*args, callbacks=self._with_resampling(callbacks), **kwargs)


@keras.saving.register_keras_serializable(package="bitfault")
class ResamplingModel(_ResamplesItself, keras.Model):
    """A functional model whose transient fault maps change every batch by themselves
    (``inject`` returns one for a transient spec)."""


@keras.saving.register_keras_serializable(package="bitfault")
class ResamplingSequential(_ResamplesItself, keras.Sequential):
    """A Sequential model whose transient fault maps change every batch by themselves."""


def resampling(model: keras.Model) -> keras.Model:
    """The same graph of the same layers as a model that resamples its transient maps in
    every fit, evaluate and predict."""
    if isinstance(model, keras.Sequential):
        config = model.get_config()
        first = (config["layers"] or [{}])[0]
        head = []
        if first.get("class_name") == "InputLayer":
            given = first["config"]
            head = [keras.Input(batch_shape=given["batch_shape"], dtype=given["dtype"],
                                sparse=given["sparse"], name=given["name"])]
        again = ResamplingSequential(head + model.layers, name=model.name,
                                     trainable=model.trainable)
        if not head and config.get("build_input_shape") is not None:
            again.build(config["build_input_shape"])
        return again
    return ResamplingModel(inputs=model.input, outputs=model.output, name=model.name,
                           trainable=model.trainable)


__all__ = ["ResampleFaults", "ResamplingModel", "ResamplingSequential", "fault_maps",
           "faulty_layers", "resample", "resampling"]
