"""``inject`` for one torch tensor: ``bitfault.inject``'s bits without leaving the device."""

from __future__ import annotations

from typing import Any

import torch

from bitfault.faults import check_fault_model
from bitfault.formats import Format, is_format
from bitfault.maps import FaultMap
from bitfault.memory import check_map_fits
from bitfault.torch import _fused
from bitfault.torch._kernels import (
    DeviceFaults,
    check_float_dtype,
    compiled_for,
    faulty_group,
)


def inject(x: torch.Tensor, fmt: Format, fault: Any, fmap: FaultMap) -> torch.Tensor:
    """The faulty values of ``x``: encode in ``fmt``, apply ``fault`` at ``fmap``, decode.

    Bit for bit ``bitfault.inject(x.numpy(), fmt, fault, fmap)`` for float16,
    float32 and float64 tensors; bfloat16 is computed on the exact float32 copy
    and rounded back by PyTorch's cast. Returns a new tensor (no autograd graph)
    of x's shape, dtype and device; an IntQuant tensor with NaN or inf raises
    ValueError, as the core does.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    check_float_dtype(x.dtype, "x")
    if not is_format(fmt):
        raise TypeError(f"fmt must be a bitfault format (FixedPoint, IntQuant, Float), got {fmt!r}")
    check_fault_model(fault)
    check_map_fits(fmap, tuple(x.shape), fmt)
    if compiled_for(x, fmt):  # the compiled pass, straight from the map
        out = torch.empty(tuple(x.shape), dtype=torch.float32)
        if _fused.bind_map(fmt, fault, fmap)(x.detach().reshape(-1).numpy(),
                                              out.view(-1).numpy()):
            return out
        # an IntQuant tensor with NaN or inf: the PyTorch path raises the core's error
    faults = DeviceFaults.build([fmap], fault.eligible_mask(fmt), x.device)
    with torch.no_grad():
        return faulty_group([x.detach()], fmt, fault, faults, strict=True)[0]
