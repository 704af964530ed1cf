"""Single faults in several tensors, one pass over the data, under a small ``max_bytes``.

What is compared: ``TorchEvaluator.predict`` on single float32 bit flips in every weight
of a small CNN (conv-BN-ReLU6, depthwise, 1x1, a linear head; two faults on one element
too, so a tensor has several groups) against a plain loop written here (flip the bit of
the weight's uint32 view in NumPy, copy it into a copy of the model, one forward), for
``max_bytes`` 0 (one example per chunk), a budget that fits the values from the head on
but not every value, and 1 GiB. Also what the pass does: each chunk's clean values are
computed once for all tensors' faults (``TracedGraph.run`` calls counted), and a chunk
keeps only the values from the earliest faulted node on and what later nodes read, so
faults in the head alone need fewer, larger chunks, each within ``max_bytes``.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.campaign import single_faults, trial_maps  # noqa: E402
from bitfault.torch import TorchEvaluator  # noqa: E402
from bitfault.torch.evaluate.budget import held_bytes  # noqa: E402
from bitfault.torch.evaluate.graph import TracedGraph  # noqa: E402

F32 = bf.Memory(bf.Float("float32"), bf.BitFlip())
GIB = 1 << 30


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem, self.bn0 = nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.pw = nn.Conv2d(8, 4, 1)
        self.fc = nn.Linear(4 * 16, 5)
        with torch.no_grad():
            self.bn0.running_mean.uniform_(-0.2, 0.2)
            self.bn0.running_var.uniform_(0.5, 1.5)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self.bn0(self.stem(x)))
        y = F.relu(self.pw(F.relu6(self.dw(y))))
        return self.fc(F.max_pool2d(y, 2).flatten(1))


def _data(n: int = 12) -> tuple[np.ndarray, np.ndarray]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 8, 8, generator=g).numpy(), np.arange(n) % 5


def _faults(model: nn.Module, per_tensor: int = 12) -> list[tuple[str, int, int]]:
    """Random (weight, element, bit) faults in every weight, half in the top 3 bits, and
    a second fault on the first element of each tensor (a second group)."""
    rng = np.random.default_rng(4)
    out = []
    for name, p in model.named_parameters():
        if name.endswith(".weight") and not name.startswith("bn"):
            size = p.numel()
            elems = rng.integers(0, size, per_tensor)
            bits = np.concatenate([rng.integers(29, 32, per_tensor // 2),
                                   rng.integers(0, 32, per_tensor - per_tensor // 2)])
            out += [(name, int(e), int(b)) for e, b in zip(elems, bits, strict=True)]
            out.append((name, int(elems[0]), int((bits[0] + 1) % 32)))
    return out


def plain_loop(model: nn.Module, x: np.ndarray, fault: tuple[str, int, int]) -> np.ndarray:
    """Flip the bit in a copy of the weight (NumPy uint32 view), one forward."""
    name, element, bit = fault
    faulty = copy.deepcopy(model)
    w = dict(faulty.named_parameters())[name]
    arr = w.detach().numpy().copy()
    flat = arr.reshape(-1).view(np.uint32)
    flat[element] ^= np.uint32(1 << bit)
    with torch.no_grad():
        w.copy_(torch.from_numpy(arr))
        logits = faulty(torch.from_numpy(x)).double()
    return torch.where(torch.isnan(logits), -torch.inf, logits).argmax(1).numpy()


def _maps(ev: TorchEvaluator, faults: list[tuple[str, int, int]]) -> list:
    return [trial_maps(t, F32, ev.tensor_shapes()) for t in single_faults(faults)]


def _count_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    run = TracedGraph.run

    def counted(self, model, env, x, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(x))
        return run(self, model, env, x, *args, **kwargs)

    monkeypatch.setattr(TracedGraph, "run", counted)
    return calls


def _head_budget(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[int, int, int]:
    """(the fc node's position, bytes per example of every value, of the values from fc)."""
    ev = TorchEvaluator(model, x, y, max_bytes=0)
    ev.predict([{}], F32)
    g = ev.graph()
    start = g.position[g.seeds("fc.weight")[0]]
    return start, ev._example_bytes(F32, 0), ev._example_bytes(F32, start)


def test_singles_in_every_tensor_equal_a_plain_loop_for_any_max_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = SmallCNN()
    x, y = _data()
    faults = _faults(model)
    want = [plain_loop(model, x, f) for f in faults]
    golden = TorchEvaluator(model, x, y).golden(F32)
    assert sum(not np.array_equal(w, golden) for w in want) >= 3  # faults change predictions
    _, _, head = _head_budget(model, x, y)
    calls = _count_runs(monkeypatch)
    for max_bytes in (0, head * len(x), GIB):
        ev = TorchEvaluator(model, x, y, max_bytes=max_bytes)
        ev.predict([{}], F32)  # golden and clean runs
        g = ev.graph()
        per = ev._example_bytes(F32, g.position[g.seeds("stem.weight")[0]])  # measured once
        calls.clear()
        got = ev.predict(_maps(ev, faults), F32)
        wrong = [f for f, g, w in zip(faults, got, want, strict=True) if not np.array_equal(g, w)]
        assert not wrong, (max_bytes, wrong[:3])
        # one pass over the data for the 4 tensors' 8 groups (none took the layer path)
        envs = ev._envs[ev._key(F32)]
        if all(e is not None and e.complete for e in envs):
            assert max_bytes == GIB and calls == []
        else:
            size = max(1, max_bytes // per)
            assert max_bytes < GIB and calls == [min(size, len(x) - a)
                                                 for a in range(0, len(x), size)], calls


def test_chunks_keep_only_the_values_from_the_first_faulted_node(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = SmallCNN()
    x, y = _data()
    start, full, head = _head_budget(model, x, y)
    assert head < full // 4, (head, full)  # the head's values are a small share
    max_bytes = head * len(x)  # all examples' values from fc on, not every value of two
    assert max_bytes < 2 * full
    ev = TorchEvaluator(model, x, y, max_bytes=max_bytes)
    ev.predict([{}], F32)
    g = ev.graph()
    for first, per in ((0, full), (start, head)):
        chunks = list(ev._env_chunks(F32, first))
        size = max(1, max_bytes // per)  # every value of one example: over max_bytes
        assert [c for c, _ in chunks] == [slice(a, min(a + size, len(x)))
                                          for a in range(0, len(x), size)]
        for _, env in chunks:
            assert held_bytes(env.values(), ev._excluded()) <= max(max_bytes, per)
            kept = {g.position[n] for n in env}
            later = {g.position[i] for n in g.nodes[first:] for i in n.all_input_nodes}
            assert all(p >= first or p in later for p in kept)
            assert g.output in env
    assert len(list(ev._env_chunks(F32, start))) == 1 < len(list(ev._env_chunks(F32, 0)))
    # faults in the head alone: one chunk of every example; results as the plain loop
    faults = [f for f in _faults(model) if f[0] == "fc.weight"]
    calls = _count_runs(monkeypatch)
    got = ev.predict(_maps(ev, faults), F32)
    assert calls == [len(x)]
    for f, p in zip(faults, got, strict=True):
        assert np.array_equal(p, plain_loop(model, x, f)), f
