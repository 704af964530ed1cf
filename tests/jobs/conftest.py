"""A tiny trained PyTorch run shared by the job tests (trained once per session)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

# tiny_config beside these tests under any --import-mode
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

from tiny_config import TINY


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
