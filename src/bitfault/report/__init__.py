"""Reports a person can read: accuracy vs fault rate with confidence bands, per-layer and
per-bit sensitivity heatmaps, training curves; PNG files, one self-contained HTML page, and
the numbers as CSV/JSON. Needs matplotlib (``bitfault[report]``), imported when used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from bitfault.campaign.stats import format_rates, headline_stat
from bitfault.formats import format_from_dict, plane_formats
from bitfault.formats.blocks import CODES
from bitfault.report.html import Table, write_html, write_rows
from bitfault.report.labels import bit_roles, fault_phrase, file_stems, rate_label, rate_name
from bitfault.report.plots import plot_heatmap, plot_rate_sweep, plot_training
from bitfault.report.schemes import plot_schemes, scheme_table

_SUMMARY_COLUMNS = ("model", "kind", "ber", "target", "bit", "n", "mean", "std", "median",
                    "min", "max", "ci_low", "ci_high")
_CI_METHODS = {"wilson_effective_n": "a Wilson score interval at the chips' effective sample "
                                     "size with Student's t quantile, inside [0, 1]",
               "student_t": "Student's t",
               "student_t_clipped": "Student's t, cut at the metric's lower bound"}


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
    tables: Sequence[Table] = (),
    more_tables: Sequence[Table] = (),
    fault: Any = None,
    formats: Mapping[str, Any] | None = None,
    chance: float | None = None,
    comparison: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """Write every plot, ``summary.csv``/``.json``, ``rate_table.csv``/``.json`` (model x
    rate) and ``report.html`` into ``out_dir``; returns {artefact: path}.

    ``rate_rows[model]``, ``layer_rows[model]`` and ``bit_rows[model]`` are summary rows
    as ``CampaignResult.summary()`` returns them; ``histories[model]`` as
    ``plot_training`` reads them. The page opens with two sentences on what it shows,
    ``intro``, ``tables`` (e.g. the models) and the model x rate table; the figures and
    ``more_tables`` follow, the rate-sweep numbers last. ``fault`` (the fault model)
    names the rate axis, ``formats[model]`` (a format or its dict) which end of a word
    is the LSB, ``chance`` (e.g. 1 / classes) draws the chance level. ``comparison``
    (memories compared in one campaign, ``bitfault.jobs.compare``) adds, first, one plot
    per model of accuracy vs raw bit error rate per scheme with its outcome shares, and
    the overhead vs robust accuracy table (``schemes.csv``/``.json``).
    """
    if not rate_rows:
        raise ValueError("rate_rows must hold at least one model's rate-sweep summary")
    if chance is not None and not 0.0 <= chance <= 1.0:
        raise ValueError(f"chance must be None or in [0, 1], got {chance!r}")
    rate_label(fault)  # a bad fault is refused before anything is written
    compared = dict(comparison["models"]) if comparison else {}
    if any(not isinstance(e, Mapping) or not e.get("schemes") for e in compared.values()):
        raise ValueError("comparison['models'] must map each model to its compared schemes")
    groups = {"layers": (layer_rows or {}, "target"), "bits": (bit_rows or {}, "bit")}
    stems = file_stems([m for rows, _ in groups.values() for m, r in rows.items() if r])
    os.makedirs(out_dir, exist_ok=True)
    out: dict[str, str] = {}
    figures: list[tuple[str, str]] = []
    what = rate_name(fault)
    scheme_stems = file_stems(compared)
    for model, entry in compared.items():
        key = f"schemes_{scheme_stems[model]}"
        out[key] = plot_schemes(model, entry, os.path.join(out_dir, f"{key}.png"),
                                raw_ber=str(comparison.get("raw_ber", "")))
        figures.append((f"{model}: accuracy vs raw bit error rate for each memory, on the "
                        "same simulated chips (mean over chips, 95% interval band; "
                        "no-fault accuracy dashed), and the share of trials masked (every "
                        "word read back as stored), benign (words read back wrong, accuracy "
                        "kept), silently corrupted (accuracy below fault-free, not detected) "
                        "and detected (a word detected uncorrectable) at each swept rate. "
                        "Raw bit error "
                        "rate: raw bit errors over physical bits, data and check, so schemes "
                        "with check bits are compared at equal physical fault density.",
                        out[key]))
    out["rate_sweep"] = plot_rate_sweep(rate_rows, os.path.join(out_dir, "rate_sweep.png"),
                                        clean=clean, chance=chance, fault=fault)
    figures.append((f"Accuracy vs {what} for each model: mean over simulated chips, 95% "
                    "confidence band of the mean, worst chip dotted, no-fault accuracy "
                    "dashed" + (", chance level dash-dotted grey." if chance is not None
                                else "."), out["rate_sweep"]))
    for kind, (rows_by_model, by) in groups.items():
        for model, all_rows in rows_by_model.items():
            if not all_rows:
                continue
            parts = split_bit_rows(all_rows) if by == "bit" else {CODES: list(all_rows)}
            for plane, rows in parts.items():
                unit = "tensor" if by == "target" else "bit position" if plane == CODES \
                    else f"bit of the {plane} words"
                key = f"{kind}_{stems[model]}" + ("" if plane == CODES else f"_{plane}")
                roles = None
                if by == "bit" and formats and model in formats:
                    fmt = formats[model]
                    fmt = format_from_dict(fmt) if isinstance(fmt, Mapping) else fmt
                    roles = bit_roles(plane_formats(fmt)[plane])
                out[key] = plot_heatmap(rows, os.path.join(out_dir, f"{key}.png"), by=by,
                                        title=f"{model}: mean accuracy with faults confined to "
                                              f"one {unit}", fault=fault, bit_roles=roles,
                                        chance=chance)
                note = (" (bit 0 is the least significant; the most significant, the sign bit "
                        "in signed formats, is at the top)" if by == "bit" else "")
                figures.append((f"{model}: sensitivity per {unit}{note}", out[key]))
    if histories:
        out["training"] = plot_training(histories, os.path.join(out_dir, "training.png"))
        figures.append(("Training loss and test accuracy per epoch (clean stored weights; "
                        "dotted: accuracy on the training batches).", out["training"]))
    summary = [{"model": model, **row}
               for group in (rate_rows, layer_rows or {}, bit_rows or {})
               for model, rows in group.items() for row in rows]
    out["summary_csv"], out["summary_json"] = write_rows(summary,
                                                         os.path.join(out_dir, "summary"))
    by_rate, rate_columns = model_rate_table(rate_rows, clean)
    out["rate_table_csv"], out["rate_table_json"] = write_rows(
        by_rate, os.path.join(out_dir, "rate_table"))
    rate_detail = [{"model": m, **r} for m, rows in rate_rows.items() for r in rows]
    methods = sorted({r.get("ci_method", "student_t") for r in rate_detail})
    detail = ("Rate sweep (confidence interval of the mean: "
              + "; ".join(_CI_METHODS.get(m, m) for m in methods) + ")")
    chips = sorted({int(r["n"]) for r in rate_detail if "n" in r})
    lead = (f"This page shows how much test accuracy each of {len(rate_rows)} models keeps "
            f"when {fault_phrase(fault)} hit its stored weights at increasing {what}s, "
            f"measured on {'/'.join(map(str, chips)) or 'several'} simulated chips per rate. "
            f"The tables first give the models and their mean accuracy at each {what}; the "
            "plots below show the same with confidence bands and, where the campaign ran "
            "them, which tensors and bits are fragile.")
    first = list(tables)
    if compared:
        caption, rows, columns = scheme_table(comparison)
        out["schemes_csv"], out["schemes_json"] = write_rows(rows, os.path.join(out_dir,
                                                                                "schemes"))
        first.append((caption, rows, columns))
    headline, _ = model_rate_table(rate_rows, clean, spread=True)
    out["html"] = write_html(
        os.path.join(out_dir, "report.html"), title, f"{lead}\n\n{intro}", figures,
        [*more_tables, (detail, rate_detail, _SUMMARY_COLUMNS)],
        lead_tables=[*first, (f"{rate_table_caption(rate_rows, 'accuracy')} over chips by "
                              f"model and {what}", headline, rate_columns)])
    return out


def rate_table_caption(rate_rows: Mapping[str, Sequence[Mapping[str, Any]]],
                       default: str = "value") -> str:
    """What ``model_rate_table`` headlines: "Mean accuracy", or "Median perplexity [25th,
    75th percentile]" for a heavy-tailed metric (``stats.headline_stat``)."""
    metric = next((str(r["metric"]) for rows in rate_rows.values() for r in rows
                   if r.get("metric")), default)
    if headline_stat(metric) == "median":
        return f"Median {metric.replace('_', ' ')} [25th, 75th percentile]"
    return f"Mean {metric.replace('_', ' ')}"


