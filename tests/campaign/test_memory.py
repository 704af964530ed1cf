"""A campaign's identity is its Memory (format + fault model), trials, model and data: what a
FaultSpec adds (rate, seed, targets, persistence) changes neither digest nor provenance."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

import bitfault as bf
from bitfault.campaign import CampaignStore, NumpyEvaluator, StoreError, rate_sweep, run
from bitfault.campaign.runner import campaign_digest

TRIALS = rate_sweep([1e-2], chips=2)


def _provenance(store: Path) -> tuple[str, str, set[str]]:
    """The store's digest, its description and the distinct memory JSON of its trials."""
    with sqlite3.connect(store) as db:
        digest, description = (db.execute(f"SELECT value FROM campaign WHERE key='{k}'")
                               .fetchone()[0] for k in ("digest", "description"))
        memories = {r[0] for r in db.execute("SELECT DISTINCT memory FROM trials")}
    return digest, description, memories


def test_specs_differing_only_outside_the_memory_give_one_campaign(
        evaluator: NumpyEvaluator, tmp_path: Path) -> None:
    fmt, fault = bf.IntQuant(8), bf.StuckAt(1)
    specs = [bf.FaultSpec(format=fmt, fault=fault, ber=1e-3, seed=0),
             bf.FaultSpec(format=fmt, fault=fault, ber=0.0, seed=7),
             bf.FaultSpec(format=fmt, fault=fault, count=3, targets="weights+biases"),
             bf.FaultSpec(format=fmt, fault=fault, ber=1e-2, persistence="transient")]
    digests = {campaign_digest(s.memory, TRIALS, "m", "d") for s in specs}
    assert digests == {campaign_digest(bf.Memory(fmt, fault), TRIALS, "m", "d")}
    stored = []
    for k, s in enumerate(specs):
        run(evaluator, TRIALS, s.memory, tmp_path / f"{k}.db")
        stored.append(_provenance(tmp_path / f"{k}.db"))
    assert len({(digest, description) for digest, description, _ in stored}) == 1
    assert all(s[2] == {bf.Memory(fmt, fault).to_json()} for s in stored)
    description = json.loads(stored[0][1])
    assert description["memory"] == bf.Memory(fmt, fault).to_dict() and "spec" not in description
    # the same campaign: one store takes every spec's memory without append=True
    for s in specs:
        assert run(evaluator, TRIALS, s.memory, tmp_path / "0.db").skipped == len(TRIALS)


@pytest.mark.parametrize("other", [bf.Memory(bf.IntQuant(4), bf.StuckAt(1)),
                                   bf.Memory(bf.IntQuant(8), bf.BitFlip()),
                                   bf.Memory(bf.IntQuant(8), bf.StuckAt(0)),
                                   bf.Memory(bf.IntQuant(8, per_channel=True), bf.StuckAt(1))])
def test_another_format_or_fault_model_is_another_campaign(
        evaluator: NumpyEvaluator, tmp_path: Path, other: bf.Memory) -> None:
    memory = bf.Memory(bf.IntQuant(8), bf.StuckAt(1))
    assert campaign_digest(other, TRIALS, "m", "d") != campaign_digest(memory, TRIALS, "m", "d")
    run(evaluator, TRIALS, memory, tmp_path / "c.db")
    with pytest.raises(StoreError, match="different campaign"):
        run(evaluator, TRIALS, other, tmp_path / "c.db")
    run(evaluator, TRIALS, other, tmp_path / "o.db")
    assert _provenance(tmp_path / "o.db")[2] == {other.to_json()}


def test_run_takes_a_memory_not_a_spec(evaluator: NumpyEvaluator, tmp_path: Path) -> None:
    spec = bf.FaultSpec(format=bf.IntQuant(8), ber=1e-3)
    with pytest.raises(TypeError, match=r"memory must be a bitfault.Memory .*spec\.memory\), "
                                        "got FaultSpec") as info:
        run(evaluator, TRIALS, spec, tmp_path / "c.db")
    assert isinstance(info.value, bf.ArgumentTypeError) and info.value.argument == "memory"
    assert not (tmp_path / "c.db").exists()


def test_a_store_of_an_older_layout_is_refused(evaluator: NumpyEvaluator, tmp_path: Path) -> None:
    """A trials table with a ``spec`` column (bitfault before Memory) is not appended to."""
    memory = bf.Memory(bf.IntQuant(8), bf.BitFlip())
    store = tmp_path / "old.db"
    run(evaluator, TRIALS, memory, store)
    with sqlite3.connect(store) as db:
        db.execute("ALTER TABLE trials RENAME COLUMN memory TO spec")
    for append in (False, True):
        with pytest.raises(StoreError, match=r"other columns \(missing \['memory'\], unknown "
                                             r"\['spec'\]\).*another version of bitfault"):
            CampaignStore(store, "x", append=append)
