"""The command line's argument types and its one-line error form (``bitfault.cli``)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def one_line(exc: BaseException) -> str:
    """An error as one line: its message with the whitespace folded (its type for others)."""
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    text = " ".join(str(text).split()) or type(exc).__name__
    if not isinstance(exc, (ValueError, TypeError, OSError, KeyError, ImportError)):
        text = f"{type(exc).__name__}: {text}"
    return text



def shape_arg(text: str) -> tuple[int, ...]:
    """``256,784`` (or ``256x784``) as a shape."""
    parts = text.replace("x", ",").split(",")
    if not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape: give non-negative "
                                         "integers separated by commas, e.g. 256,784")
    return tuple(int(p) for p in parts)


def format_arg(text: str) -> Any:
    """A format from its JSON ``to_dict()`` form."""
    from bitfault.formats import format_from_dict

    try:
        return format_from_dict(json.loads(text))
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): give a format dict, e.g. "
                                         '\'{"kind": "int_quant", "bits": 8}\'') from None
    except (TypeError, ValueError, KeyError) as exc:
        raise argparse.ArgumentTypeError(one_line(exc)) from None


def rate_arg(text: str) -> float | dict[str, float]:
    """A rate, or rates by plane / field: ``1e-3`` or ``codes=1e-3,scale=1e-5``."""
    if "=" not in text:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give a rate, e.g. 1e-3, or rates by "
                                             "plane, e.g. codes=1e-3,scale=1e-5") from None
    rates: dict[str, float] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        try:
            rates[key.strip()] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: give plane=rate, e.g. "
                                             "scale=1e-5") from None
    return rates


def bits_arg(text: str) -> list[int | str]:
    """``msb`` / ``0,1,7`` / ``scale.exponent`` as a bit selection."""
    bits = [b.strip() for b in text.split(",")]
    if not all(bits):
        raise argparse.ArgumentTypeError(f"{text!r}: give bit positions or field names "
                                         'separated by commas, e.g. "msb" or 0,1,7')
    return [int(b) if b.isdigit() else b for b in bits]


__all__ = ["bits_arg", "format_arg", "one_line", "rate_arg", "shape_arg"]
