"""``bitfault inject model.gguf``: a faulty copy that gguf's reader loads, differing from the
original exactly at the map's bits; an existing output only with --overwrite."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import bitfault as bf  # noqa: E402
from bitfault.cli import main  # noqa: E402
from bitfault.files.gguf_memory import GGUFMemory  # noqa: E402
from bitfault.formats import GGUF  # noqa: E402
from gguf_helpers import flip_bytes, write_tiny_llama  # noqa: E402


def _expected_bytes(clean: Path, maps: dict) -> np.ndarray:
    mem = GGUFMemory.open(clean)
    raw = np.frombuffer(clean.read_bytes(), np.uint8).copy()
    for name, fmap in maps.items():
        s = mem.tensor(name)
        raw[s.offset:s.offset + s.nbytes] = flip_bytes(raw[s.offset:s.offset + s.nbytes],
                                                       s.type, s.shape, fmap)
    return raw


def _inject(capsys, *args: str) -> tuple[int, dict]:
    code = main(["inject", *args, "--json"])
    return code, json.loads(capsys.readouterr().out.splitlines()[-1])


def test_cli_writes_a_copy_differing_exactly_at_the_map_bits(tmp_path: Path, capsys) -> None:
    model = write_tiny_llama(tmp_path / "tiny.gguf", tied=False)
    spec = bf.FaultSpec(format=GGUF("q4_1"), ber={"scale": 2e-2, "codes": 1e-3}, seed=3,
                        targets={"kinds": ["weights"], "exclude": ["token_embd.*"]})
    (tmp_path / "spec.json").write_text(spec.to_json())
    out = tmp_path / "faulty.gguf"
    code, result = _inject(capsys, str(model), "--spec", str(tmp_path / "spec.json"),
                           "--output", str(out))
    assert code == 0 and result["framework"] == "gguf", result
    maps = GGUFMemory.open(model).random_maps(ber=spec.ber, seed=3, targets=spec.targets)
    assert "token_embd.weight" not in maps and sorted(result["tensors"]) == sorted(maps)
    clean = np.frombuffer(model.read_bytes(), np.uint8)
    got = np.frombuffer(out.read_bytes(), np.uint8)
    assert np.array_equal(got, _expected_bytes(model, maps))
    assert int(np.unpackbits(clean ^ got).sum()) == result["faults"] > 0
    reader = gguf.GGUFReader(out)  # the copy loads, with the tensors and metadata it had
    assert [t.name for t in reader.tensors] == [t.name for t in gguf.GGUFReader(model).tensors]

    before = out.read_bytes()
    spec2 = spec.replace(seed=4)
    (tmp_path / "spec2.json").write_text(spec2.to_json())
    code, result = _inject(capsys, str(model), "--spec", str(tmp_path / "spec2.json"),
                           "--output", str(out))
    assert code == 2 and "exists; pass --overwrite" in result["error"]
    assert out.read_bytes() == before
    code, result = _inject(capsys, str(model), "--spec", str(tmp_path / "spec2.json"),
                           "--output", str(out), "--overwrite")
    assert code == 0
    maps2 = GGUFMemory.open(model).random_maps(ber=spec.ber, seed=4, targets=spec.targets)
    assert np.array_equal(np.frombuffer(out.read_bytes(), np.uint8),
                          _expected_bytes(model, maps2))
    code, result = _inject(capsys, str(model), "--spec", str(tmp_path / "spec.json"),
                           "--output", str(model), "--overwrite")
    assert code == 2 and "is the input model" in result["error"]
    assert np.array_equal(np.frombuffer(model.read_bytes(), np.uint8), clean)


def test_cli_applies_a_saved_plane_map(tmp_path: Path, capsys) -> None:
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    name = "blk.0.ffn_gate.weight"  # Q4_1, numpy shape (96, 64)
    assert main(["map", str(tmp_path / "m.npz"), "--shape", "96,64", "--name", name,
                 "--format", '{"kind": "gguf", "type": "q4_1"}', "--count", "2",
                 "--seed", "1", "--json"]) == 0
    capsys.readouterr()
    out = tmp_path / "f.gguf"
    code, result = _inject(capsys, str(model), "--map", str(tmp_path / "m.npz"), "--output",
                           str(out))
    assert code == 0 and list(result["tensors"]) == [name] and result["faults"] == 6
    fmap = bf.FaultMap.load(tmp_path / "m.npz")
    assert np.array_equal(np.frombuffer(out.read_bytes(), np.uint8),
                          _expected_bytes(model, {name: fmap}))


def test_bad_gguf_input_is_refused_before_writing(tmp_path: Path, capsys) -> None:
    model = write_tiny_llama(tmp_path / "odd.gguf",
                             extra={"rope_freqs.weight": np.arange(8, dtype=np.int32)})
    (tmp_path / "spec.json").write_text(bf.FaultSpec(ber=1e-3).to_json())
    code, result = _inject(capsys, str(model), "--spec", str(tmp_path / "spec.json"),
                           "--output", str(tmp_path / "out.gguf"))
    assert code == 2 and "rope_freqs.weight (I32)" in result["error"], result
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd.gguf", "spec.json"]


def test_an_existing_state_dict_output_needs_overwrite(tmp_path: Path, capsys) -> None:
    torch = pytest.importorskip("torch")
    torch.save({"fc.weight": torch.randn(8, 4)}, tmp_path / "m.pt")
    (tmp_path / "spec.json").write_text(bf.FaultSpec(format=bf.IntQuant(8), ber=0.05).to_json())
    (tmp_path / "out.pt").write_bytes(b"mine")
    args = [str(tmp_path / "m.pt"), "--spec", str(tmp_path / "spec.json"), "--output",
            str(tmp_path / "out.pt")]
    code, result = _inject(capsys, *args)
    assert code == 2 and "exists; pass --overwrite" in result["error"]
    assert (tmp_path / "out.pt").read_bytes() == b"mine"
    assert _inject(capsys, *args, "--overwrite")[0] == 0
    assert set(torch.load(tmp_path / "out.pt", weights_only=True)) == {"fc.weight"}
