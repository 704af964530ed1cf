"""Targets: the one target vocabulary (kinds, name patterns), what users write, JSON."""

from __future__ import annotations

import json

import pytest

from bitfault import FaultSpec, Targets
from bitfault.errors import ArgumentError
from bitfault.targets import KINDS, kind_of


@pytest.mark.parametrize("name,buffer,kind", [
    ("fc1.weight", False, "weights"),
    ("weight", False, "weights"),
    ("attn.in_proj_weight", False, "weights"),
    ("embed.pos_embedding", False, "weights"),
    ("fc1.bias", False, "biases"),
    ("attn.in_proj_bias", False, "biases"),
    ("fc1.output", False, "activations"),
    ("bn.running_mean", True, "buffers"),
    ("bn.output", True, "activations"),
])
def test_kind_of_reads_the_name(name, buffer, kind):
    assert kind_of(name, buffer=buffer) == kind


@pytest.mark.parametrize("value,want", [
    ("weights", Targets()),
    ("biases", Targets(("biases",))),
    ("weights+biases", Targets(("weights", "biases"))),
    (("biases", "weights", "biases"), Targets(("weights", "biases"))),
    (["fc1.weight", "fc2.*"], Targets(KINDS, include=("fc1.weight", "fc2.*"))),
    ({"kinds": ["weights", "buffers"], "exclude": "head.*"},
     Targets(("weights", "buffers"), exclude=("head.*",))),
    ({"include": ["enc.*"]}, Targets(include=("enc.*",))),
    (Targets(("activations",)), Targets(("activations",))),
])
def test_coerce_accepts_what_users_write(value, want):
    assert Targets.coerce(value) == want


def test_selects_by_kind_then_patterns():
    t = Targets(("weights", "biases"), include=("fc*",), exclude=("fc3.*",))
    assert t.selects("fc1.weight") and t.selects("fc2.bias")
    assert not t.selects("fc3.weight")
    assert not t.selects("conv.weight")
    assert not t.selects("fc1.output")
    assert t.selects("fc1.scale", kind="weights") and not t.selects("fc1.mean", kind="buffers")
    assert Targets().selects("a.b.weight") and not Targets().selects("a.b.bias")
    names = Targets.coerce(["fc1.weight", "fc1.output"])
    assert names.selects("fc1.weight") and names.selects("fc1.output")
    assert not names.selects("fc2.weight")


def test_round_trip_through_json():
    t = Targets(("biases", "weights"), include=("a.*",), exclude=("a.b.*", "a.c.*"))
    data = json.loads(json.dumps(t.to_dict()))
    assert data == {"kinds": ["weights", "biases"], "include": ["a.*"],
                    "exclude": ["a.b.*", "a.c.*"]}
    assert Targets.from_dict(data) == t == Targets.coerce(data)


def test_bad_targets_name_the_argument_and_the_allowed_values():
    with pytest.raises(ArgumentError, match=r"targets must be one of \('weights', 'biases', "
                                            r"'activations', 'buffers'\), got 'weight'"):
        Targets.coerce("weight")
    with pytest.raises(ArgumentError, match="got 'gradients'"):
        Targets.coerce("weights+gradients")
    with pytest.raises(ArgumentError, match="got 'fc1.weight'"):
        Targets.coerce(["weights", "fc1.weight"])  # kinds and names are not mixed
    with pytest.raises(ValueError, match="targets must name at least one of"):
        Targets.coerce([])
    with pytest.raises(TypeError, match=r"targets must be one of .* or a sequence of them"):
        Targets.coerce(5)
    with pytest.raises(TypeError, match="targets.include must be a pattern or a list"):
        Targets(include=(3,))
    with pytest.raises(ValueError, match=r"unknown targets key\(s\) \['names'\]"):
        Targets.from_dict({"names": ["a"]})
    with pytest.raises(ArgumentError, match=r"campaign.targets must be one of \('weights',"
                                            r" 'biases'\), got 'activations'"):
        Targets.coerce("activations", kinds=("weights", "biases"), argument="campaign.targets")


def test_fault_spec_targets_are_targets_kinds_and_patterns():
    assert FaultSpec(ber=0.1, targets="weights+biases").targets.kinds == ("weights", "biases")
    assert FaultSpec(ber=0.1, targets=Targets(("biases",))).targets.kinds == ("biases",)
    assert FaultSpec(ber=0.1, targets={"kinds": ["activations"]}).targets.kinds == (
        "activations",)
    assert "weights" in FaultSpec(ber=0.1).targets and "biases" not in FaultSpec(ber=0.1).targets
    assert FaultSpec(ber=0.1, targets="buffers").targets.kinds == ("buffers",)
    with pytest.raises(ValueError, match=r"targets must be one of \('weights', 'biases', "
                                         r"'activations', 'buffers'\), got 'running'"):
        FaultSpec(ber=0.1, targets="running")
    spec = FaultSpec(ber=0.1, targets=Targets(include=("fc1.*",)))
    assert spec.targets == Targets(include=("fc1.*",))
    names = FaultSpec(ber=0.1, targets=["fc1.weight"]).targets
    assert names == Targets(("weights", "biases", "activations", "buffers"),
                            include=("fc1.weight",))
    with pytest.raises(ValueError, match=r"got 'fc1.weight'"):
        FaultSpec(ber=0.1, targets=["weights", "fc1.weight"])


def test_fault_spec_json_keeps_the_kinds_only_form():
    plain = FaultSpec(ber=0.1, targets="weights+biases")
    assert plain.to_dict()["targets"] == ["weights", "biases"]  # as specs were always written
    assert FaultSpec.from_dict({"ber": 0.1, "targets": ["weights", "biases"]}) == plain
    narrowed = FaultSpec(ber=0.1, targets={"kinds": ["weights"], "exclude": ["head.*"]})
    assert narrowed.to_dict()["targets"] == {"kinds": ["weights"], "include": [],
                                             "exclude": ["head.*"]}
    assert FaultSpec.from_json(narrowed.to_json()) == narrowed
