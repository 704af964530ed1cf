"""bitfault.errors: the shared checks keep their messages and say what failed as data."""

import numpy as np
import pytest

import bitfault as bf
from bitfault.errors import ArgumentError, ArgumentTypeError, check_choice, check_rate, check_seed


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


def test_library_errors_are_argument_errors():
    with pytest.raises(ArgumentError) as info:
        bf.FaultSpec(ber=2.0)
    assert info.value.argument == "ber"
    assert bf.ArgumentError is ArgumentError
