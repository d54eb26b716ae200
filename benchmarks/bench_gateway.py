"""Gateway benchmark: the same load direct to one worker and through a gateway in front of it.

What it measures (issue 17), side by side in one run:

* one-row ``double`` requests (``y = 2 * x``, FP32 ``[1, 16]``) at 1, 16 and 64 in flight,
  closed loop (``tritonclient.grpc.aio``, this process): requests/s and p50/p99, direct and
  through the gateway, and the p50 the gateway adds;
* CPU per request (user + system, ``psutil``) of the gateway process and of the worker, and
  their ratio -- the gateway's cost relative to the work it fronts. The worker's CPU is
  taken in the same window as the gateway's (through the gateway), and also direct;
* latency against the burst bound: a closed loop moves its requests as a burst, and a
  gateway that held a burst until it had handled all of it would add about in-flight x its
  CPU per request to p50; printed beside the added p50 with the cores each process keeps
  busy through the gateway (load generator, gateway, worker);
* the same rows in two core layouts (``--layouts``): ``shared``, where the kernel spreads
  the three processes over every core, and ``pinned``, where the worker keeps a core of its
  own as it would on a GPU host and the gateway and the load generator share the rest
  (each its own core where there are three or more): on a 2-core machine ``shared`` puts
  three busy processes on two cores, and the worker then waits behind the gateway for a
  core, which is latency a deployment would not see;
* one 38 MB input inline through the gateway and direct (``double_38mb``, as in
  ``bench_serve``): what the raw-byte path's copies cost a large tensor;
* where the gateway's CPU goes: a ``py-spy`` profile of the gateway under the 16-in-flight
  load (samples holding the GIL, by package), when py-spy can attach.

Processes as deployed: ``python -m reactantserver.cli serve node.yaml`` (one CPU worker,
``fair``, ``max_concurrent_requests: 1024``) and ``python -m reactantserver.cli gateway
gateway.yml`` (round_robin, one endpoint). Rows are measured ``--runs`` times, direct and
gateway alternating (each run takes every layout in turn), and each figure is the median.
Latency and requests/s are properties of the trio and of the cores they were given; CPU
per request is each process's own.

    python benchmarks/bench_gateway.py                  # the tables (about 3 minutes)
    python benchmarks/bench_gateway.py --runs 1 --seconds 2
    python benchmarks/bench_gateway.py --baseline REV   # this gateway against REV's,
                                                        # three pairs of processes
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import partial
from pathlib import Path

import attrs
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_serve import (  # noqa: E402
    BIG_MODEL,
    LoadResult,
    Server,
    baseline_tree,
    big_array,
    build_repo,
    closed_loop,
    free_port,
    process_cpu,
    run_in_workdir,
    start_ours,
    tensor_input,
    wait_ready,
)

MODEL = "double"
CONCURRENCY = (1, 16, 64)
LAYOUTS = ("shared", "pinned")


@attrs.frozen
class Layout:
    """Which cores each process may run on."""

    name: str
    load: frozenset[int]
    gateway: frozenset[int]
    worker: frozenset[int]

    def describe(self) -> str:
        if self.name == "shared":
            return "shared: the kernel places load generator, gateway and worker on any core"
        return (
            f"pinned: worker on cores {sorted(self.worker)}, gateway on {sorted(self.gateway)}"
            f", load generator on {sorted(self.load)}"
        )


def layouts(names: Sequence[str], cores: Iterable[int]) -> list[Layout]:
    """The layouts asked for over ``cores``. ``pinned`` gives the worker the last core;
    with three or more the gateway the one before it and the load generator the rest;
    with two, gateway and load generator share the first (the gateway is then the one
    disadvantaged, never helped); with one it is left out."""
    ordered = sorted(cores)
    every = frozenset(ordered)
    out = []
    for name in names:
        if name == "shared":
            out.append(Layout("shared", every, every, every))
        elif len(ordered) < 2:
            print("one core only: the pinned layout is left out", file=sys.stderr)
        elif len(ordered) == 2:
            rest = frozenset(ordered[:1])
            out.append(Layout("pinned", rest, rest, frozenset(ordered[1:])))
        else:
            load, gateway, worker = ordered[:-2], ordered[-2:-1], ordered[-1:]
            out.append(Layout("pinned", frozenset(load), frozenset(gateway), frozenset(worker)))
    return out


def pin(pid: int, cores: frozenset[int]) -> None:
    """Every thread of ``pid`` (and so the threads they start later) onto ``cores``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
            os.sched_setaffinity(int(tid), cores)


