"""Run configs: every mistake names its key, value and what is allowed; YAML == TOML."""

from __future__ import annotations

from pathlib import Path

import pytest

import bitfault as bf
import bitfault.recipes
from bitfault.config import ConfigError, RunConfig, load_config
from bitfault.errors import ArgumentError
from bitfault.jobs.demo import demo_config
from bitfault.recipes import RandBET, Recipe

ROOT = Path(__file__).resolve().parents[2]

YAML = """
framework: torch
seed: 3
output: runs/x
data: {source: embedded, train_limit: 500}
model: {name: seed_mlp, kwargs: {hidden: 32}}
train: {epochs: 2, batch_size: 50, lr: 1e-2, optimizer: adam, weight_decay: 1e-4}
recipes:
  - {name: normal, format: {kind: int_quant, bits: 8}}
  - {name: robust, format: {kind: int_quant, bits: 8}, weight_clip: 0.1, randbet: {p_train: 1e-1}}
  - name: aware
    format: null
    fault_aware: {format: {kind: fixed_point, bits: 16, frac: 12}, ber: 1e-3,
                  persistence: transient}
campaign: {bers: [1e-4, 1.0e-3, "0.01"], chips: 4, seed: 7, fault: {kind: stuck_at, value: 1},
           targets: [fc1.weight, fc2.weight], layers: true, bits: false,
           single_faults: 2e-2}
"""

TOML = """
framework = "torch"
seed = 3
output = "runs/x"
[data]
source = "embedded"
train_limit = 500
[model]
name = "seed_mlp"
kwargs = {hidden = 32}
[train]
epochs = 2
batch_size = 50
lr = 0.01
optimizer = "adam"
weight_decay = 1e-4
[[recipes]]
name = "normal"
format = {kind = "int_quant", bits = 8}
[[recipes]]
name = "robust"
format = {kind = "int_quant", bits = 8}
weight_clip = 0.1
randbet = {p_train = 0.1}
[[recipes]]
name = "aware"
format = "none"
[recipes.fault_aware]
format = {kind = "fixed_point", bits = 16, frac = 12}
ber = 1e-3
persistence = "transient"
[campaign]
bers = [1e-4, 1e-3, 0.01]
chips = 4
seed = 7
fault = {kind = "stuck_at", value = 1}
targets = ["fc1.weight", "fc2.weight"]
layers = true
bits = false
single_faults = 0.02
"""


