"""Fault positions on a device: the form every PyTorch kernel reads a fault map in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bitfault.faults.models import FaultModel
from bitfault.formats import Format
from bitfault.maps import FaultMap
from bitfault.torch.kernels import blocks as block_ops
from bitfault.torch.kernels.registry import kernels_for


@dataclass(frozen=True)
class DeviceFaults:
    """Fault positions of one or more tensors laid end to end, on one device.

    ``index``: flat element indices (int64) into the concatenation; ``masks``: the
    faulty bits of each (int64, restricted to the bits the fault model may touch;
    entries left without any are dropped); ``offsets``/``sizes``: where each
    tensor starts and how many elements it has; ``spans[i]``: the slice of
    ``index``/``masks`` that belongs to tensor ``i``. For a block format (``of``),
    ``blocks[i]``: tensor ``i``'s faults in every plane, in block form
    (``kernels.blocks.BlockFaults``).
    """

    index: torch.Tensor
    masks: torch.Tensor
    masks32: torch.Tensor  # the same bits in int32 (bit 31 as the sign)
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]
    blocks: tuple[block_ops.BlockFaults, ...] = ()

    @classmethod
    def of(cls, maps: Sequence[FaultMap], fmt: Format, fault: FaultModel,
           device: torch.device | str) -> DeviceFaults:
        """The faults of ``maps`` (one per tensor, in order) stored in ``fmt`` on ``device``,
        restricted to the bits ``fault`` may touch in each plane: what every caller builds."""
        faults = cls.build(maps, fault.eligible_mask(fmt), device)
        if not kernels_for(fmt).blocks:
            return faults
        per_tensor = tuple(block_ops.BlockFaults.of(m, fmt, fault, device) for m in maps)
        return cls(faults.index, faults.masks, faults.masks32, faults.offsets, faults.sizes,
                   faults.spans, per_tensor)

    @classmethod
    def build(cls, maps: Sequence[FaultMap], eligible_mask: int,
              device: torch.device | str) -> DeviceFaults:
        """The faults of ``maps`` (one per tensor, in order) on ``device``, restricted to
        the bits of ``eligible_mask``."""
        idx_parts, mask_parts, offsets, sizes, spans = [], [], [], [], []
        offset = start = 0
        for fmap in maps:
            masks = fmap.masks & np.uint32(eligible_mask)
            keep = masks != 0
            idx_parts.append(fmap.indices[keep] + offset)
            mask_parts.append(masks[keep].astype(np.int64))
            offsets.append(offset)
            sizes.append(fmap.size)
            spans.append((start, start + int(keep.sum())))
            start = spans[-1][1]
            offset += fmap.size
        index = np.concatenate(idx_parts) if idx_parts else np.zeros(0, np.int64)
        masks = np.concatenate(mask_parts) if mask_parts else np.zeros(0, np.int64)
        return cls(torch.from_numpy(index.astype(np.int64, copy=False)).to(device),
                   torch.from_numpy(masks).to(device),
                   torch.from_numpy(masks.astype(np.uint32).view(np.int32)).to(device),
                   tuple(offsets), tuple(sizes), tuple(spans))

    def masks_as(self, dtype: torch.dtype) -> torch.Tensor:
        """The masks in a narrower signed container (same low bits), cached."""
        if dtype == torch.int32:
            return self.masks32
        cache = self.__dict__.setdefault("_narrow", {})
        if dtype not in cache:
            cache[dtype] = self.masks32.to(dtype)  # wraps: keeps the low bits
        return cache[dtype]

    def host_parts(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per tensor: (flat indices relative to it, int64 masks) as NumPy arrays, cached
        (the fused CPU kernels' form; the tensors must be on the CPU)."""
        parts = self.__dict__.get("_host_parts")
        if parts is None:
            index, masks = self.index.numpy(), self.masks.numpy()
            parts = self.__dict__["_host_parts"] = [
                (np.ascontiguousarray(index[a:b] - o), np.ascontiguousarray(masks[a:b]))
                for (a, b), o in zip(self.spans, self.offsets, strict=True)]
        return parts

    def part(self, i: int) -> DeviceFaults:
        """The faults of tensor ``i`` alone (indices relative to it)."""
        if len(self.sizes) == 1:
            return self
        a, b = self.spans[i]
        index = self.index[a:b]
        return DeviceFaults(index - self.offsets[i] if self.offsets[i] else index,
                            self.masks[a:b], self.masks32[a:b], (0,), (self.sizes[i],),
                            ((0, b - a),), self.blocks[i:i + 1])


__all__ = ["DeviceFaults"]
