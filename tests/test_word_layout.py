"""WordLayout against a reference written here with Python ints."""

from __future__ import annotations

import numpy as np
import pytest

from bitfault.errors import ArgumentError, ArgumentTypeError
from bitfault.layout import WordLayout


def ref_pack(values: list[int], bits: int, word_bits: int) -> list[int]:
    """Element j in bits [(j % k) * bits, ...) of word j // k, as unsigned patterns."""
    k = word_bits // bits
    words = [0] * (-(-len(values) // k))
    for j, v in enumerate(values):
        words[j // k] |= (v % 2 ** bits) << ((j % k) * bits)
    return words


CASES = [(8, 64, np.int8), (4, 32, np.int8), (16, 64, np.int16), (32, 64, np.int32),
         (6, 24, np.int8), (2, 8, np.int8), (32, 32, np.int32), (5, 40, np.int8)]


@pytest.mark.parametrize(("bits", "word_bits", "dtype"), CASES)
def test_pack_unpack_match_reference(bits: int, word_bits: int, dtype) -> None:
    rng = np.random.default_rng(bits * word_bits)
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1)
    values = rng.integers(lo, hi, size=(3, 7), dtype=np.int64).astype(dtype)
    layout = WordLayout(word_bits)
    packed = layout.pack(values, bits)
    assert packed.dtype == np.uint64
    assert [int(x) for x in packed] == ref_pack([int(v) for v in values.ravel()], bits,
                                                word_bits)
    assert packed.size == layout.n_words(values.size, bits)
    back = layout.unpack(packed, bits, values.size)
    assert [int(x) for x in back] == [int(v) % 2 ** bits for v in values.ravel()]


def test_documented_order_eight_int8_per_word() -> None:
    codes = np.arange(1, 10, dtype=np.int8)  # 9 codes: two words, the second padded
    packed = WordLayout(64).pack(codes, 8)
    assert int(packed[0]) == 0x0807060504030201 and int(packed[1]) == 0x09


@pytest.mark.parametrize(("bits", "word_bits"), [(8, 64), (6, 24), (32, 64), (4, 16)])
def test_index_maps_agree_with_pack(bits: int, word_bits: int) -> None:
    layout = WordLayout(word_bits)
    n = 11
    for element in range(n):
        for bit in range(bits):
            values = np.zeros(n, np.int64)
            values[element] = 1 << bit
            packed = layout.pack(values, bits)
            w, b = layout.memory_bit(element, bit, bits)
            assert [int(x) for x in packed] == [1 << int(b) if i == w else 0
                                                for i in range(packed.size)]
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
    for bad in (7, 65, True):
        with pytest.raises(ArgumentError) as e:
            WordLayout(bad)
        assert e.value.argument == "word_bits"
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
    for layout in (WordLayout(), WordLayout(32, 128)):
        assert WordLayout.from_dict(layout.to_dict()) == layout


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
