"""ModelStreamInfer against unary ModelInfer: requests/s and the server's CPU per request.

Issue 43 asks for streaming's cost against unary's, measured in the same run. One CPU
worker (``reactantserver serve``, the zoo's ``double``: FP32 ``[1, 16]``, ``y = 2x``) and
a gateway in front of it (``reactantserver gateway``, round robin), as deployed. The load
is a closed loop of ``N`` requests in flight on one HTTP/2 connection, from a lean client
of our own in this process -- the HTTP/2 client role the gateway itself speaks to workers
(``h2.client.ClientConnection``) over a blocking socket, about 20 us a request,
so the servers, not the client, set the pace:

* **unary**: ``N`` ModelInfer calls in flight, each its own HTTP/2 stream (HEADERS, one
  DATA frame, the answer's HEADERS, DATA and trailers); each answer starts the next call;
* **stream**: one ModelStreamInfer call with ``N`` requests outstanding on it (a DATA
  message each way per request, no headers); each answer sends the next request.

A third target, ``in-process``, is the transport alone: the worker's gRPC server
(``serve_grpc`` over ``Service``) in this process over a host that answers every request
at once (no JAX, no scheduler), driven by the same client from a process of its own; its
CPU is this process's. It shows what the two modes cost the server's transport, without
the model's execution and the scheduler around it.

Each target (the worker direct, the worker through the gateway) and in-flight count
(``--inflight``) is measured ``--runs`` times, unary and stream alternating (the order
flips each run), in windows of ``--seconds`` after a warm-up; each figure is the median.
CPU per request is user + system CPU of the server processes (psutil) in the window over
the answers in it: the worker's for direct rows, the gateway's and the worker's for rows
through the gateway. Every answer is checked to be OK (unary: grpc-status 0; stream: a
``ModelStreamInferResponse`` without an error message), with ``y = 2x``.

    python benchmarks/bench_stream.py                   # about 3 minutes
    python benchmarks/bench_stream.py --runs 3 --seconds 2 --inflight 1,16,32
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_serve as bs  # noqa: E402
from bench_gateway import start_gateway  # noqa: E402
from bench_grpc import _Host as _BenchHost  # noqa: E402

from reactantserver.h2 import events as h2events  # noqa: E402
from reactantserver.h2.client import ClientConnection, encode_request, request_prefix  # noqa: E402
from reactantserver.protocol import inference as pb  # noqa: E402
from reactantserver.transport import guest  # noqa: E402
from reactantserver.transport.core.limits import WireLimits  # noqa: E402

INFER = b"/inference.GRPCInferenceService/ModelInfer"
STREAM = b"/inference.GRPCInferenceService/ModelStreamInfer"
MODES = ("unary", "stream")
X = np.arange(16, dtype=np.float32).reshape(1, 16)


def request_message() -> bytes:
    """The one-row ``double`` request, serialized (no gRPC prefix)."""
    return bytes(
        pb.ModelInferRequest(
            model_name=bs.SMALL_MODEL,
            inputs=[pb.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=[1, 16])],
            raw_input_contents=[X.tobytes()],
        )
    )


def check_answer(message: bytes | memoryview, *, stream: bool) -> None:
    if stream:
        wrapped = pb.ModelStreamInferResponse().parse(bytes(message))
        if wrapped.error_message:
            raise AssertionError(f"in-stream error: {wrapped.error_message}")
        response = wrapped.infer_response
    else:
        response = pb.ModelInferResponse().parse(bytes(message))
    y = np.frombuffer(response.raw_output_contents[0], dtype=np.float32).reshape(1, 16)
    if not np.array_equal(y, 2 * X):
        raise AssertionError(f"wrong answer {y!r}")


class Client:
    """One HTTP/2 connection driven in a closed loop (module docstring)."""

    def __init__(self, url: str) -> None:
        host, port = url.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        limits = WireLimits(stream_window=16 << 20, connection_window=64 << 20)
        self.conn = ClientConnection(limits, time.monotonic())
        self.conn.initiate_connection()
        self.flush()
        self.message = request_message()
        self.framed = b"\x00" + len(self.message).to_bytes(4, "big") + self.message
        authority = url.encode()
        self.unary_block = encode_request(request_prefix(INFER, authority), None)
        self.stream_block = encode_request(request_prefix(STREAM, authority), None)
        #: Answers so far, and the first few checked.
        self.answered = 0
        self.checked = 0

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def events(self) -> list[h2events.Event]:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the server closed the connection")
        events = self.conn.receive_data(data, time.monotonic())
        return events

    def _answered(self, message: bytes | memoryview, *, stream: bool) -> None:
        self.answered += 1
        if self.checked < 50 or self.answered % 997 == 0:
            self.checked += 1
            check_answer(message, stream=stream)

    # ---------------------------------------------------------------- unary

    def _start_unary(self) -> int:
        sid = self.conn.send_request(self.unary_block, self.message)
        if sid is None:
            sid = self.conn.open_stream(self.unary_block)
            self.conn.send_data(sid, self.framed, end_stream=True)
        return sid

    def unary(self, inflight: int, until: Callable[[], bool]) -> None:
        """``inflight`` calls at a time until ``until()``, then the last ones answered."""
        bodies: dict[int, bytearray] = {self._start_unary(): bytearray() for _ in range(inflight)}
        self.flush()
        while bodies:
            for event in self.events():
                kind = event.__class__
                if kind is h2events.DataReceived:
                    bodies[event.stream_id] += event.data  # type: ignore[attr-defined]
                elif kind is h2events.TrailersReceived:
                    sid = event.stream_id  # type: ignore[attr-defined]
                    status = dict(event.headers).get(b"grpc-status")  # type: ignore[attr-defined]
                    if status != b"0":
                        raise AssertionError(f"ModelInfer answered grpc-status {status!r}")
                    self._answered(memoryview(bodies.pop(sid))[5:], stream=False)
                    if not until():
                        bodies[self._start_unary()] = bytearray()
                elif kind is h2events.StreamReset:
                    raise AssertionError(f"stream reset: {event!r}")
            self.flush()

    # ---------------------------------------------------------------- stream

    def stream(self, inflight: int, until: Callable[[], bool]) -> None:
        """One ModelStreamInfer call with ``inflight`` requests outstanding until
        ``until()``, then the last ones answered and the call ended."""
        conn = self.conn
        sid = conn.open_stream(self.stream_block)
        conn.send_data(sid, self.framed * inflight)
        self.flush()
        pending = bytearray()
        outstanding = inflight
        ended = False
        while True:
            for event in self.events():
                kind = event.__class__
                if kind is h2events.DataReceived:
                    pending += event.data  # type: ignore[attr-defined]
                    more = 0
                    while len(pending) >= 5:
                        size = int.from_bytes(pending[1:5], "big")
                        if len(pending) < 5 + size:
                            break
                        self._answered(memoryview(pending)[5 : 5 + size], stream=True)
                        del pending[: 5 + size]
                        outstanding -= 1
                        if not until():
                            more += 1
                    if more:
                        conn.send_data(sid, self.framed * more)
                        outstanding += more
                elif kind is h2events.TrailersReceived:
                    status = dict(event.headers).get(b"grpc-status")  # type: ignore[attr-defined]
                    if status != b"0" or outstanding:
                        raise AssertionError(
                            f"ModelStreamInfer ended grpc-status {status!r}, {outstanding} owed"
                        )
                    return
                elif kind is h2events.StreamReset:
                    raise AssertionError(f"stream reset: {event!r}")
            if not outstanding and not ended:
                conn.send_data(sid, b"", end_stream=True)
                ended = True
            self.flush()

    def close(self) -> None:
        self.sock.close()


@attrs.frozen
class Window:
    requests: int
    seconds: float
    #: CPU seconds of each server process in the window (gateway first, then worker).
    cpu: tuple[float, ...]

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def per_request_us(self) -> tuple[float, ...]:
        return tuple(c / self.requests * 1e6 for c in self.cpu)


def measure(
    url: str, mode: str, inflight: int, servers: Sequence[bs.Server], warmup: float, seconds: float
) -> Window:
    """One window of ``seconds`` after ``warmup``: answers counted, servers' CPU read."""
    client = Client(url)
    marks: dict[str, tuple[float, int, list[float]]] = {}

    def until() -> bool:
        now = time.perf_counter()
        if "start" not in marks:
            if now >= began + warmup:
                marks["start"] = (now, client.answered, [s.cpu() for s in servers])
            return False
        start = marks["start"][0]
        if now < start + seconds:
            return False
        if "end" not in marks:
            marks["end"] = (now, client.answered, [s.cpu() for s in servers])
        return True

    began = time.perf_counter()
    try:
        (client.unary if mode == "unary" else client.stream)(inflight, until)
    finally:
        client.close()
    (t0, n0, c0), (t1, n1, c1) = marks["start"], marks["end"]
    return Window(n1 - n0, t1 - t0, tuple(b - a for a, b in zip(c0, c1, strict=True)))


