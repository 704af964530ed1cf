"""Summaries of pretrained-model campaigns, from their stores (framework-free).

A recipe's entry in ``summary.json`` gives, per trial kind and rate, the headline value of
the run's metric (``perplexity``, ``next_token_agreement``, ``cosine``) and the curves of
its other values, each over the chips whose value is finite (a faulty fp16 scale can make
perplexity infinite: such chips are counted in ``non_finite``, never averaged), and the
share of trials masked / non-finite / corrupted with Wilson intervals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bitfault.config import CampaignConfig
from bitfault.formats import GGUF
from bitfault.jobs.summary import build_trials, read_records
from bitfault.memory import Memory
from bitfault.stats import summary_rows

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


def _cell(text: str) -> str:
    """A column: one space, then ``text`` right-aligned in 18 (``3.751e+153 (4 inf)`` fills
    them)."""
    return " " + text.rjust(18)


def format_metric_table(summary: dict[str, Any]) -> str:
    """Plain text: one row per recipe, the clean value then the headline's mean per rate
    (over the chips where it is finite; ``(k inf)`` counts the others)."""
    from bitfault.stats import format_rates

    models = summary["models"]
    value = summary.get("value", "value")
    bers = sorted({r["ber"] for m in models.values() for r in m["rate"]})
    labels = format_rates(bers) if bers else []
    width = max([len("model")] + [len(n) for n in models]) + 2
    lines = [f"mean {value.replace('_', ' ')} over simulated chips (finite chips), by bit "
             "error rate", "model".ljust(width) + "no faults".rjust(12)
             + "".join(_cell(label) for label in labels)]
    for name, m in models.items():
        by = {r["ber"]: r for r in m["rate"]}
        cells = []
        for b in bers:
            r = by.get(b)
            if r is None or not r["n"]:
                cells.append(_cell("-" if r is None else f"({r['non_finite']} inf)"))
                continue
            extra = f" ({r['non_finite']} inf)" if r["non_finite"] else ""
            cells.append(_cell(f"{r['mean']:.4g}{extra}"))
        clean = m["clean"].get(value)
        lines.append(name.ljust(width) + (f"{clean:12.4g}" if isinstance(clean, (int, float))
                                          else "-".rjust(12)) + "".join(cells))
    return "\n".join(lines)


__all__ = ["GGUF_FILE", "format_metric_table", "pretrained_entry",
           "refresh_entry", "trial_memory"]
