"""Gateway benchmark: the same load direct to one worker and through a gateway in front of it.

What it measures (issues 17 and 34), side by side in one run:

* one-row ``double`` requests (``y = 2 * x``, FP32 ``[1, 16]``), closed loop, in client
  shapes (``--shapes``): ``CxS`` is C HTTP/2 connections with S requests in flight on each
  (default ``1x1,1x16,4x16,16x4,1x64``): requests/s and p50/p99, direct and through the
  gateway, and the p50 the gateway adds. The gateway sees the shape the client has: a
  single connection hands it a burst in one read, several connections in several reads,
  and 64 in flight are more than the 32 streams it opens to one worker, so a shape can
  cost it more per request than another with the same requests in flight;
* the load generator (``--load``): ``tritonclient`` (``tritonclient.grpc.aio`` in this
  process, one channel per connection) or ``h2load`` (nghttp2's C load generator, Debian
  ``nghttp2-client``: ``-c C -m S`` POSTing the framed request, a fraction of the CPU per
  request, on a core of the load generator's; its per-request log gives the latencies,
  and every answer is checked to be 200 with a whole OK reply);
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
* where the gateway's CPU goes: a ``py-spy`` profile of the gateway under each shape's
  load (samples holding the GIL, by package, a column per shape), when py-spy can attach.

Processes as deployed: ``python -m reactantserver.cli serve node.yaml`` (one CPU worker,
``fair``, ``max_concurrent_requests: 1024``) and ``python -m reactantserver.cli gateway
gateway.yml`` (round_robin, one endpoint). Rows are measured ``--runs`` times, direct and
gateway alternating (each run takes every layout in turn), and each figure is the median.
Latency and requests/s are properties of the trio and of the cores they were given; CPU
per request is each process's own.

    python benchmarks/bench_gateway.py                  # the tables (about 5 minutes)
    python benchmarks/bench_gateway.py --runs 1 --seconds 2
    python benchmarks/bench_gateway.py --load h2load --shapes 1x16,4x16,16x4
    python benchmarks/bench_gateway.py --baseline REV   # this gateway against REV's,
                                                        # three pairs of processes, 1x16
    python benchmarks/bench_gateway.py --baseline REV --shapes 1x16,4x16  # a table each
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
    small_input,
    start_ours,
    tensor_input,
    versus,
    wait_ready,
)
from bench_serve import pair_ratios as serve_pair_ratios  # noqa: E402

MODEL = "double"
LAYOUTS = ("shared", "pinned")
LOADS = ("tritonclient", "h2load")
#: The shapes measured unless ``--shapes`` says otherwise: one connection at 1, 16 and 64
#: in flight (issue 17's rows), and 64 in flight over 4 and 16 connections (issue 34).
DEFAULT_SHAPES = "1x1,1x16,4x16,16x4,1x64"
#: ``--baseline``'s shapes unless ``--shapes`` says otherwise (each costs a full set of
#: windows per pair of processes).
BASELINE_SHAPES = "1x16"
INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
#: h2load runs this much past the measured window, so that no connection is closing in it.
H2LOAD_TAIL = 0.5


@attrs.frozen(order=True)
class Shape:
    """A client shape: ``connections`` HTTP/2 connections, ``streams`` requests in flight
    on each (a closed loop: each stream sends its next request when it has its answer)."""

    connections: int
    streams: int

    @property
    def in_flight(self) -> int:
        return self.connections * self.streams

    def __str__(self) -> str:
        return f"{self.connections}x{self.streams}"


def parse_shapes(text: str) -> list[Shape]:
    """``"1x16,4x16"`` -> the shapes, in order, each once (``--shapes``)."""
    shapes = []
    for part in text.split(","):
        found = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", part)
        if found is None or int(found[1]) < 1 or int(found[2]) < 1:
            raise argparse.ArgumentTypeError(
                f"{part.strip()!r} is not a client shape: write CONNECTIONSxSTREAMS, both at "
                "least 1, shapes separated by commas (e.g. 1x16,4x16,16x4)"
            )
        shapes.append(Shape(int(found[1]), int(found[2])))
    return list(dict.fromkeys(shapes))


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


# ------------------------------------------------------------------ load generators


def framed_request() -> bytes:
    """The one-row ``double`` request as h2load posts it: the gRPC length prefix, then the
    serialized ``ModelInferRequest`` (the request the Python client sends)."""
    from tritonclient.grpc import service_pb2 as pb

    x, _ = small_input()
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=x.shape)
    message = pb.ModelInferRequest(
        model_name=MODEL, inputs=[tensor], raw_input_contents=[x.tobytes()]
    ).SerializeToString()
    return b"\x00" + len(message).to_bytes(4, "big") + message


async def check_request(url: str, framed: bytes) -> int:
    """Send ``framed`` once as raw bytes (grpc) and check that the answer is ``2 * x``;
    returns the length of the framed answer, the DATA every OK answer to it carries."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    async with grpc.aio.insecure_channel(url) as channel:
        raw = await channel.unary_unary(INFER_PATH)(framed[5:])
    y = np.frombuffer(pb.ModelInferResponse.FromString(raw).raw_output_contents[0], np.float32)
    x, _ = small_input()
    if not np.array_equal(y, 2 * x.ravel()):
        raise AssertionError(f"{url}: wrong answer {y!r} to h2load's request (2 * {x!r})")
    return 5 + len(raw)


