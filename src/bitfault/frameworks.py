"""The adapter protocol and registry: what the jobs and the CLI ask of a framework.

An adapter is an object with the operations of ``Adapter`` (build, save, load and train
a model, run it on a sample, make a campaign evaluator, fault a saved model file); each
framework's lives in its own package (``bitfault.torch.adapter``, ``bitfault.keras.adapter``)
and is registered here by name and module path, beside what can be known about it without
importing it: the packages it needs, the model file suffixes it reads and the file a
trained model is saved as. ``adapter(name)`` imports the module on first use, so
importing bitfault loads no framework::

    from bitfault.frameworks import adapter

    torch_adapter = adapter("torch")       # imports torch now
    model = torch_adapter.builtin("seed_mlp")(hidden=64, seed=0)

A new framework is one adapter module (a module-level ``ADAPTER``) and one
``register_adapter`` call.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Adapter(Protocol):
    """The operations of one framework the jobs need (docs/frameworks.md)."""

    name: str          # the registered name ("torch")
    title: str         # how messages name it ("PyTorch")
    model_type: str    # what a model of it is, for errors ("a torch.nn.Module")
    model_file: str    # the file a trained model is saved as ("model.pt")
    output_suffix: str | None  # the suffix a faulty copy of a model file must have

    def builtin(self, name: str) -> Callable[..., Any]:
        """The factory of built-in model ``name`` (``bitfault.models``)."""
        ...

    def seed(self, seed: int) -> None:
        """Seed the framework's random generators (before a model is built)."""
        ...

    def set_threads(self, threads: int) -> None:
        """Use ``threads`` threads from now on (the framework is already imported)."""
        ...

    def is_model(self, obj: Any) -> bool:
        """Whether ``obj`` is a model of this framework."""
        ...

    def run_sample(self, model: Any, x: Any) -> None:
        """Run ``model`` in inference mode on the batch ``x`` (its mode left unchanged)."""
        ...

    def save_model(self, model: Any, path: Path) -> dict[str, Any]:
        """Write ``model`` to ``path``; returns what model.json must hold besides the
        name, kwargs and seed to rebuild it."""
        ...

    def prepare_model(self, info: Mapping[str, Any], build: Callable[[], Any]) -> Any:
        """What a saved model is loaded into (``build()`` where the file holds weights
        only; None where the file holds the whole model)."""
        ...

    def read_model(self, path: Path) -> Any:
        """The content of a file ``save_model`` wrote (raises what the framework raises)."""
        ...

    def restore_model(self, prepared: Any, content: Any) -> Any:
        """The loaded, eval-ready model from ``prepare_model``'s and ``read_model``'s
        results (RuntimeError or TypeError when they do not fit)."""
        ...

    def fit(self, model: Any, x: Any, y: Any, recipe: Any, **settings: Any) -> list[Any]:
        """Train ``model`` in place as ``recipe`` says; returns the epoch records."""
        ...

    def check_campaign(self, campaign: Any) -> None:
        """A ConfigError when the campaign settings ask what this framework cannot do."""
        ...

    def make_evaluator(self, model: Any, x: Any, y: Any, targets: Any) -> Any:
        """The campaign evaluator (``bitfault.campaign.Evaluator``) of ``model`` on (x, y)."""
        ...

    def inject_file(self, model_file: Any, output: Any, spec: Any, maps: Any,
                    overwrite: bool) -> dict[str, Any]:
        """Write a faulty copy of the saved model ``model_file`` to ``output``
        (``bitfault.jobs.inject_file``); returns what was faulted."""
        ...


@dataclass(frozen=True)
class Registration:
    """A registered adapter: where it lives and what is known before importing it."""

    name: str
    module: str                     # its module, holding ``ADAPTER``
    requires: tuple[str, ...] = ()  # packages it needs installed
    suffixes: tuple[str, ...] = ()  # model file suffixes it reads (lower case)


_REGISTRY: dict[str, Registration] = {}


def register_adapter(name: str, module_path: str, *, requires: Sequence[str] = (),
                     suffixes: Sequence[str] = ()) -> Registration:
    """Register the adapter ``ADAPTER`` of module ``module_path`` as ``name`` (the module
    is imported when ``adapter(name)`` first asks for it)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"adapter name: a non-empty string, got {name!r}")
    registration = Registration(name, module_path, tuple(requires),
                                tuple(s.lower() for s in suffixes))
    _REGISTRY[name] = registration
    return registration


def unregister_adapter(name: str) -> None:
    """Forget the adapter registered as ``name`` (a ValueError if there is none)."""
    registration(name)
    del _REGISTRY[name]


def registered() -> tuple[str, ...]:
    """The registered adapter names, in registration order."""
    return tuple(_REGISTRY)


def registration(name: str) -> Registration:
    """What is registered as ``name``; a ValueError listing the registered names."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"framework {name!r}: unknown; registered: "
                         f"{', '.join(_REGISTRY)}") from None


def adapter(name: str) -> Adapter:
    """The adapter registered as ``name`` (importing its module, and its framework)."""
    module = importlib.import_module(registration(name).module)
    found = module.ADAPTER
    if not isinstance(found, Adapter):
        raise TypeError(f"{registration(name).module}.ADAPTER does not have the operations "
                        "of bitfault.frameworks.Adapter")
    return found


def framework_for_suffix(suffix: str) -> str | None:
    """The adapter that reads model files ending in ``suffix`` (None: none does)."""
    for reg in _REGISTRY.values():
        if suffix.lower() in reg.suffixes:
            return reg.name
    return None


register_adapter("torch", "bitfault.torch.adapter", requires=("torch",),
                 suffixes=(".pt", ".pth"))
register_adapter("keras", "bitfault.keras.adapter", requires=("tensorflow", "keras"),
                 suffixes=(".keras",))
register_adapter("gguf", "bitfault.jobs.gguf_file", suffixes=(".gguf",))

__all__ = ["Adapter", "Registration", "adapter", "framework_for_suffix", "register_adapter",
           "registered", "registration", "unregister_adapter"]
