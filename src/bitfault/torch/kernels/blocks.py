"""Block formats in tensor ops: encode every plane, fault it, decode; bit for bit the core.

A tensor goes to blocks as ``BlockLayout`` moves it (the block axis last, the last block
of a row padded with zeros, one ``(n_blocks, k)`` float32 array), every plane is computed
in its block form (int32 words holding the bit pattern ``BlockFormat.encode_blocks``
gives), the faults of each plane are applied at their block-form positions
(``BlockFaults``: codes at ``block * k + slot``, block planes at the block number, the
tensor plane at 0), the planes are decoded and the values put back in the tensor's shape.

Native kernels (``kernels.block_formats``) run MX, NVFP4, GGUF Q8_0/Q4_0/Q4_1 and GroupwiseInt
on the tensor's device with the core's float32 operations in the core's order; any other
``BlockFormat`` runs the NumPy core on the host (``core_blocks``), so a new core format
works at once. float16 and float64 tensors go through float32, as the core does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from bitfault.faults.models import FaultModel
from bitfault.formats import BlockFormat, BlockLayout
from bitfault.formats.blocks import CODES
from bitfault.maps import FaultMap
from bitfault.memory.memory import plane_faults
from bitfault.torch.kernels import block_formats
from bitfault.torch.kernels.generic import apply_fault, f32_to
from bitfault.torch.kernels.registry import register

# ---- fault positions in block form ----------------------------------------------------------

def _lead_and_position(flat: np.ndarray, shape: tuple[int, ...], axis: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Flat indices into ``shape`` -> (the row they lie in once ``axis`` is moved last, their
    position along ``axis``)."""
    if not flat.size:
        return flat, flat
    index = np.unravel_index(flat, shape)
    lead_shape = shape[:axis] + shape[axis + 1:]
    lead = index[:axis] + index[axis + 1:]
    row = np.ravel_multi_index(lead, lead_shape) if lead else np.zeros_like(flat)
    return row.astype(np.int64), index[axis].astype(np.int64)


@functools.lru_cache(maxsize=256)
def _eligible(fault: FaultModel, fmt: BlockFormat, plane: str) -> np.uint32:
    return np.uint32(fault.eligible_mask(fmt, plane))


