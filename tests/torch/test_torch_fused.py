"""The compiled one-pass CPU kernels (Numba): switched by the environment; outputs reused
only once released. Their bits are checked against the core in test_torch_kernels.py."""

import importlib.util

import pytest

torch = pytest.importorskip("torch")

import bitfault as bf  # noqa: E402
from bitfault.torch import _fused  # noqa: E402
from bitfault.torch._kernels import DeviceFaults, faulty_group  # noqa: E402

needs_numba = pytest.mark.skipif(not _fused.available(), reason="Numba is not installed")


def test_numba_can_be_switched_off_by_the_environment(monkeypatch):
    _fused.available.cache_clear()
    try:
        monkeypatch.setenv("BITFAULT_NUMBA", "0")
        assert not _fused.available()
        _fused.available.cache_clear()
        monkeypatch.setenv("BITFAULT_NUMBA", "1")
        assert _fused.available() == (importlib.util.find_spec("numba") is not None)
    finally:
        monkeypatch.delenv("BITFAULT_NUMBA")
        _fused.available.cache_clear()


@needs_numba
def test_group_output_is_reused_only_once_nothing_holds_it():
    fmt, fault = bf.FixedPoint(32, 28, rounding="trunc"), bf.BitFlip()
    x = torch.randn(30, 20)
    faults = DeviceFaults.build([bf.FaultMap.random((30, 20), fmt, ber=0.01, seed=0)],
                                fault.eligible_mask(fmt), "cpu")
    expected = faulty_group([x], fmt, fault, faults)[0].clone()
    (held,) = faulty_group([x], fmt, fault, faults, reuse_output=True)
    (second,) = faulty_group([x], fmt, fault, faults, reuse_output=True)
    assert held.data_ptr() != second.data_ptr()  # ``held`` is still alive: not written again
    assert torch.equal(held, expected) and torch.equal(second, expected)
    ptr = second.data_ptr()
    del second
    (third,) = faulty_group([x], fmt, fault, faults, reuse_output=True)
    assert third.data_ptr() == ptr and torch.equal(third, expected)  # released: written again
    (other,) = faulty_group([x * 2], fmt, fault, faults, reuse_output=True)
    assert other.data_ptr() != ptr  # other tensors: another output
