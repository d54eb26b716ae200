"""Plan benchmark (issue 45): does a plan made from idle calibration hold on a live fleet?

Setup (as ``bench_fleet.py``): a catalog of ``--models`` mlp variants, widths alternating
over ``--widths``, compiled at 1, 2, 4, 8, whose weights are ``--budget-ratio`` x one worker's
on-demand budget; ``max(--fleets)`` CPU workers (``fifo``), each its own process. For each
fleet size k of ``--fleets`` and each traffic mix of ``--mixes`` (``zipf``: Zipf(1)
popularity, ranks shuffled; ``uniform``: every model alike), a gateway in ``lpt_packing``
mode in front of the first k workers, ``--inflight`` closed-loop clients in this process
(``tritonclient.grpc.aio``), ``--warmup`` seconds (the operator Repack half-way), then a
``--seconds`` window: p50, p99 and requests/s of the requests inside it.

Calibration, idle, before any load, with the planner's own code: ``planning.calibrate``'s
``measure_worker`` on the first worker (costs per model and size, load time, the worker's
host CPU per request and per execution, its other threads' cores per execution and per
load, the machine's busy cores), ``measure_gateway`` through a gateway in front of it, and
this process's own CPU per request (the load generator shares the machine).

Prediction: ``reactantserver plan``'s evaluation of each fleet size (``planning.plan``) on
that calibration only -- the fleet simulator with the host-contention model: every worker,
the gateway and the load generator on one host of this machine's cores -- printed beside
the measurement.

    python benchmarks/bench_plan.py            (or: nox -s bench -- plan; ~6 minutes)
    python benchmarks/bench_plan.py --save run.json ; python benchmarks/bench_plan.py --replay run.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "examples"))

import tritonclient.grpc.aio as aioclient  # noqa: E402
from bench_fleet import (  # noqa: E402
    BATCH_SIZES,
    FEATURES,
    ON_DEMAND_FRACTION,
    build_catalog,
    features,
    run_mode,
)
from bench_gateway import start_gateway  # noqa: E402
from bench_serve import (  # noqa: E402
    CHANNEL_ARGS,
    Server,
    free_port,
    run_in_workdir,
    wait_ready,
)
from fleet_live import Window, popularity, window_from_json, window_to_json  # noqa: E402

from reactantserver.planning import cpu  # noqa: E402
from reactantserver.planning.calibrate import (  # noqa: E402
    ModelProbe,
    measure_gateway,
    measure_worker,
    wake_split,
)
from reactantserver.planning.costs import Costs, costs_from_data, render_costs  # noqa: E402
from reactantserver.planning.device import Device  # noqa: E402
from reactantserver.planning.fleet import FleetOutcome, Goal, Run, evaluate  # noqa: E402
from reactantserver.planning.plan import Plan, make_plan, render_plan  # noqa: E402
from reactantserver.planning.traffic import ModelTraffic, Traffic  # noqa: E402

MIXES = ("zipf", "uniform")


def shares_of(mix: str, names: Sequence[str], seed: int) -> dict[str, float]:
    if mix == "zipf":
        return popularity(names, 1.0, seed)
    return {n: 1.0 / len(names) for n in names}


def probe(name: str) -> ModelProbe:
    def inputs(rows: int) -> dict[str, np.ndarray]:
        x = np.random.default_rng(0).standard_normal((rows, FEATURES)).astype(np.float32)
        return {"features": x}

    return ModelProbe(name=name, batch_sizes=BATCH_SIZES, inputs=inputs)


@attrs.frozen
class ClientCost:
    """This process's CPU per request through a gateway at idle, and the round trip."""

    seconds: float
    round_trip: float


