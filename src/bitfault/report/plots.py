"""Plots of campaign results (matplotlib, Agg backend, imported when called).

Each function takes plain rows (dicts as ``CampaignResult.summary`` returns them,
or training histories) and writes one PNG; none needs a framework.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bitfault.campaign.stats import HIGHER_IS_WORSE, format_rates, headline_stat, metric_bounds
from bitfault.report.labels import rate_label, rate_name


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str | os.PathLike[str]) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return os.fspath(path)


def plot_rate_sweep(curves: Mapping[str, Sequence[Mapping[str, Any]]],
                    path: str | os.PathLike[str], metric: str = "accuracy",
                    clean: Mapping[str, float] | None = None, *, chance: float | None = None,
                    fault: Any = None) -> str:
    """Metric vs fault rate, one line per model with its confidence band and worst chip.

    ``curves[model]`` holds summary rows with ``ber``, ``mean``, ``ci_low``,
    ``ci_high``, ``min`` and ``max`` (and for a heavy-tailed metric, perplexity or KL,
    ``median``, ``p25`` and ``p75``: the line is the median over chips and the band the
    middle half of the chips, which one chip's 1e7 does not move); ``clean[model]`` draws
    the fault-free value,
    ``chance`` a grey chance-level line; ``fault`` (the fault model) names the axis. The
    worst chip is the minimum, or the maximum where a higher value is worse
    (``stats.HIGHER_IS_WORSE``: perplexity, KL); a row without a finite value (``n`` 0:
    every chip's value was NaN or infinite) is marked with an x on the top edge; an
    unbounded positive metric spanning 100x or more (perplexity) gets a log axis, where a
    band reaching 0 or below (a t interval of heavy-tailed values) starts at the lowest
    chip instead.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rates: set[float] = set()
    worst = "max" if metric in HIGHER_IS_WORSE else "min"
    centre = headline_stat(metric)
    if centre == "median" and not all(k in r for rows in curves.values() for r in rows
                                      if _has_value(r) for k in ("median", "p25", "p75")):
        centre = "mean"  # rows without quartiles (a caller's own): the mean and its CI
    low_key, high_key = ("p25", "p75") if centre == "median" else ("ci_low", "ci_high")
    drawn: list[float] = []
    plotted: list[tuple[str, str, list[Mapping[str, Any]]]] = []
    lost: list[tuple[float, str]] = []
    for i, (model, rows) in enumerate(curves.items()):
        rows = sorted((r for r in rows if r["ber"] and r["ber"] > 0), key=lambda r: r["ber"])
        rates.update(float(r["ber"]) for r in rows)
        color = f"C{i}"
        lost += [(float(r["ber"]), color) for r in rows if not _has_value(r)]
        rows = [r for r in rows if _has_value(r)]
        if clean and model in clean:
            ax.axhline(clean[model], color=color, linestyle="--", linewidth=1)
            drawn.append(clean[model])
        if rows:
            drawn += [v for r in rows for v in (r[centre], r[worst], r[high_key])]
            plotted.append((model, color, rows))
    values = np.array([v for v in drawn if v is not None and np.isfinite(v)], np.float64)
    log = bool(metric_bounds(metric) is None and values.size and values.min() > 0
               and values.max() >= 100 * values.min())
    for model, color, rows in plotted:
        ber = np.array([r["ber"] for r in rows])
        low = [r[low_key] if not log or r[low_key] > 0 else r["min"] for r in rows]
        ax.plot(ber, [r[centre] for r in rows], "o-", color=color,
                label=f"{model} ({centre} over chips)")
        ax.fill_between(ber, low, [r[high_key] for r in rows], color=color, alpha=0.25,
                        linewidth=0)
        ax.plot(ber, [r[worst] for r in rows], ":", marker=".", color=color, linewidth=1)
    if log:
        ax.set_yscale("log")
    if lost:
        ax.scatter([b for b, _ in lost], [1.0] * len(lost), marker="x", s=60, clip_on=False,
                   c=[c for _, c in lost], transform=ax.get_xaxis_transform(), zorder=3,
                   label="no chip finite (every value NaN or infinite)")
    if chance is not None:
        ax.axhline(chance, color="0.4", linestyle="-.", linewidth=1,
                   label=f"chance level ({chance:.3g})")
    ax.set_xscale("log")
    _rate_ticks(ax, sorted(rates))
    what = metric.replace("_", " ")
    ax.set_xlabel(rate_label(fault))
    ax.set_ylabel(what)
    band = ("25th-75th percentile of chips" if centre == "median"
            else "95% CI of the mean")
    ax.set_title(textwrap.fill(f"{what} vs {rate_name(fault)} ({centre} over chips; band: "
                               f"{band}; dotted: worst chip; dashed: no faults)", 95))
    ax.title.set_fontsize(9)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _has_value(row: Mapping[str, Any]) -> bool:
    """Whether a summary row holds statistics (``n`` > 0 and a finite mean)."""
    mean = row.get("mean")
    return bool(row.get("n", 1)) and mean is not None and bool(np.isfinite(mean))


def _rate_ticks(ax: Any, rates: Sequence[float]) -> None:
    """One labelled tick per swept rate on the x axis, as ``format_rates`` writes them."""
    from matplotlib.ticker import NullLocator

    if rates:
        ax.set_xticks(list(rates), format_rates(rates))
        ax.xaxis.set_minor_locator(NullLocator())
        crowded = len(rates) > 6 or bool(np.any(np.diff(np.log10(rates)) < 0.35))
        if crowded:
            ax.tick_params(axis="x", labelrotation=45, labelsize=8)
            for label in ax.get_xticklabels():
                label.set_horizontalalignment("right")


def plot_heatmap(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike[str],
                 by: str, title: str, value: str = "mean", *, fault: Any = None,
                 bit_roles: Mapping[int, str] | None = None,
                 chance: float | None = None) -> str:
    """Heatmap of ``value``: one row per ``by`` (tensor name or bit), one column per rate.

    Bits run from the top (most significant) down; ``bit_roles`` names some of them
    (``{0: "LSB", 31: "sign, MSB"}``); ``chance`` is marked on the colour bar.
    """
    plt = _pyplot()
    keys = sorted({r[by] for r in rows}, key=lambda k: (isinstance(k, str), k))
    if by == "bit":
        keys = [k for k in keys if not isinstance(k, str)][::-1] + \
               [k for k in keys if isinstance(k, str)]
    bers = sorted({r["ber"] for r in rows})
    grid = np.full((len(keys), len(bers)), np.nan)
    for r in rows:
        grid[keys.index(r[by]), bers.index(r["ber"])] = r[value]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 + 1.1 * len(bers)),
                                    max(2.8, 1.2 + 0.32 * len(keys))))
    image = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(bers)), format_rates(bers))
    roles = bit_roles or {}
    ax.set_yticks(range(len(keys)), [f"{k} ({roles[k]})" if by == "bit" and k in roles
                                     else str(k) for k in keys])
    ax.set_xlabel(rate_label(fault))
    ax.set_ylabel("tensor" if by == "target" else
                  "bit position (bottom: LSB, top: MSB)")
    for (i, j), v in np.ndenumerate(grid):
        if np.isfinite(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if v < 0.5 else "black")
    bar = fig.colorbar(image, ax=ax, label="mean accuracy" if value == "mean" else value)
    if chance is not None:
        bar.ax.axhline(chance, color="red", linewidth=1.5)
        bar.ax.text(1.05, chance, " chance", transform=bar.ax.get_yaxis_transform(),
                    fontsize=7, va="center", color="red")
    width = fig.get_size_inches()[0]
    ax.set_title(textwrap.fill(title, max(30, int(width * 9))), fontsize=9)
    return _save(fig, path)


