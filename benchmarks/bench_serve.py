"""Serving benchmark: a real worker process, driven over gRPC by ``tritonclient.grpc.aio``.

What it measures (issue 6), on a temporary repository holding the zoo's ``double``
(``y = 2 * x``, FP32 ``[-1, 16]``, the smallest zoo model) and ``double_38mb`` (the same
function, unbatched at ``[593750, 16]``: 38,000,000 bytes; see ``peer/bundles.py``):

* requests/s and p50/p99 latency at 1, 16 and 64 requests in flight, one-row requests;
* the server's CPU time per request: user + system seconds of the server's process tree
  (``psutil``) over the measured window, divided by the requests answered in it;
* one 38 MB input answered inline (request and response through gRPC) and through
  system shared memory (input and output in registered regions, ``tritonclient.utils
  .shared_memory``): latency, MB/s of input and server CPU per request;
* where the server's CPU goes at each number in flight: a second window per row during
  which ``py-spy record --gil`` samples the server (so the figures above are taken
  without a profiler attached); each sample is attributed to the innermost frame of a
  known package (Trio, asyncio, h2, grpclib, ours by module...), and the shares times the
  CPU per request give microseconds per request. Without py-spy (or without the right
  to attach to a process) this table is skipped, saying why;
* the scheduler's per-dispatch decision, in-process: ``SchedulingPolicy.submit``,
  ``next_batch`` and ``complete`` with one model queued (the common case) and with 16
  models competing, microseconds per call.

The server is ``python -m reactantserver.cli serve node.yaml`` in its own process, as
deployed; the load generator is this process (one ``grpc.aio`` channel, ``N`` coroutines
each looping ``infer``). On a small machine the two share the cores, so requests/s is a
property of the pair; CPU per request is the server's alone. Every request's answer is
checked once against ``2 * x`` before measuring.

    python benchmarks/bench_serve.py                   # the tables (about two minutes)
    python benchmarks/bench_serve.py --seconds 5       # longer windows
    python benchmarks/bench_serve.py --no-profile      # without the CPU breakdown
    python benchmarks/bench_serve.py --baseline REV    # server CPU per request against
                                                       # REV's worker, windows alternating

``benchmarks/peer/bench_peer.py`` imports the pieces below to compare with MLServer.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from functools import partial
from pathlib import Path

import attrs
import numpy as np
import psutil
import tritonclient.grpc.aio as aioclient
import tritonclient.utils.shared_memory as tshm
from tritonclient.grpc import InferInput, InferRequestedOutput

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SMALL_MODEL = "double"
BIG_MODEL = "double_38mb"
FEATURES = 16
#: 593750 rows x 16 FP32 = 38,000,000 bytes (see peer/bundles.py).
BIG_ROWS = 593_750
CONCURRENCY = (1, 16, 64)
#: What the load generator's channel may send and receive (the 38 MB tensors).
MAX_MESSAGE = 512 * 1024 * 1024
CHANNEL_ARGS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
]


# ------------------------------------------------------------------------------ results


@attrs.frozen
class LoadResult:
    """One measured window of closed-loop load at a fixed number of requests in flight."""

    concurrency: int
    requests: int
    seconds: float
    #: Latencies of the requests answered inside the window, sorted, seconds.
    latencies: tuple[float, ...]
    #: Server CPU (user + system, whole process tree) spent during the window.
    cpu_seconds: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 99)

    @property
    def cpu_per_request(self) -> float:
        return self.cpu_seconds / self.requests if self.requests else float("nan")


@attrs.frozen
class BigResult:
    """Repeated single calls carrying one 38 MB tensor."""

    how: str
    nbytes: int
    latencies: tuple[float, ...]
    cpu_seconds: float

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies)

    @property
    def mbps(self) -> float:
        return self.nbytes / self.p50 / 1e6

    @property
    def cpu_per_request(self) -> float:
        return self.cpu_seconds / len(self.latencies)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (nan when empty)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, round(q / 100 * len(sorted_values) + 0.5 - 1e-9))
    return sorted_values[min(rank, len(sorted_values)) - 1]


# ------------------------------------------------------------------------------ processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and all its descendants so far."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = proc.cpu_times()
            total += t.user + t.system
    return total


def build_repo(
    out: Path, zoo: Sequence[str] = (SMALL_MODEL,), exported: Sequence[str] = (BIG_MODEL,)
) -> None:
    """Zoo bundles (``examples/build_repo.py``) and ``peer/bundles.py`` exports into
    ``out``; bundles already there are kept."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    missing = [n for n in zoo if not (out / n / "manifest.yaml").is_file()]
    if missing:
        build = [sys.executable, str(ROOT / "examples" / "build_repo.py")]
        subprocess.run(
            [*build, "--only", ",".join(missing), "--out", str(out)],
            check=True,
            stdout=subprocess.DEVNULL,
            env=env,
        )
    for name in exported:
        if not (out / name / "manifest.yaml").is_file():
            spec = f"{HERE / 'peer' / 'bundles.py'}:{name}"
            subprocess.run(
                [sys.executable, "-m", "reactantserver.cli", "export", spec,
                 "--out", str(out / name), "--platforms", "cpu"],
                check=True,
                stdout=subprocess.DEVNULL,
                env=env,
            )  # fmt: skip


