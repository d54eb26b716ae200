"""A well-behaved client through the gateway, with and without two hostile clients (issue 41).

One worker (the real ``serve_grpc`` over the real ``Service`` and the fake host of
``tests/fake_host.py``) and one gateway (``reactantserver gateway``, a real process) in
front of it, from this tree (**after**) and, side by side, from the tree at
``--baseline REV`` (**before**; default: where this branch left ``main``). A victim
client (``tritonclient``, one call in flight) sends ModelInfer through the gateway all the
time; the run alternates quiet phases and hostile phases, in pairs, and in the hostile
ones two more processes attack the gateway, each one message every ``--interval`` seconds:

* **decode** (item 4): a ServerLive of 300 KB of three-byte unknown fields, a ModelInfer
  of 3 MB of them, a SystemSharedMemoryRegister of 300 KB of them (the gateway decodes
  that one itself), in turn;
* **hold** (item 7): calls whose HEADERS come and whose message never does (a new
  connection for each, up to 64 held at once), answers it never reads (a connection of
  eight ModelInfer calls with 2 MiB answers and no stream window), and ModelInfer calls
  naming a sparse 256 MiB shared-memory region with more rows than any compiled batch.

The table: the victim's p50 and p99 latency in each kind of phase, their ratio (the
target: p99 with the hostile clients within 2x the p99 without), calls that failed, and
whether the gateway exited -- the issue's before: a stalled loop, a prober that saw no
worker answer, and a gateway that exited. Then what the hostile clients got back.

    python benchmarks/bench_loop_stall.py [--baseline REV | --no-baseline]
        [--pairs 3] [--seconds 4] [--interval 0.05]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_serve import baseline_tree, merge_base  # noqa: E402
from h2_client import INFER, LIVE, H2Client, RawClient, grpc_message, request_headers  # noqa: E402

from reactantserver.protocol import inference as pb  # noqa: E402

WORKER = r"""
import logging, sys
tree = sys.argv[1]
sys.path[:0] = [tree + "/src", tree + "/tests"]
import trio
from fake_host import FakeHost
from reactantserver.config.schema import EndpointsConfig
from reactantserver.service import Service
from reactantserver.transport import guest
from reactantserver.worker.grpc import serve_grpc
logging.basicConfig(level=logging.ERROR)
async def main():
    host = FakeHost()
    async with trio.open_nursery() as nursery:
        await nursery.start(host.run)
        port = await nursery.start(serve_grpc, Service(host), EndpointsConfig(port=0))
        print(port, flush=True)
