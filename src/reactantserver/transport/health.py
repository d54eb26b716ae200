"""``grpc.health.v1.Health``: the standard gRPC health check, on a worker and on a gateway.

Kubernetes' native gRPC probes (``grpc:`` in a probe), Envoy's gRPC health checks and
``grpc_health_probe`` ask ``Check`` (one answer) or ``Watch`` (an answer now and one per
change). The service name is ``""`` for the server as a whole, or a model name.

Theory of operation
-------------------
:class:`HealthServicer` is given one synchronous function, ``status_of(service)``, that
answers from state the server already keeps -- a worker's readiness and its models', a
gateway's route table -- and returns True (SERVING), False (NOT_SERVING), or None for a
name the server does not know. ``Check`` answers it (an unknown name is the gRPC status
NOT_FOUND, as the protocol asks); ``Watch`` sends it at once (``SERVICE_UNKNOWN`` for an
unknown name) and then again whenever it changes, re-reading it every ``poll_seconds``,
until the client hangs up or the server stops. :meth:`HealthServicer.drain` makes every
answer NOT_SERVING from then on and tells every watcher at once, so load balancers stop
sending before the server closes: each watch sends NOT_SERVING and ends (status OK), and the
server awaits :meth:`HealthServicer.wait_told` before its GOAWAY.

The handlers run on the asyncio loop (the server's call tasks) and take no request-path lock;
``status_of`` must not block. A watch costs one timer per ``poll_seconds``; polling rather
than notifying keeps the servers free of health hooks on every state change.

The health service itself is never refused while draining (a watcher must see
NOT_SERVING), and it does not count as a call in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpclib.const
from grpclib.const import Handler

from reactantserver.grpcwire import StatusCode
from reactantserver.protocol.grpc.health import v1 as health

from .grpcerror import grpc_error

if TYPE_CHECKING:
    from .server import ServerStream

_Status = health.HealthCheckResponseServingStatus
SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3  # the protocol's ServingStatus numbers
SERVICE = "grpc.health.v1.Health"

#: ``service`` name -> serving (True) or not (False), or None for a name not known here.
StatusOf = Callable[[str], "bool | None"]


class HealthServicer:
    """``Check`` and ``Watch`` over ``status_of`` (see the module docstring)."""

    def __init__(self, status_of: StatusOf, *, poll_seconds: float = 1.0) -> None:
        self._status_of = status_of
        self._poll = poll_seconds
        self._draining = False
        self._changed = asyncio.Event()
        #: Watch streams that have not sent NOT_SERVING since the drain began.
        self._untold = 0
        self._told = asyncio.Event()

    def status(self, service: str) -> int | None:
        """The ServingStatus number of ``service`` now; None for an unknown name."""
        if self._draining:
            return NOT_SERVING
        serving = self._status_of(service)
        if serving is None:
            return None
        return SERVING if serving else NOT_SERVING

    def drain(self) -> None:
        """Answer NOT_SERVING from now on; watchers are told at once."""
        self._draining = True
        self._changed.set()
        if self._untold == 0:
            self._told.set()

    async def wait_told(self) -> None:
        """Until every watch has sent NOT_SERVING and ended (call after :meth:`drain`,
        before the server's GOAWAY, after which a client reads nothing more)."""
        await self._told.wait()

    def mapping(self) -> dict[str, Handler]:
        """grpclib handlers, by path (betterproto messages through the server's codec)."""
        return {
            f"/{SERVICE}/Check": Handler(
                self.check,
                grpclib.const.Cardinality.UNARY_UNARY,
                health.HealthCheckRequest,
                health.HealthCheckResponse,
            ),
            f"/{SERVICE}/Watch": Handler(
                self.watch,
                grpclib.const.Cardinality.UNARY_STREAM,
                health.HealthCheckRequest,
                health.HealthCheckResponse,
            ),
        }

    async def check(self, stream: ServerStream) -> None:
        request = await stream.recv_message()
        assert request is not None  # a unary request always carries its message
        status = self.status(request.service)
        if status is None:
            raise grpc_error(
                StatusCode.NOT_FOUND,
                f"unknown service {request.service!r}: ask '' (the server) or a model name",
            )
        await stream.send_message(health.HealthCheckResponse(status=_Status(status)))

    async def watch(self, stream: ServerStream) -> None:
        request = await stream.recv_message()
        assert request is not None
        self._untold += 1
        try:
            await self._watch(stream, request.service)
        finally:
            self._untold -= 1
            if self._draining and self._untold == 0:
                self._told.set()

    async def _watch(self, stream: ServerStream, service: str) -> None:
        last = None
        while True:
            known = self.status(service)
            status = SERVICE_UNKNOWN if known is None else known
            if status != last:
                await stream.send_message(health.HealthCheckResponse(status=_Status(status)))
                last = status
            if self._draining:
                # Told NOT_SERVING: end the stream (status OK) now, so that its trailers
                # are written before the server's GOAWAY (wait_told waits for this).
                await stream.send_trailing_metadata()
                return
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait({changed}, timeout=self._poll)
            finally:
                changed.cancel()
