"""bitfault.jobs.pretrained_summary: the plain-text table of a pretrained campaign."""

from __future__ import annotations

from bitfault.jobs.pretrained_summary import format_metric_table


def test_every_cell_stays_apart_however_wide_its_value() -> None:
    rows = [{"ber": 1e-6, "n": 6, "non_finite": 4, "mean": 3.751e153},
            {"ber": 1e-5, "n": 0, "non_finite": 10},
            {"ber": 1e-4, "n": 10, "non_finite": 0, "mean": 41.5}]
    summary = {"value": "perplexity",
               "models": {"gguf": {"rate": rows, "clean": {"perplexity": 37.4558}}}}
    head, header, line = format_metric_table(summary).splitlines()
    assert head.startswith("mean perplexity over simulated chips")
    assert header.split() == ["model", "no", "faults", "1e-06", "1e-05", "1e-04"]
    assert line.split() == ["gguf", "37.46", "3.751e+153", "(4", "inf)", "(10", "inf)", "41.5"]
    assert len(header) == len(line)  # the columns line up
