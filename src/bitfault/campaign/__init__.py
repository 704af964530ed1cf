"""Resilience campaigns: grids of trials, a resumable SQLite store, and the engine.

Framework-free (imports no framework and no adapter): the framework adapters supply
evaluators (``TorchEvaluator``, ``KerasEvaluator``) that implement the ``Evaluator``
protocol and run many fault maps per forward pass.
"""

from bitfault.campaign.evaluator import Evaluator, NumpyEvaluator
from bitfault.campaign.grid import (
    Trial,
    bit_sweep,
    exhaustive_single_faults,
    layer_sweep,
    rate_sweep,
    sampled_single_faults,
    single_faults,
)
from bitfault.campaign.metrics import accuracy_metrics
from bitfault.campaign.runner import CampaignResult, run, trial_maps
from bitfault.campaign.stopping import StopWhenPrecise
from bitfault.campaign.store import CampaignStore, StoreError

__all__ = [
    "CampaignResult",
    "CampaignStore",
    "Evaluator",
    "NumpyEvaluator",
    "StopWhenPrecise",
    "StoreError",
    "Trial",
    "accuracy_metrics",
    "bit_sweep",
    "exhaustive_single_faults",
    "layer_sweep",
    "rate_sweep",
    "run",
    "sampled_single_faults",
    "single_faults",
    "trial_maps",
]
