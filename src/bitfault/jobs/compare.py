"""Comparing memories in one campaign (``campaign.memory`` as a list of named memories).

Each (recipe, memory) pair is one entry of ``summary.json``'s ``models``, keyed
``"<recipe> / <memory>"`` (``scheme_key``), its trials in its own store
``RUN_DIR/campaign/<memory>/<recipe>.sqlite`` (``scheme_store``), every scheme on the
same chips. ``compare_schemes`` puts the schemes of each recipe side by side: accuracy
against the *raw* bit error rate (the trials' measured raw bit errors over the physical
bits, data and check, of the planes the campaign faults, so a scheme with check bits is
compared at the same physical fault density), the masked / benign / SDC / detected
shares, the storage overhead and the highest rate whose accuracy stays within 0.5 points
of fault-free. Framework-free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bitfault.formats import plane_formats
from bitfault.formats.blocks import CODES
from bitfault.memory.memory import Memory

TOLERANCE = 0.005  # 0.5 accuracy points
RAW_BER = ("raw bit error rate: the raw bit errors a trial's pattern injected (data and "
           "check bits), over the physical bits (data and check) of the planes the "
           "campaign faults; mean over chips")
ROBUST = ("highest swept rate at which the mean accuracy over chips, there and at every "
          "lower swept rate, stays within 0.5 points of the fault-free accuracy (none: not "
          "even at the lowest rate)")


def scheme_key(recipe: str, scheme: str | None) -> str:
    """The summary entry of ``recipe`` in memory ``scheme`` (None: the one memory)."""
    return recipe if scheme is None else f"{recipe} / {scheme}"


def scheme_store(run_dir: str | Path, recipe: str, scheme: str | None) -> Path:
    """The store of ``recipe``'s trials in memory ``scheme`` (None: the one memory's
    ``campaign/<recipe>.sqlite``). Memory names hold no '.', so a folder never meets a
    recipe's store file."""
    campaign = Path(run_dir) / "campaign"
    return campaign / f"{recipe}.sqlite" if scheme is None else \
        campaign / scheme / f"{recipe}.sqlite"


def memory_bits(memory: Memory, shapes: Mapping[str, Any]) -> dict[str, int]:
    """Data, check and physical bits of the memory words holding ``shapes``' planes that
    the campaign faults (its fault model's planes, a plane rate above 0); a plane split by
    ``protected_bits`` counts the words of both its parts (whole fields per word)."""
    storage, fmt = memory.storage, memory.format
    if storage is None:
        raise ValueError("memory_bits needs a memory with storage")
    formats = plane_formats(fmt)
    rates = memory.plane_ber(1.0)
    word = storage.layout.word_bits
    data = check = 0
    for name, shape in shapes.items():
        tensor = storage.for_tensor(name)  # unprotected if protected_tensors leaves it out
        planes = fmt.plane_shapes(tuple(shape)) if len(formats) > 1 else {CODES: tuple(shape)}
        for plane, pf in formats.items():
            rate = rates.get(plane, 0.0) if isinstance(rates, Mapping) else rates
            if not rate or not memory.fault.eligible_bits(fmt, plane):
                continue
            n = math.prod(planes[plane])
            parts = tensor.parts(plane, pf.bits)
            if parts is None:
                words = storage.layout.n_words(n, pf.bits)
                data += words * word
                check += words * tensor.scheme(plane).check_bits(word)
                continue
            for part in parts:  # chosen bits in their own protected words, the rest apart
                words = part.layout.n_words(n, part.bits)
                data += words * part.layout.word_bits
                check += words * part.protection.check_bits(part.layout.word_bits)
    return {"data_bits": data, "check_bits": check, "physical_bits": data + check}


