"""The worst-case search against an exhaustive reference, replay, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from bitfault import inject
from bitfault.campaign.search import worst_case
from bitfault.errors import ArgumentError
from bitfault.faults.models import BitFlip
from bitfault.formats import MX, FixedPoint, IntQuant, plane_formats
from bitfault.maps import FaultMap
from bitfault.memory.memory import Memory

torch = pytest.importorskip("torch")
TorchSearchModel = pytest.importorskip("bitfault.torch.search").TorchSearchModel


def _model_and_data(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    x = torch.randn(120, 32)
    y = model(x).argmax(1)
    return model, TorchSearchModel(model, x[:40], y[:40], x[40:], y[40:])


def _loss_with(model, x, y, name, value):
    """The attack loss with tensor ``name`` replaced by ``value`` (the others as stored)."""
    params = {n: p.detach() for n, p in model.named_parameters()}
    params[name] = torch.as_tensor(value)
    logits = torch.func.functional_call(model, params, (x,))
    return float(torch.nn.functional.cross_entropy(logits, y))


def _exhaustive_best(model, search, fmt, names):
    """Every stored bit of every plane of ``names`` flipped alone: (loss, name, plane,
    word, bit) of the flip with the largest attack loss (others stored in ``fmt``)."""
    x, y = search.attack
    stored = {n: inject(p.detach().numpy(), fmt, BitFlip(), FaultMap.empty(p.shape))
              for n, p in model.named_parameters() if n in search.names}
    best = None
    for name in names:
        clean = dict(model.named_parameters())[name].detach().numpy()
        shapes = fmt.plane_shapes(clean.shape) if len(plane_formats(fmt)) > 1 else {
            "codes": clean.shape}
        for plane, pf in plane_formats(fmt).items():
            size = int(np.prod(shapes[plane]))
            for word in range(size):
                for bit in range(pf.bits):
                    one = FaultMap(shapes[plane], [word], [1 << bit], name)
                    fmap = one if plane == "codes" else FaultMap(
                        clean.shape, [], np.zeros(0, np.uint32), name,
                        planes={plane: FaultMap(shapes[plane], [word], [1 << bit],
                                                f"{name}:{plane}")})
                    value = inject(clean, fmt, BitFlip(), fmap)
                    if np.array_equal(value, stored[name], equal_nan=True):
                        continue
                    loss = _loss_with(model, x, y, name, {**stored, name: value}[name])
                    loss = np.inf if np.isnan(loss) else loss
                    cand = (loss, name, plane, word, bit)
                    if best is None or cand[0] > best[0]:
                        best = cand
    return best


@pytest.mark.parametrize("fmt", [IntQuant(8), FixedPoint(12, 6),
                                 MX("float4_e2m1fn")], ids=str)
def test_first_flip_is_the_exhaustive_best(fmt):
    model, search = _model_and_data()
    names = ["0.weight"]  # 192 elements: every bit of every plane is evaluated exactly
    result = worst_case(search, Memory(fmt, BitFlip()), max_flips=1, tensors=names)
    loss, name, plane, word, bit = _exhaustive_best(model, search, fmt, names)
    flip = result.flips[0]
    found = result.attack_loss[1]
    assert (np.inf if np.isnan(found) else found) == pytest.approx(loss, rel=1e-6)
    assert (flip.tensor, flip.plane) == (name, plane)
    if loss < np.inf:  # several flips to inf tie; a finite best is unique here
        assert (flip.element, flip.bit) == (word, bit)


@pytest.mark.parametrize("fmt", [IntQuant(8), MX("float4_e2m1fn")], ids=str)
def test_exported_maps_replay_the_reported_metric(fmt):
    model, search = _model_and_data(1)
    memory = Memory(fmt, BitFlip())
    result = worst_case(search, memory, max_flips=4, stop_at=0.0, candidates=4,
                        exhaustive_below=0)
    assert len(result.flips) == len(result.metric) - 1 == 4
    values = {n: inject(v, fmt, BitFlip(), result.maps.get(n, FaultMap.empty(v.shape)))
              for n, v in search.tensor_values().items()}
    assert search.metric(values) == result.metric[-1]
    for f in result.flips:  # each flip is recorded in its tensor's map
        fmap = result.maps[f.tensor].plane(f.plane)
        k = int(np.searchsorted(fmap.indices, f.element))
        assert fmap.masks[k] >> f.bit & 1


def test_direction_restricts_flips_to_the_stored_bit():
    model, search = _model_and_data(2)
    fmt = IntQuant(8)
    result = worst_case(search, Memory(fmt, BitFlip()), max_flips=3, direction="0->1")
    for f in result.flips:
        clean = search.tensor_values()[f.tensor]
        words = fmt.encode(clean, fmt.calibrate(clean)).reshape(-1).view(np.uint8)
        assert not words[f.element] >> f.bit & 1


def test_stops_at_the_target_and_says_whether_it_was_reached():
    _, search = _model_and_data(3)
    result = worst_case(search, Memory(FixedPoint(16, 8), BitFlip()), max_flips=10,
                        stop_at=0.5)
    assert result.reached == (result.metric[-1] <= 0.5)
    assert all(m > 0.5 for m in result.metric[:-1])
    unreachable = worst_case(search, Memory(IntQuant(8), BitFlip()), max_flips=1,
                             stop_at=-1.0)
    assert not unreachable.reached and len(unreachable.flips) == 1
    assert unreachable.to_dict()["accuracy"] == unreachable.metric


def test_refuses_bad_input_before_searching():
    _, search = _model_and_data()
    memory = Memory(IntQuant(8), BitFlip())
    with pytest.raises(ArgumentError, match="direction"):
        worst_case(search, memory, direction="up")
    with pytest.raises(ArgumentError, match="tensors"):
        worst_case(search, memory, tensors=["nothing.*"])
    with pytest.raises(ArgumentError, match="no plane and bit"):
        worst_case(search, memory, planes=["scale"])
    with pytest.raises(ArgumentError, match="max_flips"):
        worst_case(search, memory, max_flips=0)
