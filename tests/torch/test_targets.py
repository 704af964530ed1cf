"""One target vocabulary: the same Targets choose the same tensors in inject_, TorchEvaluator,
fit's stored weights, ``bitfault inject`` on a state_dict and a config's campaign.targets."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
from torch import nn  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.config import load_config  # noqa: E402
from bitfault.jobs import inject_file  # noqa: E402
from bitfault.jobs.campaign import make_evaluator  # noqa: E402
from bitfault.models.torch import seed_mlp, small_cnn  # noqa: E402
from bitfault.torch import Selected, TorchEvaluator, inject_, select_tensors, stored_weights  # noqa: E402
from bitfault.torch.targets import state_dict_targets  # noqa: E402

MODELS = {"mlp": lambda: seed_mlp(hidden=8), "cnn": lambda: small_cnn((4, 8)),
          "cnn_bn": lambda: small_cnn((4, 8), norm="batch"),
          "cnn_gn": lambda: small_cnn((4, 8), norm="group")}
TARGETS = ["weights", "weights+biases", ("biases",), {"kinds": ["weights"], "exclude": ["fc*"]},
           {"kinds": ["weights", "biases"], "include": ["conv*", "fc2.*"]}]


def _names(model: nn.Module, targets) -> list[str]:
    return [s.name for s in select_tensors(model, targets)]


def _applicable(model: nn.Module, targets) -> bool:
    try:
        return bool(_names(model, targets))
    except ValueError:  # an include pattern the model lacks (conv* on the MLP)
        return False


@pytest.mark.parametrize("which", sorted(MODELS))
@pytest.mark.parametrize("targets", TARGETS, ids=str)
def test_every_entry_point_faults_the_same_tensors(which, targets, tmp_path) -> None:
    model = MODELS[which]()
    if not _applicable(model, targets):
        pytest.skip("the targets name no tensor of this model")
    want = _names(model, targets)
    spec = bf.FaultSpec(format=bf.IntQuant(8), ber=0.01, seed=3, targets=targets)
    with inject_(model, spec) as handle:
        assert handle.targets == want
    assert state_dict_targets(model.state_dict(), spec.targets) == want
    torch.save(model.state_dict(), tmp_path / "m.pt")
    (tmp_path / "spec.json").write_text(spec.to_json())
    done = inject_file(tmp_path / "m.pt", tmp_path / "out.pt", spec=tmp_path / "spec.json")
    assert list(done["tensors"]) == want
    x, y = np.zeros((2, 784), np.float32), np.zeros(2, np.int64)
    assert TorchEvaluator(model, x, y, targets=targets).names == want
    if targets == "weights":
        assert list(stored_weights(model)) == want  # fit: what RandBET and clipping touch


@pytest.mark.parametrize("targets", ["weights", "weights+biases", ["fc2.weight", "fc1.weight"]],
                         ids=str)
def test_a_config_selects_what_inject_selects(targets) -> None:
    model = seed_mlp(hidden=8)
    config = load_config({"campaign": {"targets": targets}})
    x, y = np.zeros((2, 784), np.float32), np.zeros(2, np.int64)
    ev = make_evaluator(model, "torch", x, y, config.campaign)
    spec = bf.FaultSpec(ber=0.01, targets=targets)
    with inject_(model, spec) as handle:
        assert ev.names == handle.targets == _names(model, targets)
    if not isinstance(targets, str):
        assert ev.names == targets  # a list of names keeps its order


def test_selected_entries_and_the_default_modules() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    model.register_buffer("scale", torch.ones(2))
    assert _names(model, "weights") == ["0.weight", "2.weight"]  # no LayerNorm by default
    assert _names(model, ["1.weight", "scale"]) == ["1.weight", "scale"]  # names: any module
    assert _names(model, {"kinds": ["weights"], "include": ["*.weight"]}) == [
        "0.weight", "1.weight", "2.weight"]
    (first,) = select_tensors(model, "weights", filter_fn="2")
    assert first == Selected("2.weight", "weights", "2", "weight", model[2].weight)
    assert [s.name for s in select_tensors(model, "weights+activations")] == [
        "0.weight", "0.output", "2.weight", "2.output"]
    with pytest.raises(ValueError, match=r"unknown tensor\(s\) \['fc9.weight'\]"):
        select_tensors(model, ["fc9.weight"])


def test_tied_tensors_are_one_memory_everywhere(tmp_path) -> None:
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = nn.ModuleDict({"emb": emb, "head": head})
    (sel,) = select_tensors(model)
    assert sel.name == "emb.weight" and sel.also == (("head", "weight"),)
    assert list(stored_weights(model)) == ["emb.weight"]
    state = model.state_dict()
    assert set(state) == {"emb.weight", "head.weight"}
    assert state_dict_targets(state) == ["emb.weight"]
    torch.save(state, tmp_path / "tied.pt")
    spec = bf.FaultSpec(format=bf.IntQuant(8), ber=0.05, seed=0)
    done = inject_file(tmp_path / "tied.pt", tmp_path / "out.pt", spec=spec)
    assert list(done["tensors"]) == ["emb.weight"]
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert torch.equal(out["emb.weight"], out["head.weight"])
    assert not torch.equal(out["emb.weight"], state["emb.weight"])


def test_patterns_in_a_spec_round_trip_and_narrow_inject() -> None:
    model = seed_mlp(hidden=8)
    spec = bf.FaultSpec(ber=0.01, targets={"kinds": ["weights", "biases"], "exclude": ["fc3.*"]})
    assert bf.FaultSpec.from_json(spec.to_json()) == spec
    with inject_(model, spec) as handle:
        assert handle.targets == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    with pytest.raises(ValueError, match=r"unknown tensor\(s\) \['fc9.weight'\]"):
        inject_(model, bf.FaultSpec(ber=0.01, targets=["fc9.weight"]))
