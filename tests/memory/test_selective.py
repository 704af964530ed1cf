"""Per-bit-position protection: chosen bits in protected words, the rest in unprotected ones.

The reference is a plain loop with Python ints: split every element into its protected
and unprotected fields, pack each part's fields (``word_bits // width`` to a word), encode
with the textbook codes of tests/ecc_reference.py, flip the drawn physical bits, decode,
and scatter each part's field errors back to the element's bit positions.
"""

from __future__ import annotations

import numpy as np
import pytest

import bitfault as bf
from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.faults.patterns import IndependentBits, MultiBitUpset
from bitfault.memory.codes import NoProtection, Parity, SecDed
from bitfault.memory.decode import pattern_at
from bitfault.memory.layout import WordLayout
from bitfault.memory.storage import Storage
from ecc_reference import CORRECTED, DUE, ref_check, ref_check_bits, ref_scheme


def reference_part(words, bits, positions, word_bits, kind, faults, policy="flag"):
    """({element: mask at its own bit positions}, counts) of one part, word by word."""
    m = len(positions)
    k = word_bits // m
    data_bits = k * m
    low = 2 ** m - 1
    flat = [int(v) & (2 ** bits - 1) for v in np.asarray(words).ravel()]
    fields = [sum(((w >> p) & 1) << i for i, p in enumerate(positions)) for w in flat]
    masks = {}
    counts = dict.fromkeys(("bit_errors", "words", "corrected", "due", "silent"), 0)
    for w, dmask, cmask in zip(faults.indices.tolist(), faults.data.tolist(),
                               faults.check.tolist(), strict=True):
        elems = [e for e in range(w * k, w * k + k) if e < len(flat)]
        data = sum(fields[e] << (m * (e - w * k)) for e in elems)
        check = ref_check(kind, data, data_bits)
        out, status = ref_scheme(kind, data ^ dmask, check ^ cmask, data_bits, policy)
        used = sum(low << (m * (e - w * k)) for e in elems)
        err = (out ^ data) & used
        counts["bit_errors"] += dmask.bit_count() + cmask.bit_count()
        counts["words"] += 1
        counts["due"] += status == DUE
        counts["corrected"] += status == CORRECTED and err == 0
        counts["silent"] += status != DUE and err != 0
        for e in elems:
            field = (err >> (m * (e - w * k))) & low
            mask = sum(((field >> i) & 1) << p for i, p in enumerate(positions))
            if mask:
                masks[e] = mask
    return masks, counts


