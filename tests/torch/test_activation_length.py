"""Activations at fixed addresses (issue 17): with ``activation_length`` a position's faults
do not depend on the length a text batch was padded to; without it each length draws its
own map."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import bitfault as bf  # noqa: E402
from bitfault.errors import ArgumentError  # noqa: E402
from bitfault.torch import inject_  # noqa: E402
from bitfault.torch.activation_maps import leading_rows  # noqa: E402

SPEC = bf.FaultSpec(format=bf.FixedPoint(16, 10), ber=0.05, seed=4, targets="activations")


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 8))


def test_a_positions_faults_do_not_depend_on_the_padded_length() -> None:
    m = model()
    handle = inject_(m, SPEC, filter_fn=["1"], activation_length=12)
    name = "1.output"
    ids = torch.randint(0, 50, (3, 9))
    long = m(ids)
    long_map = handle.maps[name]
    short = m(ids[:, :5])
    short_map = handle.maps[name]
    assert long_map.shape == (9, 8) and short_map.shape == (5, 8)
    full = SPEC.map_for(name, (12, 8), 0)
    assert short_map == leading_rows(full, 5) and long_map == leading_rows(full, 9)
    keep = long_map.indices < 5 * 8  # the first 5 positions: the same cells at both lengths
    assert np.array_equal(short_map.indices, long_map.indices[keep])
    assert short_map.n_faults > 0
    # the faulty outputs are the core's on the clean outputs, per sample, at those cells
    handle.remove()
    clean_long, clean_short = m(ids).detach().numpy(), m(ids[:, :5]).detach().numpy()
    for faulty, clean, fmap in ((long, clean_long, long_map), (short, clean_short, short_map)):
        want = np.stack([bf.inject(c, SPEC.format, SPEC.fault, fmap) for c in clean])
        assert np.array_equal(faulty.detach().numpy(), want)
    assert np.array_equal(short.detach().numpy()[:, :5], long.detach().numpy()[:, :5])


def test_without_a_length_each_shape_draws_its_own_map_and_bad_lengths_are_refused() -> None:
    m = model()
    handle = inject_(m, SPEC, filter_fn=["1"])
    ids = torch.randint(0, 50, (2, 9))
    m(ids)
    nine = handle.maps["1.output"]
    m(ids[:, :5])
    assert handle.maps["1.output"] == SPEC.map_for("1.output", (5, 8), 0)
    assert nine == SPEC.map_for("1.output", (9, 8), 0)
    handle.remove()
    handle = inject_(m, SPEC, filter_fn=["1"], activation_length=6)
    with pytest.raises(ArgumentError, match="activation_length"):
        m(ids)  # 9 positions, a 6-row buffer
    handle.remove()
    with pytest.raises(ArgumentError, match="activation_length"):
        inject_(m, SPEC.replace(targets="weights"), activation_length=6)
    with pytest.raises(ArgumentError, match="activation_length"):
        inject_(m, SPEC, filter_fn=["1"], activation_length=0)
