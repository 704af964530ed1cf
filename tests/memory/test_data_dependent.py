"""Data-dependent memories: policy "zero" and asymmetric cells, drawn with the stored words.

The reference is the plain loop a hardware model would run, with Python ints: encode the
clean tensor, pack its words, encode their check bits with the textbook codes of
tests/ecc_reference.py, draw the pattern (asymmetric cells with those stored words),
flip, decode (a detected word read back as 0 under "zero"), unpack, decode the values.
"""

from __future__ import annotations

import numpy as np
import pytest

import bitfault as bf
from bitfault.campaign import rate_sweep, run
from bitfault.campaign.evaluator import NumpyEvaluator, predicted_labels
from bitfault.campaign.runner import trial_maps
from bitfault.errors import ArgumentError
from bitfault.faults.patterns import Asymmetric, IndependentBits, MultiBitUpset
from bitfault.memory.codes import NoProtection, Parity, SecDed
from bitfault.memory.layout import WordLayout
from bitfault.memory.plane_maps import TensorWords
from bitfault.memory.storage import Storage
from bitfault.recipes import Recipe
from stored_reference import reference_values

MEMORIES = {
    "secded-zero": Storage(WordLayout(64), SecDed("zero"), IndependentBits(0.0)),
    "parity-zero-mbu": Storage(WordLayout(32), Parity("zero"),
                               MultiBitUpset(0.0, {1: 0.5, 2: 0.5})),
    "asymmetric": Storage(WordLayout(64), NoProtection(), Asymmetric(1.0, 0.25)),
    "asymmetric-secded-zero": Storage(WordLayout(32), SecDed("zero"), Asymmetric(1.0, 0.1)),
}


def _model():
    rng = np.random.default_rng(0)
    params = {"w1": rng.normal(size=(12, 8)).astype(np.float32),
              "w2": rng.normal(size=(8, 3)).astype(np.float32)}
    x = rng.normal(size=(48, 12)).astype(np.float32)

    def forward(p, xx):
        return np.maximum(xx @ p["w1"], 0) @ p["w2"]

    return forward, params, x, predicted_labels(forward(params, x))


@pytest.mark.parametrize("key", list(MEMORIES))
def test_a_campaign_equals_the_plain_loop_trial_for_trial(key, tmp_path):
    forward, params, x, labels = _model()
    evaluator = NumpyEvaluator(forward, params, x, labels)
    fmt = bf.IntQuant(8)
    storage = MEMORIES[key]
    memory = bf.Memory(fmt, bf.BitFlip(), storage=storage)
    assert memory.data_dependent
    rates = [0.01, 0.08] if "mbu" not in key else [0.1, 0.5]
    trials = rate_sweep(rates, 3, base_seed=4)
    result = run(evaluator, trials, memory, tmp_path / "dd.db")
    by_key = {r.trial_key: r.metrics for r in result.records}
    changed = 0
    for t in trials:
        faulty, due = {}, 0
        for name, clean in params.items():
            faulty[name], counts = reference_values(clean, fmt, storage, t.ber, t.seed, name)
            due += counts["due"]
        with np.errstate(all="ignore"):
            pred = predicted_labels(forward(faulty, x))
        assert by_key[t.key]["accuracy"] == pytest.approx(float(np.mean(pred == labels)))
        assert by_key[t.key]["words_due"] == due
        changed += int(np.any(pred != labels))
        # the maps themselves: the XOR maps turning the clean words into the read-back ones
        maps = trial_maps(t, memory, evaluator.tensor_shapes(), TensorWords(evaluator, fmt))
        for name, clean in params.items():
            np.testing.assert_array_equal(bf.inject(clean, fmt, bf.BitFlip(), maps[name]),
                                          faulty[name])
            assert maps[name].meta["data_dependent"] is True
    assert changed > 0  # the faults reached the predictions


def test_zero_policy_clears_detected_words():
    fmt = bf.FixedPoint(8, 4)
    x = np.random.default_rng(2).uniform(-7, 7, (32, 16)).astype(np.float32)
    memory = bf.Memory(fmt, bf.BitFlip(), storage=Storage(WordLayout(64), SecDed("zero")))
    fmap = memory.random_map(x.shape, ber=0.01, seed=1, name="w", values=x)
    assert fmap.meta["outcomes"]["due"] > 0
    faulty = np.bitwise_xor(fmt.encode(x), fmap.to_dense(np.int8)).reshape(-1, 8)
    clean = fmt.encode(x).reshape(-1, 8)
    zeroed = np.all(faulty == 0, axis=1) & np.any(clean != 0, axis=1)
    assert zeroed.sum() >= fmap.meta["outcomes"]["due"]


