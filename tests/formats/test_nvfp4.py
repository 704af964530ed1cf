"""NVFP4 (16 E2M1 codes, an E4M3 block scale, a float32 tensor scale) against the
independent reference of mx_reference.py (every float32 operation rounded once)."""

from __future__ import annotations

import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import mx_reference as ref

from bitfault.errors import ArgumentTypeError
from bitfault.formats.base import format_from_dict
from bitfault.formats.nvfp4 import NVFP4

F32 = np.float32


def check(x: np.ndarray, axis: int = -1) -> dict:
    fmt = NVFP4(axis=axis)
    planes = fmt.encode(x)
    moved = np.moveaxis(x, axis, -1)
    n = math.ceil(moved.shape[-1] / 16)
    padded = np.zeros((*moved.shape[:-1], 16 * n), F32)
    padded[..., :moved.shape[-1]] = moved
    t_bits, blocks = ref.nvfp4_tensor(padded.reshape(-1, 16))
    assert int(planes["tensor_scale"].view(np.uint32)) == t_bits
    scales = np.array([s for s, _ in blocks]).reshape(*moved.shape[:-1], n)
    codes = np.array([c for _, c in blocks]).reshape(padded.shape)[..., :moved.shape[-1]]
    np.testing.assert_array_equal(planes["scale"].view(np.uint8), np.moveaxis(scales, -1, axis))
    np.testing.assert_array_equal(planes["codes"].astype(np.int64) & 0xF,
                                  np.moveaxis(codes, -1, axis))
    # decoding: (q * s) * t, each product rounded once to float32
    out = np.moveaxis(fmt.decode(planes), axis, -1)
    t = Fraction(float(planes["tensor_scale"].view(np.float32)))
    for index in np.ndindex(codes.shape):
        q = ref.element_value("float4_e2m1fn", int(codes[index]))
        s = ref.element_value("float8_e4m3fn", int(scales[(*index[:-1], index[-1] // 16)]))
        assert float(out[index]) == ref.f32(Fraction(ref.f32(q * s)) * t)
    return planes


@pytest.mark.parametrize("seed", range(4))
def test_random_tensors_match_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((6, 48)) * np.exp2(rng.integers(-12, 12, (6, 1)))).astype(F32)
    x *= F32(10.0 ** rng.integers(-30, 30))
    check(x)


def test_edges() -> None:
    x = np.zeros((5, 16), F32)
    x[0, :4] = [6 * 448, -1.0, 0.25, -0.0]                # the tensor scale is exactly 1
    x[1, :3] = [1e-4, -3e-5, 1e-6]                        # block scales in E4M3 subnormals
    x[2, :2] = [1e-12, -1e-12]                            # block scale rounds to 0
    x[3, :] = np.linspace(-7, 7, 16)
    planes = check(x)
    assert float(planes["tensor_scale"].view(np.float32)) == 1.0
    assert planes["scale"].view(np.uint8)[2] == 0
    codes = planes["codes"].astype(np.int64) & 0xF
    assert codes[2, :2].tolist() == [0, 8]                # zeros of x's sign
    check(np.zeros((2, 16), F32))                         # an all-zero tensor: t = 1
    check(np.full((1, 16), 1e-44, F32))                   # amax / 2688 underflows: t = 1
    check(np.array([[3e38, -1e-30, 5.0]], F32))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_padding_along_each_axis(axis: int) -> None:
    rng = np.random.default_rng(7)
    shape = [3, 4, 5]
    shape[axis] = 21
    planes = check(rng.standard_normal(shape).astype(F32), axis)
    expected = list(shape)
    expected[axis] = 2
    assert planes["codes"].shape == tuple(shape)
    assert planes["scale"].shape == tuple(expected) and planes["tensor_scale"].shape == ()


def test_ties_round_to_even() -> None:
    """t = 1 and s = 1 (amax_block = 6): x / (s * t) = x, so E2M1's midpoints are ties
    (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4)."""
    fmt = NVFP4()
    x = np.zeros((2, 16), F32)
    x[0, 0] = 2688                                        # t = 2688 / (6 * 448) = 1
    x[1] = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0,
            -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, -0.0]
    planes = check(x)
    assert planes["scale"].view(np.uint8)[1] == 0x38     # E4M3 1.0
    values = fmt.decode(planes)[1, 1:].tolist()
    assert values == [0, 1, 1, 2, 2, 4, 4, -0, -1, -1, -2, -2, -4, -4, -0]


def test_a_flipped_scale_bit_changes_exactly_its_block() -> None:
    rng = np.random.default_rng(8)
    fmt = NVFP4()
    x = rng.uniform(1.0, 2.0, (2, 40)).astype(F32)
    planes = fmt.encode(x)
    clean = fmt.decode(planes)
    for bit in range(8):
        scale = planes["scale"].copy()
        scale[1, 1] ^= np.uint8(1 << bit).view(np.int8)
        out = fmt.decode({**planes, "scale": scale})
        changed = ~((out == clean) | (np.isnan(out) & np.isnan(clean)))
        expected = np.zeros(x.shape, bool)
        expected[1, 16:32] = clean[1, 16:32] != 0
        np.testing.assert_array_equal(changed, expected)
    tensor_scale = planes["tensor_scale"] ^ np.int32(1 << 30)
    out = fmt.decode({**planes, "tensor_scale": tensor_scale})
    assert np.all(out != clean)


def test_bad_arguments_and_round_trip() -> None:
    with pytest.raises(ArgumentTypeError) as e:
        NVFP4(axis=1.0)
    assert e.value.argument == "axis"
    with pytest.raises(ValueError, match=r"index \(0, 3\)"):
        NVFP4().encode(np.array([[1, 2, 3, np.inf]], F32))
    fmt = NVFP4(axis=0)
    assert format_from_dict(fmt.to_dict()) == fmt and fmt.to_dict() == {"kind": "nvfp4",
                                                                        "axis": 0}
    assert [p.name for p in fmt.planes] == ["codes", "scale", "tensor_scale"]
    assert [p.per for p in fmt.planes] == ["element", "block", "tensor"]


def test_scales_on_many_magnitudes() -> None:
    """Tensor and block scales on 300 random tensors of 40 blocks each (the float32
    rounding of amax / 2688 and of amax_block / (6 * t), one operation at a time)."""
    rng = np.random.default_rng(9)
    fmt = NVFP4()
    for _ in range(300):
        x = np.zeros((40, 16), F32)
        x[:, 0] = rng.uniform(1, 2, 40) * np.exp2(rng.integers(-20, 1, 40))
        x[0, 0] = rng.uniform(1, 2) * 2.0 ** rng.integers(-100, 100)
        x[:, 0] *= x[0, 0] / np.abs(x[:, 0]).max()
        planes = fmt.encode(x)
        amax = max(Fraction(float(v)) for v in x[:, 0])
        t = ref.f32(amax / 2688)
        assert float(planes["tensor_scale"].view(np.float32)) == t
        six_t = Fraction(ref.f32(6 * Fraction(t)))
        expected = [ref.encode_element("float8_e4m3fn", Fraction(ref.f32(Fraction(float(v))
                                                                          / six_t)), False)
                    for v in x[:, 0]]
        assert planes["scale"].view(np.uint8)[:, 0].tolist() == expected
