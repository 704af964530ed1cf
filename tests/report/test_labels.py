"""Report numbers and words (issue 14, items 10, 11, 19): rates that read differently, the
chance level, LSB/MSB, fault-model axis labels, unique figure files, what comes first."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

import bitfault as bf
from bitfault.campaign import NumpyEvaluator, rate_sweep, run
from bitfault.jobs.report import format_rate_table
from bitfault.report.labels import bit_roles, file_stems, rate_label

pytest.importorskip("matplotlib")
from bitfault.report import build_report, model_rate_table, plots


def rate_rows(means: dict[float, float], n: int = 3) -> list[dict[str, Any]]:
    return [{"kind": "rate", "ber": b, "n": n, "mean": m, "std": 0.01, "min": m - 0.01,
             "max": m, "ci_low": m - 0.02, "ci_high": min(1.0, m + 0.02),
             "ci_method": "wilson_effective_n"} for b, m in means.items()]


def bit_rows(bits: range) -> list[dict[str, Any]]:
    return [{"kind": "bit", "ber": 0.01, "bit": b, "n": 2, "mean": 0.9 - 0.1 * (b > 5)}
            for b in bits]


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every matplotlib figure the report saves, kept for inspection."""
    saved: list[Any] = []
    save = plots._save

    def keep(fig: Any, path: Any) -> str:
        saved.append(fig)
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return saved


def test_figure_files_are_unique_per_recipe(tmp_path: Path) -> None:
    # "x+y" and "x_y" both wrote bits_x_y.png before (issue 14, item 19).
    rows = {"x+y": rate_rows({0.01: 0.8}), "x_y": rate_rows({0.01: 0.7})}
    out = build_report(tmp_path, rows, bit_rows={"x+y": bit_rows(range(8)),
                                                 "x_y": bit_rows(range(8))})
    heatmaps = sorted(p for k, p in out.items() if k.startswith("bits_"))
    assert len(heatmaps) == 2 and len(set(heatmaps)) == 2
    assert Path(out["html"]).read_text().count('data-file="bits_') == 2


def test_a_block_format_gets_one_bit_heatmap_per_plane(tmp_path: Path, figures) -> None:
    rows = {"m": rate_rows({0.01: 0.8})}
    bits = [{**r, "bit": b} for r, b in zip(bit_rows(range(6)), [0, 1, 2, 3, "scale.0",
                                                                  "scale.7"], strict=True)]
    out = build_report(tmp_path, rows, bit_rows={"m": bits},
                       formats={"m": {"kind": "mx", "element": "float4_e2m1fn"}})
    assert sorted(k for k in out if k.startswith("bits_")) == ["bits_m", "bits_m_scale"]
    labels = [[t.get_text() for t in f.axes[0].get_yticklabels()] for f in figures[-2:]]
    assert labels[0][0].startswith("3") and labels[1] == ["7 (MSB)", "0 (LSB)"]


def test_file_stems() -> None:
    stems = file_stems(["x+y", "x_y", "A", "a", ".", "normal-fixed32"])
    assert stems["x_y"] == "x_y" and stems["normal-fixed32"] == "normal-fixed32"
    assert stems["x+y"].startswith("x_y-") and stems["."].startswith("model-")
    assert len({s.lower() for s in stems.values()}) == len(stems)
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+", s) and not s.startswith(".")
               for s in stems.values())


def test_page_opens_with_two_sentences_then_the_tables(tmp_path: Path) -> None:
    rows = {"a": rate_rows({1e-4: 0.9, 0.1: 0.5, 0.15: 0.4}), "b": rate_rows({0.1: 0.3})}
    models = ("Models", [{"model": "a", "epochs": 3}, {"model": "b", "epochs": 3}],
              ("model", "epochs"))
    out = build_report(tmp_path, rows, clean={"a": 0.95, "b": 0.9}, tables=[models],
                       histories={"a": {"loss": [1.0, 0.5], "accuracy": [0.8, 0.9]}},
                       intro="Details.", fault=bf.BitFlip(), chance=0.1)
    page = Path(out["html"]).read_text()
    lead = re.search(r"<h1>[^<]*</h1><p>([^<]*)</p><p>Details.</p>", page)
    assert lead and len(re.findall(r"[.;] [A-Z]|\.$", lead.group(1))) == 2, page[:600]
    first_figure = page.index("<figure")
    assert page.index("<h2>Models") < page.index("<h2>Mean accuracy over chips by model and "
                                                 "bit error rate") < first_figure
    table = page[page.index("<h2>Mean accuracy"):first_figure]
    assert "<th>1e-01</th>" in table and "<th>1.5e-01</th>" in table  # was 1e-01 twice
    assert "Wilson score" in page[first_figure:]  # how the intervals are computed
    header = Path(out["rate_table_csv"]).read_text().splitlines()[0]
    assert header == "model,no faults,1e-04,1e-01,1.5e-01"


