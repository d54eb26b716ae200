"""Rates, costs and the repack cadence of lpt_packing, on the fleet's compute clock.

Theory of operation
-------------------
The packer needs, per model, an arrival rate and a compute cost per request. Both are
measured between two repacks and smoothed by an EWMA whose clock is **fleet compute
seconds** (the sum of every worker's ``total_compute_seconds`` deltas), not wall time::

    a   = 1 - 2 ** (-delta_fleet_compute / h)      h = ema_halflife_compute_seconds,
    new = (1 - a) * old + a * sample                   or the rebalance budget when 0

so ``ewma(0, 1, 300, 300) == 0.5``: after one half-life of fleet work an estimate has moved
half-way to the new sample. An idle fleet does not forget what it learned, and a busy one
adapts as fast as its work accumulates. A model's first sample seeds its estimate (there is
nothing to smooth against).

* ``rate`` sample = requests that *arrived at the gateway* for the model / wall seconds of
  the window (arrivals, not completions: a saturated worker serves less than its demand).
* ``cost`` sample = delta compute seconds / delta requests served, fleet-wide (the route
  table's monotone totals, which survive worker restarts). A model that served nothing in
  the window keeps its cost; one never measured falls back to the mean of the measured
  costs, or 0 (it is then placed by memory alone).

:class:`RepackCadence` is the trigger rule: a ``startup`` repack first; then a ``compute``
repack once ``first_rebalance_compute_seconds`` of fleet compute accumulated since the last
repack (0 = use ``rebalance_compute_seconds``) the first time, and every
``rebalance_compute_seconds`` after that; an ``operator`` repack whenever one is requested
(the Repack RPC, SetModelPlacement). Any repack restarts the count. (The lpt_packing
controller adds a ``fleet`` repack when the set of ready workers changed since the last one,
so that ``replicas: all`` follows the fleet and models placed on a worker that left are
placed again.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Literal

import attrs

from reactantserver.floatmath import exp2

from .table import ModelTotals

Trigger = Literal["startup", "compute", "operator", "fleet"]
TRIGGERS: tuple[Trigger, ...] = ("startup", "compute", "operator", "fleet")


def ewma(old: float, sample: float, delta: float, halflife: float) -> float:
    """Move ``old`` towards ``sample`` by ``a = 1 - 2^(-delta / halflife)``."""
    if halflife <= 0:
        return sample
    # floatmath's exp2, not ``2.0 **``: the same bits on every machine (the fleet
    # simulator's tables must not depend on the C library).
    a = 1.0 - exp2(-max(0.0, delta) / halflife)
    return (1.0 - a) * old + a * sample


@attrs.frozen(kw_only=True)
class Estimate:
    """One model's smoothed demand, as the packer reads it."""

    name: str
    #: Requests per second arriving at the gateway.
    rate: float
    #: Compute seconds per request (fallback applied; 0 when nothing is known).
    cost: float
    #: Whether ``cost`` was measured for this model (False: a fallback).
    measured: bool

    @property
    def load(self) -> float:
        return self.rate * self.cost


