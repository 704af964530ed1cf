"""Protection codes against the independent textbook reference (tests/ecc_reference.py,
Python ints)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.memory.codes import (
    CORRECTED,
    DUE,
    OK,
    NoProtection,
    Parity,
    SecDed,
    protection_from_dict,
)
from ecc_reference import flip, from_array, random_words, ref_decode, ref_encode, to_array

WIDTHS = (8, 12, 16, 24, 32, 57, 64, 65, 100, 128, 256)  # above 64: (n, lanes) uint64 words


def decode_many(code, cases: list[tuple[int, int]], k: int) -> tuple[list[int], list[int]]:
    d = to_array([x for x, _ in cases], k)
    c = np.array([y for _, y in cases], np.uint64)
    out, status = code.decode(d, c, k)
    assert out.shape == d.shape and status.shape == c.shape
    return from_array(out), [int(s) for s in status]


# ---- SEC-DED ----------------------------------------------------------------------------

@pytest.mark.parametrize("k", WIDTHS)
def test_secded_encode_matches_reference(k: int) -> None:
    words = random_words(k, 200, k)
    got = SecDed().encode(to_array(words, k), k)
    assert got.dtype == np.uint64 and got.shape == (len(words),)
    assert [int(x) for x in got] == [ref_encode(w, k) for w in words]


@pytest.mark.parametrize(("k", "n"), [(8, 13), (16, 22), (32, 39), (64, 72), (128, 137),
                                      (256, 266)])
def test_secded_code_sizes(k: int, n: int) -> None:
    assert k + SecDed().check_bits(k) == n


def test_overheads() -> None:
    assert SecDed().overhead(32) == 7 / 32
    assert SecDed().overhead(64) == 8 / 64
    assert SecDed().overhead(8) == 5 / 8
    assert SecDed().overhead(128) == 9 / 128 and Parity().overhead(128) == 1 / 128
    assert Parity().overhead(64) == 1 / 64
    assert NoProtection().overhead(32) == 0.0
    assert NoProtection().check_bits(64) == 0 and Parity().check_bits(16) == 1


@pytest.mark.parametrize("k", WIDTHS)
def test_secded_corrects_every_single_error(k: int) -> None:
    code = SecDed()
    width = k + code.check_bits(k)
    words = random_words(k, 6, 100 + k)
    cases, clean = [], []
    for w in words:
        c = ref_encode(w, k)
        for p in range(width):
            cases.append(flip(w, c, k, (p,)))
            clean.append(w)
    out, status = decode_many(code, cases, k)
    assert out == clean
    assert status == [CORRECTED] * len(cases)
    assert [ref_decode(d, c, k) for d, c in cases] == list(zip(clean, status, strict=True))


@pytest.mark.parametrize("k", WIDTHS)
@pytest.mark.parametrize("policy", ["flag", "zero"])
def test_secded_detects_every_double_error(k: int, policy: str) -> None:
    code = SecDed(policy)
    width = k + code.check_bits(k)
    w = random_words(k, 1, 200 + k)[-1]
    c = ref_encode(w, k)
    cases = [flip(w, c, k, pair) for pair in itertools.combinations(range(width), 2)]
    out, status = decode_many(code, cases, k)
    assert status == [DUE] * len(cases)
    assert all(ref_decode(d, cc, k)[1] == DUE for d, cc in cases[:300])
    expected = [0] * len(cases) if policy == "zero" else [d for d, _ in cases]
    assert out == expected


@pytest.mark.parametrize("k", WIDTHS)
def test_secded_triple_errors_decode_as_the_reference(k: int) -> None:
    code = SecDed()
    width = k + code.check_bits(k)
    triples = list(itertools.combinations(range(width), 3))
    if len(triples) > 1500:
        rng = np.random.default_rng(k)
        triples = [triples[i] for i in rng.choice(len(triples), 1500, replace=False)]
    w = random_words(k, 1, 300 + k)[-1]
    c = ref_encode(w, k)
    cases = [flip(w, c, k, t) for t in triples]
    out, status = decode_many(code, cases, k)
    ref = [ref_decode(d, cc, k) for d, cc in cases]
    assert list(zip(out, status, strict=True)) == ref
    # a triple error is never silently "ok": it is miscorrected (a wrong word) or detected
    assert OK not in status
    assert all(o != w for o, s in zip(out, status, strict=True) if s == CORRECTED)


def test_secded_shortened_code_flags_syndromes_outside_the_code() -> None:
    # (13,8): syndromes 13..15 name no position; some triple errors reach them
    k, code = 8, SecDed()
    cases = [flip(0, 0, k, t) for t in itertools.combinations(range(13), 3)]
    _, status = decode_many(code, cases, k)
    refs = [ref_decode(d, c, k)[1] for d, c in cases]
    assert status == refs and DUE in status and CORRECTED in status


def test_secded_clean_words_decode_ok() -> None:
    for k in WIDTHS:
        words = to_array(random_words(k, 50, k), k)
        for code in (SecDed(), Parity(), NoProtection()):
            out, status = code.decode(words, code.encode(words, k), k)
            assert np.array_equal(out, words) and not status.any()
            assert status.dtype == np.uint8 and status.shape == (52,)


# ---- parity -----------------------------------------------------------------------------

@pytest.mark.parametrize("k", (8, 32, 64, 128, 200))
@pytest.mark.parametrize("weight", (1, 2, 3, 4))
def test_parity_detects_odd_misses_even(k: int, weight: int) -> None:
    rng = np.random.default_rng(weight * 100 + k)
    words = random_words(k, 40, k)
    cases = []
    for w in words:
        c = sum((w >> j) & 1 for j in range(k)) % 2
        for _ in range(10):
            positions = tuple(int(p) for p in rng.choice(k + 1, weight, replace=False))
            cases.append(flip(w, c, k, positions))
    for policy in ("flag", "zero"):
        out, status = decode_many(Parity(policy), cases, k)
        want = DUE if weight % 2 else OK
        assert status == [want] * len(cases)
        expected = [0 if (policy == "zero" and want == DUE) else d for d, _ in cases]
        assert out == expected


def test_parity_encode_is_the_even_parity_bit() -> None:
    for k in (64, 128, 256):
        words = random_words(k, 300, 7)
        got = Parity().encode(to_array(words, k), k)
        assert [int(x) for x in got] == [bin(w).count("1") % 2 for w in words]


def test_no_protection_passes_errors_through() -> None:
    d = np.array([1, 2, 3], np.uint64)
    out, status = NoProtection().decode(d, NoProtection().encode(d, 8), 8)
    assert np.array_equal(out, d) and not status.any() and out is not d


# ---- dicts and bad input ------------------------------------------------------------------

@pytest.mark.parametrize("scheme", [NoProtection(), Parity(), Parity("zero"), SecDed(),
                                    SecDed("zero")])
def test_dict_round_trip(scheme) -> None:
    assert protection_from_dict(scheme.to_dict()) == scheme
    assert type(scheme).from_dict(scheme.to_dict()) == scheme
    assert scheme.to_dict()["kind"] in ("none", "parity", "secded")


def test_kind_names() -> None:
    assert protection_from_dict("secded") == SecDed()
    assert SecDed("zero").to_dict() == {"kind": "secded", "policy": "zero"}
    assert NoProtection().to_dict() == {"kind": "none"}


def test_bad_input_names_the_argument() -> None:
    with pytest.raises(ArgumentError) as e:
        protection_from_dict({"kind": "hamming"})
    assert e.value.argument == "protection.kind" and "secded" in e.value.allowed
    with pytest.raises(ArgumentError) as e:
        protection_from_dict({"kind": "none", "policy": "zero"})
    assert e.value.argument == "protection"
    with pytest.raises(ArgumentError) as e:
        SecDed(policy="drop")
    assert e.value.argument == "policy" and "zero" in e.value.allowed
    for bad in (7, 257, True, 8.0):
        with pytest.raises(ArgumentError) as e:
            SecDed().check_bits(bad)
        assert e.value.argument == "data_bits"
    with pytest.raises(ArgumentError) as e:
        SecDed().encode(np.array([256], np.uint64), 8)
    assert e.value.argument == "data"
    with pytest.raises(ArgumentTypeError) as e:
        Parity().encode(np.array([1.0]), 8)
    assert e.value.argument == "data"
    with pytest.raises(ArgumentError) as e:
        SecDed().decode(np.array([1], np.uint64), np.array([1, 2], np.uint64), 8)
    assert e.value.argument == "check"
    with pytest.raises(ArgumentError) as e:
        SecDed().decode(np.array([1], np.uint64), np.array([64], np.uint64), 8)
    assert e.value.argument == "check"
    # wide words: (n, lanes) arrays of the right lanes, the top lane within the width
    for code in (SecDed(), Parity(), NoProtection()):
        with pytest.raises(ArgumentError) as e:
            code.encode(np.zeros(3, np.uint64), 128)
        assert e.value.argument == "data"
        with pytest.raises(ArgumentError) as e:
            code.encode(np.zeros((3, 3), np.uint64), 128)
        assert e.value.argument == "data"
    with pytest.raises(ArgumentError) as e:
        SecDed().encode(np.array([[0, 1 << 36]], np.uint64), 100)  # bit 100 of 100 bits
    assert e.value.argument == "data"
    with pytest.raises(ArgumentError) as e:
        SecDed().decode(np.zeros((3, 2), np.uint64), np.zeros(2, np.uint64), 128)
    assert e.value.argument == "check"
    with pytest.raises(ArgumentError) as e:
        SecDed().decode(np.zeros((1, 2), np.uint64), np.array([1 << 9], np.uint64), 128)
    assert e.value.argument == "check"


def test_decode_does_not_change_its_input() -> None:
    d = np.array([5, 6], np.uint64)
    c = SecDed().encode(d, 16)
    d[0] ^= np.uint64(1)
    before = d.copy()
    SecDed("zero").decode(d, c, 16)
    assert np.array_equal(d, before)
