"""Pretrained models in jobs: a Hugging Face model directory or a GGUF file, its text data,
and one evaluator per recipe (storage format), all checked before anything is written.

``model.kind: hf``: ``AutoModelForCausalLM`` (metrics perplexity, agreement) or
``AutoModel`` with mean pooling (cosine) from the directory, each recipe's format storing
every targeted weight (``bitfault.torch.OutputEvaluator``). ``model.kind: gguf``: the file
loaded once (``bitfault.torch.gguf.load_gguf_model``), faulted in the planes it stores
(``bitfault.torch.gguf.evaluate``). Text: ``data.path`` (a UTF-8 file, or ``lee``: gensim's Lee
corpus) through the model's tokenizer (or ``data.tokenizer``): ``data.windows`` rows of
``data.context`` tokens for a language model, the first ``data.windows`` non-empty lines
(truncated to ``data.context`` tokens) for embeddings; ``data.source: pairs`` (metric
similarity): every text of the pair set, truncated to ``data.context`` tokens, scored by
``bitfault.campaign.similarity.SimilarityMetric``. Nothing downloads: transformers is
asked for local files only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bitfault.config import ConfigError, RunConfig, targets_value
from bitfault.config.pretrained import CAUSAL_METRICS, LEE, with_local_paths
from bitfault.errors import ArgumentError
from bitfault.memory.memory import Memory
from bitfault.recipes import Recipe

# config metric -> (OutputMetric kind, the value its curves headline, other curves)
METRICS = {"perplexity": ("language_model", "perplexity",
                          ("next_token_agreement", "next_token_accuracy")),
           "agreement": ("language_model", "next_token_agreement",
                         ("perplexity", "next_token_accuracy")),
           "cosine": ("cosine", "cosine", ("cosine_min",)),
           "similarity": ("similarity", "spearman", ("cosine", "cosine_min"))}
HEADS = ("ForCausalLM", "LMHeadModel")  # architectures with a causal language-model head


def headline(metric: str) -> str:
    """The value a metric's campaign plots first (``perplexity``, ``cosine``...)."""
    return METRICS[metric][1]


def curves(metric: str) -> tuple[str, ...]:
    """Every value of a metric the summary and the report give curves of."""
    return (METRICS[metric][1], *METRICS[metric][2])


def check_paths(config: RunConfig) -> None:
    """model.path, data.path and data.tokenizer exist and fit the metric (reads only)."""
    m, d = config.model, config.data
    if m.kind == "hf":
        cfg = Path(m.path) / "config.json"
        if not cfg.is_file():
            raise ConfigError("model.path", m.path, "a Hugging Face model directory (with "
                              f"config.json): {cfg} does not exist")
        try:
            arch = json.loads(cfg.read_text(encoding="utf-8")).get("architectures") or []
        except (ValueError, OSError) as exc:
            raise ConfigError("model.path", m.path, f"a directory whose config.json is JSON "
                              f"({exc})") from None
        if config.metric in CAUSAL_METRICS and not any(a.endswith(HEADS) for a in arch):
            raise ConfigError("metric", config.metric, f"cosine for {m.path}: its config.json "
                              f"names architectures {arch}, none with a causal language-model "
                              f"head ({' or '.join(HEADS)}), which {config.metric} scores")
    elif not os.path.isfile(m.path):
        raise ConfigError("model.path", m.path, "an existing GGUF file")
    if d.source == "pairs":
        if d.path is not None and not os.path.isfile(d.path):
            raise ConfigError("data.path", d.path, "an existing pairs file (text_a, text_b, "
                              "score per line, tab-separated)")
    elif d.path != LEE and not os.path.isfile(d.path):
        raise ConfigError("data.path", d.path, f"an existing text file or {LEE!r}")
    if d.tokenizer is not None and not os.path.isdir(d.tokenizer):
        raise ConfigError("data.tokenizer", d.tokenizer, "an existing tokenizer directory")


def read_corpus(config: RunConfig) -> str:
    """The text of ``data.path`` (a file, or gensim's Lee corpus)."""
    from bitfault.data.text import lee_corpus, read_text

    try:
        return lee_corpus() if config.data.path == LEE else read_text(config.data.path)
    except ArgumentError as exc:
        raise ConfigError("data.path", config.data.path, exc.requirement) from None
    except UnicodeDecodeError as exc:
        raise ConfigError("data.path", config.data.path, f"a UTF-8 text file ({exc})") from None


