"""Text data for the metrics: a text file or gensim's Lee news corpus, tokenised by the
model's own tokenizer into fixed-length windows of token ids; and pairs of texts with
human similarity scores (``text_pairs``) for a downstream score of sentence embeddings.

    from bitfault.data.text import lee_corpus, text_pairs, token_windows
    ids = token_windows(lee_corpus(), tokenizer, context=128, n_windows=4)  # (4, 128) int64
    lee = text_pairs("lee")  # 50 documents, 1225 pairs with Lee et al.'s human ratings

Nothing is downloaded: ``lee_corpus`` reads ``gensim/test/test_data/lee_background.cor``
from the installed gensim wheel without importing gensim; any other text is a file the
user names (``read_text``, ``read_pairs``). Text too short for the windows asked, and a
pairs file that is missing, malformed or too short, are ArgumentErrors before anything
runs.
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError, check_choice

LEE_FILES = ("lee_background.cor", "lee.cor")


def read_text(path: str | os.PathLike[str]) -> str:
    """The UTF-8 text of ``path``; ArgumentError for a missing or empty file."""
    p = Path(path)
    if not p.is_file():
        raise ArgumentError("path", os.fspath(path), "an existing text file",
                            requirement=f"{os.fspath(path)}: no such text file")
    text = p.read_text(encoding="utf-8", errors="strict")
    if not text.strip():
        raise ArgumentError("path", os.fspath(path), "a file with some text",
                            requirement=f"{os.fspath(path)}: the file holds no text")
    return text


def gensim_file(name: str, source: str = "gensim") -> Path:
    """A file of gensim's test data (found, not imported); ``source`` names what wants it."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise ArgumentError("source", source, "an installed gensim wheel (its test corpora)",
                            requirement=f"{source!r} comes from gensim's wheel "
                                        "(gensim/test/test_data); install gensim or name a "
                                        "file of your own")
    path = Path(next(iter(spec.submodule_search_locations))) / "test" / "test_data" / name
    if not path.is_file():
        raise ArgumentError("source", source, "gensim's test corpora",
                            requirement=f"{path}: not found in the installed gensim")
    return path


def lee_corpus_path(name: str = "lee_background.cor") -> Path:
    """Where gensim's wheel keeps a Lee corpus file (found, not imported)."""
    if name not in LEE_FILES:
        raise ArgumentError("name", name, f"one of {LEE_FILES}")
    return gensim_file(name, "lee")


def lee_corpus(name: str = "lee_background.cor") -> str:
    """The Lee news corpus (one document a line) as one string. The files are Latin-1
    (``lee.cor`` holds a pound sign), read as gensim reads them."""
    return lee_corpus_path(name).read_text(encoding="latin-1")


def _encode(tokenizer: Any, text: str) -> list[int]:
    if hasattr(tokenizer, "encode"):
        try:
            return list(tokenizer.encode(text, add_special_tokens=False))
        except TypeError:
            return list(tokenizer.encode(text))
    if callable(tokenizer):
        return list(tokenizer(text))
    raise ArgumentTypeError("tokenizer", tokenizer, "a tokenizer with .encode(text) or a "
                            "callable text -> token ids")


def token_windows(text: str, tokenizer: Any, context: int, n_windows: int | None = None,
                  stride: int | None = None) -> np.ndarray:
    """``text`` tokenised and cut into windows of ``context`` ids: ``(n, context)`` int64.

    Windows start every ``stride`` tokens (default ``context``: no overlap); ``n_windows``
    takes the first ones (default: as many as fit). ArgumentError when the text has fewer
    tokens than the windows need."""
    for value, arg in ((context, "context"), (n_windows, "n_windows"), (stride, "stride")):
        if value is None and arg != "context":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ArgumentError(arg, value, "a positive integer")
    if not isinstance(text, str):
        raise ArgumentTypeError("text", text, "a string")
    stride = int(context if stride is None else stride)
    ids = np.asarray(_encode(tokenizer, text), dtype=np.int64)
    fit = 0 if ids.size < context else (ids.size - context) // stride + 1
    want = fit if n_windows is None else int(n_windows)
    if want < 1 or want > fit:
        need = context + (max(want, 1) - 1) * stride
        raise ArgumentError("text", f"{ids.size} tokens", f"at least {need} tokens",
                            requirement=f"text too short for the context: {ids.size} tokens, "
                                        f"{max(want, 1)} window(s) of {context} every {stride} "
                                        f"need {need}")
    starts = np.arange(want, dtype=np.int64) * stride
    return ids[starts[:, None] + np.arange(context, dtype=np.int64)[None, :]]


# ---- pairs of texts with human similarity scores ---------------------------------------

PAIR_SETS = {"lee": "lee.cor + similarities0-1.txt", "wordsim353": "wordsim353.tsv",
             "simlex999": "simlex999.txt"}  # text_pairs(name): sets in gensim's test data


