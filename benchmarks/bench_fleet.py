"""Fleet benchmark (issue 18): three CPU workers behind one gateway, round_robin against
lpt_packing on a catalog three times one worker's weight budget, and the fleet simulator's
prediction of both.

Setup. A catalog of ``--models`` MLP variants (``examples/build_repo.py``'s zoo ``mlp``,
seeded, widths alternating between ``--widths``: one export per width, the rest derived),
compiled at batch sizes 1, 2, 4, 8. Three workers (``reactantserver serve``, one process
each, ``fifo`` as lpt_packing requires, ``model_control_mode: static``) each get a weight
budget through ``runtime.arena_bytes``: the catalog's weight bytes over ``--budget-ratio``
(default 3). One gateway (``reactantserver gateway``) in front of them, started per mode.

Calibration (direct to the first worker, before any load): every model, cycled in order so
that the LRU cache misses on each first request, is sent one request of each compiled size.
The worker's ``worker_weight_load_seconds_total`` per cold load against the model's weight
bytes gives the transfer time per byte and per load (least squares); its
ModelControlStatus ``total_compute_seconds`` / ``dispatch_count`` deltas give each model's
cost at each batch size. Then a run of warm one-row requests to one resident model: the
worker process's CPU seconds (``bench_serve.process_cpu``) less the compute and load seconds
it reported, per request, is the worker's per-request CPU (decoding, encoding, its event
loop): the simulator runs it in series with execution (``FleetWorker.request_seconds``).

Load. ``--inflight`` closed-loop clients in this process (``tritonclient.grpc.aio``), each
sending one-row requests back to back to a model drawn from Zipf(``--zipf``) popularity.
Per mode: ``--warmup`` seconds unmeasured (lpt_packing: the operator ``Repack`` RPC half-way
through, after the gateway has measured the traffic), then a ``--seconds`` window. Reported
per mode: requests/s and p50/p99 of the requests inside the window, weight loads (delta of
the workers' ``worker_weight_loads_total``) per 1,000 requests, mean rows per execution
(ModelControlStatus ``rows_served`` / ``dispatch_count`` deltas).

Prediction. ``fleet.simulate_fleet`` gets the calibrated costs, the weight bytes
and budgets the workers reported, the fitted transfer time, the same popularity, in-flight
count and scheduling knobs, and the live run's schedule in virtual time (the same warm-up and
window; lpt_packing: the operator Repack at the same point of the warm-up, so its repack
cadence, counted in fleet compute seconds, runs as the live gateway's did). It prints its p50
and weight-load rate beside the measurement, and what each lpt_packing controller did
(repacks by trigger, models moved: GetSchedulingStatus at the start of the warm-up and at both
edges of the window, the Repack reply; the simulator's repack log). A load count is within
when the predicted loads over the window are within 25% of the live count or within one load
of it (``fleet_live.count_within``: a relative error of 0 live loads means nothing).
``--save FILE`` keeps what the live part measured; ``--replay FILE`` predicts it again
without starting a process.

    python benchmarks/bench_fleet.py                 (or: nox -s bench -- fleet; ~3 minutes)
    python benchmarks/bench_fleet.py --seconds 20 --runs 2 --workdir /tmp/fleet

On a small machine the client, the gateway and the three workers share the cores:
requests/s and latency are properties of the whole set; ratios side by side are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "examples"))

import build_repo  # noqa: E402
import tritonclient.grpc.aio as aioclient  # noqa: E402
from bench_gateway import start_gateway  # noqa: E402
from bench_serve import (  # noqa: E402
    CHANNEL_ARGS,
    Server,
    free_port,
    run_in_workdir,
    start_ours,
    wait_ready,
)
from fleet_live import (  # noqa: E402
    Control,
    Goals,
    ModelCounters,
    ModelDraw,
    Prediction,
    Window,
    WorkerCounters,
    affine_costs,
    control_lines,
    fit_line,
    live_table,
    popularity,
    prediction_table,
    window,
    window_from_json,
    window_to_json,
)
from grpclib.client import Channel  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from tritonclient.grpc import InferInput  # noqa: E402

from reactantserver.fleet.report import moved_models  # noqa: E402
from reactantserver.protocol import reactant_control as cpb  # noqa: E402

BATCH_SIZES = (1, 2, 4, 8)
FEATURES = 32  # the zoo mlp's input width
MODES = ("round_robin", "lpt_packing")
#: on-demand budget = floor(0.9 x arena) on the CPU (default fractions, no scratch).
ON_DEMAND_FRACTION = 0.9


# ------------------------------------------------------------------------------ catalog


def build_catalog(repo: Path, n: int, widths: Sequence[int]) -> list[str]:
    """``n`` seeded mlp variants, widths alternating over ``widths`` (one export each)."""
    planned = [
        build_repo.Planned(f"mlp_w{widths[i % len(widths)]}_{i:02d}", "mlp", 2000 + i,
                           widths[i % len(widths)])
        for i in range(n)
    ]  # fmt: skip
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    build_repo.build(repo, planned=planned, batch_sizes=lambda arch: BATCH_SIZES)
    return [p.name for p in planned]


# ------------------------------------------------------------------------------ workers


@contextlib.asynccontextmanager
async def control(server: Server) -> Any:
    channel = Channel("127.0.0.1", server.port)
    try:
        yield channel
    finally:
        channel.close()


async def model_status(server: Server) -> cpb.ModelControlStatusResponse:
    async with control(server) as channel:
        stub = cpb.ControlServiceStub(channel)
        return await stub.model_control_status(cpb.ModelControlStatusRequest(), timeout=30)


def _metrics(server: Server) -> dict[str, float]:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "model" not in sample.labels:
                out[sample.name] = sample.value
    return out


async def counters(server: Server) -> WorkerCounters:
    metrics = await asyncio.to_thread(_metrics, server)
    status = await model_status(server)
    return WorkerCounters(
        loads=metrics.get("worker_weight_loads_total", 0.0),
        load_seconds=metrics.get("worker_weight_load_seconds_total", 0.0),
        models={
            m.name: ModelCounters(
                m.total_compute_seconds, m.requests_served, m.dispatch_count, m.rows_served
            )
            for m in status.models
        },
    )


async def snapshot(workers: Mapping[str, Server]) -> dict[str, WorkerCounters]:
    values = await asyncio.gather(*(counters(s) for s in workers.values()))
    return dict(zip(workers, values, strict=True))


def features(rows: int, seed: int = 0) -> InferInput:
    x = np.random.default_rng(seed).standard_normal((rows, FEATURES)).astype(np.float32)
    inp = InferInput("features", [rows, FEATURES], "FP32")
    inp.set_data_from_numpy(x)
    return inp


@attrs.frozen
class Calibration:
    """What the first worker reported: costs per model and size, and load times."""

    costs: Mapping[str, Mapping[int, float]]
    nbytes: Mapping[str, int]
    budget: int
    #: Fitted load time: ``load_latency + bytes x seconds_per_byte``.
    seconds_per_byte: float
    load_latency: float
    #: The cold loads it was fitted on: (bytes, seconds).
    samples: tuple[tuple[int, float], ...]
    #: Median round trip of a warm one-row request minus its execution: the RPC path.
    rpc_overhead: float
    #: CPU seconds of the worker's main thread per warm one-row request: the part of the
    #: RPC path spent on the worker (its event loops: HTTP/2, decoding, the dispatch
    #: decision, encoding), serial with its executions.
    request_cpu: float = 0.0


def main_thread_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid``'s main thread (Linux: its id is the pid)."""
    for thread in psutil.Process(pid).threads():
        if thread.id == pid:
            return thread.user_time + thread.system_time
    raise RuntimeError(f"process {pid} has no main thread")