def test_yaml_and_toml_load_to_the_same_config(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(YAML)
    (tmp_path / "c.toml").write_text(TOML)
    a, b = load_config(tmp_path / "c.yaml"), load_config(tmp_path / "c.toml")
    assert a == b
    assert a.train.lr == 0.01 and a.train.weight_decay == 1e-4 and a.train.optimizer == "adam"
    assert a.campaign.bers == (1e-4, 1e-3, 0.01)  # YAML's string "1e-4" and "0.01" converted
    assert a.campaign.single_faults == 0.02 and a.campaign.single_fault_confidence == 0.95
    assert a.campaign.fault == bf.StuckAt(1) and a.campaign.targets == ("fc1.weight",
                                                                        "fc2.weight")
    assert a.recipes[1] == Recipe(name="robust", format=bf.IntQuant(8), weight_clip=0.1,
                                  randbet=RandBET(p_train=0.1))
    assert a.recipes[2].format is None
    assert a.recipes[2].stored_format == bf.FixedPoint(16, 12)
    assert load_config(a.to_dict()) == a  # config.json round trip


def test_defaults_and_demo_example() -> None:
    c = load_config({})
    assert c == RunConfig() and [r.name for r in c.recipes] == ["normal"]
    assert load_config(ROOT / "examples" / "demo.yaml") == demo_config()
    fast = demo_config(fast=True, output="x", framework="keras")
    assert (fast.data.train_limit, fast.train.epochs, fast.model.kwargs["hidden"]) == (1000, 2, 64)
    assert len(fast.campaign.bers) == 3 and fast.campaign.chips == 3
    assert (fast.output, fast.framework) == ("x", "keras")


@pytest.mark.parametrize(("data", "message"), [
    ({"bogus": 1}, "config key 'bogus': unknown; allowed: campaign, data, framework, metric, "
                   "model, output, recipes, seed, title, train"),
    ({"framework": "jax"}, "config key 'framework': got 'jax'; allowed: torch, keras"),
    ({"seed": -1}, "config key 'seed': got -1; allowed: an integer >= 0"),
    ({"train": {"epochs": -1}}, "config key 'train.epochs': got -1; allowed: a positive integer"),
    ({"train": {"epoch": 3}}, "config key 'train.epoch': unknown; allowed: batch_size, epochs, "
                              "lr, optimizer, weight_decay"),
    ({"train": {"lr": "fast"}}, "config key 'train.lr': got 'fast'; allowed: a positive number"),
    ({"train": {"lr": 0}}, "config key 'train.lr': got 0; allowed: a positive number"),
    ({"train": {"epochs": True}}, "config key 'train.epochs': got True; allowed: a positive"),
    ({"train": {"optimizer": "rmsprop"}}, "config key 'train.optimizer': got 'rmsprop'; "
                                          "allowed: sgd, adam"),
    ({"train": [1]}, "config key 'train': got [1]; allowed: a mapping"),
    ({"data": {"source": "web"}}, "config key 'data.source': got 'web'; allowed: embedded, idx"),
    ({"data": {"source": "npz"}}, "config key 'data.path': got None; allowed: a file path"),
    ({"data": {"path": "x"}}, "config key 'data.path': got 'x'; allowed: null for data.source"),
    ({"data": {"train_limit": 0}}, "config key 'data.train_limit': got 0; allowed: a positive"),
    ({"data": {"size": 3}}, "config key 'data.size': unknown"),
    ({"model": {"name": "resnet"}}, "config key 'model.name': got 'resnet'; allowed: seed_mlp, "
                                    "small_cnn or 'package.module:callable'"),
    ({"model": {"name": "seed_mlp", "kwargs": {"hiden": 3}}},
     "config key 'model.kwargs.hiden': unknown; allowed: hidden, seed"),
    ({"model": {"kwargs": {"hidden": 0}}}, "config key 'model.kwargs.hidden': got 0"),
    ({"model": {"name": "small_cnn", "kwargs": {"channels": [4]}}},
     "config key 'model.kwargs.channels': got [4]; allowed: two positive integers"),
    ({"model": {"arch": "x"}},
     "config key 'model.arch': unknown; allowed: kind, kwargs, name, path"),
    ({"recipes": []}, "config key 'recipes': got []; allowed: a non-empty list"),
    ({"recipes": [{"format": None}]}, "config key 'recipes[0].name': got None"),
    ({"recipes": [{"name": "a"}, {"name": "a"}]},
     "config key 'recipes[1].name': got 'a'; allowed: a name no other recipe uses"),
    ({"recipes": [{"name": "a/b"}]}, "config key 'recipes[0].name': got 'a/b'"),
    # names become folders: '.'/'..' would name models/ or the run directory itself
    ({"recipes": [{"name": "."}]}, "config key 'recipes[0].name': got '.'; allowed: a name "
                                   "of up to 100 letters"),
    ({"recipes": [{"name": ".."}]}, "config key 'recipes[0].name': got '..'"),
    ({"recipes": [{"name": ".hidden"}]}, "config key 'recipes[0].name': got '.hidden'"),
    ({"recipes": [{"name": "a\\b"}]}, "config key 'recipes[0].name': got 'a\\\\b'"),
    ({"recipes": [{"name": "x" * 101}]}, "config key 'recipes[0].name': got 'xxx"),
    ({"recipes": [{"name": "a"}, {"name": "a.single_faults"}]},
     "config key 'recipes[1].name': got 'a.single_faults'"),  # a's single-fault store
    ({"recipes": [{"name": "Net"}, {"name": "net"}]},
     "config key 'recipes[1].name': got 'net'; allowed: a name no other recipe uses"),
    ({"recipes": [{"name": "a", "clip": 0.1}]}, "config key 'recipes[0].clip': unknown; "
                                                 "allowed: activation_clip, activation_quantile"),
    ({"recipes": [{"name": "a"}, {"name": "b", "weight_clip": -1}]},
     "config key 'recipes[1].weight_clip': got -1; allowed: weight_clip must be a positive"),
    ({"recipes": [{"name": "a", "weight_clip": "big"}]},
     "config key 'recipes[0].weight_clip': got 'big'"),
    ({"recipes": [{"name": "a", "format": {"kind": "int_quant", "bits": 99}}]},
     "config key 'recipes[0].format.bits': got 99; allowed: bits must be an integer in 2..32"),
    ({"recipes": [{"name": "a", "format": {"kind": "int4"}}]},
     "config key 'recipes[0].format': got {'kind': 'int4'}; allowed: format kind must be one of"),
    ({"recipes": [{"name": "a", "format": "int8"}]},
     "config key 'recipes[0].format': got 'int8'; allowed: a format mapping"),
    ({"recipes": [{"name": "a", "randbet": {"p_train": 2}}]},
     "config key 'recipes[0].randbet.p_train': got 2; allowed: p_train must be in (0, 1)"),
    ({"recipes": [{"name": "a", "randbet": {"p": 0.1}}]},
     "config key 'recipes[0].randbet.p': unknown; allowed: fault, grad_clamp, p_train"),
    ({"recipes": [{"name": "a", "format": None, "randbet": {"p_train": 0.1}}]},
     "config key 'recipes[0].randbet': got {'p_train': 0.1}; allowed: randbet needs a format"),
    ({"recipes": [{"name": "a", "format": None, "fault_aware": {"ber": 0.1, "gradient": "x"}}]},
     "config key 'recipes[0].fault_aware.gradient': got 'x'; allowed: gradient must be one of"),
    ({"recipes": [{"name": "a", "format": None, "fault_aware": {"rate": 0.1}}]},
     "config key 'recipes[0].fault_aware.rate': unknown"),
    ({"recipes": [{"name": "a", "activation_quantile": 2}]},
     "config key 'recipes[0].activation_quantile': got 2"),
    ({"campaign": {"bers": []}}, "config key 'campaign.bers': got []; allowed: a non-empty list"),
    ({"campaign": {"bers": [1e-3, 2]}}, "config key 'campaign.bers[1]': got 2; allowed: a bit "
                                        "error rate in [0, 1]"),
    ({"campaign": {"bers": ["1e-3", "lots"]}}, "config key 'campaign.bers[1]': got 'lots'"),
    ({"campaign": {"bers": [True]}}, "config key 'campaign.bers[0]': got True; allowed: a bit "
                                     "error rate in [0, 1]"),
    ({"campaign": {"bers": [0.1, 0.1, "lots"]}}, "config key 'campaign.bers[2]': got 'lots'"),
    ({"campaign": {"chips": 0}}, "config key 'campaign.chips': got 0; allowed: a positive"),
    ({"campaign": {"chips": 10**7}}, "config key 'campaign.chips': got 10000000; allowed: a "
                                     "positive integer and <= 1000000"),
    # chip seeds seed + c are stored as signed 64-bit SQLite integers
    ({"campaign": {"seed": 2**63 - 1}}, "config key 'campaign.seed': got 9223372036854775807; "
                                        "allowed: an integer >= 0 and <= 9223372036854775798"),
    ({"campaign": {"seed": 2**63 - 3, "chips": 2, "sensitivity_chips": 4}},
     "config key 'campaign.seed': got 9223372036854775805; allowed: an integer >= 0 and <= "
     "9223372036854775804"),
    ({"seed": 2**32}, "config key 'seed': got 4294967296; allowed: an integer >= 0 and <= "
                      "4294967295"),
    ({"model": {"kwargs": {"seed": 2**32}}}, "config key 'model.kwargs.seed': got 4294967296"),
    ({"train": {"batch_size": 2**64}}, "config key 'train.batch_size': got 18446744073709551616"),
    ({"data": {"test_limit": 2**63}}, "config key 'data.test_limit': got 9223372036854775808"),
    ({"campaign": {"batch": 2**63}}, "config key 'campaign.batch': got 9223372036854775808"),
    ({"campaign": {"bers": [1e-3, "1e-2", 0.01]}}, "config key 'campaign.bers[2]': got 0.01; "
                                                    "allowed: a rate not already in the list"),
    ({"campaign": {"sensitivity_bers": [0.1, 0.1]}}, "config key 'campaign.sensitivity_bers[1]'"),
    ({"campaign": {"targets": ["fc1.weight", "fc1.weight"]}},
     "config key 'campaign.targets': got ['fc1.weight', 'fc1.weight']; allowed: tensor names, "
     "each once"),
    ({"campaign": {"layers": "yes"}}, "config key 'campaign.layers': got 'yes'; allowed: true "
                                      "or false"),
    ({"campaign": {"targets": "everything"}}, "config key 'campaign.targets': got 'everything'"),
    ({"campaign": {"fault": {"kind": "melt"}}}, "config key 'campaign.fault': got {'kind': "
                                                "'melt'}; allowed: fault kind must be"),
    ({"campaign": {"chip": 3}}, "config key 'campaign.chip': unknown; allowed: batch, bers, bits"),
    ({"campaign": {"single_faults": 0.5}}, "config key 'campaign.single_faults': got 0.5; "
                                           "allowed: a margin in (0, 0.5), e.g. 0.01 or null"),
    ({"campaign": {"single_fault_confidence": 1}}, "config key "
     "'campaign.single_fault_confidence': got 1; allowed: a confidence in (0, 1)"),
])
def test_errors_name_key_value_and_what_is_allowed(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(data)
    assert str(info.value).startswith(message), str(info.value)
    assert isinstance(info.value, ValueError)


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "c.ini").write_text("x")
    with pytest.raises(ValueError, match=r"\.yaml, \.yml, \.toml or \.json"):
        load_config(tmp_path / "c.ini")
    (tmp_path / "bad.toml").write_text("epochs = = 3")
    with pytest.raises(ValueError, match="bad.toml: not valid TOML"):
        load_config(tmp_path / "bad.toml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="a mapping at the top level"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "deep.yaml").write_text("train:\n  epochs: 0\n")
    with pytest.raises(ConfigError, match="'train.epochs': got 0"):
        load_config(tmp_path / "deep.yaml")


def test_nested_core_checks_name_the_key_through_the_error_object(monkeypatch) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"recipes": [{"name": "a"}, {"name": "b", "weight_clip": -1}]})
    assert (info.value.key, info.value.value, info.value.allowed) == (
        "recipes[1].weight_clip", -1, "weight_clip must be a positive finite number")
    with pytest.raises(ConfigError) as info:  # a rule between arguments names its key too
        load_config({"recipes": [{"name": "a", "format": None, "randbet": {"p_train": 0.1}}]})
    assert (info.value.key, info.value.value) == ("recipes[0].randbet", {"p_train": 0.1})

    class Mute(ArgumentError):  # an error whose text says nothing: only its attributes do
        def __init__(self, *args: object) -> None:
            super().__init__(*args)
            self.args = ("?",)

        def __str__(self) -> str:
            return "?"

    def check_positive(value: object, argument: str) -> float:
        raise Mute(argument, value, "a number the test likes")

    monkeypatch.setattr(bitfault.recipes, "check_positive", check_positive)
    with pytest.raises(ConfigError) as info:
        load_config({"recipes": [{"name": "a", "randbet": {"grad_clamp": 0.5}}]})
    assert (info.value.key, info.value.value, info.value.allowed) == (
        "recipes[0].randbet.grad_clamp", 0.5, "grad_clamp must be a number the test likes")



