"""Config files: YAML (``.yaml``/``.yml``, needs PyYAML), TOML and JSON, and ``load_config``.

A file is at most ``MAX_CONFIG_BYTES`` long, a YAML file's aliases expand to at most
``MAX_CONFIG_NODES`` values (checked before they are expanded), and a file without a
setting (empty, only comments, ``{}``) is an error in every syntax.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from bitfault.config.checks import MAX_CONFIG_BYTES, ConfigTooLarge, count_nodes
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
    size = os.path.getsize(path)
    if size > MAX_CONFIG_BYTES:
        raise ValueError(f"{path}: {size:,} bytes; a {what} file holds at most "
                         f"{MAX_CONFIG_BYTES:,} bytes")
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
                data = _safe_yaml(yaml, fh)
    except ModuleNotFoundError:
        raise
    except ConfigTooLarge as exc:
        raise ValueError(f"{path}: {exc}") from None
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(f"{path}: not valid {ext[1:].upper()} ({type(exc).__name__}: "
                         f"{first})") from None
    if data is None or (isinstance(data, Mapping) and not data):
        raise ValueError(f"{path}: empty {what} file (no settings); a {what} is a mapping of "
                         "keys, see the README's 'Command line'")
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: a {what} is a mapping at the top level, got "
                         f"{type(data).__name__}")
    return dict(data)


def _safe_yaml(yaml: Any, stream: Any) -> Any:
    """``yaml.safe_load``, refusing a document whose aliases expand past
    ``MAX_CONFIG_NODES`` values before building it."""
    loader = yaml.SafeLoader(stream)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        count_nodes(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_config(source: str | os.PathLike[str] | Mapping[str, Any] | RunConfig) -> RunConfig:
    """A validated RunConfig from a config file path, a dict, or a RunConfig."""
    if isinstance(source, RunConfig):
        return source
    if isinstance(source, Mapping):
        return config_from_dict(source)
    return config_from_dict(read_config_file(source))


__all__ = ["load_config", "read_config_file"]
