"""A small NumPy model on the embedded MNIST subset, shared by the campaign tests."""

from __future__ import annotations

import numpy as np
import pytest

from bitfault.campaign import NumpyEvaluator
from bitfault.data import split_embedded_mnist


def forward(params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    h = np.maximum(x @ params["fc1.weight"].T + params["fc1.bias"], 0.0)
    return h @ params["fc2.weight"].T + params["fc2.bias"]


def train_mlp(seed: int = 0, hidden: int = 32, epochs: int = 30) -> dict[str, np.ndarray]:
    """A 784-32-10 MLP trained by full-batch gradient descent in NumPy (about a second)."""
    (x, y), _ = split_embedded_mnist()
    rng = np.random.Generator(np.random.PCG64(seed))
    p = {"fc1.weight": rng.normal(0, 784**-0.5, (hidden, 784)).astype(np.float32),
         "fc1.bias": np.zeros(hidden, np.float32),
         "fc2.weight": rng.normal(0, hidden**-0.5, (10, hidden)).astype(np.float32),
         "fc2.bias": np.zeros(10, np.float32)}
    onehot = np.eye(10, dtype=np.float32)[y]
    for _ in range(epochs):
        h_pre = x @ p["fc1.weight"].T + p["fc1.bias"]
        h = np.maximum(h_pre, 0)
        logits = h @ p["fc2.weight"].T + p["fc2.bias"]
        e = np.exp(logits - logits.max(1, keepdims=True))
        g = (e / e.sum(1, keepdims=True) - onehot) / len(x)
        gh = (g @ p["fc2.weight"]) * (h_pre > 0)
        p["fc2.weight"] -= 0.5 * g.T @ h
        p["fc2.bias"] -= 0.5 * g.sum(0)
        p["fc1.weight"] -= 0.5 * gh.T @ x
        p["fc1.bias"] -= 0.5 * gh.sum(0)
    return p


@pytest.fixture(scope="session")
def mlp_params() -> dict[str, np.ndarray]:
    return train_mlp()


@pytest.fixture
def evaluator(mlp_params: dict[str, np.ndarray]) -> NumpyEvaluator:
    _, (x_test, y_test) = split_embedded_mnist()
    return NumpyEvaluator(forward, mlp_params, x_test[:300], y_test[:300])
