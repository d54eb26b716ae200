"""The lean HTTP/2 connection against h2's, in-process and in a serving worker.

Two tables, each taken side by side in one run, alternating the two variants:

* **in-process** (always): one small unary gRPC call at a time through a server
  connection, driven by an h2 client connection: microseconds per call to receive the
  request (HEADERS + DATA, the DATA acknowledged as grpclib does) and to send the answer
  (HEADERS, DATA, trailers), for h2's ``H2Connection`` configured as the worker used it
  before (built here from :mod:`reactantserver.transport.h2conn`'s pieces) and for
  :class:`~reactantserver.h2.server.ServerConnection`;
* **worker** (``--against SRC``): a real worker (``reactantserver.cli serve``, the
  ``double`` model of ``bench_serve``) started from this tree and from another one
  (``SRC``: a ``src`` directory, e.g. ``/work/main/src`` before h2lean), driven by
  ``tritonclient.grpc.aio`` at 1 and 16 in flight; server CPU microseconds per request
  (``bench_serve.process_cpu``) and requests/s, alternating the trees ``--rounds`` times.

    python benchmarks/bench_h2lean.py
    python benchmarks/bench_h2lean.py --against /work/main/src --rounds 3 --seconds 4
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events

from reactantserver.config.schema import EndpointsConfig
from reactantserver.h2 import events as h2events
from reactantserver.h2.server import ServerConnection
from reactantserver.transport.core.limits import WireLimits
from reactantserver.transport.unary import ANSWER_HEADERS as ANSWER
from reactantserver.transport.unary import OK_TRAILERS as TRAILERS

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import bench_serve as bs
from h2_reference import h2_reference_connection  # h2 is the tests' oracle, not the server's

LIMITS = WireLimits.from_endpoints(EndpointsConfig())
REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/inference.GRPCInferenceService/ModelInfer"),
    (":authority", "127.0.0.1:1"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
    ("user-agent", "grpc-python/1.0"),
    ("grpc-accept-encoding", "identity,deflate,gzip"),
]


def h2_server() -> h2.connection.H2Connection:
    """h2's server connection exactly as ``new_h2_connection`` built it before h2lean."""
    return h2_reference_connection(LIMITS)


def per_call(make: Callable[[], Any], data_event: type, calls: int) -> tuple[float, float]:
    """Microseconds per call (receive, send) through the server connection ``make()``
    (whose DATA events are ``data_event``: h2's, or ours)."""
    server = make()
    server.initiate_connection()
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    server.data_to_send()
    receive = send = 0.0
    for _ in range(calls):
        sid = client.get_next_available_stream_id()
        client.send_headers(sid, REQUEST)
        client.send_data(sid, b"\0\0\0\0\x10" + b"x" * 16, end_stream=True)
        wire = client.data_to_send()
        t0 = time.perf_counter()
        for event in server.receive_data(wire):
            if isinstance(event, data_event):
                server.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        t1 = time.perf_counter()
        server.send_headers(sid, ANSWER)
        server.send_data(sid, b"\0\0\0\0\x10" + b"y" * 16)
        server.send_headers(sid, TRAILERS, end_stream=True)
        out = server.data_to_send()
        t2 = time.perf_counter()
        receive += t1 - t0
        send += t2 - t1
        for event in client.receive_data(out):
            if isinstance(event, h2.events.DataReceived):
                client.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        server.receive_data(client.data_to_send())
    return receive / calls * 1e6, send / calls * 1e6


def in_process(rounds: int, calls: int) -> None:
    samples: dict[str, list[tuple[float, float]]] = {"h2": [], "h2lean": []}
    for _ in range(rounds):
        samples["h2"].append(per_call(h2_server, h2.events.DataReceived, calls))
        samples["h2lean"].append(
            per_call(lambda: ServerConnection(LIMITS), h2events.DataReceived, calls)
        )
    med = {
        k: (statistics.median(r for r, _ in v), statistics.median(s for _, s in v))
        for k, v in samples.items()
    }
    print(f"in-process, one small unary call at a time ({rounds} rounds x {calls} calls, medians)")
    print(f"{'connection':12s} {'receive us':>11s} {'send us':>9s} {'total us':>9s}")
    for name, (r, s) in med.items():
        print(f"{name:12s} {r:11.1f} {s:9.1f} {r + s:9.1f}")
    (hr, hs), (lr, ls) = med["h2"], med["h2lean"]
    print(f"{'h2lean / h2':12s} {lr / hr:11.2f} {ls / hs:9.2f} {(lr + ls) / (hr + hs):9.2f}")


async def _load(server: bs.Server, inflight: int, seconds: float) -> tuple[float, float]:
    r = await bs.closed_loop(
        server.url, bs.SMALL_MODEL, inflight, seconds=seconds, warmup=1.0, cpu=server.cpu
    )
    n = len(r.latencies)
    return r.cpu_seconds / n * 1e6, n / seconds


def worker(against: Path, rounds: int, seconds: float) -> None:
    here = Path(__file__).resolve().parent.parent / "src"
    trees = {"h2lean": here, "before": against}
    work = Path(tempfile.mkdtemp(prefix="bench_h2lean_"))
    repo = work / "repo"
    bs.build_repo(repo, exported=())
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for name, src in trees.items():
            port = bs.free_port()
            node = work / f"node_{name}.yaml"
            node.write_text(
                bs.NODE_YAML.format(
                    repo=repo,
                    port=port,
                    cache=work / "cache",
                    scheduler_extra="",
                    runtime_extra="",
                    discipline="fair",
                    metrics_port=0,
                )
            )
            env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(src)}
            log = work / f"{name}.log"
            cmd = [sys.executable, "-m", "reactantserver.cli", "serve", str(node)]
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [*cmd, "--log-level", "warning"], env=env, stdout=out, stderr=subprocess.STDOUT
                )
            server = bs.Server(name, proc, port, log)
            try:
                asyncio.run(bs.wait_ready(server, [bs.SMALL_MODEL]))
                for inflight in (1, 16):
                    sample = asyncio.run(_load(server, inflight, seconds))
                    results.setdefault((name, inflight), []).append(sample)
            finally:
                server.stop()
    print(f"\nworker, `double`, tritonclient.grpc.aio ({rounds} rounds alternating, medians)")
    print(f"{'tree':10s} {'in flight':>9s} {'CPU us/req':>11s} {'req/s':>8s}")
    for inflight in (1, 16):
        for name in trees:
            v = results[(name, inflight)]
            cpu = statistics.median(c for c, _ in v)
            rate = statistics.median(r for _, r in v)
            print(f"{name:10s} {inflight:9d} {cpu:11.0f} {rate:8.0f}")
        lean = statistics.median(c for c, _ in results[("h2lean", inflight)])
        before = statistics.median(c for c, _ in results[("before", inflight)])
        print(f"{'ratio':10s} {inflight:9d} {lean / before:11.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--against", type=Path, help="a src/ tree to compare the worker with")
    args = parser.parse_args(argv)
    in_process(args.rounds, args.calls)
    if args.against is not None:
        worker(args.against, args.rounds, args.seconds)


if __name__ == "__main__":
    main()
