"""``run_campaign``: a rate sweep (plus optional per-tensor and per-bit sweeps) per model.

Each trained model is evaluated on the test split under its recipe's stored format
(``Recipe.stored_format``), chip ``c`` drawing seed ``campaign.seed + c`` at every
rate, so every model meets the same simulated chips. Trials stream into
``RUN_DIR/campaign/<recipe>.sqlite`` as they finish; rerunning skips every stored
trial. A store holding trials of another model, data set, memory (the recipe's format,
``campaign.fault``) or ``campaign.seed`` is refused, naming what differs, unless
``replace_stores`` moves it into ``RUN_DIR/replaced/``. With ``campaign.single_faults``
(a margin), sampled single bit faults follow, in
``RUN_DIR/campaign/<recipe>.single_faults.sqlite``, until the share that turns a
correct prediction wrong is known to within that margin. With ``campaign.memory`` a
list of named memories, each model runs in each memory on the same chips, the trials in
``RUN_DIR/campaign/<memory>/<recipe>.sqlite`` (``bitfault.jobs.compare``).
``RUN_DIR/summary.json`` is built from the stores and names each model's planned and
stored trials (and, comparing memories, the schemes side by side: ``comparison``).

Everything is checked (config, data, models, grids, stores) before anything is
written, with the run directory locked (``bitfault.jobs.lock``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bitfault.config import CampaignConfig, ConfigError, RunConfig, load_config, targets_value
from bitfault.frameworks import adapter
from bitfault.jobs.compare import compare_schemes, scheme_key, scheme_store
from bitfault.jobs.data import load_data
from bitfault.jobs.lock import lock_run_dir
from bitfault.jobs.models import load_model
from bitfault.jobs.progress import SILENT, Reporter
from bitfault.jobs.run_dir import (
    RunDir,
    jsonable,
    move_aside,
    read_json,
    training_differences,
    write_json,
)
from bitfault.jobs.stores import refuse_stale_stores, store_differences
from bitfault.jobs.summary import (
    build_trials,
    incomplete,
    model_summary,
    single_fault_trials,
)
from bitfault.memory.memory import Memory
from bitfault.recipes import Recipe


def _resolve(rd: RunDir, config: RunConfig | None,
             framework: str | None) -> RunConfig:
    if config is None:
        config = rd.config()
    else:
        diffs = training_differences(rd.config(), config)
        if diffs:
            raise ValueError(f"{rd.path}: its models were trained with different "
                             f"{', '.join(diffs)} than this config; run `bitfault train` first")
    if framework is not None and framework != config.framework:
        raise ValueError(f"--framework {framework}: the run in {rd.path} was trained with "
                         f"{config.framework}")
    return config


def check_campaign(config: RunConfig, *, stored_formats: bool = True) -> None:
    """Every recipe needs a stored format (campaigns fault stored words; ``stored_formats``
    False skips that, for training); Keras campaigns fault kernels only."""
    for i, r in enumerate(config.recipes):
        if stored_formats and r.stored_format is None:
            raise ConfigError(f"recipes[{i}].format", None,
                              f"a format or fault_aware spec: campaigns fault stored words, "
                              f"and recipe {r.name!r} trains plain float weights")
    adapter(config.framework).check_campaign(config.campaign)


def make_evaluator(model: Any, framework: str, x: Any, y: Any, c: CampaignConfig) -> Any:
    """The framework's evaluator of ``model`` on (x, y) for the config's targets."""
    return adapter(framework).make_evaluator(model, x, y, c.targets)


@dataclass
class ModelPlan:
    """One model's campaign in one memory, checked: its memory (format + fault model, and
    the storage of ``scheme``, a named memory of ``campaign.memory``), evaluator and
    trials."""

    recipe: Recipe
    memory: Memory
    evaluator: Any
    trials: list[Any]
    singles: list[Any]
    scheme: str | None = None

    @property
    def key(self) -> str:
        """Its entry in summary.json's ``models``: the recipe, or "recipe / scheme"."""
        return scheme_key(self.recipe.name, self.scheme)


