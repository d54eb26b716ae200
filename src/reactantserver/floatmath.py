"""``exp2``, ``exp``, ``log`` and ``pow`` that give the same bits on every machine.

Why: the simulators promise that a seed gives the same table anywhere
(``examples/simulate.py``, ``examples/simulate_fleet.py``; docs/scheduling.md and
docs/fleet.md print their output, and ``tests/docs/test_docs_output.py`` checks it). The
scheduler's fair accounts decay with ``2 ** (-age / halflife)``, the gateway's estimates
smooth with ``1 - 2 ** (-delta / h)``, and the workload generators draw exponential
gaps and log-uniform costs. Computed by the platform, none of these is the same
everywhere:

* numpy picks an implementation of ``np.exp2`` by the CPU it finds at import: with
  AVX-512 (``X86_V4``) one of Intel's SVML kernels, without it another. They differ in
  the last bit for about one argument in ten, and one flipped comparison between two
  fair priorities changes every dispatch after it: docs/scheduling.md's fair table came
  out ``dispatches=16408`` on a machine without AVX-512 against the page's 16411
  (``NPY_DISABLE_CPU_FEATURES=X86_V4`` reproduces it on one that has it; issue 42).
* glibc's ``exp``, ``log`` and ``pow`` have FMA variants chosen the same way
  (``GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX2,-FMA`` changes their last bits here), and
  other C libraries (macOS, musl) are other code again.

What holds: these functions use only IEEE-754 addition, subtraction, multiplication and
division, ``frexp``/``ldexp`` and integer rounding, which every conforming machine does
exactly alike, in one fixed order (no FMA can be fused into Python's float arithmetic).
So each returns the same float for the same argument on any CPU, C library, Python and
numpy. They are accurate to a few units in the last place (``tests/scheduling/test_floatmath.py``
checks against 60-digit ``decimal`` references), not correctly rounded: determinism is
the point, not the last bit.

Cost: a pure-Python polynomial, about a microsecond a call against ~50 ns for
``math.exp2``. The scheduler calls ``exp2`` once per completed batch and once per fair
decision (the candidate table keeps its usages scaled to a common origin, so the
decision needs one scalar factor, not an array of them); the simulators' workload
generators call ``log`` once per arrival.
"""

from __future__ import annotations

import math

#: ``ln(2) ** j / j!`` for j = 0..13 (60-digit ``decimal``, rounded once to a float).
#: Degree 13 on ``|f| <= 0.5`` leaves a truncation error below 5e-18.
_EXP2 = (
    1.0,
    0.6931471805599453,
    0.24022650695910072,
    0.05550410866482158,
    0.009618129107628477,
    0.0013333558146428443,
    0.0001540353039338161,
    1.5252733804059841e-05,
    1.321548679014431e-06,
    1.01780860092397e-07,
    7.054911620801123e-09,
    4.4455382718708116e-10,
    2.5678435993488206e-11,
    1.3691488853904128e-12,
)
#: ``1 / j!`` for j = 0..13: ``e ** r`` on ``|r| <= ln(2) / 2``, truncation below 5e-18.
_EXP = (
    1.0,
    1.0,
    0.5,
    0.16666666666666666,
    0.041666666666666664,
    0.008333333333333333,
    0.001388888888888889,
    0.0001984126984126984,
    2.48015873015873e-05,
    2.7557319223985893e-06,
    2.755731922398589e-07,
    2.505210838544172e-08,
    2.08767569878681e-09,
    1.6059043836821613e-10,
)
#: ``1 / (2k + 1)`` for k = 0..11: ``atanh`` series, ``|s| <= 0.1716``, truncation < 2e-17.
_LOG = (
    1.0,
    0.3333333333333333,
    0.2,
    0.14285714285714285,
    0.1111111111111111,
    0.09090909090909091,
    0.07692307692307693,
    0.06666666666666667,
    0.058823529411764705,
    0.05263157894736842,
    0.047619047619047616,
    0.043478260869565216,
)
#: ``ln 2`` split as fdlibm does: ``_LN2_HI`` has 21 trailing zero bits, so ``k * _LN2_HI``
#: is exact for any exponent ``k`` a double has.
_LN2_HI = 0.6931471803691238
_LN2_LO = 1.9082149292705877e-10
_INV_LN2 = 1.4426950408889634
_SQRT_HALF = 0.7071067811865476


def _poly(coefficients: tuple[float, ...], x: float) -> float:
    """``sum(c[j] * x ** j)`` by Horner's rule, highest degree first."""
    result = 0.0
    for c in reversed(coefficients):
        result = result * x + c
    return result


def exp2(x: float) -> float:
    """``2 ** x``, the same bits everywhere (see the module docstring)."""
    if x != x:
        return x
    if x >= 1024.0:
        return math.inf
    if x < -1080.0:
        return 0.0
    k = round(x)
    f = x - k  # exact: x and k are within 0.5 of each other
    # _poly(_EXP2, f) written out (the scheduler's decay calls this once per decision and
    # per batch): the same multiplications and additions in the same order, so the same
    # bits; Horner's first step, 0.0 * f + c13, is c13 exactly.
    c = _EXP2
    p = (((((c[13] * f + c[12]) * f + c[11]) * f + c[10]) * f + c[9]) * f + c[8]) * f + c[7]
    p = ((((((p * f + c[6]) * f + c[5]) * f + c[4]) * f + c[3]) * f + c[2]) * f + c[1]) * f + c[0]
    return math.ldexp(p, k)


def exp(x: float) -> float:
    """``e ** x``, the same bits everywhere."""
    if x != x:
        return x
    if x > 709.8:
        return math.inf
    if x < -745.2:
        return 0.0
    k = round(x * _INV_LN2)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    return math.ldexp(_poly(_EXP, r), k)


def log(x: float) -> float:
    """The natural logarithm of ``x > 0``, the same bits everywhere (``ValueError`` for
    ``x <= 0``, as ``math.log``)."""
    if x != x or x == math.inf:
        return x
    if x <= 0.0:
        raise ValueError(f"log of {x!r}: math domain error")
    m, e = math.frexp(x)  # x = m * 2**e, 0.5 <= m < 1, exact
    if m < _SQRT_HALF:
        m, e = m * 2.0, e - 1  # exact; now sqrt(1/2) <= m < sqrt(2)
    s = (m - 1.0) / (m + 1.0)  # log(m) = 2 atanh(s)
    z = s * s
    return e * _LN2_HI + (e * _LN2_LO + 2.0 * s * _poly(_LOG, z))


def pow(base: float, exponent: float) -> float:
    """``base ** exponent`` for ``base > 0``, the same bits everywhere (a power of a
    positive base is ``exp(exponent * log(base))``; ``1 ** y`` and ``x ** 0`` are 1)."""
    if exponent == 0.0 or base == 1.0:
        return 1.0
    return exp(exponent * log(base))


def expovariate(random: float, rate: float) -> float:
    """An exponential variate of ``rate`` from a uniform ``random`` in ``[0, 1)``, as
    ``random.Random.expovariate`` draws it (``-log(1 - u) / rate``), the same bits
    everywhere. Call it with ``rng.random()``: the stream of draws is the one
    ``expovariate`` would consume."""
    return -log(1.0 - random) / rate
