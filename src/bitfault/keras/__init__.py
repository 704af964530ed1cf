"""bitfault for Keras 3 on the TensorFlow backend: faulty layers, ``inject``, resampling,
training by a ``bitfault.recipes.Recipe`` (``fit``, ``clip_weights_``, ``bound_relus``),
and ``KerasEvaluator`` for campaigns (``bitfault.campaign``).

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

from bitfault.keras.callbacks import ResampleFaults, fault_maps, faulty_layers, resample
from bitfault.keras.evaluate import KerasEvaluator
from bitfault.keras.inject import inject, left_out
from bitfault.keras.layers import (
    FaultyConv1D,
    FaultyConv2D,
    FaultyConv3D,
    FaultyDense,
    FaultyEinsumDense,
    FaultyEmbedding,
    FaultyLayer,
    KeepStorable,
    storable_range,
)
from bitfault.keras.recipes import (
    BoundedReLU,
    ClipWeights,
    bound_relus,
    bound_relus_,
    calibrate_relu_thresholds,
    clip_weights_,
    quantised_weights,
    relu_bounds,
    relu_sites,
    stored_weights,
)
from bitfault.keras.seam import inject_tensor
from bitfault.keras.targets import select_report, select_tensors
from bitfault.keras.train import evaluate, fit, randbet_step

__all__ = [
    "BoundedReLU",
    "ClipWeights",
    "FaultyConv1D",
    "FaultyConv2D",
    "FaultyConv3D",
    "FaultyDense",
    "FaultyEinsumDense",
    "FaultyEmbedding",
    "FaultyLayer",
    "KeepStorable",
    "KerasEvaluator",
    "ResampleFaults",
    "bound_relus",
    "bound_relus_",
    "calibrate_relu_thresholds",
    "clip_weights_",
    "evaluate",
    "fault_maps",
    "faulty_layers",
    "fit",
    "inject",
    "inject_tensor",
    "left_out",
    "quantised_weights",
    "randbet_step",
    "relu_bounds",
    "relu_sites",
    "resample",
    "select_report",
    "select_tensors",
    "storable_range",
    "stored_weights",
]