def place(layout: Layout, gateway: Server, worker: Server) -> None:
    pin(worker.proc.pid, layout.worker)
    pin(gateway.proc.pid, layout.gateway)
    pin(os.getpid(), layout.load)


@attrs.frozen
class Pair:
    """One row: the direct and the gateway windows at one concurrency (medians of runs)."""

    layout: Layout
    concurrency: int
    direct: list[LoadResult]
    gateway: list[LoadResult]
    gateway_cpu: list[float]  # gateway CPU per request, seconds
    worker_cpu_via: list[float]  # worker CPU per request through the gateway
    #: Cores kept busy through the gateway: (load generator, gateway, worker) per run.
    busy_via: list[tuple[float, float, float]] = attrs.field(factory=list)

    @staticmethod
    def med(values: Sequence[float]) -> float:
        return statistics.median(values)


def start_gateway(
    workers: Server | Sequence[Server], workdir: Path, *, src: Path | None = None, **extra: object
) -> Server:
    """``reactantserver gateway`` in front of ``workers``; ``extra`` adds or replaces
    top-level keys of its gateway.yml (``scheduling``, ``health_interval_seconds``...);
    ``src``: run the ``reactantserver`` package found there (another tree's) instead."""
    port = free_port()
    fleet = [workers] if isinstance(workers, Server) else list(workers)
    config = {
        "listen": {"grpc": f"127.0.0.1:{port}", "metrics": "127.0.0.1:0"},
        "endpoints": [w.url for w in fleet],
        "health_interval_seconds": 5.0,
        "logging": {"level": "warning", "format": "text"},
        **extra,
    }
    path = workdir / f"gateway_{port}.yml"
    path.write_text(json.dumps(config))
    log = workdir / f"gateway_{port}.log"
    env = None if src is None else {**os.environ, "PYTHONPATH": str(src)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reactantserver.cli", "gateway", str(path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    return Server("gateway", proc, port, log)


async def _window(url: str, n: int, args: argparse.Namespace, pids: Sequence[int]) -> LoadResult:
    """One closed-loop window; ``cpu`` reads every pid's CPU and, last, this process's
    own (the load generator's: ``time.process_time`` counts no children) as a numpy
    array (subtractable)."""
    return await closed_loop(
        url,
        MODEL,
        n,
        seconds=args.seconds,
        warmup=args.warmup,
        cpu=lambda: np.array([*(process_cpu(p) for p in pids), time.process_time()]),  # type: ignore[arg-type,return-value]
    )


def cpu_per_request(via: LoadResult) -> tuple[float, float]:
    """The gateway's and the worker's CPU per request in a window through the gateway."""
    gateway, worker = np.asarray(via.cpu_seconds)[:2] / via.requests
    return float(gateway), float(worker)


async def measure(
    args: argparse.Namespace, worker: Server, gateway: Server, where: Sequence[Layout]
) -> list[Pair]:
    """Every row in every layout; a run takes each layout in turn, so the layouts see
    the same stretch of a noisy machine."""
    pairs = {
        (layout.name, n): Pair(layout, n, [], [], [], []) for layout in where for n in CONCURRENCY
    }
    for n in CONCURRENCY:
        for _, layout in itertools.product(range(args.runs), where):
            place(layout, gateway, worker)
            pair = pairs[layout.name, n]
            direct = await _window(worker.url, n, args, [worker.proc.pid])
            via = await _window(gateway.url, n, args, [gateway.proc.pid, worker.proc.pid])
            gw_cpu, wkr_cpu = cpu_per_request(via)
            pair.direct.append(attrs.evolve(direct, cpu_seconds=float(direct.cpu_seconds[0])))  # type: ignore[index]
            pair.gateway.append(via)
            pair.gateway_cpu.append(gw_cpu)
            pair.worker_cpu_via.append(wkr_cpu)
            gw, wkr, load = (float(c) / via.seconds for c in via.cpu_seconds)  # type: ignore[attr-defined]
            pair.busy_via.append((load, gw, wkr))
    return list(pairs.values())


# ------------------------------------------------------------------ against a baseline


@attrs.define
class Side:
    """One gateway's windows in the comparison with a baseline."""

    label: str
    gateway_cpu: list[float] = attrs.Factory(list)
    worker_cpu: list[float] = attrs.Factory(list)
    p50: list[float] = attrs.Factory(list)
    #: How many of the windows above each pair of processes measured, in order.
    per_pair: list[int] = attrs.Factory(list)

    def row(self, base: Side | None = None) -> str:
        med = statistics.median
        gw, wkr = med(self.gateway_cpu), med(self.worker_cpu)
        line = (
            f"{self.label:>12} | {gw * 1e6:>6.1f} {wkr * 1e6:>7.0f} {gw / wkr:>7.3f} "
            f"{med(self.p50) * 1e3:>7.2f}"
        )
        if base is not None:
            line += f" | gw us x{gw / med(base.gateway_cpu):.3f}"
            pairs = pair_ratios(base, self)
            if len(pairs) > 1:
                line += ", by pair of processes " + " ".join(f"x{r:.3f}" for r in pairs)
        return line


def pair_ratios(base: Side, this: Side) -> list[float]:
    """This side's median gateway CPU over the baseline's, for each pair of processes."""
    out = []
    at = 0
    for n in this.per_pair:
        ours = statistics.median(this.gateway_cpu[at : at + n])
        theirs = statistics.median(base.gateway_cpu[at : at + n])
        out.append(ours / theirs)
        at += n
    return out


async def against_baseline(
    args: argparse.Namespace, worker: Server, workdir: Path, where: Sequence[Layout]
) -> list[tuple[Layout, Side, Side]]:
    """This tree's gateway and the one at ``--baseline`` in front of the same worker, both
    running, their windows alternating (16 in flight, ``--runs`` each per layout and pair):
    the CPU a change saves, with the machine's drift shared by both sides.

    Both gateways are started afresh ``--pairs`` times (which starts first alternates):
    one pair of processes can sit a few percent apart on identical code -- where each
    lands in memory, its hash seed -- and keep that offset in every window, so a change of
    a few percent is read from several pairs, never one (docs/benchmarks.md)."""
    tree = baseline_tree(args.baseline, workdir)
    if tree is None:
        return []
    sides = {layout: (Side(args.baseline[:12]), Side("this tree")) for layout in where}
    for pair in range(max(1, args.pairs)):
        if pair % 2 == 0:
            old = start_gateway(worker, workdir, src=tree / "src")
            new = start_gateway(worker, workdir)
        else:
            new = start_gateway(worker, workdir)
            old = start_gateway(worker, workdir, src=tree / "src")
        try:
            await wait_ready(old, [MODEL])
            await wait_ready(new, [MODEL])
            for layout in where:
                for side in sides[layout]:
                    side.per_pair.append(args.runs)
                for run in range(args.runs):
                    for i in (0, 1) if run % 2 == 0 else (1, 0):
                        gateway = (old, new)[i]
                        place(layout, gateway, worker)
                        via = await _window(
                            gateway.url, 16, args, [gateway.proc.pid, worker.proc.pid]
                        )
                        gw_cpu, wkr_cpu = cpu_per_request(via)
                        side = sides[layout][i]
                        side.gateway_cpu.append(gw_cpu)
                        side.worker_cpu.append(wkr_cpu)
                        side.p50.append(via.p50)
        finally:
            old.stop()
            new.stop()
    return [(layout, *sides[layout]) for layout in where]


def baseline_report(rows: Sequence[tuple[Layout, Side, Side]]) -> None:
    print("this tree's gateway against the baseline's, in front of the same worker, windows")
    print("alternating; 16 in flight, medians; both gateways restarted for each pair")
    for layout, base, this in rows:
        print()
        print(f"cores -- {layout.describe()}")
        print(f"{'gateway':>12} | {'gw us':>6} {'wkr us':>7} {'gw/wkr':>7} {'p50 ms':>7}")
        print(base.row())
        print(this.row(base))


async def big(url: str, repeats: int) -> float:
    """Median seconds of one 38 MB request (inline both ways)."""
    import tritonclient.grpc.aio as aioclient
    from bench_serve import CHANNEL_ARGS

    x = big_array()
    client = aioclient.InferenceServerClient(url, channel_args=CHANNEL_ARGS)
    try:
        times = []
        for _ in range(repeats):
            started = time.monotonic()
            result = await client.infer(BIG_MODEL, [tensor_input("x", x)])
            times.append(time.monotonic() - started)
            assert np.array_equal(result.as_numpy("y")[:4], 2 * x[:4])
        return statistics.median(times)
    finally:
        await client.close()


# ------------------------------------------------------------------------------ profile

#: Package of a frame's file -> the row it counts in (py-spy shows paths relative to the
#: entries of sys.path, e.g. ``h2/connection.py``; first match wins).
_BUCKETS = (
    ("reactantserver/gateway/http2", "gateway: HTTP/2 client to the worker (http2.py, hpack)"),
    ("reactantserver/gateway/channel", "gateway: worker connections (channel.py, pool.py)"),
    ("reactantserver/gateway/pool", "gateway: worker connections (channel.py, pool.py)"),
    ("reactantserver/gateway", "gateway: proxy, peek, routing, stats"),
    ("reactantserver/transport", "server wire (transport/: h2lean, h2guard, server, framing)"),
    ("hpack/", "hpack, hyperframe, h2 (header decoding, frame objects)"),
    ("hyperframe/", "hpack, hyperframe, h2 (header decoding, frame objects)"),
    ("h2/", "hpack, hyperframe, h2 (header decoding, frame objects)"),
    ("grpclib/", "grpclib (server streams and protocol)"),
    ("asyncio/", "asyncio event loop"),
    ("selectors", "asyncio event loop"),
)


def _bucket(frame: str) -> str:
    for needle, label in _BUCKETS:
        if needle in frame:
            return label
    return "other (Python runtime, logging, enum, ...)"


def profile(pid: int, seconds: float, workdir: Path) -> Counter[str] | str:
    """py-spy's GIL-holding samples of ``pid``, by the package of the innermost frame."""
    spy = shutil.which("py-spy")
    if spy is None:
        return "py-spy not found (pip install py-spy): no profile"
    out = workdir / "gateway.pyspy"
    proc = subprocess.run(
        [spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "250",
         "--gil", "--nonblocking", "--format", "raw", "--output", str(out)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0 or not out.exists():
        return f"py-spy could not profile the gateway: {proc.stderr.strip()[-300:]}"
    counts: Counter[str] = Counter()
    for line in out.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        counts[_stack_bucket(stack)] += int(n)
    return counts


def _stack_bucket(stack: str) -> str:
    """The gateway's client side owns everything below it (its hpack decoding included);
    any other sample counts where its innermost frame is."""
    if "reactantserver/gateway/http2" in stack:
        return _BUCKETS[0][1]
    if "reactantserver/gateway/channel" in stack or "reactantserver/gateway/pool" in stack:
        return _BUCKETS[1][1]
    leaf = stack.rsplit(";", 1)[-1]
    path = re.search(r"\((.*?):\d+\)", leaf)
    return _bucket(path.group(1) if path else leaf)


async def profiled_load(args: argparse.Namespace, gateway: Server, workdir: Path) -> object:
    load = asyncio.ensure_future(
        closed_loop(
            gateway.url, MODEL, 16, seconds=args.profile_seconds + 1, warmup=0.5, cpu=lambda: 0.0
        )
    )
    await asyncio.sleep(0.7)
    counts = await asyncio.to_thread(profile, gateway.proc.pid, args.profile_seconds, workdir)
    await load
    return counts


# ------------------------------------------------------------------------------ report


def report(pairs: list[Pair], big_direct: float, big_via: float, counts: object) -> None:
    print(f"one worker (double, CPU), direct and through one gateway; {os.cpu_count()} CPUs; "
          "load generator in this process; medians")  # fmt: skip
    for layout in dict.fromkeys(p.layout for p in pairs):
        print()
        print(f"cores -- {layout.describe()}")
        rows = [p for p in pairs if p.layout == layout]
        table(rows)
        print()
        bursts(rows)
    print()
    print("wkr us / gw us: CPU per request of the worker / gateway process; gw/wkr: the gateway's")
    print(
        "CPU per request over the worker's in the same window; gw/direct: over the worker's direct"
    )
    print("burst: a closed loop moves its requests in flight as a burst; a gateway that held a")
    print("burst until it had handled all of it would add about in flight x its CPU per request")
    print("(what it added before it wrote every 8 calls to the worker, gateway/channel.py")
    print("FLUSH_EVERY); cores: those the load generator, gateway and worker kept busy")
    print()
    print(f"one 38 MB input, inline: direct {big_direct * 1e3:.0f} ms, through the gateway "
          f"{big_via * 1e3:.0f} ms (x{big_via / big_direct:.2f})")  # fmt: skip
    print()
    if isinstance(counts, str):
        print(counts)
        return
    assert isinstance(counts, Counter)
    total = sum(counts.values()) or 1
    print("where the gateway's CPU goes (py-spy, GIL-holding samples, 16 in flight):")
    for label, n in counts.most_common():
        print(f"  {n / total * 100:5.1f} %  {label}")


def table(pairs: Sequence[Pair]) -> None:
    """Throughput, latency and CPU per request, direct and through the gateway."""
    head = (
        f"{'in flight':>9} | {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'wkr us':>7} | "
        f"{'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'gw us':>6} {'wkr us':>7} | "
        f"{'+p50 ms':>7} {'gw/wkr':>6} {'gw/direct':>9}"
    )
    print(f"{'':>9} | {'direct to the worker':^31} | {'through the gateway':^38} |")
    print(head)
    med = Pair.med
    for p in pairs:
        d_rps = med([r.rps for r in p.direct])
        d_p50 = med([r.p50 for r in p.direct])
        d_p99 = med([r.p99 for r in p.direct])
        d_cpu = med([r.cpu_per_request for r in p.direct])
        g_rps = med([r.rps for r in p.gateway])
        g_p50 = med([r.p50 for r in p.gateway])
        g_p99 = med([r.p99 for r in p.gateway])
        g_cpu = med(p.gateway_cpu)
        w_cpu = med(p.worker_cpu_via)
        print(
            f"{p.concurrency:>9} | {d_rps:>7.0f} {d_p50 * 1e3:>7.2f} {d_p99 * 1e3:>7.2f} "
            f"{d_cpu * 1e6:>7.0f} | {g_rps:>7.0f} {g_p50 * 1e3:>7.2f} {g_p99 * 1e3:>7.2f} "
            f"{g_cpu * 1e6:>6.0f} {w_cpu * 1e6:>7.0f} | {(g_p50 - d_p50) * 1e3:>7.2f} "
            f"{g_cpu / w_cpu:>6.2f} {g_cpu / d_cpu:>9.2f}"
        )


def bursts(pairs: Sequence[Pair]) -> None:
    """The added p50 beside the burst bound and the busy cores, and window by window."""
    med = Pair.med
    print(f"{'in flight':>9} | {'+p50 ms':>7} | {'burst':>8} | "
          f"{'load':>5} {'gw':>5} {'wkr':>5} {'all':>5} cores of {os.cpu_count()} | "
          "+p50 ms, window by window")  # fmt: skip
    for p in pairs:
        added = med([r.p50 for r in p.gateway]) - med([r.p50 for r in p.direct])
        burst = p.concurrency * med(p.gateway_cpu)
        busy = [med([b[i] for b in p.busy_via]) for i in range(3)]
        # Each gateway window against the direct window just before it: the spread a
        # closed loop on shared cores shows from one window to the next.
        each = " ".join(
            f"{(g.p50 - d.p50) * 1e3:.2f}" for d, g in zip(p.direct, p.gateway, strict=True)
        )
        print(
            f"{p.concurrency:>9} | {added * 1e3:>7.2f} | {burst * 1e3:>5.2f} ms | "
            + " ".join(f"{b:>5.2f}" for b in busy)
            + f" {sum(busy):>5.2f}             | {each}"
        )


async def _run(args: argparse.Namespace, workdir: Path) -> None:
    repo = workdir / "repo"
    build_repo(repo, zoo=(MODEL,), exported=(BIG_MODEL,))
    worker = start_ours(repo, workdir, cache_dir=workdir / "cache")
    gateway: Server | None = None
    try:
        await wait_ready(worker, [MODEL, BIG_MODEL])
        # The cores this process may use, read before any pinning narrows them; the
        # rest of the run is back on all of them.
        cores = os.sched_getaffinity(0)
        if args.baseline:
            compared = await against_baseline(args, worker, workdir, layouts(args.layouts, cores))
            baseline_report(compared)
            return
        gateway = start_gateway(worker, workdir)
        await wait_ready(gateway, [MODEL, BIG_MODEL])
        pairs = await measure(args, worker, gateway, layouts(args.layouts, cores))
        place(*layouts(["shared"], cores), gateway, worker)
        big_direct = await big(worker.url, args.big_repeats)
        big_via = await big(gateway.url, args.big_repeats)
        counts = (
            await profiled_load(args, gateway, workdir) if args.profile_seconds else "no profile"
        )
    finally:
        if gateway is not None:
            gateway.stop()
        worker.stop()
    report(pairs, big_direct, big_via, counts)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="windows per row and side")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured lead-in")
    parser.add_argument("--big-repeats", type=int, default=3, help="38 MB calls per side")
    parser.add_argument("--profile-seconds", type=float, default=5.0, help="0: no profile")
    parser.add_argument(
        "--layouts",
        nargs="+",
        choices=LAYOUTS,
        default=list(LAYOUTS),
        help="core layouts to measure the rows in (shared: the kernel's choice; pinned: "
        "the worker on a core of its own)",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="instead of the tables: this tree's gateway against the one at git revision REV "
        "(CPU per request and p50 at 16 in flight, side by side)",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=3,
        help="with --baseline: start both gateways afresh this many times (--runs windows "
        "each per layout); one pair of processes can be a few percent apart on identical code",
    )
    parser.add_argument("--workdir", help="keep the repository, cache and logs here")
    args = parser.parse_args(argv)
    run_in_workdir(args.workdir, "rs_bench_gateway_", partial(_run, args))


if __name__ == "__main__":
    main()
