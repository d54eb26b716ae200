"""``reactantserver calibrate``: measure each model and the worker's host costs, at idle.

Theory of operation
-------------------
A plan is only as good as its costs, and a worker measured under load reports costs
stretched by whatever shared its cores. So calibration measures one worker with nothing
else running (it says how busy the machine was) and separates what the device does from
what the host's cores do, so the fleet simulator can put the contention back
(:mod:`reactantserver.fleet.host`). Everything is read from the worker's own counters
(``ModelControlStatus``: compute seconds, dispatches, rows; ``/metrics``: weight loads and
their seconds) and from the kernel's accounting of its threads (:mod:`.cpu`):

1. **Executions and loads, as traffic over a catalog meets them.** Every model gets,
   ``passes`` times, one request right after a CompactMemory (the weight cache emptied: a
   cold load), then ``repeats`` of each compiled size. A request that caused exactly one
   load is a load sample; every sample, against its model's bytes, gives the load time
   (least squares: a fixed part plus bytes over a bandwidth, through the samples' mean),
   and each sample over that line is the loads' ``spread``. Then ``rounds`` rounds per
   compiled size send each model one request in turn, so that every execution finds the
   caches full of the other models' weights, as a request does when traffic moves over
   the catalog: each model's cost at each size is the mean of its executions there, and
   each execution over its mean is the executions' ``spread``. Where the catalog is
   larger than the budget these requests load as traffic does, evicting others as they
   go, and their loads are the load samples instead of the cold loads after a compaction
   (which measured 3x slower at the median here: the first put after an emptied cache).
   Each round takes the models in an order of its own (:func:`in_turn_order`), as traffic
   does: one fixed cycle evicts in one fixed pattern, and the catalog's cycle of 4.4 and
   17.1 MB models gave every other 17 MB load fresh pages. (Repeats of one model
   measure its weights hot in the caches: on the CPU backend a one-row execution of a
   17 MB model took a third of the time it takes in traffic, 2026-12-02; and loads have a
   tail -- a tenth of the 17 MB puts took four times the median -- that a fastest sample
   hides and a live p99 does not.) The other threads' CPU in the cold requests, beyond
   the execution, per mean load, is ``load_threads`` (a copy by the CPU: about 1; DMA:
   about 0).
2. **Host CPU per request.** ``requests`` one-row requests to the cheapest model, one at
   a time: the worker's main thread -- its event loop, where the RPC path runs -- per
   request is ``request_seconds`` (an inline execution's time taken out). One at a time
   on purpose: each request then pays its own wake-ups, as requests forwarded one by one
   by a gateway do; a burst on one connection shares them and costs a third as much,
   which a live fleet does not see (measured: ``benchmarks/bench_plan.py``'s diagnosis
   table). The other threads' CPU per execution over the fastest execution is what
   they burn at idle (XLA's pool on the CPU backend, spinning while it waits included;
   about 0 on a GPU).
3. **What an execution needs of the cores.** Where the threads burn CPU and the machine
   has ``cores >= 2``: one-row requests in turn over the cheapest models that fit the
   budget together, ``contended_seconds`` alone and as long beside a spinning process on
   every core but one (:func:`reactantserver.planning.cpu.start_spinners`), five times
   over (the median: a single pair now and then says 1.9x where the rest say 1.1-1.3x).
   There an execution one core wide or wider gets the one core left, so its time is its
   work in core-seconds; that over its time alone (the ``stretch``) is its width in the host
   model (:func:`width_from_stretch`): ``execution_threads``. What the threads burn
   alone overstates it: on the CPU backend they burn 2 cores per second of execution
   (the machine's two) where the stretch says 1.1-1.3, and live fleets of three CPU
   workers on two cores spent 0.38-0.56 cores of those threads per second of execution.
4. **The rest of the round trip.** The mean round trip less what the client's own
   process, the worker's main thread and the execution account for, halved: a one-way
   delay (loopback, wake-ups) that no core explains.
5. **Through a gateway** (optional): the same one-at-a-time run through it gives the
   gateway's CPU per request alone, and the delay of that path, which then replaces step
   4's; a run with ``concurrency`` requests in flight gives its CPU per request when its
   loop serves several from one wake-up (about half, here). The simulator charges the
   second per request and the difference -- the wake-up -- to each request that finds the
   gateway's loop idle.

:func:`measure_worker` and :func:`measure_gateway` work on processes someone else started
(the plan benchmark calls them on its own fleet); :func:`run` starts a worker on a model
repository for the command line, measures it and writes the costs file.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from ..fleet.host import HostCosts
from . import cpu
from .costs import Costs, ModelCosts

__all__ = [
    "GatewayMeasurement",
    "ModelProbe",
    "WorkerMeasurement",
    "fit_line",
    "in_turn_order",
    "measure_gateway",
    "measure_worker",
    "wake_split",
    "width_from_stretch",
]


@attrs.frozen(kw_only=True)
class ModelProbe:
    """How to send a model ``rows`` rows: its inputs, and its compiled sizes."""

    name: str
    batch_sizes: tuple[int, ...]
    inputs: Callable[[int], Mapping[str, np.ndarray]]


@attrs.frozen
class _Counters:
    loads: float
    load_seconds: float
    #: Executions run inline on the worker's loop (tiny programs on the CPU backend).
    inline: float
    #: model -> (compute seconds, dispatches, requests)
    models: Mapping[str, tuple[float, int, int]]
    #: model -> batch size -> the worker's learned (fastest) seconds per execution.
    fastest: Mapping[str, Mapping[int, float]]


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = intercept + slope x``; with one distinct x, through the origin."""
    n = len(xs)
    if n == 0:
        raise ValueError("no points to fit")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0, (my / mx if mx else 0.0)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - slope * mx, slope