NODE_YAML = """\
# Written by benchmarks/bench_serve.py: one CPU worker serving the benchmark repository.
model_repo: {repo}
base_port: {port}
metrics_base_port: {metrics_port}
gpus: 0
workers:
  - name: bench
global:
  cache_dir: {cache}
  model_control_mode: static
  runtime:
    backend: cpu
{runtime_extra}  scheduler:
    discipline: {discipline}
{scheduler_extra}  endpoints:
    host: 127.0.0.1
    max_concurrent_requests: 1024
"""


@attrs.define
class Server:
    """A server process on 127.0.0.1:``port`` (ours or the peer), stopped with SIGTERM."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    #: Admin HTTP port (``/metrics``); 0 = none.
    metrics_port: int = 0

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cpu(self) -> float:
        return process_cpu(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_ours(
    repo: Path,
    workdir: Path,
    *,
    cache_dir: Path,
    scheduler_extra: str = "",
    runtime_extra: str = "",
    discipline: str = "fair",
    metrics_port: int = 0,
    pin: Callable[[], None] | None = None,
    src: Path | None = None,
) -> Server:
    """``reactantserver serve`` on a fresh node file; returns once the process runs.

    ``scheduler_extra`` / ``runtime_extra``: more YAML lines (indented four spaces) under
    ``global.scheduler`` / ``global.runtime``; ``metrics_port``: its admin port (0 = off);
    ``pin``: run in the child before it starts (``os.sched_setaffinity``: its cores);
    ``src``: another tree's ``src/``, first on the child's path (``--baseline``).
    """
    port = free_port()
    node = workdir / f"node_{port}.yaml"
    node.write_text(
        NODE_YAML.format(
            repo=repo,
            port=port,
            cache=cache_dir,
            scheduler_extra=scheduler_extra,
            runtime_extra=runtime_extra,
            discipline=discipline,
            metrics_port=metrics_port,
        )
    )
    log = workdir / f"ours_{port}.log"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [env.get("PYTHONPATH")])])
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reactantserver.cli",
                "serve",
                str(node),
                "--log-level",
                "warning",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=pin,
        )
    return Server("reactantserver", proc, port, log, metrics_port)


async def wait_ready(server: Server, models: Sequence[str], timeout: float = 180.0) -> None:
    """Poll until every model answers ModelReady (the process must stay alive)."""
    client = aioclient.InferenceServerClient(server.url, channel_args=CHANNEL_ARGS)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                raise RuntimeError(
                    f"{server.name} exited with {server.proc.returncode}; its log "
                    f"({server.log}):\n{server.log.read_text()[-3000:]}"
                )
            with contextlib.suppress(Exception):
                ready = [await client.is_model_ready(m) for m in models]
                if all(ready):
                    return
            await asyncio.sleep(0.2)
        raise TimeoutError(f"{server.name} was not ready after {timeout} s")
    finally:
        await client.close()


# ------------------------------------------------------------------------------ load


def tensor_input(name: str, x: np.ndarray) -> InferInput:
    inp = InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def small_input(rows: int = 1) -> tuple[np.ndarray, InferInput]:
    """One ``[rows, 16]`` FP32 request for ``double``."""
    x = np.arange(rows * FEATURES, dtype=np.float32).reshape(rows, FEATURES)
    return x, tensor_input("x", x)


async def check_double(client: aioclient.InferenceServerClient, model: str) -> None:
    """Fail unless ``model`` answers ``y = 2 * x``."""
    x, inp = small_input()
    result = await client.infer(model, [inp])
    y = result.as_numpy("y")
    if y is None or not np.array_equal(y, 2 * x):
        raise AssertionError(f"{model}: wrong answer {y!r} for 2 * {x!r}")


async def closed_loop(
    url: str,
    model: str,
    concurrency: int,
    *,
    seconds: float,
    warmup: float,
    cpu: Callable[[], float],
    inputs: Sequence[InferInput] | None = None,
    connections: int = 1,
) -> LoadResult:
    """``concurrency`` coroutines each sending ``inputs`` back to back (default: one
    ``double`` row, whose answer is checked first), spread evenly over ``connections``
    clients, each its own HTTP/2 connection (a channel of its own subchannel pool: grpc
    would otherwise share one connection among channels to the same address).

    Requests started before the window opens (the warm-up) or answered after it closes
    are not counted; CPU is read at the window's edges.
    """
    own = [("grpc.use_local_subchannel_pool", 1)] if connections > 1 else []
    clients = [
        aioclient.InferenceServerClient(url, channel_args=[*CHANNEL_ARGS, *own])
        for _ in range(connections)
    ]
    try:
        if inputs is None:
            for client in clients:
                await check_double(client, model)
            inputs = [small_input()[1]]
        inp = list(inputs)
        loop = asyncio.get_running_loop()
        start = loop.time() + warmup
        end = start + seconds
        latencies: list[float] = []
        marks: dict[str, float] = {}

        async def edge(name: str, at: float) -> None:
            await asyncio.sleep(max(0.0, at - loop.time()))
            marks[name] = cpu()

        async def one(client: aioclient.InferenceServerClient) -> None:
            while (t0 := loop.time()) < end:
                await client.infer(model, inp)
                t1 = loop.time()
                if t0 >= start and t1 <= end:
                    latencies.append(t1 - t0)

        await asyncio.gather(
            edge("start", start),
            edge("end", end),
            *(one(clients[i % connections]) for i in range(concurrency)),
        )
        latencies.sort()
        return LoadResult(
            concurrency, len(latencies), seconds, tuple(latencies), marks["end"] - marks["start"]
        )
    finally:
        for client in clients:
            await client.close()


def big_array() -> np.ndarray:
    return np.arange(BIG_ROWS * FEATURES, dtype=np.float32).reshape(BIG_ROWS, FEATURES) % 1000


async def _repeat(
    call: Callable[[], Awaitable[None]], repeats: int, cpu: Callable[[], float]
) -> tuple[tuple[float, ...], float]:
    await call()  # warm up
    c0 = cpu()
    latencies = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await call()
        latencies.append(time.perf_counter() - t0)
    return tuple(latencies), cpu() - c0


async def big_inline(url: str, model: str, *, repeats: int, cpu: Callable[[], float]) -> BigResult:
    """One 38 MB input per call, request and response inline."""
    x = big_array()
    inp = InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    client = aioclient.InferenceServerClient(url, channel_args=CHANNEL_ARGS)
    try:
        first = await client.infer(model, [inp])
        if not np.array_equal(first.as_numpy("y"), 2 * x):
            raise AssertionError(f"{model}: wrong answer for the 38 MB input")

        async def call() -> None:
            await client.infer(model, [inp])

        latencies, cpu_s = await _repeat(call, repeats, cpu)
    finally:
        await client.close()
    return BigResult("inline", x.nbytes, latencies, cpu_s)


async def big_inline_ours_client(
    url: str, model: str, *, repeats: int, cpu: Callable[[], float]
) -> BigResult:
    """:func:`big_inline` with ``reactantserver.client.AsyncClient`` as the client: the
    same tensor and checks, a client whose own cost per 38 MB call is small (docs/client.md)."""
    from reactantserver.client import AsyncClient

    x = big_array()
    async with AsyncClient(url, timeout=120) as client:
        first = await client.infer(model, {"x": x})
        if not np.array_equal(first["y"], 2 * x):
            raise AssertionError(f"{model}: wrong answer for the 38 MB input")

        async def call() -> None:
            await client.infer(model, {"x": x})

        latencies, cpu_s = await _repeat(call, repeats, cpu)
    return BigResult("inline, reactantserver.client", x.nbytes, latencies, cpu_s)


@contextlib.contextmanager
def _region(name: str, nbytes: int) -> Iterator[tuple[str, object]]:
    key = f"/reactantserver-bench_{name}_{uuid.uuid4().hex[:8]}"
    handle = tshm.create_shared_memory_region(name, key, nbytes)
    try:
        yield key, handle
    finally:
        tshm.destroy_shared_memory_region(handle)


async def big_shm(url: str, model: str, *, repeats: int, cpu: Callable[[], float]) -> BigResult:
    """One 38 MB input per call through system shared memory, output likewise."""
    x = big_array()
    tag = uuid.uuid4().hex[:6]
    names = (f"bench_in_{tag}", f"bench_out_{tag}")
    client = aioclient.InferenceServerClient(url, channel_args=CHANNEL_ARGS)
    with (
        _region(names[0], x.nbytes) as (key_in, h_in),
        _region(names[1], x.nbytes) as (
            key_out,
            h_out,
        ),
    ):
        try:
            tshm.set_shared_memory_region(h_in, [x])
            await client.register_system_shared_memory(names[0], key_in, x.nbytes)
            await client.register_system_shared_memory(names[1], key_out, x.nbytes)
            inp = InferInput("x", list(x.shape), "FP32")
            inp.set_shared_memory(names[0], x.nbytes)
            out = InferRequestedOutput("y")
            out.set_shared_memory(names[1], x.nbytes)

            async def call() -> None:
                await client.infer(model, [inp], outputs=[out])

            await call()
            y = tshm.get_contents_as_numpy(h_out, np.float32, list(x.shape))
            if not np.array_equal(y, 2 * x):
                raise AssertionError(f"{model}: wrong answer in shared memory")
            latencies, cpu_s = await _repeat(call, repeats, cpu)
        finally:
            with contextlib.suppress(Exception):
                for name in names:
                    await client.unregister_system_shared_memory(name)
            await client.close()
    return BigResult("shared memory (in + out)", x.nbytes, latencies, cpu_s)


# ------------------------------------------------------------------------------ profile

#: (category, path prefixes of its frames), checked in order; a sample goes to the
#: innermost frame that matches one. py-spy names a frame's file relative to its
#: ``sys.path`` entry (``h2/connection.py``, ``reactantserver/service.py``). The stdlib's
#: generic helpers (functools, contextlib, threading...) match none, so such a frame
#: counts for whoever called it.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ModelInfer codec", ("reactantserver/protocol/codec.py",)),
    ("scheduler: policy, dispatch loop", ("reactantserver/scheduling/", "reactantserver/threads.py")),
    # before the worker's row: the worker's listener (worker/grpc.py) is the wire's
    ("our wire layer (transport/, h2/)", ("reactantserver/transport/", "reactantserver/h2/",
                                          "reactantserver/worker/grpc.py")),
    ("worker: admission, versions", ("reactantserver/worker/", "reactantserver/lifecycle/")),
    ("service, inferio, statistics", ("reactantserver/service.py", "reactantserver/inferio.py",
                                      "reactantserver/histogram.py", "reactantserver/records.py",
                                      "reactantserver/tensors.py", "reactantserver/shm.py")),
    ("executor, assemble, JAX, numpy", ("reactantserver/runtime/", "reactantserver/models.py",
                                        "jax/", "jaxlib/", "numpy/")),
    ("grpclib", ("grpclib/",)),
    ("HTTP/2: h2, hpack, hyperframe", ("h2/", "hpack/", "hyperframe/")),
    ("Trio: run loop, guest ticks", ("trio/", "outcome/", "sniffio/")),
    ("asyncio: event loop, selectors", ("asyncio/", "selectors.py", "socket.py")),
)  # fmt: skip
OTHER = "other (logging, threading, ...)"


def frame_path(frame: str) -> str:
    """``fn (path/file.py:12)`` -> ``path/file.py``."""
    inner = frame[frame.rfind("(") + 1 :]
    return inner.rpartition(":")[0] or inner


def categorize(stack: str) -> str:
    """The category of one collapsed stack (root first, frames ``fn (file:line)``)."""
    for frame in reversed(stack.split(";")):
        path = frame_path(frame)
        for name, prefixes in CATEGORIES:
            if path.startswith(prefixes):
                return name
    return OTHER


def read_collapsed(text: str) -> collections.Counter[str]:
    """Samples per category from ``py-spy record --format raw`` output."""
    counts: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        stack, _, number = line.rpartition(" ")
        if stack and number.isdigit():
            counts[categorize(stack)] += int(number)
    return counts


def py_spy() -> str | None:
    """The py-spy executable, next to this interpreter or on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


