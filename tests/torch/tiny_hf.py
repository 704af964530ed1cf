"""Tiny random Hugging Face models built from configs (the tests never load real ones):
two layers, hidden size 32, a 64-token vocabulary, seeded. Import after
``pytest.importorskip("transformers")``."""

from __future__ import annotations

import torch
import transformers


def llama(layers: int = 2, kv_heads: int = 1) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=layers, num_attention_heads=2,
                                   num_key_value_heads=kv_heads, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).eval()


def gpt2() -> transformers.GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2,
                                  n_positions=64, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def bert() -> transformers.BertModel:
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=64)
    return transformers.BertModel(cfg).eval()
