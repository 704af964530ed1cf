"""Campaign stores of a run directory: which hold another campaign's trials, and refusing
them (naming what differs) before anything is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bitfault.jobs.summary import chip_seeds, provenance, stored_columns
from bitfault.memory.memory import Memory


def store_differences(store: Path, evaluator: Any, memory: Memory, seed: int) -> list[str]:
    """What makes the trials in ``store`` another campaign's (empty: none, or no store):
    model, data, the memory (format, fault model), chips of another ``campaign.seed``, or
    a store of another bitfault version."""
    from bitfault.campaign.store import COLUMNS

    rows = provenance(store)
    if not rows:
        return []
    diffs: list[str] = []
    if stored_columns(store) != set(COLUMNS):
        diffs.append("the store's layout (written by another version of bitfault)")
    if any(model != evaluator.model_digest() for model, _, _ in rows):
        diffs.append("the model (its weights, or the tensors campaign.targets selects)")
    if any(data != evaluator.data_digest() for _, data, _ in rows):
        diffs.append("the test data (data settings)")
    want, fields = memory.to_dict(), set()
    for _, _, text in rows:
        old = json.loads(text or "{}")
        fields |= {k for k in want if old.get(k) != want[k]}
    names = {"fault": "campaign.fault", "format": "the recipe's format"}
    diffs += [f"the memory's {f} ({names.get(f, 'campaign.' + f)})" for f in sorted(fields)]
    if chip_seeds(store) - {seed}:
        diffs.append("the chips' seeds (campaign.seed)")
    return diffs


def refuse_stale_stores(stale: dict[Any, list[str]], run_dir: Path,
                        replace_stores: bool) -> None:
    """ValueError naming every store that holds another campaign's trials (and what
    differs), unless ``replace_stores``: nothing has been written yet."""
    if stale and not replace_stores:
        raise ValueError("; ".join(f"{store}: holds trials of another campaign (it differs "
                                   f"in {', '.join(d)})" for store, d in stale.items())
                         + "; rerun with --replace-store (replace_stores=True) to move it "
                         f"into {run_dir / 'replaced'} and start over")


__all__ = ["refuse_stale_stores", "store_differences"]
