"""Single-fault grids (exhaustive, Leveugle-sampled) and sequential stopping."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import bitfault as bf
from bitfault.campaign import (
    NumpyEvaluator,
    StopWhenPrecise,
    exhaustive_single_faults,
    run,
    sampled_single_faults,
)
from bitfault.campaign.stats import fault_injection_sample_size, wilson_interval

MEMORY = bf.Memory(bf.IntQuant(8), bf.BitFlip())
SHAPES = {"fc1.weight": (4, 5), "fc2.weight": (3,)}


def test_exhaustive_covers_every_element_and_bit_once():
    trials = exhaustive_single_faults(SHAPES, bf.IntQuant(8))
    cells = {(t.target, t.element, t.bit) for t in trials}
    assert len(trials) == len(cells) == (20 + 3) * 8
    assert cells == {(n, e, b) for n, s in SHAPES.items() for e in range(int(np.prod(s)))
                     for b in range(8)}
    assert all(t.kind == "single" for t in trials)
    msb = exhaustive_single_faults(SHAPES, bf.FixedPoint(32, 28), targets=["fc2.weight"],
                                   bits="sign")
    assert [(t.element, t.bit) for t in msb] == [(0, 31), (1, 31), (2, 31)]


def test_sampled_size_follows_leveugle_and_the_seed():
    shapes = {"w": (1000, 100)}
    fmt = bf.FixedPoint(32, 28)
    trials = sampled_single_faults(shapes, fmt, margin=0.02, confidence=0.99)
    assert len(trials) == fault_injection_sample_size(100_000 * 32, 0.02, 0.99)
    cells = {(t.element, t.bit) for t in trials}
    assert len(cells) == len(trials)  # no repeats
    assert all(0 <= e < 100_000 and 0 <= b < 32 for e, b in cells)
    assert trials == sampled_single_faults(shapes, fmt, margin=0.02, confidence=0.99)
    assert trials != sampled_single_faults(shapes, fmt, margin=0.02, confidence=0.99, seed=1)
    # roughly uniform over bits and elements (a 4,000-fault sample of 3.2M)
    bits = np.bincount([b for _, b in cells], minlength=32)
    assert bits.min() > 0.5 * len(trials) / 32
    assert np.mean([e for e, _ in cells]) == pytest.approx(50_000, rel=0.05)


def test_sampled_from_several_tensors_and_a_fixed_size():
    trials = sampled_single_faults(SHAPES, bf.IntQuant(8), size=184, seed=3)
    assert {(t.target, t.element, t.bit) for t in trials} == {
        (t.target, t.element, t.bit) for t in exhaustive_single_faults(SHAPES, bf.IntQuant(8))}
    huge = sampled_single_faults({"w": (10**6, 1000)}, bf.FixedPoint(32, 28), margin=0.05)
    assert len(huge) == fault_injection_sample_size(32 * 10**9, 0.05)


@pytest.mark.parametrize("kwargs, match", [
    ({"targets": ["nope"]}, "unknown \\['nope'\\]"),
    ({"targets": "fc1.weight"}, "list of tensor names"),
    ({"size": 0}, "size must be an integer in 1..184"),
    ({"size": 185}, "size must be an integer in 1..184"),
    ({"margin": 0}, "margin must be in"),
    ({"seed": -1}, "seed must be"),
    ({"bits": 9}, "bits"),
])
def test_sampled_bad_input(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        sampled_single_faults(SHAPES, bf.IntQuant(8), **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"margin": 0.0}, "margin"), ({"margin": 0.7}, "margin"), ({"confidence": 1.0}, "confidence"),
    ({"min_trials": 0}, "min_trials"), ({"failure": "robust"}, "failure must be a function"),
])
def test_stop_rule_bad_input(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        StopWhenPrecise(**kwargs)


def test_sequential_stopping_ends_early_and_resumes(evaluator: NumpyEvaluator,
                                                   tmp_path: Path) -> None:
    shapes = evaluator.tensor_shapes()
    trials = sampled_single_faults(shapes, MEMORY.format, margin=0.05, seed=0)
    stop = StopWhenPrecise(margin=0.05, min_trials=40)
    result = run(evaluator, trials, MEMORY, tmp_path / "s.db", batch=16, stop=stop)
    est = result.stopping
    assert est["reached"] and 40 <= result.ran < len(trials)
    lo, hi = est["interval"]
    assert (hi - lo) / 2 <= 0.05 and est["trials"] == result.ran == len(result.records)
    # the trials run are the first ones of the (random) list, and the count is right
    assert {r.trial_key for r in result.records} == {t.key for t in trials[:result.ran]}
    failed = sum(r.metrics["robust_error"] > result.clean["robust_error"]
                 for r in result.records)
    assert est["failures"] == failed and (lo, hi) == wilson_interval(failed, result.ran)
    # a batch earlier the interval was still too wide (it stopped as soon as it could)
    k = sum(r.metrics["robust_error"] > result.clean["robust_error"] for r in result.records
            if r.trial_key in {t.key for t in trials[:result.ran - 16]})
    a, b = wilson_interval(k, result.ran - 16)
    assert result.ran - 16 < 40 or (b - a) / 2 > 0.05
    again = run(evaluator, trials, MEMORY, tmp_path / "s.db", batch=16, stop=stop)
    assert again.ran == 0 and again.stopping == est and len(again.records) == result.ran
    whole = run(evaluator, trials, MEMORY, tmp_path / "s.db", batch=16)  # no stop: the rest
    assert whole.ran == len(trials) - result.ran and len(whole.records) == len(trials)


def test_custom_failure_and_a_metric_without_robust_error(evaluator: NumpyEvaluator,
                                                          tmp_path: Path) -> None:
    trials = sampled_single_faults(evaluator.tensor_shapes(), MEMORY.format, size=64, seed=1)

    def accuracy_only(labels, clean, faulty):
        return {"accuracy": float(np.mean(faulty == labels))}

    with pytest.raises(ValueError, match="no 'robust_error'.*failure="):
        run(evaluator, trials, MEMORY, tmp_path / "a.db", metric=accuracy_only,
            stop=StopWhenPrecise(margin=0.2))
    assert not (tmp_path / "a.db").exists()  # refused before the store was made
    never = StopWhenPrecise(margin=0.2, min_trials=10, failure=lambda m, c: False)
    result = run(evaluator, trials, MEMORY, tmp_path / "a.db", metric=accuracy_only, batch=8,
                 stop=never)
    assert result.stopping["failures"] == 0 and result.ran == 16  # [0, 0.21] at 16: narrow


def test_progress_true_draws_a_bar(evaluator: NumpyEvaluator, tmp_path: Path, capsys) -> None:
    pytest.importorskip("tqdm")
    trials = exhaustive_single_faults(evaluator.tensor_shapes(), MEMORY.format, bits=[7])[:20]
    run(evaluator, trials, MEMORY, tmp_path / "p.db", batch=5, progress=True)
    err = capsys.readouterr().err
    assert "campaign" in err and "20/20" in err
    with pytest.raises(TypeError, match="progress must be"):
        run(evaluator, trials, MEMORY, tmp_path / "p.db", progress="yes")


def test_bit_sweep_by_field_name(evaluator: NumpyEvaluator, tmp_path: Path) -> None:
    """A field ("sign": the MSB of IntQuant's signed codes) is a bit sweep like a position."""
    from bitfault.campaign import bit_sweep

    by_name = run(evaluator, bit_sweep([5e-2], 2, ["sign"]), MEMORY, tmp_path / "n.db")
    by_pos = run(evaluator, bit_sweep([5e-2], 2, [7]), MEMORY, tmp_path / "p.db")
    assert [r.bit for r in by_name.records] == ["sign", "sign"]
    assert [r.metrics for r in by_name.records] == [r.metrics for r in by_pos.records]
    assert [r.map_digest for r in by_name.records] == [r.map_digest for r in by_pos.records]
    with pytest.raises(TypeError, match="bit position .* or a field name"):
        bit_sweep([1e-2], 1, [True])
    with pytest.raises(ValueError, match="at least one"):
        bit_sweep([1e-2], 1, "sign")


@pytest.mark.parametrize("trial, match", [
    ("bit", "unknown bit field 'mantissa'"),
    ("bit_range", "outside 0..7"),
    ("single_bit", "bit must be in 0..7"),
    ("single_element", "element must be in 0..9"),
])
def test_trials_are_checked_against_format_and_shapes_first(
        evaluator: NumpyEvaluator, tmp_path: Path, trial, match) -> None:
    from bitfault.campaign import Trial, bit_sweep, single_faults

    trials = {"bit": bit_sweep([1e-2], 1, ["mantissa"]),
              "bit_range": bit_sweep([1e-2], 1, [9]),
              "single_bit": single_faults([("fc2.bias", 0, 8)]),
              "single_element": single_faults([("fc2.bias", 10, 0)])}[trial]
    with pytest.raises(ValueError, match=match):
        run(evaluator, trials, MEMORY, tmp_path / "x.db")
    assert not (tmp_path / "x.db").exists()
    with pytest.raises(ValueError, match="needs a target"):
        run(evaluator, [Trial("single", bit=0, element=0)], MEMORY, tmp_path / "x.db")
