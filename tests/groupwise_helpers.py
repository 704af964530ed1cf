"""Shared inputs for the group-wise integer tests: values planted next to rounding ties."""

from __future__ import annotations

import numpy as np

from bitfault.formats.groupwise import GroupwiseInt

F = np.float32


def near_ties(fmt: GroupwiseInt, w: np.ndarray, seed: int) -> np.ndarray:
    """``w`` with every value but each group's extremes moved next to a rounding tie of its
    group's scale (where x / s and x * (1 / s) round apart), the scales unchanged."""
    rng = np.random.default_rng(seed)
    lay = fmt.layout(w.shape)
    b = lay.to_blocks(w)
    planes = fmt.encode(w)
    s = lay.block_plane_to_blocks(planes["scale"]).astype(np.int16).view(np.float16)
    s = s.astype(F)[:, None]
    k = np.trunc(b / s) + np.where(b < 0, F(-0.5), F(0.5))
    v = (k * s).astype(F)
    step = rng.integers(-1, 2, size=b.shape)
    v = np.where(step > 0, np.nextafter(v, F(np.inf)),
                 np.where(step < 0, np.nextafter(v, F(-np.inf)), v))
    v = np.clip(v, b.min(axis=1, keepdims=True), b.max(axis=1, keepdims=True))
    keep = (b == b.min(axis=1, keepdims=True)) | (b == b.max(axis=1, keepdims=True))
    out = lay.from_blocks(np.where(keep, b, v).astype(F))
    again = fmt.encode(out)
    for name in fmt.plane_names[1:]:
        assert np.array_equal(again[name], planes[name])
    return out
