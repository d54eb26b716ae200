"""Run a real worker in a background thread for synchronous tests.

``running_worker(config)`` starts ``reactantserver.worker.serve`` in its own Trio run
on a thread -- Trio as the guest of an asyncio loop, as in production -- waits until it listens *and* has finished its startup load, yields its
address, and on exit asks it to stop the same way SIGTERM does (drain, then return).
Tests then talk to it with ordinary blocking clients (tritonclient, urllib), exactly as
an outside client would.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
from clocks import wait_until

from reactantserver.config import EndpointsConfig, SchedulerConfig, ServerConfig
from reactantserver.transport import guest
from reactantserver.worker import WorkerAddress, serve


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_config(
    repo: Path,
    *,
    include: tuple[str, ...] = (),
    cache_dir: Path | str = "",
    scheduler: SchedulerConfig | None = None,
    metrics: bool = True,
    mode: str = "static",
    **endpoints: object,
) -> ServerConfig:
    return ServerConfig(
        model_dirs=(str(repo),),
        models_include=include,
        cache_dir=str(cache_dir),
        model_control_mode=mode,  # type: ignore[arg-type]
        scheduler=scheduler or SchedulerConfig(),
        endpoints=attrs.evolve(
            EndpointsConfig(port=0, metrics_port=free_port() if metrics else 0), **endpoints
        ),
    )


@contextmanager
def running_worker(
    config: ServerConfig, *, ready_timeout: float = 120.0, energy_reader: Any = None
) -> Iterator[WorkerAddress]:
    started: dict[str, object] = {}
    ready = threading.Event()
    failed: list[BaseException] = []

    async def main() -> None:
        stop = trio.Event()
        started["stop"] = stop
        started["token"] = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            started["address"] = await nursery.start(
                lambda task_status: serve(
                    config, stop=stop, task_status=task_status, energy_reader=energy_reader
                )
            )
            ready.set()

    def run() -> None:
        try:
            guest.run(main)  # exactly as ``reactantserver serve`` runs the worker
        except BaseException as exc:  # reported to the test below
            failed.append(exc)
            ready.set()

    thread = threading.Thread(target=run, name="worker", daemon=True)
    thread.start()
    ready.wait(ready_timeout)
    if failed:
        raise failed[0]
    address = started["address"]
    assert isinstance(address, WorkerAddress)
    try:
        wait_ready(address, ready_timeout)
        yield address
    finally:
        token = started["token"]
        stop = started["stop"]
        assert isinstance(stop, trio.Event)
        trio.from_thread.run_sync(stop.set, trio_token=token)  # type: ignore[arg-type]
        thread.join(60)
        assert not thread.is_alive(), "worker did not stop within 60 s"
        if failed:
            raise failed[0]


def wait_ready(address: WorkerAddress, timeout: float) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{address.grpc_port}")
    try:
        wait_until(client.is_server_ready, timeout, "the worker ready")
    finally:
        client.close()
