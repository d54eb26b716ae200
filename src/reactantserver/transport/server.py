"""A hardened gRPC server built from a handler mapping and a limits record.

:class:`GuardedServer` is what both a worker and a gateway serve with: it takes grpclib
``Handler`` entries (``{"/pkg.Service/Method": Handler(func, cardinality, request_type,
reply_type)}``), a message codec and a :class:`~.core.limits.WireLimits`, and knows nothing of
``Service``, Trio or model inference. Connections are :class:`~.h2guard.GuardedProtocol`\\ s
(every check of the wire); this module runs the calls that pass them.

Theory of operation
-------------------
Per connection, a :class:`_Calls` object is the ``RequestSink`` of
:mod:`.h2guard`: ``admit`` judges a request's headers (:func:`.core.framing.request_head`,
then the path against the mapping, then its metadata) and computes its deadline *at
arrival*; ``accept`` makes the call's :class:`ServerStream` and runs the handler with it
as an asyncio task whose done-callback releases the stream -- a callback, because a task
cancelled before it first runs never executes its own ``finally``. Two kinds of mapping
entry need no task: a :class:`~.unary.DirectHandler` (served by the connection itself,
:mod:`.unary`) and a :class:`~.streaming.StreamHandler`, whose calls ``accept`` makes into
:class:`~.streaming.StreamCall` records (:mod:`.streaming`: a stream of unary requests,
each begun as its message completes); the rest of this module is the task path.

Each call ends with exactly one status, chosen here and nowhere else:

* the handler's ``GRPCError`` as raised (this is how every expected outcome arrives);
* DEADLINE_EXCEEDED when the deadline had passed before the handler could start, or
  passes while it runs (the task is cancelled, ``asyncio.timeout``) -- never UNKNOWN,
  and never a traceback (a deadline is an outcome, not an error);
* nothing at all when the peer reset the stream (the task is cancelled) or the
  connection went away;
* INTERNAL with the fixed message ``internal error`` for anything else, with the
  traceback in the log: that is our bug.

**The stream.** :class:`ServerStream` is what a handler is given: ``recv_message`` (and
``async for``), ``send_message``, ``send_trailing_metadata``, ``metadata``, ``deadline``,
``peer``, written on the connection's own methods (``send_headers``, ``send_data``,
``send_answer``, ``acknowledge_received_data``). A request's DATA is kept as the views the
connection parsed and acknowledged as its messages are read, so a handler that reads
slowly holds the peer to one window. A call that answers one message (unary and
client-streaming) answers it in one pass: the initial headers (a constant list, built
once), the message framed straight from its pieces and the OK trailers (constant too)
queued back to back -- one ``send_answer`` step when it fits a frame and the windows --
and handed to the transport once. Beyond the windows it waits for WINDOW_UPDATE, frame
by frame; a streaming answer sends each message the same way, without trailers.

A large answer leaves in DATA frames of at most :data:`SEND_CHUNK` (256 KiB) even when
the peer allows 16 MiB frames and windows (gRPC's C core does): the frame is copied on
its way to the socket (:mod:`..h2.server` joins a frame's header and payload once, then the
transport), and a 256 KiB frame is copied while it sits in the CPU's cache, a 16 MiB one
from main memory into freshly mapped pages every time. Each frame is handed to the
transport at once, and the next waits while the transport's buffer is over its
high-water mark. Measured on a 38 MB answer: server CPU per call 0.75-0.8x, median
latency 0.85x (docs/benchmarks.md).

Housekeeping: every :data:`TICK` seconds the server sweeps its connections for
handshake, idle, body and send timeouts, flushes the rate-limited fault log and, once a hostile
burst is over, gives its memory back (:mod:`.core.reclaim`).

Shutdown helpers: :meth:`GuardedServer.goaway` (no new streams, on every connection),
:meth:`GuardedServer.close` (stop listening, close every connection, cancel every call)
and :meth:`GuardedServer.wait_closed`. Draining -- refusing new calls while old ones
finish -- is the caller's policy: a handler can simply answer UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import binascii
import collections
import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
from grpclib import GRPCError
from grpclib.const import Cardinality, Handler
from grpclib.encoding.base import CodecBase
from grpclib.metadata import Deadline, decode_metadata

from reactantserver.grpcwire import StatusCode
from reactantserver.status import INTERNAL_MESSAGE

from ..h2 import events as h2events
from .core.auth import Authorizer, Peer
from .core.compression import Inflater
from .core.faultlog import FaultLog
from .core.framing import HeadersPassed, Refusal, RequestHead, request_head, take_bytes
from .core.limits import Fault, WireCounters, WireLimits, WireStatistics
from .core.reclaim import ReclaimPolicy, release_memory
from .grpcerror import error_code, grpc_error
from .h2guard import ConnectionTable, GuardedProtocol
from .streaming import StreamAdmission, StreamCall, StreamHandler
from .tls import ServerTls
from .unary import (
    ACCEPTING_ANSWER_HEADERS,
    ANSWER_HEADERS,
    OK_TRAILERS,
    SEND_CHUNK,
    DirectAdmission,
    DirectHandler,
    message_pieces,
    send_frames,
    status_headers,
    waiting_bytes,
)

log = logging.getLogger(__name__)

_UNARY_REQUEST = (Cardinality.UNARY_UNARY, Cardinality.UNARY_STREAM)
#: Seconds between two runs of the server's periodic housekeeping.
TICK = 2.0


@attrs.frozen(eq=False)
class Admission(HeadersPassed[Handler, Deadline]):
    """A request for a grpclib handler whose headers passed: what its handler task needs.
    Its deadline is grpclib's (``time.monotonic`` based), fixed when the headers arrived."""

    #: The call's metadata, decoded (``-bin`` values as bytes).
    metadata: Any = None

    @property
    def unary_request(self) -> bool:
        return self.handler.cardinality in _UNARY_REQUEST


