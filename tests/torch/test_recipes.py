"""Recipe building blocks and one training step: weight clipping, bounded ReLUs, the
quantised forward, RandBET's loss and gradient, checked against bitfault.inject on NumPy."""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
nn = torch.nn

import bitfault as bf  # noqa: E402
from bitfault.models.torch import SeedMLP, SmallCNN  # noqa: E402
from bitfault.recipes import RandBET, Recipe  # noqa: E402
from bitfault.torch import (  # noqa: E402
    BoundedReLU,
    bound_relus_,
    calibrate_relu_thresholds,
    clip_weights_,
    inject_,
    quantised_weights,
    randbet_step,
)

WEIGHTS = ("fc1.weight", "fc2.weight", "fc3.weight")


def tiny(seed: int = 0) -> SeedMLP:
    return SeedMLP(hidden=16, inputs=20, classes=4, seed=seed)


def batch(n: int = 32, seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 20, generator=g), torch.randint(0, 4, (n,), generator=g)


def reference(model, x, y, fmt, maps):
    """Loss and gradients of a functional forward through bf.inject's weights (NumPy)."""
    ws = {}
    for n in WEIGHTS:
        w = model.get_parameter(n).detach().numpy()
        fmap = maps.get(n) or bf.FaultMap.empty(w.shape, n)
        ws[n] = torch.tensor(bf.inject(w, fmt, bf.BitFlip(), fmap), requires_grad=True)
    bs = {n: model.get_parameter(n).detach().clone().requires_grad_() for n in
          ("fc1.bias", "fc2.bias", "fc3.bias")}
    h = F.relu(F.linear(x, ws["fc1.weight"], bs["fc1.bias"]))
    h = F.relu(F.linear(h, ws["fc2.weight"], bs["fc2.bias"]))
    loss = F.cross_entropy(F.linear(h, ws["fc3.weight"], bs["fc3.bias"]), y)
    loss.backward()
    return loss.item(), {n: t.grad for n, t in {**ws, **bs}.items()}


def randbet_maps(model, rb: RandBET, fmt, step: int) -> dict:
    return {n: bf.FaultMap.random(tuple(model.get_parameter(n).shape), fmt, ber=rb.p_train,
                                  seed=rb.seed, name=n, step=step) for n in WEIGHTS}


def test_models_have_relu_modules_and_optional_norms():
    assert list(SmallCNN(channels=(4, 8)).state_dict()) == [
        "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc.weight", "fc.bias"]
    gn = SmallCNN(channels=(4, 8), norm="group")
    assert isinstance(gn.norm1, nn.GroupNorm) and gn.norm2.num_groups == 4
    assert isinstance(SmallCNN(norm="batch").norm2, nn.BatchNorm2d)
    assert [n for n, m in gn.named_modules() if type(m) is nn.ReLU] == ["act1", "act2"]
    assert torch.equal(SmallCNN(seed=3).conv2.weight, SmallCNN(seed=3, norm="batch").conv2.weight)
    with pytest.raises(ValueError, match="norm"):
        SmallCNN(norm="layer")


# ---- weight clipping ---------------------------------------------------------------------------

def test_clip_weights_after_every_step_weights_only():
    model, twin = tiny(), tiny()
    for m in (model, twin):
        with torch.no_grad():
            for n in ("fc1.bias", "fc2.bias", "fc3.bias"):
                m.get_parameter(n).fill_(0.5)
    x, y = batch()
    opt = torch.optim.SGD(model.parameters(), lr=2.0)
    opt_twin = torch.optim.SGD(twin.parameters(), lr=2.0)
    handle = clip_weights_(opt, 0.05)
    assert len(handle.params) == 3 and repr(handle).startswith("ClipHandle(3 tensors")
    for _ in range(4):
        for m, o in ((model, opt), (twin, opt_twin)):
            o.zero_grad()
            F.cross_entropy(m(x), y).backward()
            o.step()
        assert all(model.get_parameter(n).abs().max() <= 0.05 for n in WEIGHTS)
        assert any(twin.get_parameter(n).abs().max() > 0.05 for n in WEIGHTS)  # would exceed
        assert model.fc3.bias.abs().max() > 0.05  # 1-D biases are not clipped by default
        assert (model.fc1.weight.abs() == 0.05).any()
    handle.remove()
    handle.remove()  # idempotent
    opt.zero_grad()
    F.cross_entropy(model(x * 50), y).backward()
    opt.step()
    assert model.fc1.weight.abs().max() > 0.05


def test_clip_weights_explicit_params_and_apply():
    model = tiny()
    with torch.no_grad():
        model.fc1.bias.fill_(1.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = clip_weights_(opt, 0.01, params=[model.fc1.bias])
    handle.apply()
    assert torch.all(model.fc1.bias == 0.01)
    assert model.fc1.weight.abs().max() > 0.01


@pytest.mark.parametrize("w_max", [0, -0.1, float("inf"), float("nan"), "0.1", True])
def test_clip_weights_bad_w_max(w_max):
    opt = torch.optim.SGD(tiny().parameters(), lr=0.1)
    with pytest.raises((ValueError, TypeError), match="w_max"):
        clip_weights_(opt, w_max)


def test_clip_weights_bad_arguments():
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="optimizer"):
        clip_weights_(model, 0.1)
    with pytest.raises(ValueError, match="params"):
        clip_weights_(opt, 0.1, params=[tiny().fc1.weight])
    with pytest.raises(ValueError, match="params"):
        clip_weights_(torch.optim.SGD([model.fc1.bias], lr=0.1), 0.1)
    assert not opt._optimizer_step_post_hooks


