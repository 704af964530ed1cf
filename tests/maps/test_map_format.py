"""A fault map records the format it was drawn for; applying it to another format is an
error unless it is converted explicitly (``FaultMap.for_format``)."""

from __future__ import annotations

import numpy as np
import pytest

import bitfault as bf
from bitfault.maps import FaultMap, check_map_format

INT8, FIXED16 = bf.IntQuant(8), bf.FixedPoint(16, 12)


def test_a_map_drawn_for_another_format_is_refused_by_inject() -> None:
    w = np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32)
    fmap = FaultMap.random(w.shape, INT8, ber=0.05, seed=0, name="fc1.weight")
    assert fmap.format == INT8
    with pytest.raises(bf.ArgumentError, match=r"fmap 'fc1.weight' was drawn for IntQuant\(.*"
                                               r"bits=8.*the tensor is stored in FixedPoint\(.*"
                                               r"fmap.for_format\(fmt\)") as info:
        bf.inject(w, FIXED16, bf.BitFlip(), fmap)
    assert info.value.argument == "fmap"
    # the explicit conversion: the same faults, now recorded for the other format
    moved = fmap.for_format(FIXED16)
    assert moved.format == FIXED16 and moved.meta["converted_from"] == INT8.to_dict()
    assert moved == fmap and moved.digest() == fmap.digest()
    want = FaultMap(w.shape, fmap.indices, fmap.masks, "fc1.weight")  # records no format
    np.testing.assert_array_equal(bf.inject(w, FIXED16, bf.BitFlip(), moved),
                                  bf.inject(w, FIXED16, bf.BitFlip(), want))
    # its own format, and an equal one built anew, are accepted
    bf.inject(w, bf.IntQuant(8), bf.BitFlip(), fmap)


def test_the_check_holds_for_stored_arrays_and_the_adapters() -> None:
    fmap = FaultMap.random((4, 4), INT8, ber=0.1, seed=1, name="0.weight")
    stored = bf.StoredArray.of(np.ones((4, 4), np.float32), FIXED16)
    with pytest.raises(bf.ArgumentError, match="was drawn for IntQuant"):
        stored.faulty(bf.BitFlip(), fmap)
    torch = pytest.importorskip("torch")
    from bitfault.torch import inject_

    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(bf.ArgumentError, match=r"maps\['0.weight'\] '0.weight' was drawn for "
                                               "IntQuant"):
        inject_(model, bf.FaultSpec(format=FIXED16, maps={"0.weight": fmap}))
    inject_(model, bf.FaultSpec(format=FIXED16, maps={"0.weight": fmap.for_format(FIXED16)}))


def test_maps_without_a_recorded_format_and_saved_maps_still_apply(tmp_path) -> None:
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    legacy = FaultMap.from_mask(np.eye(3, 4, dtype=np.uint32) << 3, name="w")
    assert legacy.format is None
    check_map_format(legacy, FIXED16)
    bf.inject(w, FIXED16, bf.BitFlip(), legacy)
    fmap = FaultMap.random(w.shape, FIXED16, ber=0.1, seed=2, name="w")
    fmap.save(tmp_path / "w.npz")
    loaded = FaultMap.load(tmp_path / "w.npz")
    assert loaded.format == FIXED16
    np.testing.assert_array_equal(bf.inject(w, FIXED16, bf.BitFlip(), loaded),
                                  bf.inject(w, FIXED16, bf.BitFlip(), fmap))
    with pytest.raises(bf.ArgumentError, match="was drawn for FixedPoint"):
        bf.inject(w, bf.FixedPoint(16, 8), bf.BitFlip(), loaded)


def test_block_format_maps_relabel_every_plane() -> None:
    mx = bf.MX("int8")
    fmap = FaultMap.random((4, 64), mx, ber=0.01, seed=0, name="w")
    assert fmap.for_format(mx).planes.keys() == fmap.planes.keys()
    with pytest.raises(bf.ArgumentError, match="has maps of the planes"):
        fmap.for_format(INT8)


def test_maps_bitfault_draws_record_their_format() -> None:
    from bitfault.campaign import rate_sweep, single_faults
    from bitfault.campaign.runner import trial_maps
    from bitfault.memory.storage import Storage

    shapes = {"w": (4, 8)}
    for storage in (None, Storage.from_dict({"word_bits": 64, "protection": "secded"})):
        memory = bf.Memory(INT8, bf.BitFlip(), storage=storage)
        [trial] = rate_sweep([0.05], 1)
        assert trial_maps(trial, memory, shapes)["w"].format == INT8
    [single] = single_faults([("w", 3, 5)])
    assert trial_maps(single, bf.Memory(INT8, bf.BitFlip()), shapes)["w"].format == INT8
    mx = bf.MX("int8")
    fmap = bf.Memory(mx, bf.BitFlip()).random_map((4, 64), ber=0.01, seed=0, name="w")
    assert fmap.format == mx and set(fmap.planes) == {"scale"}
    check_map_format(fmap.planes["scale"], bf.formats.plane_formats(mx)["scale"])
