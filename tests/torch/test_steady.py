"""The steady state of ``inject_`` in a training loop (``bitfault.torch.steady``): every
forward, bound or not, uses the core's faulty values of the parameters as they are now;
whatever the bound path assumed and no longer holds sends the forward down the general path."""

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
nn = torch.nn

from torch_helpers import bits_equal, core_faulty, mlp  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.torch import inject_, seam  # noqa: E402
from bitfault.torch.steady import SteadyForward  # noqa: E402

needs_numba = pytest.mark.skipif(not seam.numba_available(), reason="Numba is not installed")
FORMATS = [bf.FixedPoint(32, 28, rounding="trunc"), bf.FixedPoint(8, 4), bf.IntQuant(8),
           bf.IntQuant(8, per_channel=True), bf.IntQuant(4, symmetric=False)]


def _seen(model, handle, x):
    """The weights the model's next forward uses, read inside the forward."""
    seen = {}

    def grab(module, args):
        seen[module] = module.weight.detach().clone()

    hooks = [m.register_forward_pre_hook(grab) for m in model if isinstance(m, nn.Linear)]
    try:
        model(x).sum().backward()
    finally:
        for h in hooks:
            h.remove()
    return [seen[m] for m in model if isinstance(m, nn.Linear)]


def _expected(model, handle):
    names = [f"{i}.weight" for i, m in enumerate(model) if isinstance(m, nn.Linear)]
    weights = [m.weight for m in model if isinstance(m, nn.Linear)]
    return [core_faulty(w, handle.spec, handle.maps[n]) for w, n in zip(weights, names,
                                                                         strict=True)]


@needs_numba
@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
def test_training_steps_through_the_steady_path_equal_the_core(fmt):
    model = mlp()
    with torch.no_grad():  # values at both ends of FixedPoint(8, 4)'s range and beyond
        model[0].weight[0, :4] = torch.tensor([-8.0, 7.9375, 7.99, -8.01])
    handle = inject_(model, bf.FaultSpec(format=fmt, ber=0.02, seed=3, targets=("weights",)))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(16, 20)
    for step in range(4):
        opt.zero_grad()
        seen = _seen(model, handle, x)
        if step:
            assert isinstance(handle._steady, SteadyForward)
        expected = _expected(model, handle)  # after the forward's projection, if any
        assert all(bits_equal(a, b) for a, b in zip(seen, expected, strict=True))
        opt.step()


@needs_numba
def test_steady_and_general_paths_train_alike():
    fmt = bf.IntQuant(8, per_channel=True)
    models = [mlp(), mlp()]
    handles = [inject_(m, bf.FaultSpec(format=fmt, ber=0.01, seed=1)) for m in models]
    x, y = torch.randn(32, 20), torch.randint(0, 4, (32,))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    for _ in range(5):
        handles[1]._steady = None  # bound again at every forward: never used
        for m, o in zip(models, opts, strict=True):
            o.zero_grad()
            F.cross_entropy(m(x), y).backward()
            o.step()
    assert isinstance(handles[0]._steady, SteadyForward)
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert bits_equal(a, b)


@needs_numba
@pytest.mark.parametrize("change", ["parameter", "data", "transposed", "numba off"])
def test_a_changed_parameter_leaves_the_steady_path(monkeypatch, change):
    fmt = bf.FixedPoint(32, 28, rounding="trunc")
    model = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 3))
    handle = inject_(model, bf.FaultSpec(format=fmt, ber=0.05, seed=2, targets=("weights",)))
    x = torch.randn(4, 6)
    for _ in range(2):
        _seen(model, handle, x)
    assert isinstance(handle._steady, SteadyForward)
    first = model[0]
    if change == "parameter":
        first.weight = nn.Parameter(torch.randn(6, 6))
    elif change == "data":
        first.weight.data = torch.randn(6, 6)
    elif change == "transposed":  # the same memory, read the other way round
        first.weight.data = first.weight.data.t()
    else:
        monkeypatch.setattr(seam, "numba_available", lambda: False)
    seen = _seen(model, handle, x)
    assert all(bits_equal(a, b) for a, b in zip(seen, _expected(model, handle), strict=True))
    assert first.weight.grad is not None and first.weight.grad.abs().sum() > 0


@needs_numba
def test_the_steady_path_keeps_off_what_it_does_not_cover():
    x = torch.randn(4, 20)
    cases = {"transient": dict(persistence="transient", resample="forward"),
             "blocked": dict(gradient="blocked")}
    for kw in cases.values():
        model = mlp()
        handle = inject_(model, bf.FaultSpec(format=bf.IntQuant(8), ber=0.01, seed=0, **kw))
        model(x)
        model(x)
        assert not handle._steady
    model = mlp().double()
    handle = inject_(model, bf.FaultSpec(format=bf.IntQuant(8), ber=0.01, seed=0))
    model(x.double())
    assert not handle._steady


@needs_numba
def test_a_kept_output_is_not_written_while_something_holds_it():
    """Two forwards before one backward: the first forward's faulty weights stay as they were."""
    model = mlp()
    handle = inject_(model, bf.FaultSpec(format=bf.FixedPoint(32, 28), ber=0.02, seed=0))
    x = torch.randn(8, 20)
    model(x)
    model(x)  # bound
    held = {}
    hook = model[0].register_forward_pre_hook(lambda m, a: held.setdefault("w", m.weight))
    first = model(x).sum()
    hook.remove()
    want = _expected(model, handle)[0]
    with torch.no_grad():
        model[0].weight.mul_(2)
    second = model(x).sum()
    assert bits_equal(held["w"], want) and not bits_equal(model[0].weight, held["w"])
    del first, second
