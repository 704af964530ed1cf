"""GroupwiseInt against torch.fake_quantize_per_channel_affine with the same fp16 scales and
zero points: the integer codes and the decoded values, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from bitfault.formats.base import low_bits_signed, low_bits_unsigned
from bitfault.formats.groupwise import GroupwiseInt
from groupwise_helpers import near_ties

torch = pytest.importorskip("torch")

F = np.float32


def weight(seed: int, out: int, inp: int, g: int) -> np.ndarray:
    """A Linear weight at a random scale, with exact ties planted in some groups."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((out, inp)) * 10.0 ** rng.uniform(-4, 1)).astype(F)
    e = F(2.0) ** int(rng.integers(-8, 2))
    w[0, :g] = (rng.integers(-7, 7, size=min(g, inp)) + F(0.5)) * e  # x / s on .5
    w[0, 0] = F(7) * e
    w[1, :g] = 0  # an all-zero group: s = fp16(eps)
    return w


def torch_codes(fmt: GroupwiseInt, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, fake-quantised values) from PyTorch, per group as one channel each."""
    g = fmt.group_size
    out, inp = w.shape
    pad = -inp % g
    wp = np.concatenate([w, np.zeros((out, pad), F)], axis=1).reshape(-1, g)
    lay = fmt.layout(w.shape)
    planes = fmt.encode(w)
    scale = planes["scale"].astype(np.int16).view(np.float16).astype(F).reshape(-1)
    zp = (low_bits_unsigned(planes["zero_point"], fmt.bits).reshape(-1)
          if not fmt.symmetric else np.zeros(len(scale), np.int64))
    lo, hi = fmt.code_range
    fq = torch.fake_quantize_per_channel_affine(
        torch.from_numpy(wp), torch.from_numpy(scale), torch.from_numpy(zp.astype(np.int32)),
        0, lo, hi).numpy()
    codes = fq / scale[:, None] + zp[:, None]  # exact: small ints times an fp16 scale
    assert np.array_equal(codes, np.rint(codes))
    return (lay.from_blocks(codes.astype(np.int64)),
            lay.from_blocks(fq))


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("seed", range(5))
def test_codes_equal_torch_fake_quant(bits: int, symmetric: bool, seed: int) -> None:
    g = [32, 64, 128][seed % 3]
    fmt = GroupwiseInt(bits=bits, group_size=g, symmetric=symmetric)
    w = weight(seed, 24, 3 * g, g)
    w[12:] = near_ties(fmt, w, seed)[12:]
    planes = fmt.encode(w)
    mine = (low_bits_signed if symmetric else low_bits_unsigned)(planes["codes"], bits)
    codes, fq = torch_codes(fmt, w)
    assert np.array_equal(mine, codes)
    assert np.array_equal(fmt.decode(planes).view(np.int32), fq.view(np.int32))


@pytest.mark.parametrize("symmetric", [True, False])
def test_padding_matches_torch_on_zero_padded_groups(symmetric: bool) -> None:
    fmt = GroupwiseInt(bits=4, group_size=128, symmetric=symmetric)
    w = weight(3, 16, 200, 128)  # 200 = 128 + 72: the last group padded with zeros
    w = near_ties(fmt, w, 3)
    planes = fmt.encode(w)
    assert planes["codes"].shape == (16, 200)
    assert planes["scale"].shape == (16, 2)
    mine = (low_bits_signed if symmetric else low_bits_unsigned)(planes["codes"], 4)
    codes, fq = torch_codes(fmt, w)
    assert np.array_equal(mine, codes)
    assert np.array_equal(fmt.decode(planes).view(np.int32), fq.view(np.int32))


def test_torch_multiplies_by_the_reciprocal() -> None:
    """Why the format computes x * (1 / s): on values next to a tie the two differ, and
    PyTorch's fake quantisation agrees with the reciprocal."""
    rng = np.random.default_rng(0)
    s = rng.uniform(0.001, 1, size=64).astype(np.float16).astype(F)
    k = rng.integers(-7, 7, size=(64, 128)).astype(F) + F(0.5)
    x = np.nextafter((k * s[:, None]).astype(F), F(np.inf))
    fq = torch.fake_quantize_per_channel_affine(torch.from_numpy(x), torch.from_numpy(s),
                                                torch.zeros(64, dtype=torch.int32),
                                                0, -7, 7).numpy()
    by_reciprocal = np.clip(np.rint(x * (F(1) / s)[:, None]), -7, 7) * s[:, None]
    by_division = np.clip(np.rint(x / s[:, None]), -7, 7) * s[:, None]
    assert np.array_equal(fq, by_reciprocal)
    assert not np.array_equal(fq, by_division)