def reference_split(words, bits, positions, word_bits, kind, pattern, rate, seed, name,
                    policy="flag"):
    """The merged element map and summed counts of both parts, drawn as the docs say."""
    rest = tuple(b for b in range(bits) if b not in positions)
    merged, total = {}, {}
    for part, part_kind, tag in ((positions, kind, "protected"), (rest, "none", "unprotected")):
        data_bits = (word_bits // len(part)) * len(part)
        n_words = -(-np.asarray(words).size // (word_bits // len(part)))
        faults = pattern_at(pattern, rate).draw(
            n_words, data_bits, ref_check_bits(part_kind, data_bits), seed=seed,
            name=f"{name}\x00{tag}")
        masks, counts = reference_part(words, bits, part, word_bits, part_kind, faults,
                                       policy)
        for e, mk in masks.items():
            merged[e] = merged.get(e, 0) | mk
        for key, v in counts.items():
            total[key] = total.get(key, 0) + v
    return merged, total


def as_dict(fmap):
    return {int(e): int(m) for e, m in zip(fmap.indices, fmap.masks, strict=True)}


CASES = [  # (format, positions, word_bits, scheme, pattern, rate)
    (bf.IntQuant(8), (7, 6), 64, SecDed(), IndependentBits(0.0), 0.02),
    (bf.IntQuant(8), (5, 7, 6), 64, SecDed(), MultiBitUpset(0.0, {1: 0.5, 2: 0.3, 3: 0.2}),
     0.3),  # 3-bit fields: 21 in 63 of 64 bits, SEC-DED (71,63); the rest 5 bits: 12 in 60
    (bf.IntQuant(8), (7,), 32, Parity(), IndependentBits(0.0), 0.03),
    (bf.FixedPoint(16, 8), (15, 14, 13, 12, 11), 32, SecDed(), IndependentBits(0.0), 0.02),
]


@pytest.mark.parametrize(("fmt", "positions", "word_bits", "scheme", "pattern", "rate"), CASES)
def test_split_plane_equals_the_reference_loop(fmt, positions, word_bits, scheme, pattern,
                                               rate):
    x = np.random.default_rng(word_bits).normal(0, 2, (13, 17)).astype(np.float32)
    storage = Storage(WordLayout(word_bits), scheme, pattern, protected_bits=positions)
    memory = bf.Memory(fmt, bf.BitFlip(), storage=storage)
    fmap = memory.random_map(x.shape, ber=rate, seed=7, name="fc.weight")
    words = fmt.encode(x, fmt.calibrate(x))
    want, counts = reference_split(words, fmt.bits, tuple(sorted(positions)), word_bits,
                                   scheme.kind, pattern, rate, 7, "fc.weight")
    assert len(want) > 5
    assert as_dict(fmap) == want
    got = fmap.meta["outcomes"]
    assert {k: got[k] for k in counts} == counts
    assert fmap.meta["protected_bits"] == sorted(positions)
    assert fmap == memory.random_map(x.shape, ber=rate, seed=7, name="fc.weight")
    # what the network sees: the clean words with those bits flipped
    faulty = np.bitwise_xor(words, fmap.to_dense(words.dtype))
    np.testing.assert_array_equal(bf.inject(x, fmt, bf.BitFlip(), fmap),
                                  fmt.decode(faulty, fmt.calibrate(x)))


def test_block_format_codes_split_and_scales_whole():
    fmt = bf.MX("float4_e2m1fn")
    storage = Storage(WordLayout(64), "secded", IndependentBits(0.0),
                      protected_bits={"codes": (3,)})
    memory = bf.Memory(fmt, bf.BitFlip(), storage=storage)
    x = np.random.default_rng(1).normal(size=(8, 64)).astype(np.float32)
    fmap = memory.random_map(x.shape, ber=0.02, seed=2, name="w")
    codes = fmt.encode(x)["codes"]
    want, _ = reference_split(codes, 4, (3,), 64, "secded", IndependentBits(0.0), 0.02, 2, "w")
    assert as_dict(fmap) == want
    whole = bf.Memory(fmt, bf.BitFlip(), storage=Storage(WordLayout(64), "secded"))
    assert fmap.planes["scale"] == whole.random_map(x.shape, ber=0.02, seed=2,
                                                    name="w").planes["scale"]
    assert storage.overhead(fmt) == {"codes": 8 / 64 / 4, "scale": 8 / 64}


def test_overhead_round_trip_and_config_form():
    fmt = bf.IntQuant(8)
    assert Storage(protection="secded", protected_bits=(7, 6)).overhead(fmt) == \
        {"codes": 8 / 32 / 8}
    assert Storage(protection="secded", protected_bits=(7, 6, 5)).overhead(fmt) == \
        {"codes": 8 / 21 / 8}  # 21 three-bit fields per (71,63) word
    assert Storage(protection="parity", protected_bits=(7,)).overhead(fmt) == \
        {"codes": 1 / 64 / 8}
    config = {"protection": "secded", "protected_bits": [7, 6]}
    storage = Storage.from_dict(config)
    assert storage.protected_bits == {"codes": (6, 7)}
    assert storage.to_dict()["protected_bits"] == {"codes": [6, 7]}
    assert Storage.from_dict(storage.to_dict()) == storage
    assert "protected_bits" not in Storage(protection="secded").to_dict()
    spec = bf.FaultSpec(format=fmt, ber=1e-3, storage=config)
    assert bf.FaultSpec.from_dict(spec.to_dict()) == spec
    plain = bf.FaultSpec(format=fmt, ber=1e-3, storage={"protection": "secded"})
    assert spec.memory.digest() != plain.memory.digest()


@pytest.mark.parametrize(("bits", "error", "match"), [
    ((8,), ArgumentError, r"protected_bits\['codes'\].*outside"),
    ((), ArgumentError, "protected_bits is empty"),
    ((7, 7), ArgumentError, r"distinct.*\[7\] more than once"),
    ((-1,), ArgumentError, ">= 0"),
    (tuple(range(8)), ArgumentError, "every bit"),
    ("7", ArgumentTypeError, "protected_bits"),
    ((True,), ArgumentTypeError, "ints"),
    ({"scale": (1,)}, ArgumentError, "protected_bits names plane 'scale'"),
    ({}, ArgumentError, "empty mapping"),
])
def test_bad_protected_bits_are_named_errors(bits, error, match):
    with pytest.raises(error, match=match) as info:
        bf.Memory(bf.IntQuant(8), bf.BitFlip(),
                  storage={"protection": "secded", "protected_bits": bits})
    assert info.value.argument.startswith("protected_bits")


def test_protected_bits_need_a_protected_plane():
    with pytest.raises(ArgumentError, match="no protection scheme") as info:
        bf.Memory(bf.MX("float4_e2m1fn"), bf.BitFlip(),
                  storage=Storage(protection={"scale": SecDed()},
                                  protected_bits={"codes": (3,)}))
    assert info.value.argument == "protected_bits['codes']"
    with pytest.raises(ArgumentError, match="no protection"):
        Storage(protection=NoProtection(), protected_bits=(7,)).check_for(bf.IntQuant(8))
