"""Simulate workloads on the real ``Scheduler`` under Trio's virtual clock.

Nothing here is a model of the scheduler: the requests go through the same
``Scheduler.submit`` and dispatch loop the worker runs. Only the device is
simulated -- ``SimulatedExecutor`` sleeps for a cost model's seconds -- and time is
``trio.testing.MockClock(autojump_threshold=0)``, which jumps to the next timer as
soon as every task is blocked. Minutes of traffic therefore replay in seconds, and
the same seed gives the same numbers.

Pieces:

* ``ModelSpec``: a model's compiled sizes, weight, cost model, arrival rate and
  request timeout. ``cost(size) = base_cost * (1 + marginal * (size - 1))``: a batch of
  8 costs ``1 + 7 * marginal`` times a batch of 1.
* ``zipf_models``: ``n`` models with Zipf popularity, costs spanning a range and
  weights drawn from a set; ``saturating_rate`` finds the total arrival rate at which
  every model's demand exceeds its weighted share (so fair shares must equal the
  weights); ``offered_load`` is the demand in device-seconds per second.
* ``poisson_arrivals``: merged per-model Poisson processes.
* ``simulate``: run it and return a ``SimulationReport`` (per-model GPU share vs
  weight, latency percentiles, outcomes, batch-size histogram, utilisation), which
  ``examples/simulate.py`` prints.
* fleet mode lives in ``fleet.py``: N simulated workers, each running the real
  ``SchedulingPolicy`` and ``WeightCachePolicy``, behind the gateway's real router and
  lpt_packing packer (``examples/simulate_fleet.py``, ``examples/simulate.py --workers``,
  docs/fleet.md);
* ``drive_backlogged``: no Trio at all -- keep every model of a bare
  ``SchedulingPolicy`` backlogged and step it dispatch by dispatch, advancing
  ``now`` by each batch's cost. The property tests use it for share convergence
  and bounded waiting.

Why one module of this size: the pieces above are one tool (``examples/simulate.py``
and the property tests use them together); each is a few dozen lines.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio
import trio.testing

from reactantserver.config import SchedulerConfig
from reactantserver.errors import DeadlineExceeded, ExecutionFailed, ResourceExhausted
from reactantserver.floatmath import expovariate, log
from reactantserver.floatmath import pow as fpow
from reactantserver.histogram import percentile

from .dispatch import Scheduler
from .policy import SchedulingPolicy
from .records import Batch


@attrs.frozen(kw_only=True)
class ModelSpec:
    """One simulated model: how it batches, what it costs, how often it is called."""

    name: str
    base_cost: float
    weight: float = 1.0
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    #: Extra cost of each row beyond the first, as a fraction of ``base_cost``.
    marginal: float = 0.25
    #: Poisson arrival rate (requests per second).
    rate: float = 0.0
    #: Relative deadline of each request (seconds), or None.
    timeout: float | None = None
    #: Each request's rows are drawn uniformly from these.
    rows: tuple[int, ...] = (1,)

    def cost(self, size: int) -> float:
        """Device seconds of one dispatch at padded ``size``."""
        return self.base_cost * (1.0 + self.marginal * (size - 1))


@attrs.frozen
class DispatchRecord:
    """One simulated execution."""

    model: str
    size: int
    rows: int
    requests: int
    start: float
    end: float

    @classmethod
    def of(cls, batch: Batch, start: float, end: float) -> DispatchRecord:
        """The record of ``batch``, executed from ``start`` to ``end``."""
        return cls(
            model=batch.model,
            size=batch.size,
            rows=batch.rows,
            requests=len(batch.requests),
            start=start,
            end=end,
        )


class SimulatedExecutor:
    """An ``Executor`` whose device time comes from a cost model.

    ``execute`` sleeps for ``cost(model, size)`` and answers each request with its
    payload, so callers can check they got their own answer back.
    """

    def __init__(self, cost: Callable[[str, int], float]) -> None:
        self.cost = cost
        self.trace: list[DispatchRecord] = []
        self.running = 0
        self.max_running = 0

    async def prepare(self, batch: Batch) -> None:
        return None

    async def execute(self, batch: Batch) -> Sequence[Any]:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        start = trio.current_time()
        try:
            await trio.sleep(self.cost(batch.model, batch.size))
        finally:
            self.running -= 1
        self.trace.append(DispatchRecord.of(batch, start, trio.current_time()))
        return [r.payload for r in batch.requests]


def drive_backlogged(
    policy: SchedulingPolicy,
    cost: Callable[[str, int], float],
    *,
    dispatches: int,
    depth: int = 1,
    rows: int = 1,
    now: float = 0.0,
    models: Sequence[str] | None = None,
) -> list[DispatchRecord]:
    """Run ``dispatches`` batches with every model in ``models`` (default: all) backlogged.

    Before each decision each model's queue is topped up to ``depth`` requests of
    ``rows`` rows; each batch then takes ``cost(model, size)`` seconds of virtual
    time. Returns one record per batch, in order.
    """
    names = list(policy.models if models is None else models)
    trace: list[DispatchRecord] = []
    for _ in range(dispatches):
        for name in names:
            for _ in range(depth - policy.queue_depth(name)):
                policy.submit(name, now=now, rows=rows)
        batch = policy.next_batch(now).batch
        if batch is None:
            break
        seconds = cost(batch.model, batch.size)
        trace.append(DispatchRecord.of(batch, now, now + seconds))
        now += seconds
        policy.complete(batch, seconds, now)
    return trace


def zipf_models(
    n: int,
    *,
    cost_range: tuple[float, float] = (0.001, 0.1),
    zipf_s: float | None = None,
    weights: Sequence[float] = (1.0, 2.0, 4.0),
    total_rate: float = 100.0,
    rows: tuple[int, ...] = (1,),
    timeout: float | None = None,
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8),
    marginal: float = 0.25,
    seed: int = 0,
) -> list[ModelSpec]:
    """``n`` models ranked by popularity: rank ``r`` is called ``~ r**-zipf_s`` often.

    Costs grow with rank as a power law spanning ``cost_range`` (the most popular
    model is the cheapest: small models get called most). With ``zipf_s=None`` the
    Zipf exponent equals the cost exponent, so every model offers the same device
    demand and the request counts alone span the cost range. Weights are drawn
    from ``weights``; each request's rows from ``rows``.
    """
    rng = random.Random(seed)
    low, high = cost_range
    # floatmath, not math or **: the same workload on every machine (its docstring).
    exponent = log(high / low) / log(n) if n > 1 else 0.0
    s = exponent if zipf_s is None else zipf_s
    popularity = [fpow(rank, -s) for rank in range(1, n + 1)]
    total = math.fsum(popularity)
    return [
        ModelSpec(
            name=f"m{i:02d}",
            base_cost=low * fpow(i + 1, exponent),
            weight=rng.choice(list(weights)),
            batch_sizes=batch_sizes,
            marginal=marginal,
            rate=total_rate * popularity[i] / total,
            rows=rows,
            timeout=timeout,
        )
        for i in range(n)
    ]


def with_total_rate(specs: Sequence[ModelSpec], total_rate: float) -> list[ModelSpec]:
    """The same models with arrival rates rescaled to sum to ``total_rate``."""
    current = math.fsum(s.rate for s in specs)
    return [attrs.evolve(s, rate=s.rate * total_rate / current) for s in specs]


def saturating_rate(specs: Sequence[ModelSpec], margin: float = 1.5) -> float:
    """Total arrival rate at which every model's demand is ``margin`` x its weighted share.

    Demand is counted at the cheapest per-row cost (full batches), so the model stays
    backlogged even when the scheduler batches it fully.
    """
    total_weight = math.fsum(s.weight for s in specs)
    total_rate = math.fsum(s.rate for s in specs)
    need = 0.0
    for s in specs:
        top = max(s.batch_sizes)
        per_request = s.cost(top) / top * sum(s.rows) / len(s.rows)
        share = s.weight / total_weight
        # At total rate R, model s gets R * s.rate / total_rate requests per second.
        need = max(need, margin * share * total_rate / (s.rate * per_request))
    return need


def offered_load(specs: Sequence[ModelSpec]) -> float:
    """Device seconds per second the arrivals ask for, if every dispatch were a full batch.

    1.0 means the device could just keep up with perfect batching; partial batches
    cost more per row, so real utilisation is higher.
    """
    total = 0.0
    for s in specs:
        top = max(s.batch_sizes)
        total += s.rate * sum(s.rows) / len(s.rows) * s.cost(top) / top
    return total


def poisson_arrivals(
    specs: Iterable[ModelSpec], duration: float, *, seed: int = 0
) -> list[tuple[float, str, int]]:
    """``(time, model, rows)`` for every arrival in ``[0, duration)``, sorted by time.

    The gaps are ``floatmath.expovariate``: ``random.expovariate``'s draws, with a
    logarithm that gives the same bits on every machine."""
    rng = random.Random(seed)
    arrivals: list[tuple[float, str, int]] = []
    for spec in specs:
        if spec.rate <= 0:
            continue
        t = expovariate(rng.random(), spec.rate)
        while t < duration:
            arrivals.append((t, spec.name, rng.choice(spec.rows)))
            t += expovariate(rng.random(), spec.rate)
    arrivals.sort()
    return arrivals


@attrs.frozen
class ModelReport:
    """One model's outcome over the measurement window."""

    name: str
    weight: float
    weight_share: float
    gpu_seconds: float
    gpu_share: float
    arrivals: int
    completed: int
    #: Refused at admission (queue full).
    rejected: int
    #: Failed with DeadlineExceeded: shed at dispatch, or expired while queued.
    late: int
    p50: float
    p99: float
    mean_batch_rows: float
    #: Fraction of queue samples in which the model had queued work.
    backlogged: float

    @property
    def share_ratio(self) -> float:
        """GPU share over weight share (1.0 = exactly its weight)."""
        return self.gpu_share / self.weight_share if self.weight_share else math.nan