async def calibrate(
    server: Server, names: Sequence[str], passes: int = 2, cpu_requests: int = 300
) -> Calibration:
    client = aioclient.InferenceServerClient(server.url, channel_args=CHANNEL_ARGS)
    status = await model_status(server)
    nbytes = {m.name: m.weight_nbytes for m in status.models}
    samples: list[tuple[int, float]] = []
    points: dict[str, dict[int, list[float]]] = {n: {} for n in names}
    overheads: list[float] = []
    try:
        for _ in range(passes):
            for name in names:
                before = await counters(server)
                await client.infer(name, [features(1)])
                after = await counters(server)
                if after.loads - before.loads == 1:  # exactly one cold load: a clean sample
                    samples.append((nbytes[name], after.load_seconds - before.load_seconds))
                for rows in BATCH_SIZES:
                    for _ in range(2):
                        t0 = time.perf_counter()
                        await client.infer(name, [features(rows)])
                        took = time.perf_counter() - t0
                        done = await counters(server)
                        s, e = after.models[name], done.models[name]
                        if e.dispatches - s.dispatches == 1:
                            cost = e.compute_seconds - s.compute_seconds
                            points[name].setdefault(rows, []).append(cost)
                            if rows == 1 and done.loads == after.loads:
                                overheads.append(took - cost)
                        after = done
        # Per-request worker CPU: back-to-back warm requests to the last model calibrated
        # (resident), the CPU of the worker's main thread -- its event loops, where the
        # whole RPC path runs. Executions of these models (over 100 us each) run on the
        # device thread and XLA's pool, whose CPU is the compute, not the request path:
        # the process's CPU minus the compute's wall time counted XLA's second core as
        # per-request CPU (1.2 ms per request, against about 0.3 ms on the main thread).
        hot = names[-1]
        await client.infer(hot, [features(1)])
        cpu0 = main_thread_cpu(server.proc.pid)
        for _ in range(cpu_requests):
            await client.infer(hot, [features(1)])
        request_cpu = (main_thread_cpu(server.proc.pid) - cpu0) / cpu_requests
    finally:
        await client.close()
    if not samples:
        raise RuntimeError("no clean cold load seen: is the budget smaller than the catalog?")
    latency, per_byte = fit_line([b for b, _ in samples], [s for _, s in samples])
    costs = {
        name: affine_costs({r: statistics.median(v) for r, v in by.items()}, BATCH_SIZES)
        for name, by in points.items()
    }
    return Calibration(
        costs,
        nbytes,
        status.weight_cache_max_bytes,
        per_byte,
        max(0.0, latency),
        tuple(samples),
        statistics.median(overheads),
        request_cpu,
    )


