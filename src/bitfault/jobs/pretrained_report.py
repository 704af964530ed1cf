"""The report of a pretrained-model run (``model.kind`` hf or gguf), from its stores.

``RUN_DIR/report/``: one plot per value of the run's metric vs bit error rate
(``rate_<value>.png``: perplexity, next-token agreement and accuracy, cosine, or spearman
with cosine for similarity; over the chips where the value is finite the median and
quartiles of perplexity, the mean and its 95% band of the others, worst chip dotted, no
faults dashed), a heatmap per recipe of the headline value by tensor when the layer sweep
ran (bounded metrics; perplexity's and spearman's layer rows are tables), the outcomes
(masked / benign / sdc / non-finite with Wilson intervals), ``summary.csv``/``.json``,
``rate_table.csv``/``.json`` and one ``report.html``.
"""

from __future__ import annotations

import math
import os
from typing import Any

from bitfault.config import RunConfig, config_from_dict
from bitfault.jobs.pretrained import curves, headline
from bitfault.jobs.pretrained_summary import GGUF_FILE, refresh_entry
from bitfault.jobs.progress import Reporter
from bitfault.jobs.run_dir import RunDir, read_json
from bitfault.jobs.summary import incomplete

BOUNDED_HEADLINES = ("next_token_agreement", "cosine")  # heatmaps on [0, 1]
_COLUMNS = ("model", "kind", "ber", "target", "chips", "non_finite", "n", "mean", "median",
            "min", "max", "ci_low", "ci_high")


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _stored_as(fmt: Any) -> str:
    if fmt == GGUF_FILE:
        return "the GGUF file's own blocks (codes, fp16 scales and minimums, float words)"
    from bitfault.formats import format_from_dict

    return str(format_from_dict(dict(fmt)))


