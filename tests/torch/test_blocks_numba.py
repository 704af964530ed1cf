"""The compiled block kernels (``kernels.block_numba``) against the NumPy core, bit for bit.

Every format family, random per-plane maps, block axes (padding included), BitFlip and
StuckAt, NaN / inf scale words; the seam takes them for float32 CPU tensors and the fused
pass with a reused output gives the same bits as a fresh one.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba")

import bitfault as bf  # noqa: E402
from bitfault.errors import ArgumentError  # noqa: E402
from bitfault.formats import GGUF, MX, NVFP4, GroupwiseInt  # noqa: E402
from bitfault.torch import seam  # noqa: E402
from bitfault.torch.kernels import block_numba  # noqa: E402
from bitfault.torch.kernels import blocks as block_ops  # noqa: E402

FORMATS = [*(MX(e) for e in ("float8_e4m3fn", "float8_e5m2", "float6_e2m3fn",
                             "float6_e3m2fn", "float4_e2m1fn", "int8")),
           NVFP4(), GGUF("q8_0"), GGUF("q4_0"), GGUF("q4_1"), GroupwiseInt(4, 32),
           GroupwiseInt(8, 16, symmetric=False), GroupwiseInt(2, 8)]
IDS = [repr(f).split("(")[0] + str(i) for i, f in enumerate(FORMATS)]
FAULTS = [bf.BitFlip(), bf.StuckAt(0), bf.StuckAt(1)]
CASES = [((5, 96), -1), ((7, 45), -1), ((40, 6), 0), ((3, 37, 4), 1), ((2, 3, 50), -1)]


def _data(shape, seed):
    """Many magnitudes, zero blocks with negative zeros, ties, tiny and subnormal values."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape) * rng.choice([1e-40, 1e-6, 1.0, 300.0, 1e4], size=shape)
    flat = x.astype(np.float32).reshape(-1)
    flat[:36] = 0.0
    flat[3:9] = -0.0
    flat[40:44] = [2.5, -2.5, 0.5, -0.5]
    return flat.reshape(shape)


def _compiled(x, fmt, fault, fmap):
    faults = block_ops.BlockFaults.of(fmap, fmt, fault, "cpu")
    out = np.full(x.size, np.nan, np.float32)
    block_numba.bind(fmt, fault, faults)(np.ascontiguousarray(x).reshape(-1), out)
    return out.reshape(x.shape)


def _same_bits(a, b):
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_compiled_kernels_equal_the_core_on_random_plane_maps(fmt):
    rng = np.random.default_rng(hash(repr(fmt)) % 2**32)
    for seed, (shape, axis) in enumerate(CASES):
        f = dataclasses.replace(fmt, axis=axis)
        x = _data(shape, seed)
        for fault in FAULTS:
            rates = {p: float(rng.choice([0.0, 0.01, 0.1, 0.5])) for p in f.plane_names}
            fmap = bf.FaultMap.random(shape, f, ber=rates, seed=seed, name="w")
            assert _same_bits(_compiled(x, f, fault, fmap), bf.inject(x, f, fault, fmap)), \
                (f, shape, fault, rates)