def _plane_faults(fmap: FaultMap, fmt: BlockFormat, fault: FaultModel, plane: str
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``memory.plane_faults``, the eligible mask of (fault, format, plane) computed once."""
    try:
        eligible = _eligible(fault, fmt, plane)
    except TypeError:  # an unhashable format or fault model
        return plane_faults(fmap, fmt, fault, plane)
    pmap = fmap.plane(plane)
    if pmap is None:
        return np.zeros(0, np.int64), np.zeros(0, np.uint32)
    masks = pmap.masks & eligible
    keep = masks != 0
    return pmap.indices[keep], masks[keep]


def block_positions(fmap: FaultMap, fmt: BlockFormat, fault: FaultModel, lay: BlockLayout
                    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every faulted plane's (positions in block form, int64 masks of the bits ``fault``
    may touch): codes ``block * k + slot``, block planes the block number, a tensor
    plane 0. Planes without an eligible fault are left out. Cost: in proportion to the
    faults (the block axis last, the common case, is plain arithmetic on the indices)."""
    out = {}
    last = lay.axis == len(lay.shape) - 1
    for plane in fmt.planes:
        idx, masks = _plane_faults(fmap, fmt, fault, plane.name)
        if not idx.size:
            continue
        if plane.per == "element" and last:  # row * length + p -> row * nbpr * k + p
            pad = lay.n_blocks_per_row * lay.k - lay.length
            pos = idx + (idx // lay.length) * pad if pad else idx
        elif plane.per == "element":
            row, p = _lead_and_position(idx, lay.shape, lay.axis)
            pos = (row * lay.n_blocks_per_row + p // lay.k) * lay.k + p % lay.k
        elif plane.per == "block" and last:  # the flat block-plane index is the block
            pos = idx
        elif plane.per == "block":
            row, b = _lead_and_position(idx, lay.block_plane_shape, lay.axis)
            pos = row * lay.n_blocks_per_row + b
        else:
            pos = np.zeros(1, np.int64)
        out[plane.name] = (np.ascontiguousarray(pos, dtype=np.int64),
                           masks.astype(np.int64))
    return out


@dataclass(frozen=True)
class BlockFaults:
    """One tensor's faults in every plane of a block format, in block form, on one device:
    ``planes[name] = (positions, int32 masks)``; ``host`` the same as NumPy arrays (int64
    masks: the host fallback's form); ``layout`` the tensor's blocks."""

    layout: BlockLayout
    planes: dict[str, tuple[torch.Tensor, torch.Tensor]]
    host: dict[str, tuple[np.ndarray, np.ndarray]]

    @classmethod
    def of(cls, fmap: FaultMap, fmt: BlockFormat, fault: FaultModel,
           device: torch.device | str) -> BlockFaults:
        lay = fmt.layout(fmap.shape)
        host = block_positions(fmap, fmt, fault, lay)
        planes = {name: (torch.from_numpy(pos).to(device),  # masks: int32, as the words
                         torch.from_numpy(m.astype(np.uint32).view(np.int32)).to(device))
                  for name, (pos, m) in host.items()}
        return cls(lay, planes, host)

    @property
    def n_faulty_words(self) -> int:
        return sum(int(p.shape[0]) for p, _ in self.planes.values())


# ---- the pipeline ---------------------------------------------------------------------------

def to_blocks(x: torch.Tensor, lay: BlockLayout) -> torch.Tensor:
    """float32 ``x`` as ``(n_blocks, k)``: the block axis last, each row padded with zeros."""
    y = x.movedim(lay.axis, -1) if lay.axis != x.ndim - 1 else x
    pad = lay.n_blocks_per_row * lay.k - lay.length
    if pad:
        y = torch.nn.functional.pad(y, (0, pad))
    return y.reshape(lay.n_blocks, lay.k)


def from_blocks(values: torch.Tensor, lay: BlockLayout) -> torch.Tensor:
    """The inverse of ``to_blocks``: the padding dropped, the axis put back (a new tensor)."""
    lead = lay.moved_shape[:-1]
    y = values.reshape(*lead, lay.n_blocks_per_row * lay.k)
    if y.shape[-1] != lay.length:
        y = y[..., :lay.length]
    if lay.axis != len(lay.shape) - 1:
        y = y.movedim(-1, lay.axis)
    return y.contiguous()


def fault_planes_(planes: dict[str, torch.Tensor], faults: BlockFaults,
                  fault: FaultModel) -> None:
    """Apply ``fault`` to the block-form planes at ``faults``' positions, in place."""
    for name, (pos, masks) in faults.planes.items():
        flat = planes[name].reshape(-1)
        flat.index_copy_(0, pos, apply_fault(flat.index_select(0, pos), masks, fault))


def core_blocks(x: torch.Tensor, fmt: BlockFormat, fault: FaultModel,
                faults: BlockFaults) -> torch.Tensor:
    """Any block format through its NumPy core on the host (float32 in, float32 out): the
    core's ``encode`` (and its errors), the faults at the block-form positions, the core's
    ``decode_blocks``."""
    arr = x.detach().cpu().numpy()
    lay = faults.layout
    planes = fmt.to_block_form(lay, fmt.encode(arr))
    for name, (pos, masks) in faults.host.items():
        words = np.array(planes[name], dtype=np.int64, copy=True)
        flat = words.reshape(-1)
        flat[pos] = fault.apply(flat[pos], masks)
        planes[name] = words.reshape(np.shape(planes[name]))
    values = lay.from_blocks(np.asarray(fmt.decode_blocks(planes), dtype=np.float32))
    return torch.from_numpy(np.ascontiguousarray(values)).to(x.device)


def faulty_blocks(x: torch.Tensor, fmt: BlockFormat, fault: FaultModel, faults: BlockFaults,
                  strict: bool = False) -> torch.Tensor:
    """Encode ``x`` (float16/32/64) in ``fmt``, apply ``fault`` at ``faults``, decode: a new
    tensor like ``x``. ``strict``: NaN, inf or an unstorable scale raise the core's error
    (otherwise they come out as whatever the arithmetic gives)."""
    x32 = x if x.dtype == torch.float32 else x.to(torch.float32)
    kernel = block_formats.kernel_for(fmt)
    if kernel is None or x.numel() == 0:
        out = core_blocks(x32, fmt, fault, faults)
        return out if x.dtype == torch.float32 else f32_to(out, x.dtype)
    if strict and not bool(torch.isfinite(x32).all()):
        fmt.encode(x32.cpu().numpy())  # raises the core's error, naming the value
    lay = faults.layout
    blocks = to_blocks(x32, lay)
    planes = kernel.encode(fmt, blocks)
    if strict and not kernel.storable(fmt, planes):
        fmt.encode(x32.cpu().numpy())  # raises the core's error (a scale it cannot store)
    fault_planes_(planes, faults, fault)
    out = from_blocks(kernel.decode(fmt, planes), lay)
    return out if x.dtype == torch.float32 else f32_to(out, x.dtype)


def native(fmt: BlockFormat) -> bool:
    """Whether ``fmt`` has a native tensor kernel (else the host fallback runs)."""
    return block_formats.kernel_for(fmt) is not None


register(BlockFormat, blocks=True)  # stored as planes in blocks (``BlockFaults``)

__all__ = ["CODES", "BlockFaults", "block_positions", "core_blocks", "fault_planes_",
           "faulty_blocks", "from_blocks", "native", "to_blocks"]