async def client_cost(gateway: Server, model: str, requests: int, concurrency: int) -> ClientCost:
    client = aioclient.InferenceServerClient(gateway.url, channel_args=CHANNEL_ARGS)
    inp = features(1)
    trips: list[float] = []
    try:
        await client.infer(model, [inp])
        per = requests // concurrency

        async def chain() -> None:
            for _ in range(per):
                t0 = time.perf_counter()
                await client.infer(model, [inp])
                trips.append(time.perf_counter() - t0)

        own0 = time.process_time()
        await asyncio.gather(*(chain() for _ in range(concurrency)))
        own = time.process_time() - own0
    finally:
        await client.close()
    return ClientCost(own / (per * concurrency), sum(trips) / len(trips))


# ------------------------------------------------------------------------------ workers

WORKER_YAML = """\
# Written by benchmarks/bench_plan.py: one worker serving the benchmark's catalog.
model_repo: {repo}
base_port: {port}
metrics_base_port: {metrics_port}
{gpus}workers:
  - name: bench
global:
  cache_dir: {cache}
  model_control_mode: static
  runtime:
    backend: {backend}
{runtime}  scheduler:
    discipline: fifo
  endpoints:
    host: 127.0.0.1
    max_concurrent_requests: 1024
"""


def start_worker(repo: Path, workdir: Path, backend: str, runtime: str) -> Server:
    """``reactantserver serve`` on a fresh node file (``runtime``: more lines of it)."""
    import subprocess

    port, metrics_port = free_port(), free_port()
    node = workdir / f"node_{port}.yaml"
    node.write_text(
        WORKER_YAML.format(
            repo=repo, port=port, metrics_port=metrics_port, cache=workdir / "cache",
            backend=backend, runtime=runtime, gpus="gpus: 0\n" if backend == "cpu" else "",
        )
    )  # fmt: skip
    log = workdir / f"worker_{port}.log"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"} if backend == "cpu" else dict(os.environ)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reactantserver.cli", "serve", str(node), "--log-level",
             "warning"],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    return Server("reactantserver", proc, port, log, metrics_port)


async def runtime_lines(
    args: argparse.Namespace, repo: Path, workdir: Path, names: Sequence[str], budget: int
) -> str:
    """The ``runtime:`` lines that give a worker an on-demand budget of ``budget`` bytes:
    the CPU's arena outright; on a GPU, the fraction of the device's arena (read from a
    first worker's /metrics) that leaves that budget after the wiggle room."""
    if args.backend == "cpu":
        return f"    arena_bytes: {math.ceil(budget / ON_DEMAND_FRACTION)}\n"
    probe_worker = start_worker(repo, workdir, "cuda", "    allow_cpu_fallback: false\n")
    try:
        await wait_ready(probe_worker, names, timeout=900)
        from reactantserver.planning.calibrate import _metrics

        metrics, _ = _metrics(f"http://127.0.0.1:{probe_worker.metrics_port}/metrics")
    finally:
        probe_worker.stop()
    arena = metrics["worker_weight_cache_arena_bytes"]
    fraction = budget / (ON_DEMAND_FRACTION * arena)
    return f"    allow_cpu_fallback: false\n    weight_cache_fraction: {fraction:.6g}\n"


# ------------------------------------------------------------------------------ the plan


def costs_of(record: Mapping[str, Any]) -> Costs:
    import tempfile

    from reactantserver.config.source import read_yaml

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "costs.yaml"
        path.write_text(record["costs"])
        data, lines = read_yaml(path)
    return costs_from_data(data, lines)


def question(
    record: Mapping[str, Any], mix: str, args: argparse.Namespace, background: float | None = None
) -> tuple[Traffic, Device, Run]:
    """The plan's inputs for one mix: the live run's closed loop, this machine as one host
    of every worker, the gateway and this process (the load generator)."""
    costs = costs_of(record)
    shares = shares_of(mix, record["names"], args.seed)
    traffic = Traffic(
        models={n: ModelTraffic(name=n, rate=s) for n, s in shares.items()},
        clients=args.inflight,
        generator_seconds=record["client_seconds"],
        generator_wake_seconds=record.get("client_wake_seconds", 0.0),
        source=f"bench_plan {mix}",
    )
    device = Device(
        name=f"{record.get('backend', 'cpu')} worker",
        weight_budget_bytes=record["budget"],
        devices_per_host=0,
        host_cores=costs.cores,
        host_background_threads=background,
        gateway_on_host=True,
        max_devices=max(args.fleets),
    )
    return traffic, device, Run(warmup=args.warmup, seconds=args.seconds, seed=args.seed)