def h2load_latencies(log: str, opened: float, closed: float) -> list[float]:
    """Sorted latencies (seconds) of the requests in h2load's ``--log-file`` text that ended
    between ``opened`` and ``closed`` (seconds since the epoch), the window whose CPU is
    read. Raises on any request answered other than HTTP 200 (-1: the stream failed),
    inside the window or not."""
    latencies = []
    bad: Counter[str] = Counter()
    for line in log.splitlines():
        start_us, status, took_us = line.split("\t")[:3]
        if status != "200":
            bad[status] += 1
        if opened <= (int(start_us) + int(took_us)) / 1e6 <= closed:
            latencies.append(int(took_us) / 1e6)
    if bad:
        raise AssertionError(
            f"h2load: requests answered with HTTP status other than 200: {dict(bad)}"
        )
    latencies.sort()
    return latencies


def check_h2load_summary(out: str, reply_bytes: int) -> None:
    """h2load's summary says every request it finished succeeded with a whole OK answer:
    none failed or errored, and its DATA bytes are ``reply_bytes`` per request done (a
    gRPC error is trailers-only, no DATA: a shortfall is an answer that was not OK)."""
    requests = re.search(
        r"requests: .*?(\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", out
    )
    traffic = re.search(r"traffic: .*\((\d+)\) data", out)
    if requests is None or traffic is None:
        raise AssertionError(f"h2load's summary was not understood:\n{out[-2000:]}")
    done, succeeded, failed, errored = map(int, requests.groups())
    data = int(traffic[1])
    if failed or errored or succeeded != done or data != done * reply_bytes:
        raise AssertionError(
            f"h2load: {done} done, {succeeded} succeeded, {failed} failed, {errored} errored, "
            f"{data} DATA bytes where {done} OK answers carry {done * reply_bytes}:\n{out[-2000:]}"
        )


@attrs.frozen
class TritonLoad:
    """``tritonclient.grpc.aio`` in this process: one channel per connection, the shape's
    streams as coroutines each looping ``infer`` (:func:`bench_serve.closed_loop`)."""

    name = "tritonclient.grpc.aio in this process"

    async def window(
        self, url: str, shape: Shape, *, seconds: float, warmup: float, pids: Sequence[int]
    ) -> LoadResult:
        """One closed-loop window; its ``cpu_seconds`` is every pid's CPU and, last, this
        process's own (``time.process_time`` counts no children) as a numpy array."""
        return await closed_loop(
            url,
            MODEL,
            shape.in_flight,
            connections=shape.connections,
            seconds=seconds,
            warmup=warmup,
            cpu=lambda: np.array([*(process_cpu(p) for p in pids), time.process_time()]),  # type: ignore[arg-type,return-value]
        )


