"""``run_campaign``: a rate sweep (plus optional per-tensor and per-bit sweeps) per model.

Each trained model is evaluated on the test split under its recipe's stored format
(``Recipe.stored_format``), chip ``c`` drawing seed ``campaign.seed + c`` at every
rate, so every model meets the same simulated chips. Trials stream into
``RUN_DIR/campaign/<recipe>.sqlite`` as they finish; rerunning skips every stored
trial (a store written for another model, data set or fault model is started over).
With ``campaign.single_faults`` (a margin), sampled single bit faults follow, in
``RUN_DIR/campaign/<recipe>.single_faults.sqlite``, until the share that turns a
correct prediction wrong is known to within that margin. Summaries go to
``RUN_DIR/summary.json``.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from bitfault.config import CampaignConfig, ConfigError, RunConfig, load_config
from bitfault.jobs.data import load_data
from bitfault.jobs.models import load_model
from bitfault.jobs.progress import SILENT, Reporter
from bitfault.jobs.run_dir import RunDir, jsonable, read_json, training_differences, write_json
from bitfault.spec import FaultSpec


def _resolve(run_dir: str | os.PathLike[str] | None, config: RunConfig | Any | None,
             framework: str | None) -> tuple[RunDir, RunConfig]:
    if config is None:
        if run_dir is None:
            raise ValueError("give a run directory or a config")
        rd = RunDir(run_dir)
        config = rd.config()
    else:
        config = load_config(config)
        rd = RunDir(run_dir if run_dir is not None else config.output)
        if not rd.exists():
            raise FileNotFoundError(f"{rd.path}: no trained run there; run `bitfault train` "
                                    "with this config first")
        diffs = training_differences(rd.config(), config)
        if diffs:
            raise ValueError(f"{rd.path}: its models were trained with different "
                             f"{', '.join(diffs)} than this config; run `bitfault train` first")
    if framework is not None and framework != config.framework:
        raise ValueError(f"--framework {framework}: the run in {rd.path} was trained with "
                         f"{config.framework}")
    return rd, config


def check_campaign(config: RunConfig) -> None:
    """Every recipe needs a stored format: campaigns fault stored words."""
    for i, r in enumerate(config.recipes):
        if r.stored_format is None:
            raise ConfigError(f"recipes[{i}].format", None,
                              f"a format or fault_aware spec: campaigns fault stored words, "
                              f"and recipe {r.name!r} trains plain float weights")
    c = config.campaign
    if config.framework == "keras" and (c.targets == "weights+biases" or (
            not isinstance(c.targets, str) and any(not t.endswith(".weight")
                                                   for t in c.targets))):
        raise ConfigError("campaign.targets", c.targets if isinstance(c.targets, str)
                          else list(c.targets), "'weights' or a list of '<layer>.weight' "
                          "names for framework 'keras' (Keras campaigns fault kernels)")


def make_evaluator(model: Any, framework: str, x: Any, y: Any, c: CampaignConfig) -> Any:
    if framework == "torch":
        from bitfault.campaign.torch_eval import TorchEvaluator

        if isinstance(c.targets, str):
            return TorchEvaluator(model, x, y, biases=c.targets == "weights+biases",
                                  batch_size=1000)
        return TorchEvaluator(model, x, y, targets=list(c.targets), batch_size=1000)
    from bitfault.campaign.keras_eval import KerasEvaluator

    return KerasEvaluator(model, x, y, targets=None if isinstance(c.targets, str)
                          else list(c.targets))


def build_trials(c: CampaignConfig, spec: FaultSpec, shapes: dict[str, Any]) -> list[Any]:
    from bitfault.campaign import bit_sweep, layer_sweep, rate_sweep

    trials = rate_sweep(c.bers, c.chips, base_seed=c.seed)
    if c.layers:
        trials += layer_sweep(c.sweep_bers, c.sweep_chips, list(shapes), base_seed=c.seed)
    if c.bits:
        trials += bit_sweep(c.sweep_bers, c.sweep_chips, spec.fault.eligible_bits(spec.format),
                            base_seed=c.seed)
    return trials


def _stale(store: Path, evaluator: Any, spec: FaultSpec) -> bool:
    """Whether a store holds trials of another model, data set or spec."""
    if not store.is_file():
        return False
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
            rows = db.execute("SELECT DISTINCT model_digest, data_digest, spec FROM trials"
                              ).fetchall()
    except sqlite3.DatabaseError:
        return False  # let CampaignStore report what is wrong with the file
    want = (evaluator.model_digest(), evaluator.data_digest(), spec.to_json(sort_keys=True))
    return any(tuple(r) != want for r in rows)


def _remove_store(store: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store}{suffix}").unlink(missing_ok=True)


def run_campaign(run_dir: str | os.PathLike[str] | None = None,
                 config: RunConfig | Any | None = None, *, framework: str | None = None,
                 reporter: Reporter = SILENT) -> dict[str, Any]:
    """Run (or resume) the campaign of a run directory; returns what summary.json holds.

    ``config`` (a RunConfig, dict or file) replaces the run's campaign settings; its
    training settings must match those the models were trained with.
    """
    from bitfault.campaign import run

    rd, config = _resolve(run_dir, config, framework)
    check_campaign(config)
    missing = [r.name for r in config.recipes if not rd.trained(r.name)]
    if missing:
        raise FileNotFoundError(f"{rd.path}: no trained model for recipe(s) {missing}; run "
                                "`bitfault train` first")
    changed = [r.name for r in config.recipes
               if read_json(rd.model_dir(r.name) / "recipe.json") != jsonable(r.to_dict())]
    if changed:
        raise ValueError(f"{rd.path}: recipe(s) {changed} differ from the ones their models "
                         "were trained with; run `bitfault train` first")
    write_json(rd.config_path, config.to_dict())
    c = config.campaign
    _, (xt, yt) = load_data(config.data)
    summary: dict[str, Any] = {"framework": config.framework, "test_examples": len(yt),
                               "campaign": config.to_dict()["campaign"], "models": {}}
    (rd.path / "campaign").mkdir(exist_ok=True)
    for recipe in config.recipes:
        fmt = recipe.stored_format
        try:
            spec = FaultSpec(format=fmt, fault=c.fault, ber=0.0, seed=c.seed)
        except (ValueError, TypeError) as exc:
            raise ConfigError("campaign.fault", c.fault.to_dict(), f"a fault model that fits "
                              f"recipe {recipe.name!r}'s format {fmt} ({exc})") from None
        model = load_model(rd.model_dir(recipe.name))
        evaluator = make_evaluator(model, config.framework, xt, yt, c)
        trials = build_trials(c, spec, evaluator.tensor_shapes())
        store = rd.store_path(recipe.name)
        if _stale(store, evaluator, spec):
            reporter.note(f"{store}: written for another model, data set or fault model; "
                          "starting it over")
            _remove_store(store)
        with reporter.bar(f"faults {recipe.name}", len(trials), "trial") as progress:
            result = run(evaluator, trials, spec, store, batch=c.batch or 8, append=True,
                         progress=progress)
        rows = result.summary("accuracy")
        summary["models"][recipe.name] = {
            "format": fmt.to_dict(), "clean_accuracy": result.clean["accuracy"],
            "ran": result.ran, "skipped": result.skipped, "store": str(store),
            "rate": [r for r in rows if r["kind"] == "rate"],
            "layer": [r for r in rows if r["kind"] == "layer"],
            "bit": [r for r in rows if r["kind"] == "bit"]}
        write_json(rd.summary_path, summary)
        reporter.note(f"{recipe.name}: {result.ran} trials run, {result.skipped} already done; "
                      f"no-fault accuracy {result.clean['accuracy']:.3f}")
        if c.single_faults is not None:
            summary["models"][recipe.name]["single_faults"] = _single_faults(
                rd, recipe.name, evaluator, spec, c, reporter)
            write_json(rd.summary_path, summary)
    return summary


def _single_faults(rd: RunDir, name: str, evaluator: Any, spec: FaultSpec, c: CampaignConfig,
                   reporter: Reporter) -> dict[str, Any]:
    """Statistical single-fault injection for one model, in its own resumable store: a
    Leveugle-sized random sample of single bit faults, stopped once the failure share is
    known to within ``c.single_faults``."""
    from bitfault.campaign import StopWhenPrecise, run, sampled_single_faults

    trials = sampled_single_faults(evaluator.tensor_shapes(), spec.format,
                                   margin=c.single_faults, confidence=c.single_fault_confidence,
                                   seed=c.seed, bits=spec.fault.bits)
    store = rd.single_faults_store_path(name)
    if _stale(store, evaluator, spec):
        reporter.note(f"{store}: written for another model, data set or fault model; "
                      "starting it over")
        _remove_store(store)
    stop = StopWhenPrecise(margin=c.single_faults, confidence=c.single_fault_confidence)
    with reporter.bar(f"single faults {name}", len(trials), "fault") as progress:
        result = run(evaluator, trials, spec, store, batch=c.batch or 64, append=True,
                     progress=progress, stop=stop)
    estimate = result.stopping or {}
    reporter.note(f"{name}: {estimate.get('failures')} of {estimate.get('trials')} single "
                  f"faults turn a correct prediction wrong (sample of {len(trials)})")
    return {"sample_size": len(trials), "ran": result.ran, "skipped": result.skipped,
            "store": str(store), **estimate}


__all__ = ["build_trials", "check_campaign", "make_evaluator", "run_campaign"]
