"""A campaign's result: every trial from the store, its summaries and outcome shares, and
what a stored memory's decoder did in one trial."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from bitfault.campaign.evaluator import Maps
from bitfault.campaign.metrics import BENIGN_COSINE, outcome_summary
from bitfault.campaign.stats import SUMMARY_COLUMNS, summary_rows
from bitfault.campaign.store import TrialRecord


@dataclass
class CampaignResult:
    """Every trial of a campaign (from the store, including earlier runs)."""

    records: list[TrialRecord]
    ran: int = 0
    skipped: int = 0
    clean: dict[str, float] = field(default_factory=dict)
    stopping: dict[str, Any] | None = None  # with run(stop=...): the estimate it stopped on
    # tensor -> the error a fast path of the evaluator failed with (it took the exact path)
    fallbacks: dict[str, str] = field(default_factory=dict)

    def to_dataframe(self) -> Any:
        import pandas as pd

        return pd.DataFrame([r.flat() for r in self.records])

    def summary(self, metric: str = "accuracy",
                confidence: float = 0.95) -> list[dict[str, Any]]:
        """Across chips: ``summary_rows`` of ``metric`` (a bounded one, such as accuracy or
        cosine, gets an interval inside its bounds, perplexity and KL one above their
        floor; a chip where it is not finite is counted in ``non_finite``, never averaged).
        For perplexity and KL read the ``median`` and quartiles (``stats.headline_stat``):
        one chip's 1e7 moves the mean, not them."""
        for r in self.records:
            if metric not in r.metrics:
                raise KeyError(f"metric {metric!r} not recorded; have {sorted(r.metrics)}")
        return summary_rows(self.records, metric, confidence)

    def to_frame(self, metric: str = "accuracy", confidence: float = 0.95) -> Any:
        """``summary(metric, confidence)`` as a pandas DataFrame, columns in
        ``stats.SUMMARY_COLUMNS`` order (NaN where a group has no finite chip)."""
        import pandas as pd

        return pd.DataFrame(self.summary(metric, confidence), columns=list(SUMMARY_COLUMNS))

    def outcomes(self, confidence: float = 0.95,
                 benign_cosine: float = BENIGN_COSINE) -> list[dict[str, Any]]:
        """An ``OutputMetric`` campaign's share of trials in each outcome class, with Wilson
        intervals, per (kind, ber, target, bit) (``metrics.outcome_summary``)."""
        return outcome_summary(self.records, confidence, benign_cosine)

    def to_json(self) -> str:
        """The result as JSON; with an ``OutputMetric``'s trials, ``outcomes`` too."""
        body = {"clean": self.clean, "ran": self.ran, "skipped": self.skipped,
                "stopping": self.stopping, "fallbacks": self.fallbacks,
                "trials": [r.flat() for r in self.records]}
        if self.records and all("masked" in r.metrics for r in self.records):
            body["outcomes"] = self.outcomes()
        return json.dumps(body, sort_keys=True)


def memory_outcomes(maps: Maps) -> dict[str, int]:
    """What a stored memory's decoder did in one trial, summed over every tensor and plane
    (``storage``'s maps record it): ``raw_bit_errors``, ``words_corrected``, ``words_due``
    (detected, uncorrectable), ``words_silent`` (wrong data, undetected), and ``detected``
    (1 when any word was DUE: the trial is flagged); empty for other memories."""
    total: dict[str, int] = {}
    for fmap in maps.values():
        for m in (fmap, *fmap.planes.values()):
            for key, value in m.meta.get("outcomes", {}).items():
                total[key] = total.get(key, 0) + int(value)
    if not total:
        return {}
    return {"raw_bit_errors": total["bit_errors"], "words_corrected": total["corrected"],
            "words_due": total["due"], "words_silent": total["silent"],
            "detected": int(total["due"] > 0)}
