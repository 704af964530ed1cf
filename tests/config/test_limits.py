"""Config input that is refused: empty files, alias bombs, huge counts, paths that are not
paths, recipes a campaign cannot measure; long values are cut in messages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bitfault.config import ConfigError, load_config
from bitfault.config.checks import MAX_CONFIG_BYTES, MAX_EPOCHS
from bitfault.recipes import Recipe


@pytest.mark.parametrize("name,text", [("c.yaml", ""), ("c.yml", "# only a comment\n"),
                                       ("c.toml", ""), ("c.json", "{}"), ("c.yaml", "{}\n"),
                                       ("c.toml", "# nothing\n")])
def test_an_empty_config_file_is_an_error_in_every_syntax(tmp_path: Path, name: str,
                                                          text: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=rf"{name}: empty config file \(no settings\)"):
        load_config(tmp_path / name)


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    (tmp_path / "bomb.yaml").write_text("\n".join([*lines, "title: *a8"]) + "\n")
    with pytest.raises(ValueError, match=r"bomb.yaml: more than 100,000 values once its "
                                         "aliases are expanded"):
        load_config(tmp_path / "bomb.yaml")
    (tmp_path / "loop.yaml").write_text("title: &a [*a]\n")
    with pytest.raises(ValueError, match="loop.yaml: .*an alias refers to a value that "
                                         "contains it"):
        load_config(tmp_path / "loop.yaml")
    # a few aliases are fine
    (tmp_path / "ok.yaml").write_text("campaign: {bers: &r [1.0e-3, 1.0e-2], "
                                      "sensitivity_bers: *r}\n")
    assert load_config(tmp_path / "ok.yaml").campaign.sweep_bers == (1e-3, 1e-2)


def test_a_config_file_has_a_size_limit(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text('{"title": "' + "x" * MAX_CONFIG_BYTES + '"}')
    with pytest.raises(ValueError, match=r"big.json: 1,048,589 bytes; a config file holds at "
                                         r"most 1,048,576 bytes"):
        load_config(big)


def test_long_values_are_cut_in_messages() -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"title": ["x" * 100] * 10_000})
    message = str(info.value)
    assert len(message) < 400 and "..." in message and message.startswith(
        "config key 'title': got [")
    with pytest.raises(ConfigError, match=r"got 'jax'; allowed"):  # short values as they are
        load_config({"framework": "jax"})


def test_tilde_in_paths_is_the_home_directory() -> None:
    home = os.path.expanduser("~")
    assert load_config({"output": "~"}).output == home
    assert load_config({"output": "~/runs/x"}).output == os.path.join(home, "runs", "x")
    config = load_config({"data": {"source": "npz", "path": "~/mnist.npz"}})
    assert config.data.path == os.path.join(home, "mnist.npz")
    assert load_config(config.to_dict()) == config
    with pytest.raises(ConfigError, match=r"'output': got '~no-such-user-bitfault/x'; allowed: "
                                          r"a directory path \(string\); '~no-such-user-"
                                          "bitfault' names no user's home directory"):
        load_config({"output": "~no-such-user-bitfault/x"})


def test_a_nul_character_in_a_path_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"config key 'output': got 'a\\x00b'; allowed: a "
                                          "directory path .*without NUL characters"):
        load_config({"output": "a\0b"})
    with pytest.raises(ConfigError, match=r"config key 'data.path': got 'm\\x00.npz'"):
        load_config({"data": {"source": "npz", "path": "m\0.npz"}})


@pytest.mark.parametrize("key,section,value", [
    ("train.epochs", "train", {"epochs": MAX_EPOCHS + 1}),
    ("train.batch_size", "train", {"batch_size": 10**9}),
    ("model.kwargs.hidden", "model", {"name": "seed_mlp", "kwargs": {"hidden": 10**7}}),
    ("campaign.batch", "campaign", {"batch": 10**6}),
])
def test_counts_have_upper_bounds(key: str, section: str, value: dict) -> None:
    with pytest.raises(ConfigError, match=rf"config key '{key}': got \d+; allowed: a positive "
                                          r"integer and <= \d+"):
        load_config({section: value})
    assert load_config({"train": {"epochs": MAX_EPOCHS}}).train.epochs == MAX_EPOCHS


def test_recipes_absent_is_one_int8_recipe_and_every_recipe_needs_a_stored_format() -> None:
    assert load_config({"title": "t"}).recipes == (Recipe(name="normal"),)
    assert Recipe(name="normal").stored_format is not None
    with pytest.raises(ConfigError, match=r"config key 'recipes': got \[\]; allowed: a "
                                          "non-empty list of recipes"):
        load_config({"recipes": []})
    with pytest.raises(ConfigError, match=r"config key 'recipes\[1\].format': got None; "
                                          "allowed: a format or fault_aware spec: campaigns "
                                          "fault stored words, and recipe 'float'"):
        load_config({"recipes": [{"name": "int8"}, {"name": "float", "format": None}]})
    aware = load_config({"recipes": [{"name": "aware", "format": None, "fault_aware": {
        "format": {"kind": "int_quant", "bits": 8}, "ber": 0.01}}]})
    assert aware.recipes[0].stored_format is not None