@attrs.frozen
class H2Load:
    """nghttp2's ``h2load`` as the load generator: ``-c`` connections x ``-m`` streams,
    each stream posting :func:`framed_request` again as it has its answer."""

    exe: str
    #: The file h2load posts (:func:`framed_request`).
    body: Path
    #: DATA bytes of one OK answer (:func:`check_request`).
    reply_bytes: int
    #: Requests a second per connection (h2load's ``--rps``): a paced load rather than a
    #: closed loop; None: as fast as the answers come.
    rps: int | None = None
    name = "h2load (nghttp2, C) in its own process"

    def command(self, url: str, shape: Shape, seconds: float, log: Path) -> list[str]:
        paced = [] if self.rps is None else [f"--rps={self.rps}"]
        return [
            self.exe, "-c", str(shape.connections), "-m", str(shape.streams), *paced,
            "-D", f"{max(1, round(seconds * 1000))}ms", "-d", str(self.body),
            "-H", "content-type: application/grpc", "-H", "te: trailers",
            f"--log-file={log}", f"http://{url}{INFER_PATH}",
        ]  # fmt: skip

    async def window(
        self, url: str, shape: Shape, *, seconds: float, warmup: float, pids: Sequence[int]
    ) -> LoadResult:
        """One window of ``seconds`` after ``warmup``, h2load running a little past both;
        its ``cpu_seconds`` is every pid's CPU and, last, h2load's, as a numpy array. The
        requests counted are those that ended inside the window."""
        log = self.body.with_name(f"h2load_{shape}.tsv")
        log.unlink(missing_ok=True)  # h2load appends to a log that is there
        argv = self.command(url, shape, warmup + seconds + H2LOAD_TAIL, log)
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:

            def cpu() -> np.ndarray:
                return np.array([*(process_cpu(p) for p in pids), process_cpu(proc.pid)])

            await asyncio.sleep(warmup)
            opened, at_open = time.time(), cpu()
            await asyncio.sleep(seconds)
            closed, at_close = time.time(), cpu()
            if proc.returncode is not None:
                raise RuntimeError("h2load ended before its window did")
            out = (await proc.communicate())[0].decode(errors="replace")
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(
                f"h2load failed ({proc.returncode}): {' '.join(argv)}\n{out[-2000:]}"
            )
        check_h2load_summary(out, self.reply_bytes)
        latencies = h2load_latencies(log.read_text(), opened, closed)
        return LoadResult(
            shape.in_flight,
            len(latencies),
            closed - opened,
            tuple(latencies),
            at_close - at_open,  # type: ignore[arg-type]
        )


Load = TritonLoad | H2Load


async def load_generator(name: str, workdir: Path, urls: Sequence[str]) -> Load:
    """The ``--load`` asked for; for h2load, its request checked against each of ``urls``
    (the answer ``2 * x``, and its length learnt)."""
    if name == "tritonclient":
        return TritonLoad()
    exe = shutil.which("h2load")
    if exe is None:
        raise SystemExit(
            "--load h2load: h2load not found on PATH (Debian/Ubuntu: apt-get install "
            "nghttp2-client); or use --load tritonclient"
        )
    body = workdir / "request.bin"
    body.write_bytes(framed_request())
    lengths = {await check_request(url, body.read_bytes()) for url in urls}
    if len(lengths) != 1:
        raise AssertionError(f"the answers to h2load's request differ in length: {lengths}")
    return H2Load(exe, body, lengths.pop())


@attrs.frozen
class Pair:
    """One row: the direct and the gateway windows in one client shape (medians of runs)."""

    layout: Layout
    shape: Shape
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


def cpu_per_request(via: LoadResult) -> tuple[float, float]:
    """The gateway's and the worker's CPU per request in a window through the gateway."""
    gateway, worker = np.asarray(via.cpu_seconds)[:2] / via.requests
    return float(gateway), float(worker)


async def measure(
    args: argparse.Namespace,
    load: Load,
    worker: Server,
    gateway: Server,
    where: Sequence[Layout],
) -> list[Pair]:
    """Every shape in every layout; a run takes each layout in turn, so the layouts see
    the same stretch of a noisy machine."""
    pairs = {
        (layout.name, shape): Pair(layout, shape, [], [], [], [])
        for layout in where
        for shape in args.shapes
    }
    window = partial(load.window, seconds=args.seconds, warmup=args.warmup)
    for shape in args.shapes:
        for _, layout in itertools.product(range(args.runs), where):
            place(layout, gateway, worker)
            pair = pairs[layout.name, shape]
            direct = await window(worker.url, shape, pids=[worker.proc.pid])
            via = await window(gateway.url, shape, pids=[gateway.proc.pid, worker.proc.pid])
            gw_cpu, wkr_cpu = cpu_per_request(via)
            pair.direct.append(attrs.evolve(direct, cpu_seconds=float(direct.cpu_seconds[0])))  # type: ignore[index]
            pair.gateway.append(via)
            pair.gateway_cpu.append(gw_cpu)
            pair.worker_cpu_via.append(wkr_cpu)
            gw, wkr, busy_load = (float(c) / via.seconds for c in via.cpu_seconds)  # type: ignore[attr-defined]
            pair.busy_via.append((busy_load, gw, wkr))
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
            line += versus("gw us", base.gateway_cpu, self.gateway_cpu, self.per_pair)
        return line