# ---- bounded ReLUs -------------------------------------------------------------------------------

def test_bounded_relu_values_and_gradient():
    x = torch.linspace(-2, 3, 51, requires_grad=True)
    out = BoundedReLU(1.5)(x)
    assert torch.equal(out, torch.clamp(x.detach(), 0.0, 1.5))
    out.sum().backward()
    inside = (x > 0) & (x < 1.5)
    assert torch.equal(x.grad, inside.float())
    with pytest.raises(ValueError, match="threshold"):
        BoundedReLU(0.0)


def test_bound_relus_all_and_by_name():
    model = tiny()
    x, _ = batch()
    before = model(x)
    assert bound_relus_(model, 1e-3) == ["act1", "act2"]
    assert all(isinstance(m, BoundedReLU) for m in (model.act1, model.act2))
    h = torch.clamp(model.fc1(x), 0, 1e-3)
    expected = model.fc3(torch.clamp(model.fc2(h), 0, 1e-3))
    assert torch.equal(model(x), expected) and not torch.allclose(model(x), before)
    assert list(model.state_dict()) == list(tiny().state_dict())
    other = tiny()
    assert bound_relus_(other, {"act2": 0.5}) == ["act2"]
    assert type(other.act1) is nn.ReLU and other.act2.threshold == 0.5


def test_bound_relus_bad_arguments():
    model = tiny()
    with pytest.raises(ValueError, match="act9"):
        bound_relus_(model, {"act1": 1.0, "act9": 1.0})
    with pytest.raises(ValueError, match=r"thresholds\['act1'\]"):
        bound_relus_(model, {"act1": -1.0})
    with pytest.raises(ValueError, match="thresholds"):
        bound_relus_(model, float("nan"))
    assert type(model.act1) is nn.ReLU and type(model.act2) is nn.ReLU  # nothing changed
    with pytest.raises(ValueError, match="no nn.ReLU"):
        bound_relus_(nn.Sequential(nn.Linear(2, 2)), 1.0)


def test_calibrate_relu_thresholds_matches_numpy_quantile():
    model = tiny()
    model.train()
    x, _ = batch(300)
    got = calibrate_relu_thresholds(model, x, quantile=0.9, batch_size=64)
    with torch.no_grad():
        h1 = F.relu(model.fc1(x))
        h2 = F.relu(model.fc2(h1))
    assert got["act1"] == pytest.approx(float(np.quantile(h1.numpy(), 0.9)), rel=1e-6)
    assert got["act2"] == pytest.approx(float(np.quantile(h2.numpy(), 0.9)), rel=1e-6)
    assert got["act1"] < float(h1.max())
    assert model.training  # mode restored
    assert not any(m._forward_hooks for m in model.modules())
    with pytest.raises(ValueError, match="quantile"):
        calibrate_relu_thresholds(model, x, quantile=1.5)
    with pytest.raises(ValueError, match="x"):
        calibrate_relu_thresholds(model, x[:0])


# ---- the quantised forward and RandBET's step ----------------------------------------------

@pytest.mark.parametrize("fmt", [bf.IntQuant(8), bf.FixedPoint(8, 5),
                                 bf.FixedPoint(16, 12, rounding="trunc")],
                         ids=["int8", "q3.5", "q4.12trunc"])
def test_quantised_forward_is_bit_exact(fmt):
    model = SmallCNN(channels=(2, 3), seed=1)
    x = torch.rand(4, 784, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1, 2, 3])
    used = {}
    def record(name):
        def hook(module, args):
            used.setdefault(name, module.weight.detach().clone())
        return hook

    for name in ("conv1", "conv2", "fc"):
        model.get_submodule(name).register_forward_pre_hook(record(name))
    before = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    randbet_step(model, opt, x, y, Recipe(format=fmt), 0)
    for name in ("conv1", "conv2", "fc"):
        w = before[f"{name}.weight"]
        want = bf.inject(w, fmt, bf.BitFlip(), bf.FaultMap.empty(w.shape))
        assert np.array_equal(used[name].numpy().view(np.int32), want.view(np.int32))
        assert not np.array_equal(want, w)  # quantisation does something
    direct = quantised_weights(model, fmt)
    w = model.fc.weight.detach().numpy()
    assert np.array_equal(direct["fc.weight"].detach().numpy(),
                          bf.inject(w, fmt, bf.BitFlip(), bf.FaultMap.empty(w.shape)))