@attrs.frozen
class SimulationReport:
    discipline: str
    duration: float
    warmup: float
    models: tuple[ModelReport, ...]
    #: Padded batch size -> dispatches, over the window.
    batch_sizes: Mapping[int, int]
    #: Fraction of the window the device was executing.
    utilization: float
    dispatches: int
    #: Most executions ever running at once (must be 1).
    max_concurrent: int

    @property
    def window(self) -> float:
        return self.duration - self.warmup

    def worst_share_error(self) -> float:
        """Largest ``|gpu_share / weight_share - 1|`` over the models."""
        return max(abs(m.share_ratio - 1.0) for m in self.models)

    def format(self, *, rows: int | None = None) -> str:
        """The report as text tables (``rows`` limits the per-model table)."""
        out = [
            f"discipline={self.discipline}  models={len(self.models)}  "
            f"window={self.warmup:g}..{self.duration:g} s  dispatches={self.dispatches}  "
            f"utilization={self.utilization:.1%}  max concurrent executions={self.max_concurrent}",
            "",
            f"{'model':>6} {'weight':>6} {'w.share':>8} {'gpu.share':>9} {'ratio':>6} "
            f"{'arrived':>8} {'done':>7} {'rejected':>8} {'late':>6} {'p50 ms':>8} "
            f"{'p99 ms':>8} {'rows/b':>6} {'backlog':>7}",
        ]
        shown = self.models if rows is None else self.models[:rows]
        for m in shown:
            out.append(
                f"{m.name:>6} {m.weight:>6g} {m.weight_share:>8.4f} {m.gpu_share:>9.4f} "
                f"{m.share_ratio:>6.3f} {m.arrivals:>8} {m.completed:>7} {m.rejected:>8} "
                f"{m.late:>6} {m.p50 * 1e3:>8.1f} {m.p99 * 1e3:>8.1f} "
                f"{m.mean_batch_rows:>6.2f} {m.backlogged:>7.0%}"
            )
        if rows is not None and rows < len(self.models):
            out.append(f"{'...':>6} ({len(self.models) - rows} more)")
        ratios = [m.share_ratio for m in self.models]
        out.append("")
        out.append(
            f"gpu.share / weight.share: min {min(ratios):.3f}  max {max(ratios):.3f}  "
            f"worst error {self.worst_share_error():.1%}  "
            "(a share can match its weight only while the model stays backlogged)"
        )
        total = sum(self.batch_sizes.values()) or 1
        hist = "  ".join(
            f"B={size}: {count} ({count / total:.0%})"
            for size, count in sorted(self.batch_sizes.items())
        )
        out.append(f"batch sizes: {hist}")
        return "\n".join(out)


