"""The gRPC listener: our server on the host asyncio loop, and the one asyncio <-> Trio seam.

This is the worker's gRPC server (it runs on asyncio; the client runs its own asyncio
loop). Everything it serves is in
:class:`reactantserver.service.Service`; this module moves bytes and calls.

Theory of operation
-------------------
The worker runs Trio as the *guest* of a standard asyncio loop
(:mod:`~reactantserver.transport.guest`): both loops share the main thread, the server
runs natively on asyncio, and Trio owns the structure (nurseries, the dispatch loop,
signals). :func:`serve_grpc` is a Trio task: it binds the listening socket itself (so it
can report the bound port, also for port 0, through ``task_status.started(port)``) and
starts a :class:`~..transport.server.GuardedServer` on the host loop serving ``inference.GRPCInferenceService``,
``reactant_control.ControlService`` and server reflection (``grpc.reflection.v1alpha``
and ``v1``, so ``grpcurl list``/``describe`` work without ``.proto`` files). Called
outside a guest run it says so.

**ModelInfer** is served without a task (:mod:`..transport.unary`, a direct method): when its
message is complete the connection calls :meth:`_Bridge.infer`, which decodes it (the
lean codec) and calls ``Service.begin_infer`` -- synchronously validate, admit and queue
the request in the scheduler's table, with a wake-up callback -- and returns. The
dispatch loop settles the answers of a finished batch inside its Trio tick on the same
thread and calls their wake-ups; each runs ``Service.finish_infer``, encodes the response
into pieces and writes it in one pass, headers, message and trailers
(:meth:`..transport.unary.UnaryCall.answer`): one crossing per batch, no task, no future and no
stream object per request. A call with a deadline gets one timer: past it, the request is
withdrawn and answered DEADLINE_EXCEEDED at once (a result that comes later is dropped).
A client cancel or disconnect, or the server closing, withdraws the request synchronously
(``Service.abandon_infer``).

**ModelStreamInfer** is a stream of such requests (:mod:`..transport.streaming`, no task either):
each message begins as it completes and takes ModelInfer's steps (:class:`_StreamInfer`,
counted under ``ModelStreamInfer``), answered in the stream as a
``ModelStreamInferResponse`` (an error as its ``error_message``, the stream going on), in
request order; the stream's deadline is its one timer. Draining ends each open stream
UNAVAILABLE once what it owes is written; a request arriving meanwhile is refused in the
stream.

**Every other RPC** (metadata, control, repository, shared memory: none is hot) goes
through :meth:`_Bridge.unary`: the call runs as a Trio task in the bridge's own nursery
under one ``trio.CancelScope`` at the call's deadline, and resolves an asyncio future the
handler awaits; cancelling the handler cancels that scope. In both paths any
``Exception`` becomes a status with :func:`~reactantserver.status.to_status`, and on the
asyncio side a status becomes ``GRPCError(status, message)``.

The handler table is built from the generated service bases' own ``__mapping__``
(paths, cardinalities, message types) and the explicit RPC -> method tables below; a
generated RPC without a method is an error at startup, not at call time.

Messages: ModelInfer requests and responses go through the hand-written codec of
:mod:`reactantserver.protocol.codec` (the hot path: raw tensors stay slices of the
received buffer, the response is written with one join); every other message is a
betterproto message serialized by grpclib's protobuf codec. A ModelInfer request that
is not valid protobuf is refused with INVALID_ARGUMENT saying where it breaks.

The wire: the server is a :class:`~reactantserver.transport.server.GuardedServer` over
:mod:`~reactantserver.transport.h2guard` connections, built from the handler table below
and the limits of ``endpoints:`` (:class:`~reactantserver.transport.core.limits.WireLimits`):
connections, streams per connection, handshake and idle timeouts, and
``endpoints.max_message_bytes`` checked at each request's 5-byte length prefix (and again
by the codec, in both directions). Nothing in this module checks the wire itself, so a
change of the bridge cannot weaken it. The host loop gets an exception handler that
logs: a socket error on one connection must not end the server.

Shutdown: cancelling :func:`serve_grpc` stops at once (in-flight calls are cancelled).
Setting the ``stop`` event stops gracefully: new calls are refused with UNAVAILABLE,
calls in flight get up to ``grace_seconds`` to finish, then the listener and the
connections are closed and the function returns.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import resource
import socket
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

import trio
from grpclib import GRPCError
from grpclib.const import Cardinality, Handler
from grpclib.encoding.proto import ProtoCodec

from reactantserver.config.schema import EndpointsConfig
from reactantserver.errors import DeadlineExceeded, InvalidArgument
from reactantserver.grpcwire import StatusCode
from reactantserver.protocol import inference, reactant_control, screen
from reactantserver.protocol.codec import (
    decode_infer_request,
    encode_infer_response_sized,
    encode_stream_error,
    stream_response_head,
)
from reactantserver.protocol.grpc.reflection import v1 as reflection_v1
from reactantserver.protocol.grpc.reflection import v1alpha as reflection_v1alpha
from reactantserver.protocol.reflection import WORKER_SERVICES, ReflectionAnswerer
from reactantserver.protocol.screen import decode_message
from reactantserver.records import CallContext
from reactantserver.service import PendingInfer, Service
from reactantserver.status import WireStatus, to_status

from ..transport import guest
from ..transport.core.limits import Fault, WireCounters, WireLimits
from ..transport.grpcerror import error_code, grpc_error
from ..transport.h2guard import GuardedProtocol
from ..transport.health import HealthServicer
from ..transport.security import describe_security, listener_security, open_warning
from ..transport.server import GuardedServer, ServerStream, listen_tcp
from ..transport.streaming import RequestCall, StreamCall, StreamedRequest, StreamHandler
from ..transport.unary import DirectHandler, UnaryCall

log = logging.getLogger(__name__)

#: RPC name -> ``Service`` method, for ``inference.GRPCInferenceService``.
INFERENCE_RPCS: Mapping[str, str] = {
    "ServerLive": "server_live",
    "ServerReady": "server_ready",
    "ModelReady": "model_ready",
    "ServerMetadata": "server_metadata",
    "ModelMetadata": "model_metadata",
    "ModelInfer": "model_infer",
    # Each request of the stream takes ModelInfer's steps (begin_infer, finish_infer).
    "ModelStreamInfer": "begin_infer",
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
    "AdminEndpoint": "admin_endpoint",
}

#: How long closing the listener and its connections may take after draining.
CLOSE_TIMEOUT = 5.0
#: After GOAWAY, how long connections stay open so the frames (and late refusals) arrive.
GOAWAY_LINGER = 0.25

_Method = Callable[[Any, CallContext], Awaitable[Any]]


class _SizeLimitedCodec(ProtoCodec):
    """grpclib's protobuf codec (betterproto messages implement its interface), with
    ``endpoints.max_message_bytes`` enforced on every message in and out, the lean
    codec for ModelInfer's request (its response is framed by the bridge itself) and every
    other request screened before betterproto parses it (:mod:`~reactantserver.protocol.screen`:
    bounded work, unknown fields dropped)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit

    def encode(self, message: Any, message_type: Any) -> bytes:
        data: bytes = super().encode(message, message_type)
        self.check_response(len(data))
        return data

    def check_response(self, size: int) -> None:
        if size > self._limit:
            raise grpc_error(
                StatusCode.RESOURCE_EXHAUSTED,
                f"response message of {size} bytes exceeds the limit of {self._limit} "
                "bytes (endpoints.max_message_bytes); use shared memory for outputs this large",
            )

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self._limit:
            raise grpc_error(
                StatusCode.RESOURCE_EXHAUSTED,
                f"request message of {len(data)} bytes exceeds the limit of {self._limit} "
                "bytes (endpoints.max_message_bytes); use shared memory for inputs this large",
            )
        if message_type is inference.ModelInferRequest:
            try:
                return decode_infer_request(data)
            except InvalidArgument as exc:
                status = to_status(exc, rpc="ModelInfer")
                raise grpc_error(status.code, status.message) from None
        try:
            return decode_message(data, message_type)  # bounded work (protocol/screen.py)
        except InvalidArgument as exc:
            raise grpc_error(StatusCode.INVALID_ARGUMENT, str(exc)) from None