class LoadEstimator:
    """EWMAs of rate and cost per model over fleet compute seconds (see the module doc)."""

    def __init__(self, halflife: float) -> None:
        self.halflife = halflife
        self._rate: dict[str, float] = {}
        self._cost: dict[str, float] = {}
        self._window: tuple[float, float, dict[str, int], dict[str, ModelTotals]] | None = None
        self._estimates: Mapping[str, Estimate] = MappingProxyType({})

    @property
    def estimates(self) -> Mapping[str, Estimate]:
        """The estimates of the last :meth:`update`."""
        return self._estimates

    def update(
        self,
        now: float,
        models: Iterable[str],
        arrivals: Mapping[str, int],
        totals: Mapping[str, ModelTotals],
        fleet_compute: float,
    ) -> Mapping[str, Estimate]:
        """Close the window that started at the previous update; return every model's estimate.

        ``arrivals`` are cumulative per-model request counts at the gateway, ``totals`` and
        ``fleet_compute`` the route table's monotone totals, ``models`` the models to
        estimate (those served now; others are forgotten).
        """
        names = sorted(set(models))
        if self._window is not None:
            start, fleet_start, arrived_start, totals_start = self._window
            wall = now - start
            delta = fleet_compute - fleet_start
            for name in names:
                if wall > 0:
                    sample = (arrivals.get(name, 0) - arrived_start.get(name, 0)) / wall
                    old = self._rate.get(name)
                    self._rate[name] = (
                        max(0.0, sample) if old is None else ewma(old, sample, delta, self.halflife)
                    )
                now_t = totals.get(name, ModelTotals())
                then_t = totals_start.get(name, ModelTotals())
                served = now_t.requests - then_t.requests
                if served > 0:
                    sample = (now_t.compute_seconds - then_t.compute_seconds) / served
                    old = self._cost.get(name)
                    self._cost[name] = (
                        sample if old is None else ewma(old, sample, delta, self.halflife)
                    )
        self._window = (now, fleet_compute, dict(arrivals), dict(totals))
        known = [self._cost[n] for n in names if n in self._cost]
        fallback = math.fsum(known) / len(known) if known else 0.0
        self._estimates = MappingProxyType(
            {
                n: Estimate(
                    name=n,
                    rate=self._rate.get(n, 0.0),
                    cost=self._cost.get(n, fallback),
                    measured=n in self._cost,
                )
                for n in names
            }
        )
        for gone in set(self._rate) - set(names):
            del self._rate[gone]
        for gone in set(self._cost) - set(names):
            del self._cost[gone]
        return self._estimates


@attrs.frozen(kw_only=True)
class CadenceStatistics:
    repacks: Mapping[str, int]
    #: Fleet compute seconds at the last repack (None before the first).
    mark: float | None
    #: Fleet compute seconds at which the next compute repack is due (None before startup).
    next_due: float | None
    operator_pending: bool


class RepackCadence:
    """When to repack (see the module docstring). Sans-IO: it is given fleet compute."""

    def __init__(self, rebalance_compute_seconds: float, first_rebalance_compute_seconds: float):
        self.configure(rebalance_compute_seconds, first_rebalance_compute_seconds)
        self._mark: float | None = None
        self._compute_repacks = 0
        self._operator = False
        self._counts: dict[str, int] = dict.fromkeys(TRIGGERS, 0)

    def configure(self, rebalance: float, first: float) -> None:
        if rebalance <= 0:
            raise ValueError(f"rebalance_compute_seconds must be > 0; got {rebalance}")
        self.rebalance = rebalance
        self.first = first if first > 0 else rebalance

    def request(self) -> None:
        """An operator asked for a repack."""
        self._operator = True

    def budget(self) -> float:
        """Fleet compute seconds between the last repack and the next compute repack."""
        return self.first if self._compute_repacks == 0 else self.rebalance

    def due(self, fleet_compute: float) -> Trigger | None:
        """The trigger of a repack due now, or None."""
        if self._mark is None:
            return "startup"
        if self._operator:
            return "operator"
        if fleet_compute - self._mark >= self.budget():
            return "compute"
        return None

    def done(self, trigger: Trigger, fleet_compute: float) -> None:
        """A repack ran (whatever its trigger): restart the count."""
        self._mark = fleet_compute
        self._counts[trigger] += 1
        if trigger == "compute":
            self._compute_repacks += 1
        elif trigger == "operator":
            self._operator = False

    def statistics(self) -> CadenceStatistics:
        return CadenceStatistics(
            repacks=MappingProxyType(dict(self._counts)),
            mark=self._mark,
            next_due=None if self._mark is None else self._mark + self.budget(),
            operator_pending=self._operator,
        )
