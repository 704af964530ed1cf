"""ResampleFaults: new transient fault maps every batch, replayable from (seed, name, step)."""

from __future__ import annotations

from typing import Any

import keras

from bitfault.keras.inject import faulty_layers


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


__all__ = ["ResampleFaults"]