def _plane_map(fmt, shape, words):
    """A map that sets given words of every plane to given masks."""
    shapes = fmt.plane_shapes(shape)
    planes = {p: bf.FaultMap(shapes[p], [i for i, _ in w], [m for _, m in w], f"w:{p}")
              for p, w in words.items() if p != "codes"}
    codes = words.get("codes", [])
    return bf.FaultMap(shape, [i for i, _ in codes], [m for _, m in codes], "w", planes=planes)


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_nan_and_inf_scale_words_decode_as_the_core_decodes_them(fmt):
    shape = (3, 64)
    x = _data(shape, 11)
    width = {p.name: p.format.word_mask for p in fmt.planes}
    special = {"float8_e8m0fnu": [0xFF], "float8_e4m3fn": [0x7F, 0xFF],
               "float16": [0x7C00, 0xFC00, 0x7E01],
               "float32": [0x7F800000, 0x7FA00000, 0xFFC00000]}
    words, tensor_words = {}, [None]
    for p in fmt.planes:
        pats = special.get(getattr(p.format, "dtype", ""), [width[p.name]])
        if p.per == "tensor":  # one word: one pattern per map
            tensor_words = [(p.name, m) for m in pats]
            continue
        n = int(np.prod(fmt.plane_shapes(shape)[p.name], dtype=np.int64))
        words[p.name] = [(i % n, m & width[p.name]) for i, m in enumerate(pats)]
    words["codes"] = [(0, width["codes"]), (65, width["codes"] & 0x7F), (130, 1)]
    for fault in (bf.StuckAt(1), bf.BitFlip()):
        for extra in tensor_words:
            fmap = _plane_map(fmt, shape, {**words, **({extra[0]: [(0, extra[1])]}
                                                       if extra else {})})
            assert _same_bits(_compiled(x, fmt, fault, fmap), bf.inject(x, fmt, fault, fmap))


def test_fp16_rounding_equals_numpys_on_every_kind_of_float32():
    rng = np.random.default_rng(0)
    bits = np.concatenate([rng.integers(0, 2**32, 200000, dtype=np.uint64).astype(np.uint32),
                           (rng.integers(0x30000000, 0x48000000, 200000)).astype(np.uint32)])
    v = bits.view(np.float32)
    v = v[np.isfinite(v)]
    want = v.astype(np.float16).view(np.uint16).astype(np.int64)
    import numba

    helper = block_numba.block_loops._f16_bits  # a dispatcher once the kernels compiled
    rounding = numba.njit(getattr(helper, "py_func", helper))
    got = np.array([rounding(np.int64(u)) for u in v.view(np.uint32)[:20000]])
    assert np.array_equal(got, want[:20000])


@pytest.mark.parametrize("fmt", [MX("float4_e2m1fn"), NVFP4(), GGUF("q4_1"),
                                 GroupwiseInt(4, 32)], ids=str)
def test_the_seam_takes_them_and_a_reused_output_gives_the_same_bits(fmt):
    xs = [torch.from_numpy(_data((16, 64), 1)), torch.from_numpy(_data((8, 33), 2))]
    assert all(seam.block_compiled_for(x, fmt) for x in xs)
    assert not seam.block_compiled_for(xs[0].double(), fmt)
    maps = [bf.FaultMap.random(tuple(x.shape), fmt, ber=0.05, seed=i, name=f"w{i}")
            for i, x in enumerate(xs)]
    faults = seam.DeviceFaults.of(maps, fmt, bf.BitFlip(), "cpu")
    eager = [block_ops.faulty_blocks(x, fmt, bf.BitFlip(), f)
             for x, f in zip(xs, faults.blocks, strict=True)]
    for _ in range(3):  # the second and third calls write into the first call's memory
        outs = seam.faulty_group(xs, fmt, bf.BitFlip(), faults, reuse_output=True)
        for out, x, fmap, e in zip(outs, xs, maps, eager, strict=True):
            want = bf.inject(x.numpy(), fmt, bf.BitFlip(), fmap)
            assert _same_bits(out.numpy(), want) and _same_bits(e.numpy(), want)
        del outs


def test_strict_injection_raises_the_cores_errors_through_the_compiled_path():
    x = torch.from_numpy(_data((4, 64), 3))
    fmt = GroupwiseInt(4, 32)
    fmap = bf.FaultMap.random((4, 64), fmt, ber=0.01, seed=0, name="w")
    bad = x.clone()
    bad[1, 3] = float("nan")
    mx = MX("float4_e2m1fn")
    with pytest.raises(ValueError, match="NaN"):
        seam.inject_tensor(bad, mx, bf.BitFlip(),
                           bf.FaultMap.random((4, 64), mx, ber=0.01, seed=0, name="w"))
    big = x.clone()
    big[0, 0] = 3e38
    with pytest.raises(ArgumentError, match="float16"):
        seam.inject_tensor(big, fmt, bf.BitFlip(), fmap)