def make_pretrained_report(rd: RunDir, config: RunConfig, reporter: Reporter
                           ) -> dict[str, str]:
    """Write ``RUN_DIR/report/`` (call it holding the run directory's lock)."""
    from bitfault.campaign.metrics import BENIGN_COSINE
    from bitfault.campaign.stats import headline_stat
    from bitfault.report import model_rate_table, plot_heatmap, plot_rate_sweep, rate_table_caption
    from bitfault.report.html import write_html, write_rows
    from bitfault.report.labels import fault_phrase, file_stems, rate_name

    if not rd.summary_path.is_file():
        raise FileNotFoundError(f"{rd.summary_path}: missing; run `bitfault campaign "
                                f"{rd.path}` first")
    summary = read_json(rd.summary_path)
    c = config_from_dict({"campaign": summary["campaign"]}).campaign
    keys, value = curves(config.metric), headline(config.metric)
    models = {r.name: refresh_entry(summary["models"][r.name], c, keys)
              for r in config.recipes if r.name in summary.get("models", {})}
    models = {n: m for n, m in models.items() if m["rate"]}
    if not models:
        raise ValueError(f"{rd.summary_path}: holds no campaign result for this run's "
                         f"recipes {[r.name for r in config.recipes]}")
    left = incomplete(models)
    if left:
        reporter.note(f"incomplete: {', '.join(left)}; rerun `bitfault campaign {rd.path}` "
                      "to finish")
    out_dir = rd.report_dir
    os.makedirs(out_dir, exist_ok=True)
    out: dict[str, str] = {}
    figures: list[tuple[str, str]] = []
    what = rate_name(c.fault)
    for key in keys:
        rows = {n: m["curves"][key] for n, m in models.items()}
        if not any(r["n"] for rs in rows.values() for r in rs):
            continue
        clean = {n: m["clean"][key] for n, m in models.items() if _finite(m["clean"].get(key))}
        out[f"rate_{key}"] = plot_rate_sweep(rows, os.path.join(out_dir, f"rate_{key}.png"),
                                             metric=key, clean=clean, fault=c.fault)
        centre = ("median over the chips where it is finite, band: their 25th-75th "
                  "percentile" if headline_stat(key) == "median" else
                  "mean over the chips where it is finite, 95% band of the mean")
        figures.append((f"{key.replace('_', ' ')} vs {what}: {centre}, worst chip dotted, no "
                        "faults dashed; x: no chip finite at that rate.",
                        out[f"rate_{key}"]))
    layer_tables = []
    stems = file_stems(list(models))
    for n, m in models.items():
        rows = [r for r in m["layer"] if r["n"]]
        if not m["layer"]:
            continue
        if value in BOUNDED_HEADLINES and rows:
            key = f"layers_{stems[n]}"
            out[key] = plot_heatmap(rows, os.path.join(out_dir, f"{key}.png"), by="target",
                                    title=f"{n}: mean {value.replace('_', ' ')} with faults "
                                          "confined to one tensor", fault=c.fault)
            figures.append((f"{n}: sensitivity per tensor", out[key]))
        else:
            layer_tables.append((f"{n}: {value} with faults confined to one tensor",
                                 [{"model": n, **r} for r in m["layer"]], _COLUMNS))
    rate_rows = {n: [r for r in m["rate"] if r["n"]] for n, m in models.items()}
    by_rate, rate_columns = model_rate_table(
        rate_rows, {n: m["clean"].get(value) for n, m in models.items()})
    out["rate_table_csv"], out["rate_table_json"] = write_rows(
        by_rate, os.path.join(out_dir, "rate_table"))
    detail = [{"model": n, **r} for n, m in models.items()
              for group in ("rate", "layer", "bit") for r in m[group]]
    out["summary_csv"], out["summary_json"] = write_rows(detail, os.path.join(out_dir,
                                                                              "summary"))
    classes = [k for k in ("masked", "benign", "sdc", "detected", "non_finite")
               if any(k in o for m in models.values() for o in m["outcomes"])]
    outcomes = [{"model": n, "rate": f"{o['ber']:g}", "trials": o["trials"],
                 **{k: f"{o[k]:.0%} ({o[f'{k}_low']:.0%}-{o[f'{k}_high']:.0%})"
                    for k in classes if k in o}}
                for n, m in models.items() for o in m["outcomes"]]
    intro_models = [{"model": n, "stored as": _stored_as(m["format"]),
                     f"{value}, no faults": m["clean"].get(value), "trials": m["trials"],
                     "stored": m["stored"]} for n, m in models.items()]
    chips = sorted({r["chips"] for m in models.values() for r in m["rate"]})
    d = config.data
    measured = (f"{summary.get('examples')} windows of {d.path} ({d.context} tokens)"
                if config.metric in ("perplexity", "agreement") else
                f"{summary.get('examples')} sentences of {d.path} (at most {d.context} tokens)"
                if config.metric == "cosine" else
                f"the {summary.get('examples')} texts of {d.name or d.path} (at most "
                f"{d.context} tokens), spearman being the rank correlation of the cosine "
                f"similarity of their {summary.get('pairs')} rated pairs with the human "
                "scores")
    lead = (f"This page shows how the {value.replace('_', ' ')} of the pretrained model "
            f"{config.model.path} ({config.model.kind}) changes when {fault_phrase(c.fault)} "
            f"hit its stored weights at increasing {what}s, on "
            f"{'/'.join(map(str, chips))} simulated chips per rate (chip c draws seed "
            f"{c.seed} + c), measured on {measured}. No faults is the model with "
            "its weights in the recipe's storage; every faulty trial is compared with it.")
    if left:
        lead += f" Incomplete campaigns, shown with the trials stored so far: {', '.join(left)}."
    decision = ("each embedding's cosine to no faults at least "
                f"{BENIGN_COSINE:g}" if config.metric in ("cosine", "similarity") else
                "every scored token's top-1")
    tables = [("Outcomes per rate (share of trials masked: outputs bit-identical to no "
               f"faults; benign: outputs changed, {decision} kept; sdc: silent data "
               "corruption, a decision changed; non-finite: a NaN or Inf reached the "
               "outputs; 95% Wilson intervals)", outcomes,
               ("model", "rate", "trials", *classes)), *layer_tables,
              ("Rate sweep (every value)", [{"model": n, **r} for n, m in models.items()
                                            for k in keys for r in m["curves"][k]],
               ("model", "metric", *_COLUMNS[2:]))]
    headline_rows, _ = model_rate_table(
        rate_rows, {n: m["clean"].get(value) for n, m in models.items()}, spread=True)
    out["html"] = write_html(
        os.path.join(out_dir, "report.html"), config.title, lead, figures, tables,
        lead_tables=[("Models", intro_models, tuple(intro_models[0])),
                     (f"{rate_table_caption(rate_rows, value)} over chips by {what} (finite "
                      "chips)", headline_rows, rate_columns)])
    return out


__all__ = ["make_pretrained_report"]
