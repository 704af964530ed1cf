"""Hugging Face models under faults: text batches, labels and outputs for ``OutputEvaluator``.

Nothing here downloads: models load from local directories or files (set
``HF_HUB_OFFLINE=1``), text comes from a file the user names or from the corpora in
gensim's wheel (``lee_corpus``, read as a file; gensim is not imported). ``transformers``
is imported only by the functions that need a tokenizer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bitfault.data.text import gensim_file, lee_corpus
from bitfault.errors import ArgumentError, check_int

IGNORE = -100  # a label position no metric scores (Hugging Face's convention)


def next_token_labels(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                      ) -> np.ndarray:
    """Labels for a causal language model: position t is scored against token t + 1; the
    last position, and positions whose next token is padding, are ``IGNORE``."""
    ids = np.asarray(input_ids.cpu().numpy() if isinstance(input_ids, torch.Tensor)
                     else input_ids, np.int64)
    if ids.ndim != 2 or ids.shape[1] < 2:
        raise ArgumentError("input_ids", ids.shape, "a (N, T) array with T >= 2")
    labels = np.full_like(ids, IGNORE)
    labels[:, :-1] = ids[:, 1:]
    if attention_mask is not None:
        mask = np.asarray(attention_mask.cpu().numpy() if isinstance(
            attention_mask, torch.Tensor) else attention_mask).astype(bool)
        labels[:, :-1][~mask[:, 1:]] = IGNORE
    return labels


def token_windows(ids: Any, context: int, windows: int | None = None) -> torch.Tensor:
    """A long token sequence cut into ``windows`` (default: all) rows of ``context`` tokens;
    text too short for one window is refused."""
    context = check_int(context, "context", 2)
    flat = np.asarray(ids, np.int64).reshape(-1)
    have = len(flat) // context
    if windows is not None:
        windows = check_int(windows, "windows", 1)
    want = have if windows is None else windows
    if have < max(1, want):
        raise ArgumentError("context", context, f"at most {len(flat) // max(1, want)} tokens "
                            f"for {max(1, want)} window(s)",
                            requirement=f"the text has {len(flat)} tokens: too short for "
                                        f"{max(1, want)} window(s) of {context} tokens")
    return torch.from_numpy(flat[:want * context].reshape(want, context).copy())


def text_windows(tokenizer: Any, text: str, context: int, windows: int | None = None
                 ) -> torch.Tensor:
    """``token_windows`` of ``text`` tokenized by ``tokenizer`` (a transformers tokenizer)."""
    if not isinstance(text, str) or not text.strip():
        raise ArgumentError("text", type(text).__name__, "a non-empty string")
    return token_windows(tokenizer(text, add_special_tokens=False)["input_ids"], context,
                         windows)


def gensim_corpus(name: str = "lee_background.cor") -> Path:
    """The path of one of the corpora in gensim's wheel (gensim/test/test_data), found
    without importing gensim (``bitfault.data.text.gensim_file``)."""
    return gensim_file(name, name)


def mean_pooled(out: Any, batch: Any) -> torch.Tensor:
    """An ``output_fn`` for sentence embeddings: the mean of ``last_hidden_state`` over the
    tokens the batch's ``attention_mask`` keeps (sentence-transformers' pooling)."""
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    mask = batch["attention_mask"] if isinstance(batch, dict) and "attention_mask" in batch \
        else torch.ones(hidden.shape[:2], device=hidden.device)
    m = mask.to(hidden.dtype)[..., None]
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


def offline() -> None:
    """Set ``HF_HUB_OFFLINE=1`` (and transformers' twin) for this process."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


__all__ = ["IGNORE", "gensim_corpus", "lee_corpus", "mean_pooled", "next_token_labels",
           "offline", "text_windows", "token_windows"]
