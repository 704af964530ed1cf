"""A tiny trained PyTorch run shared by the job tests (trained once per session)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

TINY: dict[str, Any] = {
    "framework": "torch",
    "seed": 0,
    "title": "tiny",
    "data": {"source": "embedded", "train_limit": 600, "test_limit": 200},
    "model": {"name": "seed_mlp", "kwargs": {"hidden": 16}},
    "train": {"epochs": 3, "batch_size": 25, "lr": 0.05},
    "recipes": [{"name": "int8", "format": {"kind": "int_quant", "bits": 8}},
                {"name": "clip", "format": {"kind": "int_quant", "bits": 8},
                 "weight_clip": 0.1}],
    "campaign": {"bers": [1e-3, 1e-2], "chips": 2, "seed": 5, "layers": True,
                 "sensitivity_bers": [1e-2]},
}


@pytest.fixture(scope="session")
def tiny_trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with TINY's two models trained (do not modify: copy it)."""
    pytest.importorskip("torch")
    pytest.importorskip("mlxtend")
    from bitfault.jobs import train

    out = tmp_path_factory.mktemp("tiny") / "run"
    train({**TINY, "output": str(out)})
    return out


@pytest.fixture
def tiny_run(tiny_trained: Path, tmp_path: Path) -> Path:
    """A private copy of the trained tiny run."""
    dest = tmp_path / "run"
    shutil.copytree(tiny_trained, dest)
    return dest