def pair_ratios(base: Side, this: Side) -> list[float]:
    """This side's median gateway CPU over the baseline's, for each pair of processes."""
    return serve_pair_ratios(base.gateway_cpu, this.gateway_cpu, this.per_pair)


async def against_baseline(
    args: argparse.Namespace, load: Load, worker: Server, workdir: Path, where: Sequence[Layout]
) -> list[tuple[Layout, Shape, Side, Side]]:
    """This tree's gateway and the one at ``--baseline`` in front of the same worker, both
    running, their windows alternating (each shape, ``--runs`` windows each per layout,
    shape and pair): the CPU a change saves, with the machine's drift shared by both sides.

    Both gateways are started afresh ``--pairs`` times (which starts first alternates):
    one pair of processes can sit a few percent apart on identical code -- where each
    lands in memory, its hash seed -- and keep that offset in every window, so a change of
    a few percent is read from several pairs, never one (docs/benchmarks.md)."""
    tree = baseline_tree(args.baseline, workdir)
    if tree is None:
        return []
    sides = {
        (layout, shape): (Side(args.baseline[:12]), Side("this tree"))
        for layout in where
        for shape in args.shapes
    }
    window = partial(load.window, seconds=args.seconds, warmup=args.warmup)
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
            for layout, shape in itertools.product(where, args.shapes):
                for side in sides[layout, shape]:
                    side.per_pair.append(args.runs)
                for run in range(args.runs):
                    for i in (0, 1) if run % 2 == 0 else (1, 0):
                        gateway = (old, new)[i]
                        place(layout, gateway, worker)
                        via = await window(
                            gateway.url, shape, pids=[gateway.proc.pid, worker.proc.pid]
                        )
                        gw_cpu, wkr_cpu = cpu_per_request(via)
                        side = sides[layout, shape][i]
                        side.gateway_cpu.append(gw_cpu)
                        side.worker_cpu.append(wkr_cpu)
                        side.p50.append(via.p50)
        finally:
            old.stop()
            new.stop()
    return [(layout, shape, *sides[layout, shape]) for layout, shape in sides]


def baseline_report(rows: Sequence[tuple[Layout, Shape, Side, Side]], load: Load) -> None:
    print("this tree's gateway against the baseline's, in front of the same worker, windows")
    print(f"alternating; medians; both gateways restarted for each pair; load: {load.name}")
    for layout, shape, base, this in rows:
        print()
        print(f"shape {shape} ({shape.connections} connections x {shape.streams} in flight "
              f"each), cores -- {layout.describe()}")  # fmt: skip
        print(f"{'gateway':>12} | {'gw us':>6} {'wkr us':>7} {'gw/wkr':>7} {'p50 ms':>7}")
        print(base.row())
        print(this.row(base))


async def big(url: str, repeats: int) -> float | None:
    """Median seconds of one 38 MB request (inline both ways); None for no repeats."""
    if repeats <= 0:
        return None
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
    (
        "reactantserver/transport/h2client",  # trees before issue 46 (a --baseline)
        "gateway: HTTP/2 client to the worker (h2client.py, hpack)",
    ),
    ("reactantserver/h2/client", "gateway: HTTP/2 client to the worker (h2client.py, hpack)"),
    ("reactantserver/gateway/channel", "gateway: worker connections (channel.py, pool.py)"),
    ("reactantserver/gateway/pool", "gateway: worker connections (channel.py, pool.py)"),
    ("reactantserver/gateway", "gateway: proxy, peek, routing, stats"),
    ("reactantserver/transport", "server wire (transport/: h2lean, h2guard, server, framing)"),
    ("reactantserver/h2/", "server wire (transport/: h2lean, h2guard, server, framing)"),
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


