"""The campaign store: one SQLite file (WAL mode) holding every finished trial.

Each trial is committed in its own transaction as soon as it is known, keyed by
its trial key, so a campaign killed at any moment (even ``kill -9``) loses at most
the trials that had not been committed, and a re-run skips every committed one:
none is lost, none is duplicated. The file also records which campaign it belongs
to (a digest of the memory, i.e. format + fault model, the trials, model and data) and
what it holds (its ``description``: the memory, the model and data digests, how tensors
were named, and each trial's own columns); opening it for a different campaign is an
error unless ``append=True``, which adds trials of the same memory, model and data only
(another trial grid) and names whatever else differs; a store whose trials table has
other columns (an older bitfault's) cannot be appended to.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from bitfault.files.csvfile import write_csv

_SCHEMA = """
CREATE TABLE IF NOT EXISTS campaign (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trials (
    trial_key TEXT PRIMARY KEY,
    campaign TEXT NOT NULL,
    kind TEXT NOT NULL,
    ber REAL,
    chip INTEGER,
    seed INTEGER,
    target TEXT,
    bit INTEGER,
    element INTEGER,
    map_digest TEXT,
    model_digest TEXT,
    data_digest TEXT,
    memory TEXT,
    versions TEXT,
    metrics TEXT NOT NULL,
    started REAL,
    finished REAL,
    worker TEXT
);
"""

COLUMNS = ("trial_key", "campaign", "kind", "ber", "chip", "seed", "target", "bit", "element",
           "map_digest", "model_digest", "data_digest", "memory", "versions", "metrics",
           "started", "finished", "worker")
_INSERT = (f"INSERT OR IGNORE INTO trials ({', '.join(COLUMNS)}) "
           f"VALUES ({', '.join('?' for _ in COLUMNS)})")


@dataclass(frozen=True)
class TrialRecord:
    """One stored trial: its fields, provenance and metric values."""

    trial_key: str
    campaign: str
    kind: str
    ber: float | None
    chip: int | None
    seed: int | None
    target: str | None
    bit: int | str | None
    element: int | None
    map_digest: str | None
    model_digest: str | None
    data_digest: str | None
    memory: str | None  # the Memory's JSON (format + fault model)
    versions: str | None
    metrics: dict[str, Any]
    started: float | None
    finished: float | None
    worker: str | None

    def flat(self) -> dict[str, Any]:
        """Columns plus one ``metric_<name>`` column per metric (for CSV / DataFrames)."""
        row = {c: getattr(self, c) for c in COLUMNS if c != "metrics"}
        row.update({f"metric_{k}": v for k, v in self.metrics.items()})
        return row


class StoreError(ValueError):
    """A store that cannot be used for this campaign."""


@contextmanager
def _sqlite_errors(path: str) -> Iterator[None]:
    """SQLite's errors (a damaged file, a locked or read-only one) as one StoreError line
    naming the store."""
    try:
        yield
    except sqlite3.DatabaseError as exc:  # OperationalError too
        raise StoreError(f"{path}: the campaign store cannot be read or written ({exc}); "
                         "if it is damaged, move it aside and rerun") from None


class CampaignStore:
    """An open campaign store; use as a context manager or call ``close()``."""

    def __init__(self, path: str | os.PathLike[str], campaign: str,
                 description: dict[str, Any] | None = None, append: bool = False) -> None:
        self.path = os.fspath(path)
        self.campaign = campaign
        if os.path.exists(self.path) and os.path.getsize(self.path) > 0:
            with open(self.path, "rb") as fh:
                if fh.read(16) != b"SQLite format 3\x00":
                    raise StoreError(f"{self.path}: not an SQLite database (refusing to "
                                     "overwrite it; choose another store path)")
        try:
            self._db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            # a file garbled mid-way fails here, before any trial runs, not at a later read
            problem = self._db.execute("PRAGMA quick_check(1)").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a usable SQLite store ({exc})") from None
        if problem != "ok":
            self._db.close()
            detail = [line for line in problem.splitlines() if not line.startswith("***")]
            raise StoreError(f"{self.path}: damaged SQLite store (database disk image is "
                             f"malformed: {' '.join(detail[:1]) or problem}); move it aside "
                             "and rerun")
        with _sqlite_errors(self.path):
            self._open(campaign, description, append)

    def _open(self, campaign: str, description: dict[str, Any] | None, append: bool) -> None:
        have = {r[1] for r in self._db.execute("PRAGMA table_info(trials)")}
        if have != set(COLUMNS):
            self._db.close()
            raise StoreError(
                f"{self.path}: its trials table has other columns (missing "
                f"{sorted(set(COLUMNS) - have)}, unknown {sorted(have - set(COLUMNS))}): "
                "written by another version of bitfault; use another store")
        row = self._db.execute("SELECT value FROM campaign WHERE key='digest'").fetchone()
        if row is None:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("INSERT OR IGNORE INTO campaign VALUES ('digest', ?)", (campaign,))
            self._db.execute("INSERT OR IGNORE INTO campaign VALUES ('description', ?)",
                             (json.dumps(description or {}, sort_keys=True),))
            self._db.execute("INSERT OR IGNORE INTO campaign VALUES ('created', ?)",
                             (repr(time.time()),))
            self._db.execute("COMMIT")
            row = self._db.execute("SELECT value FROM campaign WHERE key='digest'").fetchone()
        if row[0] == campaign:
            return
        diffs = self._differences(description or {})
        if diffs or not append:
            self._db.close()
            if diffs:
                raise StoreError(
                    f"{self.path}: written by a different campaign: it holds trials of "
                    f"another {', '.join(diffs)}; append=True adds trials of the same memory, "
                    "model and data only: use another store")
            raise StoreError(
                f"{self.path}: written by a different campaign (other trials: digest "
                f"{row[0][:12]}..., this one is {campaign[:12]}...); use another store or "
                "pass append=True to add these trials")

    def _differences(self, description: dict[str, Any]) -> list[str]:
        """What the trials stored differ in from the campaign ``description`` describes:
        its memory (format, fault model, storage), model or data, read from the store's own
        description and from every stored trial's columns."""
        stored = self.description()
        found: dict[str, set[str]] = {"memory": set(), "model": set(), "data": set()}
        for key in found:
            if key in stored:
                found[key].add(_canonical(stored[key]))
        rows = self._db.execute("SELECT DISTINCT memory, model_digest, data_digest FROM trials")
        for memory, model, data in rows:
            for key, value in (("memory", None if memory is None else json.loads(memory)),
                               ("model", model), ("data", data)):
                if value is not None:
                    found[key].add(_canonical(value))
        names = {"memory": "memory (format, fault model or storage)",
                 "model": "model (its weights, or the tensors it faults)", "data": "data"}
        diffs = [names[k] for k, seen in found.items()
                 if k in description and seen - {_canonical(description[k])}]
        if "naming" in stored and "naming" in description and \
                _canonical(stored["naming"]) != _canonical(description["naming"]):
            diffs.append("naming of the tensors (the chips' seeds)")
        return diffs

    # ---- writing ---------------------------------------------------------------------------

    def add(self, record: dict[str, Any]) -> bool:
        """Commit one finished trial; returns False if its key was already stored."""
        return self.add_many([record]) == 1

    def add_many(self, records: Sequence[dict[str, Any]]) -> int:
        """Commit trials that finished together in one transaction (all of them or none);
        returns how many were new."""
        rows = [self._row(r) for r in records]
        with _sqlite_errors(self.path):
            before = self._db.total_changes
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(_INSERT, rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return self._db.total_changes - before

    def _row(self, record: dict[str, Any]) -> list[Any]:
        values = {c: record.get(c) for c in COLUMNS}
        values["campaign"] = values["campaign"] or self.campaign
        values["metrics"] = json.dumps(record["metrics"], sort_keys=True)
        return [values[c] for c in COLUMNS]

    # ---- reading ---------------------------------------------------------------------------

    def done_keys(self) -> set[str]:
        with _sqlite_errors(self.path):
            return {r[0] for r in self._db.execute("SELECT trial_key FROM trials")}

    def __len__(self) -> int:
        with _sqlite_errors(self.path):
            return int(self._db.execute("SELECT COUNT(*) FROM trials").fetchone()[0])

    def records(self) -> Iterator[TrialRecord]:
        """Every stored trial, in key order."""
        with _sqlite_errors(self.path):
            cur = self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM trials "
                                   "ORDER BY trial_key")
            for row in cur:
                data = dict(zip(COLUMNS, row, strict=True))
                data["metrics"] = json.loads(data["metrics"])
                yield TrialRecord(**data)

    def description(self) -> dict[str, Any]:
        with _sqlite_errors(self.path):
            row = self._db.execute("SELECT value FROM campaign WHERE key='description'"
                                   ).fetchone()
        return json.loads(row[0]) if row else {}

    def add_fallbacks(self, fallbacks: Mapping[str, str]) -> None:
        """Record that a fast path failed for these tensors (tensor -> error) and the
        evaluator took its exact path: provenance kept with the trials, merged over runs."""
        if not fallbacks:
            return
        with _sqlite_errors(self.path):
            merged = {**self.fallbacks(), **{str(k): str(v) for k, v in fallbacks.items()}}
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("INSERT OR REPLACE INTO campaign VALUES ('fallbacks', ?)",
                             (json.dumps(merged, sort_keys=True),))
            self._db.execute("COMMIT")

    def fallbacks(self) -> dict[str, str]:
        """Tensor -> the error its fast path failed with, in any run of this store."""
        with _sqlite_errors(self.path):
            row = self._db.execute("SELECT value FROM campaign WHERE key='fallbacks'"
                                   ).fetchone()
        return json.loads(row[0]) if row else {}

    # ---- export ----------------------------------------------------------------------------

    def to_csv(self, path: str | os.PathLike[str]) -> None:
        """One row per trial (``TrialRecord.flat``); names a spreadsheet would take for a
        formula are quoted (``bitfault.files.csvfile``)."""
        rows = [r.flat() for r in self.records()]
        write_csv(path, rows, _fieldnames(rows))

    def to_dataframe(self) -> Any:
        import pandas as pd

        return pd.DataFrame([r.flat() for r in self.records()])

    def to_parquet(self, path: str | os.PathLike[str]) -> None:
        """Parquet export (needs pandas and pyarrow)."""
        self.to_dataframe().to_parquet(path, index=False)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> CampaignStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _canonical(value: Any) -> str:
    """One JSON text for equal values, whatever their key order or tuple/list types."""
    return json.dumps(value, sort_keys=True, default=str)


def _fieldnames(rows: Iterable[dict[str, Any]]) -> list[str]:
    names = [c for c in COLUMNS if c != "metrics"]
    extra: list[str] = []
    for row in rows:
        extra.extend(k for k in row if k not in names and k not in extra)
    return names + sorted(extra)


__all__ = ["COLUMNS", "CampaignStore", "StoreError", "TrialRecord"]
