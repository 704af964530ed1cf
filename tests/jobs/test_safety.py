"""Data safety of the run commands (issue 14): nothing deleted, refused commands change
nothing, one process per run directory, summaries from the stores, no code from a run
directory, model files written whole and read with errors naming them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mlxtend")

from bitfault.config import ConfigError, load_config  # noqa: E402
from bitfault.jobs import Reporter, RunDir, make_report, run_campaign, train  # noqa: E402
from bitfault.jobs.lock import RunDirBusy  # noqa: E402
from bitfault.jobs.models import UntrustedModel, load_model, save_model  # noqa: E402


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``: file contents, None for folders."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
            for p in sorted(root.rglob("*"))}


def config_of(run: Path, **campaign: Any) -> dict[str, Any]:
    config = json.loads((run / "config.json").read_text())
    config["output"] = str(run)  # the copy's config names the directory it was copied from
    config["campaign"].update(campaign)
    return config


def test_overwrite_and_retraining_move_old_results_aside(tiny_run: Path) -> None:
    (tiny_run / "models" / "int8" / "my-notes.txt").write_text("mine")
    run_campaign(tiny_run)
    old_store = (tiny_run / "campaign" / "int8.sqlite").read_bytes()
    old_model = (tiny_run / "models" / "clip" / "model.pt").read_bytes()
    (tiny_run / "campaign" / "secded").mkdir()  # a store in a memory a comparison named
    (tiny_run / "campaign" / "secded" / "int8.sqlite").write_bytes(old_store)
    (tiny_run / "campaign" / "secded" / "clip.sqlite").write_bytes(old_store)
    config = config_of(tiny_run)
    config["recipes"][0]["weight_clip"] = 0.5  # int8 changes: trained again
    _, results = train(config)
    assert {n: r["trained"] for n, r in results.items()} == {"int8": True, "clip": False}
    [first] = (tiny_run / "replaced").iterdir()
    assert (first / "models" / "int8" / "my-notes.txt").read_text() == "mine"
    assert (first / "campaign" / "int8.sqlite").read_bytes() == old_store
    assert not (tiny_run / "campaign" / "int8.sqlite").exists()
    assert (first / "campaign" / "secded" / "int8.sqlite").read_bytes() == old_store
    assert not (tiny_run / "campaign" / "secded" / "int8.sqlite").exists()
    assert (tiny_run / "campaign" / "secded" / "clip.sqlite").is_file()  # clip was kept
    assert sorted(p.name for p in (tiny_run / "models").iterdir()) == ["clip", "int8"]
    # other training settings with overwrite: the whole old run moves, nothing is deleted
    train({**config, "train": {**config["train"], "epochs": 1}}, overwrite=True)
    [second] = set((tiny_run / "replaced").iterdir()) - {first}
    assert (second / "models" / "clip" / "model.pt").read_bytes() == old_model
    assert json.loads((second / "config.json").read_text())["train"]["epochs"] == 3
    assert (second / "campaign" / "clip.sqlite").is_file()
    assert json.loads((tiny_run / "config.json").read_text())["train"]["epochs"] == 1


def test_train_refuses_a_folder_of_other_things(tiny_run: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    (mine / "models" / "int8").mkdir(parents=True)
    (mine / "models" / "int8" / "thesis.tex").write_text("years of work")
    before = snapshot(mine)
    with pytest.raises(ValueError, match="not a run directory .* but holds models"):
        train({**config_of(tiny_run), "output": str(mine)})
    assert snapshot(mine) == before


def test_a_different_campaign_is_refused_then_moved_aside(tiny_run: Path) -> None:
    run_campaign(tiny_run)
    before = snapshot(tiny_run)
    for change, what in (({"seed": 6}, r"the chips' seeds \(campaign.seed\)"),
                         ({"fault": {"kind": "stuck_at", "value": 1}},
                          r"the memory's fault \(campaign.fault\)"),
                         ({"targets": ["fc1.weight"]}, "the model")):
        with pytest.raises(ValueError, match=f"int8.sqlite: holds trials of another campaign "
                                             f"\\(it differs in {what}.*--replace-store"):
            run_campaign(tiny_run, config_of(tiny_run, **change))
        assert snapshot(tiny_run) == before
    summary = run_campaign(tiny_run, config_of(tiny_run, seed=6), replace_stores=True)
    assert summary["models"]["int8"]["skipped"] == 0 and summary["models"]["int8"]["complete"]
    moved = Path(summary["moved_aside"])
    assert moved.parent == tiny_run / "replaced"
    assert (moved / "campaign" / "int8.sqlite").read_bytes() == before["campaign/int8.sqlite"]


@pytest.mark.parametrize("change", [
    {"data": {"source": "npz", "path": "missing.npz"}},      # the data files
    {"model": {"name": "bf_no_such_module:net"}},             # the model builder
    {"campaign": {"targets": ["fc9.weight"]}},                # the grid
])
def test_a_failed_train_leaves_the_run_directory_as_it_was(tiny_run: Path,
                                                           change: dict) -> None:
    before = snapshot(tiny_run)
    with pytest.raises((ConfigError, FileNotFoundError, ValueError)):
        train({**config_of(tiny_run), **change}, overwrite=True)
    assert snapshot(tiny_run) == before


def test_a_failed_campaign_leaves_the_run_directory_as_it_was(tiny_run: Path,
                                                              tmp_path: Path) -> None:
    before = snapshot(tiny_run)
    with pytest.raises(ConfigError, match="'campaign.targets'.*names of tensors the model has"):
        run_campaign(tiny_run, config_of(tiny_run, targets=["fc1.weight", "fc9.weight"]))
    with pytest.raises(ConfigError, match="'campaign.seed': got 9223372036854775807"):
        run_campaign(tiny_run, config_of(tiny_run, seed=2**63 - 1))
    assert snapshot(tiny_run) == before
    fresh = tmp_path / "new"  # a model that cannot be built: no directory is created
    with pytest.raises(ConfigError, match="model.name"):
        train({**config_of(tiny_run), "output": str(fresh),
               "model": {"name": "bf_no_such_module:net"}})
    assert not fresh.exists()


HOLDER = """
import sys
from bitfault.jobs.lock import lock_run_dir
with lock_run_dir(sys.argv[1], "campaign (test holder)"):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_busy_run_directory_fails_fast_naming_the_holder(tiny_run: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tiny_run)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(tiny_run)
        for job in (lambda: run_campaign(tiny_run), lambda: train(config_of(tiny_run)),
                    lambda: make_report(tiny_run)):
            with pytest.raises(RunDirBusy, match=f"in use by pid {holder.pid} on .*campaign "
                                                 r"\(test holder\)"):
                job()
        assert snapshot(tiny_run) == before
    finally:
        holder.communicate("")
    assert holder.returncode == 0 and not (tiny_run / ".lock").exists()
    assert run_campaign(tiny_run)["models"]["int8"]["ran"] == 10  # free again