def profile(
    pid: int, seconds: float, workdir: Path, name: str = "gateway.pyspy"
) -> Counter[str] | str:
    """py-spy's GIL-holding samples of ``pid``, by the package of the innermost frame (the
    raw stacks kept in ``workdir``/``name``)."""
    spy = shutil.which("py-spy")
    if spy is None:
        return "py-spy not found (pip install py-spy): no profile"
    out = workdir / name
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
    if "reactantserver/transport/h2client" in stack or "reactantserver/h2/client" in stack:
        return _BUCKETS[0][1]
    if "reactantserver/gateway/channel" in stack or "reactantserver/gateway/pool" in stack:
        return _BUCKETS[2][1]
    leaf = stack.rsplit(";", 1)[-1]
    path = re.search(r"\((.*?):\d+\)", leaf)
    return _bucket(path.group(1) if path else leaf)


async def profiled_load(
    args: argparse.Namespace, load: Load, gateway: Server, workdir: Path, shape: Shape
) -> Counter[str] | str:
    """py-spy's profile of the gateway (:func:`profile`) under ``shape``'s load."""
    running = asyncio.ensure_future(
        load.window(gateway.url, shape, seconds=args.profile_seconds + 1, warmup=0.5, pids=[])
    )
    await asyncio.sleep(0.7)
    counts = await asyncio.to_thread(
        profile, gateway.proc.pid, args.profile_seconds, workdir, f"gateway_{shape}.pyspy"
    )
    await running
    return counts


# ------------------------------------------------------------------------------ report


def report(
    pairs: list[Pair],
    load: Load,
    big_direct: float | None,
    big_via: float | None,
    profiles: dict[Shape, Counter[str] | str],
) -> None:
    print(f"one worker (double, CPU), direct and through one gateway; {os.cpu_count()} CPUs; "
          f"load generator: {load.name}; medians")  # fmt: skip
    for layout in dict.fromkeys(p.layout for p in pairs):
        print()
        print(f"cores -- {layout.describe()}")
        rows = [p for p in pairs if p.layout == layout]
        table(rows)
        print()
        bursts(rows)
    print()
    print("shape CxS: C connections with S requests in flight on each")
    print("wkr us / gw us: CPU per request of the worker / gateway process; gw/wkr: the gateway's")
    print(
        "CPU per request over the worker's in the same window; gw/direct: over the worker's direct"
    )
    print("burst: a closed loop moves its requests in flight as a burst; a gateway that held a")
    print("burst until it had handled all of it would add about in flight x its CPU per request")
    print("(what it added before it wrote every 8 calls to the worker, gateway/channel.py")
    print("FLUSH_EVERY); cores: those the load generator, gateway and worker kept busy")
    print()
    if big_direct is not None and big_via is not None:
        print(f"one 38 MB input, inline: direct {big_direct * 1e3:.0f} ms, through the gateway "
              f"{big_via * 1e3:.0f} ms (x{big_via / big_direct:.2f})")  # fmt: skip
    print()
    if profiles:
        print_profiles(profiles)
    else:
        print("no profile (--profile-seconds 0)")


def print_profiles(profiles: dict[Shape, Counter[str] | str]) -> None:
    """Where the gateway's CPU goes, a column per shape (percent of its samples)."""
    counted = {shape: c for shape, c in profiles.items() if isinstance(c, Counter)}
    for shape, why in profiles.items():
        if not isinstance(why, Counter):
            print(f"{shape}: {why}")
    if not counted:
        return
    print("where the gateway's CPU goes (py-spy, GIL-holding samples, % of each shape's):")
    totals = {shape: sum(c.values()) or 1 for shape, c in counted.items()}
    labels = sum(counted.values(), Counter()).most_common()
    print("  " + " ".join(f"{shape!s:>6}" for shape in counted))
    for label, _ in labels:
        shares = " ".join(f"{c[label] / totals[s] * 100:>6.1f}" for s, c in counted.items())
        print(f"  {shares}  {label}")


