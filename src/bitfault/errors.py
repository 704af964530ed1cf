"""Argument errors and the checks the core shares.

Every bad argument is reported the same way: "<argument> must be <allowed>, got
<value>". The errors keep those parts as attributes, so a caller (the config
validator, the CLI) can tell which argument failed without parsing the message.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np


class _Argument(Exception):
    """What ArgumentError and ArgumentTypeError share: the parts and the message."""

    def __init__(self, argument: str, value: Any, allowed: str, *,
                 requirement: str | None = None, tail: str | None = None) -> None:
        self.argument, self.value, self.allowed = argument, value, allowed
        self.requirement = requirement or f"{argument} must be {allowed}"
        if tail is None:
            tail = "" if requirement else f", got {value!r}"
        super().__init__(self.requirement + tail)


class ArgumentError(_Argument, ValueError):
    """An argument with a bad value: "<argument> must be <allowed>, got <value!r>".

    ``argument`` names it (``"ber"``, ``"ber[3]"``), ``value`` is what was given and
    ``allowed`` what may be given, as the words after "must be" (``"in [0, 1]"``).
    ``requirement`` is the message without the value ("ber must be in [0, 1]"); a rule
    that relates arguments states its own (``requirement="randbet needs a format"``),
    and then that sentence is the whole message. ``tail`` replaces how the message ends
    after the requirement (``"; got none"``, ``", got dtype int32"``).
    """


class ArgumentTypeError(_Argument, TypeError):
    """An argument of the wrong type; the same message and attributes as ArgumentError."""


def check_seed(seed: Any) -> int:
    """``seed`` as an int if it is a non-negative integer (not a bool); else ArgumentError."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ArgumentError("seed", seed, "a non-negative integer")
    return int(seed)


def check_rate(p: Any, argument: str) -> float:
    """``p`` as a float in [0, 1]: ArgumentTypeError if it is no number, ArgumentError if
    it lies outside."""
    try:
        value = float(p)
    except (TypeError, ValueError):
        raise ArgumentTypeError(argument, p, "a number in [0, 1]") from None
    if not 0.0 <= value <= 1.0:
        raise ArgumentError(argument, p, "in [0, 1]")
    return value


def check_choice(value: Any, allowed: tuple[str, ...], argument: str) -> str:
    """``value`` if it is one of ``allowed``; else ArgumentError."""
    if value not in allowed:
        raise ArgumentError(argument, value, f"one of {allowed}")
    return value


def check_positive(value: Any, argument: str) -> float:
    """``value`` as a float if it is a positive finite real number (not a bool):
    ArgumentTypeError if it is no real number, ArgumentError if it is not positive and
    finite."""
    allowed = "a positive finite number"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(argument, value, allowed)
    v = float(value)
    if not (v > 0 and math.isfinite(v)):
        raise ArgumentError(argument, value, allowed)
    return v


def check_int(value: Any, argument: str, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an int if it is an integer (not a bool) in ``minimum..maximum``
    (no upper bound when ``maximum`` is None); else ArgumentError."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum
            or (maximum is not None and value > maximum)):
        allowed = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        if maximum is not None:
            allowed += f" and <= {maximum}"
        raise ArgumentError(argument, value, allowed)
    return int(value)


__all__ = ["ArgumentError", "ArgumentTypeError", "check_choice", "check_int", "check_positive",
           "check_rate", "check_seed"]
