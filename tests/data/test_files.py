"""IDX / npz loaders on small files the tests write, their errors, and Debian's Fashion-MNIST."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from bitfault.data import (
    DEBIAN_FASHION_MNIST,
    load_fashion_mnist,
    load_idx_dir,
    load_npz,
    read_idx,
    split_embedded_mnist,
)


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file written by hand from the format's definition (uint8 data)."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx_dir(directory: Path, n_train: int = 12, n_test: int = 5, gz: bool = True,
                  seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test),
    }
    for name, arr in arrays.items():
        data = idx_bytes(arr)
        if gz:
            with gzip.open(directory / f"{name}.gz", "wb") as fh:
                fh.write(data)
        else:
            (directory / name).write_bytes(data)
    return arrays


@pytest.mark.parametrize("gz", [True, False])
def test_idx_directory_round_trip(tmp_path: Path, gz: bool) -> None:
    arrays = write_idx_dir(tmp_path, gz=gz)
    (x_train, y_train), (x_test, y_test) = load_idx_dir(tmp_path)
    assert x_train.shape == (12, 784) and x_test.shape == (5, 784)
    assert x_train.dtype == np.float32
    np.testing.assert_array_equal(x_train * 255, arrays["train-images-idx3-ubyte"].reshape(12, -1))
    np.testing.assert_array_equal(y_test, arrays["t10k-labels-idx1-ubyte"])
    (x2, _), _ = load_idx_dir(tmp_path, flatten=False)
    assert x2.shape == (12, 28, 28)


def test_read_idx_other_types(tmp_path: Path) -> None:
    values = np.arange(6, dtype=">i4").reshape(2, 3)
    path = tmp_path / "ints.idx"
    path.write_bytes(bytes([0, 0, 0x0C, 2]) + struct.pack(">II", 2, 3) + values.tobytes())
    np.testing.assert_array_equal(read_idx(path), np.arange(6).reshape(2, 3))


def test_truncated_idx_names_the_file(tmp_path: Path) -> None:
    write_idx_dir(tmp_path, gz=False)
    target = tmp_path / "train-images-idx3-ubyte"
    target.write_bytes(target.read_bytes()[:-100])
    with pytest.raises(ValueError, match="train-images-idx3-ubyte: truncated"):
        load_idx_dir(tmp_path)


def test_bad_magic_and_bad_gzip(tmp_path: Path) -> None:
    path = tmp_path / "junk-idx1-ubyte"
    path.write_bytes(b"PK\x03\x04 not idx")
    with pytest.raises(ValueError, match="junk-idx1-ubyte: not an IDX file"):
        read_idx(path)
    gz = tmp_path / "junk.gz"
    gz.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="junk.gz"):
        read_idx(gz)


def test_mislabelled_files(tmp_path: Path) -> None:
    arrays = write_idx_dir(tmp_path, gz=False)
    labels = arrays["t10k-labels-idx1-ubyte"].copy()
    labels[0] = 42
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(labels))
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte: labels must be in 0\.\.9"):
        load_idx_dir(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(labels[:3] % 10))
    with pytest.raises(ValueError, match="3 labels for 5 images"):
        load_idx_dir(tmp_path)


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such dataset directory"):
        load_idx_dir(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        load_idx_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match="Fashion-MNIST not found"):
        load_fashion_mnist(tmp_path / "nowhere")


def test_npz_in_keras_layout(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    arrays = {"x_train": rng.integers(0, 256, (7, 28, 28), dtype=np.uint8),
              "y_train": rng.integers(0, 10, 7), "x_test": rng.integers(0, 256, (3, 28, 28),
                                                                         dtype=np.uint8),
              "y_test": rng.integers(0, 10, 3)}
    path = tmp_path / "mnist.npz"
    np.savez(path, **arrays)
    (x_train, y_train), (x_test, y_test) = load_npz(path)
    np.testing.assert_array_equal(x_test * 255, arrays["x_test"].reshape(3, -1))
    np.testing.assert_array_equal(y_train, arrays["y_train"])
    del arrays["y_test"]
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"mnist.npz: missing array\(s\) \['y_test'\]"):
        load_npz(path)
    path.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="mnist.npz: not a readable npz"):
        load_npz(path)


@pytest.mark.skipif(not os.path.isdir(DEBIAN_FASHION_MNIST),
                    reason="Debian's dataset-fashion-mnist package is not installed")
def test_fashion_mnist_from_debian() -> None:
    (x_train, y_train), (x_test, y_test) = load_fashion_mnist()
    assert x_train.shape == (60000, 784) and x_test.shape == (10000, 784)
    assert np.bincount(y_train).tolist() == [6000] * 10
    assert np.bincount(y_test).tolist() == [1000] * 10
    assert 0.0 <= x_train.min() and x_train.max() == 1.0


def test_embedded_split_is_deterministic_and_stratified() -> None:
    (x1, y1), (xt1, yt1) = split_embedded_mnist(seed=0)
    (x2, y2), (xt2, yt2) = split_embedded_mnist(seed=0)
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(yt1, yt2)
    assert x1.shape == (4000, 784) and xt1.shape == (1000, 784)
    assert np.bincount(yt1).tolist() == [100] * 10
    (_, y3), _ = split_embedded_mnist(seed=1)
    assert not np.array_equal(y1, y3)
    with pytest.raises(ValueError, match="test_fraction"):
        split_embedded_mnist(test_fraction=1.5)
