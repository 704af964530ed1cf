"""PyTorch adapter: inject faults into any ``nn.Module`` and train through them.

    import bitfault as bf
    from bitfault.torch import inject_

    spec = bf.FaultSpec(format=bf.FixedPoint(32, 28, rounding="trunc"), ber=1e-3, seed=0)
    handle = inject_(model, spec)       # in place: hooks only, weights stay clean
    ...train or evaluate as usual...    # forward sees faulty values, gradients reach W
    handle.remove()                     # the model is exactly as before

``inject`` is the tensor-level twin of ``bitfault.inject``: the same bits, on a
torch tensor, on its device. Importing this module imports torch.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - exercised only without torch
    raise ModuleNotFoundError(
        "bitfault.torch needs PyTorch: pip install 'bitfault[torch]' (or torch itself)") from exc

from bitfault.torch._inject import DEFAULT_MODULES, FaultHandle, batch_map, inject_
from bitfault.torch._tensor import inject

__all__ = ["DEFAULT_MODULES", "FaultHandle", "batch_map", "inject", "inject_"]
