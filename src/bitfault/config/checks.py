"""Bounds on what a config may ask for, and the paths it names.

A config file is read only up to ``MAX_CONFIG_BYTES``, and a YAML file whose aliases
expand to more than ``MAX_CONFIG_NODES`` values is refused before it is built (an "alias
bomb" expands a few lines into millions). Counts have upper bounds far above any real run
(``MAX_EPOCHS``, ...), so a typo such as ``epochs: 1000000`` is an error, not a week of
training. Paths expand ``~`` as a shell does. Framework-free.
"""

from __future__ import annotations

import os
from typing import Any

from bitfault.config.schema import ConfigError

MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: real configs are a few kB
MAX_CONFIG_NODES = 100_000  # values in a config, aliases expanded
MAX_EPOCHS = 10_000  # train.epochs
MAX_BATCH_SIZE = 1 << 20  # train.batch_size
MAX_HIDDEN = 1 << 16  # model.kwargs.hidden (seed_mlp's width)
MAX_CAMPAIGN_BATCH = 4096  # campaign.batch: trials (fault-map sets) per evaluator call
MAX_TEXT_COUNT = 1 << 20  # data.context, data.windows of a pretrained model's text


def user_path(value: Any, key: str, what: str) -> str:
    """``value`` as a path: a non-empty string without NUL characters, ``~`` and
    ``~user`` expanded as a shell expands them (a literal ``./~`` folder is never made);
    else a ConfigError naming ``key`` (``what`` says what the path is)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(key, value, what)
    if "\0" in value:
        raise ConfigError(key, value, f"{what}, without NUL characters (no file system "
                          "takes them)")
    path = os.path.expanduser(value)
    if path.startswith("~"):
        user = path[1:].split("/", 1)[0]
        raise ConfigError(key, value, f"{what}; '~{user}' names no user's home directory "
                          "here (write the path out)")
    return path


class ConfigTooLarge(ValueError):
    """A config that expands past ``MAX_CONFIG_NODES`` values, or into itself."""


def count_nodes(node: Any, limit: int = MAX_CONFIG_NODES) -> int:
    """The values a composed YAML node stands for once its aliases are expanded (a shared
    node counts each time it is used), without expanding them; stops with ConfigTooLarge as
    soon as the count passes ``limit`` (or a node contains itself)."""
    memo: dict[int, int] = {}
    active: set[int] = set()

    def count(n: Any) -> int:
        key = id(n)
        if key in memo:
            return memo[key]
        if key in active:
            raise ConfigTooLarge("an alias refers to a value that contains it")
        active.add(key)
        value = n.value
        total = 1
        if isinstance(value, list):
            for item in value:
                for child in (item if isinstance(item, tuple) else (item,)):
                    total += count(child)
                    if total > limit:
                        raise ConfigTooLarge(f"more than {limit:,} values once its aliases are "
                                             "expanded; a config holds at most that many")
        active.discard(key)
        memo[key] = total
        return total

    return count(node)


__all__ = ["MAX_BATCH_SIZE", "MAX_CAMPAIGN_BATCH", "MAX_CONFIG_BYTES", "MAX_CONFIG_NODES",
           "MAX_EPOCHS", "MAX_HIDDEN", "MAX_TEXT_COUNT", "ConfigTooLarge", "count_nodes",
           "user_path"]