@attrs.frozen
class Row:
    target: str
    inflight: int
    mode: str
    windows: tuple[Window, ...]

    @property
    def rate(self) -> float:
        return statistics.median(w.rate for w in self.windows)

    def cpu_us(self) -> tuple[float, ...]:
        per = [w.per_request_us() for w in self.windows]
        return tuple(statistics.median(p[i] for p in per) for i in range(len(per[0])))


def report(rows: Sequence[Row]) -> None:
    print(
        f"{'target':<9} {'in flight':>9} {'mode':<7} {'req/s':>8} {'x unary':>8} "
        f"{'gateway us/req':>15} {'worker us/req':>14} {'x unary':>8}"
    )
    by = {(r.target, r.inflight, r.mode): r for r in rows}
    for r in rows:
        unary = by[(r.target, r.inflight, "unary")]
        cpu, base = r.cpu_us(), unary.cpu_us()
        gateway = f"{cpu[0]:15.1f}" if r.target == "gateway" else f"{'-':>15}"
        total, base_total = sum(cpu), sum(base)
        print(
            f"{r.target:<9} {r.inflight:>9} {r.mode:<7} {r.rate:8.0f} "
            f"{r.rate / unary.rate:8.2f} {gateway} {cpu[-1]:14.1f} {total / base_total:8.2f}"
        )
    print(
        "x unary: the row's figure over the unary row's with the same target and in-flight "
        "count (CPU: the servers' total per request)"
    )
    print("\nservers' CPU per request, stream / unary, in each run's pair of windows:")
    for r in rows:
        if r.mode != "stream":
            continue
        unary = by[(r.target, r.inflight, "unary")]
        ratios = [
            sum(s.per_request_us()) / sum(u.per_request_us())
            for s, u in zip(r.windows, unary.windows, strict=True)
        ]
        cells = " ".join(f"{x:5.2f}" for x in ratios)
        print(f"{r.target:<9} {r.inflight:>9}  {cells}  (median {statistics.median(ratios):.2f})")


