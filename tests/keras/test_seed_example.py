"""examples/seed_mnist_tf.py: the fix trains W; --stop-gradient freezes W while biases move."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "seed_mnist_tf.py"


@pytest.fixture(scope="module")
def seed_main():
    spec = importlib.util.spec_from_file_location("seed_mnist_tf", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_straight_through_fix_trains_the_weights(seed_main, capsys) -> None:
    seed_main(["--epochs", "2", "--hidden", "32", "--ber", "1e-3"])
    out = capsys.readouterr().out
    assert "W trained (max |dW| = " in out
    assert "seed transform == bitfault.inject, bit for bit: True" in out
    final_accuracy = float(out.split("epoch 2:")[1].split("test accuracy")[1].split()[0])
    assert final_accuracy > 0.5


def test_stop_gradient_flag_reproduces_the_frozen_weights(seed_main, capsys) -> None:
    seed_main(["--epochs", "1", "--hidden", "32", "--stop-gradient"])
    out = capsys.readouterr().out
    assert "W stayed frozen (max |dW| = 0.0) while the biases moved" in out
    moved = float(out.split("max |db| = ")[1].split(")")[0])
    assert moved > 0
