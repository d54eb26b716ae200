"""Hostile clients against the gRPC surface, before and after the hardening of issue 13.

Two servers run side by side in one run, each in its own process: the real
``serve_grpc`` over the real ``Service`` and the fake host of ``tests/fake_host.py`` --
one from this tree (**after**), one from the tree at ``--baseline REV`` (**before**;
default: where this branch left ``main``, extracted with ``git archive``). Every client
is a hand-driven HTTP/2 client (``tests/h2_client.py``) or ``tritonclient``, in this
process. Four tables:

1. 10,000 hostile requests (sixteen kinds, cycled) -> the statuses they got, and the
   server's RSS before and after; plus the connection-level attacks, one by one.
2. 300 stalled connections (TCP only, never a preface) + normal traffic -> the p50 of a
   normal call on a kept connection and on a new connection, with and without them.
3. 5,000 half-open ModelInfer streams (50 connections x 100, each a prefix declaring
   1 MiB and 4 KiB of it) -> streams accepted and refused, RSS growth while they are
   open and after the client leaves, against the configured stream limits.
4. The shared-memory round trip of a 38 MB tensor (64 x 3 x 224 x 224 FP32, input and
   output in shared memory): p50 before (mapped) and after (read and written).

    python benchmarks/bench_hostile.py [--baseline REV] [--requests N]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import hpack  # noqa: E402
from bench_serve import baseline_tree, merge_base  # noqa: E402
from h2_client import (  # noqa: E402
    INFER,
    LIVE,
    H2Client,
    RawClient,
    frame,
    grpc_message,
    request_headers,
)

from reactantserver.protocol import inference as pb  # noqa: E402

STATUS_NAMES = {
    0: "OK",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
}
RESET_NAMES = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 7: "REFUSED_STREAM", 8: "CANCEL"}

LAUNCHER = r"""
import json, logging, sys
tree, overrides = sys.argv[1], json.loads(sys.argv[2])
sys.path[:0] = [tree + "/src", tree + "/tests"]
import trio
from fake_host import FakeHost
from reactantserver.config.schema import EndpointsConfig
from reactantserver.service import Service
from reactantserver.worker.grpc import serve_grpc
logging.basicConfig(level=logging.ERROR)
# Since issue 16 the server runs Trio as asyncio's guest and the fake host owns a task;
# a tree from before (the baseline) runs as it did then.
guest_mode = hasattr(FakeHost, "run")
async def main():
    endpoints = EndpointsConfig(host="127.0.0.1", port=0, **overrides)
    host = FakeHost()
    async with trio.open_nursery() as nursery:
        if guest_mode:
            await nursery.start(host.run)
        port = await nursery.start(serve_grpc, Service(host), endpoints)
        print(port, flush=True)
if guest_mode:
    from reactantserver.transport import guest
    guest.run(main)
else:
    trio.run(main)
