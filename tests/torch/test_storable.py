"""inject_ keeps the clean tensors storable under the user's own training loop (project=True),
and refuses NaN or inf in the tensors it faults, at inject_ time and at any later forward."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
nn = torch.nn

from torch_helpers import bits_equal, core_faulty, hook_state, same_state, snapshot  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.torch import inject_, seam  # noqa: E402
from bitfault.torch.kernels.numba import inward_f32  # noqa: E402
from bitfault.torch.storable import outside, storable_bounds  # noqa: E402

SEED_FMT = bf.FixedPoint(32, 28, rounding="trunc")
BOUNDED = [SEED_FMT, bf.FixedPoint(8, 4), bf.Float("float16"), bf.Float("float8_e4m3fn")]


def _inside(model, fmt):
    lo, hi = fmt.range
    return all(bool(((p >= lo) & (p <= hi)).all()) for p in model.parameters())


def _seed_run(project, steps=6):
    """The seed program with the user's own loop: SeedMLP 784-256-256-10, FixedPoint(32, 28,
    trunc), a permanent map at ber 2e-3 (seed 0), plain SGD at lr 0.1, on embedded digits.
    A few rows of fc1 start just inside the range (7.9999995, the largest float32 below
    8 - 2**-28), so the first steps carry weights past it."""
    from bitfault.data import load_embedded_mnist
    from bitfault.models.torch import SeedMLP

    x, y = load_embedded_mnist()
    x, y = torch.from_numpy(x[:300]), torch.from_numpy(y[:300])
    model = SeedMLP(hidden=256, seed=0)
    with torch.no_grad():
        model.fc1.weight[:4] = 7.9999995
    inject_(model, bf.FaultSpec(format=SEED_FMT, ber=2e-3, seed=0, persistence="permanent"),
            project=project)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x[i * 50:(i + 1) * 50]), y[i * 50:(i + 1) * 50]).backward()
        opt.step()
    model(x[:10])  # the forward after the last step: what the model now stores
    return model


def test_seed_program_with_its_own_loop_keeps_every_clean_weight_in_range():
    model = _seed_run(project=True)
    assert _inside(model, SEED_FMT)
    assert float(model.fc1.weight.detach().max()) > 7.99  # the edge rows trained against the bound


def test_without_projection_the_same_loop_leaves_the_range():
    model = _seed_run(project=False)
    assert not _inside(model, SEED_FMT)


@pytest.mark.parametrize("fmt", BOUNDED, ids=repr)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_training_forward_projects_and_computes_from_the_projected_weights(fmt, dtype):
    lo, hi = fmt.range
    model = nn.Linear(6, 4).to(dtype)
    with torch.no_grad():
        model.weight[0, :3] = torch.tensor([hi * 3, lo * 3, hi], dtype=torch.float64).to(dtype)
        model.bias[1] = hi * 2
    spec = bf.FaultSpec(format=fmt, ber=0.05, seed=2, targets=("weights", "biases"))
    handle = inject_(model, spec)
    x = torch.randn(3, 6, dtype=dtype)
    out = model(x)
    a, b = storable_bounds(fmt, dtype)
    w = model.weight.detach()
    assert float(w[0, 0]) == b and float(w[0, 1]) == a and float(model.bias.detach()[1]) == b
    assert _inside(model, fmt)
    want = F.linear(x, core_faulty(model.weight, spec, handle.maps["weight"]),
                    core_faulty(model.bias, spec, handle.maps["bias"]))
    assert bits_equal(out, want)
    g = torch.randn_like(out)
    out.backward(g)  # every value is inside now: the whole upstream gradient passes
    assert bits_equal(model.weight.grad, g.t() @ x)


def test_forwards_without_gradients_never_change_the_model():
    model = nn.Linear(4, 3)
    with torch.no_grad():
        model.weight[0, 0] = 100.0
    before = snapshot(model)
    inject_(model, bf.FaultSpec(format=SEED_FMT, ber=0.05, seed=0))
    with torch.no_grad():
        model(torch.randn(2, 4))
    with torch.inference_mode():
        model(torch.randn(2, 4))
    model.weight.requires_grad_(False)
    model(torch.randn(2, 4))
    assert same_state(model, before)


def test_int_quant_has_no_range_to_project():
    model = nn.Linear(4, 3)
    with torch.no_grad():
        model.weight[0, 0] = 1e6
    before = snapshot(model)
    inject_(model, bf.FaultSpec(format=bf.IntQuant(8), ber=0.05, seed=0))
    model(torch.randn(2, 4)).sum().backward()
    assert same_state(model, before)


def test_a_projection_does_not_start_a_transient_step():
    model = nn.Linear(4, 3)
    with torch.no_grad():
        model.weight[0, 0] = 100.0
    handle = inject_(model, bf.FaultSpec(format=SEED_FMT, ber=0.05, seed=0,
                                         persistence="transient", resample="step"))
    model(torch.randn(2, 4))
    model(torch.randn(2, 4))
    assert handle.step == 0 and float(model.weight.detach()[0, 0]) < 8


def test_project_must_be_a_bool():
    with pytest.raises(TypeError, match="project"):
        inject_(nn.Linear(2, 2), bf.FaultSpec(format=SEED_FMT, ber=0.1), project="yes")


@pytest.mark.parametrize("fmt", [SEED_FMT, bf.FixedPoint(8, 4), bf.FixedPoint(16, 3),
                                 bf.Float("float16"), bf.IntQuant(8)], ids=repr)
@pytest.mark.parametrize("compiled", [True, False])
def test_check_finds_exactly_the_unstorable_tensors_on_every_path(monkeypatch, fmt, compiled):
    if compiled and not seam.numba_available():
        pytest.skip("needs Numba")
    if not compiled:
        monkeypatch.setattr(seam, "numba_available", lambda: False)
    bounds = storable_bounds(fmt, torch.float32)
    if isinstance(fmt, bf.FixedPoint):
        assert bounds == tuple(float(v) for v in inward_f32(*fmt.range))
    edges = [] if bounds is None else [bounds[0], bounds[1]]
    beyond = [] if bounds is None else [float(np.nextafter(np.float32(bounds[1]), np.inf)),
                                        float(np.nextafter(np.float32(bounds[0]), -np.inf))]
    cases = [[0.5, *edges], *[[0.5, v] for v in beyond], [0.5, float("nan")],
             [0.5, float("inf")], [0.5, -float("inf")], []]
    xs = [torch.tensor(c, dtype=torch.float32) for c in cases]
    maps = [bf.FaultMap.empty((len(c),)) for c in cases]
    faults = seam.DeviceFaults.of(maps, fmt, bf.BitFlip(), "cpu")
    _, bad = seam.checked_group(xs, fmt, bf.BitFlip(), faults)
    assert bad == list(range(1, len(cases) - 1))
    assert outside(xs, bounds) == bad


# ---- NaN and inf ------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [bf.IntQuant(8), SEED_FMT, bf.Float("float16")], ids=repr)
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_inject_refuses_a_non_finite_weight_naming_it_and_its_index(fmt, value):
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    with torch.no_grad():
        model[2].weight[1, 2] = value
    before, hooks = snapshot(model), hook_state(model)
    with pytest.raises(ValueError, match=r"'2\.weight': value (nan|inf) at index \(1, 2\) is "
                                         r"not finite"):
        inject_(model, bf.FaultSpec(format=fmt, ber=0.05, seed=0))
    assert same_state(model, before) and hook_state(model) == hooks


@pytest.mark.parametrize("fmt", [bf.IntQuant(8), SEED_FMT], ids=repr)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("grad", [True, False])
def test_a_weight_that_became_nan_fails_the_next_forward(fmt, dtype, grad):
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)).to(dtype)
    inject_(model, bf.FaultSpec(format=fmt, ber=0.05, seed=0))
    x = torch.randn(2, 4, dtype=dtype)
    model(x)
    with torch.no_grad():
        model[0].weight[3, 1] = float("nan")
    with torch.set_grad_enabled(grad), pytest.raises(
            ValueError, match=r"'0\.weight': value nan at index \(3, 1\) is not finite.*diverged"):
        model(x)
    with torch.no_grad():
        model[0].weight[3, 1] = 0.25
    assert torch.isfinite(model(x)).all()  # the handle still works once the weight is fixed


def test_a_module_called_on_its_own_checks_too():
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    inject_(model, bf.FaultSpec(format=bf.IntQuant(8), ber=0.05, seed=0))
    with torch.no_grad():
        model[2].weight[2, 0] = float("-inf")
    with pytest.raises(ValueError, match=r"'2\.weight': value -inf at index \(2, 0\)"):
        model[2](torch.randn(2, 5))
