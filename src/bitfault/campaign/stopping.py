"""Sequential stopping: end a campaign once the share of failing trials is known well enough.

Statistical fault injection samples faults instead of injecting them all; the
sample size formula (``stats.fault_injection_sample_size``) assumes the worst
case, a failure share of one half. When the share is far from it, fewer faults
give the same precision: ``run(..., stop=StopWhenPrecise(margin=0.01))`` checks
the Wilson interval of the failure share after every committed batch of trials
and stops once its half-width is at most ``margin``. The trials must come in
random order (``sampled_single_faults`` returns them so), so that the ones run
are a random sample of all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bitfault.campaign.stats import wilson_interval
from bitfault.errors import check_int

Failure = Callable[[Mapping[str, float], Mapping[str, float]], bool]


def turns_a_correct_prediction_wrong(metrics: Mapping[str, float],
                                     clean: Mapping[str, float]) -> bool:
    """The default failure: some example the fault-free model gets right, the faulty one
    gets wrong (its robust error exceeds the clean error)."""
    return metrics["robust_error"] > clean["robust_error"]


@dataclass(frozen=True)
class StopWhenPrecise:
    """Stop once the failure share's ``confidence`` Wilson interval has half-width
    <= ``margin``, after at least ``min_trials`` trials.

    ``failure(trial_metrics, clean_metrics) -> bool`` says whether a trial failed;
    by default a trial fails when it turns a correct prediction wrong (needs the
    default metric's ``robust_error``).
    """

    margin: float = 0.01
    confidence: float = 0.95
    min_trials: int = 30
    failure: Failure | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.margin, (int, float)) or not 0.0 < self.margin < 0.5:
            raise ValueError(f"margin must be a number in (0, 0.5), got {self.margin!r}")
        if not isinstance(self.confidence, (int, float)) or not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence!r}")
        check_int(self.min_trials, "min_trials", 1)
        if self.failure is not None and not callable(self.failure):
            raise TypeError(f"failure must be a function (metrics, clean) -> bool, got "
                            f"{self.failure!r}")

    def check(self, clean: Mapping[str, float]) -> None:
        """Refuse, before any trial runs, a metric the default failure cannot read."""
        if self.failure is None and "robust_error" not in clean:
            raise ValueError(f"stop: the metric records no 'robust_error' (it records "
                             f"{sorted(clean)}); pass StopWhenPrecise(failure=...) saying "
                             f"which trials failed")

    def failed(self, metrics: Mapping[str, float], clean: Mapping[str, float]) -> bool:
        return bool((self.failure or turns_a_correct_prediction_wrong)(metrics, clean))

    def describe(self, estimate: Mapping[str, Any]) -> str:
        """One line for a campaign it ended early: the failure share and its interval."""
        lo, hi = estimate["interval"]
        return (f"stopped early: failure share {estimate['share']:.3f} +/- {(hi - lo) / 2:.3f} "
                f"({self.confidence:.0%} Wilson interval, margin {self.margin}) after "
                f"{estimate['trials']} trials")

    def estimate(self, failures: int, trials: int) -> dict[str, Any]:
        """The failure share so far, its interval, and whether it is precise enough."""
        if trials == 0:
            return {"failures": 0, "trials": 0, "share": None, "interval": None,
                    "margin": self.margin, "confidence": self.confidence, "reached": False}
        lo, hi = wilson_interval(failures, trials, self.confidence)
        return {"failures": failures, "trials": trials, "share": failures / trials,
                "interval": [lo, hi], "margin": self.margin, "confidence": self.confidence,
                "reached": trials >= self.min_trials and (hi - lo) / 2.0 <= self.margin}


__all__ = ["StopWhenPrecise", "turns_a_correct_prediction_wrong"]
