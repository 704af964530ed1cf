"""bitfault.errors: the shared checks keep their messages and say what failed as data."""

import numpy as np
import pytest

import bitfault as bf
from bitfault.errors import (
    ArgumentError,
    ArgumentTypeError,
    check_choice,
    check_int,
    check_positive,
    check_rate,
    check_seed,
)


def test_check_seed_accepts_non_negative_integers():
    assert check_seed(0) == 0
    value = check_seed(np.int64(7))
    assert value == 7 and type(value) is int


@pytest.mark.parametrize("seed", [-1, True, 1.0, "1", None])
def test_check_seed_names_the_argument_and_what_is_allowed(seed):
    with pytest.raises(ArgumentError, match="seed must be a non-negative integer, got") as info:
        check_seed(seed)
    assert isinstance(info.value, ValueError)
    assert (info.value.argument, info.value.value, info.value.allowed) == (
        "seed", seed, "a non-negative integer")


def test_check_rate():
    assert check_rate(np.float32(0.5), "ber") == 0.5 and check_rate(1, "ber") == 1.0
    with pytest.raises(ArgumentError, match=r"ber\[3\] must be in \[0, 1\], got 1.5") as info:
        check_rate(1.5, "ber[3]")
    assert (info.value.argument, info.value.value) == ("ber[3]", 1.5)
    with pytest.raises(ArgumentTypeError, match=r"bers must be a number in \[0, 1\], got 'x'"):
        check_rate("x", "bers")
    with pytest.raises(TypeError):
        check_rate(None, "ber")


def test_check_choice():
    assert check_choice("ste", ("ste", "blocked"), "gradient") == "ste"
    with pytest.raises(ArgumentError, match=r"gradient must be one of \('ste', 'blocked'\), "
                                            "got 'x'") as info:
        check_choice("x", ("ste", "blocked"), "gradient")
    assert info.value.allowed == "one of ('ste', 'blocked')"


def test_check_positive():
    value = check_positive(np.float32(0.5), "w_max")
    assert value == 0.5 and type(value) is float
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ArgumentError, match="w_max must be a positive finite number, got"):
            check_positive(bad, "w_max")
    with pytest.raises(ArgumentTypeError, match="w_max must be a positive finite number, got "
                                                "True") as info:
        check_positive(True, "w_max")
    assert (info.value.argument, info.value.value) == ("w_max", True)


def test_check_int():
    value = check_int(np.int64(3), "epochs", 1)
    assert value == 3 and type(value) is int
    assert check_int(0, "step", 0) == 0 and check_int(5, "chips", 1, maximum=5) == 5
    with pytest.raises(ArgumentError, match="epochs must be a positive integer, got 0"):
        check_int(0, "epochs", 1)
    with pytest.raises(ArgumentError, match="step must be an integer >= 0, got True"):
        check_int(True, "step", 0)
    with pytest.raises(ArgumentError, match="chips must be a positive integer and <= 5, got 6"):
        check_int(6, "chips", 1, maximum=5)
    with pytest.raises(ArgumentError) as info:
        check_int(1.0, "seed", 0, maximum=9)
    assert info.value.allowed == "an integer >= 0 and <= 9"


def test_requirement_is_the_message_without_the_value():
    error = ArgumentError("ber", 2, "in [0, 1]")
    assert error.requirement == "ber must be in [0, 1]"
    related = ArgumentError("randbet", 1, "None without a format",
                            requirement="randbet needs a format")
    assert str(related) == related.requirement == "randbet needs a format"
    assert ArgumentTypeError("x", "a", "a number").requirement == "x must be a number"
    shown = ArgumentTypeError("x", np.dtype("int32"), "a float array", tail=", got dtype int32")
    assert str(shown) == "x must be a float array, got dtype int32"
    assert shown.requirement == "x must be a float array"
    missing = ArgumentError("kind", {}, "one of ('a',)", requirement="a dict needs a 'kind' key",
                            tail="; got {}")
    assert (str(missing), missing.requirement) == ("a dict needs a 'kind' key; got {}",
                                                   "a dict needs a 'kind' key")


def test_library_errors_are_argument_errors():
    with pytest.raises(ArgumentError) as info:
        bf.FaultSpec(ber=2.0)
    assert info.value.argument == "ber"
    assert bf.ArgumentError is ArgumentError
