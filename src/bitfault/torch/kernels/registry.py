"""Which kernels compute a format in PyTorch, registered by format type.

Each family module registers what it computes (``register(FixedPoint, encode=...)``);
``kernels_for(fmt)`` answers with every role resolved along ``type(fmt)``'s MRO, so a
subclass of a format gets its parent's kernels. A role registered ``exact=True`` serves
only that very type: a subclass may change the arithmetic, and gets the parent's
general path instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bitfault.formats.kernel_registry import KernelRegistry


@dataclass(frozen=True)
class Kernels:
    """A format's kernels in PyTorch, by role; None where it has none.

    ``encode(x, fmt, calib) -> words`` and ``decode(words, fmt, calib, dtype)``: the
    generic path (int64 words in the low ``fmt.bits`` bits); ``calibrate(x, fmt)``: the
    per-tensor constants of a format whose words depend on the tensor; ``fast_f32(xs, fmt,
    fault, faults, buffers, strict)``: the float32 fast path of a group of tensors, or None
    where it does not apply; ``compiled``: the Numba one-pass loops (``Compiled``);
    ``blocks``: the format stores planes in blocks; ``block``: its native block arithmetic
    (else the NumPy core runs on the host); ``block_bind``: its compiled block pass.
    """

    encode: Callable | None = None
    decode: Callable | None = None
    calibrate: Callable | None = None
    fast_f32: Callable | None = None
    compiled: Compiled | None = None
    blocks: bool = False
    block: Any = None
    block_bind: Callable | None = None


@dataclass(frozen=True)
class Compiled:
    """The compiled CPU loops of a format: ``accepts(fmt, ndim)``: whether they compute
    ``fmt`` on a float32 tensor of ``ndim`` dimensions; ``bind(fmt, fault, index, masks,
    shape)`` returns ``call(x, out, check=False)``; ``strict``: whether they may run where
    the core's errors must be raised."""

    accepts: Callable[[Any, int], bool]
    bind: Callable
    strict: bool = True


REGISTRY: KernelRegistry[Kernels] = KernelRegistry(Kernels)
register = REGISTRY.register
kernels_for = REGISTRY.kernels_for


def registered(role: str) -> list[str]:
    """The names of the format types with a kernel for ``role`` (for error messages)."""
    return sorted(t.__name__ for t in REGISTRY.types_with(role))


__all__ = ["REGISTRY", "Compiled", "Kernels", "kernels_for", "register", "registered"]
