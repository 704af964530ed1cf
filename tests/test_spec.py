"""FaultSpec: validation, JSON round trip, and the maps it hands to adapters."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bitfault import BitFlip, FaultMap, FaultSpec, FixedPoint, Float, IntQuant, StuckAt

SPECS = [
    FaultSpec(ber=1e-3),
    FaultSpec(count=5, seed=3, targets="biases"),
    FaultSpec(format=Float("bfloat16"), fault=StuckAt(1, bits=["exponent", 3]),
              ber={"msb": 0.1, 0: 0.2}, targets=("activations", "weights"),
              persistence="transient", resample="forward", gradient="blocked", seed=5),
    FaultSpec(format=IntQuant(8, symmetric=False, per_channel=True), fault=StuckAt(0),
              ber=[0.0] * 7 + [0.5], targets=["weights", "biases", "activations"]),
    FaultSpec(format=FixedPoint(16, 8, "nearest", "wrap"), fault=BitFlip(bits=(0, 15)), ber=0,
              persistence="transient"),
    FaultSpec(maps={"fc1.weight": FaultMap.from_mask(np.array([[1, 0], [0, -1]], np.int32),
                                                     name="fc1.weight"),
                    "fc2.bias": FaultMap.from_mask(np.array([0, 0, 4], np.int32))}),
]


def test_defaults_are_the_seed_program():
    spec = FaultSpec(ber=0.01)
    assert spec.format == FixedPoint(32, 28, rounding="trunc")
    assert spec.fault == BitFlip()
    assert spec.targets.kinds == ("weights",) and spec.persistence == "permanent"
    assert spec.gradient == "ste" and spec.resample == "step" and spec.seed == 0


@pytest.mark.parametrize("spec", SPECS, ids=range(len(SPECS)))
def test_json_round_trip(spec):
    text = spec.to_json()
    again = FaultSpec.from_json(text)
    assert again == spec
    assert again.to_json() == text
    assert FaultSpec.from_dict(json.loads(text)) == spec
    assert again.format == spec.format and again.fault == spec.fault
    if spec.maps is not None:
        for name, fmap in spec.maps.items():
            assert np.array_equal(again.maps[name].to_dense(), fmap.to_dense())
            assert again.map_for(name, fmap.shape) == spec.map_for(name, fmap.shape)


def test_specs_that_differ_are_not_equal():
    assert FaultSpec(ber=0.1) != FaultSpec(ber=0.2)
    assert FaultSpec(ber=0.1) != FaultSpec(ber=0.1, gradient="blocked")
    assert FaultSpec(ber=0.1) != FaultSpec(ber=0.1, fault=StuckAt(0))


def test_format_and_fault_may_be_given_as_dicts():
    spec = FaultSpec(format={"kind": "float", "dtype": "float16"},
                     fault={"kind": "stuck_at", "value": 1, "bits": "sign"}, count=2)
    assert spec.format == Float("float16") and spec.fault == StuckAt(1, bits="sign")


def test_unknown_spec_key_rejected():
    data = FaultSpec(ber=0.1).to_dict()
    data["rate"] = 0.1
    with pytest.raises(ValueError, match=r"unknown spec key\(s\) \['rate'\]; allowed: "
                                         r"\['format', 'fault', 'ber'"):
        FaultSpec.from_dict(data)
    with pytest.raises(TypeError, match="a spec must be a mapping"):
        FaultSpec.from_dict([("ber", 0.1)])
    with pytest.raises(ValueError, match="unknown key"):
        FaultSpec.from_dict({"ber": 0.1, "format": {"kind": "float", "dtype": "float16",
                                                    "bits": 16}})


def test_exactly_one_of_ber_count_maps():
    with pytest.raises(ValueError, match=r"give exactly one of ber=, count= or maps=; got none"):
        FaultSpec()
    with pytest.raises(ValueError, match=r"exactly one of .*got \['ber', 'count'\]"):
        FaultSpec(ber=0.1, count=3)
    fmap = FaultMap.from_mask(np.ones(2, np.int32))
    with pytest.raises(ValueError, match=r"got \['count', 'maps'\]"):
        FaultSpec(count=3, maps={"a": fmap})


@pytest.mark.parametrize("field,value,allowed", [
    ("targets", "weight", r"\('weights', 'biases', 'activations', 'buffers'\)"),
    ("targets", ["weights", "gradients"], r"\('weights', 'biases', 'activations', 'buffers'\)"),
    ("targets", [], r"\('weights', 'biases', 'activations', 'buffers'\)"),
    ("persistence", "sometimes", r"\('permanent', 'transient'\)"),
    ("resample", "epoch", r"\('step', 'forward'\)"),
    ("gradient", "none", r"\('ste', 'blocked'\)"),
    ("gradient", None, r"\('ste', 'blocked'\)"),
])
def test_bad_choices_rejected_naming_the_allowed_values(field, value, allowed):
    with pytest.raises(ValueError, match=rf"{field} must .*{allowed}"):
        FaultSpec(ber=0.1, **{field: value})


def test_other_bad_values_rejected():
    with pytest.raises(TypeError, match=r"targets must be one of \('weights'"):
        FaultSpec(ber=0.1, targets=5)
    with pytest.raises(ValueError, match=r"ber must be in \[0, 1\]"):
        FaultSpec(ber=1.5)
    with pytest.raises(ValueError, match=r"ber must be in \[0, 1\]"):
        FaultSpec(ber=-0.01)
    with pytest.raises(ValueError, match=r"one rate per bit position \(32"):
        FaultSpec(ber=[0.1, 0.2])
    with pytest.raises(ValueError, match="count must be a non-negative integer"):
        FaultSpec(count=-1)
    with pytest.raises(ValueError, match="count must be a non-negative integer"):
        FaultSpec(count=2.5)
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        FaultSpec(ber=0.1, seed=-3)
    with pytest.raises(ValueError, match="unknown bit field 'exponent' for FixedPoint"):
        FaultSpec(ber=0.1, fault=BitFlip(bits="exponent"))
    with pytest.raises(ValueError, match=r"outside 0\.\.15"):
        FaultSpec(ber=0.1, format=Float("float16"), fault=BitFlip(bits=20))
    with pytest.raises(TypeError, match="format must be a bitfault format"):
        FaultSpec(ber=0.1, format="fixed")
    with pytest.raises(TypeError, match=r"fault must be BitFlip\(\) or StuckAt"):
        FaultSpec(ber=0.1, fault="flip")
    with pytest.raises(ValueError, match="persistence='transient' needs ber= or count="):
        FaultSpec(maps={"a": FaultMap.from_mask(np.ones(2, np.int32))}, persistence="transient")
    with pytest.raises(ValueError, match="maps must be a non-empty mapping"):
        FaultSpec(maps={})
    with pytest.raises(ValueError, match=r"maps\['a'\] must be a FaultMap"):
        FaultSpec(maps={"a": 3})


def test_targets_are_normalised_in_a_fixed_order():
    assert FaultSpec(ber=0.1, targets="activations").targets.kinds == ("activations",)
    spec = FaultSpec(ber=0.1, targets=["activations", "weights", "weights"])
    assert spec.targets.kinds == ("weights", "activations")


# ---- maps for tensors --------------------------------------------------------------------------


def test_permanent_map_for_is_the_random_map_and_ignores_step():
    spec = FaultSpec(ber=0.01, seed=4, fault=BitFlip(bits="msb"))
    got = spec.map_for("fc1.weight", (128, 784))
    want = FaultMap.random((128, 784), spec.format, ber=0.01, seed=4, name="fc1.weight",
                           bits="msb")
    assert got == want and got.n_faults > 0
    assert spec.map_for("fc1.weight", (128, 784), step=7) == got
    assert spec.map_for("fc2.weight", (128, 784)) != got


def test_transient_map_for_changes_with_step_and_replays():
    spec = FaultSpec(ber=0.02, seed=1, persistence="transient")
    maps = [spec.map_for("fc1.weight", (64, 32), step=s) for s in range(4)]
    assert len({m.digest() for m in maps}) == 4
    assert spec.map_for("fc1.weight", (64, 32), step=2) == maps[2]
    assert maps[3] == FaultMap.random((64, 32), spec.format, ber=0.02, seed=1,
                                      name="fc1.weight", step=3)


def test_count_spec_gives_that_many_faults_per_tensor():
    spec = FaultSpec(count=9, format=IntQuant(4), fault=StuckAt(1, bits="magnitude"))
    for name, shape in [("a.weight", (10, 3)), ("a.bias", (10,)), ("b.output", (2, 5, 5))]:
        fmap = spec.map_for(name, shape)
        assert fmap.n_faults == 9 and fmap.shape == shape
        assert int(np.bitwise_or.reduce(fmap.masks)) & 0b1000 == 0  # magnitude bits only


def test_explicit_maps(tmp_path):
    fc1 = FaultMap.random((4, 6), FixedPoint(32, 28), count=3, seed=2, name="fc1.weight")
    fc1.save(tmp_path / "fc1.npz")
    spec = FaultSpec(maps={"fc1.weight": str(tmp_path / "fc1.npz"),
                           "fc1.bias": {"shape": [4], "indices": [1], "masks": [2**31]}})
    assert spec.map_for("fc1.weight", (4, 6)) == fc1
    assert spec.map_for("fc1.bias", (4,)).to_dense().tolist() == [0, 2**31, 0, 0]
    other = spec.map_for("fc2.weight", (3, 3))
    assert other.n_faults == 0 and other.shape == (3, 3) and other.name == "fc2.weight"
    with pytest.raises(ValueError, match=r"maps\['fc1.weight'\] is for shape \(4, 6\), the "
                                         r"tensor has shape \(6, 4\)"):
        spec.map_for("fc1.weight", (6, 4))


def test_replace_validates_and_switches_the_source():
    spec = FaultSpec(ber=0.1, seed=2)
    assert spec.replace(ber=0.2).ber == 0.2
    counted = spec.replace(count=4)
    assert counted.count == 4 and counted.ber is None and counted.seed == 2
    assert counted.replace(ber=0.3).count is None
    fmap = FaultMap.from_mask(np.ones(3, np.int32), name="w")
    assert spec.replace(maps={"w": fmap}).ber is None
    with pytest.raises(ValueError, match="gradient must be one of"):
        spec.replace(gradient="sometimes")
    assert spec.replace(gradient="blocked").gradient == "blocked"
    assert spec.ber == 0.1 and spec.gradient == "ste"  # the original is untouched
