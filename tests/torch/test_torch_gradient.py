"""Gradients: straight through to the clean weights ("ste") or nowhere ("blocked")."""

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
