"""Config sections the library builds itself: its ArgumentError becomes a ConfigError
naming the key (``built``); ``campaign.memory``, one storage mapping or a list of named
ones to compare (``storage_section``). Framework-free."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from bitfault.config.schema import ConfigError
from bitfault.errors import ArgumentError, ArgumentTypeError

_SCHEME = re.compile(r"[A-Za-z0-9_+-]{1,64}")


def built(key: str, value: Any, build: Any) -> Any:
    """Run a library constructor; its ArgumentError (ArgumentTypeError) becomes a
    ConfigError at ``key``, read from the error's attributes, never from its text.

    The error names the argument that failed: when ``value`` is a mapping with that key,
    the ConfigError names it (``recipes[0].randbet`` -> ``recipes[0].randbet.p_train``)
    and shows its value; a nested argument (``randbet.fault``, ``fault kind``) names the
    key of its first part. ``allowed`` is the error's requirement.
    """
    try:
        return build()
    except (ArgumentError, ArgumentTypeError) as exc:
        first = exc.argument.replace(" ", ".").split(".", 1)[0]
        if isinstance(value, Mapping) and first in value:
            key, value = f"{key}.{first}", value[first]
        raise ConfigError(key, value, exc.requirement) from None


def storage_section(value: Any) -> dict[str, Any] | tuple[dict[str, Any], ...] | None:
    """``campaign.memory``: a storage mapping, or a list of named ones to compare, checked
    now (their fit to each recipe's format when that recipe's campaign is planned)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return _schemes(value)
    if not isinstance(value, Mapping):
        raise ConfigError("campaign.memory", value, "a mapping such as {word_bits: 64, "
                          "protection: secded, pattern: {kind: mbu, sizes: {1: 0.8, 2: 0.2}}}, "
                          "or a list of such mappings, each with a name")
    return _storage_dict("campaign.memory", value)


def _storage_dict(key: str, value: Mapping[str, Any]) -> dict[str, Any]:
    from bitfault.memory.storage import Storage

    return built(key, value, lambda: Storage.from_dict(value)).to_dict()


def _schemes(value: list[Any] | tuple[Any, ...]) -> tuple[dict[str, Any], ...]:
    """``campaign.memory`` as a list: named memories ``{name, **storage}``, the names
    distinct ignoring case (each names a folder of stores)."""
    if not value:
        raise ConfigError("campaign.memory", list(value), "a non-empty list of named memories, "
                          "e.g. [{name: none}, {name: secded, protection: secded}]")
    out: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(value):
        key = f"campaign.memory[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(key, entry, "a mapping with a name and the storage keys "
                              "word_bits, row_words, protection, pattern")
        name = entry.get("name")
        if not isinstance(name, str) or not _SCHEME.fullmatch(name):
            raise ConfigError(f"{key}.name", name, "a name of 1 to 64 letters, digits and "
                              "_ + - (it names a folder of stores)")
        if name.lower() in seen:
            raise ConfigError(f"{key}.name", name, f"a name no other memory uses (ignoring "
                              f"case; campaign.memory[{seen[name.lower()]}] is "
                              f"{value[seen[name.lower()]]['name']!r})")
        seen[name.lower()] = i
        rest = {k: v for k, v in entry.items() if k != "name"}
        out.append({"name": name, **_storage_dict(key, rest)})
    return tuple(out)


__all__ = ["built", "storage_section"]
