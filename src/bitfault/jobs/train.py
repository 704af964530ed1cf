"""``train``: one model per recipe of a config, saved into the run directory.

Training is deterministic (fixed seeds), so a model whose recipe and training
settings are unchanged is reused rather than trained again: rerunning ``train`` (or
``demo``) on an existing run directory only trains what is missing.
"""

from __future__ import annotations

import shutil
from typing import Any

from bitfault.config import RunConfig, load_config
from bitfault.jobs.data import load_data
from bitfault.jobs.models import build_model, save_model
from bitfault.jobs.progress import SILENT, Reporter
from bitfault.jobs.run_dir import (
    RunDir,
    jsonable,
    read_json,
    training_differences,
    write_json,
)
from bitfault.recipes import EpochRecord, Recipe


def _fit(framework: str) -> Any:
    if framework == "torch":
        from bitfault.torch.training import fit
    else:
        from bitfault.keras.training import fit
    return fit


def prepare_run_dir(config: RunConfig, *, overwrite: bool = False,
                    reporter: Reporter = SILENT) -> tuple[RunDir, bool]:
    """Create or reuse ``config.output``; returns (run dir, whether old models are reusable).

    A run directory trained with other framework/seed/data/model/train settings is an
    error unless ``overwrite``, which deletes its models, campaign stores and report.
    """
    rd = RunDir(config.output)
    reusable = False
    if rd.exists():
        old = rd.config()
        diffs = training_differences(old, config)
        if diffs and not overwrite:
            raise ValueError(f"{rd.path}: holds a run trained with different "
                             f"{', '.join(diffs)}; choose another output directory or "
                             "overwrite it (--overwrite)")
        if diffs:
            reporter.note(f"{rd.path}: settings changed ({', '.join(diffs)}); starting over")
            for sub in ("models", "campaign", "report"):
                shutil.rmtree(rd.path / sub, ignore_errors=True)
            rd.summary_path.unlink(missing_ok=True)
        reusable = not diffs
    elif rd.path.exists() and not rd.path.is_dir():
        raise ValueError(f"{rd.path}: exists and is not a directory")
    rd.path.mkdir(parents=True, exist_ok=True)
    write_json(rd.config_path, config.to_dict())
    return rd, reusable


def _reusable(rd: RunDir, recipe: Recipe) -> bool:
    return rd.trained(recipe.name) and read_json(
        rd.model_dir(recipe.name) / "recipe.json") == jsonable(recipe.to_dict())


def train(config: RunConfig | Any, *, reporter: Reporter = SILENT,
          overwrite: bool = False) -> tuple[RunDir, dict[str, dict[str, Any]]]:
    """Train every recipe of ``config`` into its run directory.

    Returns the run directory and, per recipe, ``{"trained": bool (False: reused),
    "epochs": n, "val_accuracy": last epoch's test accuracy, "seconds": s, "model":
    path}``.
    """
    config = load_config(config)
    rd, reusable = prepare_run_dir(config, overwrite=overwrite, reporter=reporter)
    results: dict[str, dict[str, Any]] = {}
    data = None
    for recipe in config.recipes:
        directory = rd.model_dir(recipe.name)
        if reusable and _reusable(rd, recipe):
            history = rd.history(recipe.name)
            reporter.note(f"{recipe.name}: already trained in {directory}, reused")
            trained = False
        else:
            if data is None:
                data = load_data(config.data)
            history = [r.to_dict() for r in _train_one(config, recipe, data, rd, reporter)]
            trained = True
        last = history[-1] if history else {}
        results[recipe.name] = {
            "trained": trained, "epochs": len(history),
            "val_accuracy": last.get("val_accuracy"),
            "seconds": sum((h.get("seconds") or 0.0) for h in history),
            "model": str(rd.model_file(recipe.name, config.framework))}
    return rd, results


def _train_one(config: RunConfig, recipe: Recipe, data: Any, rd: RunDir,
               reporter: Reporter) -> list[EpochRecord]:
    (x, y), (xt, yt) = data
    directory = rd.model_dir(recipe.name)
    if directory.exists():
        shutil.rmtree(directory)
    model = build_model(config.model, config.framework, config.seed)
    fit = _fit(config.framework)
    t = config.train
    with reporter.bar(f"train {recipe.name}", t.epochs, "epoch") as update:
        history = fit(model, x, y, recipe, epochs=t.epochs, batch_size=t.batch_size, lr=t.lr,
                      optimizer=t.optimizer, weight_decay=t.weight_decay, seed=config.seed,
                      x_val=xt, y_val=yt, progress=update)
    save_model(model, directory, config.framework, config.model, config.seed)
    write_json(directory / "recipe.json", recipe.to_dict())
    write_json(directory / "history.json", [r.to_dict() for r in history])  # written last
    if history:
        reporter.note(f"{recipe.name}: test accuracy {history[-1].val_accuracy:.3f} "
                      f"(clean stored weights) after {len(history)} epochs")
    return history


__all__ = ["prepare_run_dir", "train"]
