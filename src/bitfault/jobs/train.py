"""``train``: one model per recipe of a config, saved into the run directory.

Training is deterministic (fixed seeds), so a model whose recipe and training
settings are unchanged is reused rather than trained again: rerunning ``train`` (or
``demo``) on an existing run directory only trains what is missing; a model to reuse must
load (else an error naming the file; ``retrain`` trains every recipe again). Everything is
checked (config, data against the model, every recipe's format against the model's
weights, campaign grid, models to reuse, the directory) before the first write, with the
directory locked. Nothing is deleted: a model trained again, and with ``overwrite``
everything a run with other settings made, moves to ``RUN_DIR/replaced/``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from bitfault.config import ConfigError, RunConfig, load_config
from bitfault.frameworks import adapter
from bitfault.jobs.campaign import check_campaign, plan_model
from bitfault.jobs.data import load_data
from bitfault.jobs.lock import lock_run_dir
from bitfault.jobs.models import (
    UntrustedModel,
    build_model,
    check_model_input,
    load_model,
    save_model,
)
from bitfault.jobs.progress import SILENT, Reporter
from bitfault.jobs.run_dir import (
    OWN_NAMES,
    RunDir,
    jsonable,
    move_aside,
    read_json,
    training_differences,
    write_json,
)
from bitfault.maps import FaultMap
from bitfault.recipes import EpochRecord, Recipe


def check_run_dir(rd: RunDir, config: RunConfig, overwrite: bool) -> list[str] | None:
    """The training settings that differ from the run in ``rd`` (None: no run there yet);
    raises where training there is refused. Reads only."""
    if rd.exists():
        diffs = training_differences(rd.config(), config)
        if diffs and not overwrite:
            raise ValueError(f"{rd.path}: holds a run trained with different "
                             f"{', '.join(diffs)}; choose another output directory or "
                             "overwrite it (--overwrite)")
        return diffs
    if rd.path.exists() and not rd.path.is_dir():
        raise ValueError(f"{rd.path}: exists and is not a directory")
    if rd.path.is_dir():
        mixed = sorted(n for n in OWN_NAMES if os.path.lexists(rd.path / n))
        if mixed:
            raise ValueError(f"{rd.path}: not a run directory (no config.json) but holds "
                             f"{', '.join(mixed)}; choose another output directory")
    return None


def check_training(config: RunConfig) -> Any:
    """Load the data, build the model once, run it on a sample of each split, and check the
    campaign grid and every recipe's format against it (a clean run through the format),
    before anything is written; returns the data."""
    data = load_data(config.data)
    check_campaign(config, stored_formats=False)
    model = build_model(config.model, config.framework, config.seed)
    (x, _), (xt, yt) = data
    d = config.data
    where = f"data.path {d.path}" if d.path else f"data.source {d.source!r}"
    for sample in (x, xt):
        check_model_input(model, config.framework, sample, f"{where} with model "
                          f"{config.model.name}")
    for i, recipe in enumerate(config.recipes):
        if recipe.stored_format is not None:
            _check_storable(plan_model(config, recipe, model, xt[:8], yt[:8]), i)
    return data


def _check_storable(plan: Any, i: int) -> None:
    """The model's clean weights go through recipe ``i``'s stored format: an error naming
    its format key when the format cannot store them (a per_channel axis the weights lack)."""
    golden = {n: FaultMap.empty(s, n) for n, s in plan.evaluator.tensor_shapes().items()}
    try:
        plan.evaluator.predict([golden], plan.memory)
    except (ValueError, TypeError, RuntimeError) as exc:
        r = plan.recipe
        key = f"recipes[{i}].format" if r.format is not None else \
            f"recipes[{i}].fault_aware.format"
        cause = " ".join(str(exc).split())
        raise ConfigError(key, r.stored_format.to_dict(), f"a format that can store the "
                          f"model's weights ({cause})") from None


def _check_reusable(rd: RunDir, config: RunConfig, names: set[str]) -> None:
    """Every model to reuse loads; else an error naming its file and ``--retrain``."""
    for recipe in config.recipes:
        if recipe.name not in names:
            continue
        try:
            load_model(rd.model_dir(recipe.name), trusted=config.model.name)
        except UntrustedModel:
            raise
        except (ValueError, OSError) as exc:
            text = " ".join(str(exc).split())
            hint = "" if "--retrain" in text else "; train it again: bitfault train CONFIG " \
                                                  "--retrain"
            raise ValueError(f"recipe {recipe.name!r}: its trained model cannot be reused: "
                             f"{text}{hint} (--retrain moves the old models to "
                             f"{rd.path / 'replaced'})") from None


def prepare_run_dir(config: RunConfig, *, overwrite: bool = False,
                    reporter: Reporter = SILENT) -> tuple[RunDir, bool]:
    """Create or reuse ``config.output`` (call it holding the lock, after every check);
    returns (run dir, whether old models are reusable). With ``overwrite``, a run
    trained with other settings moves into ``RUN_DIR/replaced/<time>/``."""
    rd = RunDir(config.output)
    diffs = check_run_dir(rd, config, overwrite)
    if diffs:
        moved = move_aside(rd.path, [rd.path / n for n in OWN_NAMES if n != "replaced"])
        reporter.note(f"{rd.path}: settings changed ({', '.join(diffs)}); the old run moved "
                      f"to {moved}")
    rd.path.mkdir(parents=True, exist_ok=True)
    write_json(rd.config_path, config.to_dict())
    return rd, diffs is not None and not diffs


def _reusable(rd: RunDir, recipe: Recipe) -> bool:
    return rd.trained(recipe.name) and read_json(
        rd.model_dir(recipe.name) / "recipe.json") == jsonable(recipe.to_dict())


def train(config: RunConfig | Any, *, reporter: Reporter = SILENT, overwrite: bool = False,
          retrain: bool = False) -> tuple[RunDir, dict[str, dict[str, Any]]]:
    """Train every recipe of ``config`` into its run directory.

    A recipe whose model is already trained with the same settings is reused, unless
    ``retrain`` (the old model then moves to ``RUN_DIR/replaced/``); a model to reuse that
    does not load is an error naming its file. Returns the run directory and, per recipe,
    ``{"trained": bool (False: reused), "epochs": n, "val_accuracy": last epoch's test
    accuracy, "seconds": s, "model": path}``.
    """
    config = load_config(config)
    rd = RunDir(config.output)
    diffs = check_run_dir(rd, config, overwrite)
    data = check_training(config)
    reuse = set() if retrain or diffs is None or diffs else {
        r.name for r in config.recipes if _reusable(rd, r)}
    _check_reusable(rd, config, reuse)
    rd.path.mkdir(parents=True, exist_ok=True)
    with lock_run_dir(rd.path, "train"):
        rd, reusable = prepare_run_dir(config, overwrite=overwrite, reporter=reporter)
        results: dict[str, dict[str, Any]] = {}
        for recipe in config.recipes:
            directory = rd.model_dir(recipe.name)
            if reusable and recipe.name in reuse and _reusable(rd, recipe):
                history = rd.history(recipe.name)
                reporter.note(f"{recipe.name}: already trained in {directory}, reused")
                trained = False
            else:
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
    """Train into ``models/.partial-<recipe>/``, then swap it in; an old model and its
    stores move to ``RUN_DIR/replaced/``."""
    (x, y), (xt, yt) = data
    partial = rd.partial_model_dir(recipe.name)
    if partial.exists():  # left by a train that was killed: bitfault's own, unfinished
        shutil.rmtree(partial)
    model = build_model(config.model, config.framework, config.seed)
    fit = adapter(config.framework).fit
    t = config.train
    per_epoch = -(-len(x) // t.batch_size)
    with reporter.bar(f"train {recipe.name}", t.epochs * per_epoch, "step") as bar:
        bar(0)

        def on_step(step: int, loss: float) -> None:
            bar.note(f"epoch {(step - 1) // per_epoch + 1}/{t.epochs}, loss {loss:.4f}")
            bar(step)

        history = fit(model, x, y, recipe, epochs=t.epochs, batch_size=t.batch_size, lr=t.lr,
                      optimizer=t.optimizer, weight_decay=t.weight_decay, seed=config.seed,
                      x_val=xt, y_val=yt, on_step=on_step)
    save_model(model, partial, config.framework, config.model, config.seed)
    write_json(partial / "recipe.json", recipe.to_dict())
    write_json(partial / "history.json", [r.to_dict() for r in history])
    directory = rd.model_dir(recipe.name)
    stores = [rd.store_path(recipe.name), rd.single_faults_store_path(recipe.name),
              *rd.memory_store_paths(recipe.name)]
    old = [directory] + [Path(f"{s}{x}") for s in stores for x in ("", "-wal", "-shm")]
    moved = move_aside(rd.path, old)
    if moved is not None:
        reporter.note(f"{recipe.name}: the model it replaces (and its campaign stores) moved "
                      f"to {moved}")
    os.replace(partial, directory)
    if history:
        reporter.note(f"{recipe.name}: test accuracy {history[-1].val_accuracy:.3f} "
                      f"(clean stored weights) after {len(history)} epochs")
    return history


__all__ = ["check_run_dir", "check_training", "prepare_run_dir", "train"]
