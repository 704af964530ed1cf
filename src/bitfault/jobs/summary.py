"""Campaign summaries, built from the stores on disk (framework-free).

A model's entry in ``summary.json`` says what its store holds of the trials its config
plans (``trials`` planned, ``stored``, ``complete``), so an interrupted campaign shows
as incomplete instead of vanishing; ``bitfault report`` rebuilds the entries from the
stores again, from the ``tensors``, ``format`` and ``clean`` metrics each one records.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from bitfault.config import CampaignConfig
from bitfault.faults.models import bit_names
from bitfault.memory.memory import Memory


def build_trials(c: CampaignConfig, memory: Memory, shapes: dict[str, Any]) -> list[Any]:
    """The rate sweep, plus the layer and bit sweeps the config enables."""
    from bitfault.campaign import bit_sweep, layer_sweep, rate_sweep

    trials = rate_sweep(c.bers, c.chips, base_seed=c.seed)
    if c.layers:
        trials += layer_sweep(c.sweep_bers, c.sweep_chips, list(shapes), base_seed=c.seed)
    if c.bits:
        bits = bit_names(memory.format, memory.fault.eligible_planes(memory.format))
        trials += bit_sweep(c.sweep_bers, c.sweep_chips, bits, base_seed=c.seed)
    return trials


def single_fault_trials(c: CampaignConfig, memory: Memory,
                        shapes: dict[str, Any]) -> list[Any]:
    """The sampled single bit faults of ``campaign.single_faults`` (empty when off)."""
    if c.single_faults is None:
        return []
    from bitfault.campaign import sampled_single_faults

    return sampled_single_faults(shapes, memory.format, margin=c.single_faults,
                                 confidence=c.single_fault_confidence, seed=c.seed,
                                 bits=memory.fault.bits)


def _query(store: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on ``store`` (none: no store, or no trials yet). Opened with
    ``mode=rw`` (never creating a file; read-only where the file is) rather than ``ro``,
    whose connections leave SQLite's -wal/-shm files behind."""
    if not store.is_file():
        return []
    try:
        with closing(sqlite3.connect(store.resolve().as_uri() + "?mode=rw", uri=True)) as db:
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'trials'").fetchone() is None:
                return []
            return db.execute(sql).fetchall()
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"{store}: not a readable campaign store ({exc})") from None


def read_records(store: str | Path, keys: set[str]) -> list[Any]:
    """The trials of ``store`` whose keys are in ``keys`` (it is only read)."""
    from bitfault.campaign.store import COLUMNS, TrialRecord

    out = []
    for row in _query(Path(store), f"SELECT {', '.join(COLUMNS)} FROM trials"):
        data = dict(zip(COLUMNS, row, strict=True))
        if data["trial_key"] in keys:
            data["metrics"] = json.loads(data["metrics"])
            out.append(TrialRecord(**data))
    return out


def stored_columns(store: str | Path) -> set[str]:
    """The columns of ``store``'s trials table (empty: no store, or no table yet)."""
    return {r[0] for r in _query(Path(store), "SELECT name FROM pragma_table_info('trials')")}


def provenance(store: str | Path) -> list[tuple[str | None, str | None, str | None]]:
    """The distinct (model digest, data digest, memory JSON) of the trials in ``store``;
    a store of an older bitfault (a ``spec`` column, no ``memory``) gives its spec JSON,
    whose ``format`` and ``fault`` keys are the memory's."""
    columns = stored_columns(store)
    memory = "memory" if "memory" in columns else "spec" if "spec" in columns else "NULL"
    return [tuple(r) for r in _query(Path(store), "SELECT DISTINCT model_digest, data_digest, "
                                                  f"{memory} FROM trials")]


def chip_seeds(store: str | Path) -> set[int]:
    """The base seeds of the chips in ``store`` (a chip ``c`` of seed ``base + c``), from
    its rate, layer and bit trials."""
    return {int(r[0]) for r in _query(Path(store), "SELECT DISTINCT seed - chip FROM trials "
                                                   "WHERE kind IN ('rate', 'layer', 'bit')")}


