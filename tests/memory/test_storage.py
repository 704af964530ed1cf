"""A memory with storage: planes in memory words, protection, patterns, decoded maps.

The reference is a plain loop written here with the textbook codes of tests/ecc_reference.py
(Python ints): pack the clean element words, encode, flip the drawn physical bits, decode,
and compare with the clean data.
"""

from __future__ import annotations

import numpy as np
import pytest

import bitfault as bf
from bitfault.campaign import rate_sweep, run
from bitfault.campaign.evaluator import NumpyEvaluator
from bitfault.errors import ArgumentError
from bitfault.faults.patterns import IndependentBits, MultiBitUpset
from bitfault.memory.codes import NoProtection, Parity, SecDed
from bitfault.memory.decode import pattern_at
from bitfault.memory.layout import WordLayout
from bitfault.memory.storage import Storage
from ecc_reference import ref_check, ref_check_bits, ref_scheme


def _reference_map(clean: np.ndarray, bits: int, word_bits: int, kind: str, faults) -> tuple:
    """(flat element -> xor mask, outcome counts) by the reference codes, word by word."""
    k = word_bits // bits
    flat = [int(v) & ((1 << bits) - 1) for v in clean.reshape(-1)]
    masks: dict[int, int] = {}
    due = silent = 0
    for w, dmask, cmask in zip(faults.indices.tolist(), faults.data.tolist(),
                               faults.check.tolist(), strict=True):
        elems = range(w * k, min(len(flat), w * k + k))
        data = sum(flat[e] << (bits * (e - w * k)) for e in elems)
        check = ref_check(kind, data, word_bits)
        out, status = ref_scheme(kind, data ^ dmask, check ^ cmask, word_bits)
        error = (out ^ data) & sum(((1 << bits) - 1) << (bits * (e - w * k)) for e in elems)
        due += status == 2
        silent += status != 2 and error != 0
        for e in elems:
            m = (error >> (bits * (e - w * k))) & ((1 << bits) - 1)
            if m:
                masks[e] = m
    return masks, {"due": due, "silent": silent}


@pytest.mark.parametrize("kind, scheme", [("none", NoProtection()),
                                          ("parity", Parity()), ("secded", SecDed())])
@pytest.mark.parametrize("pattern", [IndependentBits(0.0), MultiBitUpset(0.0, {1: 0.5, 2: 0.3,
                                                                              3: 0.2})],
                         ids=["independent", "mbu"])
