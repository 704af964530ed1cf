"""Campaign stores record the memory (the recipe's format + campaign.fault); a store of the
layout before Memory (a ``spec`` column) is another campaign's, refused, then moved aside."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("mlxtend")

import bitfault as bf
from bitfault.jobs import run_campaign


def _memories(store: Path) -> set[str]:
    with sqlite3.connect(store) as db:
        return {r[0] for r in db.execute("SELECT DISTINCT memory FROM trials")}


def test_stores_record_the_memory_and_refuse_the_old_layout(tiny_run: Path) -> None:
    run_campaign(tiny_run)
    store = tiny_run / "campaign" / "int8.sqlite"
    assert _memories(store) == {bf.Memory(bf.IntQuant(8), bf.BitFlip()).to_json()}
    with sqlite3.connect(store) as db:  # as bitfault wrote it before Memory: a spec column
        db.execute("ALTER TABLE trials RENAME COLUMN memory TO spec")
        db.execute("UPDATE trials SET spec = ?", (json.dumps(bf.FaultSpec(
            format=bf.IntQuant(4), ber=0.0, seed=5).to_dict(), sort_keys=True),))
    before = store.read_bytes()
    with pytest.raises(ValueError, match=r"int8.sqlite: holds trials of another campaign \(it "
                                         r"differs in the store's layout \(written by another "
                                         r"version of bitfault\), the memory's format \(the "
                                         r"recipe's format\)\).*--replace-store"):
        run_campaign(tiny_run)
    assert store.read_bytes() == before
    summary = run_campaign(tiny_run, replace_stores=True)
    assert summary["models"]["int8"]["complete"] and summary["models"]["int8"]["skipped"] == 0
    assert _memories(store) == {bf.Memory(bf.IntQuant(8), bf.BitFlip()).to_json()}
