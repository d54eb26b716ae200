"""reactantserver.floatmath: accurate to a few ulps, and the same bits everywhere."""

from __future__ import annotations

import math
import random
from decimal import Decimal, localcontext

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reactantserver import floatmath


def _ulps(got: float, want: float) -> float:
    return abs(got - want) / math.ulp(want)


def _reference(function: str, x: float) -> float:
    with localcontext() as ctx:
        ctx.prec = 60
        d = Decimal(x)
        value = {
            "exp2": lambda: Decimal(2) ** d,
            "exp": d.exp,
            "log": d.ln,
        }[function]()
        return float(value)


@given(st.floats(min_value=-1022.0, max_value=1023.0))
def test_exp2_is_within_two_ulps(x: float) -> None:
    """For every x whose 2**x is a normal float, exp2(x) is within 2 ulps of the
    60-digit decimal value."""
    assert _ulps(floatmath.exp2(x), _reference("exp2", x)) <= 2


@given(st.floats(min_value=-708.0, max_value=709.0))
def test_exp_is_within_two_ulps(x: float) -> None:
    """For every x whose e**x is a normal float, exp(x) is within 2 ulps of the decimal
    value."""
    assert _ulps(floatmath.exp(x), _reference("exp", x)) <= 2


@given(st.floats(min_value=1e-300, max_value=1e300).filter(lambda x: x != 1.0))
def test_log_is_within_two_ulps(x: float) -> None:
    """For every positive normal x but 1, log(x) is within 2 ulps of the decimal value."""
    assert _ulps(floatmath.log(x), _reference("log", x)) <= 2


def test_exact_where_the_answer_is_exact() -> None:
    for k in range(-1074, 1024):
        assert floatmath.exp2(float(k)) == math.ldexp(1.0, k)
    assert floatmath.exp(0.0) == 1.0
    assert floatmath.log(1.0) == 0.0
    assert floatmath.pow(7.0, 0.0) == floatmath.pow(1.0, 3.5) == 1.0


def test_the_edges() -> None:
    assert floatmath.exp2(1024.0) == floatmath.exp(710.0) == math.inf
    assert floatmath.exp2(-2000.0) == floatmath.exp(-800.0) == 0.0
    assert math.isnan(floatmath.exp2(math.nan)) and math.isnan(floatmath.log(math.nan))
    assert floatmath.log(math.inf) == math.inf
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="domain"):
            floatmath.log(bad)


def test_the_same_bits_as_on_the_machine_that_wrote_this() -> None:
    """Pinned results: only IEEE-754 basic operations make them, so any machine that
    computes another bit here has broken the promise (and the docs' tables with it)."""
    assert floatmath.exp2(-0.3).hex() == "0x1.9fdf8bcce533ep-1"
    assert floatmath.exp(-2.5).hex() == "0x1.50385c094f425p-4"
    assert floatmath.log(3.0).hex() == "0x1.193ea7aad030bp+0"
    assert floatmath.pow(7.0, -0.77).hex() == "0x1.c9b98dbaca4dbp-3"
    # random.expovariate's draw, with floatmath's logarithm.
    rng = random.Random(1)
    assert floatmath.expovariate(rng.random(), 2.0).hex() == "0x1.278212cba49f1p-4"


@given(st.floats(min_value=-1080.0, max_value=1023.99, allow_nan=False))
def test_exp2_written_out_is_horners_rule_bit_for_bit(x: float) -> None:
    """``exp2``'s polynomial is ``_poly(_EXP2, f)`` written out for speed: for every
    argument it gives the very same float as the loop (same operations, same order)."""
    k = round(x)
    loop = math.ldexp(floatmath._poly(floatmath._EXP2, x - k), k)
    assert floatmath.exp2(x).hex() == loop.hex()
