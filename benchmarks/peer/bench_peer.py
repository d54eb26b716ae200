"""Peer comparison: reactantserver against MLServer 1.7 on loopback (``nox -s bench_peer``).

Both servers serve the same trivial model, ``y = 2 * x`` on FP32 ``[-1, 16]``: ours as
the zoo's ``double`` bundle (plus ``double_38mb``, the same function compiled for one
38 MB request), MLServer as the custom runtime in ``peer/mlserver/double`` with
``parallel_workers: 0``, ``debug: false`` and ``grpc_max_message_length`` raised to
512 MiB (``peer/mlserver/settings.json``). Both run as their own processes on
127.0.0.1 at the same time; this process drives them with ``tritonclient.grpc.aio``
(``bench_serve.closed_loop``: N coroutines, one channel) and reads each server's CPU
time from its process tree with ``psutil``.

Table 1, per row, each figure the median of ``--runs`` runs (default 3), the servers
alternating run by run (ours, peer, ours, peer, ...): requests/s, p50 and p99 at 1, 16
and 64 one-row requests in flight; server CPU per request; one 38 MB input inline (both)
and through system shared memory (ours; MLServer has no shared-memory data plane);
ratios ours/peer (above 1 is better for requests/s, below 1 for the rest; the shared
memory row compares with the peer's inline time). The 38 MB inline row is measured twice,
with ``tritonclient`` and with ``reactantserver.client`` (``bench_serve
.big_inline_ours_client``) against both servers, alternating likewise: the second
client's own cost per call is a third of the first's, so its ratio shows more of the
servers' difference.

Table 2, ours only: a compute-heavy model at 64 in flight with coalescing on against
``scheduler.models.<name>.max_batch_size: 1`` (two servers, alternating likewise).

``--peer triton`` and ``--peer pytriton`` (or both, ``--peer triton,pytriton``) replace
both tables with the comparison against Triton Inference Server 2.51 and PyTriton, from
PyPI's ``nvidia-pytriton`` in an interpreter of its own (``--peer-python``;
``peer/triton_peer.py`` says how each is set up): the same ``double`` model (ours: the zoo's
bundle compiled at batch sizes 1-64, ``peer/bundles.py:double_b64``; Triton: a Python
backend model with dynamic batching, ``max_batch_size`` 64; PyTriton: ``@batch``), the
same ModelInfer bytes, at 1, 16 and 64 in flight on one connection, with two loads
(``--loads``): nghttp2's ``h2load`` (``-c 1 -m N``, posting the same framed request; every
answer checked: HTTP 200, and the DATA bytes of an OK answer each -- h2load counts a gRPC
error, which has no DATA, as a success) and ``tritonclient.grpc.aio`` (N coroutines, one
channel; the answer checked first). Cores are pinned: the servers on the last core (each
alone on it while measured), the load generator and this process on the others. The
servers alternate run by run; each figure is the median of ``--runs`` and the ratios'
spread is the range over the pairs of runs. h2load's header bytes per answer show what
HPACK saves each server.

``--paced R[,R...]`` adds rows of one request in flight sent at ``R`` requests/s
(``h2load --rps``) rather than in a closed loop: every server then sees the same arrivals,
the same idle gap between two requests. At one in flight a request's CPU grows with that
gap (a server idle between requests meets its next one with cooler caches), and in a
closed loop the faster server also gets the shorter gaps; the paced rows compare the
servers' CPU per request at equal gaps (``R`` below every server's closed-loop rate).

    nox -s bench_peer                       # builds its own virtualenv, then runs this
    nox -s bench_peer -- --runs 5 --seconds 5
    nox -s bench_peer -- --peer triton,pytriton   # makes the nvidia-pytriton interpreter
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TypeVar

import attrs
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # bench_serve, one directory up
sys.path.insert(0, str(HERE))  # triton_peer, beside this file

import bench_gateway as bg  # noqa: E402
import bench_serve as bs  # noqa: E402
import triton_peer as tp  # noqa: E402

PEER_TEMPLATE = HERE / "mlserver"
#: MLServer's model name (one model takes every shape, the 38 MB tensor included).
PEER_MODEL = "double"
BATCHING_MODELS = ("mlp_wide", "resnet")
BATCHING_IN_FLIGHT = 64

T = TypeVar("T")


# ------------------------------------------------------------------------------ servers


def start_mlserver(workdir: Path) -> bs.Server:
    """MLServer on fresh loopback ports, from a copy of ``peer/mlserver``."""
    root = workdir / "mlserver"
    shutil.copytree(PEER_TEMPLATE, root, dirs_exist_ok=True)
    settings = json.loads((root / "settings.json").read_text())
    port = bs.free_port()
    settings.update(grpc_port=port, http_port=bs.free_port(), metrics_port=bs.free_port())
    (root / "settings.json").write_text(json.dumps(settings, indent=2))
    log = workdir / "mlserver.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("mlserver")), "start", str(root)],
            cwd=root,  # MLServer keeps its .envs and .metrics folders in the working dir
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return bs.Server(f"MLServer {importlib.metadata.version('mlserver')}", proc, port, log)


BATCH_CAP = """\
    models:
      mlp_wide: {max_batch_size: 1}
      resnet: {max_batch_size: 1}
