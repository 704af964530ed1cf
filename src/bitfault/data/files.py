"""Datasets from files the user points at: IDX (MNIST, Fashion-MNIST, KMNIST) and npz.

Nothing is downloaded. Every problem (a missing, truncated or mislabelled file)
is a ``ValueError``/``FileNotFoundError`` naming the file.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Sequence

import numpy as np

Split = tuple[np.ndarray, np.ndarray]

#: Where Debian's ``dataset-fashion-mnist`` package installs the IDX files.
DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"

_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one IDX file (raw or gzipped) into an array of its declared type and shape."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such IDX file")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError) as exc:
        raise ValueError(f"{path}: cannot be read as {'gzip' if path.endswith('.gz') else 'raw'}"
                         f" IDX ({exc})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic number {raw[:4].hex()})")
    dtype, ndim = np.dtype(_IDX_TYPES[raw[2]]), raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header")
    dims = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    body = len(raw) - header
    if body != expected:
        what = "truncated" if body < expected else "longer than its header says"
        raise ValueError(f"{path}: {what}: header declares shape {dims} "
                         f"({expected} bytes of data), file has {body}")
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return data.astype(dtype.newbyteorder("="))


def _find(directory: str, stems: Sequence[str]) -> str:
    for stem in stems:
        for suffix in ("", ".gz"):
            candidate = os.path.join(directory, stem + suffix)
            if os.path.exists(candidate):
                return candidate
    raise FileNotFoundError(f"{directory}: none of {[s + '[.gz]' for s in stems]} found")


def _check_pair(images: np.ndarray, labels: np.ndarray, image_path: str, label_path: str,
                num_classes: int) -> None:
    if images.ndim != 3 or labels.ndim != 1:
        raise ValueError(f"{image_path} / {label_path}: expected images (N, rows, cols) and "
                         f"labels (N,), got {images.shape} and {labels.shape}")
    if len(images) != len(labels):
        raise ValueError(f"{label_path}: {len(labels)} labels for {len(images)} images in "
                         f"{image_path}")
    if not len(images) or not images[0].size:
        raise ValueError(f"{image_path}: holds no {'images' if not len(images) else 'pixels'} "
                         f"(shape {images.shape}); a split needs at least one image with at "
                         "least one pixel")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"{label_path}: labels must be in 0..{num_classes - 1}, found "
                         f"{int(labels.min())}..{int(labels.max())}")


def _to_float(images: np.ndarray, flatten: bool) -> np.ndarray:
    x = images.astype(np.float32) / np.float32(255.0)
    return x.reshape(len(x), -1) if flatten else x


def load_idx_dir(directory: str | os.PathLike[str], *, flatten: bool = True,
                 num_classes: int = 10) -> tuple[Split, Split]:
    """``(x_train, y_train), (x_test, y_test)`` from an MNIST-layout IDX directory.

    Looks for ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte`` (each raw or ``.gz``;
    KMNIST's ``*-imgs``/``*-labels`` names too). Pixels become float32 in [0, 1].
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory}: no such dataset directory")
    splits = []
    for prefix in ("train", "t10k"):
        ipath = _find(directory, [f"{prefix}-images-idx3-ubyte", f"{prefix}-images.idx3-ubyte",
                                  f"{prefix}-imgs-idx3-ubyte"])
        lpath = _find(directory, [f"{prefix}-labels-idx1-ubyte", f"{prefix}-labels.idx1-ubyte"])
        images, labels = read_idx(ipath), read_idx(lpath)
        _check_pair(images, labels, ipath, lpath, num_classes)
        splits.append((_to_float(images, flatten), labels.astype(np.int64)))
    return splits[0], splits[1]


def load_npz(path: str | os.PathLike[str], *, flatten: bool = True,
             num_classes: int = 10) -> tuple[Split, Split]:
    """A dataset in Keras' ``mnist.npz`` layout: ``x_train, y_train, x_test, y_test``."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such npz file")
    keys = ("x_train", "y_train", "x_test", "y_test")
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in keys if k not in data.files]
            arrays = {k: data[k] for k in keys if k not in missing}
    except Exception as exc:
        raise ValueError(f"{path}: not a readable npz file ({type(exc).__name__}: {exc})") from None
    if missing:
        raise ValueError(f"{path}: missing array(s) {missing} (expected x_train, y_train, "
                         "x_test, y_test as in Keras' mnist.npz)")
    splits = []
    for prefix in ("train", "test"):
        images, labels = arrays[f"x_{prefix}"], arrays[f"y_{prefix}"]
        _check_pair(images, labels, f"{path}[x_{prefix}]", f"{path}[y_{prefix}]", num_classes)
        if images.dtype != np.uint8:
            raise ValueError(f"{path}[x_{prefix}]: expected uint8 pixels, got {images.dtype}")
        splits.append((_to_float(images, flatten), labels.astype(np.int64)))
    return splits[0], splits[1]


def load_fashion_mnist(directory: str | os.PathLike[str] | None = None, *,
                       flatten: bool = True) -> tuple[Split, Split]:
    """Fashion-MNIST from ``directory`` or, by default, where Debian's package puts it."""
    directory = DEBIAN_FASHION_MNIST if directory is None else directory
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"{directory}: Fashion-MNIST not found; install Debian's dataset-fashion-mnist "
            "package or pass the directory holding its IDX files")
    return load_idx_dir(directory, flatten=flatten)


__all__ = ["DEBIAN_FASHION_MNIST", "load_fashion_mnist", "load_idx_dir", "load_npz", "read_idx"]
