"""torch.compile and inject_ in either order: the compiled model computes the eager faulty one."""

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from torch_helpers import bits_equal  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.torch import inject_  # noqa: E402

SPECS = [bf.FaultSpec(format=bf.FixedPoint(32, 28), ber=0.05, seed=0,
                      targets=("weights", "biases", "activations")),
         bf.FaultSpec(format=bf.IntQuant(8), ber=0.05, seed=1, targets=("weights", "biases"))]


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))


def _run(model, x):
    out = model(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return out.detach(), grads


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: repr(s.format))
@pytest.mark.parametrize("order", ["compile_then_inject", "inject_then_compile"])
def test_compiled_model_computes_the_eager_faulty_model(spec, order):
    torch.compiler.reset()
    x = torch.randn(5, 8)
    eager = _net()
    handle = inject_(eager, spec)
    want, want_grads = _run(eager, x)
    handle.remove()
    clean, _ = _run(eager, x)

    model = copy.deepcopy(eager)
    if order == "compile_then_inject":
        compiled = torch.compile(model, backend="aot_eager")
        assert bits_equal(_run(compiled, x)[0], clean)
        handle = inject_(model, spec)
    else:
        handle = inject_(model, spec)
        compiled = torch.compile(model, backend="aot_eager")
    for _ in range(2):
        got, grads = _run(compiled, x)
        assert bits_equal(got, want)
        assert all(bits_equal(g, w) for g, w in zip(grads, want_grads, strict=True))
    handle.remove()
    assert bits_equal(_run(compiled, x)[0], clean)


def test_a_compiled_module_called_on_its_own_is_faulted():
    torch.compiler.reset()
    model, x = _net(), torch.randn(4, 8)
    spec = SPECS[0].replace(targets=("weights",))
    inject_(model, spec)
    want = model[0](x)
    compiled = torch.compile(model[0], backend="aot_eager")
    assert bits_equal(compiled(x), want) and bits_equal(compiled(x), want)
