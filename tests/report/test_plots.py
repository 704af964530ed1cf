"""plot_rate_sweep draws what the rows say: the worst chip by the metric's direction, a log
axis for perplexities spanning orders of magnitude, a mark where no chip was finite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from bitfault.report import plots


def _row(ber: float, values: list[float]) -> dict[str, Any]:
    v = np.array(values)
    p25, median, p75 = np.percentile(v, [25, 50, 75])
    return {"ber": ber, "n": len(v), "mean": float(v.mean()), "ci_low": float(v.min()),
            "ci_high": float(v.max()), "min": float(v.min()), "max": float(v.max()),
            "p25": float(p25), "median": float(median), "p75": float(p75)}


def _drawn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, metric: str,
           rows: list[dict[str, Any]], clean: float) -> Any:
    """The axes plot_rate_sweep would save (captured instead of written)."""
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or str(path))
    plots.plot_rate_sweep({"m": rows}, tmp_path / "r.png", metric=metric, clean={"m": clean})
    (fig,) = figures
    (ax,) = fig.axes
    return ax


def test_perplexity_worst_chip_is_the_highest_and_its_axis_is_log(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rows = [_row(1e-6, [20.0, 25.0, 4e5]), {**_row(1e-5, [30.0, 9e7]), "ci_low": -4e8},
            {"ber": 1e-4, "n": 0, "chips": 3, "non_finite": 3}]
    ax = _drawn(monkeypatch, tmp_path, "perplexity", rows, 19.5)
    assert ax.get_yscale() == "log"
    (band,) = ax.collections[:1]
    assert band.get_paths()[0].vertices[:, 1].min() == 22.5  # the quartiles, not the t CI
    dotted = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
    assert [list(ln.get_ydata()) for ln in dotted] == [[4e5, 9e7]]
    median = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"]
    assert list(median[0].get_xdata()) == [1e-6, 1e-5]  # the all-infinite rate has no point
    assert list(median[0].get_ydata()) == [25.0, 30.0 + (9e7 - 30.0) / 2]
    (marks,) = ax.collections[1:]  # after the band: the x of the rate with no finite chip
    assert [list(p) for p in marks.get_offsets()] == [[1e-4, 1.0]]
    assert "no chip finite" in ax.get_legend_handles_labels()[1][-1]


def test_accuracy_worst_chip_is_the_lowest_on_a_linear_axis(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rows = [_row(1e-3, [0.97, 0.95]), _row(1e-2, [0.5, 0.01])]
    ax = _drawn(monkeypatch, tmp_path, "accuracy", rows, 0.98)
    assert ax.get_yscale() == "linear"  # bounded: never log, though it spans 98x
    dotted = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
    assert [list(ln.get_ydata()) for ln in dotted] == [[0.95, 0.01]]
    assert len(ax.collections) == 1  # the band only: every rate has a finite chip


def test_a_narrow_perplexity_range_stays_linear(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    ax = _drawn(monkeypatch, tmp_path, "perplexity", [_row(1e-6, [20.0, 21.0])], 19.5)
    assert ax.get_yscale() == "linear"


def test_a_heavy_tailed_perplexity_is_drawn_as_its_median(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    # SmolLM2 at 1e-8: two chips keep the fault-free 37.46, one flipped exponent gives 1e7
    ax = _drawn(monkeypatch, tmp_path, "perplexity", [_row(1e-8, [37.4, 37.5, 1e7])], 37.46)
    (line,) = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"]
    assert list(line.get_ydata()) == [37.5] and "median over chips" in line.get_label()
    assert "median over chips" in ax.get_title()
    bare = {k: v for k, v in _row(1e-8, [37.4, 1e7]).items() if k not in ("median", "p25")}
    ax = _drawn(monkeypatch, tmp_path, "perplexity", [bare], 37.46)  # no quartiles: the mean
    assert "mean over chips" in ax.get_title()