def plan_for(record: Mapping[str, Any], mix: str, args: argparse.Namespace) -> tuple[Plan, float]:
    """The plan's answer for one mix, from the idle calibration: the goal is ``--p99-ms``,
    else set between the predicted p99 of the two largest fleets (their geometric mean),
    so that the question has an answer whose next-smaller fleet fails (one fleet size: a
    quarter above its predicted p99)."""
    costs = costs_of(record)
    traffic, device, run = question(record, mix, args)
    if args.p99_ms:
        goal = args.p99_ms / 1e3
    elif len(args.fleets) == 1:  # one fleet (the GPU's one worker): a quarter above its p99
        k = args.fleets[0]
        goal = 1.25 * evaluate(k, traffic, costs, device, Goal(p99=math.inf), run).p99
    else:
        big = sorted(args.fleets)[-2:]
        p99 = [evaluate(k, traffic, costs, device, Goal(p99=math.inf), run).p99 for k in big]
        goal = math.sqrt(p99[0] * p99[1])
    return make_plan(traffic, costs, device, Goal(p99=goal), run), goal


# ------------------------------------------------------------------------------ live


async def _run(args: argparse.Namespace, workdir: Path) -> None:
    repo = workdir / "repo"
    started = time.monotonic()
    names = build_catalog(repo, args.models, args.widths)
    from reactantserver.bundle import load_bundle

    total = sum(load_bundle(repo / n).weights_nbytes for n in names)
    budget = int(total / args.budget_ratio)
    workers: dict[str, Server] = {}
    servers: list[Server] = []
    record: dict[str, Any] = {
        "names": names, "total_bytes": total, "windows": {}, "backend": args.backend,
    }  # fmt: skip
    runtime = await runtime_lines(args, repo, workdir, names, budget)
    try:
        for i in range(max(args.fleets)):
            workers[f"w{i}"] = start_worker(repo, workdir, args.backend, runtime)
            await wait_ready(workers[f"w{i}"], names, timeout=900)
        servers.extend(workers.values())
        print(f"{len(workers)} workers ready at {time.monotonic() - started:.0f} s", flush=True)
        # Idle calibration, with nothing else of ours running.
        w0 = workers["w0"]
        idle = await asyncio.to_thread(cpu.machine_busy, 1.0)
        hungry, _ = await asyncio.to_thread(cpu.hungry_threads, 1.0)
        measured = await measure_worker(
            w0.url, f"http://127.0.0.1:{w0.metrics_port}/metrics", w0.proc.pid,
            [probe(n) for n in names], cores=idle.cores, cores_busy=idle.busy,
            background_threads=hungry, source="bench_plan: worker w0, idle",
            backend=args.backend,
        )  # fmt: skip
        gateway = start_gateway([w0], workdir, health_interval_seconds=1.0)
        servers.append(gateway)
        await wait_ready(gateway, names)
        hot = min(measured.costs.models, key=lambda n: measured.costs.models[n].costs[1])
        through = await measure_gateway(
            gateway.url, gateway.proc.pid, probe(hot), measured, concurrency=args.inflight
        )
        own = await client_cost(gateway, hot, 600, 1)
        own_many = await client_cost(gateway, hot, 640, args.inflight)
        gateway.stop()
        costs = attrs.evolve(
            measured.costs,
            gateway_seconds=through.gateway_seconds,
            gateway_wake_seconds=through.wake_seconds,
            network_seconds=through.network_seconds,
        )
        budget_seen = (await measured_budget(w0)) or budget
        client_seconds, client_wake = wake_split(own.seconds, own_many.seconds)
        record.update(
            costs=render_costs(costs), budget=budget_seen,
            client_seconds=client_seconds, client_wake_seconds=client_wake,
            calibrated=time.strftime("%Y-%m-%d %H:%M:%S"), idle_load=os.getloadavg()[0],
            load_samples=measured.load_samples, stretch=measured.stretch,
            idle_execution_threads=measured.idle_execution_threads,
            execution_samples={m: {str(r): v for r, v in t.items()}
                               for m, t in measured.execution_samples.items()},
        )  # fmt: skip
        print_calibration(record, costs)
        # The plan, made now, from the idle calibration only.
        for mix in args.mixes:
            plan, goal = plan_for(record, mix, args)
            record.setdefault("goals", {})[mix] = goal
            print(f"\n--- {mix}: reactantserver plan, before any load ---")
            print(render_plan(plan, top=4), flush=True)
        # The live fleets.
        for mix in args.mixes:
            shares = shares_of(mix, names, args.seed)
            for k in args.fleets:
                fleet = {n: workers[n] for n in list(workers)[:k]}
                gateway = start_gateway(
                    list(fleet.values()), workdir,
                    scheduling={"mode": "lpt_packing", "rebalance_compute_seconds": 60.0,
                                "first_rebalance_compute_seconds": 2.0, "hysteresis": 0.2},
                    health_interval_seconds=1.0, worker_names=list(fleet),
                    startup_wait_seconds=60.0,
                )  # fmt: skip
                servers.append(gateway)
                await wait_ready(gateway, names)
                # What else wants the cores now (our fleet idle): the environment, for the
                # second table only.
                now = await asyncio.to_thread(cpu.machine_busy, 0.5)
                hungry, _ = await asyncio.to_thread(cpu.hungry_threads, 1.0)
                load0 = os.getloadavg()[0]
                try:
                    (live, _), used = await asyncio.gather(
                        run_mode("lpt_packing", gateway, fleet, shares, args),
                        window_cpu(fleet, gateway, args),
                    )
                except Exception as exc:  # a crowded machine: say so, measure the rest
                    print(f"{mix} {k} workers: the window failed: {exc}", flush=True)
                    record["failed"] = [*record.get("failed", []), f"{mix}/{k}: {exc}"]
                    continue
                finally:
                    gateway.stop()
                record["windows"][f"{mix}/{k}"] = {
                    "window": window_to_json(live),
                    "load": [load0, os.getloadavg()[0]],
                    "background": hungry,
                    "runnable": now.runnable,
                    "busy": now.busy,
                    "cpu": used,
                }
                print(f"{mix} {k} workers: {live.rps:.1f} req/s p50 {live.p50 * 1e3:.1f} ms "
                      f"p99 {live.p99 * 1e3:.1f} ms (load {load0:.1f}; before it, others took as "
                      f"much as {hungry:.1f} hungry threads)", flush=True)  # fmt: skip
    finally:
        for server in servers:
            server.stop()
    if args.save:
        Path(args.save).write_text(json.dumps(record))
        print(f"saved to {args.save}")
    report(args, record)


