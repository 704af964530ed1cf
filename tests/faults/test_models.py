"""Fault models against the reference: XOR / AND NOT / OR on words, and bit selections."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import reference as ref
from bitfault.faults import BitFlip, StuckAt, fault_from_dict, resolve_bits
from bitfault.formats import FixedPoint, Float, IntQuant

FORMATS = [FixedPoint(32, 28, "trunc"), FixedPoint(16, 8), FixedPoint(8, 3), FixedPoint(5, 5),
           IntQuant(8), IntQuant(12, symmetric=False), IntQuant(2), Float("float32"),
           Float("float16"), Float("bfloat16")]
FAULTS = [("flip", 0, BitFlip), ("stuck", 0, lambda bits=None: StuckAt(0, bits=bits)),
          ("stuck", 1, lambda bits=None: StuckAt(1, bits=bits))]


def selections(fmt):
    """Bit selections to try on ``fmt``: None, every field name, positions, mixtures."""
    fields = ref.fields_of(fmt)
    top = fmt.bits - 1
    out = [(None, list(range(fmt.bits)))]
    out += [(name, positions) for name, positions in fields.items() if positions]
    out += [(0, [0]), (top, [top]), ([top, 0, 0], [0, top]), ((1, "msb"), [1, top]),
            (["sign", "lsb"], [0, top]), (np.int64(top), [top])]
    return out


def random_words_and_masks(fmt, rng, n=3000):
    info = np.iinfo(fmt.container)
    words = rng.integers(info.min, info.max, n, endpoint=True).astype(fmt.container)
    masks = rng.integers(0, 2**fmt.bits, n, dtype=np.int64)
    masks[: n // 10] = 0
    masks[n // 10: n // 5] = 2**fmt.bits - 1
    sparse = np.zeros(n, np.int64)
    for _ in range(3):  # one, two or three bits, the common case
        sparse |= np.int64(1) << rng.integers(0, fmt.bits, n)
    masks[n // 2:] = sparse[n // 2:]
    return words, masks


def to_container(masks: np.ndarray, fmt) -> np.ndarray:
    """uint patterns -> the signed container (same bits), as fault.apply expects."""
    width = np.dtype(fmt.container).itemsize
    return masks.astype(f"u{width}").view(fmt.container)


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
@pytest.mark.parametrize("kind,value,make", FAULTS, ids=["flip", "stuck0", "stuck1"])
def test_apply_matches_reference(fmt, kind, value, make, rng):
    words, masks = random_words_and_masks(fmt, rng)
    fault = make()
    out = fault.apply(words, to_container(masks, fmt))
    assert out.dtype == words.dtype and out.shape == words.shape
    expected = [ref.apply_fault(w, m, kind, value)
                for w, m in zip(ref.low_words(words, fmt.bits), masks.tolist(), strict=True)]
    assert ref.low_words(out, fmt.bits) == expected
    # the words given are not touched
    assert ref.low_words(words, fmt.bits) == ref.low_words(words.copy(), fmt.bits)


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
@pytest.mark.parametrize("kind,value,make", FAULTS, ids=["flip", "stuck0", "stuck1"])
def test_bit_selection_matches_reference_fields(fmt, kind, value, make, rng):
    words, masks = random_words_and_masks(fmt, rng, n=500)
    for selection, positions in selections(fmt):
        fault = make(bits=selection)
        eligible = ref.mask_of(positions)
        assert fault.eligible_bits(fmt) == tuple(sorted(set(positions))), selection
        assert fault.eligible_mask(fmt) == eligible, selection
        out = fault.apply(words, to_container(masks & eligible, fmt))
        expected = [ref.apply_fault(w, m & eligible, kind, value)
                    for w, m in zip(ref.low_words(words, fmt.bits), masks.tolist(), strict=True)]
        assert ref.low_words(out, fmt.bits) == expected, selection
        # nothing outside the selection changed
        changed = [a ^ b for a, b in zip(ref.low_words(out, fmt.bits),
                                         ref.low_words(words, fmt.bits), strict=True)]
        assert all(c & ~eligible == 0 for c in changed)


@pytest.mark.parametrize("kind,value,make", FAULTS, ids=["flip", "stuck0", "stuck1"])
def test_changed_bits_is_what_apply_changed(kind, value, make, rng):
    fmt = FixedPoint(16, 8)
    words, masks = random_words_and_masks(fmt, rng, n=500)
    fault = make()
    changed = fault.changed_bits(words, to_container(masks, fmt))
    low = ref.low_words(words, 16)
    expected = [ref.apply_fault(w, m, kind, value) ^ w for w, m in zip(low, masks.tolist(),
                                                                      strict=True)]
    assert ref.low_words(changed, 16) == expected
    if kind == "stuck":  # a stuck-at fault only changes bits that differ from its value
        held = [w if value == 1 else ~w for w in low]
        assert all(c & h == 0 for c, h in zip(expected, held, strict=True))


word32 = st.integers(-(2**31), 2**31 - 1)
mask32 = st.integers(0, 2**32 - 1)


@given(words=st.lists(word32, min_size=1, max_size=30), data=st.data())
def test_flip_twice_is_identity(words, data):
    w = np.array(words, dtype=np.int32)
    m = np.array(data.draw(st.lists(mask32, min_size=len(words), max_size=len(words))),
                 dtype=np.uint32).view(np.int32)
    flip = BitFlip()
    once = flip.apply(w, m)
    assert np.array_equal(flip.apply(once, m), w)
    assert np.array_equal(once != w, m != 0)


@given(words=st.lists(word32, min_size=1, max_size=30), data=st.data(),
       value=st.sampled_from([0, 1]))
def test_stuck_at_is_idempotent(words, data, value):
    w = np.array(words, dtype=np.int32)
    m = np.array(data.draw(st.lists(mask32, min_size=len(words), max_size=len(words))),
                 dtype=np.uint32).view(np.int32)
    stuck = StuckAt(value)
    once = stuck.apply(w, m)
    assert np.array_equal(stuck.apply(once, m), once)
    # every masked bit now holds the value; others are as they were
    u, mu, ou = w.view(np.uint32), m.view(np.uint32), once.view(np.uint32)
    assert np.array_equal(ou & mu, mu if value else np.zeros_like(mu))
    assert np.array_equal(ou & ~mu, u & ~mu)


@pytest.mark.parametrize("fault", [BitFlip(), BitFlip(bits="msb"), BitFlip(bits=(0, 3, 7)),
                                   StuckAt(0), StuckAt(1, bits=["sign", 2]), StuckAt(1, bits=5),
                                   BitFlip(bits=np.array([1, 2])), StuckAt(0, bits="exponent")],
                         ids=repr)
def test_fault_dict_round_trip(fault):
    data = json.loads(json.dumps(fault.to_dict()))
    again = fault_from_dict(data)
    assert again == fault
    assert again.eligible_mask(Float("bfloat16")) == fault.eligible_mask(Float("bfloat16"))


def test_fault_from_dict_rejects_bad_input():
    with pytest.raises(ValueError, match="'bit_flip' or 'stuck_at'"):
        fault_from_dict({"kind": "glitch"})
    with pytest.raises(ValueError, match=r"unknown key.*'rate'.*allowed"):
        fault_from_dict({"kind": "bit_flip", "rate": 1})
    with pytest.raises(ValueError, match="needs 'value'"):
        fault_from_dict({"kind": "stuck_at"})
    with pytest.raises(ValueError, match="kind"):
        fault_from_dict([1, 2])


@pytest.mark.parametrize("value", [2, -1, True, "1", None])
def test_stuck_at_value_must_be_0_or_1(value):
    with pytest.raises(ValueError, match=r"value must be 0 or 1"):
        StuckAt(value)


def test_unknown_field_name_rejected_naming_argument_and_allowed_fields():
    with pytest.raises(ValueError, match=r"bits: unknown bit field 'exponent' for FixedPoint; "
                                         r"allowed: \['all', 'fraction', 'integer', 'lsb', "
                                         r"'msb', 'sign'\]"):
        BitFlip(bits="exponent").eligible_mask(FixedPoint(8, 4))
    with pytest.raises(ValueError, match=r"unknown bit field 'integer' for Float.*'mantissa'"):
        StuckAt(1, bits=["sign", "integer"]).eligible_mask(Float("float16"))


def test_bit_positions_outside_the_word_rejected():
    with pytest.raises(ValueError, match=r"bits: bit position 8 is outside 0\.\.7"):
        BitFlip(bits=8).eligible_mask(FixedPoint(8, 4))
    with pytest.raises(ValueError, match=r"outside 0\.\.15"):
        BitFlip(bits=[-1]).eligible_mask(Float("bfloat16"))
    with pytest.raises(ValueError, match="selects no bit position"):
        BitFlip(bits=[]).eligible_mask(Float("float32"))
    with pytest.raises(TypeError, match="ints or field names"):
        BitFlip(bits=[1.5]).eligible_mask(Float("float32"))
    # a field that is empty for this shape of format selects nothing
    with pytest.raises(ValueError, match="selects no bit position"):
        resolve_bits("fraction", FixedPoint(8, 0))
