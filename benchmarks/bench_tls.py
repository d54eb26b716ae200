"""What TLS costs the server: CPU per request and per new connection, beside cleartext.

Two servers run at once, each in its own process -- the real ``serve_grpc`` over the real
``Service`` and a host that answers at once (``bench_grpc``'s identity model, so what is
measured is the transport) -- one serving cleartext h2c, one TLS (and, for connections,
mutual TLS), with certificates made for the run (trustme). The client is grpcio's
asyncio API in a process of its own, as a real client would be. What is measured is the
*server* process's CPU time (user + system, ``/proc``) across a run of calls, divided by
the calls: the one number an operator pays per request. The modes alternate within each
pair of runs (ABAB...), so that a machine whose load changes moves both alike; the table
shows the median over the pairs and the ratio to cleartext.

* ``steady``: ``--calls`` small ModelInfer calls (16 FP32) over one connection,
  ``--concurrency`` in flight: the record layer's encryption per request.
* ``connect``: ``--connections`` new connections, one ServerLive each: the handshake.

    python benchmarks/bench_tls.py [--pairs 5] [--calls 3000] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
COLS = 16


def _cpu_seconds(pid: int) -> float:
    """The CPU time of every thread of ``pid`` so far, in seconds: ``/proc/PID/task/*/
    schedstat`` (nanoseconds; ``/proc/PID/stat`` counts in 10 ms ticks, too coarse for a
    run of a few thousand calls)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total / 1e9


# ------------------------------------------------------------------------------ the server


def _serve(endpoints: dict[str, Any], port_file: str) -> None:
    sys.path.insert(0, str(HERE))
    from bench_grpc import _Host

    from reactantserver.config.convert import structure
    from reactantserver.config.schema import EndpointsConfig
    from reactantserver.config.source import EnvOrigin
    from reactantserver.service import Service
    from reactantserver.transport import guest
    from reactantserver.worker.grpc import serve_grpc

    config = structure(
        EndpointsConfig,
        {"host": "127.0.0.1", "port": 0, "max_concurrent_requests": 0, **endpoints},
        lambda path: EnvOrigin("bench"),
    )

    async def main() -> None:
        import trio

        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_grpc, Service(_Host()), config)  # type: ignore[arg-type]
            Path(port_file + ".tmp").write_text(str(port))
            os.replace(port_file + ".tmp", port_file)

    guest.run(main)


class Server:
    def __init__(self, label: str, endpoints: dict[str, Any], tmp: Path) -> None:
        self.label = label
        port_file = tmp / f"{label}.port"
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve", json.dumps(endpoints), str(port_file)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {label} server did not start")
            time.sleep(0.02)
        self.port = int(port_file.read_text())

    def cpu(self) -> float:
        return _cpu_seconds(self.process.pid)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


# ------------------------------------------------------------------------------ the client


def _drive(spec: dict[str, Any]) -> None:
    """The client process: one run of calls (steady) or of connections (connect)."""
    import grpc
    import numpy as np

    from reactantserver.protocol import inference as pb

    target = f"127.0.0.1:{spec['port']}"
    creds = None
    if spec.get("ca"):
        cert = Path(spec["cert"]).read_bytes() if spec.get("cert") else None
        key = Path(spec["key"]).read_bytes() if spec.get("key") else None
        creds = grpc.ssl_channel_credentials(Path(spec["ca"]).read_bytes(), key, cert)
    x = np.arange(COLS, dtype=np.float32).reshape(1, COLS)
    infer = bytes(
        pb.ModelInferRequest(
            model_name="identity",
            inputs=[
                pb.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=[1, COLS])
            ],
            raw_input_contents=[x.tobytes()],
        )
    )
    options = [("grpc.use_local_subchannel_pool", 1)]

    def open_channel() -> Any:
        if creds is None:
            return grpc.aio.insecure_channel(target, options=options)
        return grpc.aio.secure_channel(target, creds, options=options)

    async def steady() -> None:
        async with open_channel() as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            await call(infer)  # connected before the measured run
            print("ready", flush=True)
            sys.stdin.readline()
            left = spec["calls"]

            async def worker() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    await call(infer)

            await asyncio.gather(*(worker() for _ in range(spec["concurrency"])))

    async def connect() -> None:
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(spec["connections"]):
            async with open_channel() as channel:
                await channel.unary_unary("/inference.GRPCInferenceService/ServerLive")(b"")

    asyncio.run(steady() if spec["mode"] == "steady" else connect())
    print("done", flush=True)


def _run(server: Server, spec: dict[str, Any]) -> float:
    """Server CPU seconds spent on one client run (the connection set up before it)."""
    client = subprocess.Popen(
        [sys.executable, __file__, "--drive", json.dumps({**spec, "port": server.port})],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert client.stdin is not None and client.stdout is not None
    assert client.stdout.readline().strip() == "ready"
    before = server.cpu()
    client.stdin.write("go\n")
    client.stdin.flush()
    assert client.stdout.readline().strip() == "done"
    spent = server.cpu() - before
    client.wait(30)
    return spent


# ------------------------------------------------------------------------------ the table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--connections", type=int, default=200)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE.parent / "tests"))
    from tls_certs import make_pki

    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        pki = make_pki(tmp / "pki", clients=("client",))
        tls = {"cert_file": str(pki.server.cert), "key_file": str(pki.server.key)}
        servers = {
            "cleartext": Server("cleartext", {}, tmp),
            "TLS": Server("TLS", {"tls": tls}, tmp),
            "mutual TLS": Server("mtls", {"tls": {**tls, "client_ca_file": str(pki.ca_file)}}, tmp),
        }
        client = pki.client("client")
        creds = {
            "cleartext": {},
            "TLS": {"ca": str(pki.ca_file)},
            "mutual TLS": {
                "ca": str(pki.ca_file),
                "cert": str(client.cert),
                "key": str(client.key),
            },
        }
        steady: dict[str, list[float]] = {m: [] for m in ("cleartext", "TLS")}
        connect: dict[str, list[float]] = {m: [] for m in servers}
        try:
            for pair in range(args.pairs):
                order = list(steady) if pair % 2 == 0 else list(reversed(steady))
                for mode in order:
                    spec = {"mode": "steady", "calls": args.calls,
                            "concurrency": args.concurrency, **creds[mode]}  # fmt: skip
                    steady[mode].append(_run(servers[mode], spec) / args.calls)
                order = list(connect) if pair % 2 == 0 else list(reversed(connect))
                for mode in order:
                    spec = {"mode": "connect", "connections": args.connections, **creds[mode]}
                    connect[mode].append(_run(servers[mode], spec) / args.connections)
        finally:
            for server in servers.values():
                server.stop()
    print(
        f"server CPU per request and per new connection, TLS beside cleartext "
        f"({date.today().isoformat()}; {args.pairs} pairs, {args.calls} calls at "
        f"{args.concurrency} in flight, {args.connections} connections)"
    )
    print(f"{'run':<34} {'cleartext':>12} {'TLS':>12} {'mutual TLS':>12} {'TLS / clear':>12}")
    med = {m: statistics.median(v) * 1e6 for m, v in steady.items()}
    print(
        f"{'ModelInfer, us CPU / request':<34} {med['cleartext']:>12.1f} {med['TLS']:>12.1f} "
        f"{'':>12} {med['TLS'] / med['cleartext']:>12.2f}"
    )
    conn = {m: statistics.median(v) * 1e6 for m, v in connect.items()}
    print(
        f"{'new connection, us CPU each':<34} {conn['cleartext']:>12.0f} {conn['TLS']:>12.0f} "
        f"{conn['mutual TLS']:>12.0f} {conn['TLS'] / conn['cleartext']:>12.2f}"
    )
    ratios = [t / c for t, c in zip(steady["TLS"], steady["cleartext"], strict=True)]
    print(f"per-pair TLS / cleartext (requests): {' '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        _serve(json.loads(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "--drive":
        _drive(json.loads(sys.argv[2]))
    else:
        main()
