"""The command line as installed: --version, map, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import bitfault as bf


def bitfault_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bitfault.cli", *args], capture_output=True,
                          text=True)


def test_version() -> None:
    out = bitfault_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"bitfault {bf.__version__}"


def test_map_writes_the_map_the_library_draws(tmp_path: Path) -> None:
    path = tmp_path / "fc1.npz"
    out = bitfault_cli("map", str(path), "--shape", "64,32", "--name", "fc1.weight",
                       "--ber", "0.01", "--seed", "3", "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    expected = bf.FaultMap.random((64, 32), bf.FixedPoint(32, 28, rounding="trunc"), ber=0.01,
                                  seed=3, name="fc1.weight")
    loaded = bf.FaultMap.load(path, shape=(64, 32), name="fc1.weight")
    assert loaded == expected and summary["faults"] == expected.n_faults
    assert np.array_equal(loaded.to_dense(), expected.to_dense())


def test_map_draws_every_plane_of_a_block_format_at_its_rate(tmp_path: Path) -> None:
    path = tmp_path / "fc1.npz"
    out = bitfault_cli("map", str(path), "--shape", "16,64", "--name", "fc1.weight",
                       "--format", '{"kind": "mx", "element": "float4_e2m1fn"}',
                       "--ber", "codes=0.01,scale=0.05", "--seed", "2", "--json")
    assert out.returncode == 0, out.stderr
    expected = bf.FaultMap.random((16, 64), bf.MX("float4_e2m1fn"), seed=2, name="fc1.weight",
                                  ber={"codes": 0.01, "scale": 0.05})
    assert bf.FaultMap.load(path) == expected and expected.planes["scale"].n_faults > 0
    assert json.loads(out.stdout)["planes"]["scale"]["name"] == "fc1.weight:scale"
    bad = bitfault_cli("map", str(tmp_path / "x.npz"), "--shape", "16,64", "--name", "w",
                       "--format", '{"kind": "mx", "element": "float4_e2m1fn"}', "--ber",
                       "min=0.1")
    assert bad.returncode == 2 and "'min' is neither a plane of MX" in bad.stderr
    assert not (tmp_path / "x.npz").exists()


def test_bad_input_exits_2_with_one_line(tmp_path: Path) -> None:
    out = bitfault_cli("map", str(tmp_path / "x.npz"), "--shape", "4,4", "--name", "w",
                       "--ber", "1.5")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "bitfault: error: argument --ber: ber must be in [0, 1], got 1.5"]
    assert not (tmp_path / "x.npz").exists()


def test_map_never_overwrites_what_is_not_a_fault_map(tmp_path: Path) -> None:
    draw = ("--shape", "4,4", "--name", "w", "--ber", "0.1")
    notes, model, folder = tmp_path / "notes.txt", tmp_path / "model.npz", tmp_path / "maps"
    notes.write_text("my notes\n")
    np.savez(model, weights=np.ones(3))
    folder.mkdir()
    for target, flags, cause in [
        (notes, (), f"{notes}: exists; pass --overwrite"),
        (notes, ("--overwrite",), f"{notes}: exists and is not a bitfault fault map (not an "
                                  ".npz file), so it is not replaced, even with --overwrite"),
        (model, ("--overwrite",), f"{model}: exists and is not a bitfault fault map"),
        (folder, (), f"{folder}: is a directory; give the .npz file to write"),
        (tmp_path / "no" / "m.npz", (), f"{tmp_path / 'no' / 'm.npz'}: the folder "
                                        f"{tmp_path / 'no'} does not exist"),
    ]:
        out = bitfault_cli("map", str(target), *draw, *flags)
        assert out.returncode == 2, out.stderr
        assert out.stderr.startswith(f"bitfault: error: {cause}"), out.stderr
    assert notes.read_text() == "my notes\n" and list(np.load(model)) == ["weights"]
    assert list(folder.iterdir()) == []
    fmap = tmp_path / "m.npz"
    assert bitfault_cli("map", str(fmap), *draw).returncode == 0
    assert bitfault_cli("map", str(fmap), *draw).returncode == 2  # exists
    out = bitfault_cli("map", str(fmap), "--shape", "4,4", "--name", "w", "--ber", "0.5",
                       "--overwrite")
    assert out.returncode == 0, out.stderr
    assert bf.FaultMap.load(fmap).meta["ber"] == 0.5


def test_map_refuses_an_empty_name_and_maps_too_large_naming_the_flag(tmp_path: Path) -> None:
    out = tmp_path / "m.npz"
    for args, cause in [
        (("--shape", "4,4", "--name", "", "--ber", "0.1"), "argument --name: name must be a "
                                                           "tensor name"),
        (("--shape", "100000,100000,100000", "--name", "w", "--ber", "1e-3"),
         "argument --ber: ber 0.001 on shape (100000, 100000, 100000)"),
        (("--shape", "1000000000,1000000000", "--name", "w", "--ber", "1e-3"),
         "argument --shape: shape (1000000000, 1000000000) has 3.2e+19 bit cells"),
    ]:
        done = bitfault_cli("map", str(out), *args)
        assert done.returncode == 2 and done.stderr.startswith(f"bitfault: error: {cause}"), \
            done.stderr
    assert not out.exists()


# ---- the run commands: exit codes and --json on bad input (no framework needed) -------------


def test_bad_config_exits_2_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("train:\n  epoch: 3\n")
    out = bitfault_cli("train", str(config))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "bitfault: error: config key 'train.epoch': unknown; allowed: batch_size, epochs, lr, "
        "optimizer, weight_decay"]
    out = bitfault_cli("--json", "campaign", str(config))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert json.loads(out.stdout) == {
        "command": "campaign", "ok": False, "exit_code": 2,
        "error": "config key 'train.epoch': unknown; allowed: batch_size, epochs, lr, optimizer, "
                 "weight_decay"}
    assert not (tmp_path / "runs").exists()


def test_bad_paths_exit_2(tmp_path: Path) -> None:
    (tmp_path / "c.ini").write_text("[train]\n")
    for args, cause in [
        (("train", str(tmp_path / "gone.ini")), f"{tmp_path / 'gone.ini'}: no such config file"),
        (("report", str(tmp_path / "nope")), f"{tmp_path / 'nope'}: no such run directory"),
        (("campaign", str(tmp_path / "nope.yaml")), f"{tmp_path / 'nope.yaml'}: no such config"),
        (("train", str(tmp_path / "c.ini")), f"{tmp_path / 'c.ini'}: config files end in .yaml"),
        (("inject", str(tmp_path / "m.pt"), "--spec", "s.json", "--output", "o.pt"),
         f"{tmp_path / 'm.pt'}: no such model file"),
        (("inject", str(tmp_path), "--output", "o.pt"), "give a fault spec (--spec)"),
    ]:
        out = bitfault_cli(*args, "--json")
        assert out.returncode == 2, (args, out.stderr)
        [line] = out.stderr.strip().splitlines()
        assert line.startswith(f"bitfault: error: {cause}"), line
        assert json.loads(out.stdout)["error"].startswith(cause)


def test_usage_errors_are_one_line_and_help_is_not_an_error() -> None:
    out = bitfault_cli("train")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "bitfault: error: the following arguments are required: config (see `bitfault train "
        "--help`)"]
    out = bitfault_cli("demo", "--framework", "jax")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    out = bitfault_cli()
    assert out.returncode == 0 and "demo" in out.stdout and "inject" in out.stdout


def test_json_flag_before_or_after_the_command(tmp_path: Path) -> None:
    for args in (("--json", "map", str(tmp_path / "a.npz")), ("map", str(tmp_path / "a.npz"),
                                                             "--json")):
        out = bitfault_cli(*args, "--shape", "8,8", "--name", "w", "--count", "3",
                           "--overwrite")  # the second run replaces the first's map
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert (result["command"], result["ok"], result["faults"]) == ("map", True, 3)
