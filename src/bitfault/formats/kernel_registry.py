"""A backend's kernels by format type: the one registry both adapters build theirs from.

A backend declares its roles as the fields of a frozen dataclass (``Kernels``); each
family module registers what it computes (``registry.register(FixedPoint, encode=...)``).
``kernels_for(fmt)`` answers with every role resolved along ``type(fmt)``'s MRO, so a
subclass of a format gets its parent's kernels; a role registered ``exact=True`` serves
that very type alone (a subclass may change the arithmetic, and takes the general path).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Generic, TypeVar

K = TypeVar("K")


class KernelRegistry(Generic[K]):
    """Kernels of one backend, by format type and role (the fields of ``kernels_type``)."""

    def __init__(self, kernels_type: type[K]) -> None:
        self.kernels_type = kernels_type
        self.roles = tuple(f.name for f in fields(kernels_type))  # type: ignore[arg-type]
        self._entries: dict[type, dict[str, tuple[Any, bool]]] = {}
        self._resolved: dict[type, K] = {}

    def register(self, format_type: type, *, exact: bool = False, **roles: Any) -> None:
        """Register kernels of ``format_type`` by role; ``exact``: they serve that type
        alone, not its subclasses."""
        unknown = set(roles) - set(self.roles)
        if unknown:
            raise TypeError(f"unknown kernel roles {sorted(unknown)}; roles: {list(self.roles)}")
        entry = self._entries.setdefault(format_type, {})
        entry.update({role: (kernel, exact) for role, kernel in roles.items()})
        self._resolved.clear()

    def resolve(self, format_type: type) -> K:
        """The kernels of ``format_type``: each role from the nearest type that has it."""
        found = self._resolved.get(format_type)
        if found is None:
            roles: dict[str, Any] = {}
            for t in format_type.__mro__:
                for role, (kernel, exact) in self._entries.get(t, {}).items():
                    if role not in roles and (not exact or t is format_type):
                        roles[role] = kernel
            found = self._resolved[format_type] = self.kernels_type(**roles)
        return found

    def kernels_for(self, fmt: Any) -> K:
        """The kernels that compute ``fmt`` (roles it has none for keep their defaults)."""
        return self.resolve(type(fmt))

    def types_with(self, role: str) -> list[type]:
        """The format types registered with a kernel for ``role``, in registration order."""
        return [t for t, entry in self._entries.items() if role in entry]


__all__ = ["KernelRegistry"]
