"""bitfault.jobs.compare on its own: the physical bits a raw bit error rate divides by
(counted here word by word), the raw rate per rate, the within-0.5-points rate."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import bitfault as bf
from bitfault.jobs.compare import memory_bits, raw_ber_rows, robust_rate, scheme_store

SHAPES = {"a.weight": (3, 70), "b.weight": (5, 32)}  # 70: a partial MX block per row


def words(elements: int, per_word: int) -> int:
    return -(-elements // per_word)


def test_physical_bits_of_every_faulted_plane_word_by_word() -> None:
    # MX: 4-bit codes (16 per 64-bit word), one 8-bit scale per 32 codes (8 per word)
    codes = sum(words(r * c, 16) for r, c in SHAPES.values())
    scales = sum(words(r * -(-c // 32), 8) for r, c in SHAPES.values())
    fmt = bf.MX("float4_e2m1fn")
    plain = bf.Memory(fmt, bf.BitFlip(), storage={"protection": "none"})
    assert memory_bits(plain, SHAPES) == {"data_bits": 64 * (codes + scales), "check_bits": 0,
                                          "physical_bits": 64 * (codes + scales)}
    scales_only = bf.Memory(fmt, bf.BitFlip(), storage={"protection": {"scale": "secded"}})
    assert memory_bits(scales_only, SHAPES) == {
        "data_bits": 64 * (codes + scales), "check_bits": 8 * scales,
        "physical_bits": 64 * (codes + scales) + 8 * scales}
    faulted = bf.Memory(fmt, bf.BitFlip(bits="scale"), storage={"protection": "parity"})
    assert memory_bits(faulted, SHAPES)["physical_bits"] == 65 * scales  # codes not faulted
    no_scales = bf.Memory(fmt, bf.BitFlip(), plane_rates={"scale": 0.0},
                          storage={"protection": "parity", "word_bits": 32})
    codes32 = sum(words(r * c, 8) for r, c in SHAPES.values())
    assert memory_bits(no_scales, SHAPES)["physical_bits"] == 33 * codes32
    with pytest.raises(ValueError, match="storage"):
        memory_bits(bf.Memory(fmt, bf.BitFlip()), SHAPES)
    # int8, SEC-DED on bits 7 and 6 only: 2-bit fields, 32 per protected 64-bit word (8
    # check bits); the other 6 bits, 10 fields in 60 bits of an unprotected word
    top = bf.Memory(bf.IntQuant(8), bf.BitFlip(),
                    storage={"protection": "secded", "protected_bits": [7, 6]})
    high = sum(words(r * c, 32) for r, c in SHAPES.values())
    low = sum(words(r * c, 10) for r, c in SHAPES.values())
    assert memory_bits(top, SHAPES) == {"data_bits": 64 * high + 60 * low,
                                        "check_bits": 8 * high,
                                        "physical_bits": 72 * high + 60 * low}


def record(ber: float, errors: int, kind: str = "rate") -> SimpleNamespace:
    return SimpleNamespace(kind=kind, ber=ber, metrics={"raw_bit_errors": errors})


def test_raw_ber_rows_average_each_chips_rate() -> None:
    rows = raw_ber_rows([record(1e-3, 10), record(1e-3, 30), record(1e-2, 200),
                         record(1e-2, 7, kind="layer")], 1000)
    assert rows == [{"ber": 1e-3, "trials": 2, "raw_ber": 0.02, "raw_ber_min": 0.01,
                     "raw_ber_max": 0.03, "raw_bit_errors": 20.0},
                    {"ber": 1e-2, "trials": 1, "raw_ber": 0.2, "raw_ber_min": 0.2,
                     "raw_ber_max": 0.2, "raw_bit_errors": 200.0}]


@pytest.mark.parametrize(("means", "want"), [
    ({1e-4: 0.95, 1e-3: 0.945, 1e-2: 0.90}, 1e-3),  # exactly 0.5 points below: within
    ({1e-4: 0.9449, 1e-3: 0.95}, None),             # the lowest rate already fails
    ({1e-4: 0.95, 1e-3: 0.90, 1e-2: 0.95}, 1e-4),   # a later recovery does not count
    ({1e-2: 0.96, 1e-4: 0.951}, 1e-2),              # order of the points does not matter
])
def test_robust_rate(means: dict[float, float], want: float | None) -> None:
    assert robust_rate([{"ber": b, "mean": m} for b, m in means.items()], 0.95) == want


def test_scheme_stores_never_meet_a_recipes_store(tmp_path) -> None:
    assert scheme_store(tmp_path, "int8", None) == tmp_path / "campaign" / "int8.sqlite"
    assert scheme_store(tmp_path, "int8", "secded") == (tmp_path / "campaign" / "secded"
                                                        / "int8.sqlite")
