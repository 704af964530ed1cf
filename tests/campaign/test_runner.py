"""The campaign engine: equal to a plain loop, resumable after SIGKILL, strict about input."""

from __future__ import annotations

import copy
import json
import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bitfault as bf
from bitfault.campaign import (
    CampaignStore,
    NumpyEvaluator,
    StoreError,
    bit_sweep,
    layer_sweep,
    rate_sweep,
    run,
    single_faults,
)
from bitfault.campaign.runner import CampaignResult
from bitfault.campaign.stats import SUMMARY_COLUMNS, summary_rows
from bitfault.campaign.store import TrialRecord

MEMORY = bf.Memory(bf.IntQuant(8), bf.BitFlip())
HERE = Path(__file__).parent


def plain_accuracy(ev: NumpyEvaluator, maps: dict[str, bf.FaultMap]) -> float:
    """Every tensor stored in the format; ``maps`` says where the faults are."""
    params = dict(ev.params)
    for name, shape in ev.tensor_shapes().items():
        fmap = maps.get(name) or bf.FaultMap.from_mask(np.zeros(shape, np.uint32), name=name)
        params[name] = bf.inject(ev.params[name], MEMORY.format, MEMORY.fault, fmap)
    with np.errstate(all="ignore"):
        logits = ev.forward(params, ev.x)
    return float(np.mean(np.argmax(np.nan_to_num(logits, nan=-np.inf), 1) == ev.labels))


def test_rate_sweep_equals_a_plain_loop(evaluator: NumpyEvaluator, tmp_path: Path) -> None:
    trials = rate_sweep([1e-3, 1e-2, 1e-1], chips=3)
    result = run(evaluator, trials, MEMORY, tmp_path / "c.db")
    assert result.ran == len(trials) and result.skipped == 0
    by_key = {r.trial_key: r for r in result.records}
    shapes = evaluator.tensor_shapes()
    for t in trials:
        maps = {n: bf.FaultMap.random(s, MEMORY.format, ber=t.ber, seed=t.chip, name=n)
                for n, s in shapes.items()}
        assert by_key[t.key].metrics["accuracy"] == plain_accuracy(evaluator, maps)
    accs = [by_key[t.key].metrics["accuracy"] for t in trials]
    assert accs[0] > 0.8 and min(accs[-3:]) < accs[0]  # faults at 10% hurt


def test_layer_bit_and_single_trials(evaluator: NumpyEvaluator, tmp_path: Path) -> None:
    trials = (layer_sweep([1e-2], 2, ["fc1.weight", "fc2.weight"])
              + bit_sweep([1e-2], 2, [7, 0])
              + single_faults([("fc2.weight", 5, 7), ("fc2.weight", 5, 0)]))
    result = run(evaluator, trials, MEMORY, tmp_path / "c.db")
    got = {r.trial_key: r.metrics["accuracy"] for r in result.records}
    shapes = evaluator.tensor_shapes()
    for t in trials:
        if t.kind == "layer":
            maps = {t.target: bf.FaultMap.random(shapes[t.target], MEMORY.format, ber=t.ber,
                                                 seed=t.seed, name=t.target)}
        elif t.kind == "bit":
            maps = {n: bf.FaultMap.random(s, MEMORY.format, ber=t.ber, seed=t.seed, name=n,
                                          bits=t.bit) for n, s in shapes.items()}
        else:
            dense = np.zeros(shapes[t.target], np.uint32)
            dense.flat[t.element] = 1 << t.bit
            maps = {t.target: bf.FaultMap.from_mask(dense, name=t.target)}
        assert got[t.key] == plain_accuracy(evaluator, maps), t.key


def test_rerun_skips_everything(evaluator: NumpyEvaluator, tmp_path: Path) -> None:
    trials = rate_sweep([1e-2], chips=3)
    first = run(evaluator, trials, MEMORY, tmp_path / "c.db")
    again = run(evaluator, trials, MEMORY, tmp_path / "c.db")
    assert (again.ran, again.skipped) == (0, 3)
    assert [r.metrics for r in again.records] == [r.metrics for r in first.records]


def _rows(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as db:
        return sorted(db.execute("SELECT trial_key, map_digest, metrics FROM trials"))


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory,
           mlp_params: dict[str, np.ndarray]) -> tuple[list[str], list[tuple]]:
    """The worker command line and the rows of an uninterrupted run."""
    folder = tmp_path_factory.mktemp("resume")
    np.savez(folder / "params.npz", **mlp_params)
    command = [sys.executable, str(HERE / "resume_worker.py"), str(folder / "params.npz")]
    subprocess.run([*command, str(folder / "reference.db"), "-1"], check=True)
    return command, _rows(folder / "reference.db")


