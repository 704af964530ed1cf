"""The compiled one-pass CPU kernels (Numba): switched by the environment; outputs reused
only once released. Their bits are checked against the core in test_torch_kernels.py."""

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import bitfault as bf  # noqa: E402
from bitfault.torch import seam  # noqa: E402
from bitfault.torch.seam import DeviceFaults, faulty_group  # noqa: E402

needs_numba = pytest.mark.skipif(not seam.numba_available(), reason="Numba is not installed")


def test_numba_can_be_switched_off_by_the_environment(monkeypatch):
    seam.numba_available.cache_clear()
    try:
        monkeypatch.setenv("BITFAULT_NUMBA", "0")
        assert not seam.numba_available()
        seam.numba_available.cache_clear()
        monkeypatch.setenv("BITFAULT_NUMBA", "1")
        assert seam.numba_available() == (importlib.util.find_spec("numba") is not None)
    finally:
        monkeypatch.delenv("BITFAULT_NUMBA")
        seam.numba_available.cache_clear()


@needs_numba
def test_group_output_is_reused_only_once_nothing_holds_it():
    fmt, fault = bf.FixedPoint(32, 28, rounding="trunc"), bf.BitFlip()
    x = torch.randn(30, 20)
    faults = DeviceFaults.build([bf.FaultMap.random((30, 20), fmt, ber=0.01, seed=0)],
                                fault.eligible_mask(fmt), "cpu")
    expected = faulty_group([x], fmt, fault, faults)[0].clone()
    def call(t):  # what a caller hands on: a fresh alias of the kept output
        return faulty_group([t], fmt, fault, faults, reuse_output=True)[0].detach()

    held = call(x)
    second = call(x)
    assert held.data_ptr() != second.data_ptr()  # ``held`` is still alive: not written again
    assert torch.equal(held, expected) and torch.equal(second, expected)
    ptr = second.data_ptr()
    del second
    third = call(x)
    assert third.data_ptr() == ptr and torch.equal(third, expected)  # released: written again
    other = call(x * 2)
    assert other.data_ptr() != ptr and torch.equal(third, expected)  # ``third`` is held


def _both_paths(monkeypatch, xs, fmt, fault, maps):
    faults = DeviceFaults.build(maps, fault.eligible_mask(fmt), "cpu")
    fused = faulty_group(xs, fmt, fault, faults)
    with monkeypatch.context() as m:
        m.setattr(seam, "numba_available", lambda: False)
        plain = faulty_group(xs, fmt, fault, faults)
    return fused, plain


TRICKY = {
    "zeros": np.zeros((6, 5), np.float32),
    "signed zeros": np.array([[0.0, -0.0, 0.0], [-0.0, -0.0, 0.0]], np.float32),
    "all negative": -np.linspace(0.1, 3.0, 24, dtype=np.float32).reshape(4, 6),
    "one element": np.array([[0.3]], np.float32),
    "nan": np.array([[0.5, np.nan], [1.0, -2.0]], np.float32),
    "inf": np.array([[0.5, np.inf], [1.0, -2.0]], np.float32),
    "-inf": np.array([[0.5, -np.inf], [1.0, -2.0]], np.float32),
    "empty rows": np.zeros((5, 0), np.float32),
    "ties": (np.arange(-40, 41, dtype=np.float32) / 8).reshape(9, 9),
}


@needs_numba
@pytest.mark.parametrize("case", sorted(TRICKY))
@pytest.mark.parametrize("fmt", [
    bf.IntQuant(8), bf.IntQuant(8, symmetric=False), bf.IntQuant(4, per_channel=True),
    bf.IntQuant(8, symmetric=False, per_channel=True, codes="unsigned", rounding="trunc"),
    bf.FixedPoint(32, 28, rounding="trunc"), bf.FixedPoint(8, 3)], ids=repr)
def test_compiled_and_pytorch_paths_agree_on_edge_cases(monkeypatch, case, fmt):
    x = TRICKY[case]
    fmap = bf.FaultMap.random(x.shape, fmt, ber=0.2, seed=5, name="t")
    (fused,), (plain,) = _both_paths(monkeypatch, [torch.from_numpy(x)], fmt, bf.BitFlip(),
                                     [fmap])
    assert torch.equal(fused.view(torch.int32), plain.view(torch.int32))
    if np.isfinite(x).all():
        assert np.array_equal(fused.numpy().view(np.uint32),
                              bf.inject(x, fmt, bf.BitFlip(), fmap).view(np.uint32))
    elif isinstance(fmt, bf.IntQuant):
        assert torch.isnan(fused).all()  # no scale from NaN or inf: the whole tensor is NaN
