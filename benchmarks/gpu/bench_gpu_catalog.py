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
over the same window: weight loads per second, the host seconds per load (``ms/load``:
the worker's ``worker_weight_load_seconds_total`` over its loads -- the event loop's time
for a load queued on the device, a worker thread's for one waited for there) and device
utilisation (execution seconds per second). A row meets the QoS when p99 <=
``--p99-ms`` and nothing failed.

``--baseline REF`` serves the same catalog from another tree of the project too -- a
directory holding its ``src/``, or a git ref, archived once into ``.baseline/<commit>``
-- with the same budget and the same client: one worker per tree (on a GPU each with its
share of the device), their windows alternating so that the machine's drift hits both,
each row printed for both trees and a ratio line under the table. ``--out DIR`` is
created if it does not exist.
Where the worker measures its device's energy (NVML on the GPU; docs/monitoring.md), each
row also gives joules per inference -- the energy attributed to the models by device
time over the window, per request answered -- the same with the idle energy included,
and the device's mean power; and a line per architecture with its own joules per
inference. Where it does not, those columns say ``-``.

    python benchmarks/gpu/bench_gpu_catalog.py                    # on the GPU
    python benchmarks/gpu/bench_gpu_catalog.py --catalogs 100,1000 --rates 200,500
    python benchmarks/gpu/bench_gpu_catalog.py --backend cpu --quick   # smoke test
    python benchmarks/gpu/bench_gpu_catalog.py --backend cpu --catalogs 300 --rates 400 \
        --seconds 5 --baseline main                                    # the load path, any machine

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

import attrs
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
    parser.add_argument(
        "--baseline",
        default=None,
        metavar="REF",
        help="also serve the catalog from another tree of the project -- a directory, or a "
        "git ref archived into .baseline/REF -- and print its rows beside ours",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.catalogs, args.rates, args.seconds, args.budget = "8,16", "20", 1.5, 0.3
        args.warmup = 0.5
        args.archs = "mlp"
    sizes = sorted(int(n) for n in args.catalogs.split(","))
    rates = [float(r) for r in args.rates.split(",")]
    baseline = baseline_tree(args.baseline) if args.baseline else None
    with tempfile.TemporaryDirectory(prefix="bench-catalog-") as tmp:
        work = args.workdir or Path(tmp)
        return run(args, sizes, rates, work, baseline)


def baseline_tree(ref: str) -> Path:
    """The tree to compare with: ``ref`` itself when it is a directory holding ``src/``,
    else ``git archive`` of the commit ``ref`` names, in ``.baseline/<commit>`` (made once;
    ``.baseline/`` is git-ignored)."""
    given = Path(ref)
    if (given / "src" / "reactantserver").is_dir():
        return given.resolve()
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    into = ROOT / ".baseline" / commit
    if not (into / "src" / "reactantserver").is_dir():
        into.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", commit, "src"], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


@attrs.frozen
class Row:
    """One measured window of one tree."""

    n: int
    rate: float
    sent: int
    latencies: list[float]
    errors: Counter[str]
    wall: float
    delta: dict[str, float]

    @property
    def p99_ms(self) -> float:
        return 1e3 * percentile(self.latencies, 99)

    @property
    def ok(self) -> bool:
        return not self.errors and bool(self.latencies)

    def per_second(self, counter: str) -> float:
        return self.delta.get(counter, 0.0) / self.wall

    @property
    def host_ms_per_load(self) -> float:
        """Milliseconds the worker spent per on-demand load: on the event loop for a load
        queued on the device, in a worker thread for one waited for there."""
        loads = self.delta.get("worker_weight_loads_total", 0.0)
        seconds = self.delta.get("worker_weight_load_seconds_total", 0.0)
        return 1e3 * seconds / loads if loads else math.nan


def window(
    worker: WorkerProcess,
    names: Sequence[str],
    inputs: dict[str, dict[str, np.ndarray]],
    n: int,
    rate: float,
    args: argparse.Namespace,
) -> Row:
    """``--warmup`` seconds of the load unmeasured (first calls, connections, a full
    cache), then ``--seconds`` measured, with the worker's counters over the window."""
    asyncio.run(open_loop(worker.url, names[:n], inputs, rate, args.warmup, seed=-n))
    before = totals(worker)
    wall = time.perf_counter()
    lat, errors, sent = asyncio.run(
        open_loop(worker.url, names[:n], inputs, rate, args.seconds, seed=n)
    )
    wall = time.perf_counter() - wall
    after = totals(worker)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    return Row(n, rate, sent, lat, errors, wall, delta)


def run(
    args: argparse.Namespace,
    sizes: list[int],
    rates: list[float],
    work: Path,
    baseline: Path | None = None,
) -> int:
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
    # One worker per tree, both serving the same catalog with the same budget; their
    # windows alternate, so the machine's drift hits both alike. On a GPU the workers
    # share the device, each with its share of the memory.
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if baseline is not None:
        trees.insert(0, (f"base {baseline.name}", baseline / "src"))
    share = 0.9 / len(trees)
    if args.backend == "cpu":
        runtime: dict[str, Any] = {"arena_bytes": math.ceil(budget / 0.9)}
    else:
        memory = gpu_memory()
        assert memory is not None, "nvidia-smi is needed to size the weight budget"
        # The arena is at most mem_fraction of the device: the budget comes out at most
        # ``budget`` bytes (floor(fraction * arena), less any scratch).
        runtime = {
            "mem_fraction": share,
            "weight_cache_fraction": budget / (share * memory.total_bytes),
        }
    rng = np.random.default_rng(0)
    inputs = {}
    for name, b in bundles.items():
        inputs[name] = {
            s.name: rng.standard_normal([1 if d == -1 else d for d in s.shape]).astype(
                s.numpy_dtype
            )
            for s in b.client_inputs
        }
    workers: dict[str, WorkerProcess] = {}
    ready: dict[str, float] = {}
    try:
        for label, src in trees:
            port, metrics_port = free_port(), free_port()
            node = node_yaml(
                repo,
                port=port,
                metrics_port=metrics_port,
                cache_dir=work / f"jax-cache-{len(workers)}",
                backend=args.backend,
                runtime=runtime,
                scheduler={"max_queue_depth": 1024},
            )
            started = time.perf_counter()
            worker = start_worker(
                work / f"worker-{len(workers)}",
                node,
                port=port,
                metrics_port=metrics_port,
                log_level="warning",
                src=src,
            )
            workers[label] = worker
            worker.wait_ready(900)
            ready[label] = time.perf_counter() - started
        report(args, sizes, rates, names, inputs, workers, ready, build_seconds, total)
    finally:
        for worker in workers.values():
            worker.stop()
    return 0


def report(
    args: argparse.Namespace,
    sizes: list[int],
    rates: list[float],
    names: Sequence[str],
    inputs: dict[str, dict[str, np.ndarray]],
    workers: dict[str, WorkerProcess],
    ready: dict[str, float],
    build_seconds: float,
    total: int,
) -> None:
    archs = args.archs.split(",")
    first = next(iter(workers.values()))
    m = first.metrics()
    loaded = int(m["worker_models_loaded"])
    real_budget = int(m.get("worker_weight_cache_max_bytes", 0))
    labels = list(workers)
    with Table("bench_gpu_catalog", out=args.out) as table:
        table.line(
            "(c) models per GPU at a stated QoS: open-loop single-row requests, uniform over the first N models"
        )
        table.line(f"device: {describe_device()}; worker backend {args.backend}")
        startup = ", ".join(f"{label} in {ready[label]:.1f} s" for label in labels)
        table.line(
            f"catalog: {len(names)} bundles ({', '.join(archs)} variants of examples/build_repo.py, "
            f"{total / MiB:.1f} MiB of weights), built in {build_seconds:.0f} s; worker ready "
            f"({startup}) with {loaded} models ({2 * len(archs)} programs x 3 batch sizes "
            "compiled and shared by the others)"
        )
        table.line(
            f"weight budget {real_budget / MiB:.2f} MiB (about {args.budget:g} of the "
            f"{len(names)}-model catalog); {args.seconds:g} s per row; QoS: p99 <= "
            f"{args.p99_ms:g} ms and no errors"
            + ("; the trees' windows alternate" if len(labels) > 1 else "")
        )
        tree_col = f"{'tree':<16}" if len(labels) > 1 else ""
        table.line(
            f"{tree_col}{'N':>6} {'rate/s':>7} {'sent':>6} {'ok':>6} {'errors':>7} {'got/s':>7} "
            f"{'p50 ms':>7} {'p99 ms':>8} {'loads/s':>8} {'ms/load':>8} {'util':>6} "
            f"{'J/inf':>8} {'J/inf+idl':>9} {'W':>6}  QoS"
        )
        measured = totals(first).get("worker_energy_measured", 0.0) > 0
        best: dict[tuple[str, float], int] = {}
        pairs: list[dict[str, Row]] = []
        turn = 0
        for rate in rates:
            for n in sizes:
                rows: dict[str, Row] = {}
                order = labels if turn % 2 == 0 else labels[::-1]
                turn += 1
                for label in order:
                    rows[label] = window(workers[label], names, inputs, n, rate, args)
                pairs.append(rows)
                for label in labels:
                    row = rows[label]
                    ok = row.ok and row.p99_ms <= args.p99_ms
                    if ok:
                        best[label, rate] = max(best.get((label, rate), 0), n)
                    lat = row.latencies
                    cell = f"{label:<16}" if len(labels) > 1 else ""
                    table.line(
                        f"{cell}{n:>6} {rate:>7.0f} {row.sent:>6} {len(lat):>6} "
                        f"{sum(row.errors.values()):>7} {len(lat) / row.wall:>7.1f} "
                        f"{1e3 * statistics.median(lat) if lat else math.nan:>7.2f} "
                        f"{row.p99_ms:>8.2f} {row.per_second('worker_weight_loads_total'):>8.1f} "
                        f"{row.host_ms_per_load:>8.3f} "
                        f"{row.per_second('worker_compute_seconds_total'):>6.3f} "
                        f"{energy_cells(row.delta, row.wall, measured)}  "
                        f"{'yes' if ok else 'no'}" + (f"  {dict(row.errors)}" if row.errors else "")
                    )
                    if measured:
                        per_arch = []
                        for arch in archs:
                            served = row.delta.get(f"worker_requests_served_total/{arch}", 0.0)
                            joules = row.delta.get(f"worker_energy_joules_total/{arch}", 0.0)
                            if served > 0:
                                per_arch.append(f"{arch} {joules / served:.4f}")
                        table.line(f"{'':>6} J/inference by architecture: {', '.join(per_arch)}")
        for label in labels:
            for rate in rates:
                found = best.get((label, rate))
                verdict = f"{found} models" if found else "none of the sizes tried"
                who = f" ({label})" if len(labels) > 1 else ""
                table.line(
                    f"largest catalog meeting the QoS at {rate:.0f} requests/s{who}: {verdict}"
                )
        if len(labels) > 1:
            base, this = labels
            for rows in pairs:
                b, t = rows[base], rows[this]
                table.line(
                    f"N={t.n} at {t.rate:.0f}/s, this tree / {base}: loads/s "
                    f"{_ratio(t.per_second('worker_weight_loads_total'), b.per_second('worker_weight_loads_total'))}, "
                    f"answered/s {_ratio(len(t.latencies) / t.wall, len(b.latencies) / b.wall)}, "
                    f"ms per load {b.host_ms_per_load:.3f} -> {t.host_ms_per_load:.3f}, "
                    f"p99 {b.p99_ms:.1f} -> {t.p99_ms:.1f} ms"
                )
        table.line(
            "util = device execution seconds per second; loads/s = on-demand weight loads per "
            "second; ms/load = the worker's seconds in loads / loads (worker_weight_load_seconds_total)"
        )
        table.line(
            "J/inf = device energy attributed to the models by device time / requests answered; "
            "J/inf+idl adds the idle energy; W = mean device power over the window"
            + ("" if measured else " (energy not measured by this worker: -)")
        )


def _ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if theirs > 0 else "-"


if __name__ == "__main__":
    sys.exit(main())
