"""A real gRPC server over the fake host, in a subprocess: for tests that may kill it.

``running_wire_server(**endpoints)`` starts ``python tests/wire_server.py`` -- the real
``serve_grpc`` over the real ``Service`` and ``tests/fake_host.py``'s ``FakeHost`` -- with
the given ``EndpointsConfig`` fields, waits until it listens, and yields a
:class:`WireServer`: its gRPC port, its admin port (``/metrics`` with the service's
statistics) and its process. The server's log (INFO and up) goes to a file the test can
read. A hostile client that crashes the server (SIGBUS, an exception escaping the event
loop) then kills this subprocess, never the test run, and the test sees it die.

Run directly it serves until killed: ``python tests/wire_server.py '{"port": 8080}'``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
from clocks import wait_until

HERE = Path(__file__).resolve().parent


@attrs.frozen
class WireServer:
    port: int
    admin_port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as ``{"name{labels}": value}`` (labels as exposed)."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def shm_mappings(self) -> list[str]:
        """Lines of ``/proc/PID/maps`` that map files under /dev/shm."""
        with open(f"/proc/{self.pid}/maps") as f:
            return [line for line in f if "/dev/shm/" in line]

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def running_wire_server(tmp_path: Path, **endpoints: Any) -> Iterator[WireServer]:
    """Start the server subprocess; stop it (SIGTERM, then SIGKILL) on exit."""
    log_path = tmp_path / f"wire_server_{time.monotonic_ns()}.log"
    ports_path = log_path.with_suffix(".ports")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, str(Path(__file__)), json.dumps(endpoints), str(ports_path)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:

        def started() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"wire server exited early:\n{log_path.read_text()}")
            return ports_path.exists() and ports_path.read_text().endswith("\n")

        wait_until(started, 60, lambda: f"the wire server started:\n{log_path.read_text()}")
        port, admin_port = (int(p) for p in ports_path.read_text().split())
        yield WireServer(port, admin_port, process, log_path)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


# ------------------------------------------------------------------------- the subprocess


def _main(overrides: dict[str, Any], ports_path: str) -> None:
    import trio
    from fake_host import FakeHost
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector

    from reactantserver.admin import AdminApp, serve_admin
    from reactantserver.config.schema import EndpointsConfig
    from reactantserver.metrics import wire_metrics
    from reactantserver.service import Service
    from reactantserver.shm import SharedMemoryRegistry
    from reactantserver.transport import guest
    from reactantserver.transport.core.limits import WireCounters
    from reactantserver.worker.grpc import serve_grpc

    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s"
    )
    from reactantserver.config.convert import structure
    from reactantserver.config.source import EnvOrigin

    # Nested blocks (tls, restricted, gateway) as the YAML has them.
    endpoints = structure(
        EndpointsConfig,
        {"host": "127.0.0.1", "port": 0, **overrides},
        lambda path: EnvOrigin("wire_server"),
    )
    host = FakeHost()
    registry = SharedMemoryRegistry(
        max_regions=endpoints.max_shm_regions, prefix=endpoints.shm_key_prefix
    )
    service = Service(host, registry=registry)
    wire = WireCounters()

    class _Collector(Collector):
        def collect(self) -> Iterator[Any]:
            stats = service.statistics()
            family = GaugeMetricFamily("worker_inflight_requests", "ModelInfer in flight.")
            family.add_metric([], stats.in_flight)
            yield family
            yield from wire_metrics({}, wire.statistics())

    async def main() -> None:
        registry = CollectorRegistry()
        registry.register(_Collector())
        async with trio.open_nursery() as nursery:
            await nursery.start(host.run)
            port = await nursery.start(partial(serve_grpc, service, endpoints, counters=wire))
            admin = await nursery.start(
                serve_admin, AdminApp(registry, lambda: (True, "")), "127.0.0.1", 0
            )
            tmp = ports_path + ".tmp"
            with open(tmp, "w") as f:
                f.write(f"{port} {admin}\n")
            os.replace(tmp, ports_path)

    guest.run(main)  # as the worker runs: Trio as the guest of an asyncio loop


if __name__ == "__main__":
    _main(json.loads(sys.argv[1]), sys.argv[2])