def model_rate_table(rate_rows: Mapping[str, Sequence[Mapping[str, Any]]],
                     clean: Mapping[str, float] | None = None, *, spread: bool = False
                     ) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows, columns): one row per model, its no-fault value then its headline at each
    rate (``stats.headline_stat`` of the row's metric: the median of perplexity or KL,
    where one chip's 1e7 would carry the mean, else the mean), the rate columns named as
    ``format_rates`` writes them; ``spread``: a median as text with its quartiles,
    ``37.45 [37.4, 37.5]``."""
    rates = sorted({float(r["ber"]) for rows in rate_rows.values() for r in rows})
    names = dict(zip(rates, format_rates(rates), strict=True))
    columns = ["model", *(["no faults"] if clean else []), *names.values()]
    table = []
    for model, rows in rate_rows.items():
        row: dict[str, Any] = {"model": model}
        if clean:
            row["no faults"] = clean.get(model, "")
        values = {float(r["ber"]): _headline(r, spread) for r in rows}
        row.update({names[b]: values.get(b, "") for b in rates})
        table.append(row)
    return table, columns


def _headline(row: Mapping[str, Any], spread: bool) -> Any:
    stat = headline_stat(str(row.get("metric", "")))
    if stat == "median" and "median" in row:
        return (f"{row['median']:.4g} [{row['p25']:.4g}, {row['p75']:.4g}]" if spread
                else row["median"])
    return row["mean"]


def split_bit_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """A bit sweep's rows by plane: the codes' bits (ints, field names) under "codes", a
    block format's other planes' bits (``"scale.7"``) under their plane, as ints."""
    parts: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        bit, plane = row["bit"], CODES
        if isinstance(bit, str) and "." in bit and bit.rsplit(".", 1)[1].isdigit():
            plane, index = bit.rsplit(".", 1)
            bit = int(index)
        parts.setdefault(plane, []).append({**row, "bit": bit})
    return parts


__all__ = [
    "build_report",
    "model_rate_table",
    "plot_heatmap",
    "plot_rate_sweep",
    "plot_schemes",
    "plot_training",
    "rate_table_caption",
    "scheme_table",
    "split_bit_rows",
    "write_html",
    "write_rows",
]
