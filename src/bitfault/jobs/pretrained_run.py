"""``run_pretrained``: the campaign of a pretrained model (``model.kind`` hf or gguf).

There is no ``bitfault train`` step: ``bitfault campaign CONFIG`` creates the run
directory ``config.output`` itself (``config.json``, ``campaign/<recipe>.sqlite``,
``summary.json``; the layout of ``bitfault.jobs.run_dir`` without ``models/``), after
every check passed: config, model, tokenizer, text, metric, targets, grids, stores. A
directory holding a run of another model, data or metric is refused; a store of another
campaign (other fault model, seed, format) too, unless ``replace_stores`` moves it into
``RUN_DIR/replaced/``. Rerunning resumes: stored trials are skipped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bitfault.config import RunConfig
from bitfault.jobs.lock import lock_run_dir
from bitfault.jobs.pretrained import Plan, curves, headline, plan_pretrained
from bitfault.jobs.pretrained_summary import GGUF_FILE, pretrained_entry
from bitfault.jobs.progress import SILENT, Reporter
from bitfault.jobs.run_dir import OWN_NAMES, RunDir, jsonable, move_aside, write_json
from bitfault.jobs.stores import refuse_stale_stores, store_differences

IDENTITY = ("framework", "model", "data", "metric")  # what makes two runs different runs


def run_differences(rd: RunDir, config: RunConfig) -> list[str]:
    """The identity keys in which the run in ``rd`` differs from ``config`` (reads only);
    refuses a directory that is bitfault's but not a run."""
    if rd.path.exists() and not rd.path.is_dir():
        raise ValueError(f"{rd.path}: exists and is not a directory")
    if not rd.exists():
        mixed = sorted(n for n in OWN_NAMES if os.path.lexists(rd.path / n))
        if mixed:
            raise ValueError(f"{rd.path}: not a run directory (no config.json) but holds "
                             f"{', '.join(mixed)}; choose another output directory")
        return []
    old, new = jsonable(rd.config().to_dict()), jsonable(config.to_dict())
    return [k for k in IDENTITY if old.get(k) != new.get(k)]


def _check_dir(rd: RunDir, config: RunConfig) -> None:
    diffs = run_differences(rd, config)
    if diffs:
        raise ValueError(f"{rd.path}: holds a run of another {', '.join(diffs)}; choose "
                         "another output directory")


def _clean_values(plan: Plan) -> dict[str, Any]:
    from bitfault.maps import FaultMap

    ev = plan.evaluator
    golden = {n: FaultMap.empty(s, n) for n, s in ev.tensor_shapes().items()}
    records = ev.predict([golden], plan.memory)[0]
    return ev.metric(ev.labels, records, records)


def run_pretrained(config: RunConfig, *, reporter: Reporter = SILENT,
                   replace_stores: bool = False) -> dict[str, Any]:
    """Run (or resume) ``config``'s campaign on its pretrained model; returns summary.json."""
    rd = RunDir(config.output)
    _check_dir(rd, config)
    plans = plan_pretrained(config)
    stale = {}
    for plan in plans:
        store = rd.store_path(plan.recipe.name)
        diffs = store_differences(store, plan.evaluator, plan.memory, config.campaign.seed)
        if diffs:
            stale[store] = diffs
    refuse_stale_stores(stale, rd.path, replace_stores)
    # every check passed: from here on the run directory changes
    rd.path.mkdir(parents=True, exist_ok=True)
    with lock_run_dir(rd.path, "campaign"):
        _check_dir(rd, config)  # another process may have written it meanwhile
        write_json(rd.config_path, config.to_dict())
        (rd.path / "campaign").mkdir(exist_ok=True)
        moved = move_aside(rd.path, [Path(f"{s}{x}") for s in stale
                                     for x in ("", "-wal", "-shm")])
        if moved is not None:
            reporter.note(f"moved {len(stale)} store(s) of another campaign into {moved}")
        return _run_all(rd, config, plans, reporter, moved)


def _entry(config: RunConfig, plan: Plan, clean: dict[str, Any], rd: RunDir
           ) -> dict[str, Any]:
    fmt = GGUF_FILE if plan.recipe.format is None else plan.recipe.format.to_dict()
    return pretrained_entry(config.campaign, fmt, curves(config.metric),
                            plan.evaluator.tensor_shapes(), clean,
                            rd.store_path(plan.recipe.name))


def _run_all(rd: RunDir, config: RunConfig, plans: list[Plan], reporter: Reporter,
             moved: Path | None) -> dict[str, Any]:
    from bitfault.campaign import run

    c = config.campaign
    value = headline(config.metric)
    first = plans[0].evaluator
    summary: dict[str, Any] = {
        "framework": config.framework, "model": config.model.to_dict(),
        "metric": config.metric, "value": value, "examples": len(first.labels)
        if first.labels is not None else None, "data": config.data.to_dict(),
        "campaign": config.to_dict()["campaign"], "models": {}}
    if config.metric == "similarity":  # the rated pairs of the texts (examples)
        summary["pairs"] = len(first.metric.pairs)
    if moved is not None:
        summary["moved_aside"] = str(moved)
    cleans = {p.recipe.name: _clean_values(p) for p in plans}
    for plan in plans:
        m = summary["models"][plan.recipe.name] = _entry(config, plan, cleans[plan.recipe.name],
                                                          rd)
        m.update(ran=0, skipped=m["stored"])
    write_json(rd.summary_path, summary)
    for plan in plans:
        name = plan.recipe.name
        with reporter.bar(f"faults {name}", len(plan.trials), "trial") as progress:
            result = run(plan.evaluator, plan.trials, plan.memory, rd.store_path(name),
                         metric=plan.evaluator.metric, batch=c.batch or 8, append=True,
                         progress=progress)
        m = summary["models"][name] = {**_entry(config, plan, cleans[name], rd),
                                       "ran": result.ran, "skipped": result.skipped}
        write_json(rd.summary_path, summary)
        reporter.note(f"{name}: {result.ran} trials run, {result.skipped} already done; "
                      f"no-fault {value} {m['clean'].get(value)}")
    return summary


__all__ = ["IDENTITY", "run_differences", "run_pretrained"]
