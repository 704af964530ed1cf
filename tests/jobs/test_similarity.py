"""`bitfault campaign` with metric similarity on data.source pairs: a tiny random BERT, a
tiny tokenizer and a pairs file written here; the stored Spearman scores recomputed by a
hand-written forward and a plain-loop rank correlation; bad configs refused before
anything is written."""

from __future__ import annotations

import json
import math
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
os.environ["HF_HUB_OFFLINE"] = "1"

import bitfault as bf  # noqa: E402
from bitfault.config import ConfigError, load_config  # noqa: E402
from bitfault.jobs import make_report, run_campaign  # noqa: E402
from bitfault.jobs.summary import read_records  # noqa: E402

WORDS = ("a chip stores weights in memory words and a fault flips one bit so the model "
         "reads a wrong value and the embedding of a sentence moves away").split()


def _ref_spearman(a: list[float], b: list[float]) -> float:
    """Pearson's r of textbook average ranks, exact until the square root."""
    def ranks(x):
        return [1 + sum(y < v for y in x) + Fraction(sum(y == v for y in x) - 1, 2) for v in x]
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    sab = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    den = sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)
    return 0.0 if den == 0 else math.copysign(math.sqrt(sab * sab / den), sab)


def _ref_score(emb: np.ndarray, pairs: list[tuple[int, int]], scores: list[float]) -> float:
    cos = []
    for i, j in pairs:
        u, v = emb[i].tolist(), emb[j].tolist()
        if not all(map(math.isfinite, u + v)):
            cos.append(0.0)
            continue
        dot = sum(x * y for x, y in zip(u, v, strict=True))
        cos.append(dot / (math.sqrt(sum(x * x for x in u)) * math.sqrt(sum(y * y for y in v))))
    return _ref_spearman(cos, scores)


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("similarity")
    rng = np.random.default_rng(1)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 9)))) for _ in range(10)]
    rows, pairs, scores = [], [], []
    for _ in range(18):
        i, j = (int(v) for v in rng.choice(10, size=2, replace=False))
        score = float(rng.integers(0, 4))  # ties among the human scores
        rows.append(f"{texts[i]}\t{texts[j]}\t{score}")
        pairs.append((i, j))
        scores.append(score)
    (d / "pairs.tsv").write_text("# text_a\ttext_b\tscore\n" + "\n".join(rows) + "\n",
                                 encoding="utf-8")
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=80,
                                                       special_tokens=["[UNK]", "[PAD]"]))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4,
                         max_position_embeddings=24)).save_pretrained(d / "bert")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                            pad_token="[PAD]").save_pretrained(d / "bert")
    return {"dir": d, "pairs": d / "pairs.tsv", "bert": d / "bert", "texts": texts,
            "pair_list": pairs, "scores": scores}


def _config(assets: dict, out: Path, **over) -> dict:
    cfg = {"output": str(out), "model": {"kind": "hf", "path": str(assets["bert"])},
           "metric": "similarity",
           "data": {"source": "pairs", "path": str(assets["pairs"]), "context": 12},
           "recipes": [{"name": "int8", "format": {"kind": "int_quant", "bits": 8,
                                                   "per_channel": True}}],
           "campaign": {"bers": [1e-2], "chips": 2, "seed": 3}}
    cfg.update(over)
    return cfg


