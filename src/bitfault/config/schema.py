"""The frozen sections of a run config (what ``load_config`` returns) and ConfigError."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bitfault.faults.models import BitFlip, FaultModel
from bitfault.recipes import Recipe
from bitfault.targets import Targets

FRAMEWORKS = ("torch", "keras")
SOURCES = ("embedded", "idx", "npz", "fashion-mnist", "text", "pairs")
PRETRAINED_KINDS = ("hf", "gguf")  # model.kind: a pretrained model bitfault does not train
PRETRAINED_METRICS = ("perplexity", "agreement", "cosine", "similarity")  # top-level ``metric``
TEXT_KEYS = ("context", "windows", "tokenizer")  # data keys of source "text" only
BUILTIN_MODELS = {"seed_mlp": ("hidden", "seed"), "small_cnn": ("channels", "seed", "norm")}


SHOWN_CHARS = 200  # a value in an error message is cut to this many characters


def short_repr(value: Any, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)``, cut to ``limit`` characters with "..." (an error message stays one
    readable line whatever the value holds; a huge container is not rendered whole)."""
    if _items(value, 4 * limit) <= 4 * limit:
        text = repr(value)
    else:
        import reprlib

        r = reprlib.Repr()
        r.maxstring = r.maxother = r.maxlong = limit
        text = r.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _items(value: Any, budget: int) -> int:
    """Values and characters in ``value``, counted until they pass ``budget``."""
    seen, stack = 0, [value]
    while stack and seen <= budget:
        v = stack.pop()
        seen += len(v) if isinstance(v, (str, bytes)) else 1
        if isinstance(v, Mapping):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
    return seen


class ConfigError(ValueError):
    """A config mistake; the message names the dotted key, the value (cut to
    ``SHOWN_CHARS`` characters) and what is allowed."""

    def __init__(self, key: str, value: Any = None, allowed: str = "", *,
                 unknown: bool = False) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        got = "unknown" if unknown else f"got {short_repr(value)}"
        super().__init__(f"config key {key!r}: {got}; allowed: {allowed}")



def targets_value(targets: str | tuple[str, ...] | Targets) -> Any:
    """``campaign.targets`` as the config file writes it (JSON-ready)."""
    if isinstance(targets, Targets):
        return targets.to_dict()
    return targets if isinstance(targets, str) else list(targets)


def memory_value(memory: Mapping[str, Any] | tuple[Mapping[str, Any], ...] | None) -> Any:
    """``campaign.memory`` as the config file writes it: null, a mapping or a list."""
    if memory is None:
        return None
    return dict(memory) if isinstance(memory, Mapping) else [dict(m) for m in memory]


@dataclass(frozen=True)
class DataConfig:
    """Where the digits come from; ``*_limit`` keeps the first N examples of a split.

    ``source: text`` (pretrained models): ``path`` a text file or ``lee`` (gensim's Lee
    corpus), cut into ``windows`` rows of ``context`` tokens (an embedding metric: the
    first ``windows`` lines, truncated to ``context`` tokens) by ``tokenizer`` (a tokenizer
    directory; default: the model's own). ``source: pairs`` (metric similarity): ``name``
    a pair set of gensim's test data (lee, wordsim353, simlex999) or ``path`` a
    tab-separated file of text_a, text_b, score; each text at most ``context`` tokens."""

    source: str = "embedded"
    path: str | None = None
    train_limit: int | None = None
    test_limit: int | None = None
    context: int | None = None
    windows: int | None = None
    tokenizer: str | None = None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        drop = {"text": ("train_limit", "test_limit", "name"),
                "pairs": ("train_limit", "test_limit", "windows")}.get(
                    self.source, (*TEXT_KEYS, "name"))
        return {k: v for k, v in d.items() if k not in drop}


@dataclass(frozen=True)
class ModelConfig:
    """A built-in model (``seed_mlp``, ``small_cnn``) or ``"package.module:callable"``;
    or, with ``kind`` "hf" (a Hugging Face model directory) or "gguf" (a GGUF file), the
    pretrained model at ``path``, measured as it is (never trained)."""

    name: str = "seed_mlp"
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    kind: str | None = None
    path: str | None = None

    @property
    def builtin(self) -> bool:
        """Whether ``name`` is one of bitfault's models (not a user's callable)."""
        return self.kind is None and self.name in BUILTIN_MODELS

    @property
    def pretrained(self) -> bool:
        """Whether this is a pretrained model (``kind`` hf or gguf): no training."""
        return self.kind in PRETRAINED_KINDS

    def to_dict(self) -> dict[str, Any]:
        if self.pretrained:
            return {"kind": self.kind, "path": self.path}
        return {"name": self.name, "kwargs": dict(self.kwargs)}


