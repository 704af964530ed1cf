"""Keras campaign speed: a rate sweep with KerasEvaluator vs the same number of clean
inferences, in one process (alternating, medians of each repeat's own ratio).

Model: the seed MLP 784-256-256-10 (Keras), 1,000 embedded-MNIST test inputs,
FixedPoint(32, 28, trunc) and IntQuant(8) at ber 1e-3. The clean baseline is the
model's forward pass traced once with ``tf.function`` on the same 1,000 inputs
(a constant tensor), arg-maxed, once per chip. Every run draws new chips; a one-chip
campaign splits the time into a fixed part (model clone, digests, golden run, store)
and a part per chip. Then layer sweeps (faults in one kernel at a time, 40 chips per
layer) with the evaluator's fast paths on and off, alternating, identical results
asserted, for the MLP and the small CNN.

    python benchmarks/bench_keras_campaign.py            # about 3 minutes
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import bitfault as bf
from bitfault.campaign import layer_sweep, rate_sweep, run
from bitfault.data import split_embedded_mnist
from bitfault.keras import KerasEvaluator
from bitfault.models.keras import seed_mlp, small_cnn

TMP = Path(tempfile.mkdtemp(prefix="bench_keras_campaign_"))


def campaign(model, x, y, trials, memory, store, fast_paths: bool = True) -> float:
    return timed_campaign(model, x, y, trials, memory, store, fast_paths)[0]


def timed_campaign(model, x, y, trials, memory, store, fast_paths: bool) -> tuple[float, list]:
    t = time.perf_counter()
    result = run(KerasEvaluator(model, x, y, fast_paths=fast_paths), trials, memory, store)
    dt = time.perf_counter() - t
    return dt, sorted((r.trial_key, r.metrics["correct"]) for r in result.records)


def layer_sweep_bench(label: str, model, x, y, chips: int, repeats: int) -> None:
    """Fast paths (the model run from the faulty layer on) vs the whole model per trial."""
    memory = bf.Memory(bf.FixedPoint(32, 28, rounding="trunc"), bf.BitFlip())
    names = list(KerasEvaluator(model, x[:1], y[:1]).tensor_shapes())
    ratios = []
    for r in range(repeats + 1):  # the first pair warms up and is not counted
        trials = layer_sweep([1e-3], chips, names, 20_000 * r)
        runs = {}
        for fast in ((True, False) if r % 2 else (False, True)):
            runs[fast] = timed_campaign(model, x, y, trials, memory,
                                        TMP / f"layers-{label}-{r}-{fast}.db", fast)
        assert runs[True][1] == runs[False][1], "fast paths changed a result"
        if r:
            ratios.append(runs[True][0] / runs[False][0])
    print(f"{label}: layer sweep, {chips} chips x {len(names)} layers: fast paths / whole "
          f"model = {statistics.median(ratios):.2f} (repeats {min(ratios):.2f}-"
          f"{max(ratios):.2f}), identical results")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chips", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    (x_train, y_train), (x, y) = split_embedded_mnist()
    x, y = x[:1000], y[:1000]
    keras.utils.set_random_seed(0)
    model = seed_mlp(hidden=256, seed=0)
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    model.fit(x_train, y_train, epochs=1, batch_size=100, verbose=0)
    forward = tf.function(lambda a: model(a, training=False))
    xt = tf.constant(x)

    def clean() -> float:
        t = time.perf_counter()
        for _ in range(args.chips):
            np.argmax(np.asarray(forward(xt)), axis=1)
        return time.perf_counter() - t

    clean()
    print(f"tensorflow {tf.__version__}, keras {keras.__version__}; {args.chips} chips on "
          f"{len(x)} inputs, ber 1e-3; ratio = campaign time / {args.chips} clean inferences")
    for fmt in (bf.FixedPoint(32, 28, rounding="trunc"), bf.IntQuant(8)):
        memory = bf.Memory(fmt, bf.BitFlip())
        ratios, per_chip, fixed, inference = [], [], [], []
        for r in range(args.repeats):
            trials = rate_sweep([1e-3], args.chips, 10_000 * r)  # new chips every run
            store = TMP / f"{type(fmt).__name__}{r}.db"
            if r % 2:
                k, c = clean(), campaign(model, x, y, trials, memory, store)
            else:
                c, k = campaign(model, x, y, trials, memory, store), clean()
            one = campaign(model, x, y, rate_sweep([1e-3], 1, 10_000 * r + 5_000), memory,
                           TMP / f"{type(fmt).__name__}{r}.one.db")
            ratios.append(c / k)
            per_chip.append((c - one) / (args.chips - 1))
            fixed.append(one - per_chip[-1])
            inference.append(k / args.chips)
        med = statistics.median
        print(f"{type(fmt).__name__:10}: campaign / clean = {med(ratios):.2f} (repeats "
              f"{min(ratios):.2f}-{max(ratios):.2f}); per chip {med(per_chip) * 1e3:.1f} ms vs "
              f"{med(inference) * 1e3:.1f} ms for a clean inference, fixed "
              f"{med(fixed) * 1e3:.0f} ms")
    layer_sweep_bench("MLP", model, x, y, chips=40, repeats=3)
    keras.utils.set_random_seed(0)
    layer_sweep_bench("CNN", small_cnn(), x, y, chips=40, repeats=3)


if __name__ == "__main__":
    main()
