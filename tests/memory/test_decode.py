"""decode_faults against a plain loop over memory words with the Python-int reference code."""

from __future__ import annotations

import numpy as np
import pytest

import bitfault as bf
from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.faults.patterns import (
    Asymmetric,
    ColumnFaults,
    IndependentBits,
    MultiBitUpset,
    RowFaults,
    WordFaults,
)
from bitfault.memory.codes import NoProtection, Parity, SecDed
from bitfault.memory.decode import decode_faults, draw_decoded_map, stored_words
from bitfault.memory.layout import WordLayout
from ecc_reference import (
    CORRECTED,
    DUE,
    from_array,
    ref_check,
    ref_check_bits,
    ref_scheme,
    to_array,
)

SCHEMES = [NoProtection(), Parity(), Parity("zero"), SecDed(), SecDed("zero")]


def reference(words: np.ndarray, bits: int, word_bits: int, scheme, faults: WordFaults):
    """({element: xor mask}, {element zeroed}, outcome counts) by a loop over faulty words."""
    kind, policy = scheme.kind, getattr(scheme, "policy", "flag")
    k = word_bits // bits
    low = 2 ** bits - 1
    flat = [int(v) & low for v in words.ravel()]
    n = len(flat)
    xor, zeroed = {}, set()
    counts = {"bit_errors": 0, "words": 0, "corrected": 0, "due": 0, "silent": 0}
    for w, dmask, cmask in zip(faults.indices, from_array(faults.data), faults.check,
                               strict=True):
        w, dmask, cmask = int(w), int(dmask), int(cmask)
        elements = [w * k + i for i in range(k)]
        data = sum(flat[e] << (i * bits) for i, e in enumerate(elements) if e < n)
        check = ref_check(kind, data, word_bits)
        out, status = ref_scheme(kind, data ^ dmask, check ^ cmask, word_bits, policy)
        used = sum(low << (i * bits) for i, e in enumerate(elements) if e < n)
        err = (out ^ data) & used
        counts["bit_errors"] += dmask.bit_count() + cmask.bit_count()
        counts["words"] += 1
        counts["due"] += status == DUE
        counts["corrected"] += status == CORRECTED and err == 0
        counts["silent"] += status != DUE and err != 0
        for i, e in enumerate(elements):
            m = (err >> (i * bits)) & low
            if m:
                xor[e] = m
            if e < n and status == DUE and policy == "zero":
                zeroed.add(e)
    return xor, zeroed, counts


def as_dict(fmap) -> dict[int, int]:
    return {int(e): int(m) for e, m in zip(fmap.indices, fmap.masks, strict=True)}


CASES = [  # (format, shape, word_bits)
    (bf.FixedPoint(8, 4), (7, 9), 64),
    (bf.FixedPoint(16, 8), (5, 5), 32),
    (bf.Float("float32"), (33,), 64),
    (bf.FixedPoint(8, 4), (50,), 8),
    (bf.FixedPoint(4, 2), (3, 11), 16),
    # wider than 64 data bits: (137,128) and (266,256) SEC-DED, codes straddling lanes
    (bf.FixedPoint(8, 4), (7, 9), 128),
    (bf.Float("float32"), (33,), 128),
    (bf.FixedPoint(12, 6), (5, 7), 96),
    (bf.FixedPoint(16, 8), (41,), 256),
]


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: str(s.to_dict()))
@pytest.mark.parametrize(("fmt", "shape", "word_bits"), CASES)
@pytest.mark.parametrize("pattern", [IndependentBits(0.04),
                                     MultiBitUpset(0.6, {1: 0.4, 2: 0.3, 3: 0.3})])
