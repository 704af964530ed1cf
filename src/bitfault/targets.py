"""Targets: the one vocabulary for which tensors of a model are faulted.

A tensor has a name in PyTorch's form (``"fc1.weight"``, ``"fc1.bias"``,
``"fc1.output"`` for a module's activations, ``"bn.running_mean"``) and a kind:
"weights", "biases", "activations" or "buffers". ``Targets`` chooses tensors by
kind, then keeps those whose name matches an ``include`` pattern (all, when there
is none) and matches no ``exclude`` pattern (``fnmatch`` patterns, case-sensitive:
``"fc*.weight"``, ``"encoder.*"``).

Every entry point chooses through it: ``bitfault.torch.select_tensors`` and
``bitfault.keras.select_tensors`` (``inject_`` / ``inject``, the evaluators, ``fit``,
``bitfault inject``, config files). Without include patterns the candidates are the
weights (and biases, outputs) of Linear, Conv and Embedding modules (Dense, Conv,
EinsumDense and Embedding layers); include patterns name tensors of any module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from bitfault.errors import ArgumentError, ArgumentTypeError, check_choice

KINDS = ("weights", "biases", "activations", "buffers")
_KEYS = ("kinds", "include", "exclude")


def kind_of(name: str, buffer: bool = False) -> str:
    """The kind of tensor ``name`` (PyTorch naming), from the last part of the name.

    ``*.output`` is "activations"; a buffer (``buffer=True``: running statistics,
    masks) is "buffers"; a parameter whose name ends in ``bias`` (``fc.bias``,
    ``attn.in_proj_bias``) is "biases"; every other parameter (``*.weight``,
    ``in_proj_weight``, embeddings, scales) is "weights".
    """
    last = name.rsplit(".", 1)[-1]
    if last == "output":
        return "activations"
    if buffer:
        return "buffers"
    return "biases" if last.endswith("bias") else "weights"


def _strings(value: Any, argument: str) -> tuple[str, ...]:
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, Sequence) or not all(isinstance(p, str) and p for p in items):
        raise ArgumentTypeError(argument, value, "a pattern or a list of non-empty patterns")
    return tuple(dict.fromkeys(items))


@dataclass(frozen=True)
class Targets:
    """Which tensors are faulted: ``kinds`` narrowed by ``include`` / ``exclude`` patterns."""

    kinds: tuple[str, ...] = ("weights",)
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", _kinds(self.kinds, KINDS, "targets.kinds"))
        object.__setattr__(self, "include", _strings(self.include, "targets.include"))
        object.__setattr__(self, "exclude", _strings(self.exclude, "targets.exclude"))

    @property
    def has_patterns(self) -> bool:
        """Whether names narrow the kinds (``include`` or ``exclude`` given)."""
        return bool(self.include or self.exclude)

    def __contains__(self, kind: object) -> bool:
        """Whether ``kind`` (``"weights"``, ...) is one of the targeted kinds."""
        return kind in self.kinds

    def unmatched(self, names: Iterable[str]) -> list[str]:
        """The include patterns that match none of ``names`` (a typo, or a tensor the model
        lacks)."""
        names = list(names)
        return [p for p in self.include if not any(fnmatchcase(n, p) for n in names)]

    def order(self, names: Iterable[str]) -> list[str]:
        """``names`` in the order of the first include pattern each matches (a list of tensor
        names keeps its order), model order within one pattern and without patterns."""
        names = list(names)
        if not self.include:
            return names

        def rank(name: str) -> int:
            return next((i for i, p in enumerate(self.include) if fnmatchcase(name, p)),
                        len(self.include))
        return sorted(names, key=rank)

    def describe(self) -> Any:
        """The JSON form users write: the list of kinds when no pattern narrows them (as a
        spec's ``targets`` has always been written), else ``to_dict()``."""
        return self.to_dict() if self.has_patterns else list(self.kinds)

    def selects(self, name: str, kind: str | None = None) -> bool:
        """Whether tensor ``name`` (of ``kind``; by default ``kind_of(name)``) is a target."""
        if (kind or kind_of(name)) not in self.kinds:
            return False
        if self.include and not any(fnmatchcase(name, p) for p in self.include):
            return False
        return not any(fnmatchcase(name, p) for p in self.exclude)

    @classmethod
    def coerce(cls, value: Any, kinds: tuple[str, ...] = KINDS, argument: str = "targets",
               names: bool = True) -> Targets:
        """Targets from what users write: a Targets, a kind (``"weights"``), kinds joined by
        ``+`` (``"weights+biases"``, the config form), a sequence of kinds, a sequence of
        tensor names (every kind, just those tensors; only if ``names``) or a dict with
        ``kinds`` / ``include`` / ``exclude``. ``kinds`` are those the caller supports."""
        if isinstance(value, Targets):
            found = value
        elif isinstance(value, Mapping):
            found = cls.from_dict(value)
        elif isinstance(value, str):
            parts = value.split("+") if "+" in value else [value]
            return cls(_kinds(parts, kinds, argument))
        else:
            try:
                items = tuple(value)
            except TypeError:
                raise ArgumentTypeError(argument, value,
                                        f"one of {kinds} or a sequence of them") from None
            if names and items and all(isinstance(t, str) and t not in KINDS for t in items):
                found = cls(kinds, include=items)
            else:
                return cls(_kinds(items, kinds, argument))
        _kinds(found.kinds, kinds, argument)
        if found.has_patterns and not names:
            raise ArgumentError(argument, value, f"kinds only (one of {kinds} or a sequence of "
                                "them); choose tensors by name with the adapter's filter")
        return found

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``Targets.from_dict`` rebuilds an equal value."""
        return {"kinds": list(self.kinds), "include": list(self.include),
                "exclude": list(self.exclude)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Targets:
        if not isinstance(data, Mapping):
            raise ArgumentTypeError("targets", data, "a mapping",
                                    tail=f", got {type(data).__name__}")
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            raise ArgumentError("data", unknown, f"keys of {list(_KEYS)}",
                                requirement=f"unknown targets key(s) {unknown}; allowed: "
                                            f"{list(_KEYS)}")
        kinds = data.get("kinds", ("weights",))
        return cls((kinds,) if isinstance(kinds, str) else tuple(kinds),
                   _strings(data.get("include", ()), "targets.include"),
                   _strings(data.get("exclude", ()), "targets.exclude"))


def _kinds(items: Any, allowed: tuple[str, ...], argument: str) -> tuple[str, ...]:
    """``items`` as distinct kinds of ``allowed``, in its order; errors name ``argument``."""
    if isinstance(items, str):
        items = (items,)
    try:
        items = tuple(items)
    except TypeError:
        raise ArgumentTypeError(argument, items,
                                f"one of {allowed} or a sequence of them") from None
    if not items:
        raise ArgumentError(argument, list(items), f"at least one of {allowed}",
                            requirement=f"{argument} must name at least one of {allowed}")
    for t in items:
        check_choice(t, allowed, argument)
    return tuple(t for t in allowed if t in items)


__all__ = ["KINDS", "Targets", "kind_of"]
