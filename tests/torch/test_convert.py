"""bitfault.torch.kernels.generic: float conversions with NumPy's rounding and NaN payloads."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bitfault.torch.kernels import generic as cv  # noqa: E402

ALL_F16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def test_every_float16_widens_like_numpy():
    h = torch.from_numpy(ALL_F16.copy())
    with np.errstate(invalid="ignore"):
        assert np.array_equal(_bits(cv.f16_to_f32(h).numpy()), _bits(ALL_F16.astype(np.float32)))
        assert np.array_equal(_bits(cv.f16_to_f64(h).numpy()), _bits(ALL_F16.astype(np.float64)))


def test_float32_narrows_like_numpy_including_nan_payloads():
    rng = np.random.default_rng(0)
    u = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)
    u[:4] = [0x7F800001, 0xFFBFFFFF, 0x7FC00000, 0x7F802000]  # signalling, quiet, tiny payloads
    f = u.view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = f.astype(np.float16)
    assert np.array_equal(_bits(cv.f32_to_f16(torch.from_numpy(f.copy())).numpy()),
                          _bits(expected))


def test_float64_to_float16_rounds_once():
    rng = np.random.default_rng(1)
    d = rng.standard_normal(200_000) * np.exp2(rng.integers(-30, 20, 200_000))
    d[:3] = [1 + 2**-11 + 2**-40, -(1 + 2**-11 + 2**-40), 2**-25 + 2**-60]  # double-rounding traps
    nan = np.array([0x7FF0000000000001, 0xFFF8000000000000, 0x7FF4000000000000],
                   np.uint64).view(np.float64)
    d = np.concatenate([d, nan, [np.inf, -np.inf, 1e300, -0.0]])
    with np.errstate(over="ignore", invalid="ignore"):
        expected = d.astype(np.float16)
    got = cv.f64_to_f16(torch.from_numpy(d.copy())).numpy()
    assert np.array_equal(_bits(got), _bits(expected))
    # PyTorch's own cast rounds twice on the first value; ours must not
    assert torch.tensor(d[:1]).half().view(torch.int16).item() != int(_bits(expected[:1])[0])