# ---- the validator reads error objects, not their text ---------------------------------

_LIBRARY_ERRORS = {"ValueError", "TypeError", "KeyError", "ArgumentError", "ArgumentTypeError"}
_ATTRIBUTES = {"argument", "value", "allowed", "requirement"}


def _message_reads(source: str) -> list[str]:
    """Where ``source`` reads the text of an error it caught from the library, or parses
    text with ``re`` functions (``re.sub``, ``re.match``...): compiled name patterns
    matched against config values are fine."""
    import ast

    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "re" and node.attr != "compile":
            found.append(f"line {node.lineno}: re.{node.attr}")
        if not isinstance(node, ast.ExceptHandler) or node.name is None:
            continue
        types = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
        if not {getattr(t, "id", getattr(t, "attr", "")) for t in types} & _LIBRARY_ERRORS:
            continue
        allowed = {id(a.value) for stmt in node.body for a in ast.walk(stmt)
                   if isinstance(a, ast.Attribute) and a.attr in _ATTRIBUTES}
        for stmt in node.body:
            for n in ast.walk(stmt):
                if isinstance(n, ast.Name) and n.id == node.name and id(n) not in allowed:
                    found.append(f"line {n.lineno}: {node.name} used beyond {sorted(_ATTRIBUTES)}")
    return found


