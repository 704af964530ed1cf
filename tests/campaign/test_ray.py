"""The Ray executor on a local 2-worker cluster: same results as local, survives a dead worker."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import bitfault as bf
from bitfault.campaign import NumpyEvaluator, rate_sweep, run

ray = pytest.importorskip("ray")
# Workers cannot import this test module: ship its functions and classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

MEMORY = bf.Memory(bf.IntQuant(8), bf.BitFlip())
TRIALS = rate_sweep([1e-3, 1e-2, 5e-2], chips=4)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def local_forward(params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    h = np.maximum(x @ params["fc1.weight"].T + params["fc1.bias"], 0.0)
    return h @ params["fc2.weight"].T + params["fc2.bias"]


class DiesOnce(NumpyEvaluator):
    """Kills its worker process the first time it sees the marker chunk."""

    marker: str = ""

    def predict(self, batch_of_maps, memory):
        if self.marker and batch_of_maps and not os.path.exists(self.marker) \
                and os.getpid() != self.driver_pid:
            Path(self.marker).write_text("died once")
            os._exit(1)
        return super().predict(batch_of_maps, memory)


def _evaluator(mlp_params: dict[str, np.ndarray], cls: type = NumpyEvaluator) -> NumpyEvaluator:
    from bitfault.data import split_embedded_mnist

    _, (x, y) = split_embedded_mnist()
    return cls(local_forward, mlp_params, x[:300], y[:300])


def _metrics(result: bf.campaign.CampaignResult) -> dict[str, dict]:
    return {r.trial_key: (r.map_digest, r.metrics) for r in result.records}


def test_ray_matches_local_and_survives_a_dead_worker(
        cluster: None, mlp_params: dict[str, np.ndarray], tmp_path: Path) -> None:
    local = run(_evaluator(mlp_params), TRIALS, MEMORY, tmp_path / "local.db", batch=3)
    on_ray = run(_evaluator(mlp_params), TRIALS, MEMORY, tmp_path / "ray.db", batch=3,
                 executor="ray")
    assert on_ray.ran == len(TRIALS)
    assert _metrics(on_ray) == _metrics(local)

    dying = _evaluator(mlp_params, DiesOnce)
    dying.marker = str(tmp_path / "died")
    dying.driver_pid = os.getpid()
    survived = run(dying, TRIALS, MEMORY, tmp_path / "dying.db", batch=3, executor="ray")
    assert os.path.exists(tmp_path / "died")  # a worker really died mid-task
    assert _metrics(survived) == _metrics(local)


def test_ray_campaign_stops_early_and_cancels_the_rest(
        cluster: None, mlp_params: dict[str, np.ndarray], tmp_path: Path) -> None:
    from bitfault.campaign import StopWhenPrecise, sampled_single_faults

    ev = _evaluator(mlp_params)
    trials = sampled_single_faults(ev.tensor_shapes(), MEMORY.format, size=400, seed=2)
    stop = StopWhenPrecise(margin=0.1, min_trials=40)
    result = run(ev, trials, MEMORY, tmp_path / "stop.db", batch=8, executor="ray", stop=stop)
    assert result.stopping["reached"] and result.ran < len(trials)
    assert len(result.records) == result.ran  # nothing after the stop reached the store
    lo, hi = result.stopping["interval"]
    assert (hi - lo) / 2 <= 0.1


def test_framework_evaluators_on_ray_match_local(cluster: None, tmp_path: Path) -> None:
    """The PyTorch and Keras evaluators travel to the workers (their caches rebuilt there):
    the same records as the local executor, for a compiled format, a patched one and a
    layer sweep (the fast paths)."""
    from bitfault.campaign import layer_sweep
    from bitfault.data import split_embedded_mnist

    _, (x, y) = split_embedded_mnist()
    x, y = x[:200], y[:200]
    memories = [bf.Memory(bf.FixedPoint(32, 28), bf.BitFlip()),
                bf.Memory(bf.Float("float32"), bf.BitFlip())]
    evaluators = {}
    torch = pytest.importorskip("torch")
    from bitfault.models.torch import seed_mlp
    from bitfault.torch import TorchEvaluator

    torch.manual_seed(0)
    evaluators["torch"] = lambda: TorchEvaluator(seed_mlp(hidden=16), x, y)
    try:
        from bitfault.keras import KerasEvaluator
        from bitfault.models.keras import seed_mlp as keras_mlp
    except ImportError:  # pragma: no cover - TensorFlow is installed with the test extra
        pass
    else:
        model = keras_mlp(hidden=16, seed=0)
        evaluators["keras"] = lambda: KerasEvaluator(model, x, y)
    trials = rate_sweep([1e-3, 1e-2], chips=3) + layer_sweep([1e-2], 2, ["fc2.weight"])
    for name, make in evaluators.items():
        for k, memory in enumerate(memories):
            local = run(make(), trials, memory, tmp_path / f"{name}{k}-local.db", batch=2)
            remote = run(make(), trials, memory, tmp_path / f"{name}{k}-ray.db", batch=2,
                         executor="ray")
            assert remote.ran == len(trials)
            assert _metrics(remote) == _metrics(local), (name, memory)