"""


# ------------------------------------------------------------------------------ runs


async def alternate(
    runs: int, servers: Sequence[bs.Server], measure: Callable[[bs.Server], Awaitable[T]]
) -> list[list[T]]:
    """``measure`` each server ``runs`` times, A B A B ...; results per server."""
    results: list[list[T]] = [[] for _ in servers]
    for _ in range(runs):
        for i, server in enumerate(servers):
            results[i].append(await measure(server))
    return results


def med(values: Sequence[float]) -> float:
    return statistics.median(values)


def load_figures(results: Sequence[bs.LoadResult]) -> tuple[float, float, float, float]:
    """(req/s, p50 s, p99 s, CPU s per request), each the median over the runs."""
    return (
        med([r.rps for r in results]),
        med([r.p50 for r in results]),
        med([r.p99 for r in results]),
        med([r.cpu_per_request for r in results]),
    )


def big_figures(results: Sequence[bs.BigResult]) -> tuple[float, float, float, float]:
    p50 = med([r.p50 for r in results])
    p99 = med([max(r.latencies) for r in results])  # a handful of calls: the worst one
    return 1 / p50, p50, p99, med([r.cpu_per_request for r in results])


# ------------------------------------------------------------------------------ tables


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _ratio(ours: float, peer: float | None) -> str:
    return "-" if peer is None or peer == 0 else f"{ours / peer:.2f}"


def peer_table(
    rows: Sequence[tuple[str, tuple[float, ...], tuple[float, ...] | None]],
    ours_name: str,
    peer_name: str,
) -> list[str]:
    head = (
        f"{'':<26} {'req/s':>17} {'p50 ms':>17} {'p99 ms':>17} {'CPU us/req':>19}  "
        f"{'ours/peer':<24}"
    )
    sub = (
        f"{'row':<26} {'ours':>8} {'peer':>8} {'ours':>8} {'peer':>8} {'ours':>8} {'peer':>8} "
        f"{'ours':>9} {'peer':>9}  {'req/s':>5} {'p50':>5} {'p99':>5} {'CPU':>5}"
    )
    lines = [f"ours = {ours_name}, peer = {peer_name}", head, sub]
    for label, ours, peer in rows:
        o_rps, o_p50, o_p99, o_cpu = ours
        p_rps, p_p50, p_p99, p_cpu = peer if peer is not None else (None,) * 4
        lines.append(
            f"{label:<26} {o_rps:>8.0f} {_cell(p_rps, '8.0f'):>8} "
            f"{o_p50 * 1e3:>8.2f} {_cell(p_p50 and p_p50 * 1e3, '8.2f'):>8} "
            f"{o_p99 * 1e3:>8.2f} {_cell(p_p99 and p_p99 * 1e3, '8.2f'):>8} "
            f"{o_cpu * 1e6:>9.0f} {_cell(p_cpu and p_cpu * 1e6, '9.0f'):>9}  "
            f"{_ratio(o_rps, p_rps):>5} {_ratio(o_p50, p_p50):>5} {_ratio(o_p99, p_p99):>5} "
            f"{_ratio(o_cpu, p_cpu):>5}"
        )
    return lines


def machine(*, peer_versions: bool = True) -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    packages = ("mlserver", "uvloop") if peer_versions else ()
    versions = ", ".join(
        f"{p} {importlib.metadata.version(p)}"
        for p in (*packages, "grpclib", "trio", "tritonclient", "grpcio", "jax")
    )
    return (
        f"{os.cpu_count()} CPUs ({model}), Linux {platform.release()}, Python "
        f"{platform.python_version()}; load average {load}\n{versions}"
    )


# ------------------------------------------------------------------------------ main


async def _peer_table(args: argparse.Namespace, repo: Path, workdir: Path) -> list[str]:
    ours = bs.start_ours(repo, workdir, cache_dir=workdir / "cache")
    peer = start_mlserver(workdir)
    servers = (ours, peer)
    try:
        await bs.wait_ready(ours, [bs.SMALL_MODEL, bs.BIG_MODEL])
        await bs.wait_ready(peer, [PEER_MODEL])
        rows: list[tuple[str, tuple[float, ...], tuple[float, ...] | None]] = []
        for n in bs.CONCURRENCY:
            runs = await alternate(
                args.runs,
                servers,
                lambda s, n=n: bs.closed_loop(
                    s.url,
                    bs.SMALL_MODEL if s is ours else PEER_MODEL,
                    n,
                    seconds=args.seconds,
                    warmup=args.warmup,
                    cpu=s.cpu,
                ),
            )
            rows.append((f"[1,16] FP32, {n} in flight", *map(load_figures, runs)))
            print(f"  measured {n} in flight", file=sys.stderr, flush=True)

        async def big_row(call: Callable[..., Awaitable[bs.BigResult]]) -> list[tuple[float, ...]]:
            """One 38 MB inline row: ``call`` against both servers, alternating."""
            runs = await alternate(
                args.runs,
                servers,
                lambda s: call(
                    s.url,
                    bs.BIG_MODEL if s is ours else PEER_MODEL,
                    repeats=args.big_repeats,
                    cpu=s.cpu,
                ),
            )
            return [big_figures(r) for r in runs]

        ours_inline, peer_inline = await big_row(bs.big_inline)
        rows.append(("38 MB input, inline", ours_inline, peer_inline))
        ours_own, peer_own = await big_row(bs.big_inline_ours_client)
        rows.append(("38 MB inline, our client", ours_own, peer_own))
        shm = [
            await bs.big_shm(ours.url, bs.BIG_MODEL, repeats=args.big_repeats * 4, cpu=ours.cpu)
            for _ in range(args.runs)
        ]
        rows.append(("38 MB input, shared memory", big_figures(shm), peer_inline))
        print("  measured 38 MB", file=sys.stderr, flush=True)
    finally:
        for server in servers:
            server.stop()
    return peer_table(rows, "reactantserver", peer.name)


async def _batching_table(args: argparse.Namespace, repo: Path, workdir: Path) -> list[str]:
    on = bs.start_ours(repo, workdir, cache_dir=workdir / "cache")
    off = bs.start_ours(repo, workdir, cache_dir=workdir / "cache", scheduler_extra=BATCH_CAP)
    inputs = {
        "mlp_wide": [bs.tensor_input("features", np.ones((1, 32), np.float32))],
        "resnet": [bs.tensor_input("images", np.ones((1, 32, 32, 3), np.float32))],
    }
    lines = [
        f"{'model, ' + str(BATCHING_IN_FLIGHT) + ' in flight':<26} {'coalescing':>10} "
        f"{'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/req':>10}",
    ]
    try:
        await bs.wait_ready(on, BATCHING_MODELS)
        await bs.wait_ready(off, BATCHING_MODELS)
        for model in BATCHING_MODELS:
            runs = await alternate(
                args.runs,
                (on, off),
                lambda s, model=model: bs.closed_loop(
                    s.url,
                    model,
                    BATCHING_IN_FLIGHT,
                    seconds=args.seconds,
                    warmup=args.warmup,
                    cpu=s.cpu,
                    inputs=inputs[model],
                ),
            )
            figures = [load_figures(r) for r in runs]
            for label, (rps, p50, p99, cpu) in zip(("on", "max 1"), figures, strict=True):
                lines.append(
                    f"{model:<26} {label:>10} {rps:>8.0f} {p50 * 1e3:>8.1f} {p99 * 1e3:>8.1f} "
                    f"{cpu * 1e6:>10.0f}"
                )
            lines.append(f"{'':<26} {'on / max 1':>10} {figures[0][0] / figures[1][0]:>7.1f}x")
            print(f"  measured batching, {model}", file=sys.stderr, flush=True)
    finally:
        on.stop()
        off.stop()
    return lines


# ------------------------------------------------------------------------------ Triton

#: (load, in flight) rows of the Triton comparison, in the order measured.
TRITON_CONCURRENCY = (1, 16, 64)
PEER_NAMES = {"triton": "Triton", "pytriton": "PyTriton"}


@attrs.frozen
class Window:
    """One measured window against one server: the load's figures, and for h2load the
    header bytes per answer it counted (None for tritonclient)."""

    result: bs.LoadResult
    header_bytes: float | None = None
    savings: str = ""


class Slot:
    """One server of the comparison, started again if it died between two windows (Triton
    2.51 sometimes ends with signal 11 after an h2load run closes its connection with
    requests in flight: the windows before are whole, and the crash is reported)."""

    def __init__(self, start: Callable[[], bs.Server]) -> None:
        self._start = start
        self.server = start()
        self.name = self.server.name
        self.url = self.server.url
        #: What each death left in the server's log (its last line naming a signal).
        self.crashes: list[str] = []

    async def ready(self) -> None:
        await bs.wait_ready(self.server, [tp.MODEL], timeout=300)
        self.url = self.server.url

    async def alive(self) -> bs.Server:
        """The server, started afresh (and waited for) if its process has ended."""
        if self.server.proc.poll() is not None:
            log = self.server.log.read_text(errors="replace").splitlines()
            said = [line for line in log if "Signal" in line or "signal" in line]
            self.crashes.append(
                f"exit status {self.server.proc.returncode}"
                + (f", {said[-1].strip()!r}" if said else "")
                + f" (log: {self.server.log})"
            )
            self.server.log.rename(self.server.log.with_suffix(f".{len(self.crashes)}.log"))
            self.server = self._start()
            await self.ready()
        return self.server


def core_layout(cores: Sequence[int]) -> tuple[frozenset[int], frozenset[int]]:
    """(the servers' cores, the load's): the last core for the servers, the rest for the
    load generator and this process (one core: both share it)."""
    ordered = sorted(cores)
    servers = frozenset(ordered[-1:])
    return servers, frozenset(ordered[:-1]) or servers


def pinned_to(cores: frozenset[int]) -> Callable[[], None]:
    return lambda: os.sched_setaffinity(0, cores)


def start_triton(peer: tp.PeerPython, workdir: Path, pin: Callable[[], None]) -> bs.Server:
    repo, backends = tp.write_repository(workdir, peer)
    port = bs.free_port()
    log = workdir / "triton.log"
    argv = tp.triton_command(peer, repo, backends, port)
    proc = tp.start(argv, peer.env(), log, workdir, pin)
    return bs.Server(f"Triton (nvidia-pytriton {peer.pytriton_version})", proc, port, log)


def start_pytriton(peer: tp.PeerPython, workdir: Path, pin: Callable[[], None]) -> bs.Server:
    script = workdir / "pytriton_double.py"
    script.write_text(tp.PYTRITON_SCRIPT)
    port = bs.free_port()
    log = workdir / "pytriton.log"
    argv = [peer.python, str(script), str(port), str(bs.free_port()), str(bs.free_port())]
    proc = tp.start(argv, peer.env(), log, workdir, pin)
    return bs.Server(f"PyTriton {peer.pytriton_version}", proc, port, log)


def export_double_b64(repo: Path) -> None:
    """The zoo's ``double`` at batch sizes 1-64 as ``repo/double`` (kept if there)."""
    if (repo / tp.MODEL / "manifest.yaml").is_file():
        return
    spec = f"{HERE / 'bundles.py'}:double_b64"
    subprocess.run(
        [sys.executable, "-m", "reactantserver.cli", "export", spec,
         "--out", str(repo / tp.MODEL), "--platforms", "cpu"],
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip


def h2load_tool() -> str:
    exe = shutil.which("h2load")
    if exe is None:
        raise SystemExit(
            "--loads h2load: h2load not found on PATH (nox -s bench_peer unpacks Debian's "
            "nghttp2-client for itself; or apt-get install nghttp2-client); or --loads "
            "tritonclient"
        )
    return exe


async def h2load_window(
    exe: str,
    body: Path,
    reply_bytes: int,
    server: bs.Server,
    n: int,
    args: argparse.Namespace,
    rps: int | None = None,
) -> Window:
    """One h2load window (``-c 1 -m n``, at ``rps`` requests/s if given) against
    ``server``: the requests that ended inside it, every answer checked
    (:func:`bench_gateway.check_h2load_summary`)."""
    shape = bg.Shape(1, n)
    log = body.with_name(f"h2load_{server.port}_{n}_{rps or 0}.tsv")
    log.unlink(missing_ok=True)  # h2load appends to a log that is there
    load = bg.H2Load(exe, body, reply_bytes, rps)
    argv = load.command(server.url, shape, args.warmup + args.seconds + bg.H2LOAD_TAIL, log)
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        await asyncio.sleep(args.warmup)
        opened, at_open = time.time(), server.cpu()
        await asyncio.sleep(args.seconds)
        closed, at_close = time.time(), server.cpu()
        if proc.returncode is not None:
            raise RuntimeError(f"h2load ended before its window did ({server.name})")
        out = (await proc.communicate())[0].decode(errors="replace")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"h2load failed ({proc.returncode}): {' '.join(argv)}\n{out[-2000:]}")
    bg.check_h2load_summary(out, reply_bytes)
    latencies = bg.h2load_latencies(log.read_text(), opened, closed)
    done = re.search(r"(\d+) done", out)
    headers = re.search(r"\((\d+)\) headers \(space savings ([\d.]+%)\)", out)
    header_bytes = savings = None
    if done is not None and headers is not None and int(done[1]):
        header_bytes, savings = int(headers[1]) / int(done[1]), headers[2]
    result = bs.LoadResult(n, len(latencies), closed - opened, tuple(latencies), at_close - at_open)
    return Window(result, header_bytes, savings or "")


