"""Memories compared in one campaign (campaign.memory as a list of named memories), through
the command line: one store per scheme on the same chips, summary numbers recomputed here
from the stores' records with plain Python, the report's plot and table, resuming."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mlxtend")
pytest.importorskip("matplotlib")
yaml = pytest.importorskip("yaml")

from tiny_config import TINY  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.campaign.stats import format_rate  # noqa: E402
from bitfault.cli import main  # noqa: E402
from bitfault.config import ConfigError, load_config  # noqa: E402
from bitfault.jobs import run_campaign  # noqa: E402

SCHEMES = [{"name": "none"}, {"name": "secded", "protection": "secded", "word_bits": 64}]
RATES, CHIPS, SEED = (1e-3, 1e-2), 2, 5


def config(memory: Any = SCHEMES, **campaign: Any) -> dict[str, Any]:
    """TINY's int8 model (the shared trained run) in the given memories."""
    return {**TINY, "recipes": TINY["recipes"][:1],
            "campaign": {"bers": list(RATES), "chips": CHIPS, "seed": SEED, "memory": memory,
                         **campaign}}


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main([*args, "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0, out
    return json.loads(out[-1])


def store_rows(store: Path) -> list[dict[str, Any]]:
    with closing(sqlite3.connect(store)) as db:
        rows = db.execute("SELECT kind, ber, chip, seed, memory, metrics, finished FROM "
                          "trials").fetchall()
    return [{"kind": k, "ber": b, "chip": c, "seed": s, "memory": json.loads(m),
             "metrics": json.loads(x), "finished": f} for k, b, c, s, m, x, f in rows]


def clean_accuracy(run_dir: Path) -> Fraction:
    """The int8 model's fault-free test accuracy: every Linear weight stored in IntQuant(8)
    (the format's own encode/decode, tested against PyTorch's quantisation elsewhere)."""
    from bitfault.jobs.data import load_data
    from bitfault.jobs.models import load_model

    cfg = load_config(config())
    _, (x, y) = load_data(cfg.data)
    model = load_model(run_dir / "models" / "int8", trusted=True)
    fmt = bf.IntQuant(8)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                w = module.weight.numpy()
                params = fmt.calibrate(w)
                module.weight.copy_(torch.from_numpy(fmt.decode(fmt.encode(w, params), params)))
        pred = model(torch.as_tensor(x)).argmax(1).numpy()
    return Fraction(int((pred == y).sum()), len(y))


def physical_bits(run_dir: Path, check_bits: int) -> int:
    """64-bit words of eight int8 codes, padded at each tensor's end, plus check bits."""
    state = torch.load(run_dir / "models" / "int8" / "model.pt", weights_only=True)
    words = sum(-(-v.numel() // 8) for k, v in state.items() if k.endswith(".weight"))
    return words * (64 + check_bits)


def expected(rows: list[dict[str, Any]], clean: Fraction, bits: int) -> dict[float, dict]:
    """Per rate, from the records alone: mean accuracy, raw bit error rate, shares."""
    out = {}
    for rate in RATES:
        ms = [r["metrics"] for r in rows if r["ber"] == rate]
        acc = [Fraction(m["correct"], m["n"]) for m in ms]
        detected = sum(m["detected"] == 1 for m in ms)
        sdc = sum(m["detected"] == 0 and a < clean for m, a in zip(ms, acc, strict=True))
        masked = sum(m["detected"] == 0 and m["words_silent"] == 0 for m in ms)
        out[rate] = {"n": len(ms), "mean": sum(acc) / len(acc),
                     "raw_ber": float(sum(Fraction(m["raw_bit_errors"], bits) for m in ms)
                                      / len(ms)),
                     "detected": detected / len(ms), "sdc": sdc / len(ms),
                     "masked": masked / len(ms),
                     "benign": (len(ms) - detected - sdc - masked) / len(ms)}
    return out


def robust(points: dict[float, dict], clean: Fraction) -> float | None:
    """The highest rate up to which every mean stays within 0.5 points of ``clean``."""
    best = None
    for rate in sorted(points):
        if clean - points[rate]["mean"] > Fraction(5, 1000):
            break
        best = rate
    return best


def test_memories_compared_in_one_campaign(tiny_run: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "compare.yaml"
    path.write_text(yaml.safe_dump(config()))
    result = cli(capsys, "campaign", str(path), "--output", str(tiny_run))
    assert set(result["models"]) == {"int8 / none", "int8 / secded"}
    assert all((m["ran"], m["skipped"]) == (4, 0) for m in result["models"].values())
    stores = {s["name"]: tiny_run / "campaign" / s["name"] / "int8.sqlite" for s in SCHEMES}
    assert all(p.is_file() for p in stores.values())
    assert not (tiny_run / "campaign" / "int8.sqlite").exists()

    rows = {name: store_rows(p) for name, p in stores.items()}
    chips = {(r["ber"], r["chip"], r["seed"]) for r in rows["none"]}
    assert chips == {(b, c, SEED + c) for b in RATES for c in range(CHIPS)}
    assert {(r["ber"], r["chip"], r["seed"]) for r in rows["secded"]} == chips  # same chips
    assert {r["memory"]["storage"]["protection"]["kind"] for r in rows["none"]} == {"none"}
    assert {json.dumps(r["memory"]["storage"]) for r in rows["secded"]} == {json.dumps(
        {"pattern": {"kind": "independent"}, "protection": {"kind": "secded", "policy": "flag"},
         "row_words": None, "word_bits": 64})}

    summary = json.loads((tiny_run / "summary.json").read_text())
    clean = clean_accuracy(tiny_run)
    compared = summary["comparison"]["models"]["int8"]
    assert compared["clean_accuracy"] == float(clean)
    for scheme in compared["schemes"]:
        name, check = scheme["name"], 8 if scheme["name"] == "secded" else 0
        bits = physical_bits(tiny_run, check)
        assert scheme["physical_bits"] == bits
        assert scheme["overhead"] == {"codes": check / 64}
        assert scheme["check_bits_per_data_bit"] == check / 64
        want = expected(rows[name], clean, bits)
        got = {p["ber"]: p for p in scheme["points"]}
        assert set(got) == set(RATES)
        for rate, w in want.items():
            for key, value in w.items():
                assert got[rate][key] == pytest.approx(float(value), rel=1e-12, abs=1e-15), \
                    (name, key)
        assert scheme["within_tolerance_up_to"] == robust(want, clean)
        entry = summary["models"][f"int8 / {name}"]
        assert {r["ber"]: r["mean"] for r in entry["rate"]} == {
            b: pytest.approx(float(w["mean"]), rel=1e-12) for b, w in want.items()}
    # SEC-DED on the same chips: raw errors land in check bits too, and it corrects singles
    none_pts, secded_pts = ({p["ber"]: p for p in s["points"]} for s in compared["schemes"])
    assert secded_pts[1e-2]["mean"] >= none_pts[1e-2]["mean"]
    assert secded_pts[1e-2]["detected"] == 1.0 and none_pts[1e-2]["detected"] == 0.0

    report = cli(capsys, "report", str(tiny_run))
    html = Path(report["report"]).read_text()
    assert 'data-file="schemes_int8.png"' in html
    assert "accuracy vs raw bit error rate for each memory" in html
    assert "raw bit errors over physical bits, data and check" in html
    assert "Storage overhead vs robust accuracy" in html and "SEC-DED (72,64)" in html
    assert "within 0.5 points of the fault-free accuracy" in html
    table = json.loads(Path(report["files"]["schemes_json"]).read_text())
    assert [r["memory"] for r in table] == ["none", "secded"]
    assert table[1]["storage overhead (check bits per data bit)"] == "12.5%"
    for r, s in zip(table, compared["schemes"], strict=True):
        up = s["within_tolerance_up_to"]
        assert r["within 0.5 pt up to"].split(" ")[0] == ("none" if up is None else
                                                            format_rate(up))

    again = cli(capsys, "campaign", str(path), "--output", str(tiny_run))  # resume: nothing redone
    assert all((m["ran"], m["skipped"]) == (0, 4) for m in again["models"].values())
    assert {n: store_rows(p) for n, p in stores.items()} == rows


def test_bad_memories_are_refused_before_anything_is_written(tiny_run: Path) -> None:
    before = (tiny_run / "config.json").read_text()
    misfit = [*SCHEMES, {"name": "wide", "word_bits": 60}]  # 60 bits: 7.5 int8 codes
    with pytest.raises(ConfigError) as err:
        run_campaign(tiny_run, config(misfit))
    assert err.value.key == "campaign.memory[2]" and "word_bits" in str(err.value)
    with pytest.raises(ConfigError, match=r"campaign.memory\[1\].name"):
        run_campaign(tiny_run, config([{"name": "a"}, {"name": "A"}]))
    with pytest.raises(ConfigError, match="campaign.bits"):
        run_campaign(tiny_run, config(bits=True))
    assert not (tiny_run / "campaign").exists() and not (tiny_run / "summary.json").exists()
    assert (tiny_run / "config.json").read_text() == before
