"""CSV files bitfault writes: a cell from a name never opens as a spreadsheet formula."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from bitfault.campaign import CampaignStore
from bitfault.files.csvfile import safe_cell
from bitfault.report.html import write_rows


def test_safe_cell_quotes_formulas_and_leaves_numbers() -> None:
    for text in ("=SUM(A1)", "+1+2", "-cmd", "@x", "\tx", "\rx", "-1+1"):
        assert safe_cell(text) == "'" + text
    for value in ("-1.5", "-inf", "+3", "plain", "a=b", -2, -0.5, None, True):
        assert safe_cell(value) == value


def test_csv_cells_from_names_are_never_formulas(tmp_path: Path) -> None:
    rows = [{"model": "=HYPERLINK(\"http://x\")", "target": "+cmd", "bit": "-sign",
             "worker": "@evil", "ber": -0.5, "mean": "-1.5e-3", "note": "plain"}]
    csv_path, json_path = write_rows(rows, tmp_path / "summary")
    with open(csv_path, newline="") as fh:
        (got,) = list(csv.DictReader(fh))
    assert got == {"model": "'=HYPERLINK(\"http://x\")", "target": "'+cmd", "bit": "'-sign",
                   "worker": "'@evil", "ber": "-0.5", "mean": "-1.5e-3", "note": "plain"}
    assert json.loads(Path(json_path).read_text()) == rows  # JSON keeps the names as they are
    with CampaignStore(tmp_path / "c.db", "c") as store:
        store.add({"trial_key": "=1+1", "kind": "layer", "ber": 1e-3, "chip": 0,
                   "target": "-x.weight", "metrics": {"accuracy": 0.5}})
        store.to_csv(tmp_path / "trials.csv")
    with open(tmp_path / "trials.csv", newline="") as fh:
        (trial,) = list(csv.DictReader(fh))
    assert (trial["trial_key"], trial["target"], trial["metric_accuracy"]) == \
        ("'=1+1", "'-x.weight", "0.5")
