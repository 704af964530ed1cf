"""Training recipes for bit-error robustness, framework-free.

A :class:`Recipe` says how a network is trained so that its stored weights survive
bit errors (Stutz et al., "Bit Error Robustness for Energy-Efficient DNN
Accelerators", MLSys 2021):

* ``format``: weights are trained through this storage format (quantisation-aware,
  straight-through gradient); ``None`` trains plain float weights;
* ``weight_clip``: after every optimizer step each weight is projected to
  ``[-w_max, w_max]``;
* ``randbet``: random bit error training; each step's loss is the loss on the clean
  stored weights plus the loss on weights with a fresh random bit error pattern at
  rate ``p_train`` (see :class:`RandBET`);
* ``fault_aware``: plain fault-aware training through a :class:`FaultSpec` (the seed
  program's fix): the forward pass uses the spec's faulty weights every step;
* ``activation_clip``: ReLUs bounded at a threshold, a float or ``"calibrate"`` (the
  ``activation_quantile`` of each ReLU's output on training data).

The adapters (``bitfault.torch.train``, ``bitfault.keras.train``) carry a recipe
out; this module only describes and validates it, and round-trips it through dicts
so a config file, PyTorch and Keras all read the same thing.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bitfault.errors import (
    ArgumentError,
    ArgumentTypeError,
    check_choice,
    check_int,
    check_positive,
    check_seed,
)
from bitfault.faults.models import BitFlip, FaultModel, fault_from_dict
from bitfault.formats import Format, IntQuant, format_from_dict
from bitfault.spec import FaultSpec


def _optional_positive(value: Any, argument: str) -> float | None:
    return None if value is None else check_positive(value, argument)


OPTIMIZERS = ("sgd", "adam")
CALIBRATION_SAMPLES = 1000  # activation_clip="calibrate" looks at this many training samples


def check_fit_settings(epochs: Any, batch_size: Any, lr: Any, optimizer: Any,
                       weight_decay: Any, seed: Any, progress: Any
                       ) -> tuple[int, int, float, float, int]:
    """The settings both adapters' ``fit`` share, checked: (epochs, batch_size, lr,
    weight_decay, seed). Errors name the argument and what is allowed."""
    epochs = check_int(epochs, "epochs", 1)
    batch_size = check_int(batch_size, "batch_size", 1)
    for value, name in ((lr, "lr"), (weight_decay, "weight_decay")):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                or not math.isfinite(value) or value < 0 or (name == "lr" and value == 0):
            sign = "positive" if name == "lr" else "non-negative"
            raise ArgumentError(name, value, f"a {sign} finite number")
    check_choice(optimizer, OPTIMIZERS, "optimizer")
    seed = check_seed(seed)
    if progress is not None and not callable(progress):
        raise ArgumentTypeError("progress", progress, "a callable (epoch, epochs) or None")
    return epochs, batch_size, float(lr), float(weight_decay), seed


def _unknown_keys(data: Mapping[str, Any], allowed: set[str], what: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} for {what}; allowed: {sorted(allowed)}")


@dataclass(frozen=True)
class RandBET:
    """Random bit error training.

    p_train: bit error rate of the perturbed term, in (0, 1).
    seed: seed of the per-step patterns; step ``t`` uses ``FaultMap.random(...,
        seed=seed, name=tensor, step=t)``, so a run replays exactly.
    grad_clamp: if set, each element of the perturbed term's gradient is clamped to
        ``[-grad_clamp, grad_clamp]`` before it is added to the clean term's.
    start_below: if set, the perturbed term is off until the clean loss (of a step)
        first falls below this value; from then on it stays on.
    fault: the fault model of the perturbed term (bit flips by default).
    """

    p_train: float = 0.1
    seed: int = 0
    grad_clamp: float | None = None
    start_below: float | None = None
    fault: FaultModel = field(default_factory=BitFlip)

    def __post_init__(self) -> None:
        p = self.p_train
        if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
            raise ArgumentTypeError("p_train", p, "a number in (0, 1)")
        if not 0.0 < float(p) < 1.0:
            raise ArgumentError("p_train", p, "in (0, 1)")
        object.__setattr__(self, "p_train", float(p))
        object.__setattr__(self, "seed", check_seed(self.seed))
        object.__setattr__(self, "grad_clamp",
                           _optional_positive(self.grad_clamp, "grad_clamp"))
        object.__setattr__(self, "start_below",
                           _optional_positive(self.start_below, "start_below"))
        if isinstance(self.fault, Mapping):
            object.__setattr__(self, "fault", fault_from_dict(dict(self.fault)))
        if not isinstance(self.fault, FaultModel):
            raise ArgumentTypeError("fault", self.fault, "BitFlip() or StuckAt(0|1)")

    def spec(self, format: Format) -> FaultSpec:
        """The fault spec of the perturbed term (transient: ``spec.map_for(name, shape,
        step=t)`` is step t's map)."""
        return FaultSpec(format=format, fault=self.fault, ber=self.p_train, seed=self.seed,
                         persistence="transient", resample="step")

    def to_dict(self) -> dict[str, Any]:
        return {"p_train": self.p_train, "seed": self.seed, "grad_clamp": self.grad_clamp,
                "start_below": self.start_below, "fault": self.fault.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RandBET:
        _unknown_keys(data, {f.name for f in dataclasses.fields(cls)}, "randbet")
        return cls(**dict(data))


@dataclass(frozen=True)
class Recipe:
    """How to train for bit-error robustness; see the module docstring."""

    name: str = "normal"
    format: Format | None = field(default_factory=lambda: IntQuant(8))
    weight_clip: float | None = None
    randbet: RandBET | None = None
    fault_aware: FaultSpec | None = None
    activation_clip: float | str | None = None
    activation_quantile: float = 0.999

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ArgumentError("name", self.name, "a non-empty string")
        if isinstance(self.format, Mapping):
            object.__setattr__(self, "format", format_from_dict(dict(self.format)))
        if self.format is not None and not isinstance(self.format, Format):
            raise ArgumentTypeError("format", self.format, "FixedPoint, IntQuant, Float or None")
        object.__setattr__(self, "weight_clip",
                           _optional_positive(self.weight_clip, "weight_clip"))
        if isinstance(self.randbet, Mapping):
            object.__setattr__(self, "randbet", RandBET.from_dict(self.randbet))
        if self.randbet is not None and not isinstance(self.randbet, RandBET):
            raise ArgumentTypeError("randbet", self.randbet, "a RandBET or None")
        if self.randbet is not None and self.format is None:
            raise ArgumentError("randbet", self.randbet, "None when format is None",
                                requirement="randbet needs a format: bit errors hit stored "
                                            "words")
        if self.randbet is not None:
            try:  # the fault model's bit positions must exist in the format
                self.randbet.spec(self.format)
            except ValueError as exc:
                raise ArgumentError("randbet.fault", self.randbet.fault,
                                    f"a fault model whose bits {self.format} stores",
                                    requirement=f"randbet.fault does not fit format "
                                                f"{self.format}: {exc}") from exc
        if isinstance(self.fault_aware, Mapping):
            object.__setattr__(self, "fault_aware", FaultSpec.from_dict(self.fault_aware))
        if self.fault_aware is not None and not isinstance(self.fault_aware, FaultSpec):
            raise ArgumentTypeError("fault_aware", self.fault_aware, "a FaultSpec or None")
        if self.fault_aware is not None and self.fault_aware.memory.data_dependent:
            raise ArgumentError("fault_aware.storage", self.fault_aware.storage.to_dict(),
                                "a storage whose faults ignore the stored data (policy "
                                "'flag', a pattern other than 'asymmetric')",
                                requirement="fault_aware: a memory with policy 'zero' or "
                                            "asymmetric cells reads back what depends on the "
                                            "stored values, and training changes them every "
                                            "step; train through policy 'flag' (the decoded "
                                            "error then holds for any weights) and evaluate "
                                            "the data-dependent memory in a campaign")
        if self.fault_aware is not None and self.randbet is not None:
            raise ArgumentError("fault_aware", self.fault_aware, "None when randbet is given",
                                requirement="give at most one of randbet= and fault_aware=: "
                                            "both replace the forward pass's weights")
        if self.fault_aware is not None and self.format is not None \
                and self.fault_aware.format != self.format:
            raise ArgumentError("fault_aware.format", self.fault_aware.format,
                                f"format ({self.format})",
                                requirement=f"fault_aware.format ({self.fault_aware.format}) "
                                            f"must equal format ({self.format}); set "
                                            f"format=None to use the spec's")
        clip = self.activation_clip
        if isinstance(clip, str):
            if clip != "calibrate":
                raise ArgumentError("activation_clip", clip,
                                    "a positive number, 'calibrate' or None")
        else:
            object.__setattr__(self, "activation_clip",
                               _optional_positive(clip, "activation_clip"))
        q = self.activation_quantile
        if isinstance(q, bool) or not isinstance(q, (int, float, np.integer, np.floating)) \
                or not 0.0 < float(q) <= 1.0:
            raise ArgumentError("activation_quantile", q, "in (0, 1]")
        object.__setattr__(self, "activation_quantile", float(q))

    @property
    def stored_format(self) -> Format | None:
        """The format the weights are stored in: ``format``, else the fault-aware spec's."""
        if self.format is not None:
            return self.format
        return self.fault_aware.format if self.fault_aware is not None else None

    def replace(self, **changes: Any) -> Recipe:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "format": None if self.format is None else self.format.to_dict(),
            "weight_clip": self.weight_clip,
            "randbet": None if self.randbet is None else self.randbet.to_dict(),
            "fault_aware": None if self.fault_aware is None else self.fault_aware.to_dict(),
            "activation_clip": self.activation_clip,
            "activation_quantile": self.activation_quantile,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Recipe:
        if not isinstance(data, Mapping):
            raise TypeError(f"a recipe must be a mapping, got {type(data).__name__}")
        _unknown_keys(data, {f.name for f in dataclasses.fields(cls)}, "recipe")
        return cls(**dict(data))

    # ---- the published recipes -----------------------------------------------------------

    @classmethod
    def normal(cls, format: Format | None = None) -> Recipe:
        """Quantisation-aware training, no robustness measure (8-bit symmetric by default)."""
        return cls(name="normal", format=format or IntQuant(8))

    @classmethod
    def clipped(cls, w_max: float = 0.1, format: Format | None = None) -> Recipe:
        """Weight clipping to [-w_max, w_max]."""
        return cls(name=f"clip{w_max:g}", format=format or IntQuant(8), weight_clip=w_max)

    @classmethod
    def randbet_clipped(cls, w_max: float = 0.1, p_train: float = 0.1, seed: int = 0,
                        format: Format | None = None) -> Recipe:
        """Weight clipping plus random bit error training at ``p_train``."""
        return cls(name=f"clip{w_max:g}+randbet{p_train:g}", format=format or IntQuant(8),
                   weight_clip=w_max, randbet=RandBET(p_train=p_train, seed=seed))


@dataclass(frozen=True)
class EpochRecord:
    """One epoch of a training history (``perturbed_loss`` is NaN without RandBET)."""

    epoch: int
    loss: float
    clean_loss: float
    perturbed_loss: float
    train_accuracy: float
    val_accuracy: float
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_training_loss(clean: float, perturbed: float, epoch: int, step: int) -> None:
    """Raise FloatingPointError once a step's loss is NaN or infinite (NaN ``perturbed``
    means the perturbed term was off): the weights are lost from there on."""
    if math.isfinite(clean) and (math.isnan(perturbed) or math.isfinite(perturbed)):
        return
    raise FloatingPointError(
        f"training diverged at epoch {epoch}, step {step}: clean loss {clean}, perturbed loss "
        f"{perturbed}; lower lr, clip the weights (weight_clip) or start RandBET later "
        f"(randbet.start_below)")


def thresholds_from_activations(seen: Mapping[str, list[np.ndarray]], quantile: float,
                                what: str = "ReLU site(s)") -> dict[str, float]:
    """Each ReLU's threshold: the ``quantile`` of its recorded outputs (at least the smallest
    normal float32, so a dead ReLU still passes values). A ReLU never called is an error."""
    unused = sorted(n for n, v in seen.items() if not v)
    if unused:
        raise ValueError(f"{what} {unused} were not called by the forward pass")
    tiny = float(np.finfo(np.float32).tiny)
    return {n: max(float(np.quantile(np.concatenate(v), float(quantile))), tiny)
            for n, v in seen.items()}


def history_columns(history: list[EpochRecord]) -> dict[str, list[float]]:
    """A history as columns, the shape ``bitfault.report.plot_training`` reads."""
    keys = [f.name for f in dataclasses.fields(EpochRecord)]
    return {k: [getattr(r, k) for r in history] for k in keys}


__all__ = ["CALIBRATION_SAMPLES", "OPTIMIZERS", "EpochRecord", "RandBET", "Recipe",
           "check_fit_settings", "check_training_loss", "history_columns",
           "thresholds_from_activations"]