@attrs.frozen(kw_only=True)
class WorkerMeasurement:
    """What :func:`measure_worker` found (``costs`` is the record a plan reads)."""

    costs: Costs
    #: (bytes, seconds) of every load sampled: in churn, else after a compaction.
    load_samples: tuple[tuple[int, float], ...]
    #: model -> batch size -> the seconds of each execution in turn over the catalog.
    execution_samples: Mapping[str, Mapping[int, tuple[float, ...]]] = attrs.field(factory=dict)
    #: The host run: (requests, executions, main-thread CPU, other-thread CPU, compute
    #: seconds, wall seconds, this process's CPU).
    runs: tuple[tuple[float, ...], ...]
    #: Mean round trip of one sequential one-row request, seconds.
    round_trip: float
    #: The other threads' CPU per second of execution at idle (XLA's pool spinning
    #: included), and how much longer executions took beside a spinning process on every
    #: core but one (0: not measured); ``costs.host.execution_threads`` is the width that
    #: stretch says where it was measured.
    idle_execution_threads: float = 0.0
    stretch: float = 0.0


@attrs.frozen(kw_only=True)
class GatewayMeasurement:
    #: The gateway's CPU per request with ``concurrency`` in flight, and what more one
    #: costs alone (the wake-up: one at a time minus that).
    gateway_seconds: float
    wake_seconds: float
    requests: int
    #: Mean round trip through the gateway, one at a time.
    round_trip: float
    #: One way, beyond every CPU figure, on the path through the gateway.
    network_seconds: float