def ratio_cell(ours: Sequence[float], peer: Sequence[float]) -> str:
    """The median ratio ours/peer and its range over the pairs of runs."""
    pairs = [o / p for o, p in zip(ours, peer, strict=True) if p]
    if not pairs:
        return "-"
    return f"{med(pairs):.2f} ({min(pairs):.2f}-{max(pairs):.2f})"


def triton_table(
    rows: Sequence[tuple[str, int, Sequence[Sequence[Window]]]], names: Sequence[str]
) -> list[str]:
    """One line per (load, in flight): medians per server, then ours/peer ratios with
    their range over the pairs of runs."""
    peers = names[1:]
    width = 9 * len(names)
    head = (
        f"{'load':<13}{'in flight':>9}  {'req/s':^{width}} {'p50 ms':^{width}} "
        f"{'p99 ms':^{width}} {'server CPU us/req':^{width}}"
    )
    sub = f"{'':<22}  " + " ".join("".join(f"{n[:8]:>9}" for n in names) for _ in range(4))
    lines = ["medians of the runs; " + ", ".join(names), head, sub]
    ratio_lines = [
        "ours / peer: the median of the pairs' ratios (their range); above 1 is better for "
        "req/s, below 1 for p50 and CPU"
    ]
    for load, n, windows in rows:
        results = [[w.result for w in runs] for runs in windows]
        rps = [[r.rps for r in rs] for rs in results]
        p50 = [[r.p50 * 1e3 for r in rs] for rs in results]
        p99 = [[r.p99 * 1e3 for r in rs] for rs in results]
        cpu = [[r.cpu_per_request * 1e6 for r in rs] for rs in results]
        cells = []
        for figures, fmt in ((rps, ".0f"), (p50, ".2f"), (p99, ".2f"), (cpu, ".0f")):
            cells.append("".join(f"{med(f):>9{fmt}}" for f in figures))
        lines.append(f"{load:<13}{n:>9}  " + " ".join(cells))
        for i, peer in enumerate(peers, start=1):
            ratio_lines.append(
                f"{load:<13}{n:>9}  vs {peer:<9} req/s {ratio_cell(rps[0], rps[i]):<18} "
                f"p50 {ratio_cell(p50[0], p50[i]):<18} CPU {ratio_cell(cpu[0], cpu[i])}"
            )
    return [*lines, "", *ratio_lines]


