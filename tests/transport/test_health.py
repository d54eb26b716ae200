"""``grpc.health.v1.Health`` on a worker (``transport.health`` over ``Service.health``).

A real ``serve_grpc`` over the fake host of ``tests/fake_host.py``; the clients are grpclib's
generated stub and grpcio's own health stub (``grpc_health_probe`` and Kubernetes speak the
same protocol), run in a thread, and ``grpcurl`` once. The gateway's answers are checked in
``test_gateway_proxy.py``.

Invariants: ``Check`` answers SERVING for the ready server and ready models, NOT_SERVING
for a known model that is not ready, and the status NOT_FOUND for an unknown name;
``Watch`` sends the status at once, again when it changes, SERVICE_UNKNOWN for an unknown
name, and NOT_SERVING once the server drains.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import trio
from fake_host import FakeHost
from grpclib.client import Channel
from test_grpcurl import GRPCURL

from reactantserver.config.schema import EndpointsConfig
from reactantserver.protocol.grpc.health import v1 as health
from reactantserver.service import Service
from reactantserver.worker.grpc import serve_grpc

pytestmark = pytest.mark.guest  # serve_grpc runs with Trio as asyncio's guest

S = health.HealthCheckResponseServingStatus
T = TypeVar("T")


def _client(port: int, calls: Callable[[health.HealthStub], Awaitable[T]]) -> T:
    async def main() -> T:
        channel = Channel("127.0.0.1", port)
        try:
            return await calls(health.HealthStub(channel))
        finally:
            channel.close()

    # Its own loop on a worker thread: the test's loop is the server's.
    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        return runner.run(main())


async def _check(stub: health.HealthStub, service: str) -> Any:
    try:
        return (await stub.check(health.HealthCheckRequest(service=service))).status
    except Exception as exc:
        return exc.status.name  # type: ignore[attr-defined]


async def test_check_answers_for_the_server_and_each_model(nursery: trio.Nursery) -> None:
    port = await nursery.start(serve_grpc, Service(FakeHost()), EndpointsConfig(port=0))

    async def calls(stub: health.HealthStub) -> list[Any]:
        return [await _check(stub, s) for s in ("", "double", "cold", "nope")]

    answers = await trio.to_thread.run_sync(_client, port, calls)
    assert answers == [S.SERVING, S.SERVING, S.NOT_SERVING, "NOT_FOUND"]
    proc = await trio.run_process(
        [GRPCURL, "-plaintext", "-d", '{"service": "double"}', f"127.0.0.1:{port}",
         "grpc.health.v1.Health/Check"],
        capture_stdout=True,
    )  # fmt: skip
    assert json.loads(proc.stdout) == {"status": "SERVING"}


async def test_watch_follows_changes_and_the_drain(nursery: trio.Nursery) -> None:
    """Watched with grpcio's own health stub (the C core, as Envoy-like clients are): it
    reads an answer sent just before the server's GOAWAY, which grpclib's client drops."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    host = FakeHost()
    stop = trio.Event()
    port = await nursery.start(
        lambda task_status: serve_grpc(
            Service(host), EndpointsConfig(port=0), stop=stop, grace_seconds=1.0,
            task_status=task_status,
        )
    )  # fmt: skip
    token = trio.lowlevel.current_trio_token()
    names = health_pb2.HealthCheckResponse.ServingStatus.Name

    def watch() -> list[str]:
        seen: list[str] = []
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for answer in stub.Watch(health_pb2.HealthCheckRequest(service="nope"), timeout=30):
                seen.append(names(answer.status))
                break
            for answer in stub.Watch(health_pb2.HealthCheckRequest(service="cold"), timeout=30):
                seen.append(names(answer.status))
                if len(seen) == 2:  # the model finishes loading
                    trio.from_thread.run_sync(setattr, host.models["cold"], "not_ready", "",
                                              trio_token=token)  # fmt: skip
                elif len(seen) == 3:  # the server starts to drain
                    trio.from_thread.run_sync(stop.set, trio_token=token)
        return seen

    seen = await trio.to_thread.run_sync(watch)
    # The cold watch ends (status OK) after NOT_SERVING: the iteration stops by itself.
    assert seen == ["SERVICE_UNKNOWN", "NOT_SERVING", "SERVING", "NOT_SERVING"]
