"""``make_report``: the report of a run directory, from its summary and training histories.

Writes ``RUN_DIR/report/``: ``rate_sweep.png`` (accuracy vs fault rate, every model on
one plot with 95% confidence bands and the chance level), ``layers_<model>.png`` and
``bits_<model>.png`` heatmaps when the campaign ran those sweeps (``<model>`` with a short
hash where the name is not a safe file name), ``training.png``, ``summary.csv``/``.json``,
``rate_table.csv``/``.json`` (model x rate) and one self-contained ``report.html``.
"""

from __future__ import annotations

import os
from typing import Any

from bitfault.campaign.stats import format_rates
from bitfault.config import CampaignConfig, RunConfig, config_from_dict
from bitfault.formats import format_from_dict
from bitfault.jobs.compare import compare_schemes, scheme_key, scheme_store
from bitfault.jobs.lock import lock_run_dir
from bitfault.jobs.progress import SILENT, Reporter
from bitfault.jobs.run_dir import RunDir, read_json
from bitfault.jobs.summary import incomplete, refresh
from bitfault.recipes import Recipe
from bitfault.report.labels import rate_name
from bitfault.report.schemes import protection_text

_CLASSES = 10  # every data source a run reads is a 10-class set (the loaders check 0..9)


def describe_recipe(recipe: Recipe) -> str:
    """One line on how a model was trained, e.g. "IntQuant(8) weights, clip 0.1, RandBET p=0.1"."""
    parts = []
    if recipe.format is not None:
        parts.append(f"trained through {_fmt(recipe.format)} weights")
    if recipe.fault_aware is not None:
        fa = recipe.fault_aware
        rate = f"ber {fa.ber:g}" if isinstance(fa.ber, float) else "given faults"
        parts.append(f"fault-aware: {fa.persistence} {fa.fault.kind.replace('_', ' ')}s "
                     f"at {rate} in {_fmt(fa.format)} weights ({fa.gradient} gradient)")
    if recipe.weight_clip is not None:
        parts.append(f"weights clipped to ±{recipe.weight_clip:g}")
    if recipe.randbet is not None:
        parts.append(f"random bit error training at p={recipe.randbet.p_train:g}")
    if recipe.activation_clip is not None:
        parts.append(f"ReLUs bounded ({recipe.activation_clip})")
    return "; ".join(parts) or "plain float training"


def _fmt(fmt: Any) -> str:
    d = fmt.to_dict() if hasattr(fmt, "to_dict") else dict(fmt)
    kind = d.get("kind")
    if kind == "fixed_point":
        return f"FixedPoint({d['bits']}, {d['frac']}, {d['rounding']})"
    if kind == "int_quant":
        sym = "" if d.get("symmetric", True) else ", asymmetric"
        ch = ", per channel" if d.get("per_channel") else ""
        return f"IntQuant({d['bits']}{sym}{ch})"
    return f"Float({d.get('dtype')})"


def make_report(run_dir: str | os.PathLike[str], *,
                reporter: Reporter = SILENT) -> dict[str, str]:
    """Write ``RUN_DIR/report/`` from the campaign stores (as ``summary.json`` describes
    them: run a campaign first) and the models' ``history.json``; returns {artefact:
    path}. A model whose campaign is incomplete is named on the page and by ``reporter``."""
    rd = RunDir(run_dir)
    with lock_run_dir(rd.path, "report"):
        return _make_report(rd, reporter)


def load_summary(rd: RunDir, config: RunConfig) -> tuple[dict[str, Any], CampaignConfig]:
    """summary.json with each model rebuilt from its stores as they are now, and the
    campaign settings it was measured with."""
    if not rd.summary_path.is_file():
        raise FileNotFoundError(f"{rd.summary_path}: missing; run `bitfault campaign "
                                f"{rd.path}` first")
    summary = read_json(rd.summary_path)
    c = config_from_dict({"campaign": summary["campaign"]}).campaign \
        if isinstance(summary.get("campaign"), dict) else config.campaign
    have = summary.get("models", {})
    summary["models"] = {
        key: refresh(have[key], c, scheme_store(rd.path, r.name, scheme),
                     rd.single_faults_store_path(r.name))
        for r, scheme, key in entry_keys(config, c) if key in have}
    if c.schemes:
        summary["comparison"] = compare_schemes(summary["models"], [n for n, _ in c.schemes])
    return summary, c


def entry_keys(config: RunConfig, c: CampaignConfig) -> list[tuple[Recipe, str | None, str]]:
    """(recipe, memory name or None, summary key) of every entry the campaign makes."""
    names = [n for n, _ in c.schemes] or [None]
    return [(r, n, scheme_key(r.name, n)) for r in config.recipes for n in names]


