"""Argument errors and the checks the core shares.

Every bad argument is reported the same way: "<argument> must be <allowed>, got
<value>". The errors keep those three parts as attributes, so a caller (the config
validator, the CLI) can tell which argument failed without parsing the message.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ArgumentError(ValueError):
    """An argument with a bad value: "<argument> must be <allowed>, got <value!r>".

    ``argument`` names it (``"ber"``, ``"ber[3]"``), ``value`` is what was given and
    ``allowed`` what may be given, as the words after "must be" (``"in [0, 1]"``).
    """

    def __init__(self, argument: str, value: Any, allowed: str) -> None:
        self.argument, self.value, self.allowed = argument, value, allowed
        super().__init__(f"{argument} must be {allowed}, got {value!r}")


class ArgumentTypeError(TypeError):
    """An argument of the wrong type; the same message and attributes as ArgumentError."""

    def __init__(self, argument: str, value: Any, allowed: str) -> None:
        self.argument, self.value, self.allowed = argument, value, allowed
        super().__init__(f"{argument} must be {allowed}, got {value!r}")


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


__all__ = ["ArgumentError", "ArgumentTypeError", "check_choice", "check_rate", "check_seed"]
