"""The run commands in process: --json shapes, human output, --quiet, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mlxtend")
pytest.importorskip("matplotlib")
yaml = pytest.importorskip("yaml")

import bitfault as bf  # noqa: E402
from bitfault.cli import main  # noqa: E402


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def one_json(stdout: str) -> dict:
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    return json.loads(lines[0])


def test_train_campaign_report_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "output": "ignored", "data": {"train_limit": 300, "test_limit": 100},
        "model": {"name": "seed_mlp", "kwargs": {"hidden": 8}},
        "train": {"epochs": 1, "batch_size": 30},
        "recipes": [{"name": "q8", "format": {"kind": "int_quant", "bits": 8}}],
        "campaign": {"bers": ["1e-3", "1e-2"], "chips": 2, "bits": True,
                     "sensitivity_bers": [0.05], "sensitivity_chips": 1}}))
    run_dir = tmp_path / "run"
    code, out, err = run(capsys, "train", str(config), "--output", str(run_dir), "--json")
    result = one_json(out)
    assert code == 0 and err == ""
    assert set(result) == {"command", "ok", "run_dir", "models"}
    assert set(result["models"]["q8"]) == {"trained", "epochs", "val_accuracy", "seconds",
                                           "model"}
    assert Path(result["models"]["q8"]["model"]) == run_dir / "models" / "q8" / "model.pt"

    code, out, err = run(capsys, "campaign", str(run_dir), "--json")
    result = one_json(out)
    assert code == 0 and err == ""
    assert set(result) == {"command", "ok", "run_dir", "summary", "models"}
    q8 = result["models"]["q8"]
    assert set(q8) == {"clean_accuracy", "ran", "skipped", "rates"}
    assert (q8["ran"], q8["skipped"]) == (4 + 8, 0)  # 2 rates x 2 chips + 8 bits x 1 chip
    assert [r["ber"] for r in q8["rates"]] == [1e-3, 1e-2]

    code, out, err = run(capsys, "campaign", str(config), "--output", str(run_dir))
    assert code == 0 and "0 already done" not in err and "12 already done" in err
    assert out.splitlines()[1].split() == ["model", "no", "faults", "1e-03", "1e-02"]
    assert out.splitlines()[2].split()[0] == "q8"

    code, out, err = run(capsys, "--quiet", "report", str(run_dir))
    assert code == 0 and err == ""
    assert out.strip() == f"report: {run_dir / 'report' / 'report.html'} (3 plots; numbers in " \
                          "summary.csv/json)"
    code, out, _ = run(capsys, "report", str(run_dir), "--json")
    result = one_json(out)
    assert set(result) == {"command", "ok", "report", "files"}
    assert {"rate_sweep", "bits_q8", "training", "html", "summary_csv"} <= set(result["files"])

    # a config that would retrain differently is refused (exit 2), nothing changes
    config.write_text(config.read_text().replace("epochs: 1", "epochs: 2"))
    code, out, err = run(capsys, "train", str(config), "--output", str(run_dir))
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        f"bitfault: error: {run_dir}: holds a run trained with different train; choose another "
        "output directory or overwrite it (--overwrite)"]
    code, out, err = run(capsys, "campaign", str(config), "--output", str(run_dir))
    assert code == 2 and "trained with different train" in err


def test_inject_json(tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = bf.FaultSpec(format=bf.IntQuant(8), ber=0.01, seed=2, targets=("weights", "biases"))
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec.to_dict()))
    code, out, err = run(capsys, "inject", str(tiny_run / "models" / "int8" / "model.pt"),
                         "--spec", str(tmp_path / "spec.yaml"), "--output",
                         str(tmp_path / "faulty.pt"), "--json")
    result = one_json(out)
    assert code == 0 and err == ""
    assert set(result) == {"command", "ok", "input", "output", "framework", "format", "fault",
                           "tensors", "faults", "changed_values"}
    assert result["framework"] == "torch" and result["format"] == bf.IntQuant(8).to_dict()
    assert sorted(result["tensors"]) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight",
                                         "fc3.bias", "fc3.weight"]
    faulty = torch.load(tmp_path / "faulty.pt", weights_only=True)
    clean = torch.load(tiny_run / "models" / "int8" / "model.pt", weights_only=True)
    for name in result["tensors"]:
        want = bf.inject(clean[name].numpy(), spec.format, spec.fault,
                         spec.map_for(name, tuple(clean[name].shape)))
        assert (faulty[name].numpy() == want).all(), name
    code, out, err = run(capsys, "inject", str(tiny_run / "models" / "int8" / "model.pt"),
                         "--spec", str(tmp_path / "spec.yaml"), "--output",
                         str(tmp_path / "f.keras"), "--framework", "keras")
    assert code == 2 and "a .pt file is a torch model, not keras" in err


def test_campaign_refuses_a_float_recipe(tiny_run: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads((tiny_run / "config.json").read_text())
    config["recipes"][0]["format"] = None
    (tmp_path / "float.json").write_text(json.dumps(config))
    code, out, err = run(capsys, "--json", "campaign", str(tmp_path / "float.json"))
    assert code == 2
    assert one_json(out)["error"].startswith(
        "config key 'recipes[0].format': got None; allowed: a format or fault_aware spec")