def test_asymmetric_one_to_zero_only_never_sets_a_bit():
    fmt = bf.IntQuant(8)
    x = np.random.default_rng(3).normal(size=(40, 40)).astype(np.float32)
    words = fmt.encode(x, fmt.calibrate(x)).astype(np.int64) & 0xFF
    for rate in (0.05, 0.3, 1.0):
        memory = bf.Memory(fmt, bf.BitFlip(),
                           storage=Storage(WordLayout(64), "none", Asymmetric(1.0, 0.0)))
        fmap = memory.random_map(x.shape, ber=rate, seed=5, name="w", values=x)
        assert fmap.n_faults > 0
        flat = words.reshape(-1)[fmap.indices]
        assert np.all(fmap.masks & ~flat == 0)  # only stored 1s fail
        if rate == 1.0:  # every 1 fails: all words read 0
            assert np.array_equal(np.sort(fmap.indices), np.flatnonzero(words.reshape(-1)))
            assert np.array_equal(fmap.masks, flat.astype(np.uint32))
    nested = [set(bf.Memory(fmt, bf.BitFlip(), storage=Storage(
        pattern=Asymmetric(1.0, 0.5))).random_map(x.shape, ber=r, seed=5, name="w",
                                                   values=x).indices.tolist())
        for r in (0.01, 0.05)]
    assert nested[0] <= nested[1]


def test_data_dependent_split_plane_zero_policy():
    """Policy zero on a split plane clears only the protected bits of a detected word."""
    fmt = bf.IntQuant(8)
    x = np.random.default_rng(4).normal(size=(64, 32)).astype(np.float32)
    storage = Storage(WordLayout(64), SecDed("zero"), protected_bits=(7, 6))
    memory = bf.Memory(fmt, bf.BitFlip(), storage=storage)
    fmap = memory.random_map(x.shape, ber=0.02, seed=9, name="w", values=x)
    flag = bf.Memory(fmt, bf.BitFlip(), storage=Storage(WordLayout(64), SecDed(),
                                                        protected_bits=(7, 6)))
    same = flag.random_map(x.shape, ber=0.02, seed=9, name="w")
    assert fmap.meta["outcomes"] == same.meta["outcomes"]
    words = fmt.encode(x, fmt.calibrate(x)).astype(np.int64).reshape(-1) & 0xFF
    diff = {int(e): int(m) for e, m in zip(fmap.indices, fmap.masks, strict=True)}
    base = {int(e): int(m) for e, m in zip(same.indices, same.masks, strict=True)}
    for e in set(diff) | set(base):  # the unprotected bits: the same flips under both
        assert diff.get(e, 0) & 0x3F == base.get(e, 0) & 0x3F
        if diff.get(e, 0) & 0xC0 != base.get(e, 0) & 0xC0:  # a zeroed protected field
            assert diff.get(e, 0) & 0xC0 == words[e] & 0xC0
    assert fmap.meta["outcomes"]["due"] > 0 and diff != base


def test_training_and_live_maps_refuse_a_data_dependent_memory(tmp_path):
    spec = bf.FaultSpec(format=bf.IntQuant(8), ber=1e-2, storage={
        "protection": {"kind": "secded", "policy": "zero"}})
    with pytest.raises(ArgumentError, match="values change every step") as info:
        spec.map_for("w", (4, 4))
    assert info.value.argument == "storage"
    x = np.ones((4, 4), np.float32)
    assert spec.map_for("w", (4, 4), values=x).meta["data_dependent"]
    with pytest.raises(ArgumentError, match="training changes them") as info:
        Recipe(format=None, fault_aware=spec)
    assert info.value.argument == "fault_aware.storage"
    asym = bf.Memory(bf.IntQuant(8), bf.BitFlip(),
                     storage={"pattern": {"kind": "asymmetric", "p10": 1.0, "p01": 0.0}})
    assert asym.data_dependent and asym.storage.to_dict()["pattern"] == {
        "kind": "asymmetric", "p10": 1.0, "p01": 0.0}

    class NoValues:  # an evaluator that cannot give its clean tensors
        labels = np.zeros(2, np.int64)

        def tensor_shapes(self):
            return {"w": (4, 4)}

    store = tmp_path / "never.db"
    with pytest.raises(ArgumentError, match="clean_tensor") as info:
        run(NoValues(), rate_sweep([0.1], 1), asym, store)
    assert info.value.argument == "memory" and not store.exists()
