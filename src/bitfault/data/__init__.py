"""Datasets: the embedded MNIST subset, IDX directories, Keras-layout npz, Fashion-MNIST."""

from bitfault.data.embedded import embedded_mnist_path, load_embedded_mnist, split_embedded_mnist
from bitfault.data.files import (
    DEBIAN_FASHION_MNIST,
    load_fashion_mnist,
    load_idx_dir,
    load_npz,
    read_idx,
)

__all__ = [
    "DEBIAN_FASHION_MNIST",
    "embedded_mnist_path",
    "load_embedded_mnist",
    "load_fashion_mnist",
    "load_idx_dir",
    "load_npz",
    "read_idx",
    "split_embedded_mnist",
]
