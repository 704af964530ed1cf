"""campaign.memory as a list of named memories: validated into frozen, round-tripping
configs; every bad entry a ConfigError naming campaign.memory[i]; a single mapping as
before."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bitfault.config import ConfigError, load_config
from bitfault.memory.storage import Storage

SCHEMES = [{"name": "none"}, {"name": "parity", "protection": "parity"},
           {"name": "secded", "protection": "secded", "word_bits": 64}]


def campaign(memory: Any) -> dict[str, Any]:
    return {"campaign": {"bers": [1e-3], "memory": memory}}


def test_a_list_of_named_memories_is_each_storage_and_round_trips() -> None:
    config = load_config(campaign(SCHEMES))
    c = config.campaign
    assert [name for name, _ in c.schemes] == ["none", "parity", "secded"]
    for (name, storage), raw in zip(c.schemes, SCHEMES, strict=True):
        rest = {k: v for k, v in raw.items() if k != "name"}
        assert storage == Storage.from_dict(rest).to_dict()  # what Storage.from_dict takes
        assert name == raw["name"]
    assert c.schemes[2][1]["protection"] == {"kind": "secded", "policy": "flag"}
    text = json.dumps(config.to_dict())  # JSON-ready, and back to the same config
    assert load_config(json.loads(text)) == config
    assert json.loads(text)["campaign"]["memory"][1]["name"] == "parity"


def test_a_single_mapping_keeps_working() -> None:
    c = load_config(campaign({"word_bits": 32, "protection": "secded"})).campaign
    assert c.schemes == ()
    assert c.memory == Storage.from_dict({"word_bits": 32, "protection": "secded"}).to_dict()
    assert load_config({"campaign": {}}).campaign.schemes == ()


@pytest.mark.parametrize(("memory", "key", "allowed"), [
    ([], "campaign.memory", "non-empty list"),
    ([{"name": "a"}, {"name": "b"}, {"name": "A"}], "campaign.memory[2].name",
     "campaign.memory[0] is 'a'"),
    ([{"name": "a"}, {"protection": "secded"}], "campaign.memory[1].name", "a name of"),
    ([{"name": "x.y"}], "campaign.memory[0].name", "letters, digits"),
    ([{"name": ""}], "campaign.memory[0].name", "letters, digits"),
    ([{"name": 3}], "campaign.memory[0].name", "letters, digits"),
    ([{"name": "a"}, "secded"], "campaign.memory[1]", "a mapping with a name"),
    ([{"name": "a", "protection": "hamming"}], "campaign.memory[0].protection",
     "'none', 'parity', 'secded'"),
    ([{"name": "a"}, {"name": "b", "wordbits": 64}], "campaign.memory[1]",
     "unknown storage key"),
    ([{"name": "a", "pattern": {"kind": "mbu", "sizes": {0: 1.0}}}],
     "campaign.memory[0]", "sizes must be a positive integer"),
    ("secded", "campaign.memory", "or a list of such mappings"),
])
def test_bad_memory_lists_name_the_entry(memory: Any, key: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(campaign(memory))
    assert err.value.key == key
    assert allowed in err.value.allowed


def test_a_pretrained_model_refuses_a_memory_list() -> None:
    raw = {"model": {"kind": "hf", "path": "somewhere"}, "metric": "perplexity",
           "data": {"source": "text", "path": "lee"}, **campaign(SCHEMES)}
    with pytest.raises(ConfigError) as err:
        load_config(raw)
    assert err.value.key == "campaign.memory" and isinstance(err.value.value, list)


def test_the_example_config_compares_five_memories() -> None:
    pytest.importorskip("yaml")
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "protection_mlp.yaml"
    c = load_config(path).campaign
    assert [n for n, _ in c.schemes] == ["none", "parity", "secded", "secded32", "secded-mbu"]
    assert dict(c.schemes)["secded32"]["word_bits"] == 32
