"""Fixtures shared by the PyTorch training tests (import after pytest.importorskip("torch")):
one thread while a module's tests run, and slices of the embedded MNIST digits."""

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from bitfault.data import split_embedded_mnist


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Models this small train fastest on one thread (and don't fight other processes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def mnist_digits(train: int, test_every: int) -> tuple[np.ndarray, ...]:
    """(x_train, y_train, x_test, y_test): the first ``train`` training digits and every
    ``test_every``-th test digit (the test split is sorted by label)."""
    (xtr, ytr), (xte, yte) = split_embedded_mnist()
    return xtr[:train], ytr[:train], xte[::test_every], yte[::test_every]