async def _triton_run(args: argparse.Namespace, workdir: Path) -> None:
    started = time.perf_counter()
    peers = [p for p in args.peer if p != "mlserver"]
    peer = tp.PeerPython.probe(args.peer_python)
    server_cores, load_cores = core_layout(sorted(os.sched_getaffinity(0)))
    os.sched_setaffinity(0, load_cores)  # this process, and h2load (its child), off them
    pin = pinned_to(server_cores)
    repo = workdir / "repo_b64"
    print("building the benchmark repository ...", file=sys.stderr, flush=True)
    export_double_b64(repo)
    loads_before = os.getloadavg()
    slots = [Slot(partial(bs.start_ours, repo, workdir, cache_dir=workdir / "cache", pin=pin))]
    for name in peers:
        start = start_triton if name == "triton" else start_pytriton
        slots.append(Slot(partial(start, peer, workdir, pin)))
    rows: list[tuple[str, int, Sequence[Sequence[Window]]]] = []
    savings: dict[str, tuple[list[float], list[str]]] = {s.name: ([], []) for s in slots}
    try:
        for slot in slots:
            await slot.ready()
        if "h2load" in args.loads or args.paced:
            exe = h2load_tool()
            body = workdir / "request.bin"
            body.write_bytes(bg.framed_request())
            replies = {s.name: await bg.check_request(s.url, body.read_bytes()) for s in slots}
        for load in args.loads:
            for n in TRITON_CONCURRENCY:

                async def measure(slot: Slot, n: int = n, load: str = load) -> Window:
                    server = await slot.alive()
                    if load == "h2load":
                        window = await h2load_window(
                            exe, body, replies[server.name], server, n, args
                        )
                        if window.header_bytes is not None:
                            savings[server.name][0].append(window.header_bytes)
                            savings[server.name][1].append(window.savings)
                        return window
                    result = await bs.closed_loop(
                        server.url, tp.MODEL, n, seconds=args.seconds, warmup=args.warmup,
                        cpu=server.cpu,
                    )  # fmt: skip
                    return Window(result)

                rows.append((load, n, await alternate(args.runs, slots, measure)))
                print(f"  measured {load}, {n} in flight", file=sys.stderr, flush=True)
        for rate in args.paced:

            async def paced(slot: Slot, rate: int = rate) -> Window:
                server = await slot.alive()
                return await h2load_window(exe, body, replies[server.name], server, 1, args, rate)

            rows.append((f"h2load {rate}/s", 1, await alternate(args.runs, slots, paced)))
            print(f"  measured h2load at {rate}/s, 1 in flight", file=sys.stderr, flush=True)
    finally:
        for slot in slots:
            slot.server.stop()
    names = ["ours", *(PEER_NAMES[p] for p in peers)]
    print(machine(peer_versions=False))
    print(f"peers: {', '.join(s.name for s in slots[1:])} (from {peer.python})")
    print(
        f"servers pinned to cores {sorted(server_cores)}, the load generator and this "
        f"process to {sorted(load_cores)}; load average "
        + ", ".join(f"{x:.2f}" for x in loads_before)
        + " before, "
        + ", ".join(f"{x:.2f}" for x in os.getloadavg())
        + " after"
    )
    print(
        f"median of {args.runs} runs, servers alternating; {args.seconds:g} s windows after "
        f"{args.warmup:g} s warm-up; one HTTP/2 connection"
    )
    print()
    print("\n".join(triton_table(rows, names)))
    if any(b for b, _ in savings.values()):
        print()
        print("h2load's header bytes per answer (header space savings), median of its windows:")
        for slot in slots:
            counts, ratios = savings[slot.name]
            if counts:
                print(f"  {slot.name:<40} {med(counts):6.1f} bytes ({ratios[-1]})")
    for slot in slots:
        for crash in slot.crashes:
            print(f"{slot.name} died between windows and was restarted: {crash}")
    print(f"\n({time.perf_counter() - started:.0f} s)")


