"""The admin HTTP server, over a real socket on loopback (on autojump_clock where a test
lets the server catch up: the clock moves only once every task waits)."""

from __future__ import annotations

import socket
import struct
from functools import partial

import trio
import trio.testing
from prometheus_client import CollectorRegistry, Counter

from reactantserver.admin import AdminApp, serve_admin


async def _get(port: int, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        out = bytearray()
        while chunk := await stream.receive_some(65536):
            out += chunk
    return bytes(out)


async def test_endpoints_over_loopback() -> None:
    registry = CollectorRegistry()
    Counter("demo_requests", "a demo counter", registry=registry).inc(3)
    state = {"ready": False}
    app = AdminApp(registry, lambda: (state["ready"], "model 'mlp' is compiling"))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(partial(serve_admin, app, "127.0.0.1", 0))
        health = await _get(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert health.startswith(b"HTTP/1.1 200 OK") and health.endswith(b"ok\n")

        notready = await _get(port, b"GET /readyz HTTP/1.1\r\n\r\n")
        assert notready.startswith(b"HTTP/1.1 503")
        assert notready.endswith(b"not ready: model 'mlp' is compiling\n")
        state["ready"] = True
        assert (await _get(port, b"GET /readyz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 200")

        metrics = await _get(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert b"demo_requests_total 3.0" in metrics
        assert b"Content-Type: text/plain; version=" in metrics

        assert (await _get(port, b"GET /nope HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404")
        assert (await _get(port, b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405")
        assert (await _get(port, b"garbage\r\n\r\n")).startswith(b"HTTP/1.1 400")
        head = await _get(port, b"HEAD /healthz HTTP/1.1\r\n\r\n")
        assert head.endswith(b"\r\n\r\n") and b"ok\n" not in head
        huge = await _get(port, b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 3000)
        assert huge.startswith(b"HTTP/1.1 431")
        nursery.cancel_scope.cancel()


async def test_idle_connections_cannot_keep_a_probe_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Issue 41: the admin port had no connection cap (3,000 idle connections held 3,000
    descriptors). Past ``max_connections`` a new connection closes the oldest one that has
    not sent its request; when every open one is being answered, the new one gets 503."""
    release = trio.Event()
    app = AdminApp(CollectorRegistry(), lambda: (True, ""), before_metrics=release.wait)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(partial(serve_admin, app, "127.0.0.1", 0, max_connections=3))
        idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(3)]
        await trio.sleep(0.1)
        health = await _get(port, b"GET /healthz HTTP/1.1\r\n\r\n")  # closes the oldest
        assert health.startswith(b"HTTP/1.1 200 OK")
        with trio.fail_after(5):
            assert await idle[0].receive_some(1) == b""
        async with trio.open_nursery() as scrapes:  # three scrapes: the other two go
            for _ in range(3):
                scrapes.start_soon(_get, port, b"GET /metrics HTTP/1.1\r\n\r\n")
                await trio.sleep(0.1)
            for stream in idle[1:]:
                with trio.fail_after(5):
                    assert await stream.receive_some(1) == b""
            busy = await _get(port, b"GET /healthz HTTP/1.1\r\n\r\n")  # all being answered
            assert busy.startswith(b"HTTP/1.1 503") and busy.endswith(b"retry\n")
            release.set()
        for stream in idle:
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_a_client_resetting_its_connection_ends_only_that_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A reset (RST) while the request head is read raised out of the handler and ended
    the admin server -- and the worker or gateway whose nursery it ran in."""
    app = AdminApp(CollectorRegistry(), lambda: (True, ""))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(partial(serve_admin, app, "127.0.0.1", 0))
        for partial_head in (b"GET /hea", b""):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.send(partial_head)
            await trio.sleep(0.05)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()  # RST
        await trio.sleep(0.1)
        health = await _get(port, b"GET /healthz HTTP/1.1\r\n\r\n")
        assert health.startswith(b"HTTP/1.1 200 OK")
        nursery.cancel_scope.cancel()
