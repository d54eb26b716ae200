"""Python calls per forwarded request in the gateway, this tree's against another tree's.

Each gateway runs under ``cProfile`` in front of the same worker (this tree's) and forwards
a fixed number of one-row ``double`` requests (``tritonclient.grpc.aio``, N in flight);
a gateway started afresh for a small and for a large count gives, by the difference, the
calls one more request costs, start-up and shutdown cancelled out. Calls (Python and C
functions, cProfile's ``total_calls``) are counted, not timed: at one in flight the count is
the same from run to run whatever else the machine does, which a CPU-seconds ratio on a
shared 2-core machine is not (``bench_gateway --baseline``'s medians of identical code sit
up to 6 % apart). More in flight, reads carry several requests and the count moves a little
with timing.

    python benchmarks/bench_forward_calls.py --baseline f61d277      # about two minutes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import signal
import subprocess
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import tritonclient.grpc.aio as aioclient

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_serve import (  # noqa: E402
    Server,
    baseline_tree,
    build_repo,
    free_port,
    run_in_workdir,
    small_input,
    start_ours,
    wait_ready,
)

MODEL = "double"


def start_profiled_gateway(worker: Server, workdir: Path, out: Path, src: Path | None) -> Server:
    """``reactantserver gateway`` under cProfile (statistics written to ``out`` at exit),
    from ``src`` when given; health probes far apart so that none falls in the count."""
    port = free_port()
    config = {
        "listen": {"grpc": f"127.0.0.1:{port}", "metrics": "127.0.0.1:0"},
        "endpoints": [worker.url],
        "health_interval_seconds": 600.0,
        "logging": {"level": "warning", "format": "text"},
    }
    path = workdir / f"gateway_{port}.yml"
    path.write_text(json.dumps(config))
    log = workdir / f"gateway_{port}.log"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    command = [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "reactantserver.cli"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [*command, "gateway", str(path)], stdout=sink, stderr=subprocess.STDOUT, env=env
        )
    return Server("gateway", proc, port, log)


async def send(url: str, requests: int, in_flight: int) -> int:
    """About ``requests`` one-row requests (a multiple of ``in_flight``), ``in_flight`` at a
    time, over one connection; returns how many were sent."""
    inputs = [small_input()[1]]
    client = aioclient.InferenceServerClient(url)

    async def one(count: int) -> None:
        for _ in range(count):
            await client.infer(MODEL, inputs)

    try:
        await asyncio.gather(*(one(requests // in_flight) for _ in range(in_flight)))
    finally:
        await client.close()
    return requests // in_flight * in_flight


async def calls_after(
    worker: Server, workdir: Path, src: Path | None, requests: int, in_flight: int
) -> tuple[int, int]:
    """The calls a fresh gateway makes from start to exit, and the requests it forwarded."""
    out = workdir / f"profile_{free_port()}"
    gateway = start_profiled_gateway(worker, workdir, out, src)
    try:
        await wait_ready(gateway, [MODEL])
        sent = await send(gateway.url, requests, in_flight)
    finally:
        gateway.proc.send_signal(signal.SIGTERM)
        gateway.proc.wait(60)
    return pstats.Stats(str(out)).total_calls, sent  # type: ignore[attr-defined]


async def _run(args: argparse.Namespace, workdir: Path) -> None:
    tree = baseline_tree(args.baseline, workdir)
    if tree is None:
        return
    repo = workdir / "repo"
    build_repo(repo, exported=())
    worker = start_ours(repo, workdir, cache_dir=workdir / "cache")
    small, large = args.requests // 5, args.requests
    per: dict[tuple[str, int], float] = {}
    try:
        await wait_ready(worker, [MODEL])
        for in_flight in args.in_flight:
            for label, src in ((args.baseline[:12], tree / "src"), ("this tree", None)):
                few, first = await calls_after(worker, workdir, src, small, in_flight)
                many, second = await calls_after(worker, workdir, src, large, in_flight)
                per[label, in_flight] = (many - few) / (second - first)
    finally:
        worker.stop()
    print(f"gateway calls per forwarded request ({small} and {large} requests, cProfile)")
    print(f"{'in flight':>9} {args.baseline[:12]:>12} {'this tree':>12} {'ratio':>7}")
    for in_flight in args.in_flight:
        base, this = per[args.baseline[:12], in_flight], per["this tree", in_flight]
        print(f"{in_flight:>9} {base:>12.1f} {this:>12.1f} {this / base:>7.3f}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", metavar="REV", default="main", help="the other tree")
    parser.add_argument("--requests", type=int, default=2400, help="the larger count")
    parser.add_argument(
        "--in-flight",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=(1, 16),
        help="requests in flight, comma-separated (default 1,16)",
    )
    parser.add_argument("--workdir", help="keep the repository, profiles and logs here")
    args = parser.parse_args(argv)
    run_in_workdir(args.workdir, "rs_bench_forward_calls_", partial(_run, args))


if __name__ == "__main__":
    main()
