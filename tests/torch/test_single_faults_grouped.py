"""The single-fault shortcut on grouped/depthwise convolutions and same-padding convs.

What is compared: ``TorchEvaluator.predict`` (the shortcut) against a full rerun of the
model with the one faulty weight (``inject_tensor`` + ``functional_call``), prediction
for prediction, on a MobileNetV2-style inverted residual block (1x1 expand, 3x3
depthwise, 1x1 project, residual), a grouped conv, and Conv2d subclasses that pad then
call ``F.conv2d`` (static padding: traced through; padding from the input's size:
untraceable by plain fx, traced as a leaf and proven per batch). Each test also checks
that the shortcut was taken (no fallback to the layer path) or, for forwards it cannot
prove, that it was refused.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.campaign import single_faults, trial_maps  # noqa: E402
from bitfault.torch import TorchEvaluator, inject_tensor  # noqa: E402
from bitfault.torch.evaluate.conv_calls import conv_call  # noqa: E402

FIXED = bf.Memory(bf.FixedPoint(32, 28, rounding="trunc"), bf.BitFlip())
INT8 = bf.Memory(bf.IntQuant(8, per_channel=True), bf.BitFlip())
F32 = bf.Memory(bf.Float("float32"), bf.BitFlip())


class StaticSame(nn.Conv2d):
    """EfficientNet-style same padding fixed at build time (fx traces through it)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        k = self.kernel_size[0]
        self.pad = nn.ZeroPad2d([(k - 1) // 2, k // 2, (k - 1) // 2, k // 2])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(self.pad(x), self.weight, self.bias, self.stride, 0, self.dilation,
                        self.groups)


class DynamicSame(nn.Conv2d):
    """TensorFlow 'SAME' padding computed from the input's size (timm's Conv2dSame)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ih, iw = x.shape[-2:]
        kh, kw = self.weight.shape[-2:]
        (sh, sw), (dh, dw) = self.stride, self.dilation
        ph = max((math.ceil(ih / sh) - 1) * sh + (kh - 1) * dh + 1 - ih, 0)
        pw = max((math.ceil(iw / sw) - 1) * sw + (kw - 1) * dw + 1 - iw, 0)
        x = F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


class Standardized(nn.Conv2d):
    """Weight standardisation: the forward computes another weight (not provable)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight - self.weight.mean(dim=(1, 2, 3), keepdim=True)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Scaled(nn.Conv2d):
    """The convolution's output is changed afterwards (not provable either)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.weight, self.bias) * 2.0


def bn(c: int) -> nn.BatchNorm2d:
    b = nn.BatchNorm2d(c)
    g = torch.Generator().manual_seed(c)
    b.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
    b.running_var.copy_(torch.rand(c, generator=g) + 0.5)
    return b


class InvertedResidual(nn.Module):
    def __init__(self, c: int, expand: int, conv: type = nn.Conv2d) -> None:
        super().__init__()
        h = c * expand
        self.expand = nn.Conv2d(c, h, 1, bias=False)
        self.bn1 = bn(h)
        self.dw = conv(h, h, 3, padding=1 if conv is nn.Conv2d else 0, groups=h, bias=False)
        self.bn2 = bn(h)
        self.project = nn.Conv2d(h, c, 1, bias=False)
        self.bn3 = bn(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self.bn1(self.expand(x)))
        y = F.relu6(self.bn2(self.dw(y)))
        return x + self.bn3(self.project(y))


class MobileNetLike(nn.Module):
    def __init__(self, stem: type = nn.Conv2d, dw: type = nn.Conv2d) -> None:
        super().__init__()
        pad = {"padding": 1} if stem is nn.Conv2d else {}
        self.stem = stem(1, 8, 3, stride=2, **pad)
        self.bn0 = bn(8)
        self.block = InvertedResidual(8, 4, dw)
        self.grouped = nn.Conv2d(8, 16, 3, padding=1, groups=4)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(F.relu6(self.bn0(self.stem(x))))
        y = F.relu(self.grouped(y))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 1, 16, 16, generator=g)
    return x.numpy(), np.arange(48) % 10


def trained(model: nn.Module, data: tuple, steps: int = 40) -> nn.Module:
    """A few full-batch Adam steps, so that predictions differ between examples."""
    torch.manual_seed(0)
    x, y = torch.from_numpy(data[0]), torch.from_numpy(data[1]).long()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval()


def brute_force(ev: TorchEvaluator, memory: bf.Memory, name: str, element: int,
                bit: int) -> np.ndarray:
    """The full rerun: the one faulty weight (inject_tensor) and every stored weight."""
    from torch.func import functional_call

    params = dict(ev.stored(memory))
    shape = ev.tensor_shapes()[name]
    fmap = bf.FaultMap(shape, np.array([element]), np.array([1 << bit], np.uint32), name)
    params[name] = inject_tensor(ev._clean[name], memory.format, memory.fault, fmap)
    with torch.no_grad():
        logits = functional_call(ev.model, params, (ev.x,)).double()
    return torch.where(torch.isnan(logits), -torch.inf, logits).argmax(1).numpy()


def check(model: nn.Module, data: tuple, memory: bf.Memory, names: list[str],
          per_tensor: int = 40, shortcut: bool = True, targets: object = "weights",
          not_run: tuple[str, ...] = (), also: tuple = (), train: bool = True) -> None:
    """Shortcut predictions == brute force for sampled faults in ``names`` (and the faults
    ``also``); the shortcut is (or, with ``shortcut=False``, is not) what computed them;
    ``not_run``: submodules the shortcut must not call (layers it updates instead)."""
    ev = TorchEvaluator(trained(model, data) if train else model, *data, targets=targets)
    calls: list[str] = []
    if not_run:
        # the clean runs (and the probe of how nodes follow the batch) call every module
        ev.golden(memory), ev._clean_env(memory), ev.batch_roles()
    for path in not_run:
        ev.model.get_submodule(path).register_forward_hook(
            lambda *a, path=path: calls.append(path))
    shapes = ev.tensor_shapes()
    rng = np.random.default_rng(3)
    bits = memory.format.bits
    faults = []
    for n in names:
        size = int(np.prod(shapes[n]))
        high = rng.integers(bits - 6, bits, per_tensor // 2)  # the bits that matter
        faults += [(n, int(e), int(b)) for e, b in zip(
            rng.integers(0, size, per_tensor), np.concatenate(
                [high, rng.integers(0, bits, per_tensor - len(high))]), strict=True)]
    faults += list(also)
    layer_calls = []
    predict_layer = ev._predict_layer
    ev._predict_layer = lambda *a: layer_calls.append(a[0]) or predict_layer(*a)
    fast = ev.predict([trial_maps(t, memory, shapes) for t in single_faults(faults)], memory)
    assert not calls, f"ran {sorted(set(calls))}"
    if shortcut:
        assert all(ev._single_ok(n) for n in names)
        assert not layer_calls, f"fell back to the layer path for {sorted(set(layer_calls))}"
    else:
        assert layer_calls or not all(ev._single_ok(n) for n in names)
    golden = ev.golden(memory)
    for n in names:
        mine = [(f, p) for f, p in zip(faults, fast, strict=True) if f[0] == n]
        wrong = [f for f, p in mine if not np.array_equal(p, brute_force(ev, memory, *f))]
        assert not wrong, f"{len(wrong)} of {len(mine)} faults differ, e.g. {wrong[:3]}"
        assert any(not np.array_equal(p, golden) for _, p in mine), n  # the test can fail


def test_inverted_residual_depthwise_and_grouped(data) -> None:
    names = ["block.expand.weight", "block.dw.weight", "block.project.weight",
             "grouped.weight", "stem.weight"]
    check(MobileNetLike(), data, FIXED, names)


def test_inverted_residual_int8_per_channel(data) -> None:
    check(MobileNetLike(), data, INT8, ["block.dw.weight", "grouped.weight"], per_tensor=30)


def test_static_same_padding_subclass_traced_through(data) -> None:
    model = MobileNetLike(stem=StaticSame, dw=StaticSame)
    ev = TorchEvaluator(model, *data)
    call = conv_call(ev.graph(), ev.model, "block.dw.weight")
    assert call is not None and call.module is None and call.groups == 32  # from the graph
    check(model, data, FIXED, ["stem.weight", "block.dw.weight"])


def test_dynamic_same_padding_subclass_traced_as_a_leaf(data) -> None:
    model = MobileNetLike(stem=DynamicSame, dw=DynamicSame)
    with pytest.raises(torch.fx.proxy.TraceError):  # plain fx cannot: the conv leaves can
        torch.fx.symbolic_trace(model)
    ev = TorchEvaluator(model, *data)
    assert ev.graph() is not None
    call = conv_call(ev.graph(), ev.model, "block.dw.weight")
    assert call is not None and call.module == "block.dw"  # proven per batch
    check(model, data, FIXED, ["stem.weight", "block.dw.weight", "block.expand.weight"])


def test_reflect_padding_mode_is_captured(data) -> None:
    model = MobileNetLike()
    model.grouped.padding_mode = "reflect"
    check(model, data, FIXED, ["grouped.weight"])


@pytest.mark.parametrize("conv", [Standardized, Scaled], ids=["standardized", "scaled"])
def test_leaf_forwards_it_cannot_prove_fall_back_with_equal_results(data, conv) -> None:
    model = MobileNetLike(stem=DynamicSame)  # untraceable by plain fx: convs are leaves
    old = model.grouped
    model.grouped = conv(8, 16, 3, padding=1, groups=4)
    model.grouped.load_state_dict(old.state_dict())
    check(model, data, FIXED, ["grouped.weight"], per_tensor=20, shortcut=False)


def test_traced_through_forwards(data) -> None:
    """Traced through, a scaled conv output is just one more graph node (shortcut); a
    standardised weight is read twice (refused)."""
    for conv, ok in ((Scaled, True), (Standardized, False)):
        model = MobileNetLike()
        old = model.grouped
        model.grouped = conv(8, 16, 3, padding=1, groups=4)
        model.grouped.load_state_dict(old.state_dict())
        check(model, data, FIXED, ["grouped.weight"], per_tensor=20, shortcut=ok)


def test_channel_steps_equal_the_full_operations_bit_for_bit(data) -> None:
    """From the expand conv, BN, ReLU6, the depthwise conv, BN, ReLU6 run on chosen
    channels alone and give those channels of the clean run exactly; the project conv
    (it mixes channels) ends the chain. From the project conv: BN, the residual add."""
    from bitfault.torch.evaluate.channel_ops import channel_step

    ev = TorchEvaluator(trained(MobileNetLike(), data), *data)
    env = ev._clean_env(FIXED)[0].values
    g = ev.graph()
    params = ev._with_aliases(ev.stored(FIXED))
    col = torch.tensor([0, 5, 5, 31, 17])
    for start, chain, end in (("block.expand", ["block.bn1", "relu6_1", "block.dw",
                                                "block.bn2", "relu6_2"], "block.project"),
                              ("block.project", ["block.bn3", "add"], "grouped")):
        node = next(n for n in g.nodes if n.name == start.replace(".", "_"))
        dirty = g.dependents([node])
        prev, vals = node, env[node].index_select(1, col % env[node].shape[1])
        c = col % env[node].shape[1]
        for want in chain:
            nxt = next(n for n in g.nodes if n.name == want.replace(".", "_"))
            step = channel_step(nxt, prev, ev.model, params, c, env, dirty)
            assert step is not None, want
            vals, prev = step(vals), nxt
            assert torch.equal(vals, env[nxt].index_select(1, c)), want
        nxt, = prev.users
        assert nxt.name == end.replace(".", "_")
        assert channel_step(nxt, prev, ev.model, params, c, env, dirty) is None, end


class TwoUsers(nn.Module):
    """A conv output read twice (ReLU and a later add): the chain must not skip it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1, groups=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dw(self.conv(x))
        z = F.relu(y) * 0.5 + y
        return self.fc(F.adaptive_avg_pool2d(z, 1).flatten(1))


def test_a_value_read_twice_is_not_skipped(data) -> None:
    check(TwoUsers(), data, FIXED, ["conv.weight", "dw.weight"])


class PadConv(nn.Module):
    """Not a Conv2d at all: its own weight, reflect padding, then F.conv2d (grouped)."""

    def __init__(self, c_in: int, c_out: int, groups: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(c_out, c_in // groups, 3, 3) * 0.3)
        self.groups = groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(F.pad(x, [1, 1, 1, 1], mode="reflect"), self.weight, None, 1, 0, 1,
                        self.groups)


def test_any_module_whose_forward_ends_in_a_convolution(data) -> None:
    model = MobileNetLike()
    model.grouped = PadConv(8, 16, 4)
    check(model, data, FIXED, ["grouped.weight", "block.dw.weight"],
          targets=["grouped.weight", "block.dw.weight"])


class TwoBlocks(nn.Module):
    """Two inverted residual blocks in a row: after block 1's project conv, BN and the
    residual add, block 2's 1x1 expand conv is linear in the change too."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, stride=2, padding=1)
        self.block = InvertedResidual(8, 4)
        self.block2 = InvertedResidual(8, 4)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block2(self.block(F.relu6(self.stem(x))))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


def test_1x1_convs_after_one_changed_channel_are_rank_one_updates(data) -> None:
    """After a fault in block 1's expand or depthwise conv, neither its 1x1 project conv
    nor block 2's 1x1 expand conv (after BN and the residual add) is run: rank-one
    updates (``bitfault.torch.evaluate.rank_one``); predictions equal brute force. After a fault
    in block 1's project conv, block 2's expand conv is the first update."""
    check(TwoBlocks(), data, FIXED, ["block.expand.weight", "block.dw.weight"],
          not_run=("block.project", "block2.expand"))
    check(TwoBlocks(), data, FIXED, ["block.project.weight"], not_run=("block2.expand",))
    check(MobileNetLike(), data, INT8, ["block.expand.weight", "block.dw.weight"],
          per_tensor=20, not_run=("block.project",))


def test_float32_exponent_faults_huge_and_nan_changes(data) -> None:
    """float32 exponent and sign faults: huge changes, clamped by ReLU6, and NaN ones (bit
    30 of a weight in [1, 2) with a mantissa: NaN) reaching the 1x1 project conv, which
    then runs on whole rows (a change that is not finite is never a rank-one update: from
    a clean inf it would be inf - inf); predictions equal brute force."""
    model = trained(MobileNetLike(), data)
    with torch.no_grad():
        model.block.expand.weight.view(-1)[[5, 40]] = torch.tensor([1.5, -1.25])
        model.block.dw.weight.view(-1)[9] = 1.375
    nan = [("block.expand.weight", 5, 30), ("block.expand.weight", 40, 30),
           ("block.dw.weight", 9, 30)]
    check(model, data, F32, ["stem.weight", "block.expand.weight", "block.dw.weight",
                             "block.project.weight"], also=nan, train=False)
