"""NVIDIA's NVFP4: 16 E2M1 codes share an E4M3 scale, and the tensor one float32 scale.

The recipe of NVIDIA's TensorRT Model Optimizer and Transformer Engine, in float32
arithmetic throughout (each operation rounded to nearest even in float32):

* tensor scale ``t = amax(|x|) / 2688`` (2688 = 6 * 448, the E2M1 max times the E4M3
  max); ``t = 1`` where that is 0 (an all-zero tensor, or amax below 2688 * 2**-150);
* block scale ``s = E4M3(amax_block / (6 * t))``, rounded to nearest even, saturating;
* elements ``q = E2M1(x / (s * t))``, rounded to nearest even, saturating at 6; where
  ``s * t`` is 0 the elements are zeros of x's sign;
* decoding ``(q * s) * t`` in float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from bitfault.formats.blocks import BlockFormat, Plane, check_axis, row_reduce
from bitfault.formats.floats import Float
from bitfault.formats.mx import round_to_element

E2M1 = Float("float4_e2m1fn")
E4M3 = Float("float8_e4m3fn")
FLOAT32 = Float("float32")
NVFP4_BLOCK = 16
TENSOR_DIVISOR = np.float32(6.0 * 448.0)


def tensor_scale(amax: float) -> np.float32:
    """The NVFP4 tensor scale of a tensor whose largest magnitude is ``amax`` (float32)."""
    t = np.float32(amax) / TENSOR_DIVISOR
    return np.float32(1.0) if t == 0 else np.float32(t)


@dataclass(frozen=True)
class NVFP4(BlockFormat, kind="nvfp4"):
    """NVFP4: blocks of 16 E2M1 codes along ``axis`` with an E4M3 scale each and one
    float32 scale for the tensor (planes ``codes``, ``scale``, ``tensor_scale``)."""

    axis: int = -1

    def __post_init__(self) -> None:
        object.__setattr__(self, "axis", check_axis(self.axis))

    @property
    def block_size(self) -> int:
        return NVFP4_BLOCK

    @cached_property  # built once per format: a trial asks per plane of every tensor
    def planes(self) -> tuple[Plane, ...]:
        return (Plane("codes", E2M1, "element"), Plane("scale", E4M3, "block"),
                Plane("tensor_scale", FLOAT32, "tensor"))

    def encode_blocks(self, blocks: np.ndarray) -> dict[str, np.ndarray]:
        """The tensor scale, the block scales, then the elements (float32 throughout)."""
        blocks = np.asarray(blocks, dtype=np.float32)
        amax_block = row_reduce(np.abs(blocks))
        t = tensor_scale(float(amax_block.max()) if amax_block.size else 0.0)
        with np.errstate(under="ignore"):
            scale_codes = E4M3.encode(amax_block / (np.float32(6.0) * t))
            denominator = E4M3.decode(scale_codes) * t
        denominator[denominator == 0] = np.inf  # x / inf: a zero of x's sign
        codes = round_to_element(blocks / denominator[:, None], "float4_e2m1fn")
        return {"codes": codes, "scale": scale_codes.view(np.uint8),
                "tensor_scale": np.asarray(t).view(np.uint32)}

    def decode_blocks(self, planes: Mapping[str, np.ndarray]) -> np.ndarray:
        """``(q * s) * t`` in float32 (faulty words included: NaN and inf propagate)."""
        q = E2M1.decode(planes["codes"])
        s = E4M3.decode(planes["scale"])
        t = FLOAT32.decode(planes["tensor_scale"])
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            return (q * s[:, None]) * t


__all__ = ["NVFP4", "tensor_scale"]