def raw_ber_rows(records: Iterable[Any], physical_bits: int) -> list[dict[str, Any]]:
    """Per rate of the rate sweep: the raw bit error rate of its trials (mean, min, max
    over chips) and the mean raw bit errors per trial."""
    groups: dict[float, list[float]] = {}
    for r in records:
        if r.kind == "rate" and "raw_bit_errors" in r.metrics:
            groups.setdefault(float(r.ber), []).append(float(r.metrics["raw_bit_errors"]))
    rows = []
    for ber, errors in sorted(groups.items()):
        rates = [e / physical_bits for e in errors] if physical_bits else [0.0] * len(errors)
        rows.append({"ber": ber, "trials": len(errors), "raw_ber": sum(rates) / len(rates),
                     "raw_ber_min": min(rates), "raw_ber_max": max(rates),
                     "raw_bit_errors": sum(errors) / len(errors)})
    return rows


def robust_rate(points: Iterable[Mapping[str, Any]], clean: float,
                tolerance: float = TOLERANCE) -> float | None:
    """The highest rate of ``points`` (``ber``, ``mean``) whose mean accuracy, and that
    of every lower rate, is at least ``clean - tolerance`` (see ``ROBUST``)."""
    best = None
    for p in sorted(points, key=lambda p: p["ber"]):
        if clean - p["mean"] > tolerance + 1e-12:  # 1e-12: 0.95 - 0.945 is 0.5 points
            break
        best = p["ber"]
    return best


_SHARES = ("detected", "sdc", "benign", "masked")


def scheme_points(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One scheme's rate sweep: accuracy (mean and interval over chips), raw bit error
    rate and outcome shares per rate, from its summary entry."""
    mem = entry["memory"]
    raw = {r["ber"]: r for r in mem.get("raw_ber", [])}
    shares = {o["ber"]: o for o in mem.get("outcomes", [])}
    out = []
    for row in sorted(entry["rate"], key=lambda r: r["ber"]):
        ber = row["ber"]
        point = {k: row.get(k) for k in ("ber", "n", "mean", "ci_low", "ci_high", "min", "max")}
        point.update({k: raw[ber][k] for k in ("raw_ber", "raw_ber_min", "raw_ber_max",
                                               "raw_bit_errors")} if ber in raw else {})
        if ber in shares:
            point.update({f"{k}{x}": shares[ber][f"{k}{x}"]
                          for k in _SHARES for x in ("", "_low", "_high")})
        out.append(point)
    return out


def compare_schemes(models: Mapping[str, Mapping[str, Any]],
                    schemes: Iterable[str]) -> dict[str, Any]:
    """The ``comparison`` section of summary.json: per recipe, its schemes side by side
    (see the module docstring) from the entries ``models`` holds."""
    names = list(schemes)
    recipes = list(dict.fromkeys(m["recipe"] for m in models.values()
                                 if m.get("scheme") in names))
    out: dict[str, Any] = {"raw_ber": RAW_BER, "robust": ROBUST, "tolerance": TOLERANCE,
                           "models": {}}
    for recipe in recipes:
        rows = []
        for name in names:
            m = models.get(scheme_key(recipe, name))
            if m is None or "memory" not in m:
                continue
            mem, points = m["memory"], scheme_points(m)
            robust = robust_rate(points, m["clean_accuracy"])
            rows.append({
                "name": name, "storage": mem["storage"], "overhead": mem["overhead"],
                "check_bits_per_data_bit": mem["check_bits"] / mem["data_bits"]
                if mem.get("data_bits") else 0.0,
                **{k: mem.get(k) for k in ("data_bits", "check_bits", "physical_bits")},
                "trials": m["trials"], "stored": m["stored"], "complete": m["complete"],
                "points": points, "within_tolerance_up_to": robust,
                "raw_ber_within_tolerance": next((p.get("raw_ber") for p in points
                                                  if p["ber"] == robust), None)})
        first = models[scheme_key(recipe, rows[0]["name"])] if rows else {}
        out["models"][recipe] = {"clean_accuracy": first.get("clean_accuracy"),
                                 "format": first.get("format"), "schemes": rows}
    return out


__all__ = ["RAW_BER", "ROBUST", "TOLERANCE", "compare_schemes", "memory_bits", "raw_ber_rows",
           "robust_rate", "scheme_key", "scheme_points", "scheme_store"]
