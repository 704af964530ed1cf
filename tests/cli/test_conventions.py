"""Command-line conventions: ``python -m bitfault``, --json for every failure, named
argument errors, --quiet silencing TensorFlow, missing optional packages found up front."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import bitfault as bf


def bitfault(*args: str, cwd: Path | None = None, hide: str | None = None
             ) -> subprocess.CompletedProcess[str]:
    """``python -m bitfault ARGS``; ``hide``: a package made unimportable first."""
    if hide is None:
        command = [sys.executable, "-m", "bitfault", *args]
    else:
        code = (f"import sys; sys.modules[{hide!r}] = None; from bitfault.cli import main; "
                f"sys.argv[0] = 'bitfault'; raise SystemExit(main(sys.argv[1:]))")
        command = [sys.executable, "-c", code, *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd)


def one_json(out: subprocess.CompletedProcess[str]) -> dict:
    lines = out.stdout.splitlines()
    assert len(lines) == 1, out.stdout
    return json.loads(lines[0])


def test_python_dash_m_bitfault() -> None:
    out = bitfault("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"bitfault {bf.__version__}"


@pytest.mark.parametrize(("args", "command", "error"), [
    (("--json",), None, "give a command: demo, train"),
    (("--json", "frobnicate"), None, "argument command: invalid choice: 'frobnicate'"),
    (("train", "--json"), "train", "the following arguments are required: config"),
    (("map", "m.npz", "--name", "w", "--count", "1", "--json"), "map",
     "the following arguments are required: --shape"),
    (("map", "m.npz", "--shape", "256,a", "--name", "w", "--count", "1", "--json"), "map",
     "argument --shape: '256,a' is not a shape: give non-negative integers"),
    (("--json", "map", "m.npz", "--shape", "4", "--name", "w", "--count", "x"), "map",
     "argument --count: invalid int value: 'x'"),
    (("--json", "map", "m.npz", "--shape", "4", "--name", "w", "--count", "1", "--format",
      "{kind"), "map", "argument --format: not JSON"),
    (("--json", "map", "m.npz", "--shape", "4", "--name", "w", "--count", "1", "--format",
      '{"kind": "nope"}'), "map", "argument --format: format kind must be one of"),
    (("--json", "demo", "--framework", "jax"), "demo", "argument --framework: invalid choice"),
])
def test_usage_errors_under_json_are_one_json_object(tmp_path: Path, args: tuple[str, ...],
                                                     command: str | None, error: str) -> None:
    out = bitfault(*args, cwd=tmp_path)
    assert out.returncode == 2
    result = one_json(out)
    assert (result["command"], result["ok"], result["exit_code"]) == (command, False, 2)
    assert result["error"].startswith(error), result["error"]
    [line] = out.stderr.splitlines()
    assert line == f"bitfault: error: {result['error']}"
    assert list(tmp_path.iterdir()) == []


def test_shape_with_an_x_is_a_shape(tmp_path: Path) -> None:
    out = bitfault("map", str(tmp_path / "m.npz"), "--shape", "256x784", "--name", "w",
                   "--count", "5", "--json")
    assert out.returncode == 0, out.stderr
    assert one_json(out)["shape"] == [256, 784]


@pytest.mark.parametrize(("args", "package", "extra"), [
    (("demo", "--fast"), "matplotlib", "report"),
    (("demo", "--fast"), "mlxtend", "data"),
    (("demo", "--fast", "--framework", "keras"), "tensorflow", "keras"),
    (("report", "."), "matplotlib", "report"),
])
def test_a_missing_optional_package_is_found_before_any_work(
        tmp_path: Path, args: tuple[str, ...], package: str, extra: str) -> None:
    if args[0] == "demo" and "keras" not in args and importlib.util.find_spec("torch") is None:
        pytest.skip("the demo checks its framework (torch, absent here) before the rest")
    out = bitfault(*args, "--json", cwd=tmp_path, hide=package)
    assert out.returncode == 2, out.stderr
    error = one_json(out)["error"]
    assert error.startswith(f"`bitfault {args[0]}` needs {package} (")
    assert error.endswith(f"is not installed: pip install 'bitfault[{extra}]'")
    assert list(tmp_path.iterdir()) == []  # demo wrote no run directory, trained nothing


def test_quiet_silences_tensorflow(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.save(tmp_path / "k.keras")
    (tmp_path / "spec.json").write_text(json.dumps(
        bf.FaultSpec(format=bf.IntQuant(8), ber=0.05, seed=1).to_dict()))
    out = bitfault("--quiet", "inject", "k.keras", "--spec", "spec.json", "--output",
                   "faulty.keras", cwd=tmp_path)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.splitlines()[-1].startswith("wrote faulty.keras: ")
    out = bitfault("--quiet", "inject", "k.keras", "--spec", "spec.json", "--output",
                   "faulty.pt", cwd=tmp_path)  # errors still reach stderr, one line
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "bitfault: error: faulty.pt: a Keras model is written as a .keras file"]


def test_an_interrupt_under_json_is_one_json_object(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from bitfault import cli

    def interrupted(args: object, reporter: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "report", interrupted)
    assert cli.main(["report", "somewhere", "--json"]) == 130
    out = capsys.readouterr()
    assert json.loads(out.out) == {"command": "report", "ok": False, "error": "interrupted",
                                   "exit_code": 130}
    assert out.err == "bitfault: error: interrupted\n"