guest.run(main)
"""

REGISTER = "/inference.GRPCInferenceService/SystemSharedMemoryRegister"
UNKNOWN = b"\x52\x01\x00"  # field 10, one byte: three bytes an unknown field
SHM = Path("/dev/shm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def infer_message(rows: int = 1, model: str = "double", extra: bytes = b"") -> bytes:
    x = np.ones((rows, 16), dtype=np.float32)
    tensor = pb.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=[rows, 16])
    return (
        bytes(
            pb.ModelInferRequest(
                model_name=model, inputs=[tensor], raw_input_contents=[x.tobytes()]
            )
        )
        + extra
    )


# ---------------------------------------------------------------------------- servers


class Fleet:
    """One worker and one gateway, from ``tree``, as processes."""

    def __init__(self, tree: Path, workdir: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree / "src")}
        self.worker = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tree)], stdout=subprocess.PIPE, env=env
        )
        assert self.worker.stdout is not None
        worker_port = int(self.worker.stdout.readline())
        self.port = free_port()
        config = workdir / f"gateway-{uuid.uuid4().hex[:6]}.yml"
        config.write_text(
            f"listen:\n  grpc: 127.0.0.1:{self.port}\n  metrics: 127.0.0.1:0\n"
            f"endpoints: [127.0.0.1:{worker_port}]\n"
            "health_interval_seconds: 1.0\nwedge_exit_rounds: 3\n"
            "logging:\n  level: error\n  format: text\n"
        )
        self.log = config.with_suffix(".log")
        with open(self.log, "wb") as log:
            self.gateway = subprocess.Popen(
                [sys.executable, "-m", "reactantserver.cli", "gateway", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + 60
        while not self._serves():
            if self.gateway.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start:\n{self.log.read_text()}")
            time.sleep(0.1)

    def _serves(self) -> bool:
        try:
            with H2Client(self.port) as client:
                return client.call(INFER, infer_message(), wait=2).grpc_status == 0
        except OSError:
            return False

    def exited(self) -> int | None:
        return self.gateway.poll()

    def stop(self) -> None:
        for process in (self.gateway, self.worker):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()


@contextmanager
def fleet(tree: Path, workdir: Path) -> Iterator[Fleet]:
    f = Fleet(tree, workdir)
    try:
        yield f
    finally:
        f.stop()


# ------------------------------------------------------------------ the hostile clients


def data_frames(message: bytes, sid: int = 1) -> bytes:
    """``message``, gRPC-framed, as the DATA frames of stream ``sid`` (1 MiB each, the
    frame size the servers advertise), built once: the attacker spends nothing per send."""
    framed = grpc_message(message)
    step = 1 << 20
    return b"".join(
        RawClient.data(sid, framed[at : at + step], end_stream=at + step >= len(framed))
        for at in range(0, len(framed), step)
    )


def attack_decode(
    port: int, interval: float, stop: threading.Event, got: collections.Counter[str]
) -> None:
    live = UNKNOWN * 100_000
    infer = infer_message(extra=UNKNOWN * 1_000_000)
    register = bytes(pb.SystemSharedMemoryRegisterRequest(name="r", key="/k", byte_size=64)) + live
    kinds = [("ServerLive 300 KB", LIVE, data_frames(live)),
             ("ModelInfer 3 MB", INFER, data_frames(infer)),
             ("SSM register 300 KB", REGISTER, data_frames(register))]  # fmt: skip
    turn = 0
    while not stop.is_set():
        kind, path, frames = kinds[turn % len(kinds)]
        turn += 1
        try:
            client = RawClient(port)
            client.handshake()
            client.send(client.headers(1, request_headers(path)) + frames)
            result = client.wait(1, 30)
            client.close()
            status = result.grpc_status if result.grpc_status is not None else "no answer"
            got[f"{kind}: {status}"] += 1
        except OSError:
            got[f"{kind}: connection failed"] += 1
        stop.wait(interval)


def attack_hold(
    port: int, interval: float, stop: threading.Event, got: collections.Counter[str]
) -> None:
    held: list[H2Client] = []
    unread: RawClient | None = None
    rows = (1 << 20) // 64  # 1 MiB in, 2 MiB out
    big = infer_message(rows=rows)
    size = 256 << 20
    name = f"reactantserver-bench-{uuid.uuid4().hex[:8]}"
    with open(SHM / name, "wb") as f:
        f.truncate(size)
    shm = pb.ModelInferRequestInferInputTensor(
        name="x", datatype="FP32", shape=[size // 64, 16],
        parameters={"shared_memory_region": pb.InferParameter(string_param=name),
                    "shared_memory_byte_size": pb.InferParameter(int64_param=size)},
    )  # fmt: skip
    rows_request = bytes(pb.ModelInferRequest(model_name="double", inputs=[shm]))
    try:
        with H2Client(port) as client:
            registered = pb.SystemSharedMemoryRegisterRequest(
                name=name, key="/" + name, byte_size=size
            )
            got[f"shm register: {client.call(REGISTER, bytes(registered)).grpc_status}"] += 1
        turn = 0
        while not stop.is_set():
            turn += 1
            try:
                held = [c for c in held if not c.connection.closed]
                if len(held) < 64:
                    c = H2Client(port)
                    c.start(INFER)  # headers; never the message
                    held.append(c)
                    got["held calls opened"] += 1
                for c in held:
                    c.pump(0)
                if unread is None or unread.connection.closed:
                    unread = RawClient(port)
                    unread.handshake()
                    for sid in range(1, 17, 2):
                        unread.send(
                            unread.headers(sid, request_headers(INFER)) + data_frames(big, sid)
                        )
                    got["unread connections opened"] += 1
                unread.pump(0)
                if turn % 4 == 0:
                    with H2Client(port) as c:
                        got[f"shm rows: {c.call(INFER, rows_request, wait=30).grpc_status}"] += 1
            except OSError:
                got["connection failed"] += 1
            stop.wait(interval)
    finally:
        for c in held:
            c.close()
        os.unlink(SHM / name)


ATTACKS = {"decode": attack_decode, "hold": attack_hold}


def hostile_process(kind: str, port: int, interval: float, out: str) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    got: collections.Counter[str] = collections.Counter()
    ATTACKS[kind](port, interval, stop, got)
    Path(out).write_text(json.dumps(got))


# --------------------------------------------------------------------------- the victim


def victim_phase(port: int, seconds: float) -> tuple[list[float], int]:
    import tritonclient.grpc as grpcclient

    latencies: list[float] = []
    failures = 0
    x = grpcclient.InferInput("x", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
        client.infer("double", [x])  # the connection, warm
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            try:
                client.infer("double", [x], client_timeout=30)
                latencies.append(time.perf_counter() - started)
            except Exception:
                failures += 1
                time.sleep(0.05)  # a gateway gone: do not spin on refusals
    return latencies, failures


def attacker(kind: str, port: int, interval: float, out: Path) -> subprocess.Popen[bytes]:
    """A hostile client, in a process of its own (its CPU is not the victim's)."""
    command = [sys.executable, __file__, "--attack", kind, "--port", str(port)]
    return subprocess.Popen([*command, "--interval", str(interval), "--out", str(out)])


def run_tree(label: str, tree: Path, workdir: Path, args: argparse.Namespace) -> dict[str, object]:
    quiet: list[float] = []
    loud: list[float] = []
    failures = {"quiet": 0, "hostile": 0}
    got: collections.Counter[str] = collections.Counter()
    with fleet(tree, workdir) as f:
        for _ in range(args.pairs):
            if f.exited() is not None:
                break
            lat, failed = victim_phase(f.port, args.seconds)
            quiet += lat
            failures["quiet"] += failed
            outs = [workdir / f"{label}-{kind}-{uuid.uuid4().hex[:6]}.json" for kind in ATTACKS]
            attackers = [
                attacker(kind, f.port, args.interval, out)
                for kind, out in zip(ATTACKS, outs, strict=True)
            ]
            time.sleep(1.0)  # the attackers are under way
            lat, failed = victim_phase(f.port, args.seconds)
            loud += lat
            failures["hostile"] += failed
            for a in attackers:
                a.terminate()
            for a in attackers:
                a.wait(60)
            for out in outs:
                if out.exists():
                    got.update(json.loads(out.read_text()))
            time.sleep(1.0)  # held connections and unread answers time out or are closed
        exited = f.exited()
    return {"quiet": quiet, "hostile": loud, "failures": failures, "exited": exited, "got": got}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


def table(results: dict[str, dict[str, object]], args: argparse.Namespace) -> None:
    print(
        f"\nVictim ModelInfer through the gateway (one in flight), {args.pairs} pairs of "
        f"{args.seconds:g} s phases; hostile: two clients, a message every {args.interval:g} s each"
    )
    print(f"{'tree':<8} {'phase':<8} {'calls':>6} {'p50 ms':>8} {'p99 ms':>8} {'failed':>7}")
    for label, r in results.items():
        for phase in ("quiet", "hostile"):
            lat = r[phase]
            assert isinstance(lat, list)
            failed = r["failures"][phase]  # type: ignore[index]
            print(
                f"{label:<8} {phase:<8} {len(lat):>6} {pct(lat, 0.5):>8.2f} {pct(lat, 0.99):>8.2f} {failed:>7}"
            )
        quiet, loud = r["quiet"], r["hostile"]
        assert isinstance(quiet, list) and isinstance(loud, list)
        ratio = pct(loud, 0.99) / pct(quiet, 0.99) if quiet and loud else float("nan")
        exited = r["exited"]
        print(
            f"{label:<8} p99 hostile / quiet = {ratio:.2f} (target <= 2); gateway "
            + ("kept running" if exited is None else f"EXITED with status {exited}")
        )
    for label, r in results.items():
        got = r["got"]
        assert isinstance(got, collections.Counter)
        print(f"\n{label}: what the hostile clients got (kind: gRPC status) x count")
        for what, n in sorted(got.items()):
            print(f"  {what:<40} {n:>6}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=None, help="git revision of the 'before' tree")
    parser.add_argument("--no-baseline", action="store_true", help="run this tree only")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--attack", choices=sorted(ATTACKS), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attack:
        hostile_process(args.attack, args.port, args.interval, args.out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        trees: list[tuple[str, Path]] = []
        if not args.no_baseline:
            rev = args.baseline or merge_base()
            old = baseline_tree(rev, workdir) if rev != "HEAD" else None
            print(f"before = {rev[:12] if old else '(none)'}, after = this tree")
            if old is not None:
                trees.append(("before", old))
        trees.append(("after", ROOT))
        results = {label: run_tree(label, tree, workdir, args) for label, tree in trees}
        table(results, args)


if __name__ == "__main__":
    main()
