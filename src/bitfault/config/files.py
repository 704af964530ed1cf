"""Config files: YAML (``.yaml``/``.yml``, needs PyYAML), TOML and JSON, and ``load_config``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from bitfault.config.schema import RunConfig
from bitfault.config.validate import config_from_dict


def read_config_file(path: str | os.PathLike[str], what: str = "config") -> dict[str, Any]:
    """Parse a .yaml/.yml/.toml/.json file into a dict (not yet validated); ``what`` the file
    holds ("config", "spec") names it in errors."""
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such {what} file")
    if ext not in (".yaml", ".yml", ".toml", ".json"):
        raise ValueError(f"{path}: {what} files end in .yaml, .yml, .toml or .json")
    try:
        if ext == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                try:
                    import tomli as tomllib
                except ModuleNotFoundError:
                    raise ModuleNotFoundError(f"{path}: reading TOML on Python 3.10 needs "
                                              "tomli: pip install tomli") from None

            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        elif ext == ".json":
            import json

            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        else:
            try:
                import yaml
            except ModuleNotFoundError:
                raise ModuleNotFoundError(f"{path}: reading YAML {what}s needs PyYAML: pip "
                                          "install pyyaml (or 'bitfault[cli]')") from None
            with open(path, encoding="utf-8") as fh:
                data = yaml.safe_load(fh)
    except ModuleNotFoundError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(f"{path}: not valid {ext[1:].upper()} ({type(exc).__name__}: "
                         f"{first})") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: a {what} is a mapping at the top level, got "
                         f"{type(data).__name__}")
    return dict(data)


def load_config(source: str | os.PathLike[str] | Mapping[str, Any] | RunConfig) -> RunConfig:
    """A validated RunConfig from a config file path, a dict, or a RunConfig."""
    if isinstance(source, RunConfig):
        return source
    if isinstance(source, Mapping):
        return config_from_dict(source)
    return config_from_dict(read_config_file(source))


__all__ = ["load_config", "read_config_file"]