def _machine_ticks() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


async def window_cpu(
    fleet: Mapping[str, Server], gateway: Server, args: argparse.Namespace
) -> dict[str, float]:
    """CPU seconds in the live window (for the diagnosis table, never for the plan): each
    worker's event loop and other threads, the gateway, this process, the whole machine."""

    def snap() -> dict[str, float]:
        out: dict[str, float] = {}
        for name, w in fleet.items():
            t = cpu.thread_times(w.proc.pid)
            out[f"{name}.loop"], out[f"{name}.others"] = t.main, t.others
        out["gateway"] = cpu.thread_times(gateway.proc.pid).total
        out["client"] = time.process_time()
        busy, _ = _machine_ticks()
        out["machine_busy"] = busy / (os.sysconf("SC_CLK_TCK"))
        return out

    await asyncio.sleep(args.warmup)
    a = snap()
    await asyncio.sleep(args.seconds)
    b = snap()
    return {k: b[k] - a[k] for k in a}


async def measured_budget(worker: Server) -> int:
    """The on-demand budget the worker reports (``weight_cache_max_bytes``)."""
    from reactantserver.client import AsyncClient

    async with AsyncClient(worker.url, timeout=30) as client:
        status = await client.control_status()
    return int(status.weight_cache_max_bytes)