def _memories(c: CampaignConfig, recipe: Recipe) -> list[tuple[str | None, Memory]]:
    """The memories ``recipe``'s campaign runs in (one, or one per named memory), each
    checked against its format; errors name the key (``campaign.memory[1]``)."""
    fmt = recipe.stored_format
    try:
        memory = Memory(fmt, c.fault)
    except (ValueError, TypeError) as exc:
        raise ConfigError("campaign.fault", c.fault.to_dict(), f"a fault model that fits "
                          f"recipe {recipe.name!r}'s format {fmt} ({exc})") from None
    if c.memory is not None and (c.bits or c.single_faults is not None):
        key = "bits" if c.bits else "single_faults"
        raise ConfigError(f"campaign.{key}", getattr(c, key), "off with campaign.memory (a "
                          "stored memory places its faults by its pattern, in whole words)")
    storages: list[tuple[str, str | None, Any]] = [("campaign.plane_rates", None, None)] \
        if c.plane_rates is not None else []
    if c.schemes:
        storages += [(f"campaign.memory[{i}]", name, s) for i, (name, s) in enumerate(c.schemes)]
    elif c.memory is not None:
        storages.append(("campaign.memory", None, c.memory))
    out: list[tuple[str | None, Memory]] = []
    for key, name, storage in storages:
        try:
            memory = Memory(fmt, c.fault, c.plane_rates, storage)
        except (ValueError, TypeError) as exc:
            value = dict(c.plane_rates or {}) if storage is None else \
                {**({"name": name} if name else {}), **storage}
            raise ConfigError(key, value, f"a {key.split('.')[1].split('[')[0]} that fits "
                              f"recipe {recipe.name!r}'s format {fmt} ({exc})") from None
        if storage is not None:
            out.append((name, memory))
    return out or [(None, memory)]


def plan_models(config: RunConfig, recipe: Recipe, model: Any, x: Any, y: Any
                ) -> list[ModelPlan]:
    """Check that the campaign fits ``model`` (every memory, targets, grid): one plan per
    memory, sharing one evaluator; errors name the key."""
    c = config.campaign
    memories = _memories(c, recipe)
    try:
        evaluator = make_evaluator(model, config.framework, x, y, c)
    except ValueError as exc:
        if isinstance(c.targets, str):
            raise
        raise ConfigError("campaign.targets", targets_value(c.targets),
                          f"names of tensors the model has, or patterns matching them "
                          f"({exc})") from None
    shapes = evaluator.tensor_shapes()
    plans = []
    for scheme, memory in memories:
        plans.append(ModelPlan(recipe, memory, evaluator, build_trials(c, memory, shapes),
                               single_fault_trials(c, memory, shapes), scheme))
    return plans


def plan_model(config: RunConfig, recipe: Recipe, model: Any, x: Any, y: Any) -> ModelPlan:
    """``plan_models``' first plan (every memory is checked)."""
    return plan_models(config, recipe, model, x, y)[0]


def _clean_metrics(plan: ModelPlan) -> dict[str, Any]:
    """The no-fault metrics (the golden run every trial is compared with)."""
    from bitfault.campaign import accuracy_metrics
    from bitfault.maps import FaultMap

    golden = {n: FaultMap.empty(s, n) for n, s in plan.evaluator.tensor_shapes().items()}
    clean = plan.evaluator.predict([golden], plan.memory)[0]
    return accuracy_metrics(plan.evaluator.labels, clean, clean)


def run_campaign(run_dir: str | os.PathLike[str] | None = None,
                 config: RunConfig | Any | None = None, *, framework: str | None = None,
                 reporter: Reporter = SILENT, replace_stores: bool = False,
                 trust_model_code: bool = False) -> dict[str, Any]:
    """Run (or resume) the campaign of a run directory; returns what summary.json holds.

    ``config`` (a RunConfig, dict or file) replaces the run's campaign settings; its
    training settings must match those the models were trained with. A store of another
    campaign is refused unless ``replace_stores`` (it then moves to ``RUN_DIR/replaced/``).
    A model.json naming a user callable loads only if ``config`` names it too, or with
    ``trust_model_code``.
    """
    if config is None and run_dir is None:
        raise ValueError("give a run directory or a config")
    if config is not None:
        config = load_config(config)
    rd = RunDir(run_dir if run_dir is not None else config.output)
    pretrained = config if config is not None else rd.config() if rd.exists() else None
    if pretrained is not None and pretrained.model.pretrained:  # no training: see pretrained_run
        from bitfault.jobs.pretrained_run import run_pretrained

        if framework is not None and framework != pretrained.framework:
            raise ValueError(f"--framework {framework}: model.kind {pretrained.model.kind!r} "
                             f"runs in {pretrained.framework}")
        return run_pretrained(pretrained.replace(output=os.fspath(rd.path)), reporter=reporter,
                              replace_stores=replace_stores)
    if config is not None and not rd.exists():
        raise FileNotFoundError(f"{rd.path}: no trained run there; run `bitfault train` "
                                "with this config first")
    trusted: str | bool = True if trust_model_code else (
        config.model.name if config is not None else False)
    with lock_run_dir(rd.path, "campaign"):
        config = _resolve(rd, config, framework)
        plans, xt_len = _check_all(rd, config, trusted)
        stale = {}
        for plan in plans:
            for store in _stores(rd, plan):
                diffs = store_differences(store, plan.evaluator, plan.memory,
                                          config.campaign.seed)
                if diffs:
                    stale[store] = diffs
        refuse_stale_stores(stale, rd.path, replace_stores)
        # every check passed: from here on the run directory changes
        write_json(rd.config_path, config.to_dict())
        (rd.path / "campaign").mkdir(exist_ok=True)
        for name, _ in config.campaign.schemes:
            (rd.path / "campaign" / name).mkdir(exist_ok=True)
        moved = move_aside(rd.path, [Path(f"{s}{x}") for s in stale for x in ("", "-wal", "-shm")])
        if moved is not None:
            reporter.note(f"moved {len(stale)} store(s) of another campaign into {moved}")
        return _run_all(rd, config, plans, xt_len, reporter, moved)


