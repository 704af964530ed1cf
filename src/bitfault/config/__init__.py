"""Run configs: one validated description of a train + campaign + report run.

``load_config(path_or_dict)`` reads YAML (``.yaml``/``.yml``, needs PyYAML), TOML
(``.toml``) or JSON, or takes a dict, and returns a frozen :class:`RunConfig`. Every
mistake is a :class:`ConfigError` naming the dotted key (``.key``), the value (``.value``)
and what is allowed (``.allowed``)::

    config key 'train.epochs': got -1; allowed: a positive integer

``schema.py`` holds the frozen sections, ``validate.py`` the checks, ``files.py`` the
file formats. Framework-free: nothing here imports torch or keras.
"""

from bitfault.config.files import load_config, read_config_file
from bitfault.config.schema import (
    BUILTIN_MODELS,
    FRAMEWORKS,
    CampaignConfig,
    ConfigError,
    DataConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
    memory_value,
    targets_value,
)
from bitfault.config.validate import config_from_dict

__all__ = ["BUILTIN_MODELS", "FRAMEWORKS", "CampaignConfig", "ConfigError", "DataConfig",
           "ModelConfig", "RunConfig", "TrainConfig", "config_from_dict", "load_config",
           "memory_value", "read_config_file", "targets_value"]
