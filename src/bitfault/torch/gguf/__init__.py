"""GGUF files on PyTorch: a transformers model loaded once from the file (``load``), a
trial's faulty elements written into its parameters (``patch``), campaigns over the
planes the file stores (``evaluate``: ``GGUFFileMemory``, ``GGUFEvaluator``).

    from bitfault.torch.gguf import load_gguf_model
"""

from __future__ import annotations

from bitfault.torch.gguf.load import MERGING, GGUFModel, load_gguf_model

__all__ = ["MERGING", "GGUFModel", "load_gguf_model"]