# ------------------------------------------------------------------------------ load


async def scheduling_status(gateway: Server) -> cpb.GetSchedulingStatusResponse:
    async with control(gateway) as channel:
        stub = cpb.GatewayControlServiceStub(channel)
        return await stub.get_scheduling_status(cpb.GetSchedulingStatusRequest(), timeout=30)


def placement_of(status: cpb.GetSchedulingStatusResponse) -> dict[str, tuple[str, ...]]:
    """Model -> the workers it is placed on, from GetSchedulingStatus."""
    return {m.name: tuple(sorted(m.workers)) for m in status.models if m.workers}


async def run_mode(
    mode: str,
    gateway: Server,
    workers: Mapping[str, Server],
    shares: Mapping[str, float],
    args: argparse.Namespace,
) -> tuple[Window, str]:
    """Warm up, (lpt_packing) repack half-way, then measure one window through ``gateway``.
    Under lpt_packing, GetSchedulingStatus at the start of the warm-up and at both edges of
    the window says what the controller did (:class:`fleet_live.Control`)."""
    client = aioclient.InferenceServerClient(gateway.url, channel_args=CHANNEL_ARGS)
    inp = features(1)
    loop = asyncio.get_running_loop()
    lpt = mode == "lpt_packing"
    begin = await scheduling_status(gateway) if lpt else None
    start = loop.time() + args.warmup
    end = start + args.seconds
    latencies: list[float] = []
    marks: dict[str, dict[str, WorkerCounters]] = {}
    statuses: dict[str, cpb.GetSchedulingStatusResponse] = {}
    placement = ""
    by_operator: tuple[str, ...] = ()

    async def one(seed: int) -> None:
        draw = ModelDraw(shares, seed)
        while (t0 := loop.time()) < end:
            await client.infer(draw(), [inp])
            t1 = loop.time()
            if t0 >= start and t1 <= end:
                latencies.append(t1 - t0)

    async def edge(name: str, at: float) -> None:
        await asyncio.sleep(max(0.0, at - loop.time()))
        marks[name] = await snapshot(workers)
        if lpt:
            statuses[name] = await scheduling_status(gateway)

    async def repack() -> None:
        nonlocal placement, by_operator
        await asyncio.sleep(args.warmup / 2)
        async with control(gateway) as channel:
            stub = cpb.GatewayControlServiceStub(channel)
            reply = await stub.repack(cpb.RepackRequest(wait_seconds=30), timeout=60)
            status = await stub.get_scheduling_status(cpb.GetSchedulingStatusRequest())
        placement = describe(reply, status)
        by_operator = tuple(sorted(reply.moved_models))

    tasks = [edge("start", start), edge("end", end), *(one(args.seed * 1000 + i)
             for i in range(args.inflight))]  # fmt: skip
    if lpt:
        tasks.append(repack())
    try:
        await asyncio.gather(*tasks)
    finally:
        await client.close()
    measured = window(mode, args.seconds, latencies, marks["start"], marks["end"])
    if begin is not None:
        at = {name: placement_of(st) for name, st in statuses.items()}
        measured = attrs.evolve(
            measured,
            control=Control(
                repacks={k: int(v) for k, v in statuses["end"].repacks.items()},
                moved_by_operator=by_operator,
                moved_in_warmup=moved_models(placement_of(begin), at["start"]),
                moved_in_window=moved_models(at["start"], at["end"]),
            ),
        )
    return measured, placement


