"""`bitfault demo --fast` end to end: every report file, the HTML embeds every plot, the PNGs
are images of sensible size, the numbers name every model, and --json has its shape."""

from __future__ import annotations

import base64
import csv
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("mlxtend")
pytest.importorskip("matplotlib")

def bitfault_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the CLI's default
    return subprocess.run([sys.executable, "-m", "bitfault.cli", *args], capture_output=True,
                          text=True, env=env)


MODELS = ["normal-int8", "fault-aware-int8", "robust-int8", "normal-fixed32",
          "robust-fixed32"]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    out = tmp_path_factory.mktemp("demo") / "demo"
    done = bitfault_cli("demo", "--fast", "--output", str(out), "--json")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout  # --json: one object, nothing else on stdout
    return out, json.loads(lines[0]), done.stderr


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path}: not a PNG"
    return struct.unpack(">II", data[16:24])


def test_demo_writes_every_report_file(demo_run: tuple[Path, dict[str, Any], str]) -> None:
    out, result, _ = demo_run
    report = out / "report"
    pngs = sorted(report.glob("*.png"))
    names = {p.name for p in pngs}
    assert {"rate_sweep.png", "training.png"} <= names
    assert {f"layers_{m}.png" for m in MODELS} <= names
    assert {f"bits_{m}.png" for m in MODELS} <= names
    assert len(pngs) == 2 + 2 * len(MODELS)
    for png in pngs:
        width, height = png_size(png)
        assert 300 <= width <= 4000 and 200 <= height <= 4000, (png.name, width, height)
    page = (report / "report.html").read_text()
    embedded = dict(re.findall(r'data-file="([^"]+)" src="data:image/png;base64,([^"]+)"', page))
    assert set(embedded) == names  # every plot on the page, nothing missing
    for name, data in embedded.items():
        assert base64.b64decode(data) == (report / name).read_bytes()
    assert "src=\"http" not in page and "<script" not in page  # self-contained
    with open(report / "summary.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["model"] for r in rows} == set(MODELS)
    assert {float(r["ber"]) for r in rows if r["kind"] == "rate"} == {1e-3, 1e-2, 0.1}
    summary = json.loads((report / "summary.json").read_text())
    assert {r["model"] for r in summary} == set(MODELS)
    for sub in ("config.json", "summary.json"):
        assert (out / sub).is_file()
    for m in MODELS:
        assert (out / "models" / m / "model.pt").is_file()
        assert (out / "campaign" / f"{m}.sqlite").is_file()


def test_demo_json_shape(demo_run: tuple[Path, dict[str, Any], str]) -> None:
    out, result, stderr = demo_run
    assert set(result) == {"command", "ok", "run_dir", "report", "models", "files"}
    assert (result["command"], result["ok"]) == ("demo", True)
    assert Path(result["report"]) == out / "report" / "report.html"
    assert list(result["models"]) == MODELS
    for info in result["models"].values():
        assert set(info) == {"clean_accuracy", "val_accuracy", "trained", "ran", "skipped",
                             "rates"}
        assert [r["ber"] for r in info["rates"]] == [1e-3, 1e-2, 0.1]
        assert all(set(r) == {"ber", "mean", "ci_low", "ci_high", "min", "max", "n"}
                   and r["n"] == 3 and 0 <= r["mean"] <= 1 for r in info["rates"])
        assert info["ran"] > 0 and info["skipped"] == 0
    assert result["models"]["normal-int8"]["clean_accuracy"] > 0.5
    assert stderr == ""  # --json turns progress off


def _numbers(result: dict[str, Any]) -> dict[str, Any]:
    """What the demo measured, without timings and paths."""
    return {name: {"clean": info["clean_accuracy"], "val": info["val_accuracy"],
                   "rates": info["rates"]} for name, info in result["models"].items()}


def test_demo_numbers_are_identical_in_a_second_run(
        demo_run: tuple[Path, dict[str, Any], str], tmp_path: Path) -> None:
    """Training and chips are seeded: a fresh run directory on this machine prints the same
    numbers to the last bit (the README's table is one such run of the full demo)."""
    _, first, _ = demo_run
    done = bitfault_cli("demo", "--fast", "--output", str(tmp_path / "again"), "--json")
    assert done.returncode == 0, done.stderr
    assert _numbers(json.loads(done.stdout)) == _numbers(first)
