"""Gradients: straight through to the clean weights ("ste") or nowhere ("blocked")."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
nn = torch.nn

from torch_helpers import bits_equal, core_faulty, mlp, same_state, snapshot  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.torch import inject_  # noqa: E402

FMT = bf.FixedPoint(32, 28, rounding="trunc")


def _loss(out, y):
    return F.cross_entropy(out.float(), y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("fmt", [FMT, bf.IntQuant(8)], ids=repr)
def test_ste_gradient_is_the_gradient_at_the_faulty_weights(dtype, fmt):
    model = mlp().to(dtype)
    spec = bf.FaultSpec(format=fmt, ber=0.01, seed=4, targets=("weights", "biases"))
    handle = inject_(model, spec)
    x, y = torch.randn(6, 20, dtype=dtype), torch.randint(0, 4, (6,))
    _loss(model(x), y).backward()
    # the same forward written out with the faulty tensors as leaves
    leaves = {n: core_faulty(p, spec, handle.maps[n]).requires_grad_()
              for n, p in model.named_parameters()}
    h = torch.relu(F.linear(x, leaves["0.weight"], leaves["0.bias"]))
    _loss(F.linear(h, leaves["2.weight"], leaves["2.bias"]), y).backward()
    for name, p in model.named_parameters():
        assert p.grad.dtype == p.dtype
        assert bits_equal(p.grad, leaves[name].grad), name


def test_ste_through_a_faulty_activation_is_the_identity():
    model = nn.Linear(5, 3)
    inject_(model, bf.FaultSpec(format=FMT, ber=0.1, seed=0, targets=("activations",)))
    x = torch.randn(4, 5)
    g = torch.randn(4, 3)
    model(x).backward(g)
    assert bits_equal(model.weight.grad, g.t() @ x)
    assert bits_equal(model.bias.grad, g.sum(0))


@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW])
def test_blocked_gives_no_gradient_and_the_weights_never_change(opt_cls):
    model = mlp()
    inject_(model, bf.FaultSpec(format=FMT, ber=0.01, seed=0, gradient="blocked",
                                targets=("weights", "biases")))
    before = snapshot(model)
    opt = opt_cls(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        loss = _loss(model(torch.randn(8, 20)), torch.randint(0, 4, (8,)))
        loss.backward()  # works although no targeted tensor gets a gradient
        assert all(p.grad is None for p in model.parameters())
        opt.step()
    assert same_state(model, before)  # the seed program's symptom


def test_blocked_stops_only_what_it_targets():
    model = mlp()
    inject_(model, bf.FaultSpec(format=FMT, ber=0.01, seed=0, gradient="blocked"))
    _loss(model(torch.randn(8, 20)), torch.randint(0, 4, (8,))).backward()
    assert model[0].weight.grad is None and model[2].weight.grad is None
    assert model[0].bias.grad is not None and model[2].bias.grad.abs().sum() > 0


def test_two_forwards_then_one_backward_accumulate():
    model = mlp()
    inject_(model, bf.FaultSpec(format=FMT, ber=0.05, seed=0))
    x1, x2 = torch.randn(3, 20), torch.randn(3, 20)
    (model(x1).sum() + model(x2).sum()).backward()
    together = model[0].weight.grad.clone()
    model.zero_grad()
    model(x1).sum().backward()
    model(x2).sum().backward()
    assert torch.allclose(together, model[0].weight.grad)


SATURATING = [bf.FixedPoint(8, 4), bf.FixedPoint(32, 28), bf.FixedPoint(8, 4, overflow="wrap"),
              bf.Float("float16"), bf.Float("bfloat16"), bf.IntQuant(8)]


def _beyond(fmt, shape, seed=0):
    """Weights with about a third of them outside ``fmt``'s range, and its two ends."""
    bounds = bf.formats.gradient_bounds(fmt)
    rng = np.random.default_rng(seed)
    w = rng.uniform(-1, 1, shape)
    if bounds is not None:
        lo, hi = bounds
        w = w * hi * 1.5
        w.flat[:2] = [np.float32(lo), np.nextafter(np.float32(hi), np.float32(0))]
    f32 = float(np.finfo(np.float32).max)
    return torch.from_numpy(np.clip(w, -f32, f32).astype(np.float32))


