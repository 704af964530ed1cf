"""Memories compared in one campaign: accuracy vs raw bit error rate, one line per scheme,
the masked / benign / SDC / detected shares beside it, and the overhead vs robust
accuracy table.

Both read one model's entry of a ``comparison`` (``bitfault.jobs.compare``): its
``clean_accuracy`` and ``schemes``, each with ``name``, ``storage``, ``overhead``,
``check_bits_per_data_bit``, ``within_tolerance_up_to``, ``raw_ber_within_tolerance`` and
``points`` (per rate ``ber``, ``raw_ber``, ``mean``, ``ci_low``, ``ci_high`` and the
shares ``detected``, ``sdc``, ``benign``, ``masked``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from bitfault.campaign.stats import format_rates
from bitfault.report.plots import _pyplot, _save

_SHARES = (("masked", "masked", "#4c9a4c"), ("benign", "benign", "#9ccc8c"),
           ("sdc", "silent data corruption", "#d04a3c"),
           ("detected", "detected (DUE)", "#e8a33d"))


def protection_text(storage: Mapping[str, Any]) -> str:
    """A memory's protection in words: "SEC-DED (72,64)", "scale: parity (65,64)"."""
    from bitfault.memory.codes import protection_from_dict

    word = int(storage.get("word_bits", 64))
    prot = storage.get("protection", {"kind": "none"})

    def one(d: Any) -> str:
        scheme = protection_from_dict(d)
        kind = scheme.to_dict()["kind"]
        if kind == "none":
            return "none"
        name = "SEC-DED" if kind == "secded" else kind
        return f"{name} ({word + scheme.check_bits(word)},{word})"

    if isinstance(prot, Mapping) and "kind" not in prot:
        return "; ".join(f"{p}: {one(d)}" for p, d in prot.items()) + "; other planes none"
    return one(prot)


def pattern_text(storage: Mapping[str, Any]) -> str:
    """A memory's fault pattern in words: "independent bits", "mbu sizes 1: 0.8, 2: 0.2"."""
    pattern = dict(storage.get("pattern", {"kind": "independent"}))
    kind = pattern.pop("kind", "independent")
    if kind == "independent" and not pattern:
        return "independent bits"
    extra = ", ".join(f"{k} {v}" if not isinstance(v, Mapping) else
                      f"{k} " + ", ".join(f"{a}: {b:g}" for a, b in v.items())
                      for k, v in pattern.items())
    return f"{kind} {extra}".strip()