class _Bridge:
    """The handler table, the one call helper, and the in-flight count for draining.

    ``calls`` is the Trio nursery the non-ModelInfer calls run in; :func:`serve_grpc`
    closes it only after the server, so it outlives every handler.
    """

    def __init__(
        self,
        service: Service,
        answerer: ReflectionAnswerer,
        calls: trio.Nursery,
        codec: _SizeLimitedCodec,
    ) -> None:
        self._service = service
        self._codec = codec
        self._answerer = answerer
        self._calls = calls
        self._in_flight = 0
        self._draining = False
        #: The open ModelStreamInfer calls (to drain them).
        self._streams: set[StreamCall] = set()
        self._idle = trio.Event()
        #: The host loop, whose clock the wire's deadlines are in (looked up once: in
        #: Python 3.11 ``asyncio.get_running_loop`` makes a ``getpid`` system call).
        self._loop = asyncio.get_running_loop()

    def mapping(self) -> dict[str, Handler | DirectHandler | StreamHandler]:
        table: dict[str, Handler | DirectHandler | StreamHandler] = {}
        for base, rpcs in (
            (inference.GrpcInferenceServiceBase(), INFERENCE_RPCS),
            (reactant_control.ControlServiceBase(), CONTROL_RPCS),
        ):
            for path, generated in base.__mapping__().items():
                rpc = path.rsplit("/", 1)[1]
                if rpc not in rpcs:
                    raise RuntimeError(f"no Service method is routed for the RPC {path}")
                method: _Method = getattr(self._service, rpcs[rpc])
                unary = generated.cardinality is Cardinality.UNARY_UNARY
                if rpc == "ModelInfer":
                    table[path] = DirectHandler(self.infer)
                    continue
                if rpc == "ModelStreamInfer":
                    table[path] = StreamHandler(
                        self.stream_infer,
                        stream_response_head,
                        _stream_error,
                        opened=self._stream_opened,
                    )
                    continue
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

    def infer(self, call: UnaryCall, message: bytes | memoryview) -> None:
        """ModelInfer: begin -> wait -> finish without a task (module docstring)."""
        if self._draining:
            self._service.record_rpc("ModelInfer", StatusCode.UNAVAILABLE)
            call.fail(StatusCode.UNAVAILABLE, "server is shutting down")
            return
        self._in_flight += 1
        _Infer(self, call).begin(message)

    def stream_infer(self, request: StreamedRequest, message: bytes | memoryview) -> None:
        """One request on a ModelStreamInfer stream: ModelInfer's path, answered in the
        stream (:mod:`..transport.streaming`)."""
        if self._draining:
            self._service.record_rpc("ModelStreamInfer", StatusCode.UNAVAILABLE)
            request.fail(StatusCode.UNAVAILABLE, "server is shutting down")
            return
        self._in_flight += 1
        _StreamInfer(self, request).begin(message)

    def _stream_opened(self, stream: StreamCall) -> None:
        self._streams.add(stream)
        stream.on_close = partial(self._streams.discard, stream)
        if self._draining:
            stream.drain(StatusCode.UNAVAILABLE, "server is shutting down")

    async def unary(
        self,
        rpc: str,
        method: _Method,
        stream: ServerStream,
        *,
        receive: bool = True,
    ) -> None:
        """Serve one call: receive, run ``method`` in Trio, send or raise its status."""
        if self._draining:
            self._service.record_rpc(rpc, StatusCode.UNAVAILABLE)
            raise grpc_error(StatusCode.UNAVAILABLE, "server is shutting down")
        code = StatusCode.OK
        self._in_flight += 1
        try:
            request = await stream.recv_message() if receive else None
            if receive and request is None:  # the wire layer refuses this first
                raise grpc_error(StatusCode.INVALID_ARGUMENT, "the call carries no request message")
            outcome = await self._hop(rpc, method, request, stream)
            if isinstance(outcome, WireStatus):
                raise _grpc_error(outcome)
            await stream.send_message(outcome)
        except GRPCError as exc:
            code = error_code(exc)
            raise
        except asyncio.CancelledError:
            code = StatusCode.CANCELLED
            raise
        except Exception:
            # Transport trouble after the call (the client went away mid-send): the
            # server ends the call without a status (the stream is gone), or INTERNAL.
            code = StatusCode.UNKNOWN
            raise
        finally:
            self._service.record_rpc(rpc, code)
            self._leave()

    async def reflect(self, reply_type: type[Any], stream: ServerStream) -> None:
        """One reflection stream; the answerer is sans-IO and fast, so no Trio hop."""
        if self._draining:
            raise grpc_error(StatusCode.UNAVAILABLE, "server is shutting down")
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
        stream: ServerStream,
    ) -> Any:
        """Run ``method`` as a Trio task and wait here (asyncio) for its outcome.

        Both loops run on one thread (Trio is asyncio's guest), so the task is started
        from here directly and may resolve the asyncio future directly. The scope is
        created here so that cancelling this handler (client gone, server closing) can
        cancel the call even before it starts.
        """
        now = trio.current_time()
        remaining = stream.deadline.time_remaining() if stream.deadline is not None else math.inf
        ctx = CallContext(deadline=now + remaining, peer=stream.peer, owner=stream.owner)
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
        """Refuse new calls from now on; streams end once what they owe is answered."""
        self._draining = True
        for stream in list(self._streams):
            stream.drain(StatusCode.UNAVAILABLE, "server is shutting down")
        if self._in_flight == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()


