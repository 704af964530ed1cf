"""``bitfault inject`` never writes over its input and writes its output atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import bitfault as bf  # noqa: E402
from bitfault.cli import main  # noqa: E402
from bitfault.jobs import inject_file  # noqa: E402


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.pt"
    torch.save({"fc.weight": torch.randn(8, 4), "fc.bias": torch.zeros(8)}, path)
    (tmp_path / "spec.json").write_text(json.dumps(
        bf.FaultSpec(format=bf.IntQuant(8), ber=0.05, seed=1).to_dict()))
    return path


def test_output_that_is_the_input_is_refused(model: Path, tmp_path: Path, capsys) -> None:
    clean = model.read_bytes()
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.pt").symlink_to(model)
    os.link(model, tmp_path / "hard.pt")
    for output in (model, tmp_path / "sub" / ".." / "m.pt", tmp_path / "link.pt",
                   tmp_path / "hard.pt"):
        code = main(["inject", str(model), "--spec", str(tmp_path / "spec.json"), "--output",
                     str(output), "--json"])
        error = json.loads(capsys.readouterr().out)["error"]
        assert code == 2 and error.startswith(f"--output {output}: is the input model"), error
        assert model.read_bytes() == clean
    code = main(["inject", str(model), "--spec", str(tmp_path / "spec.json"), "--output",
                 str(tmp_path), "--json"])
    assert code == 2 and "is a directory" in json.loads(capsys.readouterr().out)["error"]


def test_a_failed_write_leaves_the_old_output(model: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "faulty.pt"
    out.write_bytes(b"an earlier faulty copy")

    def half_write(obj: object, path: str) -> None:
        Path(path).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", half_write)
    with pytest.raises(OSError, match="No space"):
        inject_file(model, out, spec=tmp_path / "spec.json", overwrite=True)
    assert out.read_bytes() == b"an earlier faulty copy"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["faulty.pt", "m.pt", "spec.json"]
    monkeypatch.undo()
    inject_file(model, out, spec=tmp_path / "spec.json", overwrite=True)
    assert set(torch.load(out, weights_only=True)) == {"fc.weight", "fc.bias"}