@dataclass(frozen=True, eq=False)
class TextPairs:
    """Texts to embed and pairs of them with human similarity scores: ``pairs[k]`` indexes
    two of ``texts``, ``scores[k]`` is what people rated them; ``source`` says where they
    came from. At least two pairs, and scores that are not all equal (a rank correlation
    needs both)."""

    texts: tuple[str, ...]
    pairs: np.ndarray  # (P, 2) int64
    scores: np.ndarray  # (P,) float64
    source: str = ""

    def __post_init__(self) -> None:
        pairs = np.asarray(self.pairs)
        scores = np.asarray(self.scores, np.float64)
        if isinstance(self.texts, str) or not all(isinstance(t, str) for t in self.texts):
            raise ArgumentTypeError("texts", self.texts, "a sequence of strings")
        if pairs.ndim != 2 or pairs.shape[1:] != (2,) or not np.issubdtype(pairs.dtype,
                                                                           np.integer):
            raise ArgumentError("pairs", pairs.shape, "a (P, 2) array of integer indices")
        if pairs.size and (pairs.min() < 0 or pairs.max() >= len(self.texts)):
            raise ArgumentError("pairs", f"indices {pairs.min()}..{pairs.max()}",
                                f"indices into the {len(self.texts)} texts")
        if scores.shape != (len(pairs),) or not np.isfinite(scores).all():
            raise ArgumentError("scores", scores.shape, f"{len(pairs)} finite numbers (one "
                                "per pair)")
        _enough(len(pairs), scores, self.source or "pairs")
        object.__setattr__(self, "texts", tuple(self.texts))
        object.__setattr__(self, "pairs", pairs.astype(np.int64))
        object.__setattr__(self, "scores", scores)

    def __len__(self) -> int:
        return len(self.pairs)


def _enough(n: int, scores: np.ndarray, where: str) -> None:
    if n < 2:
        raise ArgumentError("path", where, "at least 2 pairs",
                            requirement=f"{where}: {n} pair(s); a rank correlation needs at "
                                        "least 2")
    if np.all(scores == scores[0]):
        raise ArgumentError("path", where, "scores that are not all equal",
                            requirement=f"{where}: every pair has the score {scores[0]:g}; a "
                                        "rank correlation needs scores that differ")


def _pairs_of(rows: list[tuple[str, str, float]], source: str) -> TextPairs:
    """Pairs of texts, each text once (in order of first appearance)."""
    index: dict[str, int] = {}
    pairs = [(index.setdefault(a, len(index)), index.setdefault(b, len(index)))
             for a, b, _ in rows]
    return TextPairs(tuple(index), np.asarray(pairs, np.int64).reshape(-1, 2),
                     np.asarray([s for *_, s in rows], np.float64), source)


def read_pairs(path: str | os.PathLike[str]) -> TextPairs:
    """Pairs from a tab-separated UTF-8 file: one ``text_a<TAB>text_b<TAB>score`` line per
    pair; blank lines and lines starting with ``#`` are skipped (wordsim353's and
    SimLex-999's own layout). ArgumentError naming the file (and the line) for a missing
    file, a line that is not three fields with a finite score, or too few pairs."""
    where = os.fspath(path)
    if not Path(path).is_file():
        raise ArgumentError("path", where, "an existing pairs file (text_a, text_b, score "
                            "per line, tab-separated)",
                            requirement=f"{where}: no such pairs file")
    rows = []
    lines = Path(path).read_text(encoding="utf-8", errors="strict").splitlines()
    for k, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        try:
            score = float(fields[2]) if len(fields) == 3 else math.nan
        except ValueError:
            score = math.nan
        if len(fields) != 3 or not math.isfinite(score) or not (fields[0].strip()
                                                                 and fields[1].strip()):
            raise ArgumentError("path", where, "lines text_a<TAB>text_b<TAB>score (a finite "
                                "number)", requirement=f"{where}, line {k}: not text_a<TAB>"
                                f"text_b<TAB>score with a finite score: {line[:80]!r}")
        rows.append((fields[0].strip(), fields[1].strip(), score))
    _enough(len(rows), np.asarray([r[2] for r in rows] or [0.0]), where)
    return _pairs_of(rows, where)


def lee_pairs() -> TextPairs:
    """The 50 documents of gensim's ``lee.cor`` and their 1225 pairs (i < j) with the
    human ratings of Lee, Pincombe and Welsh (2005): ``similarities0-1.txt`` holds a 50 x
    50 matrix (one row a line, tab-separated, mean ratings scaled to 0..1) whose upper
    triangle rates document i with document j (its diagonal is 1, its lower triangle 0)."""
    docs = [d.strip() for d in lee_corpus("lee.cor").splitlines() if d.strip()]
    where = gensim_file("similarities0-1.txt", "lee")
    rows = [line.split() for line in where.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    try:
        m = np.asarray(rows, np.float64)
    except ValueError:
        m = np.zeros((0, 0))
    if m.shape != (len(docs), len(docs)) or not np.isfinite(m).all():
        raise ArgumentError("source", "lee", f"a {len(docs)} x {len(docs)} matrix of ratings",
                            requirement=f"{where}: not a {len(docs)} x {len(docs)} matrix of "
                                        f"numbers (one per pair of lee.cor's {len(docs)} "
                                        "documents)")
    i, j = np.triu_indices(len(docs), 1)
    return TextPairs(tuple(docs), np.stack([i, j], 1), m[i, j], "lee")


def text_pairs(name: str | None = None, path: str | os.PathLike[str] | None = None
               ) -> TextPairs:
    """A pair set by ``name`` (one of PAIR_SETS, from gensim's test data) or from ``path``
    (``read_pairs``): exactly one of the two."""
    if (name is None) == (path is None):
        raise ArgumentError("name", name, f"one of {tuple(PAIR_SETS)}, or a path (not both)",
                            requirement="name a pair set (one of "
                                        f"{', '.join(PAIR_SETS)}) or a pairs file, not both")
    if path is not None:
        return read_pairs(path)
    check_choice(name, tuple(PAIR_SETS), "name")
    if name == "lee":
        return lee_pairs()
    pairs = read_pairs(gensim_file(PAIR_SETS[name], name))
    return TextPairs(pairs.texts, pairs.pairs, pairs.scores, name)


__all__ = ["PAIR_SETS", "TextPairs", "gensim_file", "lee_corpus", "lee_corpus_path", "lee_pairs",
           "read_pairs", "read_text", "text_pairs", "token_windows"]
