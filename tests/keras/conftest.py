"""Keras adapter tests: skipped cleanly without TensorFlow/Keras; TF kept to two threads."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

if keras.backend.backend() != "tensorflow":  # pragma: no cover - depends on the environment
    pytest.skip(f"bitfault.keras needs the TensorFlow backend, Keras uses "
                f"{keras.backend.backend()!r}", allow_module_level=True)

try:
    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(1)
except RuntimeError:  # already initialised by an earlier import
    pass


@pytest.fixture
def mlp() -> keras.Model:
    """A small seeded MLP 8-16-3 with layers named fc1, fc2."""
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.Input((8,)),
                             keras.layers.Dense(16, activation="relu", name="fc1"),
                             keras.layers.Dense(3, name="fc2")], name="mlp")


@pytest.fixture
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return rng.normal(size=(40, 8)).astype(np.float32), rng.integers(0, 3, 40)