async def profiled(
    server: Server, concurrency: int, *, seconds: float, warmup: float, workdir: Path
) -> tuple[collections.Counter[str], LoadResult] | str:
    """One more closed-loop window with py-spy sampling the server; its samples per
    category and the window's figures, or why there is no profile."""
    exe = py_spy()
    if exe is None:
        return "py-spy is not installed (pip install py-spy)"
    out = workdir / f"profile_{concurrency}.txt"

    async def record() -> str:
        await asyncio.sleep(warmup)
        proc = await asyncio.create_subprocess_exec(
            exe, "record", "--gil", "--nonblocking", "--format", "raw", "--rate", "250",
            "--duration", str(max(1, round(seconds))), "--pid", str(server.proc.pid),
            "--output", str(out),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await proc.communicate()
        return "" if proc.returncode == 0 else err.decode(errors="replace").strip()[-300:]

    recording = asyncio.ensure_future(record())
    result = await closed_loop(
        server.url, SMALL_MODEL, concurrency, seconds=seconds, warmup=warmup, cpu=server.cpu
    )
    problem = await recording
    if problem or not out.exists():
        return f"py-spy could not sample the server ({problem or 'no output'})"
    return read_collapsed(out.read_text()), result


def breakdown_table(
    profiles: Sequence[tuple[int, collections.Counter[str], LoadResult]],
) -> list[str]:
    """Share of GIL-holding samples per category, and that share of the CPU per request."""
    names = [name for name, _ in CATEGORIES] + [OTHER]
    head = f"{'where the server CPU goes':<34}" + "".join(
        f"{f'{n} in flight':>22}" for n, _, _ in profiles
    )
    sub = f"{'':<34}" + "".join(f"{'share':>10}{'us/req':>12}" for _ in profiles)
    lines = [head, sub]
    for name in names:
        cells = []
        for _, counts, result in profiles:
            total = sum(counts.values()) or 1
            share = counts[name] / total
            cells.append(f"{share * 100:>9.0f}%{share * result.cpu_per_request * 1e6:>12.0f}")
        lines.append(f"{name:<34}" + "".join(cells))
    totals = "".join(f"{'':>10}{r.cpu_per_request * 1e6:>12.0f}" for _, _, r in profiles)
    lines.append(f"{'CPU per request in that window':<34}{totals}")
    return lines


# ------------------------------------------------------------------------------ decisions


def decision_costs(dispatches: int = 20_000) -> list[str]:
    """The scheduling policy's work per dispatch, in-process: one ``submit``, the
    ``next_batch`` that takes it and the ``complete`` that accounts it, with the
    ``fair`` discipline, for one model with work and for 16 competing."""
    from reactantserver.config import SchedulerConfig
    from reactantserver.scheduling import SchedulingPolicy

    lines = [
        f"{'policy work per dispatch (fair)':<34} {'submit us':>10} {'next_batch us':>14} "
        f"{'complete us':>12}"
    ]
    for models in (1, 16):
        policy = SchedulingPolicy(SchedulerConfig(discipline="fair"))
        names = [f"m{i}" for i in range(models)]
        for name in names:
            policy.add_model(name, [1, 4, 8])
            for size, cost in ((1, 1e-4), (4, 2e-4), (8, 3e-4)):
                policy.seed_cost(name, size, cost)
        now = 0.0
        for name in names[1:]:
            policy.submit(name, None, now=now)
        spent = [0.0, 0.0, 0.0]
        model = names[0]
        clock = time.perf_counter
        for _ in range(dispatches):
            t0 = clock()
            policy.submit(model, None, now=now)
            t1 = clock()
            batch = policy.next_batch(now).batch
            t2 = clock()
            assert batch is not None
            policy.complete(batch, 1e-4, now)
            t3 = clock()
            model = batch.model  # keep every model's queue as deep as it was
            spent[0] += t1 - t0
            spent[1] += t2 - t1
            spent[2] += t3 - t2
            now += 0.001
        sub, dec, com = (x / dispatches * 1e6 for x in spent)
        label = "1 model with queued work" if models == 1 else f"{models} models competing"
        lines.append(f"{label:<34} {sub:>10.1f} {dec:>14.1f} {com:>12.1f}")
    return lines


# ------------------------------------------------------------------------------ the table


def load_row(label: str, r: LoadResult) -> str:
    return (
        f"{label:<26} {r.concurrency:>9} {r.rps:>9.0f} {r.p50 * 1e3:>9.2f} {r.p99 * 1e3:>9.2f} "
        f"{r.cpu_per_request * 1e6:>11.0f}"
    )


def big_row(r: BigResult) -> str:
    return f"{r.how:<26} {r.p50 * 1e3:>9.1f} {r.mbps:>9.0f} {r.cpu_per_request * 1e3:>12.1f}"


async def _run(args: argparse.Namespace, workdir: Path) -> None:
    repo = workdir / "repo"
    build_repo(repo)
    server = start_ours(repo, workdir, cache_dir=workdir / "cache")
    profiles: list[tuple[int, collections.Counter[str], LoadResult]] = []
    no_profile = "" if args.profile else "--no-profile"
    try:
        await wait_ready(server, [SMALL_MODEL, BIG_MODEL])
        results = [
            await closed_loop(
                server.url,
                SMALL_MODEL,
                n,
                seconds=args.seconds,
                warmup=args.warmup,
                cpu=server.cpu,
            )
            for n in CONCURRENCY
        ]
        inline = await big_inline(server.url, BIG_MODEL, repeats=args.repeats, cpu=server.cpu)
        shm = await big_shm(server.url, BIG_MODEL, repeats=args.repeats * 4, cpu=server.cpu)
        for n in CONCURRENCY if args.profile else ():
            got = await profiled(
                server, n, seconds=args.seconds, warmup=args.warmup, workdir=workdir
            )
            if isinstance(got, str):
                no_profile = got
                break
            profiles.append((n, *got))
    finally:
        server.stop()
    print(f"reactantserver {server.url}; {os.cpu_count()} CPUs; load generator in this process")
    print(f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"{'one-row requests':<26} {'in flight':>9} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9} "
        f"{'CPU us/req':>11}"
    )
    for r in results:
        print(load_row(f"{SMALL_MODEL} [1,16] FP32", r))
    print()
    print(f"{'one 38 MB input':<26} {'p50 ms':>9} {'MB/s':>9} {'CPU ms/req':>12}")
    for b in (inline, shm):
        print(big_row(b))
    print(f"{'shared memory speed-up':<26} {inline.p50 / shm.p50:>9.1f}x")
    print()
    if profiles:
        print("\n".join(breakdown_table(profiles)))
        print("(py-spy --gil samples of the server, one more window per row)")
    else:
        print(f"(no CPU breakdown: {no_profile})")
    print()
    print("\n".join(decision_costs()))


def baseline_tree(rev: str, into: Path) -> Path | None:
    """The tree at ``rev`` (src/ and tests/) under ``into``/baseline, or None without git
    (what bench_hostile and bench_gateway compare this tree with)."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev, "src", "tests"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"(no baseline: {exc})")
        return None
    path = into / "baseline"
    path.mkdir()
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(path, filter="data")
    return path


def merge_base() -> str:
    for ref in ("main", "origin/main"):
        out = subprocess.run(
            ["git", "-C", str(ROOT), "merge-base", "HEAD", ref], capture_output=True, text=True
        )
        if out.returncode == 0:
            return out.stdout.strip()
    return "HEAD"


def run_in_workdir(
    workdir: str | None, prefix: str, run: Callable[[Path], Awaitable[None]]
) -> None:
    """``asyncio.run(run(directory))``: ``workdir`` when given (created, kept afterwards),
    else a temporary directory named ``prefix...`` (removed afterwards)."""
    if workdir:
        path = Path(workdir).resolve()
        path.mkdir(parents=True, exist_ok=True)
        asyncio.run(run(path))
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        asyncio.run(run(Path(tmp)))


# ------------------------------------------------------------------ against a baseline


@attrs.define
class Side:
    """One server's windows at one number in flight, in the comparison with a baseline."""

    label: str
    #: Server CPU seconds per request, a window each.
    cpu: list[float] = attrs.Factory(list)
    rps: list[float] = attrs.Factory(list)
    #: How many of the windows above each pair of processes measured, in order.
    per_pair: list[int] = attrs.Factory(list)

    def add(self, r: LoadResult) -> None:
        self.cpu.append(r.cpu_per_request)
        self.rps.append(r.rps)

    def row(self, in_flight: int, base: Side | None = None) -> str:
        med = statistics.median
        line = f"{self.label:>12} {in_flight:>9} {med(self.rps):>9.0f} {med(self.cpu) * 1e6:>11.1f}"
        if base is not None:
            line += versus("CPU", base.cpu, self.cpu, self.per_pair)
        return line


def versus(what: str, base: Sequence[float], this: Sequence[float], per_pair: Sequence[int]) -> str:
    """`` | WHAT xR``: the median of ``this`` over the median of ``base``, then the same
    ratio for each pair of processes (``per_pair``: how many windows each measured, in
    order) when there were several, so an offset one pair carries shows as such."""
    med = statistics.median
    line = f" | {what} x{med(this) / med(base):.3f}"
    pairs = pair_ratios(base, this, per_pair)
    if len(pairs) > 1:
        line += ", by pair of processes " + " ".join(f"x{r:.3f}" for r in pairs)
    return line


def pair_ratios(
    base: Sequence[float], this: Sequence[float], per_pair: Sequence[int]
) -> list[float]:
    """The median of ``this`` over that of ``base``, for each pair of processes."""
    out = []
    at = 0
    for n in per_pair:
        out.append(statistics.median(this[at : at + n]) / statistics.median(base[at : at + n]))
        at += n
    return out


async def against_baseline(args: argparse.Namespace, workdir: Path) -> None:
    """This tree's worker and the one at ``--baseline``, both running on the same
    repository, their windows alternating (``--runs`` each per number in flight and pair
    of processes): the server CPU per request a change costs or saves, with the
    machine's drift shared by both sides. Both servers are started afresh ``--pairs``
    times, which one first alternating (one pair of processes can sit a few percent
    apart on identical code and keep that offset in every window)."""
    tree = baseline_tree(args.baseline, workdir)
    if tree is None:
        return
    repo = workdir / "repo"
    build_repo(repo, exported=())
    label = args.baseline[:12]
    sides = {n: (Side(label), Side("this tree")) for n in CONCURRENCY}
    for pair in range(max(1, args.pairs)):
        starts = [
            partial(start_ours, src=tree / "src", cache_dir=workdir / "cache_base"),
            partial(start_ours, cache_dir=workdir / "cache"),
        ]
        first = (0, 1) if pair % 2 == 0 else (1, 0)
        running: dict[int, Server] = {}
        try:
            for i in first:
                running[i] = starts[i](repo, workdir)
            for server in running.values():
                await wait_ready(server, [SMALL_MODEL])
            for n in CONCURRENCY:
                for side in sides[n]:
                    side.per_pair.append(args.runs)
                for run in range(args.runs):
                    for i in first if run % 2 == 0 else first[::-1]:
                        server = running[i]
                        window = await closed_loop(
                            server.url,
                            SMALL_MODEL,
                            n,
                            seconds=args.seconds,
                            warmup=args.warmup,
                            cpu=server.cpu,
                        )
                        sides[n][i].add(window)
        finally:
            for server in running.values():
                server.stop()
    print(
        f"this tree's worker against {label}'s, one-row {SMALL_MODEL} requests, "
        f"{args.pairs} pairs of processes x {args.runs} windows of {args.seconds:g} s each"
    )
    print(f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'tree':>12} {'in flight':>9} {'req/s':>9} {'CPU us/req':>11}  (medians)")
    for n, (base, this) in sides.items():
        print(base.row(n))
        print(this.row(n, base))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measured window per row")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured lead-in per row")
    parser.add_argument("--repeats", type=int, default=5, help="38 MB inline calls")
    parser.add_argument("--workdir", help="keep the repository, cache and logs here")
    parser.add_argument(
        "--no-profile",
        dest="profile",
        action="store_false",
        help="skip the CPU breakdown (py-spy) windows",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="instead of the tables: this tree's worker against REV's, windows alternating",
    )
    parser.add_argument("--pairs", type=int, default=3, help="--baseline: pairs of processes")
    parser.add_argument("--runs", type=int, default=2, help="--baseline: windows a pair, a side")
    args = parser.parse_args(argv)
    run = against_baseline if args.baseline else _run
    run_in_workdir(args.workdir, "rs_bench_serve_", partial(run, args))


if __name__ == "__main__":
    main()