@pytest.mark.parametrize("kill_during", [1, 5, 12])
def test_sigkill_then_resume_gives_the_uninterrupted_result(
        tmp_path: Path, worker: tuple[list[str], list[tuple]], kill_during: int) -> None:
    command, reference = worker
    killed = tmp_path / "killed.db"
    proc = subprocess.run([*command, str(killed), str(kill_during)])
    assert proc.returncode == -9  # it really died by SIGKILL
    # the trials of one evaluator call (batch=3) are committed together once scored: a
    # kill while scoring trial K keeps every earlier batch and nothing of K's own
    assert len(_rows(killed)) == 3 * ((kill_during - 1) // 3)
    subprocess.run([*command, str(killed), "-1"], check=True)
    assert _rows(killed) == reference
    assert len(reference) == 12


def test_bad_input(evaluator: NumpyEvaluator, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="trials must not be empty"):
        run(evaluator, [], MEMORY, tmp_path / "a.db")
    with pytest.raises(ValueError, match="bers"):
        rate_sweep([2.0], chips=2)
    with pytest.raises(ValueError, match="chips"):
        rate_sweep([0.1], chips=0)

    def broken(labels, clean, faulty):
        raise ZeroDivisionError("boom")

    with pytest.raises(RuntimeError, match="metric 'broken' raised on clean run"):
        run(evaluator, rate_sweep([1e-2], 1), MEMORY, tmp_path / "b.db", metric=broken)

    run(evaluator, rate_sweep([1e-2], 2), MEMORY, tmp_path / "c.db")
    with pytest.raises(StoreError, match="different campaign"):
        run(evaluator, rate_sweep([1e-2], 3), MEMORY, tmp_path / "c.db")
    more = run(evaluator, rate_sweep([1e-2], 3), MEMORY, tmp_path / "c.db", append=True)
    assert (more.ran, more.skipped) == (1, 2)

    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("my notes, not a database\n")
    with pytest.raises(StoreError, match="not an SQLite database"):
        run(evaluator, rate_sweep([1e-2], 1), MEMORY, not_sqlite)
    assert not_sqlite.read_text() == "my notes, not a database\n"


def test_store_exports(evaluator: NumpyEvaluator, tmp_path: Path) -> None:
    run(evaluator, rate_sweep([1e-2], 2), MEMORY, tmp_path / "c.db")
    digest = sqlite3.connect(tmp_path / "c.db").execute(
        "SELECT value FROM campaign WHERE key='digest'").fetchone()[0]
    with CampaignStore(tmp_path / "c.db", digest) as store:
        store.to_csv(tmp_path / "c.csv")
        frame = store.to_dataframe()
    lines = (tmp_path / "c.csv").read_text().splitlines()
    assert len(lines) == 3 and "metric_accuracy" in lines[0]
    assert list(frame["chip"]) == [0, 1]
    assert os.path.getsize(tmp_path / "c.csv") > 0


def test_summary_across_chips(evaluator: NumpyEvaluator, tmp_path: Path) -> None:
    result = run(evaluator, rate_sweep([1e-3, 1e-1], chips=4), MEMORY, tmp_path / "c.db")
    rows = result.summary("accuracy")
    assert [(r["kind"], r["ber"], r["n"]) for r in rows] == [("rate", 1e-3, 4), ("rate", 0.1, 4)]
    accs = [r.metrics["accuracy"] for r in result.records if r.ber == 0.1]
    assert rows[1]["mean"] == pytest.approx(np.mean(accs))
    assert rows[1]["min"] == min(accs) and rows[1]["max"] == max(accs)
    assert rows[1]["ci_low"] <= rows[1]["mean"] <= rows[1]["ci_high"]
    assert result.summary("robust_error")[0]["mean"] >= 1 - result.clean["accuracy"]
    with pytest.raises(KeyError, match="not recorded"):
        result.summary("f1")


def _record(kind: str, ber: float | None, chip: int, metrics: dict, target: str | None = None
            ) -> TrialRecord:
    return TrialRecord(f"{kind}-{ber}-{chip}-{target}", "c", kind, ber, chip, chip, target,
                       None, None, None, None, None, None, None, metrics, None, None, None)


def test_summary_rows_count_non_finite_chips_and_never_average_them() -> None:
    records = [_record("rate", 1e-4, 0, {"perplexity": 40.0, "next_token_agreement": 0.9}),
               _record("rate", 1e-4, 1, {"perplexity": math.inf, "next_token_agreement": 0.2}),
               _record("rate", 1e-4, 2, {"perplexity": 44.0, "next_token_agreement": 1.0}),
               _record("rate", 1e-3, 0, {"perplexity": math.nan, "next_token_agreement": 0.0}),
               _record("single", None, 0, {"perplexity": 37.0}, target="a.weight"),
               _record("single", None, 1, {"perplexity": 39.0}, target="b.weight")]
    result = CampaignResult(records)
    rows = {(r["kind"], r["ber"]): r for r in result.summary("perplexity")}
    row = rows[("rate", 1e-4)]
    assert (row["chips"], row["non_finite"], row["n"], row["mean"]) == (3, 1, 2, 42.0)
    empty = rows[("rate", 1e-3)]
    assert (empty["chips"], empty["non_finite"], empty["n"]) == (1, 1, 0) and "mean" not in empty
    single = rows[("single", None)]  # every single fault in one row, whatever its target
    assert (single["chips"], single["mean"], single["target"]) == (2, 38.0, None)
    # a bounded value's interval stays inside its range
    (agree,) = [r for r in summary_rows(records, "next_token_agreement") if r["ber"] == 1e-4]
    assert agree["ci_method"] == "wilson_effective_n" and 0.0 <= agree["ci_low"]
    assert agree["ci_high"] <= 1.0
    with pytest.raises(KeyError, match="not recorded"):
        result.summary("next_token_agreement")  # the single faults did not record it


def test_summary_as_a_data_frame() -> None:
    records = [_record("rate", 1e-8, c, {"perplexity": v}) for c, v in
               enumerate([37.4, 37.5, 1e7])] + [_record("rate", 1e-6, 0, {"perplexity": math.inf})]
    frame = CampaignResult(records).to_frame("perplexity")
    assert list(frame.columns) == list(SUMMARY_COLUMNS) and len(frame) == 2
    row = frame.set_index("ber").loc[1e-8]
    assert row["median"] == 37.5 and row["ci_low"] == 1.0 and row["n"] == 3
    lost = frame.set_index("ber").loc[1e-6]
    assert lost["n"] == 0 and lost["non_finite"] == 1 and math.isnan(lost["median"])


def test_outcomes_of_a_store_written_with_the_older_classes(tmp_path: Path) -> None:
    old = [{"agreement": 1.0, "masked": 0, "non_finite": 0, "corrupted": 1},  # benign
           {"agreement": 0.5, "masked": 0, "non_finite": 0, "corrupted": 1},  # sdc
           {"agreement": 1.0, "masked": 1, "non_finite": 0, "corrupted": 0}]
    with CampaignStore(tmp_path / "old.db", "c") as store:
        store.add_many([{"trial_key": f"rate-{c}", "kind": "rate", "ber": 1e-3, "chip": c,
                         "metrics": m} for c, m in enumerate(old)])
    with CampaignStore(tmp_path / "old.db", "c") as store:
        result = CampaignResult(list(store.records()))
    (row,) = result.outcomes()
    assert (row["masked"], row["benign"], row["sdc"], row["non_finite"]) == (1 / 3,) * 3 + (0,)
    assert json.loads(result.to_json())["outcomes"] == [row]


def _garble(path: Path, at: float) -> None:
    """Overwrite 4 KiB at fraction ``at`` of the file (after a checkpoint) with noise."""
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    start = int(len(data) * at)
    data[start:start + 4096] = np.random.default_rng(0).bytes(4096)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("at", [0.25, 0.5, 0.9])
def test_a_store_garbled_mid_file_is_one_store_error(tmp_path: Path, at: float) -> None:
    """Not a raw sqlite3.DatabaseError at some later read: a StoreError naming the file,
    raised on opening, before any trial runs."""
    path = tmp_path / "c.db"
    with CampaignStore(path, "abc") as db:
        db.add_many([{"trial_key": f"t{i:05d}", "kind": "rate", "metrics": {"pad": "x" * 300}}
                     for i in range(3000)])
    _garble(path, at)
    with pytest.raises(StoreError, match=rf"^{path}: .*malformed") as info:
        with CampaignStore(path, "abc") as db:
            db.done_keys()
            list(db.records())
    assert "\n" not in str(info.value)


def test_store_errors_after_opening_name_the_store(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    with CampaignStore(path, "abc") as db:
        db.add({"trial_key": "a", "kind": "rate", "metrics": {}})
        db._db.execute("DROP TABLE trials")  # what a damaged page would make unreadable
        for call in (db.done_keys, db.__len__, lambda: list(db.records()),
                     lambda: db.add({"trial_key": "b", "kind": "rate", "metrics": {}})):
            with pytest.raises(StoreError, match=rf"^{path}: the campaign store cannot be read"):
                call()


def test_fallbacks_of_the_evaluator_are_stored_with_the_trials(evaluator: NumpyEvaluator,
                                                               tmp_path: Path) -> None:
    """An evaluator whose fast path failed for a tensor says so in ``fallbacks``: the store
    keeps it (merged over runs) and the result and its JSON carry it."""
    def falling_back(failed: dict[str, str]) -> NumpyEvaluator:
        ev = copy.copy(evaluator)
        ev.fallbacks = failed  # what a torch evaluator records when a fast path fails
        return ev

    name = next(iter(evaluator.tensor_shapes()))
    store = tmp_path / "c.db"
    first = run(falling_back({name: "boom"}), rate_sweep([1e-2], chips=2), MEMORY,
                store)
    assert first.fallbacks == {name: "boom"}
    assert json.loads(first.to_json())["fallbacks"] == {name: "boom"}
    plain = run(evaluator, rate_sweep([1e-2], chips=2), MEMORY, store)  # resumed: kept
    assert plain.ran == 0 and plain.fallbacks == {name: "boom"}
    with CampaignStore(store, plain_digest(store)) as db:
        assert db.fallbacks() == {name: "boom"}


def plain_digest(path: Path) -> str:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT value FROM campaign WHERE key='digest'").fetchone()[0]
