"""A hardened gRPC server built from a handler mapping and a limits record.

:class:`GuardedServer` is what both a worker and a gateway serve with: it takes grpclib
``Handler`` entries (``{"/pkg.Service/Method": Handler(func, cardinality, request_type,
reply_type)}``), a message codec and a :class:`~.limits.WireLimits`, and knows nothing of
``Service``, Trio or model inference. Connections are :class:`~.h2guard.GuardedProtocol`\\ s
(every check of the wire); this module runs the calls that pass them.

Theory of operation
-------------------
Per connection, a :class:`_Calls` object is the ``RequestSink`` of
:mod:`.h2guard`: ``admit`` judges a request's headers (:func:`.framing.request_head`,
then the path against the mapping, then its metadata) and computes its deadline *at
arrival*; ``accept`` runs the handler as an asyncio task whose done-callback releases the
stream -- a callback, because a task cancelled before it first runs never executes its
own ``finally`` (grpclib's ``request_handler`` leaks the stream then).

Each call ends with exactly one status, chosen here and nowhere else:

* the handler's ``GRPCError`` as raised (this is how every expected outcome arrives);
* DEADLINE_EXCEEDED when the deadline had passed before the handler could start, or
  passes while it runs -- never UNKNOWN, and never a traceback (a deadline is an
  outcome, not an error);
* nothing at all when the peer reset the stream or the connection went away;
* INTERNAL with the fixed message ``internal error`` for anything else, with the
  traceback in the log: that is our bug.

grpclib's own ``request_handler`` is not used: it answers UNKNOWN for a deadline that
passed on arrival or a malformed ``grpc-timeout``, logs a traceback per such request,
and leaks a stream cancelled before its task starts.

Housekeeping: every :data:`TICK` seconds the server sweeps its connections for
handshake and idle timeouts, flushes the rate-limited fault log and, once a hostile
burst is over, gives its memory back (:mod:`.reclaim`).

**Unary answers in one pass.** Handlers get a :class:`ServerStream`, grpclib's server
stream plus :meth:`ServerStream.send_unary_reply`: the initial headers (a constant list,
built once), the one message framed straight from its pieces (its 5-byte prefix, then
the pieces as they are: an encoder's ``memoryview``\\ s of result arrays are copied once,
into the DATA frames, instead of being joined, prefixed and re-read in chunks first)
and the OK trailers (constant too), written to h2 back to back and handed to the
transport once, as far as the peer's flow-control windows allow (beyond them it waits
for WINDOW_UPDATE, frame by frame). grpclib's own send path makes three passes
through its events and h2 and copies a large message three times.

A large answer leaves in DATA frames of at most :data:`SEND_CHUNK` (256 KiB) even when
the peer allows 16 MiB frames and windows (gRPC's C core does): the frame is copied on
its way to the socket (five or six times under h2, which this was measured with;
:mod:`.h2lean` joins a frame's header and payload once, then the transport), and a
256 KiB frame is copied while it sits in the CPU's cache, a 16 MiB one from main memory
into freshly mapped pages every time. Each frame is handed to the transport at once, and
the next waits while the transport's buffer is over its high-water mark. Measured on a 38 MB answer: server CPU per call
0.75-0.8x, median latency 0.85x (docs/benchmarks.md).

Shutdown helpers: :meth:`GuardedServer.goaway` (no new streams, on every connection),
:meth:`GuardedServer.close` (stop listening, close every connection, cancel every call)
and :meth:`GuardedServer.wait_closed`. Draining -- refusing new calls while old ones
finish -- is the caller's policy: a handler can simply answer UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import binascii
import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import grpclib.server
from grpclib import GRPCError
from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.base import CodecBase
from grpclib.events import _DispatchServerEvents
from grpclib.exceptions import ProtocolError as GrpclibProtocolError
from grpclib.exceptions import StreamTerminatedError
from grpclib.metadata import Deadline, decode_metadata
from grpclib.protocol import Stream
from grpclib.utils import Wrapper

from reactantserver.status import INTERNAL_MESSAGE, StatusCode

from . import h2events
from .faultlog import FaultLog
from .framing import Refusal, RequestHead, request_head
from .h2guard import ConnectionTable, GuardedProtocol
from .limits import Fault, WireCounters, WireLimits, WireStatistics
from .reclaim import ReclaimPolicy, release_memory
from .unary import (
    ANSWER_HEADERS,
    OK_TRAILERS,
    SEND_CHUNK,
    DirectAdmission,
    DirectHandler,
    frame_pieces,
    message_pieces,
)

log = logging.getLogger(__name__)

_UNARY_REQUEST = (Cardinality.UNARY_UNARY, Cardinality.UNARY_STREAM)
#: Seconds between two runs of the server's periodic housekeeping.
TICK = 2.0


@attrs.frozen(eq=False)
class Admission:
    """A request whose headers passed: what its handler task needs."""

    handler: Handler
    head: RequestHead
    metadata: Any
    #: grpclib's deadline (``time.monotonic`` based), fixed when the headers arrived.
    deadline: Deadline | None

    @property
    def unary_request(self) -> bool:
        return self.handler.cardinality in _UNARY_REQUEST


class ServerStream(grpclib.server.Stream):
    """grpclib's server stream, plus the one-pass unary answer (module docstring)."""

    async def send_unary_message(self, message: Any) -> None:
        """``send_message`` for a unary call's one answer: encoded by the server's codec
        (which enforces the send limit), then sent with its trailers in one pass."""
        await self.send_unary_reply((self._codec.encode(message, self._send_type),))

    async def send_unary_reply(self, parts: Sequence[bytes | memoryview]) -> None:
        """Answer a unary call with the message ``b"".join(parts)`` and status OK."""
        if self._send_initial_metadata_done or self._send_trailing_metadata_done:
            raise GrpclibProtocolError("the call was already answered")
        # grpclib's protocol-level stream and its h2 connection: this subclass writes
        # what grpclib's send_headers/send_data would, without their per-call layers.
        stream = self._stream
        h2 = stream._h2_connection
        write = stream._transport.write
        connection = stream.connection
        sid = stream.id
        pending, _ = message_pieces(parts)
        await connection.write_ready.wait()
        if sid not in h2.streams:
            raise StreamTerminatedError("the stream was closed before the answer")
        h2.send_headers(sid, ANSWER_HEADERS)
        connection.headers_send_process()
        self._send_initial_metadata_done = True
        while pending:
            window = min(h2.local_flow_control_window(sid), h2.max_outbound_frame_size, SEND_CHUNK)
            if window <= 0:
                write(h2.data_to_send())
                stream.window_updated.clear()
                await stream.window_updated.wait()
                await connection.write_ready.wait()
                if sid not in h2.streams:
                    raise StreamTerminatedError("the stream was reset during the answer")
                continue
            data, written = frame_pieces(pending, window)
            h2.send_data(sid, data)
            stream.data_sent += written
            connection.data_sent += written
            connection.data_send_process()
            if pending:
                write(h2.data_to_send())  # one frame at a time: bounded memory
                if not connection.write_ready.is_set():
                    await connection.write_ready.wait()  # the peer reads slower
                    if sid not in h2.streams:
                        raise StreamTerminatedError("the stream was reset during the answer")
        self._send_message_done = True
        h2.send_headers(sid, OK_TRAILERS, end_stream=True)
        write(h2.data_to_send())
        connection.headers_send_process()
        self._send_trailing_metadata_done = True