# ------------------------------------------------------------------ the transport alone


class _InstantHost(_BenchHost):
    """bench_grpc's host, serving ``double`` (``y = 2x``) and answering at once."""

    model = attrs.evolve(_BenchHost.model, name=bs.SMALL_MODEL)

    def begin(self, model: str, inputs: Any, outputs: Any, deadline: float, answer: Any) -> None:
        answer.resolve({"y": inputs["x"] * 2})


def _closed_loop(url: str, mode: str, inflight: int, count: int) -> float:
    """(In the client's process.) ``count`` answers in a closed loop; the seconds taken."""
    client = Client(url)
    started = time.perf_counter()
    try:
        (client.unary if mode == "unary" else client.stream)(
            inflight, lambda: client.answered >= count
        )
    finally:
        client.close()
    return time.perf_counter() - started


async def _in_process(args: argparse.Namespace) -> list[Row]:
    import trio

    from reactantserver.config.schema import EndpointsConfig
    from reactantserver.service import Service
    from reactantserver.worker.grpc import serve_grpc

    service = Service(_InstantHost(), max_concurrent_requests=0)
    windows: dict[tuple[int, str], list[Window]] = {}
    count = max(200, int(args.seconds * 2000))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_grpc, service, EndpointsConfig(port=0))
        url = f"127.0.0.1:{port}"
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            for run in range(args.runs):
                for inflight in args.inflight:
                    for mode in MODES if run % 2 == 0 else MODES[::-1]:
                        warm = (url, mode, inflight, count // 5)
                        await trio.to_thread.run_sync(pool.apply, _closed_loop, warm)
                        cpu = time.process_time()
                        seconds = await trio.to_thread.run_sync(
                            pool.apply, _closed_loop, (url, mode, inflight, count)
                        )
                        used = time.process_time() - cpu
                        window = Window(count, seconds, (used,))
                        windows.setdefault((inflight, mode), []).append(window)
        nursery.cancel_scope.cancel()
    return [
        Row("in-proc", inflight, mode, tuple(windows[(inflight, mode)]))
        for inflight in args.inflight
        for mode in MODES
    ]


async def _run(args: argparse.Namespace, workdir: Path) -> list[Row]:
    repo = workdir / "repo"
    bs.build_repo(repo, zoo=(bs.SMALL_MODEL,), exported=())
    worker = bs.start_ours(repo, workdir, cache_dir=workdir / "cache")
    gateway = None
    try:
        await bs.wait_ready(worker, [bs.SMALL_MODEL])
        gateway = start_gateway(worker, workdir)
        await bs.wait_ready(gateway, [bs.SMALL_MODEL])
        targets = {"worker": (worker.url, [worker]), "gateway": (gateway.url, [gateway, worker])}
        windows: dict[tuple[str, int, str], list[Window]] = {}
        for run in range(args.runs):
            for target, (url, servers) in targets.items():
                for inflight in args.inflight:
                    order = MODES if run % 2 == 0 else MODES[::-1]
                    for mode in order:
                        window = await asyncio.to_thread(
                            measure, url, mode, inflight, servers, args.warmup, args.seconds
                        )
                        windows.setdefault((target, inflight, mode), []).append(window)
        return [
            Row(target, inflight, mode, tuple(windows[(target, inflight, mode)]))
            for target in targets
            for inflight in args.inflight
            for mode in MODES
        ]
    finally:
        if gateway is not None:
            gateway.stop()
        worker.stop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="windows per row (median)")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of a window")
    parser.add_argument("--warmup", type=float, default=0.5, help="load before a window")
    parser.add_argument(
        "--inflight",
        type=lambda s: [int(v) for v in s.split(",")],
        default=[1, 16],
        help="requests in flight, comma-separated (default 1,16)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rs_bench_stream_") as tmp:
        rows = asyncio.run(_run(args, Path(tmp)))
    rows += guest.run(_in_process, args)  # Trio as asyncio's guest, as the worker runs
    print(
        f"ModelStreamInfer against ModelInfer, one connection, closed loop; "
        f"{args.runs} windows of {args.seconds:g} s per row, medians"
    )
    report(rows)


if __name__ == "__main__":
    main()
