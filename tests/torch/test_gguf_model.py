"""GGUF stored memory into a transformers model: after ``inject_`` the model's weights are
what transformers itself loads from a GGUF file whose bytes the test flipped by hand."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
os.environ["HF_HUB_OFFLINE"] = "1"

import bitfault as bf  # noqa: E402
from bitfault.errors import ArgumentError  # noqa: E402
from bitfault.torch.gguf import load_gguf_model  # noqa: E402
from gguf_helpers import flip_bytes, write_tiny_llama  # noqa: E402


def _load_hf(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                dtype=torch.float32)


def _bits(sd: dict) -> dict:
    return {k: v.detach().clone().view(torch.int32) for k, v in sd.items()}


def _hand_faulted_copy(clean: Path, out: Path, gm, maps) -> Path:
    """A copy of ``clean`` with the maps' bits flipped in the bytes, by the test's own
    reference of llama.cpp's layout (not by bitfault)."""
    shutil.copyfile(clean, out)
    raw = bytearray(clean.read_bytes())
    for name, fmap in maps.items():
        s = gm.memory.tensor(name)
        part = np.frombuffer(bytes(raw[s.offset:s.offset + s.nbytes]), np.uint8)
        raw[s.offset:s.offset + s.nbytes] = flip_bytes(part, s.type, s.shape, fmap).tobytes()
    out.write_bytes(bytes(raw))
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gguf_model")
    return {"untied": write_tiny_llama(d / "untied.gguf", seed=1, tied=False),
            "tied": write_tiny_llama(d / "tied.gguf", seed=2, tied=True)}


@pytest.mark.parametrize("kind", ["untied", "tied"])
def test_injected_weights_equal_transformers_loading_the_faulty_bytes(files, kind, tmp_path
                                                                      ) -> None:
    gm = load_gguf_model(files[kind])
    assert not gm.unmapped and set(gm.targets) == set(gm.memory.names)
    clean = _bits(gm.model.state_dict())
    # the clean path: bitfault's values are exactly what from_pretrained loaded
    for name in gm.memory.names:
        for hf_name, v in gm.values(name).items():
            assert torch.equal(torch.from_numpy(np.ascontiguousarray(v)).view(torch.int32),
                               clean[hf_name]), name
    assert "blk.0.attn_q.weight" in gm.targets  # llama's q/k rows are un-permuted on load
    raw_q = gm.memory.dequantize("blk.0.attn_q.weight")
    assert not np.array_equal(raw_q, gm.values("blk.0.attn_q.weight")[
        "model.layers.0.self_attn.q_proj.weight"])

    maps = gm.memory.random_maps(ber=3e-3, seed=5)
    stats = gm.inject_(maps)
    assert sum(s["faults"] for s in stats.values()) == sum(m.n_faults for m in maps.values())
    assert any(m.planes.get("scale") is not None and m.planes["scale"].n_faults
               for m in maps.values())
    faulty_file = _hand_faulted_copy(files[kind], tmp_path / "faulty.gguf", gm, maps)
    expect = _bits(_load_hf(faulty_file).state_dict())
    got = _bits(gm.model.state_dict())
    assert got.keys() == expect.keys()
    for k in got:
        assert torch.equal(got[k], expect[k]), k
    assert sum(not torch.equal(got[k], clean[k]) for k in got) >= len(maps) - 2
    if kind == "tied":  # one memory: the head is the faulty embedding itself
        assert gm.model.lm_head.weight is gm.model.model.embed_tokens.weight
        assert "output.weight" not in gm.memory.names

    # a forward pass on the faulty model runs; restore_ puts every bit back
    gm.model(torch.tensor([[1, 2, 3, 4]]))
    gm.restore_()
    back = _bits(gm.model.state_dict())
    assert all(torch.equal(back[k], clean[k]) for k in clean)
    assert gm.faulted == set()


def test_a_second_chip_replaces_the_first(files) -> None:
    gm = load_gguf_model(files["untied"])
    clean = _bits(gm.model.state_dict())
    first = gm.memory.random_maps(ber=1e-3, seed=1)
    gm.inject_(first)
    only = "blk.1.ffn_down.weight"
    fmap = bf.FaultMap((64, 3), [0], [1 << 14], name=f"{only}:scale")
    gm.inject_({f"{only}:scale": fmap})  # one scale exponent bit of one block
    got = _bits(gm.model.state_dict())
    changed = [k for k in got if not torch.equal(got[k], clean[k])]
    assert changed == ["model.layers.1.mlp.down_proj.weight"]
    w = got["model.layers.1.mlp.down_proj.weight"] != clean["model.layers.1.mlp.down_proj.weight"]
    assert w[0, :32].any() and not w[0, 32:].any() and not w[1:].any()  # one block only
    assert gm.faulted == {only}
    gm.inject_({})
    assert all(torch.equal(v, clean[k]) for k, v in _bits(gm.model.state_dict()).items())


def test_bad_maps_change_nothing(files) -> None:
    gm = load_gguf_model(files["untied"])
    clean = _bits(gm.model.state_dict())
    good = bf.FaultMap((64, 64), [3], [1], name="blk.0.attn_q.weight")
    with pytest.raises(ArgumentError, match="has no tensor"):
        gm.inject_({"blk.0.attn_q.weight": good, "blk.9.attn_q.weight": good})
    with pytest.raises(ArgumentError, match="is for shape"):
        gm.inject_({"blk.0.attn_q.weight": good, "blk.0.attn_k.weight": good})
    assert all(torch.equal(v, clean[k]) for k, v in _bits(gm.model.state_dict()).items())


@pytest.mark.parametrize("kind", ["untied", "tied"])
def test_writing_only_the_faulty_blocks_equals_writing_whole_tensors(files, kind) -> None:
    fast, whole = load_gguf_model(files[kind]), load_gguf_model(files[kind])
    whole.patch = False
    clean = _bits(fast.model.state_dict())
    # llama's q rows move on load: an index map, not the identity; the norms stay put
    assert fast.places("blk.0.attn_q.weight").places["model.layers.0.self_attn.q_proj.weight"] \
        is not None
    assert all(v is None for v in fast.places("blk.0.ffn_down.weight").places.values())
    chips = [({"ber": 3e-3}, None), ({"ber": {"scale": 1e-2}}, None),
             ({"ber": 1e-3}, bf.StuckAt(1)), ({"ber": {"min": 5e-2, "codes": 1e-3}}, None)]
    for seed, (rate, fault) in enumerate(chips):
        maps = fast.memory.random_maps(seed=seed, fault=fault, **rate)
        assert fast.inject_(maps, fault) == whole.inject_(maps, fault)
        got, expect = _bits(fast.model.state_dict()), _bits(whole.model.state_dict())
        assert all(torch.equal(got[k], expect[k]) for k in got)
        assert any(not torch.equal(got[k], clean[k]) for k in got)
        assert fast.faulted == whole.faulted
    fast.restore_()
    assert all(torch.equal(v, clean[k]) for k, v in _bits(fast.model.state_dict()).items())