def model_summary(c: CampaignConfig, memory: Memory, shapes: dict[str, Any],
                  clean: dict[str, Any], store: Path, single_store: Path) -> dict[str, Any]:
    """One model's summary entry from its stores: what they hold of the planned trials."""
    from bitfault.campaign import CampaignResult

    trials = build_trials(c, memory, shapes)
    records = read_records(store, {t.key for t in trials})
    rows = CampaignResult(records).summary("accuracy")
    entry: dict[str, Any] = {
        "format": memory.format.to_dict(), "clean_accuracy": clean["accuracy"], "clean": clean,
        "tensors": {n: list(s) for n, s in shapes.items()}, "store": str(store),
        "trials": len(trials), "stored": len(records), "complete": len(records) == len(trials),
        "rate": [r for r in rows if r["kind"] == "rate"],
        "layer": [r for r in rows if r["kind"] == "layer"],
        "bit": [r for r in rows if r["kind"] == "bit"]}
    if memory.storage is not None:
        from bitfault.campaign.metrics import memory_outcome_summary
        from bitfault.jobs.compare import memory_bits, raw_ber_rows

        bits = memory_bits(memory, shapes)
        entry["memory"] = {"storage": memory.storage.to_dict(),
                           "overhead": memory.storage.overhead(memory.format), **bits,
                           "outcomes": memory_outcome_summary(records, clean["accuracy"]),
                           "raw_ber": raw_ber_rows(records, bits["physical_bits"])}
    if c.single_faults is not None:
        entry["single_faults"] = _single_summary(c, memory, shapes, clean, single_store)
    return entry


def _single_summary(c: CampaignConfig, memory: Memory, shapes: dict[str, Any],
                    clean: dict[str, Any], store: Path) -> dict[str, Any]:
    from bitfault.campaign import StopWhenPrecise

    trials = single_fault_trials(c, memory, shapes)
    records = read_records(store, {t.key for t in trials})
    stop = StopWhenPrecise(margin=c.single_faults, confidence=c.single_fault_confidence)
    estimate = stop.estimate(sum(stop.failed(r.metrics, clean) for r in records), len(records))
    return {"sample_size": len(trials), "store": str(store),
            "complete": bool(estimate["reached"]) or len(records) == len(trials), **estimate}


def refresh(entry: dict[str, Any], c: CampaignConfig, store: Path,
            single_store: Path) -> dict[str, Any]:
    """``entry`` (from summary.json) rebuilt from its stores as they are now; an entry
    written by an older bitfault (no ``tensors``) is returned as it is."""
    if "tensors" not in entry or "clean" not in entry:
        return entry
    storage = c.memory
    if "scheme" in entry:
        if entry["scheme"] not in dict(c.schemes):
            return entry
        storage = dict(c.schemes)[entry["scheme"]]
    memory = Memory(entry["format"], c.fault, c.plane_rates, storage)
    shapes = {n: tuple(s) for n, s in entry["tensors"].items()}
    fresh = model_summary(c, memory, shapes, entry["clean"], store, single_store)
    fresh.update({k: entry[k] for k in ("recipe", "scheme") if k in entry})
    for key in ("ran", "skipped"):  # what the last campaign run did, not store contents
        if key in entry:
            fresh[key] = entry[key]
    if "single_faults" in fresh and "single_faults" in entry:
        for key in ("ran", "skipped"):
            if key in entry["single_faults"]:
                fresh["single_faults"][key] = entry["single_faults"][key]
    return fresh


def incomplete(models: dict[str, dict[str, Any]]) -> list[str]:
    """One phrase per model whose campaign is incomplete, e.g. "b (4 of 10 trials stored)"."""
    out = []
    for name, m in models.items():
        if m.get("complete", True) is False:
            out.append(f"{name} ({m['stored']} of {m['trials']} trials stored)")
        elif m.get("single_faults", {}).get("complete", True) is False:
            s = m["single_faults"]
            out.append(f"{name} (single faults: {s['trials']} of up to {s['sample_size']} "
                       "stored, not yet precise)")
    return out


__all__ = ["build_trials", "chip_seeds", "incomplete", "model_summary", "provenance",
           "read_records", "refresh", "single_fault_trials", "stored_columns"]
