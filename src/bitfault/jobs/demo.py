"""``demo``: train the seed's MLP several ways, sweep bit error rates, write the report.

The config is data (``DEMO_CONFIG``, the same as ``examples/demo.yaml``); ``fast``
shrinks it to a smoke test (1,000 training digits, 2 epochs, 64 hidden units, 3 rates
x 3 chips) that finishes in seconds.
"""

from __future__ import annotations

import copy
from typing import Any

from bitfault.config import RunConfig, load_config
from bitfault.jobs.campaign import run_campaign
from bitfault.jobs.progress import SILENT, Reporter
from bitfault.jobs.report import format_rate_table, make_report
from bitfault.jobs.run_dir import RunDir
from bitfault.jobs.train import train

_INT8 = {"kind": "int_quant", "bits": 8}
_FIXED32 = {"kind": "fixed_point", "bits": 32, "frac": 28, "rounding": "trunc"}

DEMO_CONFIG: dict[str, Any] = {
    "framework": "torch",
    "seed": 0,
    "output": "bitfault-demo",
    "title": "bitfault demo: the seed's MLP under bit flips in its stored weights",
    "data": {"source": "embedded"},
    "model": {"name": "seed_mlp", "kwargs": {"hidden": 256}},
    "train": {"epochs": 10, "batch_size": 100, "lr": 0.05, "optimizer": "sgd"},
    "recipes": [
        {"name": "normal-int8", "format": _INT8},
        {"name": "fault-aware-int8", "format": None,
         "fault_aware": {"format": _INT8, "ber": 0.01, "persistence": "transient"}},
        {"name": "robust-int8", "format": _INT8, "weight_clip": 0.1,
         "randbet": {"p_train": 0.1}},
        {"name": "normal-fixed32", "format": _FIXED32},
        # fault-aware training alone does not help FixedPoint(32, 28) (a flipped top bit adds
        # 1 to 8 to a weight whatever it learnt); bounded ReLUs limit what such a weight does
        {"name": "robust-fixed32", "format": None, "activation_clip": 1.0,
         "fault_aware": {"format": _FIXED32, "ber": 1e-4, "persistence": "transient"}},
    ],
    "campaign": {"bers": [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1], "chips": 10,
                 "seed": 1000, "fault": {"kind": "bit_flip"}, "targets": "weights",
                 "layers": True, "bits": True, "sensitivity_bers": [1e-3, 1e-2, 0.1],
                 "sensitivity_chips": 3, "single_faults": 0.05},
}

FAST_CHANGES: dict[str, Any] = {
    "data": {"train_limit": 1000},
    "model": {"kwargs": {"hidden": 64}},
    "train": {"epochs": 2},
    "campaign": {"bers": [1e-3, 1e-2, 0.1], "chips": 3, "sensitivity_bers": [1e-2]},
}


def demo_config(*, fast: bool = False, output: str | None = None,
                framework: str | None = None) -> RunConfig:
    """The demo's RunConfig (``fast``: the smoke-test sizes)."""
    data = copy.deepcopy(DEMO_CONFIG)
    if fast:
        for section, changes in FAST_CHANGES.items():
            for k, v in changes.items():
                data[section][k] = {**data[section][k], **v} if isinstance(v, dict) else v
        data["title"] += " (--fast)"
    if output is not None:
        data["output"] = output
    if framework is not None:
        data["framework"] = framework
    return load_config(data)


def demo(*, fast: bool = False, output: str | None = None, framework: str | None = None,
         reporter: Reporter = SILENT) -> dict[str, Any]:
    """Train, run the campaign and write the report; returns what happened.

    Keys: ``run_dir``, ``report`` (report.html), ``train`` (per model), ``summary``
    (summary.json's content), ``files`` (report artefacts), ``table`` (the text table).
    An existing demo directory is reused where its settings match, else overwritten; a
    directory holding any other run is refused.
    """
    config = demo_config(fast=fast, output=output, framework=framework)
    existing = RunDir(config.output)
    if existing.exists() and not existing.config().title.startswith(DEMO_CONFIG["title"]):
        raise ValueError(f"{existing.path}: holds a run that is not the demo's; choose another "
                         "--output (the demo replaces what it finds there)")
    rd, trained = train(config, reporter=reporter, overwrite=True)
    summary = run_campaign(rd.path, reporter=reporter, replace_stores=True)
    files = make_report(rd.path)
    return {"run_dir": str(rd.path), "report": files["html"], "train": trained,
            "summary": summary, "files": files, "table": format_rate_table(summary)}


__all__ = ["DEMO_CONFIG", "FAST_CHANGES", "demo", "demo_config"]