class CallError(RuntimeError):
    """A handler used its stream out of order (our bug: answered INTERNAL)."""


class ServerStream:
    """One call served by a task: what its handler reads and writes (module docstring)."""

    def __init__(
        self,
        guard: GuardedProtocol,
        sid: int,
        admitted: Admission,
        codec: CodecBase,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        assert guard.h2 is not None
        self._guard = guard
        self._h2 = guard.h2
        self._loop = loop
        self.id = sid
        handler = admitted.handler
        self._codec = codec
        self._recv_type = handler.request_type
        self._send_type = handler.reply_type
        #: One message answers the call, and is sent with status OK.
        self.unary = not handler.cardinality.server_streaming
        #: The request's metadata (grpclib's multidict), deadline and client address.
        self.metadata = admitted.metadata
        self.deadline = admitted.deadline
        self.peer = guard.peer
        self.owner = admitted.owner
        self.path = admitted.head.path
        #: The call's ``grpc-encoding`` (messages flagged compressed are inflated), and
        #: the initial headers of its answer (they say what is accepted when it has one).
        self._head = admitted.head
        self._answer_headers = (
            ACCEPTING_ANSWER_HEADERS if admitted.head.compressed else ANSWER_HEADERS
        )
        self._limit = (guard.limits.max_message_bytes, guard.limits.names.max_message_bytes)
        #: The flags byte of the message being read.
        self._flags = 0
        #: Received and not yet read: payload views, their size, their flow-controlled
        #: bytes not yet acknowledged, the length of the message being read (-1: its
        #: prefix is not read yet), and whether the peer ended the stream.
        self._chunks: collections.deque[memoryview] = collections.deque()
        self._size = 0
        self._unacked = 0
        self._length = -1
        self._ended = False
        #: The handler's wait for input, a window or a drained transport.
        self._waiter: asyncio.Future[None] | None = None
        self.headers_sent = False
        self.message_sent = False
        self.trailers_sent = False

    # ---------------------------------------------------------------- the connection's side

    def received(self, data: memoryview, flow_controlled_length: int) -> None:
        self._chunks.append(data)
        self._size += len(data)
        self._unacked += flow_controlled_length
        self.wake()

    def ended(self) -> None:
        self._ended = True
        self.wake()

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def drop(self) -> int:
        self._chunks.clear()
        self._size = 0
        unacked, self._unacked = self._unacked, 0
        return unacked

    async def _wait(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    # ---------------------------------------------------------------- the handler's side

    async def recv_message(self) -> Any:
        """The next request message, decoded; None once the peer ended the stream."""
        while True:
            if self._length < 0 and self._size >= 5:
                prefix = self._take(5)
                self._flags, self._length = prefix[0], int.from_bytes(prefix[1:], "big")
            if 0 <= self._length <= self._size:
                break
            if self._ended:
                return None  # (a message cut short was refused by the framer)
            await self._wait()
        data = self._take(self._length)
        self._length = -1
        if self._unacked:  # read: the peer may send as much again
            self._h2.acknowledge_received_data(self._unacked, self.id)
            self._unacked = 0
            self._guard.flush()
        if self._flags == 1:  # (the framer let the flag through: the call has an encoding)
            data = await self._inflate(data)
        return self._codec.decode(data, self._recv_type)

    async def _inflate(self, data: bytes) -> bytes:
        """A compressed message inflated (:mod:`.core.compression`), a step per loop pass."""
        limit, setting = self._limit
        inflater = Inflater(data, self._head.encoding, limit, setting)
        while (result := inflater.step()) is None:
            await asyncio.sleep(0)  # the other calls are served between two steps
        if isinstance(result, Refusal):
            self._guard.fault(result.fault, result.message)
            raise grpc_error(result.code, result.message)
        return result

    def _take(self, n: int) -> bytes:
        """The next ``n`` received bytes."""
        self._size -= n
        return take_bytes(self._chunks, n)

    def __aiter__(self) -> ServerStream:
        return self

    async def __anext__(self) -> Any:
        message = await self.recv_message()
        if message is None:
            raise StopAsyncIteration
        return message

    async def send_message(self, message: Any) -> None:
        """Send one answer message, encoded by the server's codec (which enforces the send
        limit); on a call that answers one message, with its OK trailers."""
        if self.trailers_sent or (self.unary and self.message_sent):
            raise CallError(f"{self.path}: the call was already answered")
        pending, size = message_pieces((self._codec.encode(message, self._send_type),))
        self.message_sent = True
        h2, sid = self._h2, self.id
        if (
            self.unary
            and not self.headers_sent
            and size <= SEND_CHUNK
            and self._guard.writable
            and h2.send_answer(sid, self._answer_headers, pending, size, OK_TRAILERS)
        ):
            self.headers_sent = self.trailers_sent = True
            self._guard.flush()
            return
        guard = self._guard
        if not guard.room_for(size):  # unread answers before it: not one more
            raise grpc_error(StatusCode.RESOURCE_EXHAUSTED, guard.unread_refusal(size))
        if not self.headers_sent:
            h2.send_headers(sid, self._answer_headers)
            self.headers_sent = True
        waiting = 0  # of this answer's bytes, counted as waiting by the connection
        try:
            while not send_frames(h2, sid, pending, guard):
                left = waiting_bytes(pending)
                guard.answer_waits(left - waiting)
                waiting = left
                await self._wait()  # a WINDOW_UPDATE, or the transport drained
        finally:
            if waiting:
                guard.answer_waits(-waiting)
        if self.unary:
            h2.send_headers(sid, OK_TRAILERS, end_stream=True)
            self.trailers_sent = True
        self._guard.flush()

    async def send_trailing_metadata(
        self, *, status: StatusCode = StatusCode.OK, status_message: str | None = None
    ) -> None:
        """End the call with ``status`` (trailers-only if nothing was sent)."""
        if self.trailers_sent:
            raise CallError(f"{self.path}: the call was already answered")
        if self.unary and status is StatusCode.OK and not self.message_sent:
            raise CallError(f"{self.path}: a unary call ended OK without its message")
        if status is StatusCode.OK and status_message is None and self.headers_sent:
            headers: Sequence[tuple[str, str]] = OK_TRAILERS
        else:
            headers = status_headers(status, status_message, headers_sent=self.headers_sent)
        self._h2.send_headers(self.id, headers, end_stream=True)
        self.trailers_sent = self.headers_sent = True
        self._guard.flush()


class _Calls:
    """The calls of one connection (its ``RequestSink``); see the module docstring."""

    def __init__(self, server: GuardedServer) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        #: The connection (set once it is made): who the client is (:mod:`.core.auth`).
        self.guard: GuardedProtocol | None = None
        #: Who a sink without a connection (a test's) judges calls as.
        self._identity = Peer()
        self._closed = False
        self._tasks: dict[int, asyncio.Task[None]] = {}
        #: The calls of stream methods (:mod:`.streaming`: no task), by stream id.
        self._streams: dict[int, StreamCall] = {}
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
    ) -> Admission | DirectAdmission | StreamAdmission | Refusal:
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
        server = self._server
        handler = server.mapping.get(head.path)
        if handler is None:
            return Refusal(
                StatusCode.UNIMPLEMENTED,
                f"method {head.path!r} is not served here",
                Fault.UNKNOWN_METHOD,
            )
        identity = self.guard.identity if self.guard is not None else self._identity
        if server.authorizer is None:
            owner = identity.owner
        else:  # the call's own headers decide (the cache above holds a passed decision)
            verdict = server.authorizer.decide(head.path, headers, identity)
            if isinstance(verdict, Refusal):
                return verdict
            owner = verdict
        if isinstance(handler, DirectHandler):
            if head.timeout is not None:
                # Its deadline in loop time: the clock its handler's timers use.
                return DirectAdmission(handler, head, now + head.timeout, owner)
            admission = DirectAdmission(handler, head, None, owner)
            if headers is self._last_headers:
                self._last_admission = admission
            return admission
        if isinstance(handler, StreamHandler):
            return StreamAdmission(
                handler, head, None if head.timeout is None else now + head.timeout, owner
            )
        try:
            metadata = decode_metadata(headers)
        except (ValueError, binascii.Error) as exc:
            return Refusal(
                StatusCode.INVALID_ARGUMENT,
                f"malformed binary (-bin) metadata: {exc}",
                Fault.BAD_REQUEST,
            )
        deadline = None if head.timeout is None else Deadline.from_timeout(head.timeout)
        return Admission(handler, head, deadline, owner, metadata)

    def accept(
        self,
        guard: GuardedProtocol,
        sid: int,
        admitted: Admission | StreamAdmission,
        release: Callable[[], None],
    ) -> ServerStream | StreamCall:
        if isinstance(admitted, StreamAdmission):
            return self._accept_stream(guard, sid, admitted, release)
        stream = ServerStream(guard, sid, admitted, self._server.codec, self._loop)
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
        self._tasks[sid] = task
        self._server.tasks.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.pop(sid, None)
            self._server.tasks.discard(task)
            # Retrieve the outcome: an unretrieved exception would reach the loop's
            # exception handler as "never retrieved", without the call it belongs to.
            if not task.cancelled() and task.exception() is not None:
                log.error("a call of %s failed", admitted.head.path, exc_info=task.exception())
            release_once()

        task.add_done_callback(done)
        return stream

    def _accept_stream(
        self,
        guard: GuardedProtocol,
        sid: int,
        admitted: StreamAdmission,
        release: Callable[[], None],
    ) -> StreamCall:
        """A stream method's call: a record of the connection, no task (:mod:`.streaming`)."""

        def released() -> None:
            self._streams.pop(sid, None)
            release()

        call = StreamCall(guard, sid, admitted, self._server.limits, self._loop, released)
        self._streams[sid] = call
        return call

    def cancel(self, sid: int) -> None:
        task = self._tasks.pop(sid, None)
        if task is not None:
            task.cancel()
        stream = self._streams.get(sid)
        if stream is not None:
            stream.cancel()

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
        for stream in list(self._streams.values()):
            stream.close()
        closed = self._server.on_closed
        if closed is not None and not self._closed and self.guard is not None:
            self._closed = True
            try:
                closed(self.guard.identity.connection)
            except Exception:
                log.exception("cleaning up after the connection from %s failed", self._peer)

    # ---------------------------------------------------------------- one call

    async def _serve(
        self, stream: ServerStream, admitted: Admission, release: Callable[[], None]
    ) -> None:
        """Run one call and answer it; ``release`` frees its stream slot once answered.

        The slot is freed here, in the step that sends the trailers, and not only by the
        task's done-callback: that callback may run after the peer, having read the
        answer, already opened its next stream, which would then find the slot taken.
        """
        try:
            await self._call(stream, admitted)
        finally:
            release()

    async def _call(self, stream: ServerStream, admitted: Admission) -> None:
        handler, head = admitted.handler, admitted.head
        status: StatusCode = StatusCode.OK
        message: str | None = None
        remaining = None if admitted.deadline is None else admitted.deadline.time_remaining()
        timeout = asyncio.timeout(remaining)
        try:
            if remaining is not None and remaining <= 0:
                text = f"deadline exceeded before the call started (grpc-timeout {head.timeout_text!r})"
                self._server.table.fault(Fault.EXPIRED_ON_ARRIVAL, self._peer, text)
                raise grpc_error(StatusCode.DEADLINE_EXCEEDED, text)
            async with timeout:
                await handler.func(stream)
        except GRPCError as exc:
            status, message = error_code(exc), exc.message
        except TimeoutError:
            if timeout.expired():  # the call's deadline passed
                status = StatusCode.DEADLINE_EXCEEDED
                message = f"deadline exceeded (grpc-timeout {head.timeout_text!r})"
            else:
                log.exception("%s failed with an unexpected error", head.path)
                status, message = StatusCode.INTERNAL, INTERNAL_MESSAGE
        except h2events.ProtocolError:
            return  # the stream or the connection closed under the call: nobody to tell
        except Exception:
            log.exception("%s failed with an unexpected error", head.path)
            status, message = StatusCode.INTERNAL, INTERNAL_MESSAGE
        if stream.trailers_sent:
            return
        if stream.unary and status is StatusCode.OK and not stream.message_sent:
            log.error("%s ended without answering", head.path)  # our bug
            status, message = StatusCode.INTERNAL, INTERNAL_MESSAGE
        try:
            await stream.send_trailing_metadata(status=status, status_message=message)
        except h2events.ProtocolError:
            pass  # the peer is gone, or the connection closed (GOAWAY)


class GuardedServer:
    """A gRPC server over :mod:`.h2guard` connections; see the module docstring."""

    def __init__(
        self,
        mapping: Mapping[str, Handler | DirectHandler | StreamHandler],
        *,
        codec: CodecBase,
        limits: WireLimits,
        counters: WireCounters | None = None,
        faults: FaultLog | None = None,
        tls: ServerTls | None = None,
        authorizer: Authorizer | None = None,
        on_closed: Callable[[str], None] | None = None,
    ) -> None:
        self.mapping = dict(mapping)
        #: TLS on the listener (None: cleartext h2c).
        self.tls = tls
        #: Restricted groups and the trusted gateway (None: every group open).
        self.authorizer = authorizer
        #: Called with a connection's owner (``conn:<id>``) once it closed: what belonged
        #: to that connection alone (its shared-memory regions) goes with it.
        self.on_closed = on_closed
        self.codec = codec
        self.limits = limits
        self.counters = counters if counters is not None else WireCounters()
        self.faults = faults if faults is not None else FaultLog()
        self.table = ConnectionTable(limits, self.counters, self.faults)
        #: Every running call task, for ``wait_closed``.
        self.tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.AbstractServer | None = None
        self._ticker: asyncio.TimerHandle | None = None
        self._reclaim = ReclaimPolicy()
        # Often enough that the handshake, idle, body and send timeouts are kept to within
        # a quarter.
        self._tick_seconds = min(
            TICK,
            limits.handshake_timeout / 4,
            limits.idle_timeout / 4,
            limits.body_timeout / 4,
            limits.send_timeout / 4,
        )

    def statistics(self) -> WireStatistics:
        return self.counters.statistics()

    def _protocol(self) -> GuardedProtocol:
        calls = _Calls(self)
        calls.guard = protocol = GuardedProtocol(self.table, calls)
        return protocol

    async def start(self, sock: socket.socket) -> None:
        """Serve on the listening socket ``sock`` (the server owns it from now on); with
        TLS, each handshake gets the current certificate (:mod:`.tls`) and must finish
        within the handshake timeout."""
        loop = asyncio.get_running_loop()
        if self.tls is None:
            self._server = await loop.create_server(self._protocol, sock=sock)
        else:
            self._server = await loop.create_server(
                self._protocol,
                sock=sock,
                ssl=self.tls.listener_context(),
                ssl_handshake_timeout=self.limits.handshake_timeout,
            )
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
        """Stop listening, then GOAWAY on every connection (each closes itself shortly
        after, or as soon as its client closes its side).

        Listening stops first: a client that reads the GOAWAY reconnects for its next
        call, and a connection accepted now would be cut by ``close`` with that call on
        it (a reset call, issue 42); refused, the client's call fails to connect, never
        started.
        """
        if self._server is not None:
            self._server.close()
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


def listen_tcp(host: str, port: int, backlog: int = 128) -> socket.socket:
    """A listening TCP socket on host:port (port 0 picks a free port), for a
    :class:`GuardedServer` (the worker's and the gateway's).

    Accepted connections get ``TCP_NODELAY`` from the connection layer
    (:mod:`~reactantserver.transport.h2guard`); the socket is still created with
    ``proto=IPPROTO_TCP`` so that it says what it is (asyncio, too, sets ``TCP_NODELAY``
    only when the socket says TCP; without it every small answer waits for a delayed ACK).
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