def plot_schemes(model: str, entry: Mapping[str, Any], path: str | os.PathLike[str], *,
                 raw_ber: str = "") -> str:
    """Left: mean accuracy (95% interval over chips) vs raw bit error rate, one line per
    scheme, fault-free dashed; right: each scheme's masked / benign / SDC / detected
    shares per swept rate. ``raw_ber`` (its definition) is written under the plot."""
    import numpy as np

    plt = _pyplot()
    schemes = list(entry["schemes"])
    rates = sorted({p["ber"] for s in schemes for p in s["points"]})
    fig = plt.figure(figsize=(11, max(4.6, 1.5 * len(schemes) + 1.2)))
    grid = fig.add_gridspec(len(schemes), 2, width_ratios=(1.6, 1.0))
    ax = fig.add_subplot(grid[:, 0])
    for i, s in enumerate(schemes):
        pts = [p for p in s["points"] if p.get("raw_ber")]
        if not pts:
            continue
        x = np.array([p["raw_ber"] for p in pts])
        ax.plot(x, [p["mean"] for p in pts], "o-", color=f"C{i}", label=s["name"])
        ax.fill_between(x, [p["ci_low"] for p in pts], [p["ci_high"] for p in pts],
                        color=f"C{i}", alpha=0.2, linewidth=0)
    if entry.get("clean_accuracy") is not None:
        ax.axhline(entry["clean_accuracy"], color="0.4", linestyle="--", linewidth=1,
                   label=f"no faults ({entry['clean_accuracy']:.3f})")
    ax.set_xscale("log")
    ax.set_xlabel("raw bit error rate (raw bit errors / physical bits, data and check)")
    ax.set_ylabel("accuracy (mean over chips, 95% interval)")
    ax.set_title(f"{model}: accuracy vs raw bit error rate per protection scheme,\n"
                 "compared at equal physical fault density (check bits fault too)",
                 fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    labels = format_rates(rates)
    for i, s in enumerate(schemes):
        bar = fig.add_subplot(grid[i, 1])
        by_rate = {p["ber"]: p for p in s["points"]}
        bottom = np.zeros(len(rates))
        for key, label, color in _SHARES:
            share = np.array([by_rate.get(r, {}).get(key) or 0.0 for r in rates])
            bar.bar(range(len(rates)), share, bottom=bottom, color=color, label=label)
            bottom += share
        bar.set_ylim(0, 1.3)  # room for the legend above the bars
        bar.set_yticks([0, 0.5, 1])
        bar.set_ylabel(s["name"], fontsize=8)
        bar.set_xticks(range(len(rates)), labels if i == len(schemes) - 1 else [""] * len(rates),
                       fontsize=7)
        bar.tick_params(axis="y", labelsize=7)
        if i == 0:
            bar.set_title("share of trials per swept rate", fontsize=9)
            bar.legend(fontsize=6, loc="upper left", ncol=3)
    fig.axes[-1].set_xlabel("swept rate", fontsize=8)
    if raw_ber:
        fig.text(0.01, 0.005, raw_ber, fontsize=7, color="0.3")
        fig.tight_layout(rect=(0, 0.04, 1, 1))
    return _save(fig, path)


def _percent(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def scheme_rows(model: str, entry: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows, columns) of the overhead vs robust accuracy table: one row per scheme."""
    rates = sorted({p["ber"] for s in entry["schemes"] for p in s["points"]})
    names = dict(zip(rates, format_rates(rates), strict=True))
    columns = ["model", "memory", "protection", "pattern",
               "storage overhead (check bits per data bit)", "no faults",
               *(f"p={names[r]}" for r in rates), "within 0.5 pt up to"]
    rows = []
    for s in entry["schemes"]:
        planes = s["overhead"]
        overhead = f"{100 * s['check_bits_per_data_bit']:.1f}%" + (
            " (" + ", ".join(f"{p} {100 * v:.1f}%" for p, v in planes.items()) + ")"
            if len(planes) > 1 else "")
        row: dict[str, Any] = {"model": model, "memory": s["name"],
                               "protection": protection_text(s["storage"]),
                               "pattern": pattern_text(s["storage"]),
                               columns[4]: overhead,
                               "no faults": _percent(entry.get("clean_accuracy"))}
        by_rate = {p["ber"]: p for p in s["points"]}
        for r in rates:
            p = by_rate.get(r)
            row[f"p={names[r]}"] = "-" if p is None else (
                f"{_percent(p['mean'])} (raw {p['raw_ber']:.2e})" if p.get("raw_ber")
                is not None else _percent(p["mean"]))
        up = s.get("within_tolerance_up_to")
        raw = s.get("raw_ber_within_tolerance")
        row[columns[-1]] = "none" if up is None else (
            f"{format_rates([up])[0]}" + (f" (raw {raw:.2e})" if raw is not None else ""))
        rows.append(row)
    return rows, columns


def scheme_table(comparison: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]], list[str]]:
    """The overhead vs robust accuracy table of every model in ``comparison``, its
    caption stating what the columns mean."""
    rows: list[dict[str, Any]] = []
    columns: Sequence[str] = ()
    for model, entry in comparison["models"].items():
        r, columns = scheme_rows(model, entry)
        rows += r
    caption = ("Storage overhead vs robust accuracy per memory\n\nOverhead: check bits per data "
               "bit of the faulted planes' memory words (Storage.overhead per plane). Each "
               "p=... column: mean accuracy over chips at that swept rate, with the raw bit "
               "error rate measured there (raw bit errors / physical bits, data and check). "
               "Within 0.5 pt up to: the " + comparison.get("robust", "highest rate whose "
                                                          "accuracy stays within 0.5 points "
                                                          "of fault-free") + ".")
    return caption, rows, list(columns)


__all__ = ["pattern_text", "plot_schemes", "protection_text", "scheme_rows", "scheme_table"]
