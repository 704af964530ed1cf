"""Fault-aware PyTorch through a protected memory: what the network sees is the decoded
words (the spec's decoded maps), bit for bit the NumPy core, permanent and transient."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import bitfault as bf  # noqa: E402
from bitfault.torch import inject_  # noqa: E402

STORAGE = {"word_bits": 32, "protection": "secded",
           "pattern": {"kind": "mbu", "sizes": {1: 0.6, 2: 0.3, 3: 0.1}}}


@pytest.mark.parametrize("fmt", [bf.IntQuant(8), bf.MX("float4_e2m1fn")], ids=repr)
@pytest.mark.parametrize("persistence", ["permanent", "transient"])
def test_inject_through_a_protected_memory_equals_the_core(fmt, persistence):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))
    spec = bf.FaultSpec(format=fmt, ber=0.2, seed=9, persistence=persistence,
                        storage=STORAGE)
    clean = {n: p.detach().numpy().copy() for n, p in model.named_parameters()
             if n.endswith("weight")}
    handle = inject_(model, spec)
    x = torch.randn(5, 64)
    for step in range(2):
        out = model(x)
        weights = {}
        for name, w in clean.items():
            fmap = spec.map_for(name, w.shape, step if persistence == "transient" else None)
            weights[name] = torch.from_numpy(bf.inject(w, fmt, spec.fault, fmap))
        h = torch.relu(x @ weights["0.weight"].T + model[0].bias)
        want = h @ weights["2.weight"].T + model[2].bias
        assert torch.equal(out, want)
        if persistence == "transient":
            handle.resample(step + 1)
    faults = spec.map_for("0.weight", clean["0.weight"].shape)
    assert faults.meta["outcomes"]["words"] > 0  # the pattern reached the memory
    handle.remove()
