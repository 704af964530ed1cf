"""``append=True`` adds trials of the same campaign only: another memory, model or data is
refused with the difference named; stores written before still resume."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

import bitfault as bf
from bitfault.campaign import NumpyEvaluator, StoreError, rate_sweep, run

INT8 = bf.Memory(bf.IntQuant(8), bf.BitFlip())


def snapshot(store: Path) -> list[tuple]:
    with sqlite3.connect(store) as db:
        return db.execute("SELECT trial_key, memory, metrics FROM trials ORDER BY 1").fetchall()


def test_append_refuses_a_store_of_another_memory(evaluator: NumpyEvaluator,
                                                  tmp_path: Path) -> None:
    store = tmp_path / "c.db"
    run(evaluator, rate_sweep([1e-2], 2), INT8, store)
    before = snapshot(store)
    other = bf.Memory(bf.FixedPoint(16, 12), bf.BitFlip())
    with pytest.raises(StoreError, match=r"c.db: written by a different campaign: it holds "
                                         r"trials of another memory \(format, fault model or "
                                         r"storage\); append=True adds trials of the same "
                                         "memory, model and data only"):
        run(evaluator, rate_sweep([1e-2], 2), other, store, append=True)
    assert snapshot(store) == before
    # the same memory and another grid: appended, earlier trials skipped
    more = run(evaluator, rate_sweep([1e-2, 1e-3], 2), INT8, store, append=True)
    assert (more.ran, more.skipped) == (2, 2)


def test_append_refuses_another_model_or_data(evaluator: NumpyEvaluator,
                                              tmp_path: Path) -> None:
    store = tmp_path / "c.db"
    run(evaluator, rate_sweep([1e-2], 1), INT8, store)
    params = {k: v * 2 for k, v in evaluator.params.items()}
    moved = NumpyEvaluator(evaluator.forward, params, evaluator.x, evaluator.labels)
    with pytest.raises(StoreError, match=r"another model \(its weights"):
        run(moved, rate_sweep([1e-2], 2), INT8, store, append=True)
    fewer = NumpyEvaluator(evaluator.forward, evaluator.params, evaluator.x[:50],
                           np.asarray(evaluator.labels)[:50])
    with pytest.raises(StoreError, match=r"another data;"):
        run(fewer, rate_sweep([1e-2], 2), INT8, store, append=True)


def test_a_store_without_a_description_still_resumes_and_is_still_checked(
        evaluator: NumpyEvaluator, tmp_path: Path) -> None:
    store = tmp_path / "old.db"
    run(evaluator, rate_sweep([1e-2], 2), INT8, store)
    with sqlite3.connect(store) as db:  # as an early store: digest and trials only
        db.execute("DELETE FROM campaign WHERE key='description'")
    again = run(evaluator, rate_sweep([1e-2], 2), INT8, store)
    assert (again.ran, again.skipped) == (0, 2)
    assert run(evaluator, rate_sweep([1e-2], 3), INT8, store, append=True).ran == 1
    with pytest.raises(StoreError, match="another memory"):  # read from the trials' columns
        run(evaluator, rate_sweep([1e-2], 3), bf.Memory(bf.IntQuant(4), bf.BitFlip()), store,
            append=True)