def _metrics(url: str) -> tuple[dict[str, float], dict[str, dict[int, float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    fastest: dict[str, dict[int, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "worker_model_batch_fastest_seconds":
                size = int(sample.labels.get("batch_size", "0") or 0)
                fastest.setdefault(sample.labels["model"], {})[size] = sample.value
            elif sample.name == "worker_dispatches_by_place_total":
                if sample.labels.get("place") == "inline":
                    out["inline"] = sample.value
            elif "model" not in sample.labels:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out, fastest


async def _counters(client: Any, metrics_url: str) -> _Counters:
    metrics, fastest = await asyncio.to_thread(_metrics, metrics_url)
    status = await client.control_status(timeout=30)
    return _Counters(
        loads=metrics.get("worker_weight_loads_total", 0.0),
        load_seconds=metrics.get("worker_weight_load_seconds_total", 0.0),
        inline=metrics.get("inline", 0.0),
        models={
            m.name: (m.total_compute_seconds, m.dispatch_count, m.requests_served)
            for m in status.models
        },
        fastest=fastest,
    )


def _in_turn(
    final: _Counters, probes: Sequence[ModelProbe], runs: Mapping[str, Mapping[int, list[float]]]
) -> tuple[dict[str, dict[int, float]], dict[str, dict[int, float]], tuple[float, ...]]:
    """Each model's costs: the worker's learned (fastest) one per size -- its weights hot in
    the caches -- and a plan's, the mean of its executions in turn over the catalog
    (``runs``; the fastest where a size has no clean sample), with every execution over
    its mean, sorted: the executions' spread."""
    fastest = {
        p.name: {s: t for s, t in sorted(final.fastest.get(p.name, {}).items()) if t > 0}
        for p in probes
    }
    fastest = {name: c for name, c in fastest.items() if c}
    costs: dict[str, dict[int, float]] = {}
    spread: list[float] = []
    for name, table in fastest.items():
        costs[name] = {}
        for size, quickest in table.items():
            seen = runs.get(name, {}).get(size, [])
            mean = statistics.fmean(seen) if seen else quickest
            costs[name][size] = mean
            spread += [x / mean for x in seen]
    return fastest, costs, tuple(sorted(spread))


def wake_split(alone: float, many: float) -> tuple[float, float]:
    """CPU per request measured one at a time and with many in flight -> (per request with
    many in flight, the wake-up's more for one that finds the loop idle), never negative."""
    many = min(alone, many)
    return many, alone - many


def in_turn_order(probes: Sequence[ModelProbe], rng: random.Random) -> list[ModelProbe]:
    """One round in turn over the catalog: every model once, in an order of its own. Live
    traffic visits the catalog in no fixed order; a fixed cycle evicts in a fixed pattern,
    and on the CPU backend the catalog's own cycle of 4.4 and 17.1 MB models gave every
    other 17 MB load fresh pages from the allocator (8.97 ms at the median against 3.6-3.8
    ms in a shuffled order, 2026-12-02)."""
    out = list(probes)
    rng.shuffle(out)
    return out


def width_from_stretch(stretch: float, cores: float, spinners: int) -> float:
    """The width ``w`` (cores) of an execution that, in the host model, takes ``stretch``
    times as long beside ``spinners`` always-runnable threads on ``cores`` cores as it does
    alone: its work is ``w x`` its idle time, done at the share
    :func:`~reactantserver.fleet.host.share_rates` gives it, so ``w / rate(w) =
    stretch``: the widest that does (a job narrower than its share is not stretched at
    all, so a stretch of 1 says only that it fits in the share). Bisection over
    ``(0, cores]``; a stretch beyond the model's reach gives ``cores``."""
    from ..fleet.host import share_rates

    def ratio(w: float) -> float:
        return w / share_rates([w], cores, float(spinners))[0]

    stretch = max(1.0, stretch)
    lo, hi = 0.0, float(cores)
    if stretch >= ratio(hi):
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        if ratio(mid) <= stretch:
            lo = mid
        else:
            hi = mid
    return lo


def _fitting(
    probes: Sequence[ModelProbe],
    fastest: Mapping[str, Mapping[int, float]],
    nbytes: Mapping[str, int],
    budget: int,
) -> list[ModelProbe]:
    """The models, cheapest first, that fit the weight budget together (0: every one)."""
    out: list[ModelProbe] = []
    held = 0
    ranked = sorted(
        (p for p in probes if p.name in fastest),
        key=lambda p: (fastest[p.name][min(fastest[p.name])], p.name),
    )
    for p in ranked:
        b = nbytes.get(p.name, 0)
        if budget <= 0 or held + b <= budget:
            out.append(p)
            held += b
    return out or ranked[:1]


async def _stretch(
    client: Any,
    metrics_url: str,
    probes: Sequence[ModelProbe],
    spinners: int,
    seconds: float,
    pairs: int = 5,
) -> float:
    """Mean execution of one-row requests in turn over ``probes`` beside ``spinners``
    spinning processes over the mean of the same alone, each run ``seconds`` long: the
    median of ``pairs`` such pairs, one after the other. One pair alone is not enough: on
    the 2-core machine one in six took 1.9x where the others took 1.1-1.3x (2026-12-02),
    and a plan made from the 1.9 was a third short of three workers' requests/s."""
    ones = [(p.name, dict(p.inputs(1))) for p in probes]
    for name, inputs in ones:  # load them, so that no run below waits for weights
        await client.infer(name, inputs)

    async def run() -> float:
        before = await _counters(client, metrics_url)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for name, inputs in ones:
                await client.infer(name, inputs)
        after = await _counters(client, metrics_url)
        compute = sum(after.models[n][0] - before.models[n][0] for n, _ in ones)
        dispatches = sum(after.models[n][1] - before.models[n][1] for n, _ in ones)
        return compute / dispatches if dispatches else 0.0

    stretches: list[float] = []
    for _ in range(max(1, pairs)):
        alone = await run()
        # Off the loop: it returns once every spinner spins.
        procs = await asyncio.to_thread(cpu.start_spinners, spinners, seconds + 0.5)
        try:
            beside = await run()
        finally:
            for proc in procs:
                await asyncio.to_thread(proc.communicate)  # off the loop: it waits for the exit
        if alone > 0 and beside > 0:
            stretches.append(beside / alone)
    return statistics.median(stretches) if stretches else 0.0


#: What the worker's scheduler runs inline on its loop on the CPU backend (its default
#: ``scheduler.inline_max_seconds``; calibrate's worker keeps it).
CPU_INLINE_SECONDS = 1e-4


async def measure_worker(
    url: str,
    metrics_url: str,
    pid: int,
    probes: Sequence[ModelProbe],
    *,
    passes: int = 3,
    repeats: int = 3,
    rounds: int = 3,
    requests: int = 600,
    compact: bool = True,
    contended_seconds: float = 0.5,
    seed: int = 0,
    cores: float = 0.0,
    cores_busy: float = 0.0,
    background_threads: float = 0.0,
    backend: str = "cpu",
    source: str = "",
) -> WorkerMeasurement:
    """Calibrate the worker at ``url`` (admin ``metrics_url``, process ``pid``): see the
    module docstring, steps 1-4. ``compact``: empty the weight cache (CompactMemory)
    before each model's first request of a pass, so that it is a cold load whatever the
    budget."""
    from ..client import AsyncClient

    async with AsyncClient(url, timeout=120) as client:
        status = await client.control_status(timeout=30)
        nbytes = {m.name: m.weight_nbytes for m in status.models}
        loads: dict[str, list[float]] = {}
        load_cpu = load_busy = 0.0  # other-thread CPU and load seconds over the samples
        for _ in range(passes):
            for probe in probes:
                if compact:
                    await client.compact_memory()
                before = await _counters(client, metrics_url)
                t0 = cpu.thread_times(pid)
                await client.infer(probe.name, dict(probe.inputs(1)))
                t1 = cpu.thread_times(pid)
                after = await _counters(client, metrics_url)
                if after.loads - before.loads == 1:
                    seconds = after.load_seconds - before.load_seconds
                    loads.setdefault(probe.name, []).append(seconds)
                    compute = after.models[probe.name][0] - before.models[probe.name][0]
                    # Its execution ran at the same time as nothing else: the rest of the
                    # other threads' CPU in that request was the copy.
                    load_cpu += max(0.0, (t1 - t0).others - compute)
                    load_busy += seconds
                for rows in probe.batch_sizes:
                    for _ in range(repeats):
                        await client.infer(probe.name, dict(probe.inputs(rows)))
        # Executions in turn over the catalog (module docstring, step 1), each request
        # between two looks at the counters: its execution, and its load if it made one.
        runs: dict[str, dict[int, list[float]]] = {}
        churn: list[tuple[int, float]] = []
        before = await _counters(client, metrics_url)
        order = random.Random(seed)
        for rows in sorted({s for p in probes for s in p.batch_sizes}):
            sized = [p for p in probes if rows in p.batch_sizes]
            for _ in range(rounds):
                for probe in in_turn_order(sized, order):
                    await client.infer(probe.name, dict(probe.inputs(rows)))
                    after = await _counters(client, metrics_url)
                    seconds = after.models[probe.name][0] - before.models[probe.name][0]
                    dispatches = after.models[probe.name][1] - before.models[probe.name][1]
                    if dispatches == 1 and seconds > 0:
                        runs.setdefault(probe.name, {}).setdefault(rows, []).append(seconds)
                    if after.loads - before.loads == 1:
                        churn.append(
                            (nbytes.get(probe.name, 0), after.load_seconds - before.load_seconds)
                        )
                    before = after
        final = await _counters(client, metrics_url)
        fastest, costs, execution_spread = _in_turn(final, probes, runs)
        # Step 2: the cheapest model (loaded by its first request below), one request at
        # a time: each its own execution and its own wake-ups, as requests arriving
        # through a gateway mostly are.
        hot = min(
            (p for p in probes if p.name in fastest),
            key=lambda p: fastest[p.name][min(fastest[p.name])],
        )
        one = dict(hot.inputs(1))
        await client.infer(hot.name, one)
        trips: list[float] = []
        c0 = await _counters(client, metrics_url)
        t0 = cpu.thread_times(pid)
        own0 = time.process_time()
        wall0 = time.perf_counter()
        for _ in range(requests):
            s = time.perf_counter()
            await client.infer(hot.name, one)
            trips.append(time.perf_counter() - s)
        wall = time.perf_counter() - wall0
        own = time.process_time() - own0
        t1 = cpu.thread_times(pid)
        c1 = await _counters(client, metrics_url)
        # Step 3: executions in turn over models that fit together, alone and beside a
        # spinning process on every core but one.
        stretch = 0.0
        spinning = int(cores) - 1
        # Only where the execution is host work at all: the other threads burned a tenth
        # of a core or more per second of execution in step 2 (not a GPU's).
        ran = c1.models[hot.name][0] - c0.models[hot.name][0]
        host_work = ran > 0 and (t1 - t0).others >= 0.1 * ran
        if contended_seconds > 0 and spinning >= 1 and host_work and cpu.available():
            budget = int(status.weight_cache_max_bytes)
            stretch = await _stretch(
                client, metrics_url, _fitting(probes, fastest, nbytes, budget), spinning,
                contended_seconds,
            )  # fmt: skip
    compute = c1.models[hot.name][0] - c0.models[hot.name][0]
    executions = c1.models[hot.name][1] - c0.models[hot.name][1]
    served = c1.models[hot.name][2] - c0.models[hot.name][2]
    inline = c1.inline - c0.inline
    d = t1 - t0
    main, others = d.main, d.others
    if inline > 0 and executions > 0:
        # Inline executions ran on the loop: their time is the execution's, not the RPC's.
        main -= compute * min(1.0, inline / executions)
    request_seconds = max(0.0, main) / served if served else 0.0
    ceiling = cores if cores > 0 else 64.0
    # Step 2's repeats of one model run it hot: its fastest is what they each took.
    fastest_one = fastest[hot.name][min(fastest[hot.name])]
    threaded = executions - min(inline, executions)
    # What the other threads burn per second of execution at idle: XLA's pool spins
    # while it waits, so this is what they take when the cores are free, not what an
    # execution needs; the stretch beside spinners says that (where it was measured).
    idle_threads = min(
        ceiling, others / (threaded * fastest_one) if threaded > 0 and fastest_one > 0 else 0.0
    )
    execution_threads = idle_threads
    if stretch > 0 and idle_threads > 0:
        execution_threads = width_from_stretch(stretch, cores, spinning)
    # Loads as traffic makes them -- evicting others as they go, in turn over the catalog --
    # where the catalog is larger than the budget; else the cold loads after a compaction.
    samples = tuple(churn) or tuple(
        (nbytes.get(n, 0), t) for n, v in sorted(loads.items()) for t in v
    )
    latency, per_byte = (
        fit_line([b for b, _ in samples], [t for _, t in samples]) if samples else (0.0, 0.0)
    )
    if per_byte <= 0 and samples:  # every model one size, or noise: through the origin
        latency, per_byte = 0.0, sum(t for _, t in samples) / max(1, sum(b for b, _ in samples))
    latency = max(0.0, latency)
    load_spread = tuple(sorted(t / fit for b, t in samples if (fit := latency + b * per_byte) > 0))
    load_threads = 0.0
    if load_busy > 0:
        load_threads = load_cpu / load_busy
    round_trip = statistics.fmean(trips) if trips else 0.0
    rest = round_trip - own / requests - request_seconds - fastest_one
    return WorkerMeasurement(
        costs=Costs(
            backend=backend,
            source=source,
            models={
                p.name: ModelCosts(
                    name=p.name, costs=costs[p.name], weight_bytes=nbytes.get(p.name, 0)
                )
                for p in probes
                if p.name in costs
            },
            load_latency=latency,
            load_bandwidth=1.0 / per_byte if per_byte > 0 else 10e9,
            load_spread=load_spread,
            execution_spread=execution_spread,
            host=HostCosts(
                request_seconds=request_seconds,
                batch_seconds=0.0,
                execution_threads=min(ceiling, execution_threads),
                load_threads=min(1.0, load_threads),
                inline_seconds=CPU_INLINE_SECONDS if backend == "cpu" else 0.0,
            ),
            cores=cores,
            cores_busy=cores_busy,
            background_threads=background_threads,
            network_seconds=max(0.0, rest / 2),
        ),
        load_samples=samples,
        execution_samples={m: {r: tuple(v) for r, v in t.items()} for m, t in runs.items()},
        runs=((served, executions, d.main, others, compute, wall, own),),
        round_trip=round_trip,
        idle_execution_threads=idle_threads,
        stretch=stretch,
    )


async def measure_gateway(
    url: str,
    pid: int,
    probe: ModelProbe,
    worker: WorkerMeasurement,
    *,
    requests: int = 600,
    concurrency: int = 16,
) -> GatewayMeasurement:
    """The gateway at ``url`` (process ``pid``) in front of the worker ``worker`` measured:
    its CPU per request over ``requests`` one-row requests one at a time, and the rest of
    the round trip -- less this process's CPU, the gateway's, the worker's main thread's
    and the execution, halved -- the one-way delay of the path a fleet's clients take;
    then its CPU per request over as many with ``concurrency`` in flight (step 5 of the
    module docstring)."""
    from ..client import AsyncClient

    async with AsyncClient(url, timeout=120) as client:
        one = dict(probe.inputs(1))
        await client.infer(probe.name, one)
        trips: list[float] = []
        own0 = time.process_time()
        g0 = cpu.thread_times(pid)
        for _ in range(requests):
            s = time.perf_counter()
            await client.infer(probe.name, one)
            trips.append(time.perf_counter() - s)
        g1 = cpu.thread_times(pid)
        own = (time.process_time() - own0) / requests

        async def chain(n: int) -> None:
            for _ in range(n):
                await client.infer(probe.name, one)

        per = max(1, requests // max(1, concurrency))
        g2 = cpu.thread_times(pid)
        await asyncio.gather(*(chain(per) for _ in range(concurrency)))
        g3 = cpu.thread_times(pid)
    alone = (g1 - g0).total / requests
    many, wake = wake_split(alone, (g3 - g2).total / (per * concurrency))
    round_trip = statistics.fmean(trips)
    host = worker.costs.host
    model = worker.costs.models.get(probe.name)
    execution = model.costs[min(model.costs)] if model is not None else 0.0
    beside = own + alone + host.request_seconds + execution
    return GatewayMeasurement(
        gateway_seconds=many,
        wake_seconds=wake,
        requests=requests,
        round_trip=round_trip,
        network_seconds=max(0.0, (round_trip - beside) / 2),
    )


# ------------------------------------------------------------------------------ the command


def probes_for(repo: Path) -> tuple[list[ModelProbe], list[str], int]:
    """A probe per model bundle of ``repo`` (zeros of each input's dtype and shape), the
    bundles skipped and why, and the catalog's weight bytes."""
    from ..bundle.repository import scan_repository

    # The operator named these bundles (calibrate links one into a repository of its own).
    scan = scan_repository(repo, follow_symlinks=True)
    probes: list[ModelProbe] = []
    skipped = [f"{name}: {err.detail}" for name, err in sorted(scan.errors.items())]
    total = 0
    for name, bundle in sorted(scan.bundles.items()):
        if bundle.is_meta:
            skipped.append(f"{name}: a meta model (its cost is its sub-calls')")
            continue
        specs = bundle.client_inputs
        if any(s.datatype == "BYTES" for s in specs):
            skipped.append(f"{name}: BYTES inputs (no generic request to send)")
            continue
        sizes = bundle.compiled_batch_sizes or (1,)
        total += bundle.weights_nbytes

        def inputs(
            rows: int, specs: Any = specs, batched: bool = bundle.batched
        ) -> dict[str, np.ndarray]:
            out = {}
            for s in specs:
                shape = s.with_batch(rows) if batched else s.shape
                out[s.name] = np.zeros([max(1, d) for d in shape], dtype=s.numpy_dtype)
            return out

        probes.append(ModelProbe(name=name, batch_sizes=tuple(sizes), inputs=inputs))
    return probes, skipped, total


NODE_YAML = """\
# Written by reactantserver calibrate: one worker on the repository to measure.
model_repo: {repo}
base_port: {port}
metrics_base_port: {metrics_port}
{gpus}workers:
  - name: calibrate
global:
  cache_dir: '{cache}'
  # The repository is calibrate's own: a link to the bundle the operator named.
  follow_symlinks: true
  model_control_mode: static
  runtime:
    backend: {backend}
{runtime}  scheduler:
    discipline: fifo
  endpoints:
    host: 127.0.0.1
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(
    bundle_dir: str,
    out: str,
    *,
    backend: str = "cpu",
    through_gateway: bool = False,
    requests: int = 600,
    cache_dir: str = "",
    startup_timeout: float = 900.0,
    echo: Callable[[str], None] = print,
) -> int:
    """The command line: start a worker on ``bundle_dir`` (a repository, or one bundle),
    measure it (and a gateway in front of it), write the costs file ``out``."""
    import os
    import subprocess
    import sys
    import tempfile

    from .costs import render_costs

    source = Path(bundle_dir).resolve()
    if not source.is_dir():
        echo(f"reactantserver calibrate: {bundle_dir}: not a directory")
        return 2
    with tempfile.TemporaryDirectory(prefix="rs_calibrate_") as tmp:
        work = Path(tmp)
        repo = source
        if (source / "manifest.yaml").is_file():  # one bundle: a repository of it alone
            repo = work / "repo"
            repo.mkdir()
            (repo / source.name).symlink_to(source)
        probes, skipped, total = probes_for(repo)
        for line in skipped:
            echo(f"skipped {line}")
        if not probes:
            echo(f"reactantserver calibrate: {bundle_dir}: no model bundle to measure")
            return 1
        port, metrics_port = _free_port(), _free_port()
        # On the CPU the on-demand cache needs an arena: room for the whole catalog (the
        # calibration empties it itself, with CompactMemory, before each cold load).
        runtime = (
            f"    arena_bytes: {math.ceil(total * 1.25) + 64 * 2**20}\n"
            if backend == "cpu"
            else ("    allow_cpu_fallback: false\n")
        )
        node = work / "node.yaml"
        node.write_text(
            NODE_YAML.format(
                repo=repo, port=port, metrics_port=metrics_port, backend=backend,
                gpus="gpus: 0\n" if backend == "cpu" else "", runtime=runtime,
                cache=cache_dir or work / "cache",
            )
        )  # fmt: skip
        if cpu.available():
            idle = cpu.machine_busy(1.0)
            hungry, obtained = cpu.hungry_threads(1.0)
            echo(
                f"machine: {idle.cores} cores, {idle.busy:.2f} busy before the worker started; "
                f"{idle.cores} spinning processes got {obtained:.2f} cores: as if {hungry:.1f} "
                "threads of other processes always wanted one"
            )
        else:
            idle, hungry = cpu.MachineLoad(os.cpu_count() or 1, 0.0), 0.0
        log = work / "worker.log"
        env = dict(os.environ)
        if backend == "cpu":
            env.setdefault("JAX_PLATFORMS", "cpu")
        procs: list[subprocess.Popen[bytes]] = []
        try:
            with log.open("wb") as fh:
                worker = subprocess.Popen(
                    [sys.executable, "-m", "reactantserver.cli", "serve", str(node),
                     "--log-level", "warning"],
                    stdout=fh, stderr=subprocess.STDOUT, env=env,
                )  # fmt: skip
            procs.append(worker)
            url = f"127.0.0.1:{port}"
            _wait_ready(url, [p.name for p in probes], worker, log, startup_timeout)
            echo(f"worker ready: measuring {len(probes)} models")
            measured = asyncio.run(
                measure_worker(
                    url, f"http://127.0.0.1:{metrics_port}/metrics", worker.pid, probes,
                    requests=requests, cores=idle.cores, cores_busy=idle.busy,
                    background_threads=hungry, backend=backend,
                    source=f"calibrate {bundle_dir}",
                )
            )  # fmt: skip
            costs = measured.costs
            if through_gateway:
                gw = _through_gateway(work, url, probes, measured, procs, env, requests,
                                      startup_timeout)  # fmt: skip
                costs = attrs.evolve(
                    costs,
                    gateway_seconds=gw.gateway_seconds,
                    gateway_wake_seconds=gw.wake_seconds,
                    network_seconds=gw.network_seconds,
                )
        finally:
            for proc in reversed(procs):
                _stop(proc)
        if not cpu.available():
            echo("host CPU not measured (no /proc): the plan will not model host contention")
        comment = (
            f"reactantserver calibrate {bundle_dir} ({backend}), {time.strftime('%Y-%m-%d %H:%M')}\n"
            f"{len(measured.load_samples)} cold loads, {requests} requests per host run"
        )
        if measured.stretch > 0:
            comment += (
                f"\nexecutions {measured.stretch:.2f}x as long with one core left to them: "
                f"execution_threads {costs.host.execution_threads:.2f} (their threads burn "
                f"{measured.idle_execution_threads:.2f} cores alone)"
            )
        text = render_costs(costs, comment)
        if out == "-":
            sys.stdout.write(text)
        else:
            Path(out).write_text(text)
            echo(f"wrote {out}")
    return 0


def _wait_ready(url: str, names: Sequence[str], proc: Any, log: Path, timeout: float) -> None:
    from ..client import Client

    deadline = time.monotonic() + timeout
    with Client(url, timeout=10) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the worker exited with status {proc.returncode}; its log:\n"
                    f"{log.read_text(errors='replace')[-3000:]}"
                )
            try:
                if all(client.is_model_ready(n) for n in names):
                    return
            except Exception:  # not listening yet
                pass
            time.sleep(0.2)
    raise RuntimeError(f"the worker was not ready after {timeout:g} s (log: {log})")


def _stop(proc: Any) -> None:
    import signal
    import subprocess

    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _through_gateway(
    work: Path,
    worker_url: str,
    probes: Sequence[ModelProbe],
    worker: WorkerMeasurement,
    procs: list[Any],
    env: Mapping[str, str],
    requests: int,
    timeout: float,
) -> GatewayMeasurement:
    """Start a gateway in front of the worker and measure its CPU per request."""
    import json
    import subprocess
    import sys

    port = _free_port()
    config = work / "gateway.yml"
    config.write_text(
        json.dumps(
            {
                "listen": {"grpc": f"127.0.0.1:{port}", "metrics": "127.0.0.1:0"},
                "endpoints": [worker_url],
                "health_interval_seconds": 1.0,
                "logging": {"level": "warning", "format": "text"},
            }
        )
    )
    log = work / "gateway.log"
    with log.open("wb") as fh:
        gateway = subprocess.Popen(
            [sys.executable, "-m", "reactantserver.cli", "gateway", str(config)],
            stdout=fh, stderr=subprocess.STDOUT, env=dict(env),
        )  # fmt: skip
    procs.append(gateway)
    url = f"127.0.0.1:{port}"
    _wait_ready(url, [p.name for p in probes], gateway, log, timeout)
    models = worker.costs.models
    hot = min(
        probes,
        key=lambda p: models[p.name].cost_per_request() if p.name in models else math.inf,
    )
    return asyncio.run(measure_gateway(url, gateway.pid, hot, worker, requests=requests))
