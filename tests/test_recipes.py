"""The framework-free recipe description: validation, round trips, shared helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest

import bitfault as bf
from bitfault.recipes import (
    EpochRecord,
    RandBET,
    Recipe,
    check_training_loss,
    history_columns,
    thresholds_from_activations,
)


@pytest.mark.parametrize("recipe", [
    Recipe(),
    Recipe.normal(bf.FixedPoint(8, 6)),
    Recipe.clipped(0.05),
    Recipe.randbet_clipped(0.1, 0.2, seed=3),
    Recipe(format=bf.IntQuant(8, symmetric=False), weight_clip=0.1,
           randbet=RandBET(0.01, grad_clamp=0.5, start_below=1.75, fault=bf.StuckAt(1)),
           activation_clip="calibrate", activation_quantile=0.99),
    Recipe(format=None, fault_aware=bf.FaultSpec(format=bf.IntQuant(8), ber=0.01,
                                                 persistence="transient")),
])
def test_round_trip(recipe: Recipe) -> None:
    again = Recipe.from_dict(recipe.to_dict())
    assert again == recipe and again.to_dict() == recipe.to_dict()


def test_stored_format() -> None:
    assert Recipe().stored_format == bf.IntQuant(8)
    spec = bf.FaultSpec(format=bf.FixedPoint(16, 12), ber=1e-3)
    assert Recipe(format=None, fault_aware=spec).stored_format == bf.FixedPoint(16, 12)
    assert Recipe(format=None).stored_format is None


@pytest.mark.parametrize("kwargs, error, match", [
    ({"weight_clip": -1}, ValueError, "weight_clip"),
    ({"weight_clip": True}, TypeError, "weight_clip"),
    ({"activation_clip": "auto"}, ValueError, "activation_clip"),
    ({"activation_quantile": 0}, ValueError, "activation_quantile"),
    ({"name": ""}, ValueError, "name"),
    ({"format": "int8"}, TypeError, "format"),
    ({"format": None, "randbet": RandBET()}, ValueError, "randbet needs a format"),
    ({"randbet": RandBET(fault=bf.BitFlip(bits="exponent"))}, ValueError, "randbet.fault"),
    ({"randbet": RandBET(), "fault_aware": bf.FaultSpec(format=bf.IntQuant(8), ber=0.1)},
     ValueError, "at most one"),
    ({"fault_aware": bf.FaultSpec(ber=0.1)}, ValueError, "must equal"),
])
def test_bad_recipes_name_the_argument(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        Recipe(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"p_train": 0}, "p_train"), ({"p_train": 1.0}, "p_train"), ({"seed": -1}, "seed"),
    ({"grad_clamp": 0}, "grad_clamp"), ({"start_below": math.inf}, "start_below"),
])
def test_bad_randbet(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        RandBET(**kwargs)


def test_unknown_keys_are_named() -> None:
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['clip'\] for recipe"):
        Recipe.from_dict({"clip": 0.1})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['p'\] for randbet"):
        Recipe.from_dict({"randbet": {"p": 0.1}})


def test_randbet_spec_draws_a_fresh_map_each_step() -> None:
    spec = RandBET(0.05, seed=4).spec(bf.IntQuant(8))
    assert spec.persistence == "transient" and spec.ber == 0.05 and spec.seed == 4
    a, b = spec.map_for("fc.weight", (16, 16), step=0), spec.map_for("fc.weight", (16, 16), step=1)
    assert a == bf.FaultMap.random((16, 16), bf.IntQuant(8), ber=0.05, seed=4,
                                   name="fc.weight", step=0)
    assert a != b


def test_check_training_loss() -> None:
    check_training_loss(0.5, math.nan, 1, 0)  # NaN perturbed: the term was off
    check_training_loss(0.5, 0.7, 1, 0)
    for clean, pert in ((math.nan, 0.1), (math.inf, math.nan), (0.5, math.inf)):
        with pytest.raises(FloatingPointError, match="training diverged at epoch 2, step 9"):
            check_training_loss(clean, pert, 2, 9)


def test_thresholds_from_activations() -> None:
    seen = {"a": [np.arange(101, dtype=np.float32)], "dead": [np.zeros(5, np.float32)]}
    t = thresholds_from_activations(seen, 0.5)
    assert t["a"] == 50.0 and t["dead"] == float(np.finfo(np.float32).tiny)
    with pytest.raises(ValueError, match=r"\['unused'\] were not called"):
        thresholds_from_activations({**seen, "unused": []}, 0.5)


def test_history_columns() -> None:
    rows = [EpochRecord(e, 1.0 / e, 0.5 / e, math.nan, 0.9, 0.8, 1.0) for e in (1, 2)]
    cols = history_columns(rows)
    assert cols["epoch"] == [1, 2] and cols["loss"] == [1.0, 0.5]
    assert set(cols) == set(rows[0].to_dict())
