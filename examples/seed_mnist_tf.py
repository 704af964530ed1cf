"""The seed program in TF2: an MNIST MLP trained through a faulty fixed-point weight memory.

The original TensorFlow code turned each weight matrix into fixed point
(``tf.cast(268435456.0 * w, tf.int32)``, i.e. Q4.28), XORed it with a
user-supplied int32 fault map ``fmap`` (a bit flip wherever fmap has a 1),
turned it back (``* 1/268435456``) and used it in ``relu(matmul(x, W) + b)``.
Every step of that transform sat inside ``tf.stop_gradient``, so the loss had
no path to W and W never trained: only the biases moved. This version keeps
the seed's ``build_layer(inputs, fmap, nscope, layer_size1, layer_size2,
faulty_training)`` and fixes it with one line, a straight-through estimator::

    weights = w + tf.stop_gradient(faulty(w) - w)   # forward: faulty(w); backward: identity

    python examples/seed_mnist_tf.py                   # W trains through the faults
    python examples/seed_mnist_tf.py --stop-gradient   # the original: W frozen, biases move
    python examples/seed_mnist_tf.py --fmaps my.npz    # your own int32 fmaps, one per layer

``--fmaps`` takes an ``.npz`` with one int32 array per layer scope (``layer1``,
``layer2``, ``out``) in the weight's own (in, out) layout. Without it the maps
are drawn by bitfault: ``FaultMap.random(...).to_dense(np.int32)``. See
docs/stop_gradient.md for the why, and bitfault.keras for the same on any model.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import bitfault as bf
from bitfault.data import split_embedded_mnist

SEED_FORMAT = bf.FixedPoint(32, 28, rounding="trunc")  # what int32(w * 2**28) stores
SCOPES = ("layer1", "layer2", "out")


class SeedMLP(tf.Module):
    """The seed's network: variables created per scope on first use, as tf.variable_scope did."""

    def __init__(self, fmaps: dict[str, np.ndarray], stop_gradient: bool) -> None:
        super().__init__()
        self.fmaps = {k: tf.constant(v, tf.int32) for k, v in fmaps.items()}
        self.stop_gradient = stop_gradient
        self.weights: dict[str, tf.Variable] = {}
        self.biases: dict[str, tf.Variable] = {}
        self.rng = np.random.default_rng(0)

    def variables_of(self, nscope: str, layer_size1: int, layer_size2: int):
        if nscope not in self.weights:
            w = np.clip(self.rng.normal(0, 0.1, (layer_size1, layer_size2)), -0.2, 0.2)
            self.weights[nscope] = tf.Variable(w.astype(np.float32), name=f"{nscope}/weights")
            self.biases[nscope] = tf.Variable(np.full(layer_size2, 0.1, np.float32),
                                              name=f"{nscope}/biases")
        return self.weights[nscope], self.biases[nscope]

    def faulty(self, w: tf.Tensor, fmap: tf.Tensor) -> tf.Tensor:
        """The seed's 5-op transform (defined for |w| < 8, where int32(w * 2**28) fits)."""
        w_int = tf.cast(268435456.0 * w, tf.int32)
        return tf.cast(tf.bitwise.bitwise_xor(w_int, fmap), tf.float32) * (1.0 / 268435456.0)

    def used_weights(self, w: tf.Variable, fmap: tf.Tensor, faulty_training: bool) -> tf.Tensor:
        if not faulty_training:
            return w
        if self.stop_gradient:  # the original code: no gradient reaches w
            return tf.stop_gradient(self.faulty(w, fmap))
        return w + tf.stop_gradient(self.faulty(w, fmap) - w)  # the fix

    def build_layer(self, inputs: tf.Tensor, fmap: tf.Tensor, nscope: str, layer_size1: int,
                    layer_size2: int, faulty_training: bool) -> tf.Tensor:
        w, b = self.variables_of(nscope, layer_size1, layer_size2)
        weights = self.used_weights(w, fmap, faulty_training)
        return tf.nn.relu(tf.matmul(inputs, weights) + b)

    def __call__(self, x: tf.Tensor, hidden: int, faulty_training: bool = True) -> tf.Tensor:
        h = self.build_layer(x, self.fmaps["layer1"], "layer1", 784, hidden, faulty_training)
        h = self.build_layer(h, self.fmaps["layer2"], "layer2", hidden, hidden, faulty_training)
        w, b = self.variables_of("out", hidden, 10)  # logits: the same transform, no relu
        return tf.matmul(h, self.used_weights(w, self.fmaps["out"], faulty_training)) + b


