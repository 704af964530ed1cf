"""Keras through bitfault.jobs: a reduced train + campaign + report, and inject on .keras."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

keras = pytest.importorskip("keras")
pytest.importorskip("mlxtend")

import bitfault as bf  # noqa: E402
from bitfault.config import ConfigError, ModelConfig, load_config  # noqa: E402
from bitfault.jobs import inject_file, make_report, run_campaign, train  # noqa: E402
from bitfault.jobs.campaign import check_campaign  # noqa: E402
from bitfault.jobs.models import build_model, load_model  # noqa: E402

INT8 = {"kind": "int_quant", "bits": 8}
# Keras' own model.save() trips NumPy 2's __array__(copy=...) deprecation; not ours to fix.
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning")


def test_keras_train_campaign_report(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    config = load_config({
        "framework": "keras", "output": str(tmp_path / "run"),
        "data": {"train_limit": 600, "test_limit": 200},
        "model": {"name": "seed_mlp", "kwargs": {"hidden": 16}},
        "train": {"epochs": 2, "batch_size": 25},
        "recipes": [{"name": "int8", "format": INT8},
                    {"name": "aware", "format": None,
                     "fault_aware": {"format": INT8, "ber": 0.01, "persistence": "transient"}}],
        "campaign": {"bers": [1e-3, 1e-2], "chips": 2, "layers": True,
                     "sensitivity_bers": [1e-2], "sensitivity_chips": 1}})
    rd, results = train(config)
    assert results["int8"]["val_accuracy"] > 0.5
    assert Path(results["int8"]["model"]).name == "model.keras"
    model = load_model(rd.model_dir("int8"))
    assert [layer.name for layer in model.layers if layer.weights] == ["fc1", "fc2", "fc3"]
    summary = run_campaign(rd.path)
    for name in ("int8", "aware"):
        m = summary["models"][name]
        assert (m["ran"], m["skipped"]) == (4 + 3, 0)
        assert [r["ber"] for r in m["rate"]] == [1e-3, 1e-2]
        assert {r["target"] for r in m["layer"]} == {"fc1.weight", "fc2.weight", "fc3.weight"}
    assert run_campaign(rd.path)["models"]["int8"]["skipped"] == 7  # resumed: nothing to do
    files = make_report(rd.path)
    assert {"rate_sweep", "layers_int8", "layers_aware", "training"} <= set(files)


def test_keras_inject_equals_bf_inject(tmp_path: Path) -> None:
    model = build_model(ModelConfig("seed_mlp", {"hidden": 8}), "keras")
    model.save(tmp_path / "m.keras")
    spec = bf.FaultSpec(format=bf.FixedPoint(16, 12), ber=0.01, seed=9,
                        targets=("weights", "biases"))
    out = inject_file(tmp_path / "m.keras", tmp_path / "faulty.keras", spec=spec.to_dict())
    assert out["framework"] == "keras" and out["faults"] > 0
    assert sorted(out["tensors"]) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight",
                                      "fc3.bias", "fc3.weight"]
    faulty = keras.saving.load_model(tmp_path / "faulty.keras", compile=False)
    for layer in model.layers:
        if not layer.weights:
            continue
        kernel, bias = (w.numpy() for w in layer.weights)
        want = bf.inject(kernel.T, spec.format, spec.fault,
                         spec.map_for(f"{layer.name}.weight", kernel.T.shape))
        got = faulty.get_layer(layer.name).weights[0].numpy()
        assert np.array_equal(got, want.T), layer.name  # maps in PyTorch layout (out, in)
        want_b = bf.inject(bias, spec.format, spec.fault,
                           spec.map_for(f"{layer.name}.bias", bias.shape))
        assert np.array_equal(faulty.get_layer(layer.name).weights[1].numpy(), want_b)
    fmap = bf.FaultMap.random((8, 784), spec.format, count=5, seed=0, name="fc1.weight",
                              fault=bf.BitFlip())
    fmap.save(tmp_path / "fc1.npz")
    out = inject_file(tmp_path / "m.keras", tmp_path / "one.keras", maps=[tmp_path / "fc1.npz"])
    assert list(out["tensors"]) == ["fc1.weight"] and out["faults"] == 5
    with pytest.raises(ValueError, match="written as a .keras file"):
        inject_file(tmp_path / "m.keras", tmp_path / "x.h5", spec=spec.to_dict())


def test_keras_config_errors() -> None:
    pytest.importorskip("torch")
    with pytest.raises(ConfigError, match="'model.name': got 'torch.nn:Identity'; allowed: a "
                                          "callable returning a keras.Model"):
        build_model(ModelConfig("torch.nn:Identity"), "keras")
    config = load_config({"framework": "keras", "campaign": {"targets": "weights+biases"}})
    with pytest.raises(ConfigError, match="'campaign.targets': got 'weights\\+biases'"):
        check_campaign(config)