def test_config_never_parses_error_messages() -> None:
    files = sorted((ROOT / "src" / "bitfault" / "config").glob("*.py"))
    assert files
    found = {f.name: _message_reads(f.read_text()) for f in files}
    assert not any(found.values()), found


def test_the_message_check_catches_what_it_forbids() -> None:
    parses = ("import re\n"
              "try:\n    f()\nexcept ValueError as exc:\n"
              "    key = str(exc).split()[0]\n"
              "    allowed = re.sub('got .*', '', exc.args[0])\n")
    assert [f.split(":")[0] for f in _message_reads(parses)] == ["line 5", "line 6", "line 6"]
    helper = "try:\n    f()\nexcept TypeError as exc:\n    key = from_message(exc)\n"
    assert _message_reads(helper) == [  # handing the error to a helper that reads its text
        "line 4: exc used beyond ['allowed', 'argument', 'requirement', 'value']"]
    reads = ("try:\n    f()\nexcept (ArgumentError, ArgumentTypeError) as exc:\n"
             "    raise ConfigError(exc.argument, exc.value, exc.requirement) from None\n")
    assert _message_reads(reads) == []


@pytest.mark.parametrize("data, message", [
    ({"recipes": [{"name": "a", "format": {"kind": "int4"}}]},
     "config key 'recipes[0].format': got {'kind': 'int4'}; allowed: format kind must be one of "
     "('fixed_point', 'int_quant', 'float', 'gguf', 'mx', 'nvfp4')"),
    ({"recipes": [{"name": "a", "format": {"bits": 8}}]},
     "config key 'recipes[0].format': got {'bits': 8}; allowed: a format dict needs a 'kind' "
     "key, one of ('fixed_point', 'int_quant', 'float', 'gguf', 'mx', 'nvfp4')"),
    ({"recipes": [{"name": "a", "format": {"kind": "float", "bits": 8}}]},
     "config key 'recipes[0].format': got {'kind': 'float', 'bits': 8}; allowed: unknown key(s) "
     "['bits'] for format 'float'; allowed: ['dtype', 'kind', 'overflow']"),
    ({"campaign": {"fault": {"kind": "melt"}}},
     "config key 'campaign.fault': got {'kind': 'melt'}; allowed: fault kind must be 'bit_flip' "
     "or 'stuck_at'"),
    ({"campaign": {"fault": {"kind": "stuck_at", "value": 2}}},
     "config key 'campaign.fault.value': got 2; allowed: value must be 0 or 1"),
    ({"campaign": {"fault": {"kind": "stuck_at"}}},
     "config key 'campaign.fault': got {'kind': 'stuck_at'}; allowed: a 'stuck_at' fault needs "
     "'value' (0 or 1)"),
    ({"campaign": {"fault": {"kind": "bit_flip", "value": 1}}},
     "config key 'campaign.fault': got {'kind': 'bit_flip', 'value': 1}; allowed: unknown key(s) "
     "['value'] for fault 'bit_flip'; allowed: ['bits']"),
    ({"recipes": [{"name": "a", "format": None,
                   "fault_aware": {"ber": 0.1, "fault": {"kind": "melt"}}}]},
     "config key 'recipes[0].fault_aware.fault': got {'kind': 'melt'}; allowed: fault kind must "
     "be 'bit_flip' or 'stuck_at'"),
    ({"recipes": [{"name": "a", "format": None, "fault_aware": {"ber": 0.1, "count": 3}}]},
     "config key 'recipes[0].fault_aware': got {'ber': 0.1, 'count': 3}; allowed: give exactly "
     "one of ber=, count= or maps="),
    ({"recipes": [{"name": "a", "format": None, "fault_aware": {"ber": [0.1, 0.2]}}]},
     "config key 'recipes[0].fault_aware.ber': got [0.1, 0.2]; allowed: ber as a sequence needs "
     "one rate per bit position (32 for this format, LSB first)"),
    # the README's two example lines
    ({"recipes": [{"name": "a"}, {"name": "b", "weight_clip": -1}]},
     "config key 'recipes[1].weight_clip': got -1; allowed: weight_clip must be a positive "
     "finite number"),
    ({"train": {"epoch": 3}},
     "config key 'train.epoch': unknown; allowed: batch_size, epochs, lr, optimizer, "
     "weight_decay"),
])
def test_core_errors_in_a_config_read_exactly(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(data)
    assert str(info.value) == message


_FX = {"kind": "fixed_point"}
_MAP = {"a": {"shape": [2], "indices": [0], "masks": [1]}}


@pytest.mark.parametrize("fault_aware", [
    {"format": _FX}, {"ber": 0.1, "fault": {"kind": "bit_flip", "bits": "exponent"}},
    {"ber": 0.1, "fault": {"kind": "bit_flip", "bits": [1.5]}},
    {"ber": 0.1, "fault": {"kind": "bit_flip", "bits": []}}, {"ber": {"exponent": 0.1}},
    {"ber": [0.1, "x"]}, {"ber": [0.1, None]}, {"count": -1}, {"maps": {}},
    {"maps": {"fc1.weight": 3}}, {"maps": {"a": {"shape": [-1], "indices": [], "masks": []}}},
    {"maps": _MAP, "persistence": "transient"}, {"ber": 0.1, "targets": {"bogus": 1}},
    {"ber": 0.1, "format": {}}, {"ber": 0.1, "format": {"kind": "fixed_point", "x": 1}},
    {"ber": 0.1, "fault": {"kind": ["x"]}},
])
def test_every_core_error_in_a_config_is_a_config_error(fault_aware: dict) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"recipes": [{"name": "a", "format": None, "fault_aware": fault_aware}]})
    assert info.value.key.startswith("recipes[0].fault_aware"), str(info.value)


