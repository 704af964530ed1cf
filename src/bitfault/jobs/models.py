"""Models for jobs: build from a config (built-in or ``module:callable``), save, reload.

Frameworks are imported when a function needs them. A saved model is rebuilt from
``model.json`` (framework, name, kwargs, seed, bounded ReLUs) plus its weights, so a
user model needs its module importable again when the run is reused. ``model.json``
could name any callable, so only the built-in models load from it unless the caller
trusts the name (its own config names it, or ``trusted=True``): opening a run
directory someone else made never runs their code.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from bitfault.config import BUILTIN_MODELS, FRAMEWORKS, ConfigError, ModelConfig
from bitfault.frameworks import Adapter, adapter
from bitfault.jobs.run_dir import read_json, write_json


def resolve_callable(name: str) -> Any:
    """``"package.module:attr.path"`` -> the object; errors name ``model.name``."""
    module_name, _, attr = name.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError("model.name", name, f"'package.module:callable' with an importable "
                          f"module ({type(exc).__name__}: {exc})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError("model.name", name, f"'package.module:callable'; module "
                              f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError("model.name", name, f"a callable; {attr!r} is a "
                          f"{type(obj).__name__}")
    return obj


def _adapter(framework: Any) -> Adapter:
    """The adapter of a trainable framework (config.FRAMEWORKS); else a ConfigError."""
    if framework not in FRAMEWORKS:
        raise ConfigError("framework", framework, ", ".join(FRAMEWORKS))
    return adapter(framework)


def build_model(model: ModelConfig, framework: str, seed: int = 0) -> Any:
    """A fresh model: the built-in of that framework, or the user's callable(**kwargs)."""
    ad = _adapter(framework)
    kwargs = dict(model.kwargs)
    if model.builtin:
        factory = ad.builtin(model.name)
        kwargs.setdefault("seed", seed)
        if "channels" in kwargs:
            kwargs["channels"] = tuple(kwargs["channels"])
    else:
        factory = resolve_callable(model.name)
    ad.seed(seed)
    try:
        built = factory(**kwargs)
    except TypeError as exc:
        raise ConfigError("model.kwargs", dict(model.kwargs),
                          f"keyword arguments that {model.name} accepts ({exc})") from None
    if not ad.is_model(built):
        raise ConfigError("model.name", model.name, f"a callable returning {ad.model_type} "
                          f"(framework {framework!r}); it returned a {type(built).__name__}")
    return built


def check_model_input(model: Any, framework: str, x: Any, what: str) -> None:
    """Run ``model`` (eval mode, no gradients) on the first sample of ``x``; a ValueError
    naming ``what`` (where the data comes from) when the model cannot take such samples,
    found before training writes anything."""
    ad = _adapter(framework)
    try:
        ad.run_sample(model, x[:1])
    except (ImportError, MemoryError):
        raise
    except Exception as exc:  # torch and keras raise many kinds for a shape mismatch
        raise ValueError(f"{what}: samples of shape {tuple(x.shape[1:])} do not fit the model "
                         f"({_first_line(exc)})") from None


def save_model(model: Any, directory: str | os.PathLike[str], framework: str,
               spec: ModelConfig, seed: int) -> Path:
    """Write the weights (model.pt / model.keras) and model.json into ``directory``."""
    ad = _adapter(framework)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ad.model_file
    info: dict[str, Any] = {"framework": framework, "name": spec.name,
                            "kwargs": dict(spec.kwargs), "seed": seed}
    info.update(ad.save_model(model, path))
    write_json(directory / "model.json", info)
    return path


class UntrustedModel(ValueError):
    """A model.json naming code the caller did not say to trust."""


def check_trusted(info: dict[str, Any], path: Path, trusted: str | bool) -> None:
    """Refuse a model.json that names a callable other than a built-in or ``trusted``."""
    name = info.get("name")
    if not isinstance(name, str):
        raise ValueError(f"{path}: 'name' must be a model name, got {name!r}")
    if name in BUILTIN_MODELS or trusted is True or name == trusted:
        return
    raise UntrustedModel(
        f"{path}: names the callable {name!r}, and loading it would run that code; pass the "
        "config that trained it (bitfault campaign CONFIG), or --trust-model-code "
        "(trust_model_code=True) if you trust whoever wrote this run directory")


def load_model(directory: str | os.PathLike[str], *, trusted: str | bool = False) -> Any:
    """The model saved by ``save_model`` in ``directory`` (eval-ready, weights loaded).

    ``trusted``: the one ``package.module:callable`` allowed besides the built-ins (the
    caller's own config's ``model.name``), or True for any."""
    directory = Path(directory)
    info = read_json(directory / "model.json")
    if not isinstance(info, dict):
        raise ValueError(f"{directory / 'model.json'}: not a model description (a mapping)")
    framework = info.get("framework")
    ad = _adapter(framework)
    check_trusted(info, directory / "model.json", trusted)
    spec = ModelConfig(info["name"], info.get("kwargs") or {})
    path = directory / ad.model_file
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (the model was not saved)")
    if not spec.builtin:
        resolve_callable(spec.name)  # registers the user's custom objects, if any
    prepared = ad.prepare_model(info, lambda: build_model(spec, framework, info.get("seed", 0)))
    content = _read(path, lambda: ad.read_model(path))
    try:
        return ad.restore_model(prepared, content)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"{path}: does not fit the model model.json describes "
                         f"({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    """The first sentence of an error's first line (libraries append paragraphs of advice)."""
    lines = str(exc).strip().splitlines()
    line = lines[0] if lines else ""
    if len(line) > 160:
        end = line.find(". ")
        line = line[:end + 1] if 0 < end < 160 else line[:157] + "..."
    return f"{type(exc).__name__}: {line}".rstrip(": ")


def _read(path: Path, load: Any) -> Any:
    """``load()``, its failure one error naming ``path`` and the cause."""
    try:
        return load()
    except (ImportError, MemoryError):
        raise
    except Exception as exc:  # torch/keras raise many kinds for a garbled file
        raise ValueError(f"{path}: cannot be read, it may be truncated or not a saved model "
                         f"({_first_line(exc)}); train it again: bitfault train CONFIG "
                         f"--retrain") from None


__all__ = ["UntrustedModel", "build_model", "check_model_input", "check_trusted", "load_model",
           "resolve_callable", "save_model"]
