"""Reports from a real (small) campaign: every artefact written, valid PNGs, HTML embeds all."""

from __future__ import annotations

import base64
import json
import re
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import bitfault as bf
from bitfault.campaign import NumpyEvaluator, bit_sweep, layer_sweep, rate_sweep, run
from bitfault.campaign.stats import summary_rows
from bitfault.data import split_embedded_mnist

pytest.importorskip("matplotlib")
from bitfault.report import build_report, model_rate_table, rate_table_caption


def softmax_model() -> NumpyEvaluator:
    (x, y), (xt, yt) = split_embedded_mnist()
    w = np.zeros((784, 10), np.float32)
    b = np.zeros(10, np.float32)
    onehot = np.eye(10, dtype=np.float32)[y]
    for _ in range(40):
        z = x @ w + b
        p = np.exp(z - z.max(1, keepdims=True))
        g = (p / p.sum(1, keepdims=True) - onehot) / len(x)
        w -= 0.5 * x.T @ g
        b -= 0.5 * g.sum(0)
    params = {"fc.weight": np.ascontiguousarray(w.T), "fc.bias": b}
    return NumpyEvaluator(lambda p, v: v @ p["fc.weight"].T + p["fc.bias"], params,
                          xt[:300], yt[:300])


def png_size(path: str) -> tuple[int, int]:
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_report_from_a_campaign(tmp_path: Path) -> None:
    ev = softmax_model()
    rows = {}
    for label, fmt in (("IntQuant(8)", bf.IntQuant(8)), ("FixedPoint(16,12)",
                                                         bf.FixedPoint(16, 12))):
        memory = bf.Memory(fmt, bf.BitFlip())
        trials = (rate_sweep([1e-3, 1e-2, 1e-1], 3) + layer_sweep([1e-2], 2, ["fc.weight"])
                  + bit_sweep([1e-2], 2, [0, fmt.bits - 1]))
        rows[label] = run(ev, trials, memory, tmp_path / f"{label}.db")
    out = build_report(
        tmp_path / "report",
        {k: [r for r in v.summary() if r["kind"] == "rate"] for k, v in rows.items()},
        clean={k: v.clean["accuracy"] for k, v in rows.items()},
        layer_rows={k: [r for r in v.summary() if r["kind"] == "layer"] for k, v in rows.items()},
        bit_rows={k: [r for r in v.summary() if r["kind"] == "bit"] for k, v in rows.items()},
        histories={"softmax": {"loss": [2.3, 1.0, 0.6], "accuracy": [0.5, 0.8, 0.85]}},
        title="test report")
    pngs = [p for p in out.values() if p.endswith(".png")]
    assert len(pngs) == 6  # rate sweep, 2 layer + 2 bit heatmaps, training curves
    for png in pngs:
        width, height = png_size(png)
        assert 300 <= width <= 2000 and 200 <= height <= 1600, (png, width, height)
    page = Path(out["html"]).read_text()
    embedded = re.findall(r'data-file="([^"]+)" src="data:image/png;base64,([^"]+)"', page)
    assert sorted(name for name, _ in embedded) == sorted(Path(p).name for p in pngs)
    for name, data in embedded:
        assert base64.b64decode(data) == (tmp_path / "report" / name).read_bytes()
    summary = json.loads(Path(out["summary_json"]).read_text())
    assert {r["model"] for r in summary} == set(rows)
    assert Path(out["summary_csv"]).read_text().startswith("model,kind,ber")


def test_report_needs_a_rate_sweep(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rate_rows"):
        build_report(tmp_path, {})


def _perplexity_rows(values: list[float]) -> list[dict]:
    records = [SimpleNamespace(kind="rate", ber=1e-8, target=None, bit=None,
                               metrics={"perplexity": v}) for v in values]
    return summary_rows(records, "perplexity")


def test_the_headline_table_gives_a_heavy_tailed_value_as_its_median() -> None:
    # SmolLM2 at 1e-8: two chips keep the fault-free 37.46, one flipped exponent gives 1e7
    rows = {"gguf": _perplexity_rows([37.4, 37.5, 1e7])}
    (numbers,), columns = model_rate_table(rows, {"gguf": 37.46})
    assert columns == ["model", "no faults", "1e-08"] and numbers["1e-08"] == 37.5
    (text,), _ = model_rate_table(rows, {"gguf": 37.46}, spread=True)
    assert text["1e-08"] == "37.5 [37.45, 5e+06]"
    assert rate_table_caption(rows) == "Median perplexity [25th, 75th percentile]"
    assert rows["gguf"][0]["ci_low"] >= 1.0  # the full table's interval stays above 1
    accuracy = {"m": [{"ber": 1e-3, "metric": "accuracy", "mean": 0.9, "median": 0.95}]}
    assert model_rate_table(accuracy)[0][0]["1e-03"] == 0.9
    assert rate_table_caption(accuracy) == "Mean accuracy"