class _Infer:
    """One ModelInfer: begun when its message is complete, answered when the dispatch
    loop settles it (module docstring). Ends exactly once: answered, failed, expired or
    cancelled, each recorded once and leaving the bridge's in-flight count once."""

    __slots__ = ("_bridge", "_call", "_ended", "_pending", "_timer")

    #: The RPC it is counted under.
    rpc = "ModelInfer"
    #: A timer at the call's deadline (a stream has one for all its requests).
    timed = True

    def __init__(self, bridge: _Bridge, call: RequestCall) -> None:
        self._bridge = bridge
        self._call = call
        self._pending: PendingInfer | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._ended = False

    def begin(self, message: bytes | memoryview) -> None:
        call = self._call
        service = self._bridge._service
        loop = self._bridge._loop
        try:
            request = decode_infer_request(message)
            # The wire's deadline (loop time) on Trio's clock; no clock is read without one.
            deadline = (
                math.inf
                if call.deadline is None
                else trio.current_time() + (call.deadline - loop.time())
            )
            ctx = CallContext(deadline=deadline, peer=call.peer, owner=call.owner)
            pending = service.begin_infer(request, ctx, self._woken)
        except Exception as exc:
            self._fail(to_status(exc, rpc=self.rpc))
            return
        self._pending = pending
        call.on_cancel = self._cancelled
        if pending.answer.settled:  # settled within begin (its wake-up found no pending)
            self._finish()
        elif self.timed and call.deadline is not None:
            self._timer = loop.call_at(call.deadline, self._expired)

    def _woken(self) -> None:
        """The dispatch loop settled the answer (inside its tick, on this thread)."""
        if self._pending is not None:
            self._finish()

    def _finish(self) -> None:
        pending, self._pending = self._pending, None
        assert pending is not None
        self._stop_timer()
        bridge = self._bridge
        try:
            parts, size = encode_infer_response_sized(bridge._service.finish_infer(pending))
            bridge._codec.check_response(size)
        except GRPCError as exc:
            self._fail(WireStatus(error_code(exc), exc.message or ""))
            return
        except Exception as exc:
            self._fail(to_status(exc, rpc=self.rpc))
            return
        self._end(StatusCode.OK)
        self._call.answer(parts, size)

    def _expired(self) -> None:
        """The deadline passed with the request still queued or executing: withdraw it
        (a result that comes later is dropped) and answer DEADLINE_EXCEEDED now."""
        self._timer = None
        pending, self._pending = self._pending, None
        if pending is None:
            return
        self._bridge._service.abandon_infer(pending, StatusCode.DEADLINE_EXCEEDED)
        self._fail(WireStatus(StatusCode.DEADLINE_EXCEEDED, "deadline exceeded"))

    def _cancelled(self) -> None:
        """The client reset the call or went away, or the server is closing."""
        self._stop_timer()
        pending, self._pending = self._pending, None
        call = self._call
        expired = call.deadline is not None and self._bridge._loop.time() >= call.deadline
        code = StatusCode.DEADLINE_EXCEEDED if expired else StatusCode.CANCELLED
        if pending is not None:
            self._bridge._service.abandon_infer(pending, code)
        self._end(code)

    def _fail(self, status: WireStatus) -> None:
        self._end(status.code)
        self._call.fail(status.code, status.message)

    def _end(self, code: StatusCode) -> None:
        if self._ended:
            return
        self._ended = True
        self._bridge._service.record_rpc(self.rpc, code)
        self._bridge._leave()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _StreamInfer(_Infer):
    """One request of a ModelStreamInfer stream: counted under that RPC; the stream's
    one timer keeps the call's deadline."""

    __slots__ = ()
    rpc = "ModelStreamInfer"
    timed = False


