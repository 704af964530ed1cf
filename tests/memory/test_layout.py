"""WordLayout against a reference written here with Python ints."""

from __future__ import annotations

import numpy as np
import pytest

import bitfault as bf
from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.memory.layout import WordLayout
from ecc_reference import from_array, to_array


def ref_pack(values: list[int], bits: int, word_bits: int) -> list[int]:
    """Element j in bits [(j % k) * bits, ...) of word j // k, as unsigned patterns."""
    k = word_bits // bits
    words = [0] * (-(-len(values) // k))
    for j, v in enumerate(values):
        words[j // k] |= (v % 2 ** bits) << ((j % k) * bits)
    return words


CASES = [(8, 64, np.int8), (4, 32, np.int8), (16, 64, np.int16), (32, 64, np.int32),
         (6, 24, np.int8), (2, 8, np.int8), (32, 32, np.int32), (5, 40, np.int8),
         # wider than 64 bits: (n, lanes) words; 24-, 5- and 12-bit codes straddle lanes
         (8, 128, np.int8), (32, 128, np.int32), (24, 96, np.int32), (5, 200, np.int8),
         (16, 256, np.int16), (12, 72, np.int16), (4, 132, np.int8)]


@pytest.mark.parametrize(("bits", "word_bits", "dtype"), CASES)
def test_pack_unpack_match_reference(bits: int, word_bits: int, dtype) -> None:
    rng = np.random.default_rng(bits * word_bits)
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1)
    values = rng.integers(lo, hi, size=(3, 7), dtype=np.int64).astype(dtype)
    layout = WordLayout(word_bits)
    packed = layout.pack(values, bits)
    assert packed.dtype == np.uint64
    lanes = -(-word_bits // 64)
    assert packed.shape == ((layout.n_words(values.size, bits),) if lanes == 1 else
                            (layout.n_words(values.size, bits), lanes)) and layout.lanes == lanes
    assert from_array(packed) == ref_pack([int(v) for v in values.ravel()], bits, word_bits)
    back = layout.unpack(packed, bits, values.size)
    assert [int(x) for x in back] == [int(v) % 2 ** bits for v in values.ravel()]


def test_documented_order_eight_int8_per_word() -> None:
    codes = np.arange(1, 10, dtype=np.int8)  # 9 codes: two words, the second padded
    packed = WordLayout(64).pack(codes, 8)
    assert int(packed[0]) == 0x0807060504030201 and int(packed[1]) == 0x09


def test_sixteen_int8_and_four_float32_per_128_bit_word_round_trip() -> None:
    layout = WordLayout(128)
    codes = np.arange(-17, 17, dtype=np.int8)  # 34 codes: three words, the last padded
    packed = layout.pack(codes, 8)
    assert packed.shape == (3, 2) and layout.per_word(8) == 16
    assert from_array(packed)[0] == int.from_bytes(codes[:16].tobytes(), "little")
    assert from_array(packed)[2] == int.from_bytes(codes[32:].tobytes(), "little")
    back = layout.unpack(packed, 8, codes.size).astype(np.uint8).view(np.int8)
    assert np.array_equal(back, codes)
    fmt = bf.Float("float32")
    x = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    words = fmt.encode(x)
    packed = layout.pack(words, 32)
    assert packed.shape == (4, 2) and layout.per_word(32) == 4
    assert from_array(packed)[0] == int.from_bytes(x.ravel()[:4].tobytes(), "little")
    back = layout.unpack(packed, 32, words.size).astype(np.uint32).view(np.int32)
    np.testing.assert_array_equal(fmt.decode(back.reshape(x.shape)), x)
    assert [int(w) for w in layout.pack(words, 32, which=[3, 1])[:, 0]] == \
        [int(packed[3, 0]), int(packed[1, 0])]
    assert np.array_equal(layout.fields(to_array([1 << 127], 128), 32),
                          [[0, 0, 0, 1 << 31]])


@pytest.mark.parametrize(("bits", "word_bits"), [(8, 64), (6, 24), (32, 64), (4, 16),
                                                 (24, 96), (8, 128)])
def test_index_maps_agree_with_pack(bits: int, word_bits: int) -> None:
    layout = WordLayout(word_bits)
    n = 11
    for element in range(n):
        for bit in range(bits):
            values = np.zeros(n, np.int64)
            values[element] = 1 << bit
            packed = from_array(layout.pack(values, bits))
            w, b = layout.memory_bit(element, bit, bits)
            assert packed == [1 << int(b) if i == w else 0 for i in range(len(packed))]
            e2, b2 = layout.element_bit(w, b, bits)
            assert (int(e2), int(b2)) == (element, bit)


def test_rows_and_used_bits() -> None:
    layout = WordLayout(64, row_words=4)
    assert layout.n_rows(9) == 3 and layout.n_rows(8) == 2 and layout.n_rows(0) == 0
    assert list(layout.row_of(np.arange(9))) == [0, 0, 0, 0, 1, 1, 1, 1, 2]
    one = WordLayout(32)
    assert one.n_rows(5) == 1 and list(one.row_of([0, 4])) == [0, 0]
    assert one.used_mask(0, 5, 8) == 0xFFFFFFFF and one.used_mask(1, 5, 8) == 0xFF
    assert one.used_mask(2, 5, 8) == 0


def test_bad_input_is_named() -> None:
    with pytest.raises(ArgumentError) as e:
        WordLayout(64).per_word(6)
    assert e.value.argument == "word_bits" and "multiple" in e.value.allowed
    with pytest.raises(ArgumentError) as e:
        WordLayout(64).pack(np.zeros(3, np.int8), 6)
    assert e.value.argument == "word_bits"
    for bad in (7, 257, 264, True):
        with pytest.raises(ArgumentError) as e:
            WordLayout(bad)
        assert e.value.argument == "word_bits"
    for word_bits, bits in ((128, 24), (72, 16), (256, 3)):  # no whole number of elements
        with pytest.raises(ArgumentError) as e:
            WordLayout(word_bits).per_word(bits)
        assert e.value.argument == "word_bits" and str(bits) in e.value.allowed
    with pytest.raises(ArgumentError) as e:
        WordLayout(128).unpack(np.zeros(4, np.uint64), 8, 4)  # wide words need lanes
    assert e.value.argument == "memory_words"
    for bad in (0, -2, True, 1.5):
        with pytest.raises(ArgumentError) as e:
            WordLayout(64, interleave=bad)
        assert e.value.argument == "interleave"
    with pytest.raises(ArgumentError) as e:
        WordLayout(64, row_words=6, interleave=4)
    assert e.value.argument == "interleave" and "row_words" in e.value.allowed
    with pytest.raises(ArgumentError) as e:
        WordLayout(64, row_words=0)
    assert e.value.argument == "row_words"
    with pytest.raises(ArgumentTypeError) as e:
        WordLayout(64).pack(np.zeros(3), 8)
    assert e.value.argument == "words"
    with pytest.raises(ArgumentError) as e:
        WordLayout(64).element_bit(0, 64, 8)
    assert e.value.argument == "bit"
    with pytest.raises(ArgumentError):
        WordLayout.from_dict({"word_bits": 64, "rows": 3})


def test_dict_round_trip() -> None:
    for layout in (WordLayout(), WordLayout(32, 128), WordLayout(128, 8, 4),
                   WordLayout(64, None, 2)):
        assert WordLayout.from_dict(layout.to_dict()) == layout
    # interleave is recorded only when it is not 1 (earlier layouts keep their dicts)
    assert WordLayout(64, 16).to_dict() == {"word_bits": 64, "row_words": 16}
    assert WordLayout(64, 16, 4).to_dict() == {"word_bits": 64, "row_words": 16,
                                               "interleave": 4}


def test_pack_does_not_change_its_input() -> None:
    values = np.array([-1, 2, -3], np.int8)
    WordLayout(16).pack(values, 8)
    assert list(values) == [-1, 2, -3]


def test_pack_chosen_words() -> None:
    values = np.arange(-20, 21, dtype=np.int8)  # 41 codes: 6 words, the last padded
    layout = WordLayout(64)
    full = layout.pack(values, 8)
    assert list(layout.pack(values, 8, which=[5, 0, 3])) == [full[5], full[0], full[3]]
    assert layout.pack(values, 8, which=[]).size == 0
    with pytest.raises(ArgumentError) as e:
        layout.pack(values, 8, which=[6])
    assert e.value.argument == "which"
