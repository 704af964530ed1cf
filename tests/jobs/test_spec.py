"""Fault spec files for `bitfault inject`: read like configs, errors name the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bitfault as bf
from bitfault.jobs.inject import load_spec

SPEC = {"format": {"kind": "int_quant", "bits": 8}, "ber": 0.01, "seed": 3}


def test_spec_files_in_json_yaml_and_toml(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(json.dumps(SPEC))
    (tmp_path / "s.yaml").write_text("format: {kind: int_quant, bits: 8}\nber: 0.01\nseed: 3\n")
    (tmp_path / "s.toml").write_text('ber = 0.01\nseed = 3\n[format]\nkind = "int_quant"\n'
                                     'bits = 8\n')
    want = bf.FaultSpec(format=bf.IntQuant(8), ber=0.01, seed=3)
    for name in ("s.json", "s.yaml", "s.toml"):
        assert load_spec(tmp_path / name) == want


@pytest.mark.parametrize(("name", "text", "error", "match"), [
    ("gone.json", None, FileNotFoundError, "no such spec file"),
    ("s.txt", "{}", ValueError, r"spec files end in \.yaml, \.yml, \.toml or \.json"),
    ("s.json", "[1]", ValueError, "a spec is a mapping at the top level, got list"),
    ("s.json", "{", ValueError, "not valid JSON"),
    ("s.json", '{"ber": 2}', ValueError, "ber must be in"),
])
def test_bad_spec_files_name_the_file(tmp_path: Path, name, text, error, match) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(error, match=match) as info:
        load_spec(path)
    assert str(path) in str(info.value)
