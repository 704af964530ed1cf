"""Words and names for a report: what a rate means under a fault model, which end of a
word is which, and file names that stay distinct for distinct model names."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from bitfault.formats import format_from_dict


def _fault_dict(fault: Any) -> dict[str, Any]:
    if fault is None:
        return {"kind": "bit_flip"}  # FaultSpec's default fault model
    if hasattr(fault, "to_dict"):
        return dict(fault.to_dict())
    if isinstance(fault, Mapping) and "kind" in fault:
        return dict(fault)
    raise TypeError(f"fault must be a fault model, its to_dict() or None, got {fault!r}")


def _fault_words(fault: Any) -> tuple[str, str, str]:
    """(the rate's name, what a faulty bit is, the faults in words) for a fault model."""
    d = _fault_dict(fault)
    if d["kind"] == "stuck_at":
        v = d.get("value", 0)
        return f"stuck-at-{v} rate", f"stuck at {v}", f"bits stuck at {v}"
    if d["kind"] == "bit_flip":
        return "bit error rate", "flipped", "random bit flips"
    kind = str(d["kind"]).replace("_", " ")
    return f"{kind} rate", f"with a {kind} fault", f"{kind} faults"


def rate_name(fault: Any = None) -> str:
    """What the swept rate is called: "bit error rate", "stuck-at-0 rate", ..."""
    return _fault_words(fault)[0]


def rate_label(fault: Any = None) -> str:
    """An axis label for the rate, e.g. "bit error rate (fraction of stored bits flipped)"."""
    name, what, _ = _fault_words(fault)
    return f"{name} (fraction of stored bits {what})"


def fault_phrase(fault: Any = None) -> str:
    """The faults in words: "random bit flips", "bits stuck at 0"."""
    return _fault_words(fault)[2]


def bit_roles(fmt: Any) -> dict[int, str]:
    """Which stored bit is which end of a ``fmt`` word: {0: "LSB", top: "sign, MSB"}."""
    fmt = format_from_dict(fmt) if isinstance(fmt, Mapping) else fmt
    top = fmt.bits - 1
    unsigned = getattr(fmt, "codes", None) == "unsigned"
    signed = not unsigned and fmt.bit_fields.get("sign") == (top,)
    return {0: "LSB", top: "sign, MSB" if signed else "MSB"}


def file_stems(names: Iterable[str]) -> dict[str, str]:
    """A file-name stem per name, distinct for distinct names (also ignoring case): a safe
    name as it is; any other its safe characters plus a short hash of the exact name."""
    names = list(dict.fromkeys(names))
    safe = {n: re.sub(r"[^A-Za-z0-9_.-]+", "_", n).strip("_.") or "model" for n in names}
    taken: dict[str, int] = {}
    for n, s in safe.items():
        if s == n:
            taken[s.lower()] = taken.get(s.lower(), 0) + 1
    stems = {n: s if s == n and taken[s.lower()] == 1
             else f"{s}-{hashlib.sha256(n.encode()).hexdigest()[:8]}"
             for n, s in safe.items()}
    seen: dict[str, str] = {}
    for n, s in stems.items():
        if s.lower() in seen:  # only a name spelled like another's hashed stem gets here
            raise ValueError(f"model names {seen[s.lower()]!r} and {n!r} would write the same "
                             f"file {s!r}; rename one")
        seen[s.lower()] = n
    return stems


__all__ = ["bit_roles", "fault_phrase", "file_stems", "rate_label", "rate_name"]
