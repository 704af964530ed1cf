"""examples/seed_own_loop.py: the seed program with the user's own loop keeps every clean
weight in range in Keras and PyTorch; without the projection Keras's kernels leave it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "seed_own_loop.py"


@pytest.fixture(scope="module")
def own_loop():
    spec = importlib.util.spec_from_file_location("seed_own_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_both_frameworks_keep_the_clean_weights_in_range(own_loop, capsys) -> None:
    # lr 2 and ber 2e-2: the first steps push kernels far past [-8, 8) without the projection
    args = ["--seeds", "0", "--epochs", "1", "--hidden", "32", "--lr", "2", "--ber", "2e-2"]
    results = own_loop(args)
    assert all(inside for rows in results.values() for _, _, inside in rows)
    assert set(results) == {"keras", "torch"}
    off = own_loop([*args, "--frameworks", "keras", "--no-projection"])
    assert not off["keras"][0][2] and off["keras"][0][1] > 8
    assert "median accuracy" in capsys.readouterr().out