class StopAt(Reporter):
    """Interrupts the campaign once the model ``name`` has stored a batch of trials."""

    def __init__(self, name: str) -> None:
        super().__init__(False)
        self.name = name

    def bar(self, description: str, total: int, unit: str = "it") -> Any:
        from contextlib import contextmanager

        @contextmanager
        def bar() -> Any:
            def update(done: int, total: int) -> None:
                if description == f"faults {self.name}" and done:
                    raise KeyboardInterrupt
            yield update
        return bar()


def test_an_interrupted_campaign_keeps_every_model_in_the_summary(tiny_run: Path) -> None:
    pytest.importorskip("matplotlib")
    run_campaign(tiny_run)
    more = config_of(tiny_run, bers=[1e-3, 1e-2, 5e-2])
    with pytest.raises(KeyboardInterrupt):
        run_campaign(tiny_run, more, reporter=StopAt("clip"))
    models = json.loads((tiny_run / "summary.json").read_text())["models"]
    assert sorted(models) == ["clip", "int8"]
    assert models["int8"]["complete"] and (models["int8"]["stored"], models["int8"]["trials"]) \
        == (12, 12)
    assert not models["clip"]["complete"] and 10 <= models["clip"]["stored"] < 12
    notes: list[str] = []
    reporter = Reporter(True)
    reporter.note = notes.append  # type: ignore[method-assign]
    html = Path(make_report(tiny_run, reporter=reporter)["html"]).read_text()
    assert "Incomplete campaigns" in html and "clip (" in html
    assert notes and notes[0].startswith("incomplete: clip (")


def test_model_code_from_a_run_directory_is_not_run(tiny_run: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "bf_evil.py").write_text(textwrap.dedent(f"""
        open({str(marker)!r}, "w").close()
        from bitfault.models.torch import seed_mlp as build
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    info_path = tiny_run / "models" / "int8" / "model.json"
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**info, "name": "bf_evil:build"}))
    with pytest.raises(UntrustedModel, match="names the callable 'bf_evil:build'"):
        run_campaign(tiny_run)
    with pytest.raises(UntrustedModel):  # the user's config names another model
        run_campaign(tiny_run, config_of(tiny_run))
    assert not marker.exists() and not (tiny_run / "summary.json").exists()
    assert load_model(tiny_run / "models" / "clip") is not None  # built-ins always load


def test_model_files_are_written_whole_and_read_with_their_path(
        tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tiny_run / "models" / "int8"
    model = load_model(directory)
    good = (directory / "model.pt").read_bytes()

    def disk_full(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        Path(f).write_bytes(b"PK\x03\x04half")
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(torch, "save", disk_full)
    config = load_config(tiny_run / "config.json")
    with pytest.raises(OSError, match=f"{directory / 'model.pt'}: not written "
                                      r"\(PytorchStreamWriter failed .*\); nothing was replaced"):
        save_model(model, directory, "torch", config.model, config.seed)
    assert (directory / "model.pt").read_bytes() == good
    assert sorted(p.name for p in directory.iterdir()) == ["history.json", "model.json",
                                                           "model.pt", "recipe.json"]
    monkeypatch.undo()
    (directory / "model.pt").write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match=f"{directory / 'model.pt'}: cannot be read, it may be "
                                         "truncated"):
        load_model(directory)
    assert RunDir(tiny_run).trained("int8")
