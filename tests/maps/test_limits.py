"""A random map too large to draw is refused up front, naming the argument."""

from __future__ import annotations

import pytest

import bitfault as bf
from bitfault.maps import FaultMap, limits

SEED = bf.FixedPoint(32, 28)


def test_a_map_of_too_many_faults_is_refused_before_it_is_drawn() -> None:
    with pytest.raises(bf.ArgumentError, match=r"ber 0.001 on shape \(100000, 100000, 100000\) "
                                               r".* means about 3.2e\+13 faulty bits; a map "
                                               r"holds at most 2\^31") as info:
        FaultMap.random((100_000, 100_000, 100_000), SEED, ber=1e-3, name="x")
    assert info.value.argument == "ber"
    with pytest.raises(bf.ArgumentError, match=r"count 3000000000 on shape") as info:
        FaultMap.random((10**6, 10**4), SEED, count=3 * 10**9, name="x")
    assert info.value.argument == "count"


def test_a_shape_beyond_int64_cells_names_the_shape() -> None:
    for kw in ({"ber": 1e-3}, {"count": 3}):
        with pytest.raises(bf.ArgumentError, match=r"shape \(1000000000, 1000000000\) has "
                                                   r"3.2e\+19 bit cells .* at most 2\^62") as info:
            FaultMap.random((10**9, 10**9), SEED, name="x", **kw)
        assert info.value.argument == "shape"


def test_a_map_larger_than_the_memory_available_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(limits, "available_memory", lambda: 2**30)  # 1 GiB
    with pytest.raises(bf.ArgumentError, match=r"about 1.6e\+08 faulty bits, about 7.2 GiB to "
                                               r"draw; 1.0 GiB of memory is available"):
        FaultMap.random((10**8,), SEED, ber=0.05, name="x")
    assert FaultMap.random((1000,), SEED, ber=0.05, name="x").n_faults > 0  # small: drawn