def _embeddings(assets: dict, tensors: dict, maps: dict | None, fmt) -> np.ndarray:
    """Mean-pooled embeddings with every targeted weight as bf.inject makes it."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(assets["bert"]).eval()
    tok = AutoTokenizer.from_pretrained(assets["bert"])
    texts = list(dict.fromkeys(t for ij in assets["pair_list"] for t in
                               (assets["texts"][ij[0]], assets["texts"][ij[1]])))
    x = tok(texts, padding=True, truncation=True, max_length=12, return_tensors="pt")
    with torch.no_grad():
        for name, shape in tensors.items():
            p = model.get_parameter(name)
            fmap = (maps or {}).get(name) or bf.FaultMap.empty(tuple(shape), name)
            p.copy_(torch.from_numpy(bf.inject(p.numpy(), fmt, bf.BitFlip(), fmap)))
        h = model(**x).last_hidden_state.double()
    m = x["attention_mask"].double()[..., None]
    return ((h * m).sum(1) / m.sum(1)).numpy(), texts


def test_similarity_campaign_equals_a_hand_written_trial(assets, tmp_path) -> None:
    run = tmp_path / "run"
    summary = run_campaign(config=_config(assets, run))
    m = summary["models"]["int8"]
    assert summary["metric"] == "similarity" and summary["value"] == "spearman"
    assert summary["pairs"] == 18 and m["complete"] and m["stored"] == 2
    assert set(m["curves"]) == {"spearman", "cosine", "cosine_min"}
    fmt = bf.IntQuant(8, per_channel=True)
    clean, texts = _embeddings(assets, m["tensors"], None, fmt)
    assert summary["examples"] == len(texts)
    index = {t: k for k, t in enumerate(texts)}
    pairs = [(index[assets["texts"][i]], index[assets["texts"][j]])
             for i, j in assets["pair_list"]]
    want_clean = _ref_score(clean, pairs, assets["scores"])
    assert math.isclose(m["clean"]["spearman"], want_clean, rel_tol=1e-9, abs_tol=1e-12)
    assert m["clean"]["masked"] == 1 and m["clean"]["cosine"] == pytest.approx(1.0)
    store = run / "campaign" / "int8.sqlite"
    import sqlite3

    with sqlite3.connect(store) as db:
        keys = {k for (k,) in db.execute("SELECT trial_key FROM trials")}
    changed = 0
    for trial in read_records(store, keys):
        maps = {n: bf.FaultMap.random(tuple(s), fmt, ber=trial.ber, seed=trial.seed, name=n,
                                      fault=bf.BitFlip()) for n, s in m["tensors"].items()}
        faulty, _ = _embeddings(assets, m["tensors"], maps, fmt)
        want = _ref_score(faulty, pairs, assets["scores"])
        assert math.isclose(trial.metrics["spearman"], want, rel_tol=1e-9, abs_tol=1e-12)
        assert trial.metrics["spearman_clean"] == m["clean"]["spearman"]
        changed += trial.metrics["spearman"] != m["clean"]["spearman"]
    assert changed  # the faults reached the score
    again = run_campaign(run)
    assert again["models"]["int8"]["ran"] == 0
    files = make_report(run)
    html = Path(files["html"]).read_text()
    assert "spearman" in html and "18 rated pairs" in html and "rate_spearman" in files


def test_pairs_configs_round_trip_and_name_every_mistake(assets, tmp_path) -> None:
    config = load_config(_config(assets, tmp_path / "a"))
    assert load_config(json.loads(json.dumps(config.to_dict()))) == config
    assert config.data.context == 12 and config.data.windows is None
    named = load_config(_config(assets, tmp_path / "a", metric=None,
                                data={"source": "pairs", "name": "lee"}))
    assert named.metric == "similarity" and named.data.name == "lee"
    assert named.data.context == 256 and named.data.to_dict()["name"] == "lee"
    assert load_config(json.loads(json.dumps(named.to_dict()))) == named
    bad = [
        ({"data": {"source": "pairs"}}, "data.name", "not both"),
        ({"data": {"source": "pairs", "name": "lee", "path": "x"}}, "data.name", "not both"),
        ({"data": {"source": "pairs", "name": "stsb"}}, "data.name", "wordsim353"),
        ({"data": {"source": "pairs", "name": "lee", "windows": 4}}, "data.windows", "null"),
        ({"metric": "cosine"}, "metric", "similarity for data.source 'pairs'"),
        ({"data": {"source": "text", "path": "lee"}}, "data.source", "'pairs' for metric"),
        ({"data": {"source": "text", "path": "lee", "name": "lee"}}, "data.name", "null"),
        ({"data": {"source": "embedded", "name": "lee"}}, "data.name", "'pairs'"),
        ({"model": {"kind": "gguf", "path": "m.gguf"}, "metric": None}, "data.source",
         "'text' for model.kind 'gguf'"),
    ]
    for over, key, allowed in bad:
        with pytest.raises(ConfigError) as err:
            load_config(_config(assets, tmp_path / "c", **over))
        assert err.value.key == key and allowed in err.value.allowed, (over, err.value)


def test_bad_pairs_data_is_refused_before_anything_is_written(assets, tmp_path) -> None:
    run = tmp_path / "run"
    bad = tmp_path / "bad.tsv"
    bad.write_text("one\ttwo\t1\nthree\tfour\n", encoding="utf-8")
    long = tmp_path / "long.tsv"
    long.write_text(" ".join(WORDS * 3) + "\ta chip\t1\na fault\tbit\t2\n", encoding="utf-8")
    cases = [
        (_config(assets, run, data={"source": "pairs", "path": str(tmp_path / "no.tsv")}),
         "data.path", "an existing pairs file"),
        (_config(assets, run, data={"source": "pairs", "path": str(bad)}), "data.path",
         "line 2"),
        (_config(assets, run, data={"source": "pairs", "path": str(long), "context": 64}),
         "data.context", "at most 24"),
    ]
    for cfg, key, words in cases:
        with pytest.raises(ConfigError) as err:
            run_campaign(config=cfg)
        assert err.value.key == key and words in str(err.value), (key, err.value)
        assert not run.exists()
