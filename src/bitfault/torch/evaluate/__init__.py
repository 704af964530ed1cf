"""PyTorch evaluators for campaigns: ``TorchEvaluator`` (a model + labelled data) and
``OutputEvaluator`` (any model, a metric on its outputs), with the reuse strategies that
make them fast, one module each, and the planner that picks them per tensor."""

from __future__ import annotations

from bitfault.torch.evaluate.evaluator import (
    CACHES,
    EVALUATED_KINDS,
    TorchEvaluator,
    faulty_in,
)
from bitfault.torch.evaluate.outputs import OutputEvaluator
from bitfault.torch.evaluate.planner import Plan, PlanEntry

__all__ = ["CACHES", "EVALUATED_KINDS", "OutputEvaluator", "Plan", "PlanEntry",
           "TorchEvaluator", "faulty_in"]