class _Calls:
    """The calls of one connection (its ``RequestSink``); see the module docstring."""

    def __init__(self, server: GuardedServer) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._tasks: dict[Stream, asyncio.Task[None]] = {}
        self._peer = ""
        #: The headers of the last request judged and :func:`request_head`'s verdict: a
        #: client sends the same header block call after call, and the connection's
        #: decoder gives it back as the same tuple (kept here, so its id is not reused).
        self._last_headers: Sequence[tuple[str, str]] = ()
        self._last_head: RequestHead | Refusal = request_head(())
        #: The admission of that block when it is a direct method's without a deadline:
        #: nothing in it differs from call to call, so the next such call gets it again.
        self._last_admission: DirectAdmission | None = None

    # ---------------------------------------------------------------- RequestSink

    def admit(
        self, headers: Sequence[tuple[str, str]], peer: str, now: float
    ) -> Admission | DirectAdmission | Refusal:
        self._peer = peer
        if headers is self._last_headers:
            if self._last_admission is not None:
                return self._last_admission
            head = self._last_head  # the block of the last request again: its verdict
        else:
            head = request_head(headers)
            self._last_admission = None
            if type(headers) is tuple:  # immutable: safe to know again by identity
                self._last_headers, self._last_head = headers, head
        if isinstance(head, Refusal):
            return head
        handler = self._server.mapping.get(head.path)
        if handler is None:
            return Refusal(
                StatusCode.UNIMPLEMENTED,
                f"method {head.path!r} is not served here",
                Fault.UNKNOWN_METHOD,
            )
        if isinstance(handler, DirectHandler):
            if head.timeout is not None:
                # Its deadline in loop time: the clock its handler's timers use.
                return DirectAdmission(handler, head, now + head.timeout)
            admission = DirectAdmission(handler, head, None)
            if headers is self._last_headers:
                self._last_admission = admission
            return admission
        try:
            metadata = decode_metadata(headers)
        except (ValueError, binascii.Error) as exc:
            return Refusal(
                StatusCode.INVALID_ARGUMENT,
                f"malformed binary (-bin) metadata: {exc}",
                Fault.BAD_REQUEST,
            )
        deadline = None if head.timeout is None else Deadline.from_timeout(head.timeout)
        return Admission(handler, head, metadata, deadline)

    def accept(self, stream: Stream, admitted: Admission, release: Callable[[], None]) -> None:
        released = False

        def release_once() -> None:
            nonlocal released
            if not released:
                released = True
                try:
                    release()
                except Exception:
                    log.exception("releasing a stream of %s failed", self._peer)

        task = self._loop.create_task(self._serve(stream, admitted, release_once))
        self._tasks[stream] = task
        self._server.tasks.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.pop(stream, None)
            self._server.tasks.discard(task)
            # Retrieve the outcome: an unretrieved exception would reach the loop's
            # exception handler as "never retrieved", without the call it belongs to.
            if not task.cancelled() and task.exception() is not None:
                log.error("a call of %s failed", admitted.head.path, exc_info=task.exception())
            release_once()

        task.add_done_callback(done)

    def cancel(self, stream: Stream) -> None:
        task = self._tasks.pop(stream, None)
        if task is not None:
            task.cancel()

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()

    # ---------------------------------------------------------------- one call

    async def _serve(
        self, h2_stream: Stream, admitted: Admission, release: Callable[[], None]
    ) -> None:
        """Run one call and answer it; ``release`` frees its stream slot once answered.

        The slot is freed here, in the step that sends the trailers, and not only by the
        task's done-callback: that callback may run after the peer, having read the
        answer, already opened its next stream, which would then find the slot taken.
        """
        try:
            await self._call(h2_stream, admitted)
        finally:
            release()

    async def _call(self, h2_stream: Stream, admitted: Admission) -> None:
        handler, head = admitted.handler, admitted.head
        server = self._server
        stream = ServerStream(
            h2_stream,
            head.path,
            handler.cardinality,
            handler.request_type,
            handler.reply_type,
            codec=server.codec,
            status_details_codec=None,
            dispatch=server.dispatch,
            deadline=admitted.deadline,
            user_agent=head.user_agent,
        )
        stream.metadata = admitted.metadata
        status, message = Status.OK, None
        # The wrapper is how grpclib interrupts a handler: the processor cancels it with
        # StreamTerminatedError when the peer resets, and our timer with TimeoutError.
        wrapper = h2_stream.wrapper = Wrapper()
        timer: asyncio.TimerHandle | None = None
        try:
            if admitted.deadline is not None:
                remaining = admitted.deadline.time_remaining()
                if remaining <= 0:
                    text = (
                        "deadline exceeded before the call started "
                        f"(grpc-timeout {head.timeout_text!r})"
                    )
                    server.table.fault(Fault.EXPIRED_ON_ARRIVAL, self._peer, text)
                    raise GRPCError(Status.DEADLINE_EXCEEDED, text)
                timer = self._loop.call_later(
                    remaining, wrapper.cancel, TimeoutError("deadline exceeded")
                )
            try:
                with wrapper:
                    await handler.func(stream)
            finally:
                if timer is not None:
                    timer.cancel()
        except GRPCError as exc:
            status, message = exc.status, exc.message
        except TimeoutError:
            if wrapper.cancelled:  # our deadline timer fired
                status = Status.DEADLINE_EXCEEDED
                message = f"deadline exceeded (grpc-timeout {head.timeout_text!r})"
            else:
                log.exception("%s failed with an unexpected error", head.path)
                status, message = Status.INTERNAL, INTERNAL_MESSAGE
        except (StreamTerminatedError, h2events.StreamClosedError):
            return  # the peer reset the stream or the connection is gone: nobody to tell
        except Exception:
            log.exception("%s failed with an unexpected error", head.path)
            status, message = Status.INTERNAL, INTERNAL_MESSAGE
        await self._finish(stream, h2_stream, status, message)

    async def _finish(
        self,
        stream: grpclib.server.Stream[Any, Any],
        h2_stream: Stream,
        status: Status,
        message: str | None,
    ) -> None:
        if stream._send_trailing_metadata_done or not h2_stream.closable:
            return
        try:
            try:
                await stream.send_trailing_metadata(status=status, status_message=message)
            except GrpclibProtocolError:
                # A unary handler that returned without a message: our bug.
                log.exception("%s ended without answering", stream._method_name)
                await stream.send_trailing_metadata(
                    status=Status.INTERNAL, status_message=INTERNAL_MESSAGE
                )
        except (h2events.StreamClosedError, StreamTerminatedError, GrpclibProtocolError):
            pass  # the peer is gone, or trailers went out after all