@dataclass(frozen=True)
class TrainConfig:
    """The optimiser settings every recipe of a run trains with."""

    epochs: int = 10
    batch_size: int = 100
    lr: float = 0.05
    optimizer: str = "sgd"
    weight_decay: float = 0.0


@dataclass(frozen=True)
class CampaignConfig:
    """A rate sweep per model (``chips`` simulated chips per rate, chip c has seed
    ``seed + c``), plus per-tensor (``layers``) and per-bit (``bits``) sweeps at
    ``sensitivity_bers`` with ``sensitivity_chips`` chips (default: ``bers``,
    ``chips``) when enabled, and statistical single-fault injection when
    ``single_faults`` is a margin: single bit faults sampled (Leveugle et al.) until
    the share of faults that turn a correct prediction wrong is known to within that
    margin at ``single_fault_confidence``. ``plane_rates``: for block formats, each plane's
    rate relative to the trial's (``bitfault.Memory.plane_rates``). ``memory``: how the
    weights sit in physical memory (``bitfault.memory.storage.Storage.from_dict``: word_bits,
    row_words, protection, pattern); trials then record the decoder's outcomes. A list of
    named memories (``{name, **storage}`` each) compares them in one campaign: every
    scheme its own store, the same chips."""

    bers: tuple[float, ...] = (1e-4, 1e-3, 1e-2)
    chips: int = 10
    seed: int = 1000
    fault: FaultModel = field(default_factory=BitFlip)
    targets: str | tuple[str, ...] | Targets = "weights"
    layers: bool = False
    bits: bool = False
    sensitivity_bers: tuple[float, ...] | None = None
    sensitivity_chips: int | None = None
    batch: int | None = None
    single_faults: float | None = None
    single_fault_confidence: float = 0.95
    plane_rates: Mapping[str, float] | None = None
    memory: Mapping[str, Any] | tuple[Mapping[str, Any], ...] | None = None

    @property
    def schemes(self) -> tuple[tuple[str, dict[str, Any]], ...]:
        """The named memories compared (name, storage dict); empty unless ``memory`` is a
        list."""
        if self.memory is None or isinstance(self.memory, Mapping):
            return ()
        return tuple((str(m["name"]), {k: v for k, v in m.items() if k != "name"})
                     for m in self.memory)

    @property
    def sweep_bers(self) -> tuple[float, ...]:
        """The rates of the layer and bit sweeps."""
        return self.sensitivity_bers if self.sensitivity_bers is not None else self.bers

    @property
    def sweep_chips(self) -> int:
        """The chips per rate of the layer and bit sweeps."""
        return self.sensitivity_chips if self.sensitivity_chips is not None else self.chips


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs; ``to_dict()`` round-trips through ``load_config``."""

    framework: str = "torch"
    seed: int = 0
    output: str = "runs/example"
    title: str = "bitfault report"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    recipes: tuple[Recipe, ...] = field(default_factory=lambda: (Recipe(name="normal"),))
    campaign: CampaignConfig = field(default_factory=CampaignConfig)
    metric: str | None = None  # pretrained models: one of PRETRAINED_METRICS

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def recipe(self, name: str) -> Recipe:
        for r in self.recipes:
            if r.name == name:
                return r
        raise KeyError(f"no recipe named {name!r}; have {[r.name for r in self.recipes]}")

    def to_dict(self) -> dict[str, Any]:
        c = self.campaign
        return {
            "framework": self.framework, "seed": self.seed, "output": self.output,
            "title": self.title,
            **({"metric": self.metric} if self.metric is not None else {}),
            "data": self.data.to_dict(),
            "model": self.model.to_dict(),
            "train": dataclasses.asdict(self.train),
            "recipes": [r.to_dict() for r in self.recipes],
            "campaign": {"bers": list(c.bers), "chips": c.chips, "seed": c.seed,
                         "fault": c.fault.to_dict(),
                         "targets": targets_value(c.targets),
                         "layers": c.layers, "bits": c.bits,
                         "sensitivity_bers": None if c.sensitivity_bers is None
                         else list(c.sensitivity_bers),
                         "sensitivity_chips": c.sensitivity_chips, "batch": c.batch,
                         "single_faults": c.single_faults,
                         "single_fault_confidence": c.single_fault_confidence,
                         "plane_rates": None if c.plane_rates is None
                         else dict(c.plane_rates),
                         "memory": memory_value(c.memory)},
        }



__all__ = ["BUILTIN_MODELS", "FRAMEWORKS", "PRETRAINED_KINDS", "PRETRAINED_METRICS",
           "SHOWN_CHARS", "SOURCES", "TEXT_KEYS", "CampaignConfig", "ConfigError",
           "DataConfig", "ModelConfig", "RunConfig", "TrainConfig", "memory_value",
           "short_repr", "targets_value"]
