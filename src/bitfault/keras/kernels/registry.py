"""Which kernels compute a format in TensorFlow, registered by format type.

Each family module registers what it computes (``register(FixedPoint, fault=...)``);
``kernels_for(fmt)`` answers with every role resolved along ``type(fmt)``'s MRO, so a
subclass of a format gets its parent's kernels. A role registered ``exact=True`` serves
only that very type (the block formats' arithmetic: a subclass may change it). The same
API as ``bitfault.torch.kernels.registry``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bitfault.formats.kernel_registry import KernelRegistry


@dataclass(frozen=True)
class Kernels:
    """A format's kernels in TensorFlow, by role; None where it has none.

    ``fault(fmt, fault, axis) -> (x, mask) -> faulty x``: encode, fault and decode one
    tensor (``axis``: IntQuant's channel axis, or the axis a block format's blocks run
    along; then ``mask`` is one mask per plane); ``check(fmt)``: raises for a setting a
    compiled graph cannot run; ``blocks``: the format stores planes in blocks.
    """

    fault: Callable | None = None
    check: Callable | None = None
    blocks: bool = False


REGISTRY: KernelRegistry[Kernels] = KernelRegistry(Kernels)
register = REGISTRY.register
kernels_for = REGISTRY.kernels_for


def registered(blocks: bool) -> list[str]:
    """The names of the format types with a fault kernel, in registration order: the block
    formats or the others."""
    return [t.__name__ for t in REGISTRY.types_with("fault")
            if REGISTRY.resolve(t).blocks == blocks]


__all__ = ["REGISTRY", "Kernels", "kernels_for", "register", "registered"]
