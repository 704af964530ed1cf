"""bitfault for Keras 3 on the TensorFlow backend: faulty layers, ``inject``, resampling.

``import bitfault`` never imports Keras; importing this package does, and
raises ImportError unless Keras runs on TensorFlow.
"""

import keras as _keras

if _keras.backend.backend() != "tensorflow":
    raise ImportError(
        f"bitfault.keras supports the TensorFlow backend of Keras only; this Keras uses the "
        f"{_keras.backend.backend()!r} backend. Set KERAS_BACKEND=tensorflow before importing "
        f"keras (the JAX and PyTorch backends are not supported yet; PyTorch users: "
        f"bitfault.torch).")

from bitfault.keras.callbacks import ResampleFaults
from bitfault.keras.inject import fault_maps, faulty_layers, inject, resample
from bitfault.keras.layers import (
    FaultyConv1D,
    FaultyConv2D,
    FaultyConv3D,
    FaultyDense,
    FaultyEinsumDense,
    FaultyEmbedding,
    FaultyLayer,
)

__all__ = [
    "FaultyConv1D",
    "FaultyConv2D",
    "FaultyConv3D",
    "FaultyDense",
    "FaultyEinsumDense",
    "FaultyEmbedding",
    "FaultyLayer",
    "ResampleFaults",
    "fault_maps",
    "faulty_layers",
    "inject",
    "resample",
]
