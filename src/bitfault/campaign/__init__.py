"""Resilience campaigns: grids of trials, a resumable SQLite store, and the engine.

Framework-free; the PyTorch and Keras adapters supply evaluators that run many
fault maps per forward pass.
"""

from bitfault.campaign.grid import Trial, bit_sweep, layer_sweep, rate_sweep, single_faults
from bitfault.campaign.runner import (
    CampaignResult,
    NumpyEvaluator,
    accuracy_metrics,
    run,
    trial_maps,
)
from bitfault.campaign.store import CampaignStore, StoreError

__all__ = [
    "CampaignResult",
    "CampaignStore",
    "NumpyEvaluator",
    "StoreError",
    "Trial",
    "accuracy_metrics",
    "bit_sweep",
    "layer_sweep",
    "rate_sweep",
    "run",
    "single_faults",
    "trial_maps",
]
