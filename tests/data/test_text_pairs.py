"""bitfault.data.text pairs: gensim's Lee document ratings, wordsim353 and SimLex-999, and a
user's tab-separated file, checked against plain readings of the same files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from bitfault.data.text import PAIR_SETS, TextPairs, lee_corpus, read_pairs, text_pairs
from bitfault.errors import ArgumentError, ArgumentTypeError

needs_gensim = pytest.mark.skipif(importlib.util.find_spec("gensim") is None,
                                  reason="gensim not installed (its test data)")


def _gensim_data(name: str) -> Path:
    spec = importlib.util.find_spec("gensim")
    return Path(spec.submodule_search_locations[0]) / "test" / "test_data" / name


def _plain_rows(path: Path) -> list[tuple[str, str, float]]:
    """The test's own reading: every line not blank and not a '#' comment, three tabs."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.strip() and not line.startswith("#"):
                a, b, s = line.split("\t")
                out.append((a, b, float(s)))
    return out


def _as_rows(p: TextPairs) -> list[tuple[str, str, float]]:
    return [(p.texts[i], p.texts[j], float(s)) for (i, j), s in zip(p.pairs, p.scores, strict=True)]


@needs_gensim
def test_lee_pairs_are_the_upper_triangle_of_the_human_ratings() -> None:
    p = text_pairs("lee")
    assert p.source == "lee" and len(p.texts) == 50 and len(p) == 1225
    with open(_gensim_data("similarities0-1.txt"), encoding="ascii") as f:
        matrix = [[float(v) for v in line.split("\t")] for line in f if line.strip()]
    assert len(matrix) == 50 and all(len(r) == 50 for r in matrix)
    want = [(i, j, matrix[i][j]) for i in range(50) for j in range(i + 1, 50)]
    got = [(int(i), int(j), float(s)) for (i, j), s in zip(p.pairs, p.scores, strict=True)]
    assert got == want
    assert all(matrix[i][i] == 1.0 for i in range(50))  # the layout the docstring states
    with open(_gensim_data("lee.cor"), "rb") as f:
        docs = [line.decode("latin-1").strip() for line in f if line.strip()]
    assert list(p.texts) == docs and "\u00a33,000" in " ".join(p.texts)
    assert lee_corpus("lee.cor").count("\n") == 49  # the last document has no newline
    assert 0.2 <= p.scores.min() and p.scores.max() == 1.0


@needs_gensim
@pytest.mark.parametrize(("name", "n_pairs", "n_texts"), [("wordsim353", 353, 437),
                                                          ("simlex999", 999, 1028)])
def test_word_pair_sets_match_a_plain_reading(name: str, n_pairs: int, n_texts: int) -> None:
    p = text_pairs(name)
    rows = _plain_rows(_gensim_data(PAIR_SETS[name]))
    assert p.source == name and len(p) == n_pairs == len(rows) and len(p.texts) == n_texts
    assert _as_rows(p) == rows
    assert len(set(p.texts)) == len(p.texts)  # each word once
    if name == "wordsim353":
        k = rows.index(("tiger", "tiger", 10.0))
        assert p.pairs[k, 0] == p.pairs[k, 1]


def test_a_users_pairs_file(tmp_path: Path) -> None:
    f = tmp_path / "pairs.tsv"
    f.write_text("# a comment\n\nA cat sat.\tA dog sat.\t3.5\nA dog sat.\tRain fell.\t-1\n"
                 "A cat sat.\tRain fell.\t0.25\n", encoding="utf-8")
    p = read_pairs(f)
    assert p.texts == ("A cat sat.", "A dog sat.", "Rain fell.")
    assert p.pairs.tolist() == [[0, 1], [1, 2], [0, 2]] and p.scores.tolist() == [3.5, -1, 0.25]
    assert p.source == str(f) and _as_rows(text_pairs(path=f)) == _as_rows(p)


@pytest.mark.parametrize(("content", "match"), [
    ("a\tb\t1\nc\td\n", r"line 2: not text_a<TAB>text_b<TAB>score"),
    ("a\tb\t1\nc\td\thigh\n", "line 2"),
    ("a\tb\tnan\nc\td\t2\n", "line 1"),
    ("a\tb\t1\nc\td\t2\te\n", "line 2"),
    ("a\t\t1\nc\td\t2\n", "line 1"),
    ("# only a comment\na\tb\t1\n", r"1 pair\(s\); a rank correlation needs at least 2"),
    ("", r"0 pair\(s\)"),
    ("a\tb\t2\nc\td\t2\n", "every pair has the score 2"),
])
def test_bad_pairs_files_are_named(tmp_path: Path, content: str, match: str) -> None:
    f = tmp_path / "bad.tsv"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(ArgumentError, match=match) as err:
        read_pairs(f)
    assert err.value.argument == "path" and str(f) in str(err.value)


def test_missing_file_and_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match="no such pairs file"):
        read_pairs(tmp_path / "missing.tsv")
    with pytest.raises(ArgumentError, match="not both"):
        text_pairs()
    with pytest.raises(ArgumentError, match="not both"):
        text_pairs("lee", path=tmp_path / "x.tsv")
    with pytest.raises(ArgumentError, match="one of") as err:
        text_pairs("stsb")
    assert err.value.argument == "name"
    with pytest.raises(ArgumentError, match="indices into the 2 texts"):
        TextPairs(("a", "b"), np.array([[0, 1], [1, 2]]), np.array([1.0, 2.0]))
    with pytest.raises(ArgumentError, match="2 finite numbers"):
        TextPairs(("a", "b"), np.array([[0, 1], [1, 0]]), np.array([1.0, np.inf]))
    with pytest.raises(ArgumentError, match=r"\(P, 2\)"):
        TextPairs(("a", "b"), np.array([0, 1]), np.array([1.0, 2.0]))
    with pytest.raises(ArgumentTypeError, match="strings"):
        TextPairs(("a", 3), np.array([[0, 1], [1, 0]]), np.array([1.0, 2.0]))
