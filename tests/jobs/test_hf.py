"""`bitfault campaign` / `report` on a Hugging Face model directory and a GGUF file: tiny
random models built from transformers configs (and a tiny GGUF written with gguf's writer),
a tiny tokenizer trained in the test, a text file written here; nothing downloads."""

from __future__ import annotations

import json
import math
import os
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

WORDS = ("the chip stores weights in memory words and a fault flips one bit of a word so the "
         "model reads a wrong value then the next token changes or the loss grows and we "
         "measure how often that happens across many simulated chips at each rate").split()


def _text(lines: int = 60, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    return "\n".join(" ".join(rng.choice(WORDS, size=12)) for _ in range(lines)) + "\n"


def _tokenizer(folder: Path, text: str) -> Path:
    """A tiny word-level BPE tokenizer (under 100 tokens) saved as a transformers one."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(text.splitlines(), trainers.BpeTrainer(
        vocab_size=90, special_tokens=["[UNK]", "[PAD]"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
    fast.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("hf_assets")
    text = _text()
    (d / "text.txt").write_text(text, encoding="utf-8")
    tok = _tokenizer(d / "tok", text)
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, max_position_embeddings=64))
    llama.save_pretrained(d / "llama")
    _tokenizer(d / "llama", text)
    bert = BertModel(BertConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2, num_attention_heads=4,
                                max_position_embeddings=64))
    bert.save_pretrained(d / "bert")
    _tokenizer(d / "bert", text)
    out = {"text": d / "text.txt", "tok": tok, "llama": d / "llama", "bert": d / "bert"}
    if importlib_ok("gguf"):
        from gguf_helpers import write_tiny_llama

        out["gguf"] = write_tiny_llama(d / "tiny.gguf", seed=3, tied=True)
    return out


def importlib_ok(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _hf_config(assets: dict[str, Path], out: Path, **over) -> dict:
    cfg = {"output": str(out), "model": {"kind": "hf", "path": str(assets["llama"])},
           "data": {"source": "text", "path": str(assets["text"]), "context": 16,
                    "windows": 3},
           "metric": "perplexity",
           "recipes": [{"name": "int8", "format": {"kind": "int_quant", "bits": 8,
                                                   "per_channel": True}}],
           "campaign": {"bers": [1e-3, 1e-2], "chips": 2, "seed": 3}}
    cfg.update(over)
    return cfg


def _gguf_config(assets: dict[str, Path], out: Path, **over) -> dict:
    cfg = {"output": str(out), "model": {"kind": "gguf", "path": str(assets["gguf"])},
           "data": {"source": "text", "path": str(assets["text"]), "context": 16,
                    "windows": 2, "tokenizer": str(assets["tok"])},
           "campaign": {"bers": [1e-4, 1e-3], "chips": 2, "seed": 1}}
    cfg.update(over)
    return cfg


def _perplexity(logits, ids) -> float:
    """Perplexity of next tokens, computed by torch (the test's own reference)."""
    lo = logits[:, :-1].double().reshape(-1, logits.shape[-1])
    nll = torch.nn.functional.cross_entropy(lo, ids[:, 1:].reshape(-1), reduction="mean")
    return float(torch.exp(nll))


def _windows(assets, context: int, windows: int):
    from transformers import AutoTokenizer

    from bitfault.data.text import token_windows

    tok = AutoTokenizer.from_pretrained(assets["tok"])
    return torch.from_numpy(token_windows(assets["text"].read_text(), tok, context, windows))


def _records(run: Path, recipe: str) -> dict:
    store = run / "campaign" / f"{recipe}.sqlite"
    import sqlite3

    with sqlite3.connect(store) as db:
        keys = {k for (k,) in db.execute("SELECT trial_key FROM trials")}
    return {r.trial_key: r for r in read_records(store, keys)}


def test_config_round_trips_and_names_every_mistake(assets, tmp_path) -> None:
    for cfg in (_hf_config(assets, tmp_path / "a"), _gguf_config(assets, tmp_path / "b")):
        config = load_config(cfg)
        again = load_config(json.loads(json.dumps(config.to_dict())))
        assert again == config and again.model.pretrained
    g = load_config(_gguf_config(assets, tmp_path / "b"))
    assert g.metric == "perplexity" and [r.name for r in g.recipes] == ["gguf"]
    assert g.recipes[0].format is None and g.data.context == 16
    bad = [
        ({"model": {"kind": "onnx", "path": "m"}}, "model.kind", "hf, gguf"),
        ({"model": {"kind": "hf"}}, "model.path", "Hugging Face model directory"),
        ({"metric": "bleu"}, "metric", "perplexity, agreement, cosine"),
        ({"train": {"epochs": 1}}, "train", "not trained"),
        ({"data": {"source": "embedded"}}, "data.source", "'text'"),
        ({"data": {"source": "text"}}, "data.path", "a text file"),
        ({"data": {"source": "text", "path": "x", "context": 1}}, "data.context", ">= 2"),
        ({"recipes": [{"name": "a", "format": {"kind": "int_quant", "bits": 8},
                       "weight_clip": 0.1}]}, "recipes[0].weight_clip", "nothing is trained"),
        ({"recipes": [{"name": "a"}]}, "recipes[0].format", "stored in"),
        ({"campaign": {"single_faults": 0.05}}, "campaign.single_faults", "null"),
    ]
    for over, key, allowed in bad:
        with pytest.raises(ConfigError) as err:
            load_config(_hf_config(assets, tmp_path / "c", **over))
        assert err.value.key == key and allowed in err.value.allowed, (over, err.value)
    with pytest.raises(ConfigError, match="'metric'.*perplexity or agreement"):
        load_config(_gguf_config(assets, tmp_path / "d", metric="cosine"))
    with pytest.raises(ConfigError, match="campaign.bits"):
        load_config(_gguf_config(assets, tmp_path / "d", campaign={"bits": True}))
    with pytest.raises(ConfigError, match="'metric'.*a model bitfault trains"):
        load_config({"metric": "perplexity"})
    with pytest.raises(ConfigError, match="'data.context'.*data.source 'text'"):
        load_config({"data": {"source": "embedded", "context": 4}})


def test_hf_campaign_resumes_and_equals_a_hand_written_trial(assets, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    cfg = _hf_config(assets, run)
    summary = run_campaign(config=cfg)
    m = summary["models"]["int8"]
    assert m["complete"] and m["stored"] == m["trials"] == 4 and m["ran"] == 4
    assert summary["metric"] == "perplexity" and summary["value"] == "perplexity"
    assert {r["ber"] for r in m["rate"]} == {1e-3, 1e-2}
    assert m["clean"]["masked"] == 1 and m["clean"]["next_token_agreement"] == 1.0
    assert sorted(os.listdir(run)) == ["campaign", "config.json", "summary.json"]
    # one stored trial, recomputed by hand: bf.inject's values written into the weights
    fmt = bf.IntQuant(8, per_channel=True)
    ids = _windows(assets, 16, 3)
    model = AutoModelForCausalLM.from_pretrained(assets["llama"]).eval()
    records = _records(run, "int8")
    trial = next(r for r in records.values() if r.ber == 1e-2 and r.chip == 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                fmap = bf.FaultMap.random(tuple(p.shape), fmt, ber=1e-2, seed=trial.seed,
                                          name=name, fault=bf.BitFlip())
                p.copy_(torch.from_numpy(bf.inject(p.numpy(), fmt, bf.BitFlip(), fmap)))
        logits = model(ids).logits
    assert math.isclose(trial.metrics["perplexity"], _perplexity(logits, ids), rel_tol=1e-6)
    # resumed: nothing runs again, the stores keep every trial
    again = run_campaign(run)
    assert again["models"]["int8"]["ran"] == 0 and again["models"]["int8"]["skipped"] == 4
    files = make_report(run)
    html = Path(files["html"]).read_text()
    assert "perplexity" in html and "Outcomes per rate" in html
    assert {"rate_perplexity", "rate_next_token_agreement"} <= set(files)
    # perplexity is headlined by its median and quartiles; outcomes in the field's classes
    assert "Median perplexity [25th, 75th percentile] over chips" in html
    assert "<th>benign</th><th>sdc</th><th>non_finite</th>" in html
    assert {"masked", "benign", "sdc", "non_finite"} <= set(m["outcomes"][0])


def test_gguf_campaign_faults_the_stored_planes(assets, tmp_path) -> None:
    pytest.importorskip("gguf")
    from bitfault.torch.gguf import load_gguf_model

    run = tmp_path / "run"
    summary = run_campaign(config=_gguf_config(
        assets, run, campaign={"bers": [1e-4, 1e-3], "chips": 2, "seed": 1, "layers": True,
                               "sensitivity_bers": [1e-3], "plane_rates": {"codes": 0}}))
    m = summary["models"]["gguf"]
    assert m["format"] == "gguf file" and m["complete"]
    assert m["trials"] == 4 + len(m["tensors"]) * 2 and len(m["layer"]) == len(m["tensors"])
    # a trial by hand: GGUFMemory's own maps (scales and minimums only), through GGUFModel
    gm = load_gguf_model(assets["gguf"])
    ids = _windows(assets, 16, 2)
    records = _records(run, "gguf")
    for trial in (r for r in records.values() if r.kind == "rate"):
        maps = gm.memory.random_maps(ber={"scale": trial.ber, "min": trial.ber},
                                     seed=trial.seed)
        assert all(len(fm.indices) == 0 for fm in maps.values())  # no code is faulted
        gm.inject_(maps)
        with torch.no_grad():
            ppl = _perplexity(gm.model(ids).logits, ids)
        got = trial.metrics["perplexity"]
        assert (math.isclose(got, ppl, rel_tol=1e-6) if math.isfinite(ppl)
                else not math.isfinite(got)), trial.trial_key
    again = run_campaign(run)
    assert again["models"]["gguf"]["ran"] == 0
    files = make_report(run)
    assert "gguf" in Path(files["html"]).read_text()


def test_cosine_on_an_encoder(assets, tmp_path) -> None:
    run = tmp_path / "run"
    summary = run_campaign(config=_hf_config(
        assets, run, model={"kind": "hf", "path": str(assets["bert"])}, metric="cosine",
        data={"source": "text", "path": str(assets["text"]), "context": 16, "windows": 8},
        campaign={"bers": [1e-3], "chips": 2, "layers": True}))
    m = summary["models"]["int8"]
    assert summary["value"] == "cosine" and m["clean"]["cosine"] == pytest.approx(1.0)
    assert all(-1 <= r["mean"] <= 1 for r in m["rate"] + m["layer"])
    files = make_report(run)
    assert any(k.startswith("layers_") for k in files)


def test_bad_input_is_refused_before_anything_is_written(assets, tmp_path) -> None:
    run = tmp_path / "run"
    cases = [
        (_hf_config(assets, run, model={"kind": "hf", "path": str(tmp_path / "nope")}),
         "model.path"),
        (_hf_config(assets, run, model={"kind": "hf", "path": str(assets["bert"])}), "metric"),
        (_hf_config(assets, run, data={"source": "text", "path": str(assets["text"]),
                                       "context": 64, "windows": 1000}), "data.context"),
        (_hf_config(assets, run, data={"source": "text", "path": str(tmp_path / "x.txt")}),
         "data.path"),
        (_hf_config(assets, run, campaign={"targets": ["no.such.weight"]}),
         "campaign.targets"),
    ]
    if "gguf" in assets:  # the tiny GGUF carries no tokenizer
        cfg = _gguf_config(assets, run)
        del cfg["data"]["tokenizer"]
        cases.append((cfg, "model.path"))
    for cfg, key in cases:
        with pytest.raises(ConfigError) as err:
            run_campaign(config=cfg)
        assert err.value.key == key, (key, err.value)
        assert not run.exists()
    run.mkdir()
    (run / "campaign").mkdir()  # bitfault's name, but no run here: refused
    with pytest.raises(ValueError, match="not a run directory"):
        run_campaign(config=_hf_config(assets, run))
    (run / "campaign").rmdir()
    run_campaign(config=_hf_config(assets, run, campaign={"bers": [1e-3], "chips": 1}))
    with pytest.raises(ValueError, match="another model"):  # another model, same directory
        run_campaign(config=_hf_config(assets, run, model={"kind": "hf",
                                                           "path": str(assets["bert"])},
                                       metric="cosine"))
    with pytest.raises(ValueError, match="another campaign"):  # another fault model
        run_campaign(config=_hf_config(assets, run, campaign={
            "bers": [1e-3], "chips": 1, "fault": {"kind": "stuck_at", "value": 1}}))


def test_package_paths_find_the_model_and_text_a_package_ships(assets, tmp_path,
                                                               monkeypatch) -> None:
    import shutil

    pkg = tmp_path / "site" / "tiny_models_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('bitfault must not import me')\n")
    shutil.copytree(assets["llama"], pkg / "llama")
    shutil.copy(assets["text"], pkg / "text.txt")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    campaign = {"bers": [1e-2], "chips": 2, "seed": 3}
    plain = run_campaign(config=_hf_config(assets, tmp_path / "plain", campaign=campaign))
    packaged = _hf_config(assets, tmp_path / "pkg", campaign=campaign,
                          model={"kind": "hf", "path": "package:tiny_models_pkg/llama"},
                          data={"source": "text", "path": "package:tiny_models_pkg/text.txt",
                                "context": 16, "windows": 3})
    got = run_campaign(config=packaged)
    assert got["models"]["int8"]["clean"] == plain["models"]["int8"]["clean"]
    assert got["models"]["int8"]["rate"] == plain["models"]["int8"]["rate"]
    # the run directory keeps the paths as written: portable to another machine
    kept = json.loads((tmp_path / "pkg" / "config.json").read_text())
    assert kept["model"]["path"] == "package:tiny_models_pkg/llama"
    assert run_campaign(tmp_path / "pkg")["models"]["int8"]["ran"] == 0
    for model_path in ("package:no_such_package_here/llama", "package:tiny_models_pkg/nope"):
        with pytest.raises(ConfigError) as err:
            run_campaign(config=_hf_config(assets, tmp_path / "bad",
                                           model={"kind": "hf", "path": model_path}))
        assert err.value.key == "model.path" and not (tmp_path / "bad").exists()


def test_cli_campaign_and_report(assets, tmp_path, capsys) -> None:
    from bitfault.cli import main

    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps(_hf_config(assets, tmp_path / "run",
                                         campaign={"bers": [1e-3], "chips": 1})))
    assert main(["campaign", str(cfg), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["ok"] and out["metric"] == "perplexity" and out["models"]["int8"]["ran"] == 1
    assert main(["report", str(tmp_path / "run"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["ok"] and Path(out["report"]).is_file()
    assert main(["campaign", str(tmp_path / "run"), "--quiet"]) == 0
    assert "perplexity" in capsys.readouterr().out


def test_agreement_headline_and_the_example_configs_validate(assets, tmp_path) -> None:
    pytest.importorskip("yaml")
    summary = run_campaign(config=_hf_config(assets, tmp_path / "run", metric="agreement",
                                             campaign={"bers": [1e-2], "chips": 2,
                                                       "bits": True}))
    m = summary["models"]["int8"]
    assert summary["value"] == "next_token_agreement" and m["clean"][summary["value"]] == 1.0
    assert all(0 <= r["mean"] <= 1 for r in m["rate"]) and len(m["bit"]) == 8
    examples = Path(__file__).resolve().parents[2] / "examples"
    for name, kind in (("smollm2_gguf.yaml", "gguf"), ("minilm_hf.yaml", "hf")):
        config = load_config(examples / name)  # validated only: the real models are not run
        assert config.model.kind == kind and "lee" in (config.data.path, config.data.name)