def load_pairs(config: RunConfig) -> Any:
    """The ``bitfault.data.text.TextPairs`` of ``data.name`` or ``data.path`` (source pairs)."""
    from bitfault.data.text import text_pairs

    d = config.data
    key, value = ("data.name", d.name) if d.name is not None else ("data.path", d.path)
    try:
        return text_pairs(name=d.name, path=d.path)
    except ArgumentError as exc:
        raise ConfigError(key, value, exc.requirement) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(key, value, f"a UTF-8 pairs file ({exc})") from None


# model kinds whose file carries the tokenizer: the from_pretrained argument naming it
TOKENIZER_IN_FILE = {"gguf": "gguf_file"}


def load_tokenizer(config: RunConfig) -> Any:
    """The tokenizer of ``data.tokenizer``, else the model's own (local files only)."""
    from transformers import AutoTokenizer

    m, where = config.model, config.data.tokenizer
    kwargs: dict[str, Any] = {"local_files_only": True}
    in_file = TOKENIZER_IN_FILE.get(m.kind or "")
    if where is None and in_file is not None:
        where, kwargs[in_file] = os.path.split(os.path.abspath(m.path))
    where = where or m.path
    try:
        return AutoTokenizer.from_pretrained(where, **kwargs)
    except Exception as exc:
        key = "data.tokenizer" if config.data.tokenizer is not None else "model.path"
        raise ConfigError(key, config.data.tokenizer or m.path, "a tokenizer transformers "
                          f"loads offline; name one with data.tokenizer ({type(exc).__name__}: "
                          f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})"
                          ) from None


def _padded(config: RunConfig, tokenizer: Any, texts: list[str]) -> dict[str, Any]:
    if tokenizer.pad_token is None:
        raise ConfigError("data.tokenizer", config.data.tokenizer, "a tokenizer with a "
                          f"padding token (metric {config.metric} pads texts to one length)")
    return dict(tokenizer(texts, padding=True, truncation=True,
                          max_length=config.data.context, return_tensors="pt"))


def make_inputs(config: RunConfig, tokenizer: Any, pairs: Any = None) -> tuple[Any, Any]:
    """(inputs, labels): token windows and their next tokens for a language model; padded
    sentences (a dict of tensors) and no labels for embeddings; for similarity every text
    of ``pairs`` (default: ``load_pairs(config)``), padded."""
    import torch

    from bitfault.data.text import token_windows
    from bitfault.torch.hf import next_token_labels

    if config.metric == "similarity":
        pairs = load_pairs(config) if pairs is None else pairs
        return _padded(config, tokenizer, list(pairs.texts)), None
    d, text = config.data, read_corpus(config)
    if config.metric == "cosine":
        lines = [s.strip() for s in text.splitlines() if s.strip()]
        if len(lines) < d.windows:
            raise ConfigError("data.windows", d.windows, f"at most {len(lines)}: the text has "
                              f"{len(lines)} non-empty lines (sentences)")
        return _padded(config, tokenizer, lines[:d.windows]), None
    try:
        ids = token_windows(text, tokenizer, d.context, d.windows)
    except ArgumentError as exc:
        raise ConfigError("data.context", d.context, f"a context the text fits {d.windows} "
                          f"times (data.windows): {exc.requirement}") from None
    windows = torch.from_numpy(ids)
    return windows, next_token_labels(windows)


@dataclass
class Plan:
    """One recipe's campaign, checked: its memory, evaluator, trials and clean values."""

    recipe: Recipe
    memory: Memory
    evaluator: Any
    trials: list[Any]


def _targets_error(config: RunConfig, exc: Exception) -> ConfigError:
    return ConfigError("campaign.targets", targets_value(config.campaign.targets),
                       f"targets choosing tensors of the model ({exc})")


