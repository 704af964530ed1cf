"""The documentation reads as a product: the front page and the benchmarks stay short, no
page keeps a diary of sessions and issues, and every relative link leads to a file."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
HISTORY = re.compile(r"session \d|issue \d|\(#\d+\)", re.IGNORECASE)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _lines(name: str) -> int:
    return len((ROOT / name).read_text(encoding="utf-8").splitlines())


def test_readme_is_at_most_350_lines() -> None:
    assert _lines("README.md") <= 350


def test_benchmarks_is_at_most_500_lines() -> None:
    assert _lines("BENCHMARKS.md") <= 500


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "BENCHMARKS.md", *DOCS],
                         ids=lambda p: p.name)
def test_no_page_names_sessions_or_issues(page: Path) -> None:
    hits = [f"{n}: {line.strip()}" for n, line in
            enumerate(page.read_text(encoding="utf-8").splitlines(), 1) if HISTORY.search(line)]
    assert hits == []


@pytest.mark.parametrize("page", [ROOT / "README.md", *DOCS], ids=lambda p: p.name)
def test_relative_links_point_to_existing_files(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue                      # a URL (http:, mailto:) or an anchor on the page
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert broken == []