def plot_training(histories: Mapping[str, Mapping[str, Sequence[float]]],
                  path: str | os.PathLike[str]) -> str:
    """Loss and accuracy per epoch for each model.

    ``histories[model]`` holds ``"loss"`` and ``"accuracy"`` (test accuracy) lists, or
    the columns of ``bitfault.recipes.history_columns``: then ``"clean_loss"`` is the
    loss drawn (without RandBET's perturbed term), ``"val_accuracy"`` the test
    accuracy (solid) and ``"train_accuracy"`` is dotted. NaN/None are gaps.
    """
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for i, (model, hist) in enumerate(histories.items()):
        test_key = "val_accuracy" if _finite(hist.get("val_accuracy")) else "accuracy"
        loss_key = "clean_loss" if _finite(hist.get("clean_loss")) else "loss"
        for key, ax, style, label in ((loss_key, left, "o-", model),
                                      (test_key, right, "o-", model),
                                      ("train_accuracy", right, ":", None)):
            values = hist.get(key)
            if _finite(values):
                y = np.array([np.nan if v is None else v for v in values], dtype=float)
                ax.plot(range(1, len(y) + 1), y, style, color=f"C{i}", label=label,
                        markersize=3)
    left.set_xlabel("epoch")
    left.set_ylabel("training loss")
    right.set_xlabel("epoch")
    right.set_ylabel("test accuracy (dotted: training batches)")
    from matplotlib.ticker import MaxNLocator

    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("training curves", fontsize=10)
    return _save(fig, path)


def _finite(values: Sequence[float] | None) -> bool:
    """Whether ``values`` holds at least one finite number."""
    if not values:
        return False
    return any(v is not None and np.isfinite(v) for v in values)


__all__ = ["plot_heatmap", "plot_rate_sweep", "plot_training"]