@pytest.mark.parametrize("fmt", SATURATING, ids=repr)
def test_ste_gradient_is_zero_outside_the_range_and_the_upstream_gradient_inside(fmt):
    model = nn.Linear(6, 5)
    with torch.no_grad():
        model.weight.copy_(_beyond(fmt, (5, 6)))
        model.bias.copy_(_beyond(fmt, (5,), seed=1))
    inject_(model, bf.FaultSpec(format=fmt, ber=0.05, seed=0, targets=("weights", "biases")),
            project=False)
    x, g = torch.randn(4, 6), torch.randn(4, 5)
    model(x).backward(g)
    bounds = bf.formats.gradient_bounds(fmt)
    for p, upstream in ((model.weight, g.t() @ x), (model.bias, g.sum(0))):
        inside = torch.ones_like(p, dtype=torch.bool) if bounds is None else \
            (p >= bounds[0]) & (p <= bounds[1])
        assert bounds is None or not inside.all()
        assert bits_equal(p.grad[inside], upstream[inside])
        assert torch.equal(p.grad[~inside], torch.zeros_like(p.grad[~inside]))


def test_ste_gradient_of_an_activation_outside_the_range_is_zero():
    model = nn.Linear(3, 4)
    with torch.no_grad():
        model.weight.fill_(2.0)  # outputs 2 * (x0 + x1 + x2)
        model.bias.zero_()
    inject_(model, bf.FaultSpec(format=bf.FixedPoint(8, 4), count=0, targets=("activations",)))
    x = torch.tensor([[1.0, 1.0, 1.0], [0.5, 0.5, 0.5]])  # outputs 6 (inside), 3 (inside)
    x = torch.cat([x, torch.tensor([[2.0, 2.0, 2.0]])])  # outputs 12: beyond [-8, 7.9375]
    model(x).sum().backward()
    assert torch.equal(model.bias.grad, torch.full((4,), 2.0))


def test_clean_weights_pushed_out_of_range_stop_there():
    """Plain SGD pushing every weight up, no projection: each stops one step past the end,
    not 50."""
    fmt = bf.FixedPoint(8, 4)
    model = nn.Linear(4, 3, bias=False)
    inject_(model, bf.FaultSpec(format=fmt, ber=0.05, seed=1), project=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    step = 0.5 * 4  # lr * the gradient of -sum(W) * 4
    for _ in range(50):
        opt.zero_grad()
        (-4 * model(torch.eye(4)).sum()).backward()
        opt.step()
    lo, hi = fmt.range
    assert float(model.weight.detach().max()) <= hi + step
    assert float(model.weight.detach().min()) > hi  # every weight got there and stopped


def test_issue_setup_keeps_saturated_weights_where_they_left_the_range():
    """SGD, large lr, FixedPoint(32, 28), a permanent map at ber 2e-3 on the seed MLP, no
    projection: a weight outside [-8, 8) never moves again."""
    from bitfault.models.torch import SeedMLP

    torch.manual_seed(0)
    model = SeedMLP(hidden=64)
    inject_(model, bf.FaultSpec(format=bf.FixedPoint(32, 28), ber=2e-3, seed=0), project=False)
    opt = torch.optim.SGD(model.parameters(), lr=2.0)
    x, y = torch.rand(256, 784), torch.randint(0, 10, (256,))
    lo, hi = -8.0, 8.0 - 2.0**-28
    escaped = 0
    for i in range(12):
        before = {n: p.detach().clone() for n, p in model.named_parameters() if "weight" in n}
        opt.zero_grad()
        F.cross_entropy(model(x[i * 16:(i + 1) * 16]), y[i * 16:(i + 1) * 16]).backward()
        opt.step()
        for n, w in before.items():
            outside = (w < lo) | (w > hi)
            escaped += int(outside.sum())
            assert torch.equal(dict(model.named_parameters())[n].detach()[outside], w[outside])
    assert escaped > 0
