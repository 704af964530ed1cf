"""`train` checks the whole plan before it writes: data against the model, every recipe's
format against the weights, models it would reuse; errors name the file, key or flag."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("mlxtend")

from bitfault.config import ConfigError
from bitfault.jobs import RunDir, run_campaign, train

SMALL = {"model": {"name": "seed_mlp", "kwargs": {"hidden": 8}}, "train": {"epochs": 1},
         "recipes": [{"name": "int8"}]}


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
            for p in sorted(root.rglob("*"))}


def npz(path: Path, side: int, n: int = 20) -> Path:
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.integers(0, 255, (n, side, side), dtype=np.uint8),
             y_train=rng.integers(0, 10, n), x_test=rng.integers(0, 255, (n, side, side),
                                                               dtype=np.uint8),
             y_test=rng.integers(0, 10, n))
    return path


def test_data_that_does_not_fit_the_model_writes_nothing(tmp_path: Path) -> None:
    data = {"source": "npz", "path": str(npz(tmp_path / "small.npz", 10))}
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"data.path .*small.npz with model seed_mlp: samples "
                                         r"of shape \(100,\) do not fit the model"):
        train({**SMALL, "output": str(out), "data": data})
    assert not out.exists()
    # the corrected config then trains there (no "run trained with different data")
    data["path"] = str(npz(tmp_path / "mnist.npz", 28))
    _, results = train({**SMALL, "output": str(out), "data": data})
    assert results["int8"]["trained"]


def test_a_format_that_cannot_store_the_weights_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = {**SMALL, "output": str(out), "data": {"train_limit": 50, "test_limit": 20},
              "recipes": [{"name": "pc", "format": {"kind": "int_quant", "bits": 8,
                                                    "per_channel": 9}}]}
    with pytest.raises(ConfigError, match=r"config key 'recipes\[0\].format': got \{.*"
                                          r"'per_channel': 9.*allowed: a format that can store "
                                          r"the model's weights \(per_channel axis 9"):
        train(config)
    assert not out.exists()


def test_an_empty_split_names_the_file_and_the_array(tmp_path: Path) -> None:
    path = tmp_path / "empty.npz"
    np.savez(path, x_train=np.zeros((0, 28, 28), np.uint8), y_train=np.zeros(0, np.int64),
             x_test=np.zeros((5, 28, 28), np.uint8), y_test=np.zeros(5, np.int64))
    with pytest.raises(ValueError, match=r"empty.npz\[x_train\]: holds no images \(shape "
                                         r"\(0, 28, 28\)\)"):
        train({**SMALL, "output": str(tmp_path / "run"), "data": {"source": "npz",
                                                                  "path": str(path)}})
    assert not (tmp_path / "run").exists()


def test_a_model_that_cannot_be_read_is_not_reused(tiny_run: Path) -> None:
    config = json.loads((tiny_run / "config.json").read_text())
    config["output"] = str(tiny_run)
    model = tiny_run / "models" / "int8" / "model.pt"
    model.write_bytes(model.read_bytes()[:100])  # truncated
    before = snapshot(tiny_run)
    with pytest.raises(ValueError, match=r"recipe 'int8': its trained model cannot be reused: "
                                         r".*models/int8/model.pt: cannot be read.*bitfault "
                                         r"train CONFIG --retrain"):
        train(config)
    assert snapshot(tiny_run) == before
    _, results = train(config, retrain=True)
    assert results["int8"]["trained"] and results["clip"]["trained"]
    [old] = (tiny_run / "replaced").glob("*/models/int8/model.pt")
    assert old.read_bytes() == before["models/int8/model.pt"]
    run_campaign(tiny_run)  # the retrained models load


def test_a_foreign_config_json_is_named_as_the_run_directory_s(tmp_path: Path) -> None:
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "config.json").write_text('{"name": "my-site", "version": "1.0"}')
    for call in (lambda: train({**SMALL, "output": str(folder)}),
                 lambda: run_campaign(folder), lambda: RunDir(folder).config()):
        with pytest.raises(ValueError, match=r"site/config.json: not the config.json of a "
                                             r"bitfault run this version reads \(config key "
                                             r"'name': unknown.*if bitfault did not write .*"
                                             "site, choose another output directory"):
            call()
    assert (folder / "config.json").read_text() == '{"name": "my-site", "version": "1.0"}'
