"""Keras transient maps: ``resample`` vs the way it worked before session 5, in one process.

The baseline builds each mask as before: the PyTorch-layout dense mask of the map restricted
to the eligible bits, transposed to Keras layout, assigned through Keras's ``assign``. The
new ``FaultyLayer.resample`` writes the dense mask straight in Keras layout and assigns the
TensorFlow variable. Both draw the same maps; the masks are asserted equal. Timed: resample
alone, and resample + one training step of the MLP 784-256-256-10 (batch 100, SGD,
``tf.function``), alternating rounds, medians of per-round ratios.

    python benchmarks/bench_keras_resample.py          # about a minute
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf
from bench_keras_fat import mlp, trainer

import bitfault as bf
from bitfault.keras import FaultyLayer, inject
from bitfault.keras.layouts import draw_maps


def old_resample(layer: FaultyLayer, step: int) -> None:
    maps = draw_maps(layer._slots, layer.spec, step)
    eligible = layer.spec.fault.eligible_mask(layer.spec.format)
    for slot, variables in zip(layer._slots, layer._mask_variables, strict=True):
        dense = maps[slot.name].restricted(eligible).to_dense(layer.spec.format.container)
        variables[0].assign(slot.to_keras(dense))  # the codes plane's mask
    layer._maps = maps
    layer.step = step


def new_resample(layer: FaultyLayer, step: int) -> None:
    layer.resample(step)


def main() -> None:
    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((100, 784), dtype=np.float32))
    y = tf.constant(rng.integers(0, 10, 100))
    keras.utils.set_random_seed(0)
    spec = bf.FaultSpec(format=bf.FixedPoint(32, 28, rounding="trunc"), ber=1e-3,
                        persistence="transient")
    model = inject(mlp(), spec)
    layers = [la for la in model.layers if isinstance(la, FaultyLayer)]
    train_step = trainer(model, x, y, jit=False)
    step_no = [0]

    def masks() -> list[np.ndarray]:
        return [np.asarray(v) for la in layers for v in la._mask_variables]

    for fn in (old_resample, new_resample):  # same maps, same masks
        for la in layers:
            fn(la, 10**6 + (fn is new_resample))
    for la in layers:
        old_resample(la, 7)
    a = masks()
    for la in layers:
        new_resample(la, 8)
        new_resample(la, 7)
    assert all(np.array_equal(p, q) for p, q in zip(a, masks(), strict=True))

    def rounds(with_step: bool, n: int = 30) -> dict:
        def run(fn) -> float:
            t = time.perf_counter()
            for _ in range(n):
                step_no[0] += 1
                for la in layers:
                    fn(la, step_no[0])
                if with_step:
                    train_step()
            train_step().numpy()
            return (time.perf_counter() - t) / n

        ratios, new_ms, old_ms = [], [], []
        for r in range(11):
            order = (new_resample, old_resample) if r % 2 else (old_resample, new_resample)
            times = {fn: run(fn) for fn in order}
            ratios.append(times[new_resample] / times[old_resample])
            new_ms.append(times[new_resample] * 1e3)
            old_ms.append(times[old_resample] * 1e3)
        return {"ratio": statistics.median(ratios), "new": statistics.median(new_ms),
                "old": statistics.median(old_ms)}

    for label, with_step in (("resample + training step", True), ("resample alone", False)):
        res = rounds(with_step)
        print(f"{label}: new / old = {res['ratio']:.2f} ({res['new']:.2f} ms vs "
              f"{res['old']:.2f} ms, medians; identical masks)")


if __name__ == "__main__":
    main()