def _quantiles(spread: Sequence[float]) -> str:
    if not spread:
        return "none measured"
    at = [(q, spread[min(len(spread) - 1, int(q * len(spread)))]) for q in (0.1, 0.5, 0.9, 0.99)]
    return f"{len(spread)} samples, " + " ".join(f"p{q * 100:g} {x:.2f}x" for q, x in at)


def print_calibration(record: Mapping[str, Any], costs: Costs) -> None:
    h = costs.host
    print(
        f"\ncalibration ({record['calibrated']}, idle: {costs.cores_busy:.2f} of {costs.cores:g} "
        f"cores busy, as if {costs.background_threads:.1f} threads of other processes always "
        "wanted a core, "
        f"load average {record['idle_load']:.1f}):\n"
        f"  worker event loop {h.request_seconds * 1e3:.3f} ms per request; an execution needs "
        f"{h.execution_threads:.2f} cores ({record.get('stretch', 0.0):.2f}x as long beside a "
        f"spinner on every core but one; its threads burn {record.get('idle_execution_threads', 0.0):.2f} "
        f"alone), a weight load {h.load_threads:.2f}\n"
        f"  gateway {(costs.gateway_seconds or 0) * 1e3:.3f} ms per request many in flight "
        f"(+{costs.gateway_wake_seconds * 1e3:.3f} alone); this load "
        f"generator {record['client_seconds'] * 1e3:.3f} "
        f"(+{record.get('client_wake_seconds', 0.0) * 1e3:.3f}); "
        f"{costs.network_seconds * 1e3:.3f} ms one way beside the CPU\n"
        f"  a weight load {costs.load_latency * 1e3:.2f} ms + {1e9 / costs.load_bandwidth:.3f} "
        f"ns/byte; {len(costs.models)} models, 1-row cost "
        f"{min(m.costs[1] for m in costs.models.values()) * 1e3:.2f}-"
        f"{max(m.costs[1] for m in costs.models.values()) * 1e3:.2f} ms; weight budget "
        f"{record['budget'] / 1e6:.1f} MB per worker (catalog {record['total_bytes'] / 1e6:.1f} MB)"
        f"\n  spread over the mean: loads {_quantiles(costs.load_spread)}; executions "
        f"{_quantiles(costs.execution_spread)}",
        flush=True,
    )


# ------------------------------------------------------------------------------ report


def _err(predicted: float, live: float) -> float:
    return (predicted - live) / live if live else math.inf


def comparison(
    rows: Sequence[tuple[str, int, Window, FleetOutcome]], tolerance: float
) -> list[str]:
    head = (
        f"| {'mix':<7} | {'workers':>7} | {'p50 live':>8} | {'plan':>6} | {'err':>5} | "
        f"{'p99 live':>8} | {'plan':>6} | {'err':>5} | {'req/s live':>10} | {'plan':>6} | "
        f"{'err':>5} | {'p99, req/s within':>17} |"
    )
    out = [head, "|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|"]
    for mix, k, live, sim in rows:
        e50, e99, erps = (
            _err(sim.p50, live.p50),
            _err(sim.p99, live.p99),
            _err(sim.throughput, live.rps),
        )
        ok = abs(e99) <= tolerance and abs(erps) <= tolerance
        out.append(
            f"| {mix:<7} | {k:>7} | {live.p50 * 1e3:>8.1f} | {sim.p50 * 1e3:>6.1f} | {e50:>+5.0%} | "
            f"{live.p99 * 1e3:>8.1f} | {sim.p99 * 1e3:>6.1f} | {e99:>+5.0%} | {live.rps:>10.1f} | "
            f"{sim.throughput:>6.1f} | {erps:>+5.0%} | {'yes' if ok else 'NO':>17} |"
        )
    return out


