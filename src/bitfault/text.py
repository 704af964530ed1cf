"""Text data for language-model metrics: a text file or gensim's Lee news corpus, tokenised
by the model's own tokenizer into fixed-length windows of token ids.

    from bitfault.text import lee_corpus, token_windows
    ids = token_windows(lee_corpus(), tokenizer, context=128, n_windows=4)  # (4, 128) int64

Nothing is downloaded: ``lee_corpus`` reads ``gensim/test/test_data/lee_background.cor``
from the installed gensim wheel without importing gensim; any other text is a file the
user names (``read_text``). Text too short for the windows asked is an ArgumentError
before anything runs.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np

from bitfault.errors import ArgumentError, ArgumentTypeError

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


def lee_corpus_path(name: str = "lee_background.cor") -> Path:
    """Where gensim's wheel keeps a Lee corpus file (found, not imported)."""
    if name not in LEE_FILES:
        raise ArgumentError("name", name, f"one of {LEE_FILES}")
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise ArgumentError("source", "lee", "an installed gensim wheel (its test corpora)",
                            requirement="the Lee corpus comes from gensim's wheel "
                                        "(gensim/test/test_data); install gensim or name a "
                                        "text file")
    path = Path(next(iter(spec.submodule_search_locations))) / "test" / "test_data" / name
    if not path.is_file():
        raise ArgumentError("source", "lee", "gensim's test corpora",
                            requirement=f"{path}: not found in the installed gensim")
    return path


def lee_corpus(name: str = "lee_background.cor") -> str:
    """The Lee news corpus (one document a line) as one string."""
    return read_text(lee_corpus_path(name))


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


__all__ = ["lee_corpus", "lee_corpus_path", "read_text", "token_windows"]