def plan_pretrained(config: RunConfig) -> list[Plan]:
    """Load the model and data once; one checked plan per recipe (nothing written)."""
    from bitfault.jobs.summary import build_trials

    config = with_local_paths(config)
    check_paths(config)
    pairs = load_pairs(config) if config.metric == "similarity" else None
    tokenizer = load_tokenizer(config)
    inputs, labels = make_inputs(config, tokenizer, pairs)
    if config.model.kind in PLAN_ONE:  # one file, its own formats: one plan
        return [PLAN_ONE[config.model.kind](config, config.recipes[0], inputs, labels)]
    c = config.campaign
    model = _load_hf(config)
    _check_context(config, model, inputs)
    plans = []
    for i, recipe in enumerate(config.recipes):
        try:
            memory = Memory(recipe.format, c.fault, c.plane_rates)
        except (ValueError, TypeError) as exc:
            key = "campaign.plane_rates" if c.plane_rates else "campaign.fault"
            raise ConfigError(key, dict(c.plane_rates or {}) or c.fault.to_dict(),
                              f"one that fits recipes[{i}]'s format {recipe.format} "
                              f"({exc})") from None
        ev = _hf_evaluator(config, model, inputs, labels, pairs)
        plans.append(Plan(recipe, memory, ev, build_trials(c, memory, ev.tensor_shapes())))
    return plans


def _check_context(config: RunConfig, model: Any, inputs: Any) -> None:
    """Refuse inputs longer than the model has positions for (a named error, not torch's)."""
    most = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    ids = inputs["input_ids"] if isinstance(inputs, dict) else inputs
    if isinstance(most, int) and ids.shape[-1] > most:
        raise ConfigError("data.context", config.data.context, f"at most {most} (the "
                          f"model's max_position_embeddings): its texts run to "
                          f"{ids.shape[-1]} tokens")


def _load_hf(config: RunConfig) -> Any:
    from transformers import AutoModel, AutoModelForCausalLM

    auto = AutoModelForCausalLM if config.metric in CAUSAL_METRICS else AutoModel
    try:
        return auto.from_pretrained(config.model.path, local_files_only=True).eval()
    except (OSError, ValueError) as exc:
        raise ConfigError("model.path", config.model.path, f"a model {auto.__name__} loads "
                          f"offline ({str(exc).strip().splitlines()[0]})") from None


def _hf_evaluator(config: RunConfig, model: Any, inputs: Any, labels: Any,
                  pairs: Any = None) -> Any:
    from bitfault.campaign.similarity import SimilarityMetric
    from bitfault.torch import OutputEvaluator
    from bitfault.torch.hf import mean_pooled

    kind, _, _ = METRICS[config.metric]
    cosine = config.metric not in CAUSAL_METRICS  # embeddings: mean-pooled
    metric = SimilarityMetric.of(pairs) if config.metric == "similarity" else kind
    try:
        return OutputEvaluator(model, inputs, metric, labels=labels,
                               targets=config.campaign.targets, batch_size=32 if cosine else 4,
                               output_fn=mean_pooled if cosine else None)
    except ArgumentError as exc:
        if exc.argument in ("metric", "labels"):
            raise ConfigError("metric", config.metric, exc.requirement) from None
        raise _targets_error(config, exc) from None
    except ValueError as exc:
        raise _targets_error(config, exc) from None


def _plan_gguf(config: RunConfig, recipe: Recipe, windows: Any, labels: Any) -> Plan:
    from bitfault.jobs.summary import build_trials
    from bitfault.torch.gguf import load_gguf_model
    from bitfault.torch.gguf.evaluate import GGUFEvaluator

    c = config.campaign
    try:
        gm = load_gguf_model(config.model.path)
    except ArgumentError as exc:
        raise ConfigError("model.path", config.model.path, exc.requirement) from None
    try:
        ev = GGUFEvaluator(gm, windows, labels, targets=c.targets, batch_size=4)
    except ArgumentError as exc:
        if exc.argument in ("metric", "labels"):
            raise ConfigError("metric", config.metric, exc.requirement) from None
        raise _targets_error(config, exc) from None
    try:
        memory = ev.with_memory(c.fault, c.plane_rates)
    except (ValueError, TypeError) as exc:
        raise ConfigError("campaign.plane_rates", dict(c.plane_rates or {}), "relative rates "
                          f"of the GGUF planes codes, scale, min ({exc})") from None
    return Plan(recipe, memory, ev, build_trials(c, memory, ev.tensor_shapes()))


# model kinds planned as one file in the formats it stores (not one plan per recipe)
PLAN_ONE = {"gguf": _plan_gguf}


__all__ = ["METRICS", "Plan", "check_paths", "curves", "headline", "load_pairs",
           "load_tokenizer", "make_inputs", "plan_pretrained", "read_corpus"]
