"""The gRPC listener: grpclib hosted inside Trio, and the one asyncio <-> Trio bridge.

This is the only server module of reactantserver that imports asyncio, grpclib or
trio-asyncio (grpclib runs on asyncio only; the client runs its own asyncio loop). Everything it serves is Trio-native code in
:class:`reactantserver.service.Service`; this module moves bytes and calls.

Theory of operation
-------------------
:func:`serve_grpc` opens a trio-asyncio loop inside the current Trio run, binds the
listening socket itself (so it can report the bound port, also for port 0, through
``task_status.started(port)``), and starts a grpclib ``Server`` on it serving
``inference.GRPCInferenceService``, ``reactant_control.ControlService`` and server
reflection (``grpc.reflection.v1alpha`` and ``v1``, so ``grpcurl list``/``describe``
work without ``.proto`` files).

Every RPC goes through one helper, :meth:`_Bridge.unary`: receive the request (asyncio
side), build the :class:`~reactantserver.records.CallContext` (the grpc-timeout header
becomes an absolute ``trio.current_time()`` deadline) and one ``trio.CancelScope`` at
that deadline, and hop into Trio: the call runs as a Trio task in the bridge's own
nursery, under that scope, and any ``Exception`` becomes a status with
:func:`~reactantserver.status.to_status`; the task resolves an asyncio future
that the handler awaits, and back on the asyncio side a status becomes
``GRPCError(status, message)``. trio-asyncio hosts both sides in one thread, so the hop
is a task spawn and a future (about half the CPU of ``trio_asyncio.trio_as_aio``, which
wraps every call in a handle, a second cancel scope and a queue round trip). Nothing
is shielded or swallowed: when a client cancels or disconnects, grpclib cancels the
handler task, which cancels the call's scope, so the scheduler withdraws the request.
The handler table is built from the generated service bases' own
``__mapping__`` (paths, cardinalities, message types) and the explicit RPC -> method
tables below; a generated RPC without a method is an error at startup, not at call time.

Messages: ModelInfer requests and responses go through the hand-written codec of
:mod:`reactantserver.protocol.codec` (the hot path: raw tensors stay slices of the
received buffer, the response is written with one join); every other message is a
betterproto message serialized by grpclib's protobuf codec. A ModelInfer request that
is not valid protobuf is refused with INVALID_ARGUMENT saying where it breaks.

Writes: each connection's transport is wrapped so that everything grpclib writes during
one pass of the event loop (the headers, message and trailers of every call answered
by one batch, window updates) leaves in one ``send``; grpclib alone makes three sends
per unary response. Each send releases the GIL, and while the device thread holds it
the event loop waits: fewer sends, fewer stalls. Peers may send DATA frames of up to
:data:`MAX_FRAME_SIZE` (HTTP/2's default is 16 KiB), so a large tensor arrives in a
few frames instead of thousands, each of which costs h2 Python work.

Limits: HTTP/2 connection and stream flow-control windows are raised well above
grpclib's 4 MiB defaults so large tensors stream without stalls; messages larger than
``endpoints.max_message_bytes`` are refused with RESOURCE_EXHAUSTED in both directions
(grpclib itself has no size limit, so the codec enforces it; the bytes of an oversized
request have been received by then -- the HTTP/2 windows bound only how fast).

Shutdown: cancelling :func:`serve_grpc` stops at once (in-flight calls are cancelled).
Setting the ``stop`` event stops gracefully: new calls are refused with UNAVAILABLE,
calls in flight get up to ``grace_seconds`` to finish, then the listener and the
connections are closed and the function returns.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import weakref
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

import attrs
import grpclib.server
import trio
import trio_asyncio
from grpclib import GRPCError
from grpclib.config import Configuration
from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.protocol import H2Protocol
from h2.settings import SettingCodes

from reactantserver.config.schema import EndpointsConfig
from reactantserver.errors import DeadlineExceeded, InvalidArgument
from reactantserver.protocol import inference, reactant_control
from reactantserver.protocol.codec import decode_infer_request, encode_infer_response
from reactantserver.protocol.grpc.reflection import v1 as reflection_v1
from reactantserver.protocol.grpc.reflection import v1alpha as reflection_v1alpha
from reactantserver.protocol.reflection import ReflectionAnswerer
from reactantserver.records import CallContext, InferResponse
from reactantserver.service import Service
from reactantserver.status import StatusCode, WireStatus, to_status

log = logging.getLogger(__name__)

#: RPC name -> ``Service`` method, for ``inference.GRPCInferenceService``.
INFERENCE_RPCS: Mapping[str, str] = {
    "ServerLive": "server_live",
    "ServerReady": "server_ready",
    "ModelReady": "model_ready",
    "ServerMetadata": "server_metadata",
    "ModelMetadata": "model_metadata",
    "ModelInfer": "model_infer",
    "ModelStreamInfer": "model_stream_infer",
    "ModelConfig": "model_config",
    "ModelStatistics": "model_statistics",
    "RepositoryIndex": "repository_index",
    "RepositoryModelLoad": "repository_model_load",
    "RepositoryModelUnload": "repository_model_unload",
    "SystemSharedMemoryStatus": "system_shared_memory_status",
    "SystemSharedMemoryRegister": "system_shared_memory_register",
    "SystemSharedMemoryUnregister": "system_shared_memory_unregister",
    "CudaSharedMemoryStatus": "cuda_shared_memory_status",
    "CudaSharedMemoryRegister": "cuda_shared_memory_register",
    "CudaSharedMemoryUnregister": "cuda_shared_memory_unregister",
    "TraceSetting": "trace_setting",
    "LogSettings": "log_settings",
    "IsSameIPCNamespace": "is_same_ipc_namespace",
}
#: RPC name -> ``Service`` method, for ``reactant_control.ControlService``.
CONTROL_RPCS: Mapping[str, str] = {
    "ModelControlStatus": "model_control_status",
    "SetModelResidency": "set_model_residency",
    "SetModelPolicy": "set_model_policy",
    "CompactMemory": "compact_memory",
}
#: Fully qualified names of the services served (and listed by reflection).
SERVICES: tuple[str, ...] = (
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
    "inference.GRPCInferenceService",
    "reactant_control.ControlService",
)

#: Inbound HTTP/2 flow-control windows (grpclib's default is 4 MiB for both). A stream
#: window this size lets a 16 MiB tensor arrive without waiting for window updates.
CONNECTION_WINDOW = 64 * 1024 * 1024
STREAM_WINDOW = 16 * 1024 * 1024
#: Largest DATA frame peers may send us (HTTP/2 allows up to 16 MiB - 1).
MAX_FRAME_SIZE = 1024 * 1024
#: Buffered writes at least this large are sent at once instead of at the end of the pass.
FLUSH_BYTES = 256 * 1024
#: How long closing the listener and its connections may take after draining.
CLOSE_TIMEOUT = 5.0
#: After GOAWAY, how long connections stay open so the frames (and late refusals) arrive.
GOAWAY_LINGER = 0.25

_Method = Callable[[Any, CallContext], Awaitable[Any]]


class _SizeLimitedCodec(ProtoCodec):
    """grpclib's protobuf codec (betterproto messages implement its interface), with
    ``endpoints.max_message_bytes`` enforced on every message in and out, and the lean
    codec for ModelInfer's two messages."""

    def __init__(self, limit: int) -> None:
        self._limit = limit

    def encode(self, message: Any, message_type: Any) -> bytes:
        if isinstance(message, InferResponse):
            data = encode_infer_response(message)
        else:
            data = super().encode(message, message_type)
        if len(data) > self._limit:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"response message of {len(data)} bytes exceeds the limit of {self._limit} "
                "bytes (endpoints.max_message_bytes); use shared memory for outputs this large",
            )
        return data

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self._limit:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"request message of {len(data)} bytes exceeds the limit of {self._limit} "
                "bytes (endpoints.max_message_bytes); use shared memory for inputs this large",
            )
        if message_type is inference.ModelInferRequest:
            try:
                return decode_infer_request(data)
            except InvalidArgument as exc:
                status = to_status(exc, rpc="ModelInfer")
                raise GRPCError(Status(status.code.value), status.message) from None
        return super().decode(data, message_type)