async def _run(args: argparse.Namespace, workdir: Path) -> None:
    if any(p != "mlserver" for p in args.peer):
        await _triton_run(args, workdir)
        return
    started = time.perf_counter()
    repo = workdir / "repo"
    print("building the benchmark repository ...", file=sys.stderr, flush=True)
    bs.build_repo(repo, zoo=(bs.SMALL_MODEL, "resnet"), exported=(bs.BIG_MODEL, "mlp_wide"))
    header = machine()
    table = await _peer_table(args, repo, workdir)
    batching = [] if args.skip_batching else await _batching_table(args, repo, workdir)
    print(header)
    print(
        f"median of {args.runs} runs, servers alternating; {args.seconds:g} s windows after "
        f"{args.warmup:g} s warm-up; 38 MB: {args.big_repeats} calls per run inline, "
        f"{args.big_repeats * 4} through shared memory"
    )
    print()
    print("\n".join(table))
    print(
        "(the shared-memory row's peer figures are MLServer's inline ones: it has no "
        "shared-memory data plane)"
    )
    if batching:
        print()
        print("\n".join(batching))
    print(f"\n({time.perf_counter() - started:.0f} s)")


def _choices(text: str, known: Sequence[str], what: str) -> list[str]:
    picked = [part.strip() for part in text.split(",") if part.strip()]
    bad = [p for p in picked if p not in known]
    if bad or not picked:
        raise argparse.ArgumentTypeError(
            f"{text!r}: {what} are {', '.join(known)} (comma-separated)"
        )
    return list(dict.fromkeys(picked))


