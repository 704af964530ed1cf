"""One self-contained HTML page (images embedded) plus the numbers as CSV and JSON."""

from __future__ import annotations

import base64
import html
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from bitfault.campaign.stats import format_rates
from bitfault.files.csvfile import write_csv


def write_rows(rows: Sequence[Mapping[str, Any]], stem: str | os.PathLike[str]) -> list[str]:
    """Write rows as ``stem.csv`` (a name a spreadsheet would take for a formula, such as
    ``=cmd``, is written ``'=cmd``: ``bitfault.files.csvfile``) and ``stem.json``; returns both
    paths."""
    stem = os.fspath(stem)
    fields: list[str] = []
    for r in rows:
        fields.extend(k for k in r if k not in fields)
    write_csv(stem + ".csv", rows, fields)
    with open(stem + ".json", "w") as fh:
        json.dump(list(rows), fh, indent=1, sort_keys=True)
    return [stem + ".csv", stem + ".json"]


Table = tuple[str, Sequence[Mapping[str, Any]], Sequence[str]]


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """An HTML table; rates (the ``ber`` column) as ``format_rates`` writes them."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    rates = [r["ber"] for r in rows if isinstance(r.get("ber"), (int, float))]
    rate_text = dict(zip(rates, format_rates(rates), strict=True)) if "ber" in columns else {}
    body = []
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c, "")
            if c == "ber" and v in rate_text:
                text = rate_text[v]
            else:
                text = f"{v:.4g}" if isinstance(v, float) else str(v)
            cells.append(f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _heading(caption: str) -> str:
    """A table's caption: a heading, and what follows a blank line as a paragraph."""
    title, _, rest = caption.partition("\n\n")
    note = f"<p class='caption'>{html.escape(rest.strip())}</p>" if rest.strip() else ""
    return f"<h2>{html.escape(title.strip())}</h2>{note}"


def write_html(path: str | os.PathLike[str], title: str, intro: str,
               figures: Sequence[tuple[str, str]], tables: Sequence[Table] = (), *,
               lead_tables: Sequence[Table] = ()) -> str:
    """A page: ``intro`` (paragraphs split by blank lines), ``lead_tables``, ``figures``
    ((caption, png path), embedded as data URIs), then ``tables`` (a caption's text after
    a blank line is a note under its heading)."""
    parts = [f"<h1>{html.escape(title)}</h1>"]
    parts += [f"<p>{html.escape(p.strip())}</p>" for p in intro.split("\n\n") if p.strip()]
    for caption, rows, columns in lead_tables:
        parts.append(_heading(caption) + _table(rows, columns))
    for caption, png in figures:
        with open(png, "rb") as fh:
            data = base64.b64encode(fh.read()).decode("ascii")
        name = html.escape(os.path.basename(png))
        parts.append(f'<figure><img alt="{name}" data-file="{name}" '
                     f'src="data:image/png;base64,{data}"><figcaption>{html.escape(caption)}'
                     "</figcaption></figure>")
    for caption, rows, columns in tables:
        parts.append(_heading(caption) + _table(rows, columns))
    style = ("body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
             "img{max-width:100%}table{border-collapse:collapse;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
             "figcaption,.caption{font-size:13px;color:#555;margin-bottom:1.5em}")
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{style}</style></head><body>{''.join(parts)}</body></html>")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(page)
    return os.fspath(path)


__all__ = ["write_html", "write_rows"]