class _CorkedTransport:
    """The parts of an asyncio transport grpclib uses, with writes gathered per loop pass.

    ``write`` appends to a list and, the first time in a pass, schedules ``flush`` with
    ``call_soon``: everything written by the callbacks already queued goes out in one
    ``send``. Past :data:`FLUSH_BYTES` the buffer is sent at once, so big messages are
    not held (nor copied into one huge join).
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._size = 0
        self._scheduled = False

    def write(self, data: bytes) -> None:
        if not data:
            return
        self._pending.append(data)
        self._size += len(data)
        if self._size >= FLUSH_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False  # a flush still scheduled after an early one is a no-op
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        self._size = 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def discard(self) -> None:
        self._pending.clear()
        self._size = 0

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self.flush()  # e.g. a GOAWAY written just before closing
        self._transport.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


class _TunedProtocol(asyncio.Protocol):
    """grpclib's ``H2Protocol`` over a :class:`_CorkedTransport`, with large frames allowed."""

    def __init__(self, inner: H2Protocol) -> None:
        self.inner = inner
        self._cork: _CorkedTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._cork = _CorkedTransport(transport, asyncio.get_running_loop())
        self.inner.connection_made(self._cork)  # type: ignore[arg-type]
        # Sent after grpclib's own SETTINGS. h2 would start accepting the larger frames
        # only when it reads the peer's acknowledgement, and applies that to the next
        # read: an ACK and a large frame arriving in one read would then fail as a
        # protocol error. Accepting them from now on is safe, since the peer sends none
        # before it has seen these settings.
        h2_conn = self.inner.connection._connection
        h2_conn.update_settings({SettingCodes.MAX_FRAME_SIZE: MAX_FRAME_SIZE})
        h2_conn.max_inbound_frame_size = MAX_FRAME_SIZE
        self.inner.connection.flush()

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._cork is not None:
            self._cork.discard()
        self.inner.connection_lost(exc)


