"""Run a small campaign, SIGKILL-ing this process while it scores trial K (1-based).

Used by test_runner.py: ``python resume_worker.py PARAMS_NPZ STORE K`` (K < 0: never); the
model's parameters come from PARAMS_NPZ so every run evaluates the same model.
"""

from __future__ import annotations

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np

import bitfault as bf
from bitfault.campaign import NumpyEvaluator, accuracy_metrics, rate_sweep, run
from bitfault.data import split_embedded_mnist
from conftest import forward

MEMORY = bf.Memory(bf.IntQuant(8), bf.BitFlip())
TRIALS = rate_sweep([1e-3, 1e-2, 5e-2], chips=4)


def main() -> None:
    params_path, store, kill_during = sys.argv[1], sys.argv[2], int(sys.argv[3])
    calls = 0

    def metric(labels: np.ndarray, clean: np.ndarray, faulty: np.ndarray) -> dict[str, float]:
        nonlocal calls
        calls += 1
        if calls == kill_during + 1:  # +1: the first call scores the golden run
            os.kill(os.getpid(), signal.SIGKILL)
        return accuracy_metrics(labels, clean, faulty)

    metric.__name__ = "accuracy_metrics"
    _, (x, y) = split_embedded_mnist()
    with np.load(params_path) as data:
        params = {k: data[k] for k in data.files}
    evaluator = NumpyEvaluator(forward, params, x[:300], y[:300])
    run(evaluator, TRIALS, MEMORY, store, metric=metric, batch=3)


if __name__ == "__main__":
    main()
