"""The single-fault shortcut on graphs whose shapes follow the batch size, its fallback to
the exact path when one of its assumptions fails at run time, and ``TorchEvaluator.plan``.

What is compared: ``TorchEvaluator.predict`` with the fast paths against the same
evaluator with ``fast_paths=False`` (the model's own forward per trial), prediction for
prediction; the plan (and its counter of faults the shortcut evaluated) shows which path
ran, so that a test cannot pass by always falling back.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.campaign import run, single_faults, trial_maps  # noqa: E402
from bitfault.torch import TorchEvaluator  # noqa: E402

F32 = bf.Memory(bf.Float("float32"), bf.BitFlip())


class Net(nn.Module):
    """The batch size read from the input, then ``view(bs, -1)``: a widely used head."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        bs = inputs.size(0)
        x = self.pool(torch.relu(self.c2(torch.relu(self.c1(inputs)))))
        return self.fc(x.view(bs, -1))


class ShapeNet(Net):
    """``x.shape[0]``, ``reshape``, a clean token ``expand``-ed to the batch, a ``view`` of
    the output with the batch size."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Parameter(torch.randn(1, 6))
        self.fc = nn.Linear(22, 10)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        n = inputs.shape[0]
        h = self.pool(F.relu(self.c2(F.relu(self.c1(inputs))))).reshape(n, -1)
        h = torch.cat([h, self.tok.expand(n, -1)], 1)
        return self.fc(h).view(n, 1, -1).flatten(1)


class Squeezed(Net):
    """``squeeze()`` drops every dim of size 1: right on whole batches, wrong on a stack of
    one row (the batch dim goes too)."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(F.relu(self.c2(F.relu(self.c1(inputs))))).squeeze())