def report(args: argparse.Namespace, record: Mapping[str, Any]) -> None:
    costs = costs_of(record)
    windows = record["windows"]
    print(
        f"\nlive: {args.inflight} closed-loop clients, lpt_packing, {args.seconds:g} s windows "
        f"after {args.warmup:g} s of warm-up; {os.cpu_count()} CPUs"
    )
    strict, local = [], []
    verdicts = []
    for mix in args.mixes:
        plan, goal = plan_for(record, mix, args)
        evaluated = {o.workers: o for o in plan.evaluated}
        traffic, device, run = question(record, mix, args)
        for k in args.fleets:
            entry = windows.get(f"{mix}/{k}")
            if entry is None:
                continue
            live = window_from_json(entry["window"])
            sim = evaluated.get(k) or evaluate(k, traffic, costs, device, Goal(p99=goal), run)
            strict.append((mix, k, live, sim))
            t2, d2, r2 = question(record, mix, args, background=entry["background"])
            local.append((mix, k, live, evaluate(k, t2, costs, d2, Goal(p99=goal), r2)))
        answer = plan.answer.workers if plan.answer is not None else None
        verdicts.append((mix, goal, answer, {
            k: window_from_json(windows[f"{mix}/{k}"]["window"]).p99
            for k in args.fleets if f"{mix}/{k}" in windows
        }))  # fmt: skip
    loads = ", ".join(
        f"{key} {e['load'][0]:.1f}-{e['load'][1]:.1f} ({e['background']:.1f} threads)"
        for key, e in windows.items()
    )
    for line in record.get("failed", []):
        print(f"window failed (no live figures): {line}")
    print(f"machine load average over the windows (others' runnable threads before each): {loads}")
    print(
        f"\nthe plan from the idle calibration only ({costs.background_threads:.1f} threads of "
        f"other processes runnable then) against the live fleets (goal: p99 and req/s "
        f"within {args.tolerance:.0%}):"
    )
    print("\n".join(comparison(strict, args.tolerance)))
    print(
        "\nthe same, the other processes' runnable threads measured just before each window "
        "(the fleet's costs still the idle calibration's):"
    )
    print("\n".join(comparison(local, args.tolerance)))
    print()
    for mix, goal, answer, p99 in verdicts:
        if answer is None:
            print(
                f"{mix}: the plan finds no fleet of up to {max(args.fleets)} for p99 <= {goal * 1e3:.1f} ms"
            )
            continue
        meets = p99.get(answer)
        below = p99.get(answer - 1)
        first = "meets" if meets is not None and meets <= goal else "does NOT meet"
        line = (
            f"{mix}: p99 <= {goal * 1e3:.1f} ms: the plan names {answer} workers; live, {answer} "
            f"{first} it (p99 {meets * 1e3:.1f} ms)"
            if meets is not None
            else f"{mix}: -"
        )
        if below is not None:
            second = "fail" if below > goal else "do NOT fail"
            line += f" and {answer - 1} {second} (p99 {below * 1e3:.1f} ms)"
        print(line)
    if args.scale:
        scale_line()