def describe(reply: cpb.RepackResponse, status: cpb.GetSchedulingStatusResponse) -> str:
    lines = [
        f"Repack: completed={reply.completed} moved={len(reply.moved_models)} "
        f"warnings={list(reply.warnings)}; repacks so far {dict(status.repacks)}"
    ]
    for w in status.workers:
        lines.append(
            f"  {w.name or w.address}: {w.assigned_weight_bytes / 1e6:.1f} of "
            f"{w.weight_budget_bytes / 1e6:.1f} MB, load {w.compute_load:.2f}"
            f"{' OVERSUBSCRIBED' if w.oversubscribed else ''}: {' '.join(w.models)}"
        )
    return "\n".join(lines)


def scheduling(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """The gateway's ``scheduling:`` block for ``mode`` (the simulator gets the same)."""
    if mode != "lpt_packing":
        return {"mode": mode}
    return {
        "mode": mode,
        "rebalance_compute_seconds": args.rebalance,
        "first_rebalance_compute_seconds": args.first_rebalance,
        "hysteresis": 0.2,
    }


# ------------------------------------------------------------------------------ simulation


def predict(
    mode: str,
    cal: Calibration,
    shares: Mapping[str, float],
    args: argparse.Namespace,
    *,
    cost_scale: float = 1.0,
    load_scale: float = 1.0,
    round_trip: float = 0.0,
    request_seconds: float = 0.0,
) -> Prediction:
    """The simulator's run of ``mode`` on the calibrated fleet; execution costs and load
    times multiplied by ``cost_scale`` / ``load_scale`` (1: as measured on an idle worker);
    ``request_seconds`` of worker CPU per request in series with execution, ``round_trip``
    the rest of the RPC path (a delay beside the workers)."""
    from reactantserver.config import GatewaySchedulingConfig
    from reactantserver.fleet import ClosedLoop, FleetModel, FleetWorker, simulate_fleet

    models = [
        FleetModel(
            name=n,
            costs={size: c * cost_scale for size, c in cal.costs[n].items()},
            nbytes=cal.nbytes[n],
            rate=shares[n],
        )
        for n in sorted(shares)
    ]
    workers = [
        FleetWorker(
            name=f"w{i}",
            budget=cal.budget,
            bandwidth=1 / (cal.seconds_per_byte * load_scale),
            load_latency=cal.load_latency * load_scale,
            discipline="fifo",
            request_seconds=request_seconds,
        )
        for i in range(args.workers)
    ]
    knobs = {k: v for k, v in scheduling(mode, args).items() if k != "mode"}
    # The live run's schedule: the same warm-up and window, the operator Repack at the
    # same point of the warm-up (lpt_packing), the same knobs, on virtual time.
    lpt = mode == "lpt_packing"
    report = simulate_fleet(
        models,
        workers,
        GatewaySchedulingConfig(mode=mode, **knobs),  # type: ignore[arg-type]
        duration=args.warmup + args.seconds,
        warmup=args.warmup,
        seed=args.seed,
        closed_loop=ClosedLoop(clients=args.inflight),
        network_delay=round_trip / 2,
        operator_repacks=(args.warmup / 2,) if lpt else (),
    )
    control = None
    if lpt:
        control = Control(
            repacks=dict(report.repacks),
            moved_by_operator=tuple(
                sorted({m for e in report.repack_log if e.trigger == "operator" for m in e.moved})
            ),
            moved_in_warmup=report.moved_between(0.0, args.warmup),
            moved_in_window=report.moved_between(args.warmup, args.warmup + args.seconds),
        )
    return Prediction(
        mode=mode,
        rps=report.throughput,
        p50=report.p50,
        p99=report.p99,
        loads_per_second=report.loads_per_second,
        loads_per_1000=report.loads_per_1000,
        mean_batch_rows=report.mean_batch_rows,
        mean_load_seconds=report.mean_load_seconds,
        workers={w.name: (w.compute, w.request_cpu, w.models) for w in report.workers},
        window=report.window,
        weight_loads=report.weight_loads,
        control=control,
    )


# ------------------------------------------------------------------------------ main


async def _run(args: argparse.Namespace, workdir: Path) -> None:
    repo = workdir / "repo"
    started = time.monotonic()
    names = build_catalog(repo, args.models, args.widths)
    print(f"catalog built in {time.monotonic() - started:.0f} s", flush=True)
    from reactantserver.bundle import load_bundle

    total = sum(load_bundle(repo / n).weights_nbytes for n in names)
    budget = int(total / args.budget_ratio)
    arena = math.ceil(budget / ON_DEMAND_FRACTION)
    workers: dict[str, Server] = {}
    gateways: list[Server] = []
    try:
        for i in range(args.workers):
            workers[f"w{i}"] = start_ours(
                repo, workdir, cache_dir=workdir / "cache", discipline="fifo",
                runtime_extra=f"    arena_bytes: {arena}\n", metrics_port=free_port(),
            )  # fmt: skip
            # One at a time: the first fills the compilation cache the others hit.
            await wait_ready(workers[f"w{i}"], names, timeout=600)
        print(f"workers ready at {time.monotonic() - started:.0f} s", flush=True)
        cal = await calibrate(workers["w0"], names)
        shares = popularity(names, args.zipf, args.seed)
        print_setup(args, names, total, cal, shares)
        results: dict[str, list[Window]] = {m: [] for m in args.modes}
        for run in range(args.runs):
            for mode in args.modes:
                gateway = start_gateway(
                    list(workers.values()), workdir,
                    scheduling=scheduling(mode, args), health_interval_seconds=1.0,
                    worker_names=list(workers), startup_wait_seconds=60.0,
                )  # fmt: skip
                gateways.append(gateway)
                await wait_ready(gateway, names)
                measured, placement = await run_mode(mode, gateway, workers, shares, args)
                gateway.stop()
                results[mode].append(measured)
                print(f"run {run + 1} {mode}: {measured.rps:.1f} req/s", flush=True)
                if placement:
                    print(placement, flush=True)
    finally:
        for server in [*gateways, *workers.values()]:
            server.stop()
    if args.save:
        save(Path(args.save), cal, shares, results)
    report(args, results, cal, shares)


def save(
    path: Path,
    cal: Calibration,
    shares: Mapping[str, float],
    results: Mapping[str, Sequence[Window]],
) -> None:
    """What the live part measured, as JSON: ``--replay`` predicts it again without
    starting a process (to study the simulator on a recorded run)."""
    data = {
        "calibration": attrs.asdict(cal),
        "shares": dict(shares),
        "results": {m: [window_to_json(w) for w in ws] for m, ws in results.items()},
    }
    path.write_text(json.dumps(data))
    print(f"measurements saved to {path}", flush=True)


def load(path: Path) -> tuple[Calibration, dict[str, float], dict[str, list[Window]]]:
    data = json.loads(path.read_text())
    c = data["calibration"]
    cal = Calibration(
        costs={n: {int(k): v for k, v in by.items()} for n, by in c["costs"].items()},
        nbytes=c["nbytes"],
        budget=c["budget"],
        seconds_per_byte=c["seconds_per_byte"],
        load_latency=c["load_latency"],
        samples=tuple((b, s) for b, s in c["samples"]),
        rpc_overhead=c["rpc_overhead"],
        request_cpu=c["request_cpu"],
    )
    results = {m: [window_from_json(w) for w in ws] for m, ws in data["results"].items()}
    return cal, data["shares"], results


def print_setup(
    args: argparse.Namespace,
    names: Sequence[str],
    total: int,
    cal: Calibration,
    shares: Mapping[str, float],
) -> None:
    print(
        f"catalog: {len(names)} mlp variants, {total / 1e6:.1f} MB of weights = "
        f"{total / cal.budget:.2f}x one worker's budget ({cal.budget / 1e6:.1f} MB); "
        f"{args.workers} CPU workers (fifo), Zipf s={args.zipf:g}, {args.inflight} in flight"
    )
    print(
        f"calibration (worker w0, idle): a cold load takes {cal.load_latency * 1e3:.2f} ms + "
        f"{cal.seconds_per_byte * 1e9:.3f} ns/byte ({1 / cal.seconds_per_byte / 1e9:.2f} GB/s) "
        f"over {len(cal.samples)} loads; a warm one-row request's round trip is "
        f"{cal.rpc_overhead * 1e3:.2f} ms beyond its execution, of which the worker "
        f"spends {cal.request_cpu * 1e3:.2f} ms of CPU per request"
    )
    print(f"{'model':<14} {'share':>6} {'MB':>6}  cost ms at " + " ".join(
        f"{s:>5}" for s in BATCH_SIZES))  # fmt: skip
    for n in sorted(names, key=lambda n: -shares[n]):
        costs = " ".join(f"{cal.costs[n][s] * 1e3:>5.2f}" for s in BATCH_SIZES)
        print(f"{n:<14} {shares[n]:>6.1%} {cal.nbytes[n] / 1e6:>6.1f}  {'':>11} {costs}")
    print(flush=True)


def expected_compute(live: Window, cal: Calibration) -> float:
    """Device seconds the window's executions would have taken at the idle calibration:
    per model, its executions x the calibrated cost at its mean rows (on the line through
    the calibrated sizes)."""
    total = 0.0
    for name, (_, dispatches, rows) in live.per_model.items():
        if dispatches:
            intercept, slope = fit_line(list(cal.costs[name]), list(cal.costs[name].values()))
            total += dispatches * (intercept + slope * rows / dispatches)
    return total


def median_window(windows: Sequence[Window]) -> Window:
    """The run whose requests/s is the median (a real window, not a blend)."""
    ordered = sorted(windows, key=lambda w: w.rps)
    return ordered[(len(ordered) - 1) // 2]


def report(
    args: argparse.Namespace,
    results: Mapping[str, Sequence[Window]],
    cal: Calibration,
    shares: Mapping[str, float],
) -> None:
    load = os.getloadavg()
    where = (
        f"replayed from {args.replay}"
        if args.replay
        else f"{os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    print(f"\nlive: {args.seconds:g} s windows after {args.warmup:g} s warm-up, "
          f"{args.runs} run(s) per mode (median run shown); {where}")  # fmt: skip
    if args.runs > 1:
        for mode, ws in results.items():
            print(f"  {mode} req/s per run: " + ", ".join(f"{w.rps:.1f}" for w in ws))
    chosen = [median_window(results[m]) for m in args.modes]
    print(live_table(chosen))
    if len(chosen) == 2:
        for line in Goals.of(*chosen).lines():
            print(line)
    print()
    idle_pairs, live_pairs, delay_pairs = [], [], []
    for live in chosen:
        started = time.monotonic()
        idle = predict(live.mode, cal, shares, args)
        # The workers' own figures for this window: compute per execution and seconds per
        # weight load, as multiples of the idle calibration (the cores are shared).
        cost_scale = live.compute_seconds / expected_compute(live, cal)
        load_scale = (
            (live.load_seconds / live.loads) / idle.mean_load_seconds
            if live.loads and idle.mean_load_seconds > 0
            else cost_scale
        )
        # The RPC path (client, gateway, worker) is CPU work on the same shared cores, each
        # part stretched like an execution: the worker's own per-request CPU in series with
        # its executions, the rest of the idle round trip as a delay beside them.
        request_seconds = cal.request_cpu * cost_scale if args.request_cpu else 0.0
        round_trip = (
            max(0.0, cal.rpc_overhead * cost_scale - request_seconds) if args.rpc_delay else 0.0
        )
        under_load = predict(
            live.mode, cal, shares, args, cost_scale=cost_scale, load_scale=load_scale,
            round_trip=round_trip, request_seconds=request_seconds,
        )  # fmt: skip
        print(
            f"({live.mode}: simulated twice in {time.monotonic() - started:.1f} s; under load "
            f"an execution took {cost_scale:.2f}x its idle cost, a weight load "
            f"{load_scale:.2f}x its idle time; simulated worker CPU per request "
            f"{request_seconds * 1e3:.2f} ms, rest of the round trip {round_trip * 1e3:.2f} ms)"
        )
        idle_pairs.append((live, idle))
        live_pairs.append((live, under_load))
        if request_seconds > 0:
            # The same, with the whole RPC path as a delay beside the workers (no worker
            # CPU per request): what the per-request CPU changes, side by side.
            delay_pairs.append((live, predict(
                live.mode, cal, shares, args, cost_scale=cost_scale, load_scale=load_scale,
                round_trip=cal.rpc_overhead * cost_scale if args.rpc_delay else 0.0,
            )))  # fmt: skip
    print(
        f"simulator: {args.workers} workers, {args.inflight} closed-loop clients, the live "
        f"schedule in virtual time: a {args.seconds:g} s window after {args.warmup:g} s of "
        f"warm-up (lpt_packing: the operator Repack at {args.warmup / 2:g} s)"
    )
    lines = control_lines(live_pairs)
    if lines:
        print("what the lpt_packing controllers did, live and simulated (whole run):")
        for line in lines:
            print("  " + line)
    for live, sim in live_pairs:
        print(f"{live.mode}: compute fraction of each worker, live | simulated "
              "+ simulated request CPU (its models)")  # fmt: skip
        for (name, seconds), (sname, (busy, cpu, models)) in zip(
            sorted(live.worker_compute.items()), sorted(sim.workers.items()), strict=False
        ):
            print(f"  {name} {seconds / live.seconds:5.1%} | {sname} {busy:5.1%} + {cpu:5.1%} "
                  f"({' '.join(models)})")  # fmt: skip
    print("\nfed the idle calibration:")
    print(prediction_table(idle_pairs, 0.25))
    print("\nfed the costs the workers reported in the live window (the goal: within 25%):")
    print(prediction_table(live_pairs, 0.25))
    if delay_pairs:
        print("\nthe same without the workers' per-request CPU (the whole RPC path a delay):")
        print(prediction_table(delay_pairs, 0.25))
    print()
    print("per model, live (round_robin | lpt_packing): share, executions, rows/execution, "
          "cost ms per execution, workers")  # fmt: skip
    for n in sorted(shares, key=lambda n: -shares[n]):
        cells = []
        for w in chosen:
            c, d, r = w.per_model.get(n, (0.0, 0, 0))
            cells.append(
                f"{d:>5} {r / d if d else 0:>4.2f} {c / d * 1e3 if d else 0:>5.2f} "
                f"{','.join(w.model_workers.get(n, ())):<8}"
            )
        print(f"{n:<14} {shares[n]:>6.1%} | " + " | ".join(cells))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=12, help="catalog size")
    parser.add_argument("--widths", type=int, nargs="+", default=[1024, 2048],
                        help="mlp hidden widths, alternating (2048: 16.9 MB of weights)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--budget-ratio", type=float, default=3.0,
                        help="catalog weight bytes / one worker's budget")  # fmt: skip
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of popularity")
    parser.add_argument("--inflight", type=int, default=16, help="closed-loop clients")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured window per mode")
    parser.add_argument("--warmup", type=float, default=8.0, help="unmeasured lead-in per mode")
    parser.add_argument("--runs", type=int, default=1, help="windows per mode, alternating")
    parser.add_argument("--rebalance", type=float, default=60.0,
                        help="lpt_packing rebalance_compute_seconds (the bench repacks itself)")  # fmt: skip
    parser.add_argument("--first-rebalance", type=float, default=2.0,
                        help="lpt_packing first_rebalance_compute_seconds")  # fmt: skip
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--no-rpc-delay", dest="rpc_delay", action="store_false",
                        help="do not give the simulator the measured RPC round trip")  # fmt: skip
    parser.add_argument("--no-request-cpu", dest="request_cpu", action="store_false",
                        help="do not charge the workers the measured per-request CPU")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", help="keep the repository, caches and logs here")
    parser.add_argument("--save", help="write what the live part measured to this JSON file")
    parser.add_argument("--replay", help="predict a --save file again (no live run; give "
                        "the same --seconds, --warmup and knobs as the recorded run)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.replay:
        cal, shares, results = load(Path(args.replay))
        args.modes = [m for m in args.modes if m in results]
        args.runs = len(next(iter(results.values())))
        report(args, results, cal, shares)
        return
    run_in_workdir(args.workdir, "rs_bench_fleet_", partial(_run, args))


if __name__ == "__main__":
    main()
