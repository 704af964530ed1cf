"""Faults in every plane of a block-format tensor: maps, inject, StoredArray, files.

The machinery is tested on a small block format defined here (int8 codes sharing one
float16 scale per block of 4), so a failure points at the planes, not at a format's
arithmetic (each format has its own tests).
"""

from __future__ import annotations

import numpy as np
import pytest

import bitfault as bf
from bitfault.errors import ArgumentError
from bitfault.formats import plane_map_name, split_by_plane
from bitfault.memory import Memory, StoredArray
from blockfmt import Toy


def _reference(x: np.ndarray, fmt: Toy, codes_flip: dict, scale_flip: dict) -> np.ndarray:
    """The faulty tensor computed block by block, from scratch, with Python ints."""
    moved = np.moveaxis(x, fmt.axis, -1)
    out = np.empty_like(moved)
    n = moved.shape[-1]
    scale_shape = fmt.plane_shapes(x.shape)["scale"]
    for lead in np.ndindex(moved.shape[:-1]):
        for b in range(-(-n // 4)):
            idx = list(range(4 * b, min(n, 4 * b + 4)))
            vals = moved[lead][idx]
            scale = np.float16(np.abs(vals).max() / np.float32(127))
            full = list(lead)
            full.insert(fmt.axis % x.ndim, b)
            sidx = np.ravel_multi_index(tuple(full), scale_shape)
            sbits = int(scale.view(np.uint16)) ^ scale_flip.get(int(sidx), 0)
            s = np.float32(np.uint16(sbits).view(np.float16))
            clean = np.float32(scale) if scale != 0 else np.float32(1)
            for j, v in zip(idx, vals, strict=True):
                q = int(np.clip(np.rint(v / clean), -127, 127))  # codes: from the clean scale
                full = list(lead)
                full.insert(fmt.axis % x.ndim, j)
                eidx = int(np.ravel_multi_index(tuple(full), x.shape))
                q = ((q & 0xFF) ^ codes_flip.get(eidx, 0))
                q = q - 256 if q >= 128 else q
                out[(*lead, j)] = np.float32(q) * s
    return np.moveaxis(out, -1, fmt.axis)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_a_flipped_scale_bit_changes_exactly_its_block(axis):
    x = np.random.default_rng(axis + 5).normal(size=(3, 6, 5)).astype(np.float32)
    fmt = Toy(axis=axis)
    shapes = fmt.plane_shapes(x.shape)
    clean = bf.inject(x, fmt, bf.BitFlip(), bf.FaultMap.empty(x.shape, "w"))
    word = 4
    scale_map = bf.FaultMap(shapes["scale"], [word], [1 << 14], "w:scale")
    fmap = bf.FaultMap(x.shape, [], np.zeros(0, np.uint32), "w", planes={"scale": scale_map})
    faulty = bf.inject(x, fmt, bf.BitFlip(), fmap)
    changed = np.flatnonzero(faulty.reshape(-1) != clean.reshape(-1))
    lay = fmt.layout(x.shape)
    block = lay.block_of_plane_index()[word]
    expected = np.flatnonzero(lay.block_of_elements() == block)
    assert set(changed) <= set(expected) and len(changed) >= len(expected) - 1
    np.testing.assert_array_equal(faulty, _reference(x, fmt, {}, {word: 1 << 14}))


@pytest.mark.parametrize("axis", [-1, 0])
def test_inject_and_stored_array_match_the_reference_on_random_plane_maps(axis):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 9)).astype(np.float32)
    fmt = Toy(axis=axis)
    stored = StoredArray.of(x, fmt)
    for seed in range(6):
        fmap = bf.FaultMap.random(x.shape, fmt, ber=0.05, seed=seed, name="w")
        codes = dict(zip(fmap.indices.tolist(), fmap.masks.tolist(), strict=True))
        scale = fmap.planes["scale"]
        scales = dict(zip(scale.indices.tolist(), scale.masks.tolist(), strict=True))
        want = _reference(x, fmt, codes, scales)
        np.testing.assert_array_equal(bf.inject(x, fmt, bf.BitFlip(), fmap), want)
        np.testing.assert_array_equal(stored.faulty(bf.BitFlip(), fmap), want)
        for fault in (bf.StuckAt(0), bf.StuckAt(1), bf.BitFlip(bits="scale.exponent")):
            np.testing.assert_array_equal(stored.faulty(fault, fmap),
                                          bf.inject(x, fmt, fault, fmap))