def peer_list(text: str) -> list[str]:
    peers = _choices(text, ("mlserver", "triton", "pytriton"), "the peers")
    if "mlserver" in peers and len(peers) > 1:
        raise argparse.ArgumentTypeError("mlserver has tables of its own: ask for it alone")
    return peers


def load_list(text: str) -> list[str]:
    return _choices(text, ("h2load", "tritonclient"), "the loads")


def rate_list(text: str) -> list[int]:
    try:
        rates = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        rates = []
    if not rates or min(rates) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the paced rates are requests/s, whole numbers >= 1, comma-separated"
        )
    return list(dict.fromkeys(rates))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per row (median reported)")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured window per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured lead-in per run")
    parser.add_argument("--big-repeats", type=int, default=2, help="38 MB inline calls per run")
    parser.add_argument("--skip-batching", action="store_true", help="only the peer table")
    parser.add_argument("--workdir", help="keep the repositories, caches and logs here")
    parser.add_argument(
        "--peer",
        type=peer_list,
        default=["mlserver"],
        help="mlserver (the default: tables 1 and 2), or triton and/or pytriton "
        "(comma-separated: the Triton comparison)",
    )
    parser.add_argument(
        "--peer-python",
        default=os.environ.get("PYTRITON_PYTHON", sys.executable),
        help="the interpreter with nvidia-pytriton installed (default: $PYTRITON_PYTHON, "
        "else this one)",
    )
    parser.add_argument(
        "--loads",
        type=load_list,
        default=["h2load", "tritonclient"],
        help="the Triton comparison's loads, comma-separated: h2load, tritonclient",
    )
    parser.add_argument(
        "--paced",
        type=rate_list,
        default=[],
        help="the Triton comparison's paced rows: one request in flight at these "
        "requests/s (h2load --rps), comma-separated",
    )
    args = parser.parse_args(argv)
    if args.paced and args.peer == ["mlserver"]:
        parser.error("--paced is a row of the Triton comparison: add --peer triton")
    bs.run_in_workdir(args.workdir, "rs_bench_peer_", partial(_run, args))


if __name__ == "__main__":
    main()
