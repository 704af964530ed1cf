"""The run directory: where a run's config, models, campaign stores and report live.

    RUN_DIR/config.json                   the resolved config (RunConfig.to_dict())
    RUN_DIR/models/<recipe>/model.pt      PyTorch state_dict   (or model.keras)
    RUN_DIR/models/<recipe>/model.json    how to rebuild it: framework, model name/kwargs
    RUN_DIR/models/<recipe>/recipe.json   the recipe (Recipe.to_dict())
    RUN_DIR/models/<recipe>/history.json  one EpochRecord dict per epoch
    RUN_DIR/campaign/<recipe>.sqlite      the model's campaign store (resumable)
    RUN_DIR/campaign/<memory>/<recipe>.sqlite  its store in each memory campaign.memory
                                          names, when it compares several
    RUN_DIR/summary.json                  campaign summaries per model, with clean accuracy
    RUN_DIR/report/                       PNGs, report.html, summary.csv/json
    RUN_DIR/replaced/<time>/              what a later run replaced, under its old path
    RUN_DIR/.lock                         who holds the directory (``bitfault.jobs.lock``)

Nothing bitfault does deletes a result: what is replaced (``train --overwrite``, a
retrained recipe, ``campaign --replace-store``) moves into ``replaced/``.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bitfault.config import RunConfig, load_config

MODEL_FILES = {"torch": "model.pt", "keras": "model.keras"}
REPLACED = "replaced"
# what bitfault writes at the top of a run directory (anything else there is the user's)
OWN_NAMES = ("config.json", "models", "campaign", "summary.json", "report", REPLACED)


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
    text = json.dumps(jsonable(data), indent=1, sort_keys=False) + "\n"
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
    """A temporary name beside ``path`` to write; renamed onto ``path`` only if the block
    succeeds (else removed), so ``path`` is never half-written. Errors name ``path``."""
    path = os.fspath(path)
    head, tail = os.path.split(path)
    stem, ext = os.path.splitext(tail)  # keep the suffix: model.keras must end in .keras
    tmp = os.path.join(head, f".{stem}.tmp-{os.getpid()}{ext}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as exc:
        with suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, (OSError, RuntimeError)):
            cause = " ".join(str(exc).split()) or type(exc).__name__
            raise OSError(f"{path}: not written ({cause}); nothing was replaced") from exc
        raise


def move_aside(root: str | os.PathLike[str],
               paths: Sequence[str | os.PathLike[str]]) -> Path | None:
    """Move the ``paths`` that exist (inside ``root``) to ``root/replaced/<time>/``, each under
    its path relative to ``root``; returns that folder, or None when none existed."""
    root = Path(root)
    found = [Path(p) for p in paths if os.path.lexists(p)]
    if not found:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, n = root / REPLACED / stamp, 1
    while dest.exists():
        dest, n = root / REPLACED / f"{stamp}-{n}", n + 1
    for p in found:
        target = dest / p.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(p, target)
    return dest


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

    def memory_store_paths(self, recipe: str) -> list[Path]:
        """The model's stores in the named memories of a comparison (``campaign/<memory>/``),
        whatever memories the current config names."""
        return sorted((self.path / "campaign").glob(f"*/{recipe}.sqlite"))

    def single_faults_store_path(self, recipe: str) -> Path:
        return self.path / "campaign" / f"{recipe}.single_faults.sqlite"

    def partial_model_dir(self, recipe: str) -> Path:
        """Where a model is trained before it replaces ``model_dir`` (recipes never start
        with '.', so this cannot be one)."""
        return self.path / "models" / f".partial-{recipe}"

    def exists(self) -> bool:
        return self.config_path.is_file()

    def config(self) -> RunConfig:
        """The run's resolved config; a directory without one is a clear error."""
        if not self.path.is_dir():
            raise FileNotFoundError(f"{self.path}: no such run directory")
        if not self.config_path.is_file():
            raise FileNotFoundError(f"{self.path}: not a run directory (no config.json; "
                                    "create one with `bitfault train CONFIG`)")
        data = read_json(self.config_path)
        try:
            if not isinstance(data, dict):
                raise ValueError(f"a JSON {type(data).__name__}, not a mapping")
            return load_config(data)
        except ValueError as exc:  # ConfigError too: the file is not the user's config
            raise ValueError(f"{self.config_path}: not the config.json of a bitfault run "
                             f"this version reads ({exc}); if bitfault did not write "
                             f"{self.path}, choose another output directory") from None

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


__all__ = ["MODEL_FILES", "OWN_NAMES", "REPLACED", "RunDir", "atomic_path", "jsonable",
           "move_aside", "read_json", "training_differences", "write_json"]