def _stores(rd: RunDir, plan: ModelPlan) -> list[Path]:
    """The stores ``plan`` writes: its rate (layer) sweep's, and with one memory its
    single faults'."""
    store = scheme_store(rd.path, plan.recipe.name, plan.scheme)
    return [store] if plan.scheme is not None else \
        [store, rd.single_faults_store_path(plan.recipe.name)]


def _check_all(rd: RunDir, config: RunConfig, trusted: str | bool
               ) -> tuple[list[ModelPlan], int]:
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
    _, (xt, yt) = load_data(config.data)
    plans = [p for r in config.recipes for p in plan_models(
        config, r, load_model(rd.model_dir(r.name), trusted=trusted), xt, yt)]
    return plans, len(yt)


def _run_all(rd: RunDir, config: RunConfig, plans: list[ModelPlan], examples: int,
             reporter: Reporter, moved: Path | None) -> dict[str, Any]:
    from bitfault.campaign import StopWhenPrecise, run

    c = config.campaign
    summary: dict[str, Any] = {"framework": config.framework, "test_examples": examples,
                               "campaign": config.to_dict()["campaign"], "models": {}}
    if moved is not None:
        summary["moved_aside"] = str(moved)
    cleans: dict[str, dict[str, Any]] = {}  # one golden run per model, whatever its memory
    for p in plans:
        if p.recipe.name not in cleans:
            cleans[p.recipe.name] = _clean_metrics(p)

    def entry(plan: ModelPlan) -> dict[str, Any]:
        name = plan.recipe.name
        out = model_summary(c, plan.memory, plan.evaluator.tensor_shapes(), cleans[name],
                            _stores(rd, plan)[0], rd.single_faults_store_path(name))
        left = getattr(plan.evaluator, "left_out", None)  # Keras: what is not faulted, and why
        if left is not None:
            out["left_out"] = [{"name": t.name, "shape": list(t.shape), "reason": t.reason}
                               for t in left]
        return out if plan.scheme is None else {**out, "recipe": name, "scheme": plan.scheme}

    def write() -> None:
        if c.schemes:
            summary["comparison"] = compare_schemes(summary["models"],
                                                    [n for n, _ in c.schemes])
        write_json(rd.summary_path, summary)

    for plan in plans:  # every model is listed from the start, with what its store holds
        m = summary["models"][plan.key] = entry(plan)
        m.update(ran=0, skipped=m["stored"])
        if "single_faults" in m:
            m["single_faults"].update(ran=0, skipped=m["single_faults"]["trials"])
    write()
    for plan in plans:
        name = plan.key
        with reporter.bar(f"faults {name}", len(plan.trials), "trial") as progress:
            result = run(plan.evaluator, plan.trials, plan.memory, _stores(rd, plan)[0],
                         batch=c.batch or 8, append=True, progress=progress)
        m = summary["models"][name] = {**entry(plan), "ran": result.ran,
                                       "skipped": result.skipped}
        write()
        reporter.note(f"{name}: {result.ran} trials run, {result.skipped} already done; "
                      f"no-fault accuracy {m['clean_accuracy']:.3f}")
        if m.get("left_out"):
            reporter.note(f"{name}: left out {len(m['left_out'])} tensors: " + "; ".join(
                f"{t['name']} ({t['reason']})" for t in m["left_out"]))
        if plan.singles:
            stop = StopWhenPrecise(margin=c.single_faults, confidence=c.single_fault_confidence)
            with reporter.bar(f"single faults {name}", len(plan.singles), "fault") as progress:
                result = run(plan.evaluator, plan.singles, plan.memory,
                             rd.single_faults_store_path(name), batch=c.batch or 64,
                             append=True, progress=progress, stop=stop)
                if result.stopping["reached"] and len(result.records) < len(plan.singles):
                    progress.note(stop.describe(result.stopping))
            s = summary["models"][name] = {**entry(plan), "ran": m["ran"],
                                           "skipped": m["skipped"]}
            s["single_faults"].update(ran=result.ran, skipped=result.skipped)
            write_json(rd.summary_path, summary)
            e = s["single_faults"]
            reporter.note(f"{name}: {e['failures']} of {e['trials']} single faults turn a "
                          f"correct prediction wrong (sample of {len(plan.singles)})")
    left = incomplete(summary["models"])
    if left:
        reporter.note(f"incomplete: {', '.join(left)}")
    return summary


__all__ = ["ModelPlan", "build_trials", "check_campaign", "make_evaluator", "plan_model",
           "plan_models", "run_campaign", "store_differences"]
