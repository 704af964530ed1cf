"""The table `bitfault campaign` prints for a pretrained model: wide cells stay apart, and a
heavy-tailed value (perplexity) is headlined by its median and quartiles, not its mean."""

from __future__ import annotations

from types import SimpleNamespace

from bitfault.campaign.stats import summary_rows
from bitfault.jobs.pretrained_summary import format_metric_table


def test_every_cell_stays_apart_however_wide_its_value() -> None:
    rows = [{"ber": 1e-6, "n": 6, "non_finite": 4, "mean": 3.751e153, "median": 1.6e17,
             "p25": 2.5e3, "p75": 3.751e153},
            {"ber": 1e-5, "n": 0, "non_finite": 10},
            {"ber": 1e-4, "n": 10, "non_finite": 0, "mean": 41.5, "median": 41.5, "p25": 40.0,
             "p75": 43.0}]
    summary = {"value": "perplexity",
               "models": {"gguf": {"rate": rows, "clean": {"perplexity": 37.4558}}}}
    head, header, line = format_metric_table(summary).splitlines()
    assert head.startswith("median perplexity [25th, 75th percentile] over simulated chips")
    assert header.split() == ["model", "no", "faults", "1e-06", "1e-05", "1e-04"]
    assert line.split() == ["gguf", "37.46", "1.6e+17", "[2500,", "3.751e+153]", "(4", "inf)",
                            "(10", "inf)", "41.5", "[40,", "43]"]
    assert len(header) == len(line)  # the columns line up


def _records(metric: str, values: list[float]) -> list[SimpleNamespace]:
    return [SimpleNamespace(kind="rate", ber=1e-8, target=None, bit=None,
                            metrics={metric: v}) for v in values]


def test_a_heavy_tailed_value_is_headlined_by_its_median() -> None:
    # two chips keep the fault-free perplexity, one flipped exponent gives 1e7
    rows = summary_rows(_records("perplexity", [37.4, 37.5, 1e7]), "perplexity")
    summary = {"value": "perplexity",
               "models": {"gguf": {"rate": rows, "clean": {"perplexity": 37.46}}}}
    table = format_metric_table(summary)
    line = table.splitlines()[2].split()
    assert line[:3] == ["gguf", "37.46", "37.5"]  # the median, not the mean 3.3e6
    assert "3.333e+06" not in table and rows[0]["ci_low"] >= 1.0


def test_a_bounded_value_keeps_its_mean() -> None:
    rows = summary_rows(_records("next_token_agreement", [1.0, 1.0, 0.4]),
                        "next_token_agreement")
    summary = {"value": "next_token_agreement",
               "models": {"m": {"rate": rows, "clean": {"next_token_agreement": 1.0}}}}
    head, _, line = format_metric_table(summary).splitlines()
    assert head.startswith("mean next token agreement") and line.split()[2] == "0.8"