"""


# ---------------------------------------------------------------------------- servers


class Server:
    def __init__(self, label: str, tree: Path, overrides: dict[str, Any]) -> None:
        self.label = label
        self.process = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(tree), json.dumps(overrides)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the {label} server did not start")
        self.port = int(line)

    def alive(self) -> bool:
        return self.process.poll() is None

    def rss(self) -> int:
        with open(f"/proc/{self.process.pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def stop(self) -> None:
        if self.alive():
            self.process.terminate()
            self.process.wait(10)


@contextmanager
def server(label: str, tree: Path, **overrides: Any) -> Iterator[Server]:
    s = Server(label, tree, overrides)
    try:
        yield s
    finally:
        s.stop()


def mib(n: float) -> str:
    return f"{n / 2**20:+.1f} MiB" if n < 0 or n > 0 else "0.0 MiB"


# ----------------------------------------------------------------- 1. hostile requests


def infer_message(
    model: str = "double",
    shape: tuple[int, ...] = (1, 16),
    parameters: dict[str, pb.InferParameter] | None = None,
) -> bytes:
    """A ModelInfer request for ``x`` (FP32) of ``shape``; raw bytes unless in shm."""
    tensor = pb.ModelInferRequestInferInputTensor(
        name="x", datatype="FP32", shape=list(shape), parameters=parameters or {}
    )
    count = int(np.prod(shape)) if all(d < 2**20 for d in shape) else 0
    raw = [] if parameters else [bytes(4 * count)]
    return bytes(pb.ModelInferRequest(model_name=model, inputs=[tensor], raw_input_contents=raw))


#: kind -> (headers options, body bytes or None, end the stream)
KINDS: dict[str, tuple[dict[str, Any], bytes | None, bool]] = {
    "grpc-timeout 0n": ({"timeout": "0n"}, grpc_message(infer_message()), True),
    "grpc-timeout 1n": ({"timeout": "1n"}, grpc_message(infer_message()), True),
    "grpc-timeout malformed": ({"timeout": "soon"}, grpc_message(infer_message()), True),
    "compressed flag": ({}, grpc_message(infer_message(), flag=1), True),
    "grpc-encoding gzip": (
        {"extra": (("grpc-encoding", "gzip"),)},
        grpc_message(b"x", flag=1),
        True,
    ),
    "cut short": ({}, grpc_message(bytes(10), length=100), True),
    "no message": ({}, None, True),
    "two messages": ({}, grpc_message(infer_message()) * 2, True),
    "4 GiB prefix": ({}, struct.pack(">BI", 0, 2**32 - 1) + bytes(16384), False),
    "unknown method": ({"path": "/no.Such/Method"}, grpc_message(b""), True),
    "content-type text": ({"extra": (("content-type", "text/plain"),)}, grpc_message(b""), True),
    "protobuf garbage": ({}, grpc_message(b"\xff" * 24), True),
    "unknown model": ({}, grpc_message(infer_message("nope")), True),
    "wrong shape": ({}, grpc_message(infer_message(shape=(1, 15))), True),
    "hostile shape": ({}, grpc_message(infer_message(shape=(0, 2**62))), True),
    "unregistered shm": (
        {},
        grpc_message(
            infer_message(
                parameters={
                    "shared_memory_region": pb.InferParameter(string_param="nope"),
                    "shared_memory_byte_size": pb.InferParameter(int64_param=64),
                }
            )
        ),
        True,
    ),
}


def hostile_round(port: int, kinds: list[str], wait: float) -> list[tuple[str, str]]:
    """One connection, one stream per kind, all sent at once; (kind, outcome) each."""
    out: list[tuple[str, str]] = []
    try:
        client = H2Client(port)
    except OSError:
        return [(k, "connection refused") for k in kinds]
    with client:
        sids: list[tuple[str, int]] = []
        for kind in kinds:
            options, body, end = KINDS[kind]
            try:
                sid = client.start(
                    options.get("path", INFER),
                    timeout=options.get("timeout"),
                    extra=options.get("extra", ()),
                    end_stream=body is None,
                )
                if body is not None:
                    client.send(sid, body, end_stream=end)
            except Exception:
                out.append((kind, "could not send"))
                continue
            sids.append((kind, sid))
        last, progress = time.monotonic(), -1
        while True:
            done = sum(client.results[sid].finished for _, sid in sids)
            if done == len(sids) or client.connection.closed:
                break
            if done != progress:
                progress, last = done, time.monotonic()
            elif time.monotonic() - last > wait:
                break
            client.pump(0.05)
        for kind, sid in sids:
            r = client.results[sid]
            if r.grpc_status is not None:
                outcome = STATUS_NAMES.get(r.grpc_status, str(r.grpc_status))
            elif r.reset is not None:
                outcome = f"RST_STREAM {RESET_NAMES.get(r.reset, r.reset)}"
            elif client.connection.closed:
                outcome = "connection lost"
            else:
                outcome = "no answer"
            out.append((kind, outcome))
    return out


def hostile_requests(
    srv: Server, n: int
) -> tuple[collections.Counter[str], dict[str, str], int, int]:
    kinds = list(KINDS)
    before = srv.rss()
    counts: collections.Counter[str] = collections.Counter()
    by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    per_round = 96
    sent = 0
    while sent < n and srv.alive():
        batch = [kinds[(sent + i) % len(kinds)] for i in range(min(per_round, n - sent))]
        for kind, outcome in hostile_round(srv.port, batch, wait=0.3):
            counts[outcome] += 1
            by_kind[kind][outcome] += 1
        sent += len(batch)
    time.sleep(0.5)
    after = srv.rss() if srv.alive() else 0
    summary = {k: ", ".join(f"{o}" for o, _ in c.most_common(2)) for k, c in by_kind.items()}
    return counts, summary, before, after


def connection_attacks(srv: Server) -> dict[str, str]:
    """Each connection-level attack once on its own connection; what the client saw."""
    out: dict[str, str] = {}

    def attempt(name: str, run: Callable[[RawClient], None]) -> None:
        if not srv.alive():
            out[name] = "(server already dead)"
            return
        with RawClient(srv.port) as c:
            c.handshake()
            run(c)
            closed = c.wait_closed(3).closed
        time.sleep(0.3)
        if not srv.alive():
            out[name] = "server process died"
        elif c.connection.goaway is not None:
            out[name] = f"GOAWAY code {c.connection.goaway[0]}"
        elif closed:
            out[name] = "connection closed"
        else:
            ok = H2Client(srv.port).call(LIVE, b"", wait=3).grpc_status == 0
            out[name] = "ignored, connection fine" if ok else "connection stuck"

    attempt("unknown frame type 0xFA", lambda c: c.send(frame(0xFA, 0, 0, b"abc")))
    attempt(
        "DATA frame declaring 16 MiB",
        lambda c: c.send(
            c.headers(1, request_headers(INFER))
            + frame(0x0, 0, 1, bytes(1024), length=(1 << 24) - 1)
        ),
    )
    evil = hpack.Encoder().encode(
        [(k.encode(), v.encode()) for k, v in request_headers(LIVE)] + [(b"x-evil", b"\xff")]
    )
    attempt("header value 0xff", lambda c: c.send(frame(0x1, 0x4, 1, evil)))
    return out


def table_hostile(before: Server | None, after: Server, n: int) -> None:
    print(f"\n1. {n} hostile requests, {len(KINDS)} kinds cycled (stream level)")
    results = []
    for srv in [s for s in (before, after) if s is not None]:
        results.append((srv, *hostile_requests(srv, n)))
    outcomes = sorted({o for _, counts, *_ in results for o in counts})
    header = f"{'outcome':<28}" + "".join(f"{srv.label:>14}" for srv, *_ in results)
    print(header)
    for outcome in outcomes:
        print(f"{outcome:<28}" + "".join(f"{counts[outcome]:>14}" for _, counts, *_ in results))
    print(f"{'server alive after':<28}" + "".join(f"{srv.alive()!s:>14}" for srv, *_ in results))
    print(f"{'RSS before':<28}" + "".join(f"{b / 2**20:>10.1f} MiB" for _, _, _, b, _ in results))
    print(f"{'RSS after':<28}" + "".join(f"{a / 2**20:>10.1f} MiB" for _, _, _, _, a in results))
    print("\n   by kind (most common outcome)")
    print(f"   {'kind':<26}" + "".join(f"{srv.label:>22}" for srv, *_ in results))
    for kind in KINDS:
        print(f"   {kind:<26}" + "".join(f"{s[kind]:>22}" for _, _, s, _, _ in results))

    print("\n   connection-level attacks, one connection each")
    rows = [(srv.label, connection_attacks(srv)) for srv, *_ in results]
    names = list(rows[-1][1])
    print(f"   {'attack':<30}" + "".join(f"{label:>28}" for label, _ in rows))
    for name in names:
        print(f"   {name:<30}" + "".join(f"{r[name]:>28}" for _, r in rows))


# ----------------------------------------------------------- 2. stalled connections


def p50_ms(fn: Callable[[], Any], n: int) -> float:
    fn()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e3


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (what it wrote first, its SETTINGS, is skipped)."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
        return True  # EOF
    except BlockingIOError:
        return False
    except OSError:
        return True


def table_stalled(trees: list[tuple[str, Path, dict[str, Any]]], stalled_n: int = 300) -> None:
    print(f"\n2. {stalled_n} stalled connections (TCP connected, no HTTP/2 preface) + normal calls")
    print(
        f"{'server':<10} {'stalled':>8} {'kept conn p50 ms':>17} {'new conn p50 ms':>16} "
        f"{'new conn ok':>12} {'stalled closed after 12 s':>26}"
    )
    request = infer_message()
    for label, tree, overrides in trees:
        with server(label, tree, **overrides) as srv:
            kept = H2Client(srv.port)
            for n in (0, stalled_n):
                socks = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(n)]
                opened = time.monotonic()
                time.sleep(0.5)
                kept_p50 = p50_ms(lambda kept=kept: kept.call(INFER, request), 200)
                ok = 0

                def fresh() -> None:
                    nonlocal ok
                    with H2Client(srv.port) as c:
                        ok += c.call(INFER, request, wait=5).grpc_status == 0

                new_p50 = p50_ms(fresh, 100)
                closed = "-"
                if n:
                    time.sleep(max(0.0, 12 - (time.monotonic() - opened)))
                    closed = f"{sum(closed_by_peer(s) for s in socks)}/{n}"
                print(
                    f"{label:<10} {n:>8} {kept_p50:>17.2f} {new_p50:>16.2f} {ok:>8}/101 "
                    f"{closed:>26}"
                )
                for s in socks:
                    s.close()
            kept.close()


# --------------------------------------------------------------- 3. half-open streams


def table_half_open(
    trees: list[tuple[str, Path, dict[str, Any]]], conns: int = 50, per: int = 100
) -> None:
    print(
        f"\n3. {conns * per} half-open ModelInfer streams ({conns} connections x {per}; each a prefix declaring 1 MiB, then 4 KiB of it)"
    )
    print(
        f"{'server':<26} {'accepted':>9} {'refused':>8} {'conn errors':>12} {'RSS open':>12} {'per stream':>11} {'RSS after':>12}"
    )
    body = struct.pack(">BI", 0, 1 << 20) + bytes(4096)
    for label, tree, overrides in trees:
        with server(label, tree, **overrides) as srv:
            for _ in range(3):  # warm up
                H2Client(srv.port).call(INFER, infer_message())
            time.sleep(0.3)
            base = srv.rss()
            clients = []
            for _ in range(conns):
                c = RawClient(srv.port)
                c.handshake()
                frames = []
                for i in range(per):
                    sid = 1 + 2 * i
                    frames.append(
                        c.headers(
                            sid,
                            [
                                (":method", "POST"),
                                (":scheme", "http"),
                                (":path", INFER),
                                (":authority", "x"),
                                ("content-type", "application/grpc"),
                                ("te", "trailers"),
                            ],
                        )
                    )
                    frames.append(c.data(sid, body))
                c.send(b"".join(frames))
                clients.append(c)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                for c in clients:
                    c.pump(0.01)
            refused = sum(1 for c in clients for r in c.results.values() if r.reset == 7)
            errors = sum(1 for c in clients if c.connection.goaway or c.connection.closed)
            accepted = sum(
                1
                for c in clients
                if not (c.connection.goaway or c.connection.closed)
                for sid in range(1, 2 * per, 2)
                if not c.results.get(sid) or not c.results[sid].finished
            )
            open_rss = srv.rss() - base
            for c in clients:
                c.close()
            time.sleep(5)  # the server's memory reclaim runs within a tick or two
            after = srv.rss() - base
            per_stream = open_rss / accepted / 1024 if accepted else 0.0
            print(
                f"{label:<26} {accepted:>9} {refused:>8} {errors:>12} {mib(open_rss):>12} {per_stream:>8.1f} KiB {mib(after):>12}"
            )


# ------------------------------------------------------------------ 4. shm round trip


def table_shm(trees: list[tuple[str, Path, dict[str, Any]]], n: int = 40) -> None:
    """Both servers up at once, calls alternating between them (drift hits both)."""
    import tritonclient.grpc as tc
    import tritonclient.utils.shared_memory as tshm

    rows = 64 * 3 * 224 * 224 // 16
    x = np.random.default_rng(0).standard_normal((rows, 16)).astype(np.float32)
    print(
        f"\n4. shared-memory round trip, {x.nbytes / 1e6:.1f} MB in and out "
        "(model 'double', y = 2x), calls alternating between the servers"
    )
    print(f"{'server':<10} {'p50 ms':>9} {'min ms':>9} {'correct':>8}")
    with contextlib.ExitStack() as stack:
        infer: dict[str, Callable[[], Any]] = {}
        check: dict[str, Callable[[], bool]] = {}
        for label, tree, overrides in trees:
            srv = stack.enter_context(server(label, tree, **overrides))
            client = tc.InferenceServerClient(f"127.0.0.1:{srv.port}")
            stack.callback(client.close)
            key_in, key_out = (
                f"/reactantserver-bench_{k}_{uuid.uuid4().hex[:6]}" for k in ("in", "out")
            )
            h_in = tshm.create_shared_memory_region(f"in_{label}", key_in, x.nbytes)
            h_out = tshm.create_shared_memory_region(f"out_{label}", key_out, x.nbytes)
            stack.callback(tshm.destroy_shared_memory_region, h_in)
            stack.callback(tshm.destroy_shared_memory_region, h_out)
            tshm.set_shared_memory_region(h_in, [x])
            client.register_system_shared_memory("in", key_in, x.nbytes)
            client.register_system_shared_memory("out", key_out, x.nbytes)
            inp = tc.InferInput("x", list(x.shape), "FP32")
            inp.set_shared_memory("in", x.nbytes)
            out = tc.InferRequestedOutput("y")
            out.set_shared_memory("out", x.nbytes)
            infer[label] = partial(client.infer, "double", [inp], outputs=[out])
            check[label] = partial(
                lambda h: bool(
                    np.array_equal(tshm.get_contents_as_numpy(h, np.float32, x.shape), 2 * x)
                ),
                h_out,
            )
        samples: dict[str, list[float]] = {label: [] for label in infer}
        for fn in infer.values():
            fn()  # warm up
        for _ in range(n):
            for label, fn in infer.items():
                t = time.perf_counter()
                fn()
                samples[label].append(time.perf_counter() - t)
        for label, xs in samples.items():
            print(
                f"{label:<10} {statistics.median(xs) * 1e3:>9.1f} {min(xs) * 1e3:>9.1f} "
                f"{check[label]()!s:>8}"
            )
        if len(samples) == 2:
            (_, bs), (_, as_) = samples.items()
            print(
                f"after / before: p50 {statistics.median(as_) / statistics.median(bs):.2f}, "
                f"min {min(as_) / min(bs):.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=None, help="git revision of the 'before' server")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--tables", default="1,2,3,4", help="which tables, e.g. 1,4")
    args = parser.parse_args()
    tables = {int(t) for t in args.tables.split(",")}
    with tempfile.TemporaryDirectory() as tmp:
        rev = args.baseline or merge_base()
        old = baseline_tree(rev, Path(tmp)) if rev != "HEAD" else None
        print(f"before = {rev[:12] if old else '(none)'}, after = this tree")
        trees = ([("before", old, {})] if old else []) + [("after", ROOT, {})]

        if 1 in tables:
            with server("after", ROOT) as after:
                if old is not None:
                    with server("before", old) as before:
                        table_hostile(before, after, args.requests)
                else:
                    table_hostile(None, after, args.requests)
        if 2 in tables:
            table_stalled(trees)
        if 3 in tables:
            tight = {"max_concurrent_streams": 32, "max_connections": 64}
            table_half_open([*trees, ("after, 32 streams x 64 conns", ROOT, tight)])
        if 4 in tables:
            table_shm(trees)


if __name__ == "__main__":
    main()