def test_decoded_maps_equal_the_reference_decoder(kind, scheme, pattern):
    fmt = bf.IntQuant(8)
    storage = Storage(WordLayout(32), scheme, pattern)
    memory = bf.Memory(fmt, bf.BitFlip(), storage=storage)
    x = np.random.default_rng(4).normal(size=(9, 7)).astype(np.float32)
    rate = 0.03 if isinstance(pattern, IndependentBits) else 0.3
    fmap = memory.random_map(x.shape, ber=rate, seed=5, name="w")
    n_words = -(-x.size // 4)
    faults = pattern_at(pattern, rate).draw(
        n_words, 32, ref_check_bits(kind, 32), seed=5, name="w")
    assert len(faults) > 3
    words = fmt.encode(x)
    masks, counts = _reference_map(words, 8, 32, kind, faults)
    assert dict(zip(fmap.indices.tolist(), fmap.masks.tolist(), strict=True)) == masks
    assert fmap.meta["outcomes"]["due"] == counts["due"]
    assert fmap.meta["outcomes"]["silent"] == counts["silent"]
    # the map is the decoder's error for any stored data (policy "flag"): so inject applies it
    want = fmt.decode(np.bitwise_xor(words, fmap.to_dense(np.int8)), fmt.calibrate(x))
    np.testing.assert_array_equal(bf.inject(x, fmt, bf.BitFlip(), fmap), want)


def test_secded_corrects_every_lone_error_and_the_campaign_records_outcomes(tmp_path):
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(16, 4)).astype(np.float32)}
    x = rng.normal(size=(64, 16)).astype(np.float32)
    labels = np.argmax(x @ params["w"], axis=1)
    evaluator = NumpyEvaluator(lambda p, xx: xx @ p["w"], params, x, labels)
    plain = bf.Memory(bf.IntQuant(8), bf.BitFlip())
    ecc = bf.Memory(bf.IntQuant(8), bf.BitFlip(),
                    storage=Storage(WordLayout(64), SecDed(), IndependentBits(0.0)))
    trials = rate_sweep([1e-3, 3e-2], 4, base_seed=10)
    result = run(evaluator, trials, ecc, tmp_path / "ecc.db")
    raw = run(evaluator, trials, plain, tmp_path / "raw.db")
    by_key = {r.trial_key: r.metrics for r in result.records}
    for r in result.records:
        m = r.metrics
        assert {"raw_bit_errors", "words_corrected", "words_due", "words_silent",
                "detected"} <= set(m)
        assert m["detected"] == int(m["words_due"] > 0)
    low = [m for k, m in by_key.items() if "ber=0.001" in k]
    assert all(m["words_silent"] == 0 and m["accuracy"] == 1.0 for m in low)  # corrected
    assert sum(m["words_corrected"] for m in low) > 0
    assert "raw_bit_errors" not in raw.records[0].metrics
    from bitfault.campaign import single_faults

    singles = single_faults([("w", 3, 1)])
    with pytest.raises(ArgumentError, match="single fault") as info:
        run(evaluator, singles, ecc, tmp_path / "singles.db")  # protection would be bypassed
    assert info.value.argument == "memory.storage"
    assert not (tmp_path / "singles.db").exists()


def test_a_spec_with_storage_round_trips_and_bad_storage_is_refused():
    spec = bf.FaultSpec(format=bf.MX("float4_e2m1fn"), ber=1e-3, seed=3,
                        storage={"word_bits": 64, "protection": {"scale": "secded"},
                                 "pattern": {"kind": "mbu", "sizes": {1: 0.9, 2: 0.1}}})
    assert bf.FaultSpec.from_dict(spec.to_dict()) == spec
    assert spec.memory.storage.scheme("scale") == SecDed()
    assert spec.memory.storage.overhead(spec.format) == {"codes": 0.0, "scale": 8 / 64}
    fmap = spec.map_for("fc.weight", (4, 64))
    assert fmap.planes["scale"].meta["outcomes"]["words"] >= 0
    assert fmap == spec.map_for("fc.weight", (4, 64))
    with pytest.raises(ArgumentError, match="word_bits"):
        bf.Memory(bf.Float("float6_e2m3fn"), bf.BitFlip(), storage={"word_bits": 64})
    zero = bf.Memory(bf.IntQuant(8), bf.BitFlip(),
                     storage={"protection": {"kind": "secded", "policy": "zero"}})
    assert zero.data_dependent and not spec.memory.data_dependent
    with pytest.raises(ArgumentError, match="data-dependent") as info:
        zero.random_map((4, 4), ber=1e-2, seed=0, name="w")  # no stored values given
    assert info.value.argument == "storage"
    with pytest.raises(ArgumentError, match="fault"):
        bf.Memory(bf.IntQuant(8), bf.StuckAt(1), storage={})
    with pytest.raises(ArgumentError, match="protection"):
        bf.Memory(bf.IntQuant(8), bf.BitFlip(), storage={"protection": {"min": "parity"}})
    with pytest.raises(ArgumentError, match="storage"):
        bf.Memory(bf.IntQuant(8), bf.BitFlip(), storage={"words": 64})
    with pytest.raises(ArgumentError, match="count"):
        bf.FaultSpec(format=bf.IntQuant(8), count=3, storage={})


