"""GPU benchmark (c): models per GPU at a stated quality of service.

The question a lab asks: how large a catalog can one GPU serve at a given request rate
with p99 latency <= 100 ms? The catalog is ``examples/build_repo.py``'s seeded variants
of the zoo's MLP and ResNet (half of each, widths alternating 1x and 2x, so four
distinct programs and ``--catalogs``' largest number of weight files). One worker
process serves all of it on the GPU (``reactantserver serve``, defaults except a weight
budget of ``--budget`` of the largest catalog's weight bytes, so the on-demand cache is
what makes the catalog fit, as it would with larger models). Its startup time is
reported: four programs at three batch sizes are compiled, and every other model runs
those (bundles with the same artifact share their compiled programs).

For each catalog size N and each rate R, an open-loop load generator (Poisson arrivals,
``reactantserver.client.AsyncClient`` over four connections) sends single-row requests
to models drawn uniformly from the first N for ``--seconds``, after ``--warmup`` seconds
of the same load unmeasured -- uniform traffic is the worst case for an LRU cache. Latency runs from each request's scheduled send time to
its answer (so a lagging client cannot hide queueing). From the worker's ``/metrics``
over the same window: weight loads per second and device utilisation (execution seconds
per second). A row meets the QoS when p99 <= ``--p99-ms`` and nothing failed.
Where the worker measures its device's energy (NVML on the GPU; docs/monitoring.md), each
row also gives joules per inference -- the energy attributed to the models by device
time over the window, per request answered -- the same with the idle energy included,
and the device's mean power; and a line per architecture with its own joules per
inference. Where it does not, those columns say ``-``.

    python benchmarks/gpu/bench_gpu_catalog.py                    # on the GPU
    python benchmarks/gpu/bench_gpu_catalog.py --catalogs 100,1000 --rates 200,500
    python benchmarks/gpu/bench_gpu_catalog.py --backend cpu --quick   # smoke test

About 4 minutes on an H200 with the defaults (catalogs 100, 300 and 1,000; rates 200,
1,000, 2,000 and 4,000 requests/s -- the last two are issue 33's goal, 1,000 models at
2,000 requests/s within the QoS; 10 s each): building the 1,000 bundles (30 s),
compiling and the worker's startup (60 s), then twelve windows of 10 s after 2 s of
warm-up. At 4,000 requests/s the load generator (one asyncio process, four connections)
may itself be the limit: ``got/s`` against ``rate/s`` says so.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from harness import (
    ROOT,
    Table,
    WorkerProcess,
    describe_device,
    free_port,
    gpu_memory,
    node_yaml,
    start_worker,
)

from reactantserver.bundle import load_bundle

sys.path.insert(0, str(ROOT / "examples"))
MiB = 2**20
ARCHS = ("mlp", "resnet")


def catalog_names(n: int, archs: Sequence[str] = ARCHS) -> list[str]:
    """The first ``n`` variants of ``build_repo.plan`` of architectures ``archs``."""
    import build_repo

    variants = build_repo.plan(4 * n, detector=False)  # every 4th of each architecture
    return [p.name for p in variants if p.arch in archs and p.name != p.arch][:n]


def build(out: Path, names: Sequence[str]) -> float:
    """Build the bundles (``examples/build_repo.py``, JAX on the CPU); seconds taken."""
    start = time.perf_counter()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "build_repo.py"),
            *("--out", str(out), "--catalog", str(4 * len(names))),
            *("--no-detector", "--only", ",".join(names)),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        env=env,
    )
    return time.perf_counter() - start


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (nan when empty)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


#: Per-model counters also summed per architecture (joules per inference by arch).
_BY_ARCH = ("worker_energy_joules_total", "worker_requests_served_total")


def totals(worker: WorkerProcess) -> dict[str, float]:
    """Counters summed over models: execution seconds, dispatches, weight loads, energy
    (attributed and idle) and requests served; the last two also per architecture, as
    ``name/arch`` (a variant is named ``<arch>_vNNN``)."""
    out = Counter[str]()
    for name, labels, value in worker.samples():
        if name in ("worker_compute_seconds_total", "worker_dispatch_total", *_BY_ARCH) or (
            name
            in (
                "worker_weight_loads_total",
                "worker_weight_load_seconds_total",
                "worker_idle_energy_joules_total",
                "worker_energy_measured",
            )
            and (set(labels) <= {"worker", "gpu", "source"})
        ):
            out[name] += value
            if name in _BY_ARCH:
                arch = labels.get("model", "").rsplit("_v", 1)[0]  # mlp_v004 -> mlp
                out[f"{name}/{arch}"] += value
    return dict(out)


def energy_cells(delta: dict[str, float], wall: float, measured: bool) -> str:
    """J/inference (attributed), J/inference with idle, mean watts; ``-`` unmeasured."""
    served = delta.get("worker_requests_served_total", 0.0)
    if not measured or served <= 0:
        return f"{'-':>8} {'-':>9} {'-':>6}"
    attributed = delta.get("worker_energy_joules_total", 0.0)
    total = attributed + delta.get("worker_idle_energy_joules_total", 0.0)
    return f"{attributed / served:>8.4f} {total / served:>9.4f} {total / wall:>6.0f}"


async def open_loop(
    url: str,
    names: Sequence[str],
    inputs: dict[str, dict[str, np.ndarray]],
    rate: float,
    seconds: float,
    seed: int,
) -> tuple[list[float], Counter[str], int]:
    """Poisson arrivals at ``rate`` for ``seconds``: (latencies of answered requests,
    errors by kind, requests sent)."""
    from reactantserver.client import AsyncClient, RetryPolicy

    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    clients = [AsyncClient(url, timeout=10, retry=RetryPolicy(max_retries=0)) for _ in range(4)]
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    pending: set[asyncio.Task[None]] = set()

    async def one(client: Any, name: str, scheduled: float) -> None:
        try:
            await client.infer(name, inputs[name])
            latencies.append(loop.time() - scheduled)
        except Exception as exc:
            errors[type(exc).__name__] += 1

    try:
        for c in clients:  # connect before the window opens
            await c.is_server_ready()
        start = loop.time() + 0.05
        at, sent = start, 0
        while at < start + seconds:
            delay = at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            name = names[rng.randrange(len(names))]
            task = asyncio.create_task(one(clients[sent % len(clients)], name, at))
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent += 1
            at += rng.expovariate(rate)
        if pending:
            await asyncio.gather(*pending)
    finally:
        for c in clients:
            await c.close()
    return latencies, errors, sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--catalogs", default="100,300,1000", help="catalog sizes N")
    parser.add_argument(
        "--rates", default="200,1000,2000,4000", help="request rates R (requests/s)"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window per row")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured load before each row")
    parser.add_argument("--budget", type=float, default=0.1, help="weight budget / catalog bytes")
    parser.add_argument("--p99-ms", type=float, default=100.0)
    parser.add_argument("--archs", default=",".join(ARCHS), help="zoo architectures to vary")
    parser.add_argument("--quick", action="store_true", help="8 and 16 MLPs at 20/s (smoke test)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep bundles and logs here")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default $OUT)")
    args = parser.parse_args(argv)
    if args.quick:
        args.catalogs, args.rates, args.seconds, args.budget = "8,16", "20", 1.5, 0.3
        args.warmup = 0.5
        args.archs = "mlp"
    sizes = sorted(int(n) for n in args.catalogs.split(","))
    rates = [float(r) for r in args.rates.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-catalog-") as tmp:
        work = args.workdir or Path(tmp)
        return run(args, sizes, rates, work)


def run(args: argparse.Namespace, sizes: list[int], rates: list[float], work: Path) -> int:
    repo = work / "repo"
    archs = args.archs.split(",")
    names = catalog_names(max(sizes), archs)
    if len(names) < max(sizes):
        raise SystemExit(f"only {len(names)} variants of {archs} are planned")
    build_seconds = build(repo, names)
    bundles = {n: load_bundle(repo / n) for n in names}
    total = sum(b.weights_nbytes for b in bundles.values())
    budget = int(args.budget * total)
    assert max(b.weights_nbytes for b in bundles.values()) <= budget, "raise --budget"
    if args.backend == "cpu":
        runtime: dict[str, Any] = {"arena_bytes": math.ceil(budget / 0.9)}
    else:
        memory = gpu_memory()
        assert memory is not None, "nvidia-smi is needed to size the weight budget"
        # The arena is at most mem_fraction (0.9) of the device: the budget comes out
        # at most ``budget`` bytes (floor(fraction * arena), less any scratch).
        runtime = {"weight_cache_fraction": budget / (0.9 * memory.total_bytes)}
    rng = np.random.default_rng(0)
    inputs = {}
    for name, b in bundles.items():
        inputs[name] = {
            s.name: rng.standard_normal([1 if d == -1 else d for d in s.shape]).astype(
                s.numpy_dtype
            )
            for s in b.client_inputs
        }
    port, metrics_port = free_port(), free_port()
    node = node_yaml(
        repo,
        port=port,
        metrics_port=metrics_port,
        cache_dir=work / "jax-cache",
        backend=args.backend,
        runtime=runtime,
        scheduler={"max_queue_depth": 1024},
    )
    started = time.perf_counter()
    worker = start_worker(work, node, port=port, metrics_port=metrics_port, log_level="warning")
    try:
        worker.wait_ready(900)
        ready_seconds = time.perf_counter() - started
        m = worker.metrics()
        loaded = int(m["worker_models_loaded"])
        real_budget = int(m.get("worker_weight_cache_max_bytes", 0))
        with Table("bench_gpu_catalog", out=args.out) as table:
            table.line(
                "(c) models per GPU at a stated QoS: open-loop single-row requests, uniform over the first N models"
            )
            table.line(f"device: {describe_device()}; worker backend {args.backend}")
            table.line(
                f"catalog: {len(names)} bundles ({', '.join(archs)} variants of examples/build_repo.py, "
                f"{total / MiB:.1f} MiB of weights), built in {build_seconds:.0f} s; worker ready "
                f"in {ready_seconds:.1f} s with {loaded} models ({2 * len(archs)} programs x 3 "
                "batch sizes compiled and shared by the others)"
            )
            table.line(
                f"weight budget {real_budget / MiB:.2f} MiB (about {args.budget:g} of the "
                f"{len(names)}-model catalog); {args.seconds:g} s per row; QoS: p99 <= "
                f"{args.p99_ms:g} ms and no errors"
            )
            table.line(
                f"{'N':>6} {'rate/s':>7} {'sent':>6} {'ok':>6} {'errors':>7} {'got/s':>7} "
                f"{'p50 ms':>7} {'p99 ms':>8} {'loads/s':>8} {'util':>6} {'J/inf':>8} "
                f"{'J/inf+idl':>9} {'W':>6}  QoS"
            )
            measured = totals(worker).get("worker_energy_measured", 0.0) > 0
            best: dict[float, int] = {}
            for rate in rates:
                for n in sizes:
                    # The same load, unmeasured: first calls, connections, a full cache.
                    asyncio.run(
                        open_loop(worker.url, names[:n], inputs, rate, args.warmup, seed=-n)
                    )
                    before = totals(worker)
                    wall = time.perf_counter()
                    lat, errors, sent = asyncio.run(
                        open_loop(worker.url, names[:n], inputs, rate, args.seconds, seed=n)
                    )
                    wall = time.perf_counter() - wall
                    after = totals(worker)
                    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
                    p99 = 1e3 * percentile(lat, 99)
                    ok = not errors and p99 <= args.p99_ms
                    if ok:
                        best[rate] = max(best.get(rate, 0), n)
                    table.line(
                        f"{n:>6} {rate:>7.0f} {sent:>6} {len(lat):>6} {sum(errors.values()):>7} "
                        f"{len(lat) / wall:>7.1f} {1e3 * statistics.median(lat) if lat else math.nan:>7.2f} "
                        f"{p99:>8.2f} {delta.get('worker_weight_loads_total', 0.0) / wall:>8.1f} "
                        f"{delta.get('worker_compute_seconds_total', 0.0) / wall:>6.3f} "
                        f"{energy_cells(delta, wall, measured)}  "
                        f"{'yes' if ok else 'no'}" + (f"  {dict(errors)}" if errors else "")
                    )
                    if measured:
                        per_arch = []
                        for arch in archs:
                            served = delta.get(f"worker_requests_served_total/{arch}", 0.0)
                            joules = delta.get(f"worker_energy_joules_total/{arch}", 0.0)
                            if served > 0:
                                per_arch.append(f"{arch} {joules / served:.4f}")
                        table.line(f"{'':>6} J/inference by architecture: {', '.join(per_arch)}")
            for rate in rates:
                verdict = f"{best[rate]} models" if rate in best else "none of the sizes tried"
                table.line(f"largest catalog meeting the QoS at {rate:.0f} requests/s: {verdict}")
            table.line(
                "util = device execution seconds per second; loads/s = on-demand weight loads per second"
            )
            table.line(
                "J/inf = device energy attributed to the models by device time / requests answered; "
                "J/inf+idl adds the idle energy; W = mean device power over the window"
                + ("" if measured else " (energy not measured by this worker: -)")
            )
    finally:
        worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
