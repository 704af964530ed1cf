"""The forward-time wiring ``inject_`` puts on a model, kept apart from ``FaultHandle``.

``LIVE`` says which handle injects into a module (one per module), ``DIRECT`` what a
chosen module's own ``forward`` needs when it is called outside a forward of the model.
``bind`` wraps a handle's hook in a plain function; ``faulted_forward`` is the instance
``forward`` of a chosen module; ``release`` takes both off a module again.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from bitfault.torch.slots import original_forward

Attrs = tuple[tuple[str, str], ...]  # (attribute, tensor name) of a module's faulted parameters
# module -> the live handle (a FaultHandle) that injects into it (one handle per module)
LIVE: weakref.WeakKeyDictionary[nn.Module, Any] = weakref.WeakKeyDictionary()
# module -> (handle, its name, (attribute, tensor name) of each faulted parameter): what its
# overridden forward needs when it is called on its own
DIRECT: weakref.WeakKeyDictionary[nn.Module, tuple[Any, str, Attrs]] = \
    weakref.WeakKeyDictionary()


def injected(model: nn.Module) -> bool:
    """Whether a live handle injects faults into any module of ``model``."""
    return any(m in LIVE for m in model.modules())


def faulted_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A chosen module's ``forward`` while faults are injected (cheaper than a pre-hook, which
    sends every call through ``nn.Module``'s slow path): within a forward of the model its
    parameters are already shadowed; called on its own, it shadows them for the call."""
    entry = DIRECT.get(module)
    if entry is not None and not entry[0].removed:
        handle, fqn, attrs = entry
        for attr, _ in attrs:
            if attr not in module.__dict__:
                return handle.call_alone(fqn, attrs, module, args, kwargs)
    return original_forward(module)(*args, **kwargs)


def bind(fn: Callable[..., Any], *bound: Any) -> Callable[..., Any]:
    """A hook calling ``fn``: a plain function, which ``copy.deepcopy`` shares rather than
    copies, so a copied model's hooks still answer to this handle (and go inert with it).
    ``torch.compile`` runs it eagerly, between compiled graphs (it cannot trace Numba)."""
    def hook(*args: Any) -> Any:
        return fn(*bound, *args)
    return torch.compiler.disable(hook, recursive=True)


def release(module: nn.Module, handle: Any) -> None:
    """Take ``handle``'s entries and instance ``forward`` off ``module`` (others' stay)."""
    if LIVE.get(module) is handle:
        del LIVE[module]
    if DIRECT.get(module, (None,))[0] is handle:
        del DIRECT[module]
        module.__dict__.pop("forward", None)
        original = module.__dict__.pop("_bitfault_forward", None)
        if original is not None:
            module.forward = original


__all__ = ["DIRECT", "LIVE", "Attrs", "bind", "faulted_forward", "injected", "release"]