def test_a_run_config_takes_the_memory_and_checks_it_before_anything_runs(tmp_path):
    from bitfault.config import ConfigError, load_config

    base = {"recipes": [{"name": "a", "format": {"kind": "int_quant", "bits": 8}}],
            "campaign": {"bers": [0.01], "chips": 2,
                         "memory": {"word_bits": 64, "protection": "secded",
                                    "pattern": {"kind": "mbu", "sizes": {1: 0.8, 2: 0.2}}}}}
    config = load_config(base)
    assert config.campaign.memory["protection"] == {"kind": "secded", "policy": "flag"}
    assert load_config(config.to_dict()).campaign.memory == config.campaign.memory
    bad = {**base, "campaign": {**base["campaign"], "memory": {"protection": "ecc"}}}
    with pytest.raises(ConfigError, match="campaign.memory"):
        load_config(bad)


def test_interleaving_and_wide_words_round_trip_through_the_dict_form():
    data = {"word_bits": 128, "row_words": 8, "interleave": 4, "protection": "secded",
            "pattern": {"kind": "mbu", "sizes": {2: 1.0}}}
    storage = Storage.from_dict(data)
    assert storage.layout == WordLayout(128, 8, 4)
    assert Storage.from_dict(storage.to_dict()) == storage
    assert storage.overhead(bf.IntQuant(8)) == {"codes": 9 / 128}  # SEC-DED (137,128)
    assert "interleave" not in Storage.from_dict({"word_bits": 64}).to_dict()  # digests kept
    spec = bf.FaultSpec(format=bf.IntQuant(8), ber=0.01, seed=1, storage=data)
    fmap = spec.map_for("w", (64, 256))
    out = fmap.meta["outcomes"]
    # adjacent double upsets, four words interleaved: each hits two words once, corrected
    assert out["words"] > 0 and out["corrected"] == out["words"] and out["silent"] == 0
    assert fmap.n_faults == 0
    plain = bf.FaultSpec(format=bf.IntQuant(8), ber=0.01, seed=1,
                         storage={**data, "interleave": 1}).map_for("w", (64, 256))
    within = plain.meta["outcomes"]  # the same upsets, each inside one word: detected only
    assert within["bit_errors"] == out["bit_errors"] and within["due"] == within["words"] > 0
    with pytest.raises(ArgumentError, match="interleave"):
        Storage.from_dict({**data, "row_words": 6})


def test_protection_of_chosen_tensors_only():
    data = {"word_bits": 64, "protection": "secded", "protected_tensors": ["fc1.*"],
            "pattern": {"kind": "mbu", "sizes": {1: 0.5, 2: 0.5}}}
    storage = Storage.from_dict(data)
    assert storage.protects("fc1.weight") and not storage.protects("fc2.weight")
    assert Storage.from_dict(storage.to_dict()) == storage
    assert "protected_tensors" not in Storage.from_dict({"protection": "secded"}).to_dict()
    everywhere = Storage.from_dict({**data, "protected_tensors": None})
    nowhere = Storage.from_dict({**data, "protection": "none", "protected_tensors": None})
    fmt, shape = bf.IntQuant(8), (32, 64)
    for name, like in (("fc1.weight", everywhere), ("fc2.weight", nowhere)):
        got = storage.random_map(shape, fmt, ber=0.05, seed=3, name=name)
        want = like.random_map(shape, fmt, ber=0.05, seed=3, name=name)
        assert got == want and got.meta["outcomes"] == want.meta["outcomes"]
        assert got.meta["outcomes"]["words"] > 0
    assert storage.random_map(shape, fmt, ber=0.05, seed=3, name="fc2.weight").n_faults > 0
    from bitfault.jobs.compare import memory_bits

    memory = bf.Memory(fmt, bf.BitFlip(), storage=storage)
    bits = memory_bits(memory, {"fc1.weight": shape, "fc2.weight": (10, 64)})
    assert bits == {"data_bits": 64 * (256 + 80), "check_bits": 8 * 256,
                    "physical_bits": 72 * 256 + 64 * 80}
    for bad in ([], [""], {"fc1": 1}, 3):
        with pytest.raises((ArgumentError, TypeError), match="protected_tensors"):
            Storage.from_dict({**data, "protected_tensors": bad})
