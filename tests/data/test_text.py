"""bitfault.data.text: text files and gensim's Lee corpus into fixed-length token windows."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from bitfault.data.text import lee_corpus, lee_corpus_path, read_text, token_windows
from bitfault.errors import ArgumentError, ArgumentTypeError


class WordTokenizer:
    """Ids 0, 1, 2, ... in order of first appearance of each whitespace word."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        out = [] if not add_special_tokens else [-1]  # a BOS the windows must not see
        for word in text.split():
            out.append(self.vocab.setdefault(word, len(self.vocab)))
        return out


def test_windows_are_consecutive_token_ids() -> None:
    text = " ".join(f"w{i}" for i in range(10))
    ids = token_windows(text, WordTokenizer(), context=4)
    assert ids.dtype == np.int64 and ids.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    ids = token_windows(text, WordTokenizer(), context=4, stride=3)
    assert ids.tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    assert token_windows(text, WordTokenizer(), 4, n_windows=1).tolist() == [[0, 1, 2, 3]]
    assert token_windows(text, lambda t: [len(w) for w in t.split()], 10).shape == (1, 10)


def test_text_too_short_for_the_context_is_named() -> None:
    text = "a b c d e"
    with pytest.raises(ArgumentError, match="text too short for the context: 5 tokens, 1 "
                                            "window.* of 6 every 6 need 6") as info:
        token_windows(text, WordTokenizer(), context=6)
    assert info.value.argument == "text"
    with pytest.raises(ArgumentError, match="5 tokens, 3 window.* need 9"):
        token_windows(text, WordTokenizer(), context=3, n_windows=3)
    for bad in ({"context": 0}, {"context": 2, "stride": 0}, {"context": 2, "n_windows": -1},
                {"context": True}):
        with pytest.raises(ArgumentError):
            token_windows(text, WordTokenizer(), **bad)
    with pytest.raises(ArgumentTypeError, match="tokenizer"):
        token_windows(text, object(), 2)


def test_read_text(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("héllo world\n", encoding="utf-8")
    assert read_text(tmp_path / "t.txt") == "héllo world\n"
    with pytest.raises(ArgumentError, match="no such text file"):
        read_text(tmp_path / "missing.txt")
    (tmp_path / "blank.txt").write_text("  \n")
    with pytest.raises(ArgumentError, match="holds no text"):
        read_text(tmp_path / "blank.txt")


@pytest.mark.skipif(importlib.util.find_spec("gensim") is None, reason="gensim not installed")
def test_the_lee_corpus_is_read_without_importing_gensim() -> None:
    import sys

    had = "gensim" in sys.modules
    text = lee_corpus()
    assert ("gensim" in sys.modules) == had
    assert lee_corpus_path().name == "lee_background.cor" and os.path.getsize(
        lee_corpus_path()) == len(text.encode("utf-8"))
    assert text.startswith("Hundreds of people have been forced to vacate their homes")
    assert token_windows(text, WordTokenizer(), 256, n_windows=8).shape == (8, 256)
    with pytest.raises(ArgumentError, match="one of"):
        lee_corpus("other.cor")