def test_plane_maps_are_named_reproducible_nested_and_selectable():
    fmt = Toy()
    shape = (8, 10)
    a = bf.FaultMap.random(shape, fmt, ber=0.02, seed=4, name="fc1.weight")
    assert a == bf.FaultMap.random(shape, fmt, ber=0.02, seed=4, name="fc1.weight")
    assert a.planes["scale"].name == plane_map_name("fc1.weight", "scale") == "fc1.weight:scale"
    assert a.planes["scale"].shape == (8, 3)
    big = bf.FaultMap.random(shape, fmt, ber=0.2, seed=4, name="fc1.weight")
    for small, large in ((a, big), (a.planes["scale"], big.planes["scale"])):
        dense_s, dense_l = small.to_dense(), large.to_dense()
        assert np.all(dense_s & dense_l == dense_s)  # nested
    assert big.n_faults > a.n_faults > 0
    only_scale = bf.FaultMap.random(shape, fmt, ber=0.2, seed=4, name="fc1.weight", bits="scale")
    assert only_scale.n_elements == 0 and only_scale.planes["scale"] == big.planes["scale"]
    only_codes = bf.FaultMap.random(shape, fmt, ber=0.2, seed=4, name="fc1.weight",
                                    bits=["sign", "magnitude"])
    assert only_codes.planes["scale"].n_faults == 0
    assert np.array_equal(only_codes.indices, big.indices)
    per_plane = bf.FaultMap.random(shape, fmt, ber={"codes": 0.2, "scale": 0.0}, seed=4,
                                   name="fc1.weight")
    assert np.array_equal(per_plane.masks, big.masks) and per_plane.planes["scale"].n_faults == 0
    exp = bf.FaultMap.random(shape, fmt, ber={"scale.exponent": 0.5}, seed=1, name="w")
    assert exp.n_elements == 0
    assert int(np.bitwise_or.reduce(exp.planes["scale"].masks)) & ~0x7C00 == 0


def test_plane_maps_survive_files(tmp_path):
    fmap = bf.FaultMap.random((5, 7), Toy(), ber=0.1, seed=2, name="w")
    fmap.save(tmp_path / "w.npz")
    back = bf.FaultMap.load(tmp_path / "w.npz")
    assert back == fmap and back.digest() == fmap.digest()
    assert back.planes["scale"].name == "w:scale"


def test_split_by_plane_and_bad_plane_selections():
    fmt = Toy()
    assert split_by_plane(None, fmt) == {"codes": None, "scale": None}
    assert split_by_plane(["sign", "scale.exponent"], fmt) == {"codes": ["sign"],
                                                               "scale": ["exponent"]}
    assert split_by_plane({"scale": 1e-3}, fmt) == {"scale": {"all": 1e-3}}
    with pytest.raises(ArgumentError, match="names no plane"):
        Memory(fmt, bf.BitFlip(bits="min.exponent"))
    with pytest.raises(ArgumentError, match="unknown bit field"):
        Memory(fmt, bf.BitFlip(bits="scale.fraction"))
    with pytest.raises(ArgumentError, match="one rate or a mapping"):
        bf.FaultMap.random((4, 4), fmt, ber=[0.1] * 8, name="w")
    wrong = bf.FaultMap.empty((4, 4), "w")
    bad = bf.FaultMap((4, 4), [], np.zeros(0, np.uint32), "w",
                      planes={"min": bf.FaultMap.empty((4, 1), "w:min")})
    with pytest.raises(ArgumentError, match="stores the planes"):
        bf.inject(np.zeros((4, 4), np.float32), fmt, bf.BitFlip(), bad)
    bad = bf.FaultMap((4, 4), [], np.zeros(0, np.uint32), "w",
                      planes={"scale": bf.FaultMap.empty((4, 2), "w:scale")})
    with pytest.raises(ArgumentError, match="is for shape"):
        bf.inject(np.zeros((4, 4), np.float32), fmt, bf.BitFlip(), bad)
    with pytest.raises(ArgumentError, match="axis"):
        bf.inject(np.zeros((4, 4), np.float32), Toy(axis=2), bf.BitFlip(), wrong)


def test_a_spec_gives_every_plane_its_map_and_its_rate():
    fmt = Toy(axis=0)
    spec = bf.FaultSpec(format=fmt, ber={"codes": 0.0, "scale": 0.3}, seed=1)
    fmap = spec.map_for("fc.weight", (8, 3))
    assert fmap.n_elements == 0 and fmap.planes["scale"].n_faults > 0
    assert fmap.planes["scale"].shape == (2, 3) and fmap.planes["scale"].name == "fc.weight:scale"
    scale = bf.FaultMap((2, 3), [1], [1], "fc.weight:scale")
    explicit = bf.FaultSpec(format=fmt, maps={"fc.weight:scale": scale}, seed=1)
    got = explicit.map_for("fc.weight", (8, 3))
    assert got.n_elements == 0 and got.planes["scale"] == scale
    with pytest.raises(ArgumentError, match="is for shape"):
        explicit.map_for("fc.weight", (9, 3))