def _make_report(rd: RunDir, reporter: Reporter) -> dict[str, str]:
    from bitfault.report import build_report

    config = rd.config()
    if config.model.pretrained:
        from bitfault.jobs.pretrained_report import make_pretrained_report

        return make_pretrained_report(rd, config, reporter)
    summary, c = load_summary(rd, config)
    keys = entry_keys(config, c)
    left = incomplete(summary["models"]) + [
        f"{key} (no campaign yet)" for _, _, key in keys if key not in summary["models"]]
    models = {name: m for name, m in summary["models"].items() if m["rate"]}
    if not models:
        raise ValueError(f"{rd.summary_path}: holds no campaign result for this run's "
                         f"recipes {[r.name for r in config.recipes]}")
    if left:
        reporter.note(f"incomplete: {', '.join(left)}; rerun `bitfault campaign {rd.path}` "
                      "to finish")
    histories = {}
    for r in config.recipes:  # one curve per trained model, whatever memories it ran in
        if rd.trained(r.name):
            cols: dict[str, list[Any]] = {}
            for record in rd.history(r.name):
                for k, v in record.items():
                    cols.setdefault(k, []).append(v)
            histories[r.name] = cols
    rows_models = []
    for r, _, key in keys:
        m = models.get(key)
        if m is None:
            continue
        rows_models.append({"model": key, "stored as": _fmt(format_from_dict(m["format"])),
                            "training": describe_recipe(r),
                            "test accuracy, no faults": m["clean_accuracy"],
                            "epochs": len(histories.get(r.name, {}).get("epoch", []))})
    fault = c.fault.kind.replace("_", " ")
    intro = (f"{len(models)} models ({config.model.name}, {config.framework}) trained on "
             f"{config.data.source} data, then each evaluated on {summary.get('test_examples')} "
             f"test examples with its weights stored in its format and {fault}s at each "
             f"{rate_name(c.fault)}: {c.chips} simulated chips per rate (chip c draws seed "
             f"{c.seed} + c for every model, so faults are nested across rates and shared "
             "across models).")
    if c.schemes:
        recipes = len({k[0].name for k in keys if k[2] in models})
        intro += (f" Each of the {recipes} trained model(s) runs in {len(c.schemes)} "
                  f"memories compared on the same chips ({', '.join(n for n, _ in c.schemes)})"
                  ", its rows named \"<model> / <memory>\".")
    if left:
        intro += (f" Incomplete campaigns, shown with the trials stored so far: "
                  f"{', '.join(left)}.")
    columns = ("model", "stored as", "training", "test accuracy, no faults", "epochs")
    tables = [("Models", rows_models, columns)]
    more_tables = []
    singles = [(name, m["single_faults"]) for name, m in models.items()
               if m.get("single_faults", {}).get("trials")]
    if singles:
        rows = [{"model": name, "faults run": s["trials"], "sample": s["sample_size"],
                 "share that turns a correct prediction wrong": s["share"],
                 f"{s['confidence']:.0%} interval": f"{s['interval'][0]:.4f}-"
                                                    f"{s['interval'][1]:.4f}"}
                for name, s in singles]
        more_tables.append(("Single bit faults (statistical fault injection)", rows,
                            tuple(rows[0])))
    stored = [(name, m["memory"]) for name, m in models.items() if m.get("memory")]
    if stored:
        rows = [{"model": name, "protection": protection_text(mem["storage"]),
                 "overhead": ", ".join(f"{p} {v:.1%}" for p, v in mem["overhead"].items()),
                 "rate": f"{o['ber']:g}", "trials": o["trials"],
                 **{k: f"{o[k]:.0%} ({o[f'{k}_low']:.0%}-{o[f'{k}_high']:.0%})"
                    for k in ("detected", "sdc", "benign", "masked")},
                 "words corrected / DUE / silent per trial":
                     f"{o['words_corrected']:.1f} / {o['words_due']:.1f} / "
                     f"{o['words_silent']:.1f}"}
                for name, mem in stored for o in mem["outcomes"]]
        if rows:
            more_tables.append(("Memory outcomes per rate (share of trials detected: a word "
                                "detected uncorrectable; sdc: silent data corruption, "
                                "accuracy below fault-free; benign: words read back wrong, "
                                "accuracy kept; masked: every word read back as stored; 95% "
                                "Wilson intervals)", rows, tuple(rows[0])))
    return build_report(
        rd.report_dir,
        {n: m["rate"] for n, m in models.items()},
        clean={n: m["clean_accuracy"] for n, m in models.items()},
        layer_rows={n: m.get("layer", []) for n, m in models.items()},
        bit_rows={n: m.get("bit", []) for n, m in models.items()},
        histories=histories or None, title=config.title, intro=intro,
        tables=tables, more_tables=more_tables, fault=c.fault,
        formats={n: m["format"] for n, m in models.items()}, chance=1.0 / _CLASSES,
        comparison=summary.get("comparison"))


def rate_table(summary: dict[str, Any]) -> tuple[list[float], dict[str, dict[str, Any]]]:
    """(bers, {model: {"clean": acc, ber: mean accuracy}}) from a summary.json dict."""
    bers = sorted({row["ber"] for m in summary["models"].values() for row in m["rate"]})
    table = {}
    for name, m in summary["models"].items():
        means = {row["ber"]: row["mean"] for row in m["rate"]}
        table[name] = {"clean": m["clean_accuracy"], **{b: means.get(b) for b in bers}}
    return bers, table


def format_rate_table(summary: dict[str, Any]) -> str:
    """A plain-text table: one row per model, no-fault accuracy then mean accuracy per rate."""
    bers, table = rate_table(summary)
    width = max([len("model")] + [len(n) for n in table]) + 2
    labels = format_rates(bers)
    cell = max([9] + [len(label) + 2 for label in labels])
    head = "model".ljust(width) + "no faults".rjust(10) + "".join(label.rjust(cell)
                                                                  for label in labels)
    fault = summary.get("campaign", {}).get("fault")
    lines = [f"mean test accuracy over simulated chips, by {rate_name(fault)}", head]
    for name, row in table.items():
        cells = "".join(f"{row[b]:{cell}.3f}" if row[b] is not None else "-".rjust(cell)
                        for b in bers)
        lines.append(name.ljust(width) + f"{row['clean']:10.3f}" + cells)
    return "\n".join(lines)


__all__ = ["describe_recipe", "entry_keys", "format_rate_table", "load_summary", "make_report",
           "rate_table"]
