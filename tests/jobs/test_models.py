"""User models from "package.module:callable": built, trained, saved and rebuilt; bad ones
are config errors naming model.name or model.kwargs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mlxtend")

from bitfault.config import ConfigError, ModelConfig, load_config  # noqa: E402
from bitfault.jobs import run_campaign, train  # noqa: E402
from bitfault.jobs.models import build_model, load_model  # noqa: E402

MODULE = '''
from torch import nn

class Holder:
    class Net(nn.Module):
        def __init__(self, width=8):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(784, width), nn.ReLU())
            self.head = nn.Linear(width, 10)

        def forward(self, x):
            return self.head(self.body(x))

def tiny(width=8):
    return Holder.Net(width)

def not_a_model():
    return [1, 2, 3]

VALUE = 5
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = "bf_user_models"
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    yield name
    sys.modules.pop(name, None)


def test_user_model_trains_and_reloads(user_module: str, tmp_path: Path) -> None:
    model = build_model(ModelConfig(f"{user_module}:tiny", {"width": 6}), "torch")
    assert model.body[0].out_features == 6
    assert type(build_model(ModelConfig(f"{user_module}:Holder.Net"), "torch")).__name__ == "Net"
    config = load_config({
        "output": str(tmp_path / "run"), "model": {"name": f"{user_module}:tiny",
                                                   "kwargs": {"width": 12}},
        "data": {"train_limit": 400, "test_limit": 100},
        "train": {"epochs": 2, "batch_size": 20},
        "recipes": [{"name": "q", "format": {"kind": "int_quant", "bits": 8}}],
        "campaign": {"bers": [1e-2], "chips": 2}})
    rd, results = train(config)
    assert results["q"]["trained"] and results["q"]["val_accuracy"] > 0.2
    again = load_model(rd.model_dir("q"), trusted=f"{user_module}:tiny")
    saved = torch.load(rd.model_file("q", "torch"), weights_only=True)
    assert sorted(again.state_dict()) == sorted(saved) == ["body.0.bias", "body.0.weight",
                                                           "head.bias", "head.weight"]
    assert all(np.array_equal(again.state_dict()[k].numpy(), v.numpy()) for k, v in saved.items())
    # a run directory alone does not get to run the callable its model.json names
    with pytest.raises(ValueError, match=f"names the callable '{user_module}:tiny', and "
                                         "loading it would run that code"):
        run_campaign(rd.path)
    summary = run_campaign(rd.path, config)  # the user's own config names it
    assert summary["models"]["q"]["ran"] == 2
    assert run_campaign(rd.path, trust_model_code=True)["models"]["q"]["skipped"] == 2


@pytest.mark.parametrize(("name", "kwargs", "message"), [
    ("bf_no_such_module:tiny", {}, "config key 'model.name': got 'bf_no_such_module:tiny'; "
                                   "allowed: 'package.module:callable' with an importable module "
                                   "(ModuleNotFoundError"),
    ("{m}:missing", {}, "config key 'model.name': got '{m}:missing'; allowed: 'package.module:"
                        "callable'; module '{m}' has no attribute 'missing'"),
    ("{m}:VALUE", {}, "config key 'model.name': got '{m}:VALUE'; allowed: a callable; 'VALUE' is "
                      "a int"),
    ("{m}:not_a_model", {}, "config key 'model.name': got '{m}:not_a_model'; allowed: a callable "
                            "returning a torch.nn.Module (framework 'torch'); it returned a list"),
    ("{m}:tiny", {"depth": 3}, "config key 'model.kwargs': got {{'depth': 3}}; allowed: keyword "
                               "arguments that {m}:tiny accepts"),
])
def test_bad_user_models(user_module: str, name: str, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_model(ModelConfig(name.format(m=user_module), kwargs), "torch")
    assert str(info.value).startswith(message.format(m=user_module)), str(info.value)


def test_builtin_models_take_the_config_seed() -> None:
    a = build_model(ModelConfig("seed_mlp", {"hidden": 8}), "torch", seed=1)
    b = build_model(ModelConfig("seed_mlp", {"hidden": 8}), "torch", seed=1)
    c = build_model(ModelConfig("seed_mlp", {"hidden": 8}), "torch", seed=2)
    assert torch.equal(a.fc1.weight, b.fc1.weight) and not torch.equal(a.fc1.weight, c.fc1.weight)
    cnn = build_model(ModelConfig("small_cnn", {"channels": [2, 4]}), "torch")
    assert cnn.conv2.out_channels == 4
