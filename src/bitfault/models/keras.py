"""Keras 3 reference models (imports keras), layer names matching ``bitfault.models.torch``.

Inputs are flat (N, 784) like ``bitfault.data``; the CNN reshapes to 28x28x1
(channels last) itself. Flatten order after the convolutions is channels-last, so
moving weights from the PyTorch CNN needs the fc kernel permuted (see
``bitfault.keras`` layouts).
"""

from __future__ import annotations

import math

import keras


def _init(fan_in: int, seed: int) -> keras.initializers.Initializer:
    return keras.initializers.TruncatedNormal(mean=0.0, stddev=1.0 / math.sqrt(fan_in),
                                              seed=seed)


def seed_mlp(hidden: int = 256, seed: int = 0, inputs: int = 784, classes: int = 10) -> keras.Model:
    """784-hidden-hidden-10 with ReLU (layers fc1, fc2, fc3); truncated normal, zero biases."""
    x = keras.Input((inputs,), name="pixels")
    h = keras.layers.Dense(hidden, "relu", kernel_initializer=_init(inputs, seed), name="fc1")(x)
    h = keras.layers.Dense(hidden, "relu", kernel_initializer=_init(hidden, seed + 1),
                           name="fc2")(h)
    out = keras.layers.Dense(classes, kernel_initializer=_init(hidden, seed + 2), name="fc3")(h)
    return keras.Model(x, out, name="seed_mlp")


def small_cnn(channels: tuple[int, int] = (16, 32), seed: int = 0,
              classes: int = 10) -> keras.Model:
    """Two 3x3 conv layers (conv1, conv2) with max pooling, then Dense ``fc``."""
    c1, c2 = channels
    x = keras.Input((784,), name="pixels")
    h = keras.layers.Reshape((28, 28, 1))(x)
    h = keras.layers.Conv2D(c1, 3, padding="same", activation="relu",
                            kernel_initializer=_init(9, seed), name="conv1")(h)
    h = keras.layers.MaxPooling2D(2)(h)
    h = keras.layers.Conv2D(c2, 3, padding="same", activation="relu",
                            kernel_initializer=_init(9 * c1, seed + 1), name="conv2")(h)
    h = keras.layers.MaxPooling2D(2)(h)
    h = keras.layers.Flatten()(h)
    out = keras.layers.Dense(classes, kernel_initializer=_init(49 * c2, seed + 2), name="fc")(h)
    return keras.Model(x, out, name="small_cnn")


__all__ = ["seed_mlp", "small_cnn"]