def test_decode_faults_equals_the_reference_loop(scheme, fmt, shape, word_bits,
                                                 pattern) -> None:
    rng = np.random.default_rng(word_bits)
    x = rng.normal(0, 2, shape).astype(np.float32)
    words = fmt.encode(x)
    layout = WordLayout(word_bits)
    n_words = layout.n_words(words.size, fmt.bits)
    check_bits = scheme.check_bits(word_bits)
    assert check_bits == ref_check_bits(scheme.kind, word_bits)
    faults = pattern.draw(n_words, word_bits, check_bits, seed=1, name="w")
    before = words.copy()
    got = decode_faults(words, fmt.bits, layout, scheme, faults, name="w")
    assert np.array_equal(words, before)
    xor, zeroed, counts = reference(words, fmt.bits, word_bits, scheme, faults)
    assert as_dict(got.xor) == xor
    assert set(as_dict(got.zeroed)) == zeroed
    assert all(m == 2 ** fmt.bits - 1 for m in as_dict(got.zeroed).values())
    assert as_dict(got.flips) == {e: m for e, m in xor.items() if e not in zeroed}
    o = got.outcomes
    assert (o.bit_errors, o.words, o.corrected, o.due, o.silent) == tuple(counts.values())
    assert o.masked >= 0 and got.xor.shape == words.shape and got.xor.name == "w"
    # the map, applied by bitfault's pipeline as bit flips, gives the decoded values
    faulty = bf.inject(x, fmt, bf.BitFlip(), got.xor)
    low = 2 ** fmt.bits - 1
    flat = [(int(v) & low) ^ xor.get(i, 0) for i, v in enumerate(words.ravel())]
    signed = np.array([v - (v >> (fmt.bits - 1) << fmt.bits) for v in flat], np.int64)
    want = fmt.decode(signed.astype(words.dtype).reshape(shape))
    np.testing.assert_array_equal(faulty, want)


def test_outcomes_cover_every_kind_under_secded() -> None:
    fmt = bf.FixedPoint(8, 4)
    words = fmt.encode(np.random.default_rng(0).normal(0, 2, 4000).astype(np.float32))
    layout = WordLayout(64)
    faults = MultiBitUpset(0.3, {1: 0.5, 2: 0.3, 3: 0.2}).draw(500, 64, 8, seed=2, name="w")
    o = decode_faults(words, 8, layout, SecDed(), faults).outcomes
    assert o.corrected > 0 and o.due > 0 and o.silent > 0  # triples miscorrect or escape
    assert o.corrected + o.due + o.silent + o.masked == o.words == len(faults)


def test_flag_maps_do_not_depend_on_the_data() -> None:
    fmt = bf.FixedPoint(8, 4)
    rng = np.random.default_rng(5)
    a = fmt.encode(rng.normal(0, 2, 800).astype(np.float32))
    b = fmt.encode(rng.normal(0, 2, 800).astype(np.float32))
    layout = WordLayout(32)
    for scheme in (SecDed(), Parity(), SecDed("zero")):
        faults = IndependentBits(0.03).draw(200, 32, scheme.check_bits(32), seed=3, name="w")
        da = decode_faults(a, 8, layout, scheme, faults)
        db = decode_faults(b, 8, layout, scheme, faults)
        assert as_dict(da.flips) == as_dict(db.flips)
        assert as_dict(da.zeroed) == as_dict(db.zeroed)
        assert da.outcomes == db.outcomes


def test_stored_words_are_the_packed_data_and_its_check_bits() -> None:
    words = np.arange(-8, 8, dtype=np.int8)
    data, check = stored_words(words, 8, WordLayout(32), SecDed())
    assert [int(d) for d in data] == [0xFBFAF9F8, 0xFFFEFDFC, 0x03020100, 0x07060504]
    assert [int(c) for c in check] == [ref_check("secded", int(d), 32) for d in data]
    d2, c2 = stored_words(words, 8, WordLayout(32), SecDed(), which=[2])
    assert int(d2[0]) == int(data[2]) and int(c2[0]) == int(check[2])


