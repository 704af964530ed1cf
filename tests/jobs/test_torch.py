"""Train, campaign (resumable), report and inject through bitfault.jobs with PyTorch."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mlxtend")

import bitfault as bf  # noqa: E402
from bitfault.config import ConfigError, load_config  # noqa: E402
from bitfault.jobs import RunDir, inject_file, make_report, run_campaign, train  # noqa: E402
from bitfault.jobs.models import load_model  # noqa: E402


def test_run_dir_layout_and_reuse(tiny_run: Path) -> None:
    rd = RunDir(tiny_run)
    config = rd.config()
    assert [r.name for r in config.recipes] == ["int8", "clip"]
    for name in ("int8", "clip"):
        d = tiny_run / "models" / name
        assert sorted(p.name for p in d.iterdir()) == ["history.json", "model.json", "model.pt",
                                                       "recipe.json"]
        history = json.loads((d / "history.json").read_text())
        assert [h["epoch"] for h in history] == [1, 2, 3]
        assert history[-1]["val_accuracy"] > (0.6 if name == "int8" else 0.2)  # chance: 0.1
        assert json.loads((d / "model.json").read_text())["name"] == "seed_mlp"
    clip = load_model(tiny_run / "models" / "clip")
    assert float(clip.fc1.weight.detach().abs().max()) <= 0.1 + 1e-7  # weight_clip held
    # training again with the same settings reuses both models; a new recipe trains alone
    before = (tiny_run / "models" / "int8" / "model.pt").stat().st_mtime_ns
    more = config.to_dict()
    more["recipes"].append({"name": "fixed", "format": {"kind": "fixed_point", "bits": 16,
                                                        "frac": 12}})
    _, results = train(more)
    assert {n: r["trained"] for n, r in results.items()} == {"int8": False, "clip": False,
                                                             "fixed": True}
    assert (tiny_run / "models" / "int8" / "model.pt").stat().st_mtime_ns == before
    # other training settings: refused unless overwrite
    changed = {**more, "train": {**more["train"], "epochs": 2}}
    with pytest.raises(ValueError, match="different train"):
        train(changed)


def test_campaign_resumes_and_report(tiny_run: Path) -> None:
    first = run_campaign(tiny_run)
    m = first["models"]["int8"]
    # 2 rates x 2 chips, plus 3 tensors x 1 rate x 2 chips
    assert (m["ran"], m["skipped"]) == (10, 0)
    assert [r["ber"] for r in m["rate"]] == [1e-3, 1e-2] and len(m["layer"]) == 3
    assert 0.3 < m["clean_accuracy"] <= 1.0
    again = run_campaign(tiny_run)
    assert (again["models"]["int8"]["ran"], again["models"]["int8"]["skipped"]) == (0, 10)
    store = tiny_run / "campaign" / "int8.sqlite"
    with sqlite3.connect(store) as db:  # lose four trials, as if killed mid-run
        db.execute("DELETE FROM trials WHERE rowid IN (SELECT rowid FROM trials LIMIT 4)")
    resumed = run_campaign(tiny_run)
    assert (resumed["models"]["int8"]["ran"], resumed["models"]["int8"]["skipped"]) == (4, 6)
    assert resumed["models"]["int8"]["rate"] == first["models"]["int8"]["rate"]
    assert resumed["models"]["int8"]["layer"] == first["models"]["int8"]["layer"]
    files = make_report(tiny_run)
    assert {"rate_sweep", "layers_int8", "layers_clip", "training", "html"} <= set(files)
    html = Path(files["html"]).read_text()
    assert "Models" in html and "weights clipped to ±0.1" in html


def test_campaign_needs_a_stored_format(tiny_run: Path) -> None:
    config = RunDir(tiny_run).config().to_dict()
    config["recipes"][1] = {"name": "clip", "format": None, "weight_clip": 0.1}
    with pytest.raises(ConfigError, match=r"'recipes\[1\].format': got None; allowed: a format "
                                          "or fault_aware spec: campaigns fault stored words"):
        run_campaign(tiny_run, load_config(config))
    config["recipes"][1] = {"name": "clip", "format": {"kind": "int_quant", "bits": 8},
                            "weight_clip": 0.2}
    with pytest.raises(ValueError, match=r"recipe\(s\) \['clip'\] differ from the ones their "
                                         "models were trained with"):
        run_campaign(tiny_run, load_config(config))


def test_campaign_and_report_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such run directory"):
        run_campaign(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        make_report(tmp_path / "empty")


def test_inject_spec_equals_bf_inject(tiny_run: Path, tmp_path: Path) -> None:
    model_file = tiny_run / "models" / "int8" / "model.pt"
    spec = bf.FaultSpec(format=bf.IntQuant(8), ber=0.02, seed=4)
    (tmp_path / "spec.json").write_text(spec.to_json())
    out = inject_file(model_file, tmp_path / "faulty.pt", spec=tmp_path / "spec.json")
    clean = torch.load(model_file, weights_only=True)
    faulty = torch.load(tmp_path / "faulty.pt", weights_only=True)
    assert set(out["tensors"]) == {"fc1.weight", "fc2.weight", "fc3.weight"}
    assert out["faults"] == sum(t["faults"] for t in out["tensors"].values()) > 0
    for name, t in clean.items():
        if name in out["tensors"]:
            want = bf.inject(t.numpy(), spec.format, spec.fault,
                             spec.map_for(name, tuple(t.shape)))
            assert np.array_equal(faulty[name].numpy(), want, equal_nan=True), name
        else:
            assert torch.equal(faulty[name], t), name  # biases untouched


def test_inject_maps_equal_bf_inject(tiny_run: Path, tmp_path: Path) -> None:
    model_file = tiny_run / "models" / "int8" / "model.pt"
    fmt = bf.FixedPoint(32, 28, rounding="trunc")
    fmap = bf.FaultMap.random((16, 784), fmt, count=20, seed=1, name="fc1.weight",
                              fault=bf.BitFlip())
    fmap.save(tmp_path / "fc1.npz")
    out = inject_file(model_file, tmp_path / "faulty.pt", maps=[tmp_path / "fc1.npz"])
    assert list(out["tensors"]) == ["fc1.weight"] and out["faults"] == 20
    clean = torch.load(model_file, weights_only=True)
    faulty = torch.load(tmp_path / "faulty.pt", weights_only=True)
    want = bf.inject(clean["fc1.weight"].numpy(), fmt, bf.BitFlip(), fmap)
    assert np.array_equal(faulty["fc1.weight"].numpy(), want)
    assert torch.equal(faulty["fc2.weight"], clean["fc2.weight"])
    wrong = bf.FaultMap.random((3, 3), fmt, count=1, seed=1, name="fc9.weight")
    wrong.save(tmp_path / "wrong.npz")
    with pytest.raises(ValueError, match=r"tensor\(s\) \['fc9.weight'\] the model does not"):
        inject_file(model_file, tmp_path / "x.pt", maps=[tmp_path / "wrong.npz"])
    with pytest.raises(ValueError, match="give a fault spec"):
        inject_file(model_file, tmp_path / "x.pt")
    with pytest.raises(ValueError, match="cannot tell the framework"):
        inject_file(tmp_path / "fc1.npz", tmp_path / "x.pt", maps=[tmp_path / "fc1.npz"])


def test_demo_refuses_to_replace_another_run(tiny_run: Path) -> None:
    from bitfault.jobs import demo

    with pytest.raises(ValueError, match="holds a run that is not the demo's"):
        demo(fast=True, output=str(tiny_run))
    assert (tiny_run / "models" / "int8" / "model.pt").is_file()


def test_campaign_with_sampled_single_faults(tiny_run: Path) -> None:
    """campaign.single_faults: a margin; sampled faults stop once the share is that precise."""
    config = load_config(RunDir(tiny_run).config_path)
    config = config.replace(campaign=dataclasses.replace(
        config.campaign, layers=False, single_faults=0.1, single_fault_confidence=0.9))
    summary = run_campaign(tiny_run, config)
    for name in ("int8", "clip"):
        s = summary["models"][name]["single_faults"]
        lo, hi = s["interval"]
        assert s["reached"] and (hi - lo) / 2 <= 0.1 and s["confidence"] == 0.9
        assert 30 <= s["trials"] == s["ran"] <= s["sample_size"]
        assert lo <= s["share"] <= hi
        assert (tiny_run / "campaign" / f"{name}.single_faults.sqlite").is_file()
    again = run_campaign(tiny_run, config)["models"]["int8"]["single_faults"]
    assert again["ran"] == 0 and again["interval"] == summary["models"]["int8"][
        "single_faults"]["interval"]
    html = Path(make_report(tiny_run)["html"]).read_text()
    assert "Single bit faults (statistical fault injection)" in html
