"""The candidate table: the models with queued work, as parallel numpy columns.

Choosing the next model is the scheduler's hot path, and it must cost time in the
number of models *with queued work* (candidates), never in the number loaded: a
worker may hold thousands of models of which a handful are busy. The core therefore
keeps candidates in a dense structure-of-arrays -- one slot per candidate, removed
by swapping the last slot into the hole -- and evaluates a discipline as a few
vectorised numpy operations over the first ``n`` slots. Python-level work per
decision is then constant, and the numpy work grows so slowly with ``n`` that a
decision among 100 candidates costs about what one among 10 does
(``benchmarks/bench_scheduler.py`` measures it).

The columns are a *cache* of per-model state owned by the policy, which rewrites a
model's slot whenever that model changed since the last decision (its queue, usage,
weight or learned costs); a clean model's slot is never touched.

**Usages on a common origin.** A usage is an EMA stored as ``(value, stamp)`` and
decayed by ``2 ** (-(now - stamp) / halflife)`` when read. The table keeps, beside
each, ``scaled = value * 2 ** ((stamp - origin) / halflife)``, computed once when the
slot is written: every candidate's usage at ``now`` is then ``scaled`` times the one
factor ``2 ** ((origin - now) / halflife)``, so a decision computes one power of two,
not one per candidate. The power is ``floatmath.exp2``, the same bits on every
machine: with numpy's ``np.exp2`` (whose kernel numpy picks by the CPU) the fair
order, and every simulation table, came out different with and without AVX-512
(floatmath's docstring). The origin moves forward (every slot rescaled from its
``(value, stamp)``, once per ``REBASE_HALFLIVES`` half-lives) before the scale could
overflow.

Discipline keys (``select``; ties are broken by the older head, i.e. the smaller
submission number, which is unique so no further tie-break is ever needed):

* ``fair``: ``clamp(w_i / W - u_i / U, -cap, cap) / cost_i``, highest first, where
  ``W`` and ``U`` sum weights and decayed usages over the *candidates* and
  ``cost_i`` is the learned cost of the batch model ``i`` would run now. (The
  original summed over every loaded model; see ``policy`` for why that starves.)
* ``fifo``: the oldest head.
* ``edf``: the soonest deadline anywhere in the queue (none = +inf), then the oldest head.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from reactantserver.floatmath import exp2

Floats = npt.NDArray[np.float64]


#: How far (in half-lives) a written stamp may be ahead of the origin before the origin
#: moves: ``2 ** 256`` times a usage is far from overflowing.
REBASE_HALFLIVES = 256.0


class CandidateTable:
    """Dense columns over the candidate models; ``keys[i]`` names slot ``i``'s model."""

    _INITIAL = 64

    def __init__(self, halflife: float) -> None:
        if not halflife > 0:
            raise ValueError(f"a usage half-life must be > 0; got {halflife}")
        self.halflife = halflife
        #: The time the ``scaled`` column is relative to (see the module docstring).
        self.origin = 0.0
        self.keys: list[Any] = []
        self._slot: dict[Any, int] = {}
        cap = self._INITIAL
        self.weight: Floats = np.zeros(cap)
        self.usage: Floats = np.zeros(cap)  # value at ``stamp``
        self.stamp: Floats = np.zeros(cap)
        self.scaled: Floats = np.zeros(cap)  # value * 2 ** ((stamp - origin) / halflife)
        self.cost: Floats = np.ones(cap)
        self.deadline: Floats = np.full(cap, math.inf)
        self.head: npt.NDArray[np.int64] = np.zeros(cap, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, key: object) -> bool:
        return key in self._slot

    def slot(self, key: Any) -> int:
        """The slot of ``key`` (which must be a candidate)."""
        return self._slot[key]

    def add(self, key: Any) -> int:
        """Make ``key`` a candidate; returns its slot (the caller fills the columns)."""
        n = len(self.keys)
        if n == self.weight.shape[0]:
            self._grow()
        self.keys.append(key)
        self._slot[key] = n
        return n

    def discard(self, key: Any) -> None:
        """Drop ``key`` (if present) by moving the last slot into its place."""
        slot = self._slot.pop(key, None)
        if slot is None:
            return
        last = len(self.keys) - 1
        moved = self.keys.pop()
        if slot != last:
            self.keys[slot] = moved
            self._slot[moved] = slot
            for column in self._columns():
                column[slot] = column[last]

    def write(
        self,
        slot: int,
        *,
        weight: float,
        usage: float,
        stamp: float,
        cost: float,
        deadline: float,
        head: int,
    ) -> None:
        """Refresh every column of one slot."""
        offset = (stamp - self.origin) / self.halflife
        if offset > REBASE_HALFLIVES:
            self._rebase(stamp)
            offset = 0.0
        self.weight[slot] = weight
        self.usage[slot] = usage
        self.stamp[slot] = stamp
        self.scaled[slot] = usage * exp2(offset) if usage else 0.0
        self.cost[slot] = cost
        self.deadline[slot] = deadline
        self.head[slot] = head

    def decayed_usage(self, now: float) -> Floats:
        """Every candidate's usage decayed to ``now`` (no later than its stamp, which the
        policy's monotonic ``now`` guarantees)."""
        return self.scaled[: len(self.keys)] * exp2((self.origin - now) / self.halflife)

    def fair_priorities(self, usage: Floats, cap: float) -> Floats:
        """The fair key of every candidate, given their decayed ``usage``."""
        n = len(self.keys)
        weight = self.weight[:n]
        total_usage = float(usage.sum())
        gap = weight / weight.sum()
        if total_usage > 0.0:
            gap = gap - usage / total_usage
        return np.minimum(np.maximum(gap, -cap), cap) / self.cost[:n]

    def service_level(self, usage: Floats) -> float:
        """The fair service level: the smallest ``usage / weight`` among the candidates.

        ``min(axis=0)``, not ``min()``: numpy 2.5's stubs give the method self-typed
        overloads that mypy (at ``python_version = 3.11``) matches to none when it is
        called without arguments (``All overload variants of "min" of "ndarray" require at
        least one argument``); with the axis named it type-checks under old and new stubs
        alike, and costs what ``min()`` does (``np.min``, the function, costs a
        microsecond more per decision: it dispatches in Python first).
        """
        return float((usage / self.weight[: len(self.keys)]).min(axis=0))

    def select(
        self,
        discipline: str,
        *,
        now: float,
        cap: float,
        exclude: Any = None,
    ) -> tuple[int, Floats | None]:
        """The winning slot under ``discipline`` (``exclude`` may name a model to skip).

        Returns the slot (-1 if only the excluded model is a candidate) and, under
        ``fair``, the decayed usages it computed (the policy reuses them). The table
        must not be empty.
        """
        n = len(self.keys)
        usage: Floats | None = None
        if discipline == "fair":
            usage = self.decayed_usage(now)
            # Negated so that every discipline is an argmin.
            key = -self.fair_priorities(usage, cap)
        elif discipline == "edf":
            key = self.deadline[:n].copy()
        else:
            key = self.head[:n].astype(np.float64)
        skip = self._slot.get(exclude) if exclude is not None else None
        if skip is not None:
            key[skip] = math.inf
        tied = np.flatnonzero(key == key[int(np.argmin(key))])
        if skip is not None:
            # An excluded slot can still tie at +inf (EDF's "no deadline").
            tied = tied[tied != skip]
            if tied.size == 0:
                return -1, usage
        best = int(tied[0]) if tied.size == 1 else int(tied[np.argmin(self.head[tied])])
        return best, usage

    def _columns(self) -> tuple[np.ndarray[Any, Any], ...]:
        return (
            self.weight,
            self.usage,
            self.stamp,
            self.scaled,
            self.cost,
            self.deadline,
            self.head,
        )

    def _rebase(self, origin: float) -> None:
        """Move the origin to ``origin``: every slot's ``scaled`` again from its value and
        stamp (O(candidates), once per ``REBASE_HALFLIVES`` half-lives at most)."""
        self.origin = origin
        for slot in range(len(self.keys)):
            value = float(self.usage[slot])
            offset = (float(self.stamp[slot]) - origin) / self.halflife
            self.scaled[slot] = value * exp2(offset) if value else 0.0

    def _grow(self) -> None:
        size = 2 * self.weight.shape[0]
        self.weight = np.resize(self.weight, size)
        self.usage = np.resize(self.usage, size)
        self.stamp = np.resize(self.stamp, size)
        self.scaled = np.resize(self.scaled, size)
        self.cost = np.resize(self.cost, size)
        self.deadline = np.resize(self.deadline, size)
        self.head = np.resize(self.head, size)
