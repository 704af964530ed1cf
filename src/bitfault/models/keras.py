"""Keras 3 reference models (imports keras), layer names matching ``bitfault.models.torch``.

Inputs are flat (N, 784) like ``bitfault.data``; the CNN reshapes to 28x28x1
(channels last) itself. Flatten order after the convolutions is channels-last, so
moving weights from the PyTorch CNN needs the fc kernel permuted (see
``bitfault.keras`` layouts).
"""

from __future__ import annotations

import math

import keras

from bitfault.errors import check_int


def _init(fan_in: int, seed: int) -> keras.initializers.Initializer:
    return keras.initializers.TruncatedNormal(mean=0.0, stddev=1.0 / math.sqrt(fan_in),
                                              seed=seed)


def _relu(h: keras.KerasTensor, index: int) -> keras.KerasTensor:
    return keras.layers.ReLU(name=f"act{index}")(h)


def seed_mlp(hidden: int = 256, seed: int = 0, inputs: int = 784, classes: int = 10,
             relu_layers: bool = False) -> keras.Model:
    """784-hidden-hidden-10 with ReLU (layers fc1, fc2, fc3); truncated normal, zero biases.

    ``relu_layers=True`` puts each ReLU in its own ``keras.layers.ReLU`` (act1, act2, as
    ``bitfault.models.torch`` names its ``nn.ReLU`` modules) instead of fusing it into
    fc1/fc2; either way ``bitfault.keras.bound_relus`` caps it.
    """
    act = None if relu_layers else "relu"
    x = keras.Input((inputs,), name="pixels")
    h = keras.layers.Dense(hidden, act, kernel_initializer=_init(inputs, seed), name="fc1")(x)
    if relu_layers:
        h = _relu(h, 1)
    h = keras.layers.Dense(hidden, act, kernel_initializer=_init(hidden, seed + 1),
                           name="fc2")(h)
    if relu_layers:
        h = _relu(h, 2)
    out = keras.layers.Dense(classes, kernel_initializer=_init(hidden, seed + 2), name="fc3")(h)
    return keras.Model(x, out, name="seed_mlp")


NORMS = (None, "batch", "group")


def _norm(kind: str, channels: int, groups: int, index: int) -> keras.layers.Layer:
    if kind == "batch":  # PyTorch's BatchNorm2d defaults: eps 1e-5, momentum 0.1
        return keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=f"norm{index}")
    return keras.layers.GroupNormalization(groups=math.gcd(groups, channels), epsilon=1e-5,
                                           name=f"norm{index}")


def small_cnn(channels: tuple[int, int] = (16, 32), seed: int = 0, classes: int = 10,
              norm: str | None = None, groups: int = 4, relu_layers: bool = False) -> keras.Model:
    """Two 3x3 conv layers (conv1, conv2) with max pooling, then Dense ``fc``.

    ``norm``: None, "batch" (BatchNormalization) or "group" (GroupNormalization with
    ``groups`` groups, fewer if the channels do not divide) after each convolution,
    before its ReLU, named norm1, norm2 (as in ``bitfault.models.torch``). With a norm,
    or with ``relu_layers=True``, the ReLUs are ``keras.layers.ReLU`` layers act1, act2;
    otherwise they are fused into conv1, conv2.
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    groups = check_int(groups, "groups", 1)
    separate = relu_layers or norm is not None
    act = None if separate else "relu"
    c1, c2 = channels
    x = keras.Input((784,), name="pixels")
    h = keras.layers.Reshape((28, 28, 1))(x)
    for i, (c, fan_in) in enumerate(((c1, 9), (c2, 9 * c1)), start=1):
        h = keras.layers.Conv2D(c, 3, padding="same", activation=act,
                                kernel_initializer=_init(fan_in, seed + i - 1),
                                name=f"conv{i}")(h)
        if norm is not None:
            h = _norm(norm, c, groups, i)(h)
        if separate:
            h = _relu(h, i)
        h = keras.layers.MaxPooling2D(2)(h)
    h = keras.layers.Flatten()(h)
    out = keras.layers.Dense(classes, kernel_initializer=_init(49 * c2, seed + 2), name="fc")(h)
    return keras.Model(x, out, name="small_cnn")


__all__ = ["NORMS", "seed_mlp", "small_cnn"]