def test_campaign_targets_take_the_targets_vocabulary() -> None:
    """campaign.targets also takes {kinds, include, exclude}: bitfault.Targets, as a spec's
    targets and the evaluators read it; it round-trips through config.json."""
    base = {"recipes": [{"name": "int8", "format": {"kind": "int_quant", "bits": 8}}]}
    wanted = {"kinds": ["weights", "biases"], "include": ["fc*"], "exclude": ["fc3.*"]}
    config = load_config({**base, "campaign": {"targets": wanted}})
    assert config.campaign.targets == bf.Targets(("weights", "biases"), ("fc*",), ("fc3.*",))
    assert config.to_dict()["campaign"]["targets"] == wanted
    assert load_config(config.to_dict()) == config
    with pytest.raises(ConfigError) as err:
        load_config({**base, "campaign": {"targets": {"kinds": ["weights"], "bogus": 1}}})
    assert err.value.key == "campaign.targets"
    with pytest.raises(ConfigError) as err:
        load_config({**base, "campaign": {"targets": {"kinds": ["everything"]}}})
    assert err.value.key == "campaign.targets"


def test_package_paths_resolve_inside_the_installed_package_without_importing_it() -> None:
    import os

    import numpy

    from bitfault.config.pretrained import local_path, pretrained_model

    here = local_path("package:numpy/__init__.py", "model.path")
    assert here is not None and os.path.samefile(here, numpy.__file__)
    assert local_path("/some/file.gguf", "model.path") == "/some/file.gguf"
    assert local_path(None, "data.tokenizer") is None
    for value, allowed in (("package:numpy/no_such_file.gguf", "does not exist"),
                           ("package:no_such_package_xyz/a.gguf", "no package")):
        with pytest.raises(ConfigError) as err:
            local_path(value, "model.path")
        assert err.value.key == "model.path" and allowed in err.value.allowed
    # malformed: named when the config is read, before any lookup
    for value in ("package:numpy", "package:numpy/", "package:numpy/../x.gguf",
                  "package:/abs.gguf", "package:not-a-module/x.gguf"):
        with pytest.raises(ConfigError) as err:
            pretrained_model({"kind": "gguf", "path": value})
        assert err.value.key == "model.path" and "MODULE/PATH" in err.value.allowed
    assert pretrained_model({"kind": "gguf", "path": "package:llm_x/m.gguf"}).path == \
        "package:llm_x/m.gguf"  # kept as written; resolved when a run is planned
