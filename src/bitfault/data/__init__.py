"""Datasets: the embedded MNIST subset (more loaders arrive with the CLI issue)."""

from bitfault.data.embedded import embedded_mnist_path, load_embedded_mnist, split_embedded_mnist

__all__ = ["embedded_mnist_path", "load_embedded_mnist", "split_embedded_mnist"]
