"""Reports a person can read: accuracy vs bit error rate with confidence bands, per-layer and
per-bit sensitivity heatmaps, training curves; PNG files, one self-contained HTML page, and
the numbers as CSV/JSON. Needs matplotlib (``bitfault[report]``), imported when used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from bitfault.report.html import write_html, write_rows
from bitfault.report.plots import plot_heatmap, plot_rate_sweep, plot_training

_SUMMARY_COLUMNS = ("model", "kind", "ber", "target", "bit", "n", "mean", "std", "min", "max",
                    "ci_low", "ci_high")


def build_report(
    out_dir: str | os.PathLike[str],
    rate_rows: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    clean: Mapping[str, float] | None = None,
    layer_rows: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    bit_rows: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    histories: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
    title: str = "bitfault report",
    intro: str = "",
    tables: Sequence[tuple[str, Sequence[Mapping[str, Any]], Sequence[str]]] = (),
) -> dict[str, str]:
    """Write every plot, ``summary.csv``/``summary.json`` and ``report.html`` into ``out_dir``.

    ``rate_rows[model]``, ``layer_rows[model]`` and ``bit_rows[model]`` are summary rows
    as ``CampaignResult.summary()`` returns them; ``histories[model]`` as
    ``plot_training`` reads them. ``tables``: more (caption, rows, columns) tables for
    the page, before the rate-sweep table. Returns {artefact: path}.
    """
    os.makedirs(out_dir, exist_ok=True)
    if not rate_rows:
        raise ValueError("rate_rows must hold at least one model's rate-sweep summary")
    out: dict[str, str] = {}
    figures: list[tuple[str, str]] = []
    out["rate_sweep"] = plot_rate_sweep(rate_rows, os.path.join(out_dir, "rate_sweep.png"),
                                        clean=clean)
    figures.append(("Accuracy vs bit error rate for each model: mean over simulated chips, "
                    "95% confidence band of the mean, worst chip dotted, no-fault accuracy "
                    "dashed.", out["rate_sweep"]))
    for kind, rows_by_model, by in (("layers", layer_rows, "target"), ("bits", bit_rows, "bit")):
        for model, rows in (rows_by_model or {}).items():
            if not rows:
                continue
            key = f"{kind}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', model).strip('_')}"
            out[key] = plot_heatmap(rows, os.path.join(out_dir, f"{key}.png"), by=by,
                                    title=f"{model}: mean accuracy with faults confined to one "
                                          f"{'tensor' if by == 'target' else 'bit position'}")
            figures.append((f"{model}: sensitivity per "
                            f"{'tensor' if by == 'target' else 'bit position'}", out[key]))
    if histories:
        out["training"] = plot_training(histories, os.path.join(out_dir, "training.png"))
        figures.append(("Training loss and test accuracy per epoch (clean stored weights; "
                        "dotted: accuracy on the training batches).", out["training"]))
    summary = [{"model": model, **row}
               for group in (rate_rows, layer_rows or {}, bit_rows or {})
               for model, rows in group.items() for row in rows]
    out["summary_csv"], out["summary_json"] = write_rows(summary,
                                                         os.path.join(out_dir, "summary"))
    rate_table = [{"model": m, **r} for m, rows in rate_rows.items() for r in rows]
    out["html"] = write_html(os.path.join(out_dir, "report.html"), title, intro, figures,
                             [*tables, ("Rate sweep", rate_table, _SUMMARY_COLUMNS)])
    return out


__all__ = ["build_report", "plot_heatmap", "plot_rate_sweep", "plot_training", "write_html",
           "write_rows"]
