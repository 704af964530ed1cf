"""Data-dependent memories in PyTorch: a campaign through TorchEvaluator and ``bitfault
inject`` equal the plain loop (tests/stored_reference.py), live injection refuses them."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import bitfault as bf  # noqa: E402
from bitfault.campaign import rate_sweep, run  # noqa: E402
from bitfault.campaign.runner import evaluate_trials  # noqa: E402
from bitfault.errors import ArgumentError  # noqa: E402
from bitfault.faults.patterns import Asymmetric, IndependentBits  # noqa: E402
from bitfault.jobs.inject import inject_file  # noqa: E402
from bitfault.memory.codes import SecDed  # noqa: E402
from bitfault.memory.layout import WordLayout  # noqa: E402
from bitfault.memory.storage import Storage  # noqa: E402
from bitfault.torch import TorchEvaluator, inject_  # noqa: E402
from stored_reference import reference_values  # noqa: E402

WEIGHTS = ("0.weight", "2.weight")


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))
    x = torch.randn(40, 12)
    with torch.no_grad():
        labels = model(x).argmax(1).numpy()
    return model, x, labels


@pytest.mark.parametrize("storage", [
    Storage(WordLayout(64), SecDed("zero"), IndependentBits(0.0)),
    Storage(WordLayout(32), SecDed("zero"), Asymmetric(1.0, 0.2)),
], ids=["secded-zero", "asymmetric-secded-zero"])
def test_torch_campaign_equals_the_plain_loop(storage, tmp_path):
    model, x, labels = _model()
    evaluator = TorchEvaluator(model, x, labels)
    fmt = bf.IntQuant(8)
    memory = bf.Memory(fmt, bf.BitFlip(), storage=storage)
    trials = rate_sweep([0.02, 0.1], 2, base_seed=1)
    outputs = evaluate_trials(evaluator, trials, memory, evaluator.tensor_shapes())
    records = {r.trial_key: r.metrics for r in run(evaluator, trials, memory,
                                                   tmp_path / "t.db").records}
    params = dict(model.named_parameters())
    changed = 0
    for t, (_, pred, _) in zip(trials, outputs, strict=True):
        weights = {}
        for name in WEIGHTS:
            clean = params[name].detach().numpy()
            weights[name] = torch.from_numpy(
                reference_values(clean, fmt, storage, t.ber, t.seed, name)[0])
        with torch.no_grad():
            want = torch.func.functional_call(model, weights, (x,)).argmax(1).numpy()
        np.testing.assert_array_equal(pred, want)
        assert records[t.key]["accuracy"] == pytest.approx(float(np.mean(want == labels)))
        changed += int(np.any(want != labels))
    assert changed > 0


def test_bitfault_inject_writes_the_read_back_values(tmp_path):
    model, _, _ = _model()
    src, out = tmp_path / "m.pt", tmp_path / "faulty.pt"
    torch.save(model.state_dict(), src)
    storage = {"word_bits": 64, "protection": {"kind": "secded", "policy": "zero"}}
    spec = bf.FaultSpec(format=bf.IntQuant(8), ber=0.03, seed=4, storage=storage)
    inject_file(src, out, spec=spec)
    faulty = torch.load(out, weights_only=True)
    clean = model.state_dict()
    for name in WEIGHTS:
        want, counts = reference_values(clean[name].numpy(), spec.format,
                                        spec.memory.storage, 0.03, 4, name)
        assert counts["due"] > 0
        np.testing.assert_array_equal(faulty[name].numpy(), want)


def test_live_injection_refuses_a_data_dependent_memory_before_changing_the_model():
    model, x, _ = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        out = model(x)
    spec = bf.FaultSpec(format=bf.IntQuant(8), ber=1e-2, storage={
        "pattern": {"kind": "asymmetric", "p10": 1.0, "p01": 0.0}})
    with pytest.raises(ArgumentError, match="values change every step") as info:
        inject_(model, spec)
    assert info.value.argument == "storage"
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with torch.no_grad():
        assert torch.equal(model(x), out)  # no hook left behind
