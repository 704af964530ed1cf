"""``fixed_point_for``: the most fraction bits whose range holds the values (checked with
exact rationals), and its refusals."""

from fractions import Fraction

import numpy as np
import pytest

import bitfault as bf
from bitfault.formats.fit import fixed_point_for


def best_frac(values, bits, headroom=1):
    """Independent reference: the largest frac with every value's code in range, exactly."""
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    for frac in range(bits, -1, -1):
        if all(lo <= Fraction(float(v)) * headroom * 2**frac <= hi for v in values):
            return frac
    return None


@pytest.mark.parametrize("bits", [4, 8, 16, 32])
@pytest.mark.parametrize("scale", [1e-3, 0.5, 1.0, 7.0, 300.0])
def test_matches_an_exact_reference(bits, scale):
    rng = np.random.default_rng(bits)
    values = np.concatenate([rng.normal(0, scale, 50), [scale, -scale]])
    want = best_frac(values, bits)
    if want is None:
        with pytest.raises(bf.ArgumentError, match="use more bits"):
            fixed_point_for(values, bits)
        return
    fmt = fixed_point_for(values, bits, rounding="trunc")
    assert (fmt.bits, fmt.frac, fmt.rounding) == (bits, want, "trunc")
    assert np.array_equal(fmt.decode(fmt.encode(values)) >= fmt.range[0], np.ones(52, bool))


def test_edges_and_headroom():
    assert fixed_point_for([1.0], 8).frac == 6  # Q1.7 tops out at 127/128
    assert fixed_point_for([-1.0], 8).frac == 7  # but holds -1 exactly
    assert fixed_point_for([0.0], 8).frac == 8
    assert fixed_point_for([3.0], 16, headroom=2).frac == best_frac([3.0], 16, 2) == 12


def test_bad_input_is_refused():
    with pytest.raises(bf.ArgumentError, match="values"):
        fixed_point_for([np.nan], 8)
    with pytest.raises(bf.ArgumentError, match="headroom"):
        fixed_point_for([1.0], 8, headroom=0.5)
    with pytest.raises(bf.ArgumentError, match="bits"):
        fixed_point_for([1.0], 40)
    with pytest.raises(bf.ArgumentError, match="values"):
        fixed_point_for([], 8)