def table(pairs: Sequence[Pair]) -> None:
    """Throughput, latency and CPU per request, direct and through the gateway, a row per
    client shape."""
    head = (
        f"{'shape':>9} | {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'wkr us':>7} | "
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
            f"{p.shape!s:>9} | {d_rps:>7.0f} {d_p50 * 1e3:>7.2f} {d_p99 * 1e3:>7.2f} "
            f"{d_cpu * 1e6:>7.0f} | {g_rps:>7.0f} {g_p50 * 1e3:>7.2f} {g_p99 * 1e3:>7.2f} "
            f"{g_cpu * 1e6:>6.0f} {w_cpu * 1e6:>7.0f} | {(g_p50 - d_p50) * 1e3:>7.2f} "
            f"{g_cpu / w_cpu:>6.2f} {g_cpu / d_cpu:>9.2f}"
        )


def bursts(pairs: Sequence[Pair]) -> None:
    """The added p50 beside the burst bound and the busy cores, and window by window."""
    med = Pair.med
    print(f"{'shape':>9} | {'+p50 ms':>7} | {'burst':>8} | "
          f"{'load':>5} {'gw':>5} {'wkr':>5} {'all':>5} cores of {os.cpu_count()} | "
          "+p50 ms, window by window")  # fmt: skip
    for p in pairs:
        added = med([r.p50 for r in p.gateway]) - med([r.p50 for r in p.direct])
        burst = p.shape.in_flight * med(p.gateway_cpu)
        busy = [med([b[i] for b in p.busy_via]) for i in range(3)]
        # Each gateway window against the direct window just before it: the spread a
        # closed loop on shared cores shows from one window to the next.
        each = " ".join(
            f"{(g.p50 - d.p50) * 1e3:.2f}" for d, g in zip(p.direct, p.gateway, strict=True)
        )
        print(
            f"{p.shape!s:>9} | {added * 1e3:>7.2f} | {burst * 1e3:>5.2f} ms | "
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
            load = await load_generator(args.load, workdir, [worker.url])
            compared = await against_baseline(
                args, load, worker, workdir, layouts(args.layouts, cores)
            )
            baseline_report(compared, load)
            return
        gateway = start_gateway(worker, workdir)
        await wait_ready(gateway, [MODEL, BIG_MODEL])
        load = await load_generator(args.load, workdir, [worker.url, gateway.url])
        pairs = await measure(args, load, worker, gateway, layouts(args.layouts, cores))
        place(*layouts(["shared"], cores), gateway, worker)
        big_direct = await big(worker.url, args.big_repeats)
        big_via = await big(gateway.url, args.big_repeats)
        profiles: dict[Shape, Counter[str] | str] = {}
        for shape in args.shapes if args.profile_seconds else ():
            profiles[shape] = await profiled_load(args, load, gateway, workdir, shape)
    finally:
        if gateway is not None:
            gateway.stop()
        worker.stop()
    report(pairs, load, big_direct, big_via, profiles)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="windows per row and side")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured lead-in")
    parser.add_argument("--big-repeats", type=int, default=3, help="38 MB calls per side")
    parser.add_argument(
        "--profile-seconds", type=float, default=5.0, help="per shape; 0: no profile"
    )
    parser.add_argument(
        "--shapes",
        type=parse_shapes,
        metavar="CxS,...",
        help="client shapes, CxS: C connections with S requests in flight on each (default "
        f"{DEFAULT_SHAPES}; with --baseline {BASELINE_SHAPES})",
    )
    parser.add_argument(
        "--load",
        choices=LOADS,
        default="tritonclient",
        help="the load generator: tritonclient.grpc.aio in this process, or nghttp2's h2load "
        "(apt-get install nghttp2-client) in a process of its own",
    )
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
        "(CPU per request and p50 in each shape, side by side)",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=3,
        help="with --baseline: start both gateways afresh this many times (--runs windows "
        "each per layout and shape); one pair of processes can be a few percent apart on "
        "identical code",
    )
    parser.add_argument("--workdir", help="keep the repository, cache and logs here")
    args = parser.parse_args(argv)
    if args.shapes is None:
        args.shapes = parse_shapes(BASELINE_SHAPES if args.baseline else DEFAULT_SHAPES)
    run_in_workdir(args.workdir, "rs_bench_gateway_", partial(_run, args))


if __name__ == "__main__":
    main()
