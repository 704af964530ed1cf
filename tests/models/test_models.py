"""Reference models: shapes, the seed's initialisation, matching layer names across frameworks."""

from __future__ import annotations

import numpy as np
import pytest


def test_torch_models() -> None:
    torch = pytest.importorskip("torch")
    from bitfault.models.torch import seed_mlp, small_cnn

    mlp = seed_mlp(hidden=64, seed=3)
    assert mlp(torch.zeros(5, 784)).shape == (5, 10)
    w = mlp.fc1.weight.detach().numpy()
    std = 1 / np.sqrt(784)
    assert np.abs(w).max() <= 2 * std  # truncated at two standard deviations
    assert 0.8 * std < w.std() < 0.95 * std  # a normal cut at 2 sigma keeps ~0.88 of its std
    assert all(float(m.bias.detach().abs().max()) == 0.0 for m in (mlp.fc1, mlp.fc2, mlp.fc3))
    again = seed_mlp(hidden=64, seed=3)
    assert torch.equal(again.fc2.weight, mlp.fc2.weight)
    assert not torch.equal(seed_mlp(hidden=64, seed=4).fc2.weight, mlp.fc2.weight)
    cnn = small_cnn()
    assert cnn(torch.zeros(2, 784)).shape == (2, 10)
    layers = {n for n, m in cnn.named_children() if any(True for _ in m.parameters())}
    assert layers == {"conv1", "conv2", "fc"}  # ReLUs are modules too (act1, act2), no weights


def test_keras_models() -> None:
    pytest.importorskip("keras")
    from bitfault.models.keras import seed_mlp, small_cnn

    mlp = seed_mlp(hidden=64, seed=3)
    assert mlp.output_shape == (None, 10)
    assert [layer.name for layer in mlp.layers[1:]] == ["fc1", "fc2", "fc3"]
    kernel = np.asarray(mlp.get_layer("fc1").kernel)
    std = 1 / np.sqrt(784)
    assert np.abs(kernel).max() <= 2 * std + 1e-7
    assert 0.8 * std < kernel.std() < 0.95 * std
    assert np.all(np.asarray(mlp.get_layer("fc1").bias) == 0)
    cnn = small_cnn()
    assert cnn.predict(np.zeros((2, 784), np.float32), verbose=0).shape == (2, 10)
    assert {"conv1", "conv2", "fc"} <= {layer.name for layer in cnn.layers}
