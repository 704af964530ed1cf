"""Fault-aware Keras training step vs a clean step, in one process.

Models: an MLP 784-256-256-10 and a small CNN (two 3x3 convs + linear) on
28x28 inputs, batch 100, SGD, a GradientTape step inside ``tf.function``, with
and without ``jit_compile=True``. For FixedPoint(32, 28, trunc) and IntQuant(8)
at ber 1e-3, four fault-aware variants are timed against the clean model:
``bitfault.keras.inject`` with a permanent map (the optimizer applies the
constraint that keeps the clean weights storable), the same trained by Keras's
own ``fit`` step (``compile`` + ``train_on_batch``, against the clean model's),
the same with transient maps drawn every step (``resample`` before each step, as
``ResampleFaults`` does), and the seed's own transform written inline (encode,
XOR, decode as separate ops, ``w + tf.stop_gradient(faulty - w)``). Runs
alternate clean/variant in rounds; a ratio is the median over rounds of
(variant time / clean time). ``--clock cpu`` times the process's CPU time
instead of the wall clock: steadier on a machine other jobs share.

    python benchmarks/bench_keras_fat.py            # full run, about 3-4 minutes
    python benchmarks/bench_keras_fat.py --models mlp --variants permanent fit
    python benchmarks/bench_keras_fat.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Iterator

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import bitfault as bf
from bitfault.keras import inject, resample

BATCH = 100
BER = 1e-3
CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter
VARIANTS = ("permanent", "fit", "transient", "seed")


def mlp() -> keras.Model:
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(256, activation="relu"),
                             keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])


def cnn() -> keras.Model:
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(10)])


def clone(model: keras.Model) -> keras.Model:
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


class SeedTransform:
    """The seed's transform written inline on every kernel: separate TF ops, a dense mask."""

    def __init__(self, model: keras.Model, fmt: bf.FixedPoint | bf.IntQuant) -> None:
        self.model, self.fmt, self.kernels = model, fmt, []
        for layer in model.layers:
            if isinstance(layer, (keras.layers.Dense, keras.layers.Conv2D)):
                k = layer.kernel
                perm = (1, 0) if len(k.shape) == 2 else (2, 3, 1, 0)
                torch_shape = tuple(k.shape[i] for i in np.argsort(perm))
                fmap = bf.FaultMap.random(torch_shape, fmt, ber=BER, seed=0,
                                          name=f"{layer.name}.weight")
                dtype = np.int32 if fmt.bits == 32 else np.int8
                mask = np.transpose(fmap.to_dense(np.int32), perm).astype(dtype)
                self.kernels.append((k, tf.constant(mask)))

    def faulty(self, w: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        if isinstance(self.fmt, bf.FixedPoint):
            words = tf.cast(w * 2.0**self.fmt.frac, tf.int32)
            return tf.cast(tf.bitwise.bitwise_xor(words, mask), tf.float32) * 2.0**-self.fmt.frac
        scale = tf.reduce_max(tf.abs(w)) / 127.0
        words = tf.cast(tf.clip_by_value(tf.round(w / scale), -127.0, 127.0), tf.int8)
        return tf.cast(tf.bitwise.bitwise_xor(words, mask), tf.float32) * scale

    def __call__(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        pairs = []
        for k, mask in self.kernels:
            w = tf.convert_to_tensor(k)
            pairs.append((k, w + tf.stop_gradient(self.faulty(w, mask) - w)))
        with keras.StatelessScope(pairs):
            return self.model(x, training=training)

    @property
    def trainable_variables(self) -> list:
        return self.model.trainable_variables


def trainer(model, x: tf.Tensor, y: tf.Tensor, jit: bool):
    optimizer = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    variables = model.trainable_variables

    @tf.function(jit_compile=jit)
    def step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return loss

    return step


def fit_trainer(model: keras.Model, x: tf.Tensor, y: tf.Tensor, jit: bool):
    """Keras's own training step: ``compile`` (SGD) then ``train_on_batch``, as ``fit`` runs."""
    model.compile(keras.optimizers.SGD(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=jit)

    def run() -> tf.Tensor:
        return tf.constant(model.train_on_batch(x, y))

    return run


def transient_trainer(fmodel: keras.Model, x: tf.Tensor, y: tf.Tensor, jit: bool):
    step, counter = trainer(fmodel, x, y, jit), [0]

    def run() -> tf.Tensor:
        counter[0] += 1
        resample(fmodel, counter[0])
        return step()

    return run


def ratio(clean_step, step, rounds: int, per_round: int) -> tuple[float, float, float]:
    """Median over rounds of variant/clean time; also the median step times (ms)."""
    for _ in range(3):
        clean_step().numpy()
        step().numpy()
    ratios, tc, tv = [], [], []
    for r in range(rounds):
        order = (clean_step, step) if r % 2 == 0 else (step, clean_step)
        times = {}
        for fn in order:
            t0 = clock()
            for _ in range(per_round):
                loss = fn()
            loss.numpy()
            times[fn] = (clock() - t0) / per_round
        ratios.append(times[step] / times[clean_step])
        tc.append(times[clean_step])
        tv.append(times[step])
    return statistics.median(ratios), statistics.median(tc) * 1e3, statistics.median(tv) * 1e3


def arguments(doc: str, rounds: int = 15) -> argparse.ArgumentParser:
    """The options every Keras training-step benchmark takes (a caller may add more)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="TF intra-op threads (default 2)")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 2 steps: a smoke run")
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=["mlp", "cnn"])
    parser.add_argument("--clock", default="wall", choices=sorted(CLOCK),
                        help="wall (default) or cpu: the process's CPU time")
    return parser


def setup(args: argparse.Namespace) -> tuple[tf.Tensor, tf.Tensor]:
    """Applies ``--quick``, ``--threads`` and ``--clock``; the seeded batch (images, labels)."""
    global clock
    clock = CLOCK[args.clock]
    if args.quick:
        args.rounds, args.per_round = 3, 2
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rng = np.random.default_rng(0)
    images = tf.constant(rng.random((BATCH, 28, 28, 1), dtype=np.float32))
    return images, tf.constant(rng.integers(0, 10, BATCH))


def models(args: argparse.Namespace, images: tf.Tensor
           ) -> Iterator[tuple[str, keras.Model, tf.Tensor]]:
    """(name, model built after seeding, its input batch) for each model in ``--models``."""
    for model_name, build in (("MLP", mlp), ("CNN", cnn)):
        if model_name.lower() not in args.models:
            continue
        keras.utils.set_random_seed(0)
        base = build()
        yield model_name, base, tf.reshape(images, (BATCH, 784)) if model_name == "MLP" else images


LABELS = {"permanent": "inject permanent", "fit": "inject permanent, fit",
          "transient": "inject transient/step", "seed": "seed transform inline"}


def variant_step(key: str, base: keras.Model, spec: bf.FaultSpec, x: tf.Tensor, y: tf.Tensor,
                 jit: bool):
    """The fault-aware training step of variant ``key`` (see ``VARIANTS``)."""
    if key == "permanent":
        return trainer(inject(base, spec), x, y, jit)
    if key == "fit":
        return fit_trainer(inject(base, spec), x, y, jit)
    if key == "transient":
        return transient_trainer(inject(base, spec.replace(persistence="transient")), x, y, jit)
    return trainer(SeedTransform(clone(base), spec.format), x, y, jit)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = parser.parse_args()
    images, y = setup(args)
    formats = {"FixedPoint(32,28)": bf.FixedPoint(32, 28, rounding="trunc"),
               "IntQuant(8)": bf.IntQuant(8)}
    print(f"tensorflow {tf.__version__}, keras {keras.__version__}, {args.threads} thread(s), "
          f"batch {BATCH}, ber {BER}, SGD; ratio = fault-aware step / clean step (median of "
          f"{args.rounds} alternating rounds x {args.per_round} steps; CNN: half of each; "
          f"transient: a third of the rounds; {args.clock} clock)")
    print(f"{'model':5} {'jit':5} {'format':18} {'variant':24} {'clean ms':>9} {'faulty ms':>9} "
          f"{'ratio':>7}")
    for model_name, base, x in models(args, images):
        for jit in (False, True):
            clean_step = trainer(clone(base), x, y, jit)
            clean_fit = fit_trainer(clone(base), x, y, jit) if "fit" in args.variants else None
            for fmt_name, fmt in formats.items():
                spec = bf.FaultSpec(format=fmt, ber=BER, seed=0)
                for key in args.variants:
                    variant = LABELS[key]
                    clean = clean_fit if key == "fit" else clean_step
                    rounds, per_round = args.rounds, args.per_round
                    if model_name == "CNN":  # 20x slower steps: fewer, shorter rounds
                        rounds, per_round = max(3, args.rounds // 2), max(1, args.per_round // 2)
                    elif key == "transient":
                        rounds = max(3, args.rounds // 3)
                    step = variant_step(key, base, spec, x, y, jit)
                    r, tc, tv = ratio(clean, step, rounds, per_round)
                    print(f"{model_name:5} {jit!s:5} {fmt_name:18} {variant:24} {tc:9.2f} "
                          f"{tv:9.2f} {r:7.3f}", flush=True)


if __name__ == "__main__":
    main()