class Centred(Net):
    """Each example's features minus the batch's mean: rows that mix examples."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.c1(inputs))
        h = h - h.mean(0, keepdim=True)
        return self.fc(self.pool(F.relu(self.c2(h))).flatten(1))


def _model(cls: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return cls().eval()


def _data(n: int = 21) -> tuple[torch.Tensor, np.ndarray]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, 6, 6, generator=g), np.arange(n) % 10


def _faults(ev: TorchEvaluator, per_tensor: int = 12) -> list[tuple[str, int, int]]:
    """Sampled faults in every weight, half in the high exponent bits (they change
    predictions), and the issue's two."""
    rng = np.random.default_rng(0)
    out = [("c1.weight", 5, 30), ("c1.weight", 7, 2)]
    for name, shape in ev.tensor_shapes().items():
        size = int(np.prod(shape))
        bits = np.concatenate([rng.integers(26, 31, per_tensor // 2),
                               rng.integers(0, 32, per_tensor - per_tensor // 2)])
        out += [(name, int(e), int(b)) for e, b in zip(rng.integers(0, size, per_tensor),
                                                        bits, strict=True)]
    return out


def _predict(ev: TorchEvaluator, faults: list[tuple[str, int, int]]) -> list[np.ndarray]:
    shapes = ev.tensor_shapes()
    return ev.predict([trial_maps(t, F32, shapes) for t in single_faults(faults)], F32)


@pytest.mark.parametrize("cls", [Net, ShapeNet])
def test_batch_size_read_from_the_input_takes_the_shortcut(cls) -> None:
    """21 examples in batches of 8 (the last has 5): every fault's predictions equal the
    exact path's, the shortcut evaluated every one of them, nothing fell back."""
    x, y = _data()
    fast = TorchEvaluator(_model(cls), x, y, batch_size=8)
    exact = TorchEvaluator(_model(cls), x, y, batch_size=8, fast_paths=False)
    faults = _faults(fast)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning either
        got = _predict(fast, faults)
    want = _predict(exact, faults)
    wrong = [f for f, a, b in zip(faults, got, want, strict=True) if not np.array_equal(a, b)]
    assert not wrong, f"{len(wrong)} of {len(faults)} faults differ, e.g. {wrong[:3]}"
    golden = fast.golden(F32)
    assert any(not np.array_equal(p, golden) for p in want)  # the faults change something
    plan = {e.tensor: e for e in fast.plan()}
    for name in fast.names:
        n = sum(f[0] == name for f in faults)
        if name == "tok":  # not a Linear/Conv weight: the layer path (through the expand)
            assert plan[name].path == "layer" and plan[name].shortcut_faults == 0
            continue
        assert plan[name].path == "shortcut", plan[name]
        assert plan[name].shortcut_faults == n, plan[name]
        assert plan[name].fallback is None
    assert fast.fallbacks == {}


def test_the_issue_campaign_runs(tmp_path) -> None:
    """``run`` with default settings on the reproducer: no error, the exact path's results."""
    x, y = _data()
    trials = single_faults([("c1.weight", 5, 30), ("c1.weight", 7, 2)])
    fast = run(TorchEvaluator(_model(Net), x, y, batch_size=8), trials, F32, tmp_path / "a.db")
    exact = run(TorchEvaluator(_model(Net), x, y, batch_size=8, fast_paths=False), trials,
                F32, tmp_path / "b.db")
    assert [r.metrics for r in fast.records] == [r.metrics for r in exact.records]


def test_a_failing_shortcut_falls_back_once_with_a_warning() -> None:
    """``squeeze()`` breaks the shortcut's stacks of one row (``max_bytes=0``): the trial
    takes the exact layer path, a warning names the tensor and the error once, the plan
    records it, and the predictions equal the exact path's."""
    x, y = _data(10)
    fast = TorchEvaluator(_model(Squeezed), x, y, batch_size=4, max_bytes=0)
    exact = TorchEvaluator(_model(Squeezed), x, y, batch_size=4, fast_paths=False)
    faults = _faults(fast, per_tensor=6)
    with pytest.warns(RuntimeWarning, match="single-fault shortcut failed on tensor") as rec:
        got = _predict(fast, faults)
    named = [str(w.message) for w in rec if "shortcut failed" in str(w.message)]
    assert len(named) == len(set(named)) and named
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: not again on the next call
        again = _predict(fast, faults)
    want = _predict(exact, faults)
    for g, a, w in zip(got, again, want, strict=True):
        assert np.array_equal(g, w) and np.array_equal(a, w)
    assert any(not np.array_equal(w, fast.golden(F32)) for w in want)
    assert fast.fallbacks and set(fast.fallbacks) <= set(fast.names)
    plan = {e.tensor: e for e in fast.plan()}
    for name, error in fast.fallbacks.items():
        assert any(name in m and error in m for m in named)
        assert plan[name].path == "layer" and plan[name].fallback == error
        assert "failed at run time" in plan[name].reason


def test_plan_says_which_path_and_why() -> None:
    """Weights of convolutions and Linear layers: the shortcut; biases: the layer path;
    a weight before a node that mixes examples: the layer path, naming that node (and the
    predictions equal the exact path's); ``fast_paths=False``: the whole model."""
    x, y = _data(9)
    ev = TorchEvaluator(_model(Centred), x, y, targets="weights+biases", batch_size=4)
    plan = ev.plan(F32)
    assert [e.tensor for e in plan] == ev.names
    by = {e.tensor: e for e in plan}
    assert by["c1.weight"].path == "layer" and "mixes examples" in by["c1.weight"].reason
    assert "'sub'" in by["c1.weight"].reason or "'mean'" in by["c1.weight"].reason
    assert by["c2.weight"].path == "shortcut" and by["fc.weight"].path == "shortcut"
    assert by["c1.bias"].path == "layer" and "bias" in by["c1.bias"].reason
    assert all(e.several == "layer" for e in plan)
    rows = plan.to_dicts()
    assert rows[0] == {"tensor": "c1.weight", "path": "layer", "reason": by["c1.weight"].reason,
                       "several": "layer", "shortcut_faults": 0, "fallback": None}
    frame = plan.to_frame()
    assert list(frame.columns) == ["tensor", "path", "reason", "several", "shortcut_faults",
                                   "fallback"] and len(frame) == len(ev.names)
    assert str(plan).splitlines()[0].split()[:2] == ["tensor", "path"]
    with pytest.raises(AttributeError):
        plan[0].path = "model"  # frozen records
    faults = [f for f in _faults(ev, per_tensor=6) if f[0].endswith("weight")]
    exact = TorchEvaluator(_model(Centred), x, y, targets="weights+biases", batch_size=4,
                           fast_paths=False)
    for a, b in zip(_predict(ev, faults), _predict(exact, faults), strict=True):
        assert np.array_equal(a, b)
    assert {e.tensor: e.path for e in exact.plan()} == dict.fromkeys(ev.names, "model")


def test_a_failing_layer_path_runs_the_whole_model(tmp_path) -> None:
    """Trials with several faults in one tensor whose layer path raises: the whole model
    runs them (the exact results), one warning names the tensor, the plan says "model"."""
    from bitfault.campaign import layer_sweep

    x, y = _data(9)
    fast = TorchEvaluator(_model(Net), x, y, batch_size=4)
    exact = TorchEvaluator(_model(Net), x, y, batch_size=4, fast_paths=False)

    def broken(*args: object) -> None:
        raise RuntimeError("a traced graph that does not run")

    fast._predict_layer = broken
    trials = layer_sweep([3e-3], chips=4, targets=["c2.weight"])
    with pytest.warns(RuntimeWarning, match="layer path failed on tensor 'c2.weight'") as rec:
        got = run(fast, trials, F32, tmp_path / "a.db")
    assert sum("layer path failed" in str(w.message) for w in rec) == 1
    want = run(exact, trials, F32, tmp_path / "b.db")
    assert [r.metrics for r in got.records] == [r.metrics for r in want.records]
    assert "a traced graph that does not run" in fast.fallbacks["c2.weight"]
    entry = {e.tensor: e for e in fast.plan()}["c2.weight"]
    assert entry.several == "model" and entry.fallback == fast.fallbacks["c2.weight"]


def test_the_planner_chooses_each_trials_path() -> None:
    """``trial_path``: one fault in one code -> the shortcut; several faults in one tensor
    -> its layer path; faults in two tensors, or ``fast_paths=False`` -> the whole model."""
    from bitfault.torch.evaluate.planner import LAYER, MODEL, SHORTCUT

    x, y = _data(9)
    ev = TorchEvaluator(_model(Net), x, y, batch_size=4)
    shape = ev.tensor_shapes()["c1.weight"]

    def fmap(name: str, elements: list[int]) -> bf.FaultMap:
        mask = np.zeros(ev.tensor_shapes()[name], np.uint32)
        mask.reshape(-1)[elements] = 1 << 30
        return bf.FaultMap.from_mask(mask, name=name)

    one = {"c1.weight": fmap("c1.weight", [3])}
    two = {"c1.weight": fmap("c1.weight", [3, 4])}
    both = {**one, "fc.weight": fmap("fc.weight", [0])}
    codes = {n: ["codes"] for n in both}
    assert ev.trial_path(one, codes) == SHORTCUT and int(np.prod(shape)) > 4
    assert ev.trial_path(two, codes) == LAYER
    assert ev.trial_path(both, codes) == MODEL
    exact = TorchEvaluator(_model(Net), x, y, batch_size=4, fast_paths=False)
    assert exact.trial_path(one, codes) == MODEL