def scale_line(models: int = 1000, devices: int = 8) -> None:
    """The planner's speed: 1,000 models, traffic that needs 8 GPUs (synthetic, seeded)."""
    import random

    from reactantserver.fleet.host import HostCosts
    from reactantserver.planning.command import default_seconds, default_warmup
    from reactantserver.planning.costs import ModelCosts

    rng = random.Random(0)
    weights = [r**-1.0 for r in range(1, models + 1)]
    total = sum(weights)
    table, traffic = {}, {}
    for i in range(models):
        base = math.exp(rng.uniform(math.log(0.001), math.log(0.004)))
        name = f"m{i:04d}"
        nbytes = int(math.exp(rng.uniform(math.log(2e7), math.log(1.2e8))))
        table[name] = ModelCosts(
            name=name, costs={s: base * (1 + 0.25 * (s - 1)) for s in (1, 2, 4, 8)},
            weight_bytes=nbytes,
        )  # fmt: skip
        traffic[name] = ModelTraffic(name=name, rate=3600.0 * weights[i] / total)
    costs = Costs(
        backend="cuda", models=table, load_latency=0.001, load_bandwidth=12e9,
        host=HostCosts(request_seconds=0.0002, batch_seconds=0.0001), cores=32,
        network_seconds=0.0002, gateway_seconds=0.0001,
    )  # fmt: skip
    device = Device(name="gpu", weight_budget_bytes=20_000_000_000, price_per_hour=2.0,
                    devices_per_host=8, host_cores=32)  # fmt: skip
    t = Traffic(models=traffic)
    run = Run(warmup=default_warmup(t), seconds=default_seconds(t))
    wall, cpu0 = time.monotonic(), time.process_time()
    plan = make_plan(t, costs, device, Goal(p99=0.05, error_budget=0.001), run)
    wall, used = time.monotonic() - wall, time.process_time() - cpu0
    answer = plan.answer.workers if plan.answer else None
    print(
        f"\nplanner speed: {models} models, 3600 req/s, p99 <= 50 ms: {answer} GPUs "
        f"({len(plan.evaluated)} fleets simulated, {run.seconds:g} s each after "
        f"{run.warmup:g} s) in {wall:.1f} s wall, {used:.1f} s of CPU; load average "
        f"{os.getloadavg()[0]:.1f} (goal: under a minute)"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=12, help="catalog size")
    parser.add_argument("--widths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--budget-ratio", type=float, default=3.0,
                        help="catalog weight bytes / one worker's budget")  # fmt: skip
    parser.add_argument("--fleets", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--backend", default="cpu", choices=["cpu", "cuda"],
                        help="the workers' backend (cuda: one GPU, so --fleets 1)")  # fmt: skip
    parser.add_argument("--mixes", nargs="+", default=list(MIXES), choices=MIXES)
    parser.add_argument("--inflight", type=int, default=16, help="closed-loop clients")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=8.0, help="unmeasured lead-in")
    parser.add_argument("--p99-ms", type=float, default=None,
                        help="the goal (default: between the plan's p99 of the two largest fleets)")  # fmt: skip
    parser.add_argument("--tolerance", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-scale", dest="scale", action="store_false",
                        help="skip the planner-speed line (1,000 models, 8 GPUs)")  # fmt: skip
    parser.add_argument("--scale-only", action="store_true",
                        help="print only the planner-speed line (no live fleet)")  # fmt: skip
    parser.add_argument("--workdir", help="keep the repository, caches and logs here")
    parser.add_argument("--save", help="write what the live part measured to this JSON file")
    parser.add_argument("--replay", help="report a --save file again (no live run)")
    args = parser.parse_args(argv)
    if args.backend == "cuda" and max(args.fleets) > 1:
        parser.error("--backend cuda runs one worker on the one GPU: give --fleets 1")
    if args.scale_only:
        scale_line()
        return
    if args.replay:
        report(args, json.loads(Path(args.replay).read_text()))
        return
    run_in_workdir(args.workdir, "rs_bench_plan_", partial(_run, args))


if __name__ == "__main__":
    main()
