"""A small block format for the tests of the plane machinery (maps, inject, StoredArray,
the adapters): int8 codes sharing one float16 scale per block of 4; ``import blockfmt``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bitfault.formats import BlockFormat, Float, IntCodes, Plane


@dataclass(frozen=True)
class Toy(BlockFormat):
    """int8 codes, one float16 scale (amax / 127) per block of 4 along ``axis``."""

    axis: int = -1

    @property
    def block_size(self) -> int:
        return 4

    @property
    def planes(self) -> tuple[Plane, ...]:
        return (Plane("codes", IntCodes(8), "element"), Plane("scale", Float("float16"), "block"))

    def encode_blocks(self, blocks: np.ndarray) -> dict[str, np.ndarray]:
        scale = (np.abs(blocks).max(axis=1) / 127).astype(np.float16)
        s = scale.astype(np.float32)
        q = np.rint(blocks / np.where(s == 0, 1, s)[:, None]).clip(-127, 127).astype(np.int64)
        return {"codes": q & 0xFF, "scale": scale.view(np.uint16).astype(np.int64)}

    def decode_blocks(self, planes: dict[str, np.ndarray]) -> np.ndarray:
        s = planes["scale"].astype(np.uint16).view(np.float16).astype(np.float32)
        q = IntCodes(8).integers(planes["codes"])
        return (q * s[..., None]).astype(np.float32)
