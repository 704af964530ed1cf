"""Summaries of pretrained-model campaigns, from their stores (framework-free).

A recipe's entry in ``summary.json`` gives, per trial kind and rate, the headline value of
the run's metric (``perplexity``, ``next_token_agreement``, ``cosine``) and the curves of
its other values, each over the chips whose value is finite (a faulty fp16 scale can make
perplexity infinite: such chips are counted in ``non_finite``, never averaged), and the
share of trials in each outcome class (masked, benign, sdc, non-finite) with Wilson
intervals. The table the command prints headlines the median and quartiles of a
heavy-tailed value (perplexity, KL), the mean of the others.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bitfault.campaign.stats import summary_rows
from bitfault.config import CampaignConfig
from bitfault.formats import GGUF
from bitfault.jobs.summary import build_trials, read_records
from bitfault.memory.memory import Memory

GGUF_FILE = "gguf file"  # an entry's "format" for a GGUF file's own storage


def trial_memory(fmt: Any, c: CampaignConfig) -> Memory:
    """The memory that plans a recipe's trials: its format (a GGUF file: Q4_1's planes)."""
    return Memory(GGUF("q4_1") if fmt == GGUF_FILE else fmt, c.fault, c.plane_rates)


def pretrained_entry(c: CampaignConfig, fmt: Any, keys: tuple[str, ...],
                     shapes: dict[str, Any], clean: dict[str, Any], store: Path
                     ) -> dict[str, Any]:
    """One recipe's summary entry from its store: what it holds of the planned trials,
    ``keys[0]`` (the headline) by rate, tensor and bit, every key's rate curve, outcomes."""
    from bitfault.campaign.metrics import outcome_summary

    trials = build_trials(c, trial_memory(fmt, c), shapes)
    records = read_records(store, {t.key for t in trials})
    rows = summary_rows(records, keys[0])
    rate_records = [r for r in records if r.kind == "rate"]
    return {
        "format": fmt, "value": keys[0], "clean": clean,
        "tensors": {n: list(s) for n, s in shapes.items()}, "store": str(store),
        "trials": len(trials), "stored": len(records), "complete": len(records) == len(trials),
        "rate": [r for r in rows if r["kind"] == "rate"],
        "layer": [r for r in rows if r["kind"] == "layer"],
        "bit": [r for r in rows if r["kind"] == "bit"],
        "curves": {k: summary_rows(rate_records, k) for k in keys},
        "outcomes": outcome_summary(rate_records) if rate_records else []}


def refresh_entry(entry: dict[str, Any], c: CampaignConfig, keys: tuple[str, ...]
                  ) -> dict[str, Any]:
    """``entry`` rebuilt from its store as it is now (``ran`` / ``skipped`` kept)."""
    shapes = {n: tuple(s) for n, s in entry["tensors"].items()}
    fresh = pretrained_entry(c, entry["format"], keys, shapes, entry["clean"],
                             Path(entry["store"]))
    for k in ("ran", "skipped"):
        if k in entry:
            fresh[k] = entry[k]
    return fresh


def _cell(text: str, width: int = 18) -> str:
    """A column: one space, then ``text`` right-aligned in ``width`` (``3.751e+153 (4 inf)``
    fills the default)."""
    return " " + text.rjust(width)


def _value_text(row: dict[str, Any], stat: str) -> str:
    """A rate's cell: the mean, or the median with its quartiles ``37.45 [37.4, 37.5]``;
    ``(k inf)`` counts the chips where the value is not finite."""
    extra = f" ({row['non_finite']} inf)" if row["non_finite"] else ""
    if stat == "median":
        return f"{row['median']:.4g} [{row['p25']:.4g}, {row['p75']:.4g}]{extra}"
    return f"{row['mean']:.4g}{extra}"


def format_metric_table(summary: dict[str, Any]) -> str:
    """Plain text: one row per recipe, the clean value then the headline per rate over the
    chips where it is finite (``(k inf)`` counts the others): the median [25th, 75th
    percentile] of a heavy-tailed value (perplexity, KL: ``stats.headline_stat``), where
    one chip's 1e7 would make the mean meaningless, else the mean."""
    from bitfault.campaign.stats import format_rates, headline_stat

    models = summary["models"]
    value = summary.get("value", "value")
    stat = headline_stat(value)
    bers = sorted({r["ber"] for m in models.values() for r in m["rate"]})
    labels = format_rates(bers) if bers else []
    width = max([len("model")] + [len(n) for n in models]) + 2
    rows = []
    for name, m in models.items():
        by = {r["ber"]: r for r in m["rate"]}
        cells = ["-" if by.get(b) is None else _value_text(by[b], stat) if by[b]["n"]
                 else f"({by[b]['non_finite']} inf)" for b in bers]
        rows.append((name, m, cells))
    cell = max([18] + [len(t) for _, _, cells in rows for t in cells])
    what = (f"median {value.replace('_', ' ')} [25th, 75th percentile]" if stat == "median"
            else f"mean {value.replace('_', ' ')}")
    lines = [f"{what} over simulated chips (finite chips), by bit error rate",
             "model".ljust(width) + "no faults".rjust(12)
             + "".join(_cell(label, cell) for label in labels)]
    for name, m, cells in rows:
        clean = m["clean"].get(value)
        lines.append(name.ljust(width) + (f"{clean:12.4g}" if isinstance(clean, (int, float))
                                          else "-".rjust(12))
                     + "".join(_cell(t, cell) for t in cells))
    return "\n".join(lines)


__all__ = ["GGUF_FILE", "format_metric_table", "pretrained_entry",
           "refresh_entry", "trial_memory"]