class _Server(grpclib.server.Server):
    """grpclib's ``Server``, remembering its connections so that shutdown closes them.

    grpclib 0.4's ``close()`` closes the listener and cancels running calls but leaves
    client connections open (asyncio's ``Server.close_clients`` arrived in Python 3.13),
    so a stopped worker -- or a test suite starting many servers -- would leak their
    sockets. Overriding the protocol factory is the one place grpclib lets us see them;
    it is a private method, which is one reason pyproject.toml keeps grpclib below 0.5.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()

    def _protocol_factory(self) -> _TunedProtocol:  # type: ignore[override]
        protocol = super()._protocol_factory()
        self._protocols.add(protocol)
        return _TunedProtocol(protocol)

    def goaway(self) -> None:
        """Send HTTP/2 GOAWAY on every connection: "open no new streams here".

        A client then sends no further calls on the connection; calls it had already
        sent past the announced last stream are known to it as unprocessed, which gRPC
        clients retry on a new connection (where a draining server refuses them). Closing
        without GOAWAY instead cuts such calls off with "Socket closed", and the client
        cannot tell whether they ran.
        """
        for protocol in list(self._protocols):
            connection = getattr(protocol, "connection", None)
            if connection is None or connection.is_closing():
                continue
            try:
                connection._connection.close_connection()
                connection.flush()
            except Exception:  # the peer already closed it, or h2 is in a closed state
                log.debug("GOAWAY not sent on a closing connection", exc_info=True)

    def close_connections(self) -> None:
        for protocol in list(self._protocols):
            # ``connection`` exists once the transport is up (``connection_made``).
            connection = getattr(protocol, "connection", None)
            if connection is not None:
                connection.close()


@attrs.define
class _Servable:
    """What grpclib's ``Server`` takes: anything with ``__mapping__``."""

    mapping: dict[str, Handler]

    def __mapping__(self) -> dict[str, Handler]:
        return self.mapping


def _peer(stream: grpclib.server.Stream[Any, Any]) -> str:
    addr = stream.peer.addr() if stream.peer is not None else None
    if not addr:
        return ""
    return f"{addr[0]}:{addr[1]}"


