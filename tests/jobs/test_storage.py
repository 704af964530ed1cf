"""A campaign on a stored memory (campaign.memory): trials record the decoder's outcomes,
the summary and the report show detected / sdc / benign / masked shares and the overhead."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("mlxtend")
pytest.importorskip("matplotlib")

from tiny_config import TINY

from bitfault.config import ConfigError
from bitfault.jobs import make_report, run_campaign


def test_a_secded_campaign_summarises_and_reports_its_outcomes(tiny_run: Path) -> None:
    memory = {"word_bits": 64, "protection": "secded",
              "pattern": {"kind": "mbu", "sizes": {1: 0.5, 2: 0.5}}}
    config = {**TINY, "output": str(tiny_run),
              "campaign": {"bers": [1e-3, 1e-1], "chips": 3, "seed": 5, "memory": memory}}
    summary = run_campaign(tiny_run, config)
    entry = summary["models"]["int8"]
    assert entry["memory"]["overhead"] == {"codes": 0.125}
    rows = {o["ber"]: o for o in entry["memory"]["outcomes"]}
    assert set(rows) == {1e-3, 1e-1} and all(o["trials"] == 3 for o in rows.values())
    for o in rows.values():
        assert o["detected"] + o["sdc"] + o["benign"] + o["masked"] == pytest.approx(1.0)
        assert o["detected_low"] <= o["detected"] <= o["detected_high"]
    assert rows[1e-1]["words_due"] > 0 and rows[1e-1]["detected"] == 1.0
    html = Path(make_report(tiny_run)["html"]).read_text()
    assert "Memory outcomes per rate" in html
    bad = {**config, "campaign": {**config["campaign"], "bits": True}}
    with pytest.raises(ConfigError, match="campaign.bits"):
        run_campaign(tiny_run, bad)
