"""The command line as installed: --version, map, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import bitfault as bf


def bitfault_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bitfault.cli", *args], capture_output=True,
                          text=True)


def test_version() -> None:
    out = bitfault_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"bitfault {bf.__version__}"


def test_map_writes_the_map_the_library_draws(tmp_path: Path) -> None:
    path = tmp_path / "fc1.npz"
    out = bitfault_cli("map", str(path), "--shape", "64,32", "--name", "fc1.weight",
                       "--ber", "0.01", "--seed", "3", "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    expected = bf.FaultMap.random((64, 32), bf.FixedPoint(32, 28, rounding="trunc"), ber=0.01,
                                  seed=3, name="fc1.weight")
    loaded = bf.FaultMap.load(path, shape=(64, 32), name="fc1.weight")
    assert loaded == expected and summary["faults"] == expected.n_faults
    assert np.array_equal(loaded.to_dense(), expected.to_dense())


def test_bad_input_exits_2_with_one_line(tmp_path: Path) -> None:
    out = bitfault_cli("map", str(tmp_path / "x.npz"), "--shape", "4,4", "--name", "w",
                       "--ber", "1.5")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["bitfault: error: ber must be in [0, 1], got 1.5"]
    assert not (tmp_path / "x.npz").exists()