def load_or_draw_fmaps(path: str | None, hidden: int, ber: float, seed: int
                       ) -> dict[str, np.ndarray]:
    shapes = {"layer1": (784, hidden), "layer2": (hidden, hidden), "out": (hidden, 10)}
    if path:
        with np.load(path) as data:
            fmaps = {k: np.asarray(data[k]) for k in SCOPES}
        for k, fmap in fmaps.items():
            if fmap.shape != shapes[k] or fmap.dtype.kind not in "iu":
                raise SystemExit(f"--fmaps: {k!r} must be an int array of shape {shapes[k]}, "
                                 f"got {fmap.dtype} {fmap.shape}")
        return {k: v.astype(np.int64).astype(np.uint32).view(np.int32) for k, v in fmaps.items()}
    return {k: bf.FaultMap.random(shape, SEED_FORMAT, ber=ber, seed=seed, name=f"{k}.weight")
            .to_dense(np.int32) for k, shape in shapes.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stop-gradient", action="store_true",
                        help="reproduce the original code (the transform inside stop_gradient)")
    parser.add_argument("--fmaps", help=".npz of int32 fmaps named layer1, layer2, out")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.1, help="plain SGD step size")
    parser.add_argument("--ber", type=float, default=1e-4, help="bit error rate of drawn fmaps")
    parser.add_argument("--seed", type=int, default=0, help="seed of drawn fmaps")
    args = parser.parse_args(argv)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(2)
    except RuntimeError:  # TensorFlow already started (the example run from a test)
        pass

    (x_train, y_train), (x_test, y_test) = split_embedded_mnist()
    fmaps = load_or_draw_fmaps(args.fmaps, args.hidden, args.ber, args.seed)
    n_faults = sum(int(np.unpackbits(m.view(np.uint8)).sum()) for m in fmaps.values())
    print(f"{len(x_train)} training / {len(x_test)} test digits; {n_faults} faulty weight bits; "
          f"{'ORIGINAL stop_gradient' if args.stop_gradient else 'straight-through fix'}")

    model = SeedMLP(fmaps, args.stop_gradient)
    model(tf.constant(x_train[:1]), args.hidden)  # create the variables
    w0 = {k: v.numpy().copy() for k, v in model.weights.items()}
    b0 = {k: v.numpy().copy() for k, v in model.biases.items()}
    variables = [v for k in SCOPES for v in (model.weights[k], model.biases[k])]

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=y, logits=model(x, args.hidden)))
        for v, g in zip(variables, tape.gradient(loss, variables), strict=True):
            if g is not None:  # under stop_gradient the weights get no gradient at all
                v.assign_sub(args.lr * g)
        return loss

    def accuracy() -> float:
        logits = model(tf.constant(x_test), args.hidden)
        return float(np.mean(np.argmax(logits.numpy(), 1) == y_test))

    print(f"epoch 0: test accuracy {accuracy():.3f}")
    rng, start = np.random.default_rng(args.seed), time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(x_train))
        losses = [float(train_step(tf.constant(x_train[i]), tf.constant(y_train[i])))
                  for i in np.array_split(order, len(order) // args.batch)]
        dw = max(np.abs(model.weights[k].numpy() - w0[k]).max() for k in SCOPES)
        db = max(np.abs(model.biases[k].numpy() - b0[k]).max() for k in SCOPES)
        print(f"epoch {epoch}: loss {np.mean(losses):.3f}  test accuracy {accuracy():.3f}  "
              f"max|dW| {dw:.4f}  max|db| {db:.4f}")
    print(f"{time.perf_counter() - start:.1f} s of training")

    if args.stop_gradient:
        print(f"W stayed frozen (max |dW| = {dw}) while the biases moved (max |db| = {db:.4f}): "
              "stop_gradient cut every path from the loss to W.")
    else:
        print(f"W trained (max |dW| = {dw:.4f}) through the faulty memory.")
    # The transform is exactly bitfault's FixedPoint(32, 28, "trunc") with a bit flip:
    w = model.weights["layer1"].numpy()
    seed_faulty = model.faulty(tf.constant(w), tf.constant(fmaps["layer1"])).numpy()
    same = bf.inject(w, SEED_FORMAT, bf.BitFlip(), bf.FaultMap.from_mask(fmaps["layer1"]))
    print(f"seed transform == bitfault.inject, bit for bit: "
          f"{np.array_equal(seed_faulty.view(np.int32), same.view(np.int32))}")


if __name__ == "__main__":
    main()
