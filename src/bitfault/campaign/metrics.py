"""Campaign metrics: what a trial's predictions score, and the checks on a user's metric."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from bitfault.stats import robust_error

Metric = Callable[[np.ndarray, np.ndarray, np.ndarray], Mapping[str, float]]


def accuracy_metrics(labels: np.ndarray, clean: np.ndarray, faulty: np.ndarray) -> dict[str, float]:
    """The default metric: accuracy, correct count, and robust error."""
    correct = int(np.sum(faulty == labels))
    return {"accuracy": correct / len(labels), "correct": correct, "n": len(labels),
            "robust_error": robust_error(labels, clean, faulty)}


def call_metric(metric: Metric, labels: np.ndarray, clean: np.ndarray, faulty: np.ndarray,
                where: str) -> dict[str, float]:
    """``metric``'s values as plain numbers; an error names the metric and ``where`` it ran."""
    try:
        values = dict(metric(labels, clean, faulty))
    except Exception as exc:
        raise RuntimeError(f"metric {getattr(metric, '__name__', metric)!r} raised on {where}: "
                           f"{type(exc).__name__}: {exc}") from exc
    for k, v in values.items():
        if not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"metric values must be numbers; {k!r} is {type(v).__name__}")
    return {k: float(v) if isinstance(v, (float, np.floating)) else int(v)
            for k, v in values.items()}


__all__ = ["Metric", "accuracy_metrics", "call_metric"]
