"""Learned costs: per-(model, batch size) compute time and per-model device-time usage.

Two kinds of exponential averages drive the disciplines, both kept sans-IO (the
caller passes ``now``):

**Batch cost** (``CostTable``, one per model). ``cost[B]`` estimates the device
seconds of one dispatch at padded size ``B``. The first sample *seeds* it (the
warm-up run executes every compiled size once on zeros and feeds the result through
``seed``); later samples move it by ``alpha`` (``scheduler.cost_ema_alpha``, 0.2).
Weight-load time is excluded by the driver, which times only the execution. A size
never measured is estimated from the nearest measured one: the cost of the smallest
measured size above it (device cost does not fall as the batch grows), else the
largest measured size scaled linearly (batching never makes cost grow *faster* than
the rows). Both are upper bounds under those assumptions, which is the safe side for
EDF's laxity check. A model with no sample at all costs ``DEFAULT_COST`` (10 ms, the
original's constant).

**Fastest run** (``CostTable.fastest``). Beside the average, the table keeps the fastest
run seen at each size since the last seed. This is what decides whether a batch is
tiny enough to run inline on the dispatch loop (``scheduler.inline_max_seconds``):
noise -- a busy machine, a device thread waiting for the GIL -- only ever adds to a run,
so the fastest one is the program's own cost, and one slow run cannot move a tiny
program off the loop for good. (Runs on the device thread contend for the GIL with the
event loop; their wall time would keep a tiny program that once ran there from ever
coming back.)

**Usage** (``decayed``). Each model's recent device time is an EMA with half-life
``scheduler.ema_halflife_seconds``: stored as ``(value, stamp)`` and decayed lazily
by ``2 ** (-(now - stamp) / halflife)`` whenever it is read or written, so idle
models cost nothing. Because the decay is the same for every model, *ratios* of
usages do not change while nobody runs; only dispatches move them. The power of two is
``floatmath.exp2``, not ``math.exp2``: the same bits on every machine, so a simulation's
table does not depend on the C library (floatmath's docstring).
"""

from __future__ import annotations

import bisect

from reactantserver.floatmath import exp2

#: Cost assumed for a model never measured (seconds).
DEFAULT_COST = 0.01
#: Floor on any cost, so priorities (which divide by cost) stay finite.
MIN_COST = 1e-9


def decayed(value: float, stamp: float, now: float, halflife: float) -> float:
    """``value`` recorded at ``stamp``, decayed to ``now`` with the given half-life."""
    if now <= stamp or value == 0.0:
        return value
    return value * exp2(-(now - stamp) / halflife)


class CostTable:
    """The per-size cost EMA of one model (see the module docstring)."""

    __slots__ = ("_alpha", "_costs", "_fastest", "_sizes")

    def __init__(self, alpha: float) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"cost_ema_alpha must be in (0, 1]; got {alpha}")
        self._alpha = alpha
        self._costs: dict[int, float] = {}
        self._fastest: dict[int, float] = {}
        self._sizes: list[int] = []  # measured sizes, ascending

    def seed(self, size: int, seconds: float) -> None:
        """Set ``cost[size]`` outright (a warm-up run, or a new model version)."""
        if size < 1:
            # A dispatch always carries at least one row; an unbatched model's single
            # program runs one request, i.e. size 1.
            raise ValueError(f"a batch size is at least 1; got {size}")
        if size not in self._costs:
            bisect.insort(self._sizes, size)
        self._costs[size] = self._fastest[size] = max(seconds, MIN_COST)

    def observe(self, size: int, seconds: float) -> None:
        """Feed one measured dispatch: the first sample seeds, later ones smooth."""
        old = self._costs.get(size)
        if old is None:
            self.seed(size, seconds)
        else:
            self._costs[size] = max(old + self._alpha * (seconds - old), MIN_COST)
            if seconds < self._fastest[size]:
                self._fastest[size] = max(seconds, MIN_COST)

    def measured(self, size: int) -> float | None:
        """The learned cost at ``size``, or ``None`` if never measured."""
        return self._costs.get(size)

    def fastest(self, size: int) -> float | None:
        """The fastest run seen at ``size`` since it was seeded; ``None`` if never run."""
        return self._fastest.get(size)

    def estimate(self, size: int) -> float:
        """The cost of one dispatch at ``size``: measured, else bounded from neighbours."""
        cost = self._costs.get(size)
        if cost is not None:
            return cost
        if not self._sizes:
            return DEFAULT_COST
        above = bisect.bisect_right(self._sizes, size)
        if above < len(self._sizes):
            return self._costs[self._sizes[above]]
        top = self._sizes[-1]
        return self._costs[top] * size / top

    def clear(self) -> None:
        """Forget every sample (the compiled program changed)."""
        self._costs.clear()
        self._fastest.clear()
        self._sizes.clear()

    def items(self) -> list[tuple[int, float]]:
        """``(size, seconds)`` for every measured size, ascending."""
        return [(s, self._costs[s]) for s in self._sizes]