def test_bad_input_is_named_before_anything_changes() -> None:
    words = np.zeros(16, np.int8)
    layout = WordLayout(64)
    ok = WordFaults(np.array([1]), np.array([1], np.uint64), np.array([0], np.uint64))
    # a word past the last, a check bit past SEC-DED's 8, one past parity's 1
    for scheme, word, data, check in [(SecDed(), 2, 1, 0), (SecDed(), 0, 0, 256),
                                      (Parity(), 0, 0, 2)]:
        bad = WordFaults(np.array([word]), np.array([data], np.uint64),
                         np.array([check], np.uint64))
        with pytest.raises(ArgumentError) as e:
            decode_faults(words, 8, layout, scheme, bad)
        assert e.value.argument == "faults"
    with pytest.raises(ArgumentError) as e:
        decode_faults(words, 6, layout, SecDed(), ok)
    assert e.value.argument == "word_bits"
    with pytest.raises(ArgumentTypeError) as e:
        decode_faults(words, 8, layout, "secded", ok)
    assert e.value.argument == "protection"
    with pytest.raises(ArgumentTypeError) as e:
        decode_faults(words, 8, {"word_bits": 64}, SecDed(), ok)
    assert e.value.argument == "layout"
    with pytest.raises(ArgumentTypeError) as e:
        decode_faults(words, 8, layout, SecDed(), (np.array([0]), np.array([1])))
    assert e.value.argument == "faults"
    with pytest.raises(ArgumentError) as e:
        WordFaults(np.array([3, 1]), np.array([1, 1], np.uint64), np.array([0, 0], np.uint64))
    assert e.value.argument == "indices"


@pytest.mark.parametrize("scheme", [NoProtection(), SecDed()], ids=lambda s: s.kind)
def test_asymmetric_faults_from_the_stored_words(scheme) -> None:
    fmt = bf.FixedPoint(8, 4)
    words = fmt.encode(np.random.default_rng(1).normal(0, 2, 203).astype(np.float32))
    layout = WordLayout(64)
    data, check = stored_words(words, 8, layout, scheme)
    faults = Asymmetric(0.05, 0.0).draw(data.size, 64, scheme.check_bits(64), seed=0,
                                        name="w", stored=(data, check))
    assert not (faults.data & ~data[faults.indices]).any()  # only stored 1s fail
    got = decode_faults(words, 8, layout, scheme, faults)
    xor, zeroed, counts = reference(words, 8, 64, scheme, faults)
    assert as_dict(got.xor) == xor and not zeroed
    assert tuple(got.outcomes.to_dict().values())[:5] == tuple(counts.values())


@pytest.mark.parametrize("scheme", [NoProtection(), Parity(), SecDed()], ids=lambda s: s.kind)
@pytest.mark.parametrize("interleave", [1, 2])
def test_every_pattern_on_128_bit_words_equals_the_reference_loop(scheme, interleave) -> None:
    fmt = bf.FixedPoint(8, 4)
    words = fmt.encode(np.random.default_rng(3).normal(0, 2, 613).astype(np.float32))
    layout = WordLayout(128, row_words=4, interleave=interleave)
    n_words = layout.n_words(words.size, 8)  # 39 words of 16 codes, the last padded
    check_bits = scheme.check_bits(128)
    data, check = stored_words(words, 8, layout, scheme)
    assert data.shape == (n_words, 2) and check.shape == (n_words,)
    assert from_array(check) == [ref_check(scheme.kind, d, 128) for d in from_array(data)]
    patterns = [IndependentBits(0.01), MultiBitUpset(0.5, {1: 0.3, 2: 0.3, 3: 0.4}),
                ColumnFaults(0.01), RowFaults(0.3), Asymmetric(0.01, 0.005)]
    for pattern in patterns:
        faults = pattern.draw(n_words, 128, check_bits, seed=2, name="w", row_words=4,
                              interleave=interleave, stored=(data, check))
        assert faults.data.shape == (len(faults), 2) and len(faults) > 3, pattern
        assert max(from_array(faults.data)) < 1 << 128
        got = decode_faults(words, 8, layout, scheme, faults, name="w")
        xor, zeroed, counts = reference(words, 8, 128, scheme, faults)
        assert as_dict(got.xor) == xor and not zeroed, pattern
        assert tuple(got.outcomes.to_dict().values())[:5] == tuple(counts.values()), pattern


