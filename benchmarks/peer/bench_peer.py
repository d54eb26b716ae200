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

    nox -s bench_peer                       # builds its own virtualenv, then runs this
    nox -s bench_peer -- --runs 5 --seconds 5
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # bench_serve, one directory up

import bench_serve as bs  # noqa: E402

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


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    versions = ", ".join(
        f"{p} {importlib.metadata.version(p)}"
        for p in ("mlserver", "uvloop", "grpclib", "trio", "tritonclient", "grpcio", "jax")
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


async def _run(args: argparse.Namespace, workdir: Path) -> None:
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per row (median reported)")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured window per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured lead-in per run")
    parser.add_argument("--big-repeats", type=int, default=2, help="38 MB inline calls per run")
    parser.add_argument("--skip-batching", action="store_true", help="only the peer table")
    parser.add_argument("--workdir", help="keep the repositories, caches and logs here")
    args = parser.parse_args(argv)
    bs.run_in_workdir(args.workdir, "rs_bench_peer_", partial(_run, args))


if __name__ == "__main__":
    main()
