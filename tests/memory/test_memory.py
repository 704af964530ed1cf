"""Memory (format + fault model): validation, JSON round trip, a digest of just those two."""

from __future__ import annotations

import json

import pytest

from bitfault import BitFlip, FaultSpec, FixedPoint, Float, IntQuant, Memory, StuckAt

MEMORIES = [
    Memory(FixedPoint(32, 28, rounding="trunc"), BitFlip()),
    Memory(Float("bfloat16"), StuckAt(1, bits=["exponent", 3])),
    Memory(IntQuant(8, symmetric=False, per_channel=True), StuckAt(0, bits="msb")),
]


@pytest.mark.parametrize("memory", MEMORIES, ids=repr)
def test_round_trip_through_json(memory):
    data = json.loads(json.dumps(memory.to_dict()))
    again = Memory.from_dict(data)
    assert again == memory and again.digest() == memory.digest()
    assert Memory(data["format"], data["fault"]) == memory


def test_digest_is_stable_and_hashes_only_format_and_fault():
    a = FaultSpec(ber=1e-3, seed=1, targets="biases")
    b = FaultSpec(count=4, seed=9, persistence="transient")
    assert a.memory == b.memory == Memory(FixedPoint(32, 28, rounding="trunc"), BitFlip())
    assert a.memory.digest() == b.memory.digest()
    assert a.memory.to_json() == ('{"fault":{"bits":null,"kind":"bit_flip"},"format":'
                                  '{"bits":32,"frac":28,"kind":"fixed_point","overflow":'
                                  '"saturate","rounding":"trunc"}}')
    assert len({m.digest() for m in MEMORIES}) == len(MEMORIES)


def test_bad_memories_are_refused_naming_the_argument():
    with pytest.raises(TypeError, match="format must be a bitfault format"):
        Memory("fixed", BitFlip())
    with pytest.raises(TypeError, match=r"fault must be BitFlip\(\) or StuckAt"):
        Memory(FixedPoint(), "flip")
    with pytest.raises(ValueError, match="unknown bit field 'exponent' for FixedPoint"):
        Memory(FixedPoint(), BitFlip(bits="exponent"))
    with pytest.raises(ValueError, match=r"outside 0\.\.15"):
        Memory(Float("float16"), BitFlip(bits=20))
    with pytest.raises(ValueError, match=r"unknown: \['ber'\], missing: \['fault'\]"):
        Memory.from_dict({"format": FixedPoint().to_dict(), "ber": 0.1})
    with pytest.raises(TypeError, match="a memory must be a mapping"):
        Memory.from_dict([1])


def test_spec_composes_memory_and_source():
    spec = FaultSpec(format=IntQuant(4), fault=StuckAt(1), ber=0.2, seed=7)
    assert spec.memory == Memory(IntQuant(4), StuckAt(1))
    assert (spec.source.ber, spec.source.count, spec.source.maps, spec.source.seed) == (
        0.2, None, None, 7)
    assert spec.map_for("fc.weight", (5, 5)) == spec.source.map_for("fc.weight", (5, 5),
                                                                     spec.memory)
    assert spec.replace(seed=8).source.seed == 8