def test_interleaving_lets_secded_correct_adjacent_upsets() -> None:
    """A k-bit upset (k <= d) hits k words one bit each: SEC-DED corrects every word hit
    once and detects every word hit twice (two events in one group), never miscorrects."""
    fmt = bf.FixedPoint(8, 4)
    words = fmt.encode(np.random.default_rng(0).normal(0, 2, 64 * 2000).astype(np.float32))
    pattern = MultiBitUpset(0.02, {2: 0.5, 3: 0.5})
    results = {}
    for d in (1, 4):
        layout = WordLayout(64, row_words=16, interleave=d)
        faults = pattern.draw(16000, 64, 8, seed=4, name="w", row_words=16, interleave=d)
        o = decode_faults(words, 8, layout, SecDed(), faults).outcomes
        weights = [int(m).bit_count() + int(c).bit_count()
                   for m, c in zip(faults.data, faults.check, strict=True)]
        results[d] = o
        if d == 4:
            assert o.corrected == weights.count(1) > 0 and o.due == weights.count(2)
            assert o.silent == 0 and max(weights) <= 2
    assert results[1].corrected < results[1].words // 10  # without: mostly doubles, triples
    assert results[1].silent > 0 and results[4].corrected > 10 * results[1].corrected


@pytest.mark.parametrize("word_bits", [64, 128])
def test_draw_decoded_map_reads_the_layouts_interleave(word_bits) -> None:
    shape, bits = (9, 40), 8
    pattern = MultiBitUpset(0.0, {1: 0.5, 3: 0.5})
    for d in (1, 3):
        layout = WordLayout(word_bits, row_words=6, interleave=d)
        fmap = draw_decoded_map(shape, bits, rate=0.3, seed=1, name="w", step=None,
                                layout=layout, protection=SecDed(), pattern=pattern)
        n_words = layout.n_words(360, bits)
        faults = MultiBitUpset(0.3, {1: 0.5, 3: 0.5}).draw(
            n_words, word_bits, SecDed().check_bits(word_bits), seed=1, name="w",
            row_words=6, interleave=d)
        xor, _, counts = reference(np.zeros(shape, np.int64), bits, word_bits, SecDed(),
                                   faults)
        assert as_dict(fmap) == xor and fmap.meta["outcomes"]["due"] == counts["due"]
        assert fmap.meta["layout"] == layout.to_dict()
        assert ("interleave" in fmap.meta["layout"]) == (d != 1)


def test_wide_faults_with_the_wrong_lanes_are_refused() -> None:
    words = np.zeros(40, np.int8)
    layout = WordLayout(128)
    narrow = WordFaults(np.array([1]), np.array([1], np.uint64), np.array([0], np.uint64))
    with pytest.raises(ArgumentError) as e:
        decode_faults(words, 8, layout, SecDed(), narrow)
    assert e.value.argument == "faults"
    over = WordFaults(np.array([0]), to_array([1], 128), np.array([1 << 9], np.uint64))
    with pytest.raises(ArgumentError) as e:  # (137,128) has 9 check bits
        decode_faults(words, 8, layout, SecDed(), over)
    assert e.value.argument == "faults"
    top = WordFaults(np.array([0]), np.array([[0, 1 << 40]], np.uint64),
                     np.zeros(1, np.uint64))
    with pytest.raises(ArgumentError) as e:  # bit 104 of a 100-bit word
        decode_faults(np.zeros(40, np.int8), 4, WordLayout(100), SecDed(), top)
    assert e.value.argument == "faults"
    empty = decode_faults(words, 8, layout, SecDed(), WordFaults.empty(128))
    assert empty.outcomes.words == 0 and empty.xor.indices.size == 0
