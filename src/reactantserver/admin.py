"""The admin HTTP port: ``/healthz``, ``/readyz`` and Prometheus ``/metrics``.

A deliberately small HTTP/1.1 server on Trio streams. It answers one GET per
connection and closes it, which is all Prometheus scrapers and orchestrator probes
need, and it bounds everything a peer controls: the request head is at most 8 KiB, a
connection gets ``CONNECTION_TIMEOUT`` seconds to send it, and at most
``max_connections`` are open at once (``endpoints.max_admin_connections``, a gateway's
``grpc.max_admin_connections``; issue 41 held 3,000 idle ones, 3,000 descriptors). A
connection past the cap closes the oldest one that has not sent its request yet (so idle
connections cannot keep a liveness probe out), or, when every open one is being
answered, is answered 503 and closed (:class:`_Gate`).

- ``/healthz``: 200 ``ok`` while the process is alive and its event loop answers.
- ``/readyz``: 200 ``ready`` only when the readiness callback says so; otherwise 503
  with the reason as the body (for example which model is still compiling).
- ``/metrics``: the text exposition of the registry given at construction (never the
  process-global default registry). An optional ``before_metrics`` coroutine runs first
  (the gateway fetches its workers' expositions there).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger(__name__)

MAX_HEAD = 8192
CONNECTION_TIMEOUT = 10.0
#: Open admin connections at most, by default.
MAX_CONNECTIONS = 64

#: Returns (ready, reason); the reason is shown when not ready.
ReadinessCheck = Callable[[], tuple[bool, str]]


def _response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class AdminApp:
    """Maps a request line to a response; no I/O, so it is tested directly."""

    def __init__(
        self,
        registry: CollectorRegistry,
        readiness: ReadinessCheck,
        *,
        before_metrics: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._registry = registry
        self._readiness = readiness
        #: Awaited by the server before it answers /metrics (not by ``respond``).
        self.before_metrics = before_metrics

    def respond(self, method: str, target: str) -> bytes:
        path = target.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return _response("405 Method Not Allowed", b"only GET is served here\n")
        if path == "/healthz":
            resp = _response("200 OK", b"ok\n")
        elif path == "/readyz":
            ready, reason = self._readiness()
            if ready:
                resp = _response("200 OK", b"ready\n")
            else:
                resp = _response("503 Service Unavailable", f"not ready: {reason}\n".encode())
        elif path == "/metrics":
            resp = _response("200 OK", generate_latest(self._registry), CONTENT_TYPE_LATEST)
        else:
            resp = _response("404 Not Found", b"try /healthz, /readyz or /metrics\n")
        if method == "HEAD":
            resp = resp.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"
        return resp


async def _refuse_oversize(stream: trio.SocketStream) -> None:
    # Answer, then drain a bounded amount of what the peer is still sending: closing a
    # socket with unread data resets the connection and the peer may lose our answer.
    await stream.send_all(_response("431 Request Header Fields Too Large", b""))
    await stream.send_eof()
    with trio.move_on_after(1.0):
        drained = 0
        while drained < 1 << 20 and (chunk := await stream.receive_some(65536)):
            drained += len(chunk)


class _Gate:
    """The open admin connections, oldest first, and the cap on them.

    Each connection is a cancel scope and whether its request head has arrived. A new
    connection past the cap cancels the oldest one still waiting for its head (evicted);
    with none such, the new one is refused.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[trio.CancelScope, bool] = {}
        self.evicted = 0
        self.refused = 0
        #: Refused connections reading their request before the 503 (at most ``limit``).
        self.refusing = 0

    def enter(self, scope: trio.CancelScope) -> bool:
        if len(self._open) >= self.limit:
            waiting = next((s for s, has_head in self._open.items() if not has_head), None)
            if waiting is None:
                self.refused += 1
                return False
            self.evicted += 1
            self.leave(waiting)
            waiting.cancel()
        self._open[scope] = False
        return True

    def headed(self, scope: trio.CancelScope) -> None:
        if scope in self._open:
            self._open[scope] = True

    def leave(self, scope: trio.CancelScope) -> None:
        self._open.pop(scope, None)


async def _gated(app: AdminApp, gate: _Gate, stream: trio.SocketStream) -> None:
    """One connection, within the gate; a peer that resets it mid-way ends it quietly (an
    exception out of a handler would end ``serve_listeners``: the admin port, and with it
    the worker or the gateway -- a reset during the request head did, before)."""
    try:
        await _gated_connection(app, gate, stream)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _gated_connection(app: AdminApp, gate: _Gate, stream: trio.SocketStream) -> None:
    with trio.CancelScope() as scope:
        if not gate.enter(scope):
            async with stream:
                if gate.refusing >= gate.limit:
                    return  # a flood of them: closed at once
                gate.refusing += 1
                try:
                    with trio.move_on_after(1.0):
                        # Read the request first (briefly): closing a socket with unread
                        # input resets it, and the peer may lose the answer.
                        with trio.move_on_after(0.1):
                            await stream.receive_some(MAX_HEAD)
                        busy = f"{gate.limit} admin connections are being answered; retry\n"
                        await stream.send_all(_response("503 Service Unavailable", busy.encode()))
                finally:
                    gate.refusing -= 1
            return
        try:
            await _handle(app, stream, lambda: gate.headed(scope))
        finally:
            gate.leave(scope)
    if scope.cancelled_caught:
        await trio.aclose_forcefully(stream)


async def _handle(
    app: AdminApp, stream: trio.SocketStream, headed: Callable[[], None] = lambda: None
) -> None:
    async with stream:
        with trio.move_on_after(CONNECTION_TIMEOUT):
            buf = bytearray()
            while b"\r\n\r\n" not in buf:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    return
                buf += chunk
                if len(buf) > MAX_HEAD:
                    await _refuse_oversize(stream)
                    return
            headed()
            line = bytes(buf).split(b"\r\n", 1)[0].decode("latin-1")
            parts = line.split(" ")
            if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                await stream.send_all(_response("400 Bad Request", b"malformed request line\n"))
                return
            if app.before_metrics is not None and parts[1].split("?", 1)[0] == "/metrics":
                await app.before_metrics()
            try:
                await stream.send_all(app.respond(parts[0], parts[1]))
            except trio.BrokenResourceError:
                pass


async def serve_admin(
    app: AdminApp,
    host: str,
    port: int,
    *,
    max_connections: int = MAX_CONNECTIONS,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``host:port`` until cancelled; reports the bound port when listening.
    At most ``max_connections`` connections are open at once (module docstring)."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    log.info("admin HTTP listening on %s:%d (/healthz /readyz /metrics)", host, bound)
    gate = _Gate(max_connections)
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(trio.serve_listeners, partial(_gated, app, gate), listeners))
        task_status.started(bound)
