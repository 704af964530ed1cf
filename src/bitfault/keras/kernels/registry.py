"""Which kernels compute a format in TensorFlow, registered by format type.

Each family module registers what it computes (``register(FixedPoint, fault=...)``);
``kernels_for(fmt)`` answers with every role resolved along ``type(fmt)``'s MRO, so a
subclass of a format gets its parent's kernels. A role registered ``exact=True`` serves
only that very type (the block formats' arithmetic: a subclass may change it). The same
API as ``bitfault.torch.kernels.registry``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any


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


_ROLES = tuple(f.name for f in fields(Kernels))
_REGISTRY: dict[type, dict[str, tuple[Any, bool]]] = {}


def register(format_type: type, *, exact: bool = False, **roles: Any) -> None:
    """Register kernels of ``format_type`` by role (the fields of ``Kernels``); ``exact``:
    they serve that type alone, not its subclasses."""
    unknown = set(roles) - set(_ROLES)
    if unknown:
        raise TypeError(f"unknown kernel roles {sorted(unknown)}; roles: {list(_ROLES)}")
    entry = _REGISTRY.setdefault(format_type, {})
    entry.update({role: (kernel, exact) for role, kernel in roles.items()})
    _resolved.cache_clear()


@functools.cache
def _resolved(format_type: type) -> Kernels:
    found: dict[str, Any] = {}
    for t in format_type.__mro__:
        for role, (kernel, exact) in _REGISTRY.get(t, {}).items():
            if role not in found and (not exact or t is format_type):
                found[role] = kernel
    return Kernels(**found)


def kernels_for(fmt: Any) -> Kernels:
    """The kernels that compute ``fmt`` (roles it has none for are None)."""
    return _resolved(type(fmt))


def registered(blocks: bool) -> list[str]:
    """The names of the format types with a fault kernel, in registration order: the block
    formats or the others."""
    return [t.__name__ for t, roles in _REGISTRY.items()
            if "fault" in roles and _resolved(t).blocks == blocks]


__all__ = ["Kernels", "kernels_for", "register", "registered"]
