"""Tiny GGUF files written with ``gguf``'s own writer, and an independent byte-level
reference: where a fault map's bits sit in llama.cpp's bytes, flipped by hand."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

QK = 32
HEAD = {"Q8_0": 2, "Q4_0": 2, "Q4_1": 4}  # bytes of fp16 words before a block's codes
TYPE_SIZE = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}
ITEM = {"F32": 4, "F16": 2, "BF16": 2}

# hidden 64, 4 heads of 16 (2 kv heads), ffn 96, vocab 128, 2 blocks: every quantised
# row holds whole blocks of 32
HIDDEN, FFN, VOCAB, LAYERS, HEADS, KV_HEADS = 64, 96, 128, 2, 4, 2


def tensors(tied: bool = True) -> dict[str, tuple[tuple[int, ...], T]]:
    """GGUF name -> (numpy shape, stored type) of a tiny Llama with every type the test
    needs: Q8_0, Q4_0, Q4_1, F16, BF16, F32."""
    kv = HIDDEN // HEADS * KV_HEADS
    out = {"token_embd.weight": ((VOCAB, HIDDEN), T.Q8_0),
           "output_norm.weight": ((HIDDEN,), T.F32)}
    if not tied:
        out["output.weight"] = ((VOCAB, HIDDEN), T.F16)
    for i in range(LAYERS):
        out.update({
            f"blk.{i}.attn_norm.weight": ((HIDDEN,), T.F32),
            f"blk.{i}.attn_q.weight": ((HIDDEN, HIDDEN), T.Q4_0),
            f"blk.{i}.attn_k.weight": ((kv, HIDDEN), T.Q4_1),
            f"blk.{i}.attn_v.weight": ((kv, HIDDEN), T.Q8_0),
            f"blk.{i}.attn_output.weight": ((HIDDEN, HIDDEN), T.BF16),
            f"blk.{i}.ffn_norm.weight": ((HIDDEN,), T.F32),
            f"blk.{i}.ffn_gate.weight": ((FFN, HIDDEN), T.Q4_1),
            f"blk.{i}.ffn_up.weight": ((FFN, HIDDEN), T.Q4_0 if i else T.F16),
            f"blk.{i}.ffn_down.weight": ((HIDDEN, FFN), T.Q4_1),
        })
    return out


def write_tiny_llama(path: Path, seed: int = 0, tied: bool = True,
                     extra: dict[str, np.ndarray] | None = None) -> Path:
    """A tiny random Llama GGUF at ``path`` (no tokenizer: transformers loads the model)."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_vocab_size(VOCAB)
    for name, (shape, qtype) in tensors(tied).items():
        x = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        if name.endswith("norm.weight"):
            x += 1
        if qtype == T.F32:
            w.add_tensor(name, x)
        elif qtype == T.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def bit_positions(qtype: str, shape: tuple[int, ...], plane: str, index: int, mask: int
                  ) -> list[tuple[int, int]]:
    """(byte offset within the tensor's data, bit within that byte) of each set bit of
    ``mask`` in word ``index`` (flat, numpy order) of ``plane``: llama.cpp's block layout
    (fp16 d [, fp16 m], then 32 int8 codes or 16 bytes of nibbles: element j in the low
    nibble of byte j, element j + 16 in the high one), little-endian words."""
    bits = [b for b in range(32) if mask >> b & 1]
    if qtype in ITEM:
        return [(index * ITEM[qtype] + b // 8, b % 8) for b in bits]
    row_blocks = shape[-1] // QK
    size = TYPE_SIZE[qtype]
    if plane in ("scale", "min"):
        base = index * size + (2 if plane == "min" else 0)
        return [(base + b // 8, b % 8) for b in bits]
    row, col = divmod(index, shape[-1])
    block, j = row * row_blocks + col // QK, col % QK
    base = block * size + HEAD[qtype]
    if qtype == "Q8_0":
        return [(base + j, b) for b in bits]
    return [(base + j % 16, b + (4 if j >= 16 else 0)) for b in bits]


def flip_bytes(data: np.ndarray, qtype: str, shape: tuple[int, ...], fmap) -> np.ndarray:
    """A copy of a tensor's raw bytes with every bit of ``fmap`` (and its planes) flipped."""
    raw = np.array(np.asarray(data).reshape(-1).view(np.uint8), copy=True)
    for plane, pmap in [("codes", fmap), *fmap.planes.items()]:
        for index, mask in zip(pmap.indices.tolist(), pmap.masks.tolist(), strict=True):
            for offset, bit in bit_positions(qtype, shape, plane, index, mask):
                raw[offset] ^= np.uint8(1 << bit)
    return raw


def reader_bytes(t) -> np.ndarray:
    """A reader tensor's raw bytes, flat uint8."""
    return np.asarray(t.data).reshape(-1).view(np.uint8)


def dequantize_raw(raw: np.ndarray, qtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """``gguf.quants.dequantize`` of raw bytes of a tensor of numpy ``shape``."""
    qt = T[qtype]
    if qtype in ("F32", "F16"):
        return gguf.quants.dequantize(raw.view("<f4" if qtype == "F32" else "<f2")
                                      .reshape(shape), qt).astype(np.float32)
    byte_shape = gguf.quants.quant_shape_to_byte_shape(shape, qt)
    return gguf.quants.dequantize(raw.reshape(byte_shape), qt).astype(np.float32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal float32 arrays bit for bit (NaN payloads included)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))