def _stream_error(request: bytes | memoryview, code: int, message: str) -> list[bytes | memoryview]:
    return encode_stream_error(request, message)


def _grpc_error(status: WireStatus) -> GRPCError:
    return grpc_error(status.code, status.message)


def _check_file_limit(endpoints: EndpointsConfig) -> None:
    """Warn when the process may run out of file descriptors before the limits bite.

    Every connection and every registered shared-memory region holds a descriptor; past
    ``ulimit -n`` the server cannot even accept a connection to refuse it.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = endpoints.max_connections + endpoints.max_shm_regions + 64
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "the open-file limit (ulimit -n) is %d, but endpoints.max_connections (%d) + "
            "endpoints.max_shm_regions (%d) need about %d descriptors; raise the limit or "
            "lower them",
            soft,
            endpoints.max_connections,
            endpoints.max_shm_regions,
            needed,
        )


def _loop_errors(server: GuardedServer) -> Callable[[Any, dict[str, Any]], None]:
    """An asyncio exception handler for the host loop.

    asyncio calls it for errors it has no caller to give to: a socket that failed under
    a transport (counted as a client's transport error, without a traceback), or an
    exception in a callback (our bug: logged with its traceback). Neither may end the
    server.
    """

    def handle(loop: Any, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        message = context.get("message", "asyncio error")
        protocol = context.get("protocol")
        if isinstance(exc, OSError) and isinstance(protocol, GuardedProtocol):
            server.table.fault(Fault.TRANSPORT_ERROR, protocol.peer, f"{message}: {exc}")
        else:
            log.error("asyncio: %s", message, exc_info=exc)

    return handle


async def serve_grpc(
    service: Service,
    endpoints: EndpointsConfig,
    *,
    stop: trio.Event | None = None,
    grace_seconds: float = 30.0,
    counters: WireCounters | None = None,
    env: Mapping[str, str] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``service`` on ``endpoints.host:endpoints.port`` until cancelled or ``stop``.

    Start it with ``port = await nursery.start(serve_grpc, service, endpoints)``: the
    bound port is reported once the server accepts connections. ``counters`` receives
    the wire's statistics (connections, refusals, client errors by kind) for the metrics
    endpoint. ``env`` (default ``os.environ``) holds the keys ``key_env`` names. See the
    module docstring for shutdown.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "serve_grpc needs Trio running as the guest of an asyncio loop: start the "
            "process with reactantserver.transport.guest.run(main)"
        ) from None
    answerer = ReflectionAnswerer.from_package(services=WORKER_SERVICES)
    screen.prepare()  # the small requests' schemas, before the first one arrives
    limits = WireLimits.from_endpoints(endpoints)
    _check_file_limit(endpoints)
    security = listener_security(
        endpoints.tls,
        endpoints.restricted,
        os.environ if env is None else env,
        gateway=endpoints.gateway,
        what="gRPC",
    )
    warning = open_warning(endpoints.host, security, "endpoints.restricted")
    if warning is not None:
        log.warning("%s", warning)
    listener = listen_tcp(endpoints.host, endpoints.port)
    port: int = listener.getsockname()[1]
    sock: socket.socket | None = listener
    previous_handler = loop.get_exception_handler()
    try:
        # The calls' nursery closes after the server (the finally below), so no call
        # outlives its handler.
        async with trio.open_nursery() as calls:
            codec = _SizeLimitedCodec(endpoints.max_message_bytes)
            bridge = _Bridge(service, answerer, calls, codec)
            health = HealthServicer(service.health)  # grpc.health.v1, answered on asyncio
            server = GuardedServer(
                {**bridge.mapping(), **health.mapping()},
                codec=codec,
                limits=limits,
                counters=counters,
                tls=security.tls,
                authorizer=security.authorizer,
                on_closed=service.registry.forget,
            )
            loop.set_exception_handler(_loop_errors(server))
            await guest.aio(server.start(listener))
            sock = None  # the server owns it now
            log.info(
                "gRPC listening on %s:%d (%s)",
                endpoints.host,
                port,
                describe_security(security),
            )
            try:
                task_status.started(port)
                if stop is None:
                    await trio.sleep_forever()
                else:
                    await stop.wait()
                log.info("gRPC draining: refusing new calls, waiting up to %.1f s", grace_seconds)
                bridge.drain()
                health.drain()
                with trio.move_on_after(grace_seconds):
                    await bridge.wait_idle()
                with trio.move_on_after(1.0):  # watchers hear NOT_SERVING before GOAWAY
                    await guest.aio(health.wait_told())
                server.goaway()
                # Let the GOAWAY frames and any last refusals reach the clients.
                await trio.sleep(GOAWAY_LINGER)
            finally:
                # Also on cancellation: close the listener and the connections (cancelling
                # what still runs), so the loop exits without stray transports.
                with trio.move_on_after(CLOSE_TIMEOUT, shield=True):
                    server.close()
                    await guest.aio(server.wait_closed())
                    # Let the transports run their connection_lost callbacks.
                    await guest.aio(asyncio.sleep(0))
    finally:
        loop.set_exception_handler(previous_handler)
        if sock is not None:
            sock.close()