def test_randbet_draws_a_fresh_replayable_pattern_every_step():
    fmt, rb = bf.IntQuant(8), RandBET(p_train=0.05, seed=7)
    model = tiny()
    x, y = batch()
    seen = []
    model.fc1.register_forward_pre_hook(lambda m, a: seen.append(m.weight.detach().clone()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        w = model.fc1.weight.detach().numpy().copy()
        randbet_step(model, opt, x, y, Recipe(format=fmt, randbet=rb), step)
        fmap = randbet_maps(model, rb, fmt, step)["fc1.weight"]
        assert fmap.n_faults > 20
        assert np.array_equal(seen[-1].numpy(), bf.inject(w, fmt, bf.BitFlip(), fmap))
        assert np.array_equal(seen[-2].numpy(),
                              bf.inject(w, fmt, bf.BitFlip(), bf.FaultMap.empty(w.shape)))
    assert len(seen) == 4
    diff = (seen[1] != seen[3]) & (seen[0] == seen[2])
    assert diff.any()  # step 1's pattern is not step 0's


@pytest.mark.parametrize("grad_clamp", [None, 1e-3])
def test_randbet_loss_and_gradient_are_the_sum_of_both_terms(grad_clamp):
    fmt, rb = bf.IntQuant(8), RandBET(p_train=0.05, seed=3, grad_clamp=grad_clamp)
    model = tiny()
    x, y = batch()
    step = 5
    clean_ref, g_clean = reference(model, x, y, fmt, {})
    pert_ref, g_pert = reference(model, x, y, fmt, randbet_maps(model, rb, fmt, step))
    assert abs(pert_ref - clean_ref) > 1e-3
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    clean, pert = randbet_step(model, opt, x, y, Recipe(format=fmt, randbet=rb), step)
    assert clean == pytest.approx(clean_ref, rel=1e-6)
    assert pert == pytest.approx(pert_ref, rel=1e-6)
    clamped = False
    for name, gc in g_clean.items():
        gp = g_pert[name]
        if grad_clamp is not None:
            clamped |= bool((gp.abs() > grad_clamp).any())
            gp = gp.clamp(-grad_clamp, grad_clamp)
        torch.testing.assert_close(model.get_parameter(name).grad, gc + gp, rtol=1e-5, atol=1e-7)
    assert clamped or grad_clamp is None


def test_randbet_start_below_and_perturb_switch():
    fmt = bf.IntQuant(8)
    model = tiny()
    x, y = batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    clean, _ = randbet_step(model, opt, x, y, Recipe(format=fmt, randbet=RandBET(0.05)), 0)
    low = Recipe(format=fmt, randbet=RandBET(0.05, start_below=clean * 0.5))
    high = Recipe(format=fmt, randbet=RandBET(0.05, start_below=clean * 2))
    assert np.isnan(randbet_step(model, opt, x, y, low, 0)[1])
    g_off = model.fc1.weight.grad.clone()
    assert not np.isnan(randbet_step(model, opt, x, y, high, 0)[1])
    assert not torch.equal(model.fc1.weight.grad, g_off)
    assert not np.isnan(randbet_step(model, opt, x, y, low, 0, perturb=True)[1])
    assert np.isnan(randbet_step(model, opt, x, y, high, 0, perturb=False)[1])
    assert torch.equal(model.fc1.weight.grad, g_off)


def test_randbet_keeps_batchnorm_statistics_clean():
    """The perturbed forward must not move BN's running statistics: they follow the clean
    quantised weights only (what a model is evaluated with)."""
    fmt = bf.IntQuant(8)
    base = SmallCNN(channels=(2, 3), norm="batch", seed=0)
    x = torch.rand(8, 784, generator=torch.Generator().manual_seed(0))
    y = torch.arange(8) % 4
    stats = []
    for perturb in (False, True):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        pert = randbet_step(model, opt, x, y, Recipe(format=fmt, randbet=RandBET(0.1)), 0,
                            perturb=perturb)[1]
        assert np.isnan(pert) != perturb
        stats.append({n: b.clone() for n, b in model.named_buffers()})
    assert all(torch.equal(stats[0][n], stats[1][n]) for n in stats[0])
    assert not torch.equal(stats[0]["norm1.running_mean"], base.norm1.running_mean)


def test_randbet_step_rejects_fault_aware_and_injected_models():
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    spec = bf.FaultSpec(format=bf.IntQuant(8), ber=1e-3)
    with pytest.raises(ValueError, match="fault_aware"):
        randbet_step(model, opt, x, y, Recipe(fault_aware=spec), 0)
    with pytest.raises(TypeError, match="recipe"):
        randbet_step(model, opt, x, y, {"name": "x"}, 0)
    handle = inject_(model, spec)
    with pytest.raises(ValueError, match="faults injected"):
        randbet_step(model, opt, x, y, Recipe(), 0)
    handle.remove()


def test_relu_bounds_names_every_bounded_relu() -> None:
    """bitfault.torch.relu_bounds, the twin of bitfault.keras.relu_bounds."""
    from bitfault.torch import bound_relus_, relu_bounds

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2),
                                torch.nn.ReLU())
    assert relu_bounds(model) == {}
    bound_relus_(model, {"1": 0.5, "3": 2.0})
    assert relu_bounds(model) == {"1": 0.5, "3": 2.0}
