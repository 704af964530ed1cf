"""The run directory: where a run's config, models, campaign stores and report live.

    RUN_DIR/config.json                   the resolved config (RunConfig.to_dict())
    RUN_DIR/models/<recipe>/model.pt      PyTorch state_dict   (or model.keras)
    RUN_DIR/models/<recipe>/model.json    how to rebuild it: framework, model name/kwargs
    RUN_DIR/models/<recipe>/recipe.json   the recipe (Recipe.to_dict())
    RUN_DIR/models/<recipe>/history.json  one EpochRecord dict per epoch
    RUN_DIR/campaign/<recipe>.sqlite      the model's campaign store (resumable)
    RUN_DIR/summary.json                  campaign summaries per model, with clean accuracy
    RUN_DIR/report/                       PNGs, report.html, summary.csv/json
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bitfault.config import RunConfig, load_config

MODEL_FILES = {"torch": "model.pt", "keras": "model.keras"}


def jsonable(value: Any) -> Any:
    """NaN/inf become null (JSON has neither); tuples become lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def write_json(path: str | os.PathLike[str], data: Any) -> str:
    """Write ``data`` as indented JSON atomically (a temporary file, then a rename)."""
    path = os.fspath(path)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(jsonable(data), fh, indent=1, sort_keys=False)
        fh.write("\n")
    os.replace(tmp, path)
    return path


def read_json(path: str | os.PathLike[str]) -> Any:
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: missing") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run directory (nothing is created until asked)."""

    path: Path

    def __init__(self, path: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "path", Path(path))

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @property
    def report_dir(self) -> Path:
        return self.path / "report"

    def model_dir(self, recipe: str) -> Path:
        return self.path / "models" / recipe

    def model_file(self, recipe: str, framework: str) -> Path:
        return self.model_dir(recipe) / MODEL_FILES[framework]

    def store_path(self, recipe: str) -> Path:
        return self.path / "campaign" / f"{recipe}.sqlite"

    def single_faults_store_path(self, recipe: str) -> Path:
        return self.path / "campaign" / f"{recipe}.single_faults.sqlite"

    def exists(self) -> bool:
        return self.config_path.is_file()

    def config(self) -> RunConfig:
        """The run's resolved config; a directory without one is a clear error."""
        if not self.path.is_dir():
            raise FileNotFoundError(f"{self.path}: no such run directory")
        if not self.config_path.is_file():
            raise FileNotFoundError(f"{self.path}: not a run directory (no config.json; "
                                    "create one with `bitfault train CONFIG`)")
        return load_config(read_json(self.config_path))

    def trained(self, recipe: str) -> bool:
        """True when the recipe's model, recipe.json, model.json and history.json exist."""
        d = self.model_dir(recipe)
        return all((d / f).is_file() for f in ("recipe.json", "model.json", "history.json")) \
            and any((d / f).is_file() for f in MODEL_FILES.values())

    def history(self, recipe: str) -> list[dict[str, Any]]:
        return read_json(self.model_dir(recipe) / "history.json")

    def model_info(self, recipe: str) -> dict[str, Any]:
        return read_json(self.model_dir(recipe) / "model.json")


TRAINING_KEYS = ("framework", "seed", "data", "model", "train")


def training_differences(a: RunConfig, b: RunConfig) -> list[str]:
    """The top-level keys, other than recipes, that change what training produces."""
    da, db = jsonable(a.to_dict()), jsonable(b.to_dict())
    return [k for k in TRAINING_KEYS if da[k] != db[k]]


__all__ = ["MODEL_FILES", "RunDir", "jsonable", "read_json", "training_differences", "write_json"]
