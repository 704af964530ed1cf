"""``bitfault.torch.evaluate.rank_one``: a change in one channel carried through linear layers.

Reference: the same graph run on whole rows with the changed channel written in; the
carried form ``clean + u * delta`` must equal it to rounding at every node it reaches,
and the operations that do not keep the form (or read two changed values) are refused.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from bitfault.torch.evaluate.graph import TracedGraph, run_nodes  # noqa: E402
from bitfault.torch.evaluate.rank_one import carry, channel_map, materialize  # noqa: E402


def _bn(c: int, seed: int) -> nn.BatchNorm2d:
    b = nn.BatchNorm2d(c)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        b.running_mean.copy_(torch.randn(c, generator=g))
        b.running_var.copy_(torch.rand(c, generator=g) + 0.5)
        b.weight.copy_(torch.randn(c, generator=g))
        b.bias.copy_(torch.randn(c, generator=g))
    return b.eval()


class Linearish(nn.Module):
    """relu6 -> 1x1 conv -> BN -> + skip -> 1x1 conv -> BN -> skip - it -> relu."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(6, 10, 1)
        self.bn_a = _bn(10, 1)
        self.b = nn.Conv2d(10, 4, 1, bias=False)
        self.bn_b = _bn(4, 2)
        self.skip = nn.Conv2d(6, 10, 3, padding=1)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu6(x)
        s = self.skip(x)
        y = self.bn_a(self.a(h)) + s
        z = s[:, :4] - self.bn_b(self.b(y))
        return self.head(F.relu(z).mean((2, 3)))


def _env(model: nn.Module, x: torch.Tensor) -> tuple[TracedGraph, dict]:
    g = TracedGraph.trace(model)
    env: dict = {}
    with torch.no_grad():
        run_nodes(model, g.nodes, env, {}, x)
    return g, env


def _node(g: TracedGraph, name: str):
    return next(n for n in g.nodes if n.name == name)


def test_carried_change_equals_whole_rows_to_rounding() -> None:
    torch.manual_seed(0)
    model = Linearish().eval()
    x = torch.randn(5, 6, 4, 4)
    g, clean = _env(model, x)
    h, first = _node(g, "relu6"), _node(g, "a")
    weight = channel_map(model, first, h, clean, {})
    assert weight is not None and weight.shape == (10, 6)
    rows, cols = torch.tensor([0, 2, 2, 4]), torch.tensor([1, 1, 5, 0])
    delta = torch.randn(len(rows), 4, 4, generator=torch.Generator().manual_seed(3))
    # the reference: whole rows with the changed channel, from h on
    changed = clean[h][rows].clone()
    changed[torch.arange(len(rows)), cols] += delta
    want: dict = {h: changed, _node(g, "x"): x[rows]}
    with torch.no_grad():
        run_nodes(model, g.nodes[g.position[h] + 1:], want, {}, None)
    dirty = g.dependents([h])
    low = {first: weight[:, cols].T}
    reached = [first]
    for name in ("bn_a", "add", "b", "bn_b", "sub"):
        node = _node(g, name)
        u = carry(model, node, low, dirty, clean, {})
        assert u is not None, name
        low[node] = u
        reached.append(node)
    with torch.no_grad():
        for node in reached:
            mine = materialize(clean[node][rows], low[node], delta)
            assert torch.allclose(mine, want[node], rtol=1e-5, atol=1e-5), node.name
            assert not torch.allclose(mine, clean[node][rows], rtol=1e-3, atol=1e-3)
    # relu is not linear: the form ends there
    assert carry(model, _node(g, "relu"), low, dirty, clean, {}) is None


def test_refused_operations() -> None:
    torch.manual_seed(0)
    model = Linearish().eval()
    g, clean = _env(model, torch.randn(2, 6, 4, 4))
    h = _node(g, "relu6")
    # a 3x3 conv, a conv on another input than the one changed: no channel map
    assert channel_map(model, _node(g, "skip"), _node(g, "x"), clean, {}) is None
    assert channel_map(model, _node(g, "a"), _node(g, "x"), clean, {}) is None
    low = {_node(g, "a"): torch.ones(1, 10)}
    dirty = g.dependents([h]) | {_node(g, "skip")}
    # add whose other side the fault reaches (skip marked dirty here)
    low[_node(g, "bn_a")] = torch.ones(1, 10)
    assert carry(model, _node(g, "add"), low, dirty, clean, {}) is None
    # BatchNorm in training mode
    model.bn_a.train()
    assert carry(model, _node(g, "bn_a"), {_node(g, "a"): torch.ones(1, 10)}, dirty, clean,
                 {}) is None
    for mod in (nn.Conv2d(6, 10, 1, stride=2), nn.Conv2d(6, 10, 1, padding=1),
                nn.Conv2d(6, 10, 1, groups=2), nn.Conv2d(6, 10, 1, padding_mode="reflect")):
        other = Linearish().eval()
        other.a = mod
        g2 = TracedGraph.trace(other)  # (not run: these shapes do not fit the add)
        h2 = _node(g2, "relu6")
        assert channel_map(other, _node(g2, "a"), h2, {h2: clean[h]}, {}) is None, mod
