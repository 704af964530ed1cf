"""CSV files a spreadsheet opens as data: every CSV bitfault writes goes through here.

A cell that begins with ``=``, ``+``, ``-``, ``@`` (or a tab or carriage return) is a
formula to Excel, LibreOffice and Google Sheets. Names (models, recipes, tensors, trial
keys) are free text a user chose, so such a cell gets a leading single quote, as OWASP's
advice on CSV injection says: the spreadsheet shows the text instead of evaluating it.
Numbers are left as they are (a negative number is a number, in a cell or as text).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""What a spreadsheet reads as the start of a formula in a cell."""


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def safe_cell(value: Any) -> Any:
    """``value`` as a CSV cell a spreadsheet does not evaluate: a string that begins like a
    formula and is not a number gets a leading ``'``; anything else is returned as it is."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not _is_number(value):
        return "'" + value
    return value


def write_csv(path: str | os.PathLike[str], rows: Iterable[Mapping[str, Any]],
              fields: Sequence[str]) -> None:
    """Write ``rows`` (dicts; a missing key is an empty cell) under the header ``fields``
    to ``path``, every cell and header through ``safe_cell``."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow([safe_cell(f) for f in fields])
        for row in rows:
            writer.writerow([safe_cell(row.get(f, "")) for f in fields])


__all__ = ["FORMULA_STARTS", "safe_cell", "write_csv"]