def simulate(
    config: SchedulerConfig,
    specs: Sequence[ModelSpec],
    *,
    duration: float,
    warmup: float = 0.0,
    seed: int = 0,
    sample_interval: float = 0.1,
) -> SimulationReport:
    """Replay Poisson arrivals for ``specs`` through a real ``Scheduler``.

    Costs are seeded as a warm-up run would (every compiled size measured once).
    Statistics cover ``[warmup, duration)``: GPU time is counted where executions
    overlap the window, latencies for requests that arrived in it.
    """
    by_name = {s.name: s for s in specs}
    executor = SimulatedExecutor(lambda model, size: by_name[model].cost(size))
    scheduler = Scheduler(config, executor)
    for spec in specs:
        scheduler.add_model(spec.name, spec.batch_sizes, weight=spec.weight)
        for size in spec.batch_sizes:
            scheduler.seed_cost(spec.name, size, spec.cost(size))
    arrivals = poisson_arrivals(specs, duration, seed=seed)
    latencies: dict[str, list[float]] = {s.name: [] for s in specs}
    outcomes: dict[str, Counter[str]] = {s.name: Counter() for s in specs}
    backlog: Counter[str] = Counter()
    samples = 0

    async def one(name: str, arrived: float, rows: int, timeout: float | None) -> None:
        deadline = None if timeout is None else arrived + timeout
        counted = arrived >= warmup
        try:
            await scheduler.submit(name, arrived, rows=rows, deadline=deadline)
        except ResourceExhausted:
            outcome = "rejected"
        except DeadlineExceeded:
            outcome = "late"
        except ExecutionFailed:
            outcome = "failed"
        else:
            outcome = "completed"
            if counted:
                latencies[name].append(trio.current_time() - arrived)
        if counted:
            outcomes[name][outcome] += 1

    async def sampler() -> None:
        nonlocal samples
        policy = scheduler.policy
        t = warmup
        while t < duration:
            await trio.sleep_until(t)
            samples += 1
            for spec in specs:
                if policy.queue_depth(spec.name):
                    backlog[spec.name] += 1
            t += sample_interval

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(scheduler.run)
            nursery.start_soon(sampler)
            async with trio.open_nursery() as clients:
                for t, name, rows in arrivals:
                    await trio.sleep_until(t)
                    clients.start_soon(one, name, t, rows, by_name[name].timeout)
                await trio.sleep_until(duration)
                clients.cancel_scope.cancel()
            await scheduler.aclose()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))

    window = duration - warmup
    gpu: dict[str, float] = dict.fromkeys(by_name, 0.0)
    sizes: Counter[int] = Counter()
    rows: Counter[str] = Counter()
    batches: Counter[str] = Counter()
    busy = 0.0
    dispatches = 0
    for rec in executor.trace:
        overlap = min(rec.end, duration) - max(rec.start, warmup)
        if overlap <= 0:
            continue
        gpu[rec.model] += overlap
        busy += overlap
        if rec.start >= warmup:
            dispatches += 1
            sizes[rec.size] += 1
            rows[rec.model] += rec.rows
            batches[rec.model] += 1
    total_weight = sum(s.weight for s in specs)
    arrived = Counter(name for t, name, _ in arrivals if t >= warmup)
    reports = tuple(
        ModelReport(
            name=s.name,
            weight=s.weight,
            weight_share=s.weight / total_weight,
            gpu_seconds=gpu[s.name],
            gpu_share=gpu[s.name] / busy if busy else 0.0,
            arrivals=arrived[s.name],
            completed=outcomes[s.name]["completed"],
            rejected=outcomes[s.name]["rejected"],
            late=outcomes[s.name]["late"],
            p50=percentile(latencies[s.name], 0.50),
            p99=percentile(latencies[s.name], 0.99),
            mean_batch_rows=rows[s.name] / batches[s.name] if batches[s.name] else 0.0,
            backlogged=backlog[s.name] / samples if samples else 0.0,
        )
        for s in specs
    )
    return SimulationReport(
        discipline=config.discipline,
        duration=duration,
        warmup=warmup,
        models=reports,
        batch_sizes=dict(sizes),
        utilization=busy / window if window > 0 else 0.0,
        dispatches=dispatches,
        max_concurrent=executor.max_running,
    )