BLOCK_FORMATS = [bf.MX("float8_e4m3fn"), bf.MX("float4_e2m1fn", axis=0), bf.MX("int8"),
                 bf.NVFP4(), bf.GGUF("q8_0"), bf.GGUF("q4_0", axis=0), bf.GGUF("q4_1"),
                 bf.formats.GroupwiseInt(4, 32, symmetric=False),
                 bf.formats.GroupwiseInt(8, 16, axis=0)]


@pytest.mark.parametrize("fmt", BLOCK_FORMATS, ids=repr)
def test_every_block_format_faults_its_planes_the_same_way_everywhere(fmt):
    x = np.random.default_rng(7).normal(size=(6, 40)).astype(np.float32)
    stored = StoredArray.of(x, fmt)
    for bits, fault in ((None, bf.BitFlip()), ("scale", bf.BitFlip()), (None, bf.StuckAt(1)),
                        ("scale.0", bf.StuckAt(0))):
        fmap = bf.FaultMap.random(x.shape, fmt, ber=0.02, seed=3, name="w", bits=bits)
        want = bf.inject(x, fmt, fault, fmap)
        np.testing.assert_array_equal(stored.faulty(fault, fmap).view(np.int32),
                                      want.view(np.int32))
    scale_shape = fmt.plane_shapes(x.shape)["scale"]
    flip = bf.FaultMap(x.shape, [], np.zeros(0, np.uint32), "w",
                       planes={"scale": bf.FaultMap(scale_shape, [1], [1 << (
                           fmt.plane("scale").format.bits - 2)], "w:scale")})
    changed = np.flatnonzero(bf.inject(x, fmt, bf.BitFlip(), flip).ravel()
                             != stored.values.ravel())
    block = fmt.layout(x.shape).block_of_plane_index()[1]
    assert changed.size and set(changed) <= set(
        np.flatnonzero(fmt.layout(x.shape).block_of_elements() == block))


def test_a_memory_gives_each_plane_its_relative_rate():
    from bitfault.campaign.grid import Trial
    from bitfault.campaign.runner import trial_maps

    fmt = bf.MX("float4_e2m1fn")
    memory = Memory(fmt, bf.BitFlip(), plane_rates={"codes": 0})
    assert memory.plane_ber(0.1) == {"codes": 0.0, "scale": 0.1}
    assert Memory.from_dict(memory.to_dict()) == memory
    assert memory.digest() != Memory(fmt, bf.BitFlip()).digest()
    assert "plane_rates" not in Memory(fmt, bf.BitFlip()).to_dict()
    maps = trial_maps(Trial("rate", 0.05, 0, 7), memory, {"w": (4, 64)})
    assert maps["w"].n_elements == 0 and maps["w"].planes["scale"].n_faults > 0
    with pytest.raises(ArgumentError, match="plane_rates key"):
        Memory(fmt, bf.BitFlip(), plane_rates={"min": 1})
    with pytest.raises(ArgumentError, match="apply to block formats"):
        Memory(bf.IntQuant(8), bf.BitFlip(), plane_rates={"codes": 1})
    with pytest.raises(ArgumentError, match=r"plane_rates\['scale'\]"):
        Memory(fmt, bf.BitFlip(), plane_rates={"scale": -1})


def test_intquant_with_a_group_size_is_the_group_wise_block_format():
    fmt = bf.IntQuant(4, group_size=32, symmetric=False)
    assert fmt == bf.formats.GroupwiseInt(4, 32, symmetric=False)
    assert fmt.to_dict() == {"kind": "int_quant", "bits": 4, "symmetric": False,
                             "group_size": 32, "axis": -1}
    assert bf.formats.format_from_dict(fmt.to_dict()) == fmt
    assert isinstance(bf.IntQuant(8), bf.IntQuant) and "group_size" not in bf.IntQuant(8).to_dict()
    with pytest.raises(ArgumentError, match="per_channel"):
        bf.IntQuant(4, per_channel=True, group_size=32)
    with pytest.raises(ArgumentError, match="axis"):
        bf.IntQuant(4, axis=0)