class _Bridge:
    """The handler table, the one call helper, and the in-flight count for draining.

    ``calls`` is the Trio nursery the calls run in; :func:`serve_grpc` opens it inside
    the trio-asyncio loop, so it outlives every handler.
    """

    def __init__(self, service: Service, answerer: ReflectionAnswerer, calls: trio.Nursery) -> None:
        self._service = service
        self._answerer = answerer
        self._calls = calls
        self._in_flight = 0
        self._draining = False
        self._idle = trio.Event()

    def mapping(self) -> dict[str, Handler]:
        table: dict[str, Handler] = {}
        for base, rpcs in (
            (inference.GrpcInferenceServiceBase(), INFERENCE_RPCS),
            (reactant_control.ControlServiceBase(), CONTROL_RPCS),
        ):
            for path, generated in base.__mapping__().items():
                rpc = path.rsplit("/", 1)[1]
                if rpc not in rpcs:
                    raise RuntimeError(f"no Service method is routed for the RPC {path}")
                method: _Method = getattr(self._service, rpcs[rpc])
                # Only ModelStreamInfer streams, and it is refused without reading.
                unary = generated.cardinality is Cardinality.UNARY_UNARY
                table[path] = Handler(
                    partial(self.unary, rpc, method, receive=unary),
                    generated.cardinality,
                    generated.request_type,
                    generated.reply_type,
                )
        for module in (reflection_v1alpha, reflection_v1):
            for path, generated in module.ServerReflectionBase().__mapping__().items():
                table[path] = Handler(
                    partial(self.reflect, generated.reply_type),
                    generated.cardinality,
                    generated.request_type,
                    generated.reply_type,
                )
        return table

    # ---------------------------------------------------------------- asyncio side

    async def unary(
        self,
        rpc: str,
        method: _Method,
        stream: grpclib.server.Stream[Any, Any],
        *,
        receive: bool = True,
    ) -> None:
        """Serve one call: receive, run ``method`` in Trio, send or raise its status."""
        if self._draining:
            self._service.record_rpc(rpc, StatusCode.UNAVAILABLE)
            raise GRPCError(Status.UNAVAILABLE, "server is shutting down")
        code = StatusCode.OK
        self._in_flight += 1
        try:
            request = await stream.recv_message() if receive else None
            outcome = await self._hop(rpc, method, request, stream)
            if isinstance(outcome, WireStatus):
                raise GRPCError(Status(outcome.code.value), outcome.message)
            await stream.send_message(outcome)
        except GRPCError as exc:
            code = StatusCode(exc.status.value)
            raise
        except asyncio.CancelledError:
            code = StatusCode.CANCELLED
            raise
        except Exception:
            # Transport trouble after the call (the client went away mid-send): grpclib
            # logs it and answers UNKNOWN if it still can.
            code = StatusCode.UNKNOWN
            raise
        finally:
            self._service.record_rpc(rpc, code)
            self._leave()

    async def reflect(self, reply_type: type[Any], stream: grpclib.server.Stream[Any, Any]) -> None:
        """One reflection stream; the answerer is sans-IO and fast, so no Trio hop."""
        if self._draining:
            raise GRPCError(Status.UNAVAILABLE, "server is shutting down")
        self._in_flight += 1
        try:
            async for request in stream:
                answer = self._answerer.answer_bytes(bytes(request))
                await stream.send_message(reply_type().parse(answer))
        finally:
            self._leave()

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._draining and self._in_flight == 0:
            self._idle.set()

    async def _hop(
        self,
        rpc: str,
        method: _Method,
        request: Any,
        stream: grpclib.server.Stream[Any, Any],
    ) -> Any:
        """Run ``method`` as a Trio task and wait here (asyncio) for its outcome.

        Both sides run in the Trio thread (trio-asyncio), so the Trio task may resolve
        the asyncio future directly. The scope is created here so that cancelling this
        handler (client gone, server closing) can cancel the call even before it starts.
        """
        now = trio.current_time()
        remaining = stream.deadline.time_remaining() if stream.deadline is not None else math.inf
        ctx = CallContext(deadline=now + remaining, peer=_peer(stream))
        scope = trio.CancelScope(deadline=ctx.deadline)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls.start_soon(self._call, rpc, method, request, ctx, scope, future)
        try:
            return await future
        except asyncio.CancelledError:
            scope.cancel()
            raise

    # ---------------------------------------------------------------- Trio side

    async def _call(
        self,
        rpc: str,
        method: _Method,
        request: Any,
        ctx: CallContext,
        scope: trio.CancelScope,
        future: asyncio.Future[Any],
    ) -> None:
        """Run ``method`` under ``scope``; its answer, or error as a ``WireStatus``,
        resolves ``future`` (unless the handler is gone)."""
        started = trio.current_time()
        try:
            with scope:
                outcome = await method(request, ctx)
            if scope.cancelled_caught:
                raise DeadlineExceeded(
                    f"{rpc}: the gRPC deadline passed after {trio.current_time() - started:.3f} s"
                )
        except Exception as exc:
            outcome = to_status(exc, rpc=rpc)
        except BaseException:
            # Cancelled from outside (the server stopping abruptly): end the handler as
            # cancelled too, rather than leave it waiting for an outcome.
            future.cancel()
            raise
        if not future.done():  # done = cancelled: the handler is gone
            future.set_result(outcome)

    # ---------------------------------------------------------------- draining

    def drain(self) -> None:
        """Refuse new calls from now on."""
        self._draining = True
        if self._in_flight == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()