def test_model_rate_table_leaves_missing_rates_empty() -> None:
    table, columns = model_rate_table({"a": rate_rows({0.1: 0.5}), "b": rate_rows({0.2: 0.4})})
    assert columns == ["model", "1e-01", "2e-01"]
    assert table == [{"model": "a", "1e-01": 0.5, "2e-01": ""},
                     {"model": "b", "1e-01": "", "2e-01": 0.4}]


def test_rate_sweep_plot_has_chance_line_rate_ticks_and_fault_label(
        tmp_path: Path, figures: list[Any]) -> None:
    rows = {"a": rate_rows({1e-3: 0.9, 0.1: 0.5, 0.15: 0.4})}
    build_report(tmp_path, rows, fault=bf.StuckAt(0), chance=0.1)
    ax = figures[0].axes[0]
    assert ax.get_xlabel() == "stuck-at-0 rate (fraction of stored bits stuck at 0)"
    assert "flipped" not in ax.get_xlabel() + ax.get_title()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1e-03", "1e-01", "1.5e-01"]
    chance = [line for line in ax.get_lines() if line.get_label().startswith("chance")]
    assert len(chance) == 1 and set(chance[0].get_ydata()) == {0.1}


def test_bit_heatmap_names_the_lsb_and_the_sign_bit(tmp_path: Path,
                                                    figures: list[Any]) -> None:
    fmt = bf.FixedPoint(8, 4)
    build_report(tmp_path, {"m": rate_rows({0.01: 0.8})}, bit_rows={"m": bit_rows(range(8))},
                 formats={"m": fmt.to_dict()}, fault=bf.StuckAt(1))
    ax = figures[1].axes[0]
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert ticks[0] == "7 (sign, MSB)" and ticks[-1] == "0 (LSB)"  # MSB on top
    assert "LSB" in ax.get_ylabel() and ax.get_xlabel().startswith("stuck-at-1 rate")
    assert bit_roles(bf.IntQuant(8, symmetric=False)) == {0: "LSB", 7: "MSB"}


def test_bad_report_arguments_fail_before_writing(tmp_path: Path) -> None:
    rows = {"a": rate_rows({0.1: 0.5})}
    with pytest.raises(ValueError, match="chance"):
        build_report(tmp_path / "r", rows, chance=2.0)
    with pytest.raises(TypeError, match="fault"):
        build_report(tmp_path / "r", rows, fault="bit_flip")
    assert not (tmp_path / "r").exists()
    assert rate_label(None) == "bit error rate (fraction of stored bits flipped)"


def test_cli_rate_table_prints_distinct_rates_and_the_fault_model() -> None:
    # {:.0e} printed 0.1 and 0.15 both as 1e-01 (issue 14, item 11).
    summary = {"campaign": {"fault": {"kind": "stuck_at", "value": 1, "bits": None}},
               "models": {"m": {"clean_accuracy": 0.9,
                                "rate": rate_rows({1e-4: 0.88, 0.1: 0.5, 0.15: 0.4})}}}
    title, head, row = format_rate_table(summary).splitlines()
    assert title.endswith("by stuck-at-1 rate")
    assert head.split() == ["model", "no", "faults", "1e-04", "1e-01", "1.5e-01"]
    assert row.split() == ["m", "0.900", "0.880", "0.500", "0.400"]


def test_campaign_summary_interval_of_accuracy_stays_in_bounds(tmp_path: Path) -> None:
    # Three chips at 0.00, 0.02 and 0.11: Student's t gave ci_low -0.10 (issue 14, item 10).
    import numpy as np

    ev = NumpyEvaluator(lambda p, v: v @ p["w"], {"w": np.eye(4, 3, dtype=np.float32)},
                        np.eye(4, dtype=np.float32), np.array([0, 1, 2, 0]))
    result = run(ev, rate_sweep([0.5], 3), bf.Memory(bf.IntQuant(8), bf.BitFlip()),
                 tmp_path / "s.db")
    result.records = [dataclasses.replace(r, metrics={**r.metrics, "accuracy": a})
                      for r, a in zip(result.records, [0.0, 0.02, 0.11], strict=True)]
    (row,) = result.summary("accuracy")
    assert 0.0 <= row["ci_low"] <= row["mean"] <= row["ci_high"] <= 1.0
    assert row["ci_method"] == "wilson_effective_n"
