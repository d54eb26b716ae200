"""Run gateways and workers for the gateway tests: in threads, or as real processes.

``running_gateway(config)`` runs ``serve_gateway`` as Trio's guest of its own asyncio loop
on a thread, exactly as ``reactantserver gateway`` does minus the signals, and yields its
address; leaving the block stops it the way SIGTERM does (drain, then return).

``fake_workers(n)`` runs ``n`` gRPC servers over ``tests/fake_host.FakeHost`` (no JAX, no
compilation), each on its own thread and loop: a fleet of workers in a few milliseconds.

``WorkerProcess`` and ``GatewayProcess`` are real ``python -m reactantserver.cli``
subprocesses, for the end-to-end tests: started, waited for, signalled and killed by pid.

Every wait is bounded and generous: the machine running the suite is shared.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
from clocks import wait_until
from fake_host import FakeHost
from worker_harness import free_port

from reactantserver.config.schema import (
    EndpointsConfig,
    GatewayConfig,
    GatewayTrust,
    WorkerClientConfig,
)
from reactantserver.gateway.app import Gateway, GatewayAddress, serve_gateway
from reactantserver.service import Service
from reactantserver.transport import guest
from reactantserver.worker.grpc import serve_grpc

ROOT = Path(__file__).resolve().parent.parent


@attrs.define
class GatewayRun:
    address: GatewayAddress
    token: trio.lowlevel.TrioToken
    stop_event: trio.Event
    #: The running gateway's objects (router, stats...): read them, do not change them.
    gateway: Gateway

    def stop(self) -> None:
        """Begin stopping (as SIGTERM does) without waiting for it."""
        trio.from_thread.run_sync(self.stop_event.set, trio_token=self.token)

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.address.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.address.metrics_port}"


@contextmanager
def running_gateway(config: GatewayConfig, *, timeout: float = 60.0) -> Iterator[GatewayRun]:
    started: dict[str, Any] = {}
    ready = threading.Event()
    failed: list[BaseException] = []
    gateway = Gateway(config)

    async def main() -> None:
        stop = trio.Event()
        started["stop"] = stop
        started["token"] = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            started["address"] = await nursery.start(
                lambda task_status: serve_gateway(
                    config, stop=stop, gateway=gateway, task_status=task_status
                )
            )
            ready.set()

    def run() -> None:
        try:
            guest.run(main)
        except BaseException as exc:
            failed.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="gateway", daemon=True)
    thread.start()
    ready.wait(timeout)
    if failed:
        raise failed[0]
    try:
        yield GatewayRun(started["address"], started["token"], started["stop"], gateway)
    finally:
        if thread.is_alive():
            trio.from_thread.run_sync(started["stop"].set, trio_token=started["token"])
            thread.join(timeout)
        assert not thread.is_alive(), "the gateway did not stop"
        if failed:
            raise failed[0]


@attrs.define
class FakeWorker:
    host: FakeHost
    service: Service
    port: int
    token: trio.lowlevel.TrioToken

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call ``fn(*args)`` on the worker's Trio thread."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token)

    def release_slow(self) -> None:
        self.run_sync(self.host.release.set)


#: The key a test gateway and its fake workers are paired by (their ``worker_client.key_env``
#: and ``endpoints.gateway.key_env``), as a node pairs its own: the workers then keep the
#: gateway's clients' shared memory apart (docs/security.md).
PAIRED_KEY_ENV = "REACTANT_TEST_GATEWAY_KEY"
os.environ.setdefault(PAIRED_KEY_ENV, "a-key-only-these-tests-know")
PAIRED = WorkerClientConfig(key_env=PAIRED_KEY_ENV)


@contextmanager
def fake_workers(
    n: int,
    service: Callable[[FakeHost], Service] = Service,
    *,
    ports: list[int] | None = None,
    endpoints: EndpointsConfig | None = None,
) -> Iterator[list[FakeWorker]]:
    """``n`` fake workers on 127.0.0.1 (``service`` builds each one's Service), on
    ``ports`` when given (any free ones otherwise), trusting a gateway with the
    :data:`PAIRED_KEY_ENV` key unless ``endpoints`` says otherwise."""
    base = endpoints or EndpointsConfig(gateway=GatewayTrust(key_env=PAIRED_KEY_ENV))
    workers: list[FakeWorker] = []
    stops: list[tuple[trio.Event, trio.lowlevel.TrioToken, threading.Thread]] = []
    try:
        for index in range(n):
            port = ports[index] if ports else 0
            box: dict[str, Any] = {}
            ready = threading.Event()

            async def main(
                box: dict[str, Any] = box, ready: threading.Event = ready, port: int = port
            ) -> None:
                host = FakeHost()
                svc = service(host)
                stop = trio.Event()
                box.update(
                    host=host, service=svc, stop=stop, token=trio.lowlevel.current_trio_token()
                )
                async with trio.open_nursery() as tasks:
                    await tasks.start(host.run)  # the tasks of slow models
                    async with trio.open_nursery() as nursery:
                        box["port"] = await nursery.start(
                            lambda task_status: serve_grpc(
                                svc, attrs.evolve(base, port=port), stop=stop,
                                grace_seconds=5.0,
                                task_status=task_status,
                            )
                        )  # fmt: skip
                        ready.set()
                    tasks.cancel_scope.cancel()  # serve_grpc has drained: end host.run

            def run(main: Callable[[], Any] = main, ready: threading.Event = ready) -> None:
                try:
                    guest.run(main)  # serve_grpc needs Trio as asyncio's guest
                finally:
                    ready.set()

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            assert ready.wait(30)
            workers.append(FakeWorker(box["host"], box["service"], box["port"], box["token"]))
            stops.append((box["stop"], box["token"], thread))
        yield workers
    finally:
        for stop, token, thread in stops:
            if thread.is_alive():
                trio.from_thread.run_sync(stop.set, trio_token=token)
        for _, _, thread in stops:
            thread.join(30)


def http_get(url: str, timeout: float = 30.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus exposition (0.0 if absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return 0.0


# ------------------------------------------------------------------------------ processes


@attrs.define
class Process:
    """A ``python -m reactantserver.cli`` child; its output goes to ``log``."""

    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self, timeout: float = 60.0) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def kill(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


def start_cli(args: list[str], log: Path, **env: str) -> Process:
    environment = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1", **env}
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reactantserver.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environment,
            cwd=ROOT,
        )
    return Process(proc, log)


def wait_serving(address: str, process: Process, timeout: float = 120.0) -> None:
    """Until ``address`` answers ServerReady true (the process must stay alive)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(address)

    def ready() -> bool:
        assert process.alive(), f"exited with {process.proc.returncode}:\n{process.text()}"
        try:
            return bool(client.is_server_ready())
        except Exception:
            return False

    try:
        wait_until(ready, timeout, lambda: f"{address} ready:\n{process.text()}")
    finally:
        client.close()


__all__ = [
    "FakeWorker",
    "GatewayRun",
    "Process",
    "fake_workers",
    "free_port",
    "http_get",
    "metric",
    "running_gateway",
    "start_cli",
    "wait_serving",
    "wait_until",
]