def listen_tcp(host: str, port: int, backlog: int = 128) -> socket.socket:
    """A listening TCP socket on host:port (port 0 picks a free port).

    The socket is created with ``proto=IPPROTO_TCP`` on purpose: grpclib sets
    ``TCP_NODELAY`` on accepted connections only when their ``proto`` says TCP, and
    accepted sockets inherit it from the listener. With ``proto=0`` (what
    ``socket.create_server`` uses) Nagle's algorithm stays on and every small unary
    call waits ~40 ms for the peer's delayed ACK.
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve_grpc(
    service: Service,
    endpoints: EndpointsConfig,
    *,
    stop: trio.Event | None = None,
    grace_seconds: float = 30.0,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``service`` on ``endpoints.host:endpoints.port`` until cancelled or ``stop``.

    Start it with ``port = await nursery.start(serve_grpc, service, endpoints)``: the
    bound port is reported once the server accepts connections. See the module
    docstring for shutdown.
    """
    answerer = ReflectionAnswerer.from_package(services=SERVICES)
    listener = listen_tcp(endpoints.host, endpoints.port)
    port: int = listener.getsockname()[1]
    sock: socket.socket | None = listener
    try:
        # The calls' nursery closes after the server (the finally below), so no call
        # outlives its handler; both live inside the trio-asyncio loop.
        async with trio_asyncio.open_loop(), trio.open_nursery() as calls:
            bridge = _Bridge(service, answerer, calls)
            server = _Server(
                [_Servable(bridge.mapping())],
                codec=_SizeLimitedCodec(endpoints.max_message_bytes),
                config=Configuration(
                    http2_connection_window_size=CONNECTION_WINDOW,
                    http2_stream_window_size=STREAM_WINDOW,
                ),
            )
            await trio_asyncio.aio_as_trio(server.start)(sock=sock)
            sock = None  # the server owns it now
            log.info("gRPC listening on %s:%d", endpoints.host, port)
            try:
                task_status.started(port)
                if stop is None:
                    await trio.sleep_forever()
                else:
                    await stop.wait()
                log.info("gRPC draining: refusing new calls, waiting up to %.1f s", grace_seconds)
                bridge.drain()
                with trio.move_on_after(grace_seconds):
                    await bridge.wait_idle()
                server.goaway()
                # Let the GOAWAY frames and any last refusals reach the clients.
                await trio.sleep(GOAWAY_LINGER)
            finally:
                # Also on cancellation: close the listener and the connections (cancelling
                # what still runs), so the loop exits without stray transports.
                with trio.move_on_after(CLOSE_TIMEOUT, shield=True):
                    server.close()
                    server.close_connections()
                    await trio_asyncio.aio_as_trio(server.wait_closed)()
                    # Let the transports run their connection_lost callbacks.
                    await trio_asyncio.aio_as_trio(asyncio.sleep)(0)
    finally:
        if sock is not None:
            sock.close()