class GuardedServer:
    """A gRPC server over :mod:`.h2guard` connections; see the module docstring."""

    def __init__(
        self,
        mapping: Mapping[str, Handler | DirectHandler],
        *,
        codec: CodecBase,
        limits: WireLimits,
        counters: WireCounters | None = None,
        faults: FaultLog | None = None,
    ) -> None:
        self.mapping = dict(mapping)
        self.codec = codec
        self.limits = limits
        self.counters = counters if counters is not None else WireCounters()
        self.faults = faults if faults is not None else FaultLog()
        self.table = ConnectionTable(limits, self.counters, self.faults)
        self.dispatch = _DispatchServerEvents()
        #: Every running call task, for ``wait_closed``.
        self.tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.AbstractServer | None = None
        self._ticker: asyncio.TimerHandle | None = None
        self._reclaim = ReclaimPolicy()
        # Often enough that the handshake and idle timeouts are kept to within a quarter.
        self._tick_seconds = min(TICK, limits.handshake_timeout / 4, limits.idle_timeout / 4)

    def statistics(self) -> WireStatistics:
        return self.counters.statistics()

    def _protocol(self) -> GuardedProtocol:
        return GuardedProtocol(self.table, _Calls(self))

    async def start(self, sock: socket.socket) -> None:
        """Serve on the listening socket ``sock`` (the server owns it from now on)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, sock=sock)
        self._tick()

    def _tick(self) -> None:
        """Every :data:`TICK` seconds (or a quarter of the shortest timeout): close
        connections past their handshake or idle timeout, write held-back fault counts
        whose interval is over, and give memory back once a hostile burst is over."""
        loop = asyncio.get_running_loop()
        try:
            self.table.sweep(loop.time())
            self.faults.flush()
            counters = self.counters
            peak, counters.streams_peak = counters.streams_peak, counters.streams_open
            if self._reclaim.due(counters.streams_open, peak, sum(counters.faults.values())):
                release_memory()
        except Exception:
            log.exception("the gRPC server's periodic tick failed")
        finally:
            self._ticker = loop.call_later(self._tick_seconds, self._tick)

    def goaway(self) -> None:
        """GOAWAY on every connection (each closes itself shortly after)."""
        self.table.goaway()

    def close(self) -> None:
        """Stop listening, close every connection and cancel every call."""
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        self.faults.flush()
        if self._server is not None:
            self._server.close()
        self.table.close()

    async def wait_closed(self) -> None:
        if self._server is not None:
            await self._server.wait_closed()
        while self.tasks:
            await asyncio.wait(list(self.tasks))
