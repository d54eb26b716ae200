"""The gateway's connections to its workers: unary gRPC calls as raw bytes over our HTTP/2.

:class:`WorkerConnection` is an ``asyncio.Protocol`` over the client role of our HTTP/2
connection (:mod:`~reactantserver.h2.client`) that carries unary calls only. It
tells the proxy what a general client hides -- whether the worker can have executed a
request (for failover) and the exact ``grpc-timeout`` sent -- and makes nothing per call
the proxy does not need: a call is started synchronously (:meth:`WorkerConnection.start`)
with a callback that the protocol's event handling runs once with the outcome (the
gateway's ModelInfer answers its own client from there, so no task and no future exist
per forwarded call), or awaited (:meth:`WorkerConnection.call`, a future over the same
callback). One worker's connection, stream slots and waiting calls are
:class:`~.pool.WorkerClient`'s (:mod:`.pool`). A call's answer is a :class:`Reply`: the
worker's gRPC status and message, and on OK the response message's bytes, untouched.

A call that gets no gRPC answer raises :class:`ChannelError`, whose ``unprocessed`` says
whether the worker cannot have executed it:

* ``unprocessed=True``: no connection could be made; the request was not completely sent
  when the connection failed (a worker never starts a call whose message it has not
  received in full); the worker refused the stream (``REFUSED_STREAM``); or the worker's
  GOAWAY named a last stream below it (the calls at or below it are still answered: a
  worker that drains finishes them). Failing over is safe.
* ``unprocessed=False``: the request was sent in full and the connection (or the stream)
  then failed. The worker may have run it; the proxy answers UNAVAILABLE and does not retry.

Deadlines: each call carries an absolute deadline (``loop.time()``). The remaining time is
sent as ``grpc-timeout`` (:func:`~reactantserver.grpcwire.encode_grpc_timeout`: the
finest unit that fits, rounded down) when the stream opens, after any wait for a stream --
unless the caller says not to tell the worker (``tell=False``: the deadline is the
gateway's own bound, not the client's; the request headers are then the same bytes on
every call, which the worker decodes once per connection). A call still unanswered at its
deadline is answered DEADLINE_EXCEEDED, and its stream is reset (``RST_STREAM CANCEL``)
only if the worker has not ended it within :data:`DEADLINE_RESET_GRACE` -- a worker told
the deadline ends the call itself; one not told is stopped by that reset. A caller that
goes away before its deadline resets its stream at once, which cancels the call on the
worker. The connection keeps one timer, not one per call, armed for the earliest of a
heap of ``(deadline, stream id)`` (bounded by the calls in flight: :meth:`_watch`).

Writes: a request that fits the worker's windows and frame size is queued whole in one
step (``send_request``), a larger one as views of it as the windows allow (``send_pieces``).
The protocol hands the queued frames to the socket when the read that provoked them has
been handled (:class:`~reactantserver.transport.h2conn.HeldWrites`; else once per loop
pass; a large request as it goes), so the calls opened by one read of a client leave in
one ``send`` -- or every :data:`FLUSH_EVERY` calls, so that a burst does not wait for the
gateway to route the last of it while the worker idles.
Flow control: inbound windows are large (:data:`LIMITS`: those the worker grants its own
clients) and replenished as data arrives; outbound data waits for the worker's window
updates.

A worker that breaks HTTP/2 (what :mod:`~reactantserver.h2.core` refuses, the
rules the worker holds its own clients to, the abuse budget included) gets GOAWAY with the
error's code, and the connection fails like any other lost one: its calls fail as
unprocessed or not by whether they were sent in full, and the pool opens a new connection
for the next call. A stream error resets that stream and fails its call the same way.

Invariants: every call's callback runs exactly once (answer, failure, deadline or
cancellation), and its stream slot is returned exactly once; a connection that failed is
never used again; a reply larger than ``max_reply_bytes`` is reset and answered
RESOURCE_EXHAUSTED rather than buffered.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import logging
import math
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import attrs

from ..errors import DeadlineExceeded
from ..grpcwire import StatusCode, encode_grpc_timeout, parse_grpc_status, status_for_http
from ..h2 import client as h2client
from ..h2 import events as h2events
from ..h2.events import (
    ConnectionTerminated,
    DataReceived,
    ErrorCodes,
    RemoteSettingsChanged,
    ResponseReceived,
    StreamReset,
    TrailersReceived,
    WindowUpdated,
)
from ..transport.core.auth import GATEWAY_KEY as _GATEWAY_KEY
from ..transport.core.auth import OWNER as _OWNER
from ..transport.core.limits import WireLimits
from ..transport.h2conn import held_writes

log = logging.getLogger(__name__)

GATEWAY_KEY, OWNER = _GATEWAY_KEY.encode(), _OWNER.encode()

#: What the gateway advertises to its workers and holds them to: the bounds a worker's
#: server side holds its clients to (a 16 MiB stream window, so a 16 MiB response arrives
#: without waiting for window updates; 64 MiB for the connection; frames of 1 MiB at
#: most, HTTP/2 allowing 16 MiB - 1; header lists of 64 KiB).
LIMITS = WireLimits()
#: How long opening a connection may take (also bounded by the call's deadline).
CONNECT_TIMEOUT = 5.0
#: After a call's deadline, how long the worker has to end the call itself -- it has the
#: same deadline, from grpc-timeout -- before the gateway resets the stream. Resetting at
#: once would make every expired call a "premature reset" to the worker, whose rapid-reset
#: guard closes a connection where most calls are reset within 1 s (docs/grpc.md).
DEADLINE_RESET_GRACE = 1.0

#: Calls started by one read of a client (or one pass of the event loop) that are written
#: to the socket together at most: the first of a burst leaves after the gateway has
#: handled 7 more, not the whole burst. At 16 in flight this took the p50 the gateway adds
#: from 1.4 ms to about zero for one extra ``send`` per 8 calls (docs/benchmarks.md,
#: "Bursts": 4 and 16 did worse).
FLUSH_EVERY = 8
#: Most request bytes handed to the HTTP/2 layer at once (it frames them by the worker's
#: SETTINGS_MAX_FRAME_SIZE); a large request is written to the socket as it goes.
MAX_CHUNK = 1024 * 1024
#: Compared against on every answer (a module name: no attribute lookup per call).
_OK = StatusCode.OK
#: A call's request left to queue when it went out whole (never changed: :meth:`Call.hold`
#: gives a call that waits its own).
_NOTHING_PENDING: collections.deque[memoryview] = collections.deque()


#: Request header blocks remembered per connection, by (path, owner), at most.
MAX_PREFIXES = 4096


@attrs.frozen
class Credentials:
    """What the gateway's requests to a worker carry beyond the call: ``:scheme https``
    over TLS, the gateway's key (``reactant-gateway-key``: the worker's
    ``endpoints.gateway``), and -- ``vouch``, when it has a key -- the client each call is
    made for (``reactant-owner``)."""

    tls: bool = False
    key: bytes = b""

    @property
    def vouch(self) -> bool:
        return bool(self.key)

    def headers(self, owner: str) -> tuple[tuple[bytes, bytes], ...]:
        if not self.key:
            return ()
        if not owner:
            return ((GATEWAY_KEY, self.key),)
        return ((GATEWAY_KEY, self.key), (OWNER, owner.encode("utf-8", "surrogateescape")))


class Reply:
    """A worker's gRPC answer: status, message, and on OK the response message's bytes --
    ``framed`` as it came (the 5-byte gRPC prefix, then the message), ``payload`` without
    the prefix."""

    __slots__ = ("framed", "message", "status")

    def __init__(
        self,
        status: StatusCode,
        message: str = "",
        framed: bytes | memoryview = b"\x00\x00\x00\x00\x00",
    ) -> None:
        self.status = status
        self.message = message
        self.framed = framed

    @property
    def payload(self) -> bytes | memoryview:
        return self.framed[5:]

    def __repr__(self) -> str:
        return f"Reply(status={self.status}, message={self.message!r}, {len(self.payload)} bytes)"


class ChannelError(Exception):
    """A call got no gRPC answer; ``unprocessed`` when the worker cannot have run it."""

    def __init__(self, message: str, *, unprocessed: bool) -> None:
        super().__init__(message)
        self.unprocessed = unprocessed


#: A call's callback: given the worker's answer, or why there is none.
OnDone = Callable[[Reply | ChannelError], None]


class Call:
    """One stream's state, from the request headers to the last frame of the answer."""

    __slots__ = ("chunks", "deadline", "grpc_message", "grpc_status", "http_status",
                 "on_done", "owner", "pending", "received", "release", "sent",
                 "stream_id")  # fmt: skip

    def __init__(
        self,
        owner: WorkerConnection,
        stream_id: int,
        on_done: OnDone | None,
        deadline: float,
        release: Callable[[], None] | None = None,
    ):
        self.owner = owner
        self.stream_id = stream_id
        #: Runs once with the outcome (then set to None).
        self.on_done = on_done
        #: Runs once, just before ``on_done``: the caller's stream slot goes back.
        self.release = release
        self.deadline = deadline
        #: What is still to queue of the request (:meth:`hold`): its gRPC length prefix
        #: and message, as views.
        self.pending = _NOTHING_PENDING
        #: The whole request (END_STREAM included) has been queued for sending.
        self.sent = False
        self.chunks: list[memoryview] = []
        self.received = 0
        self.http_status = 0
        self.grpc_status: StatusCode | None = None
        self.grpc_message = ""

    def hold(self, payload: bytes | memoryview) -> None:
        """Keep the request message ``payload`` to queue as the windows allow."""
        prefix = b"\x00" + len(payload).to_bytes(4, "big")
        self.pending = collections.deque((memoryview(prefix), memoryview(payload).cast("B")))

    def cancel(self) -> None:
        """The caller is gone: the worker cancels the call (see ``WorkerConnection``)."""
        self.owner._abandon(self)


class WorkerConnection(asyncio.Protocol):
    """One HTTP/2 connection carrying unary gRPC calls (see the module docstring)."""

    def __init__(
        self,
        authority: str,
        *,
        max_reply_bytes: int,
        limits: WireLimits = LIMITS,
        credentials: Credentials | None = None,
    ) -> None:
        self._authority = authority.encode()
        #: The scheme, the gateway's key, and whether it names the client it acts for.
        self._credentials = credentials if credentials is not None else Credentials()
        self._max_reply = max_reply_bytes
        self._loop = asyncio.get_running_loop()
        #: This thread's owed flushes (made on the loop's thread: the loop is running).
        self._held = held_writes()
        self._h2 = h2client.ClientConnection(limits, self._loop.time())
        self._prefixes: dict[tuple[bytes, str], bytes] = {}
        #: Header blocks seen (by the decoder's tuple) -> what they say
        #: (:func:`_header_fields`); the worker sends the same few blocks on every call.
        self._said: dict[int, tuple[object, _Said]] = {}
        self._transport: asyncio.Transport | None = None
        self._calls: dict[int, Call] = {}
        #: Calls whose request waits for the worker's flow-control window, in order.
        self._blocked: collections.deque[Call] = collections.deque()
        self._flush_scheduled = False
        #: Calls started since the last write to the socket (:data:`FLUSH_EVERY`).
        self._unsent = 0
        #: ``(deadline, stream id)`` of the calls (and of some answered ones, dropped
        #: lazily), a heap; one timer, for its earliest entry (module docstring).
        self._deadlines: list[tuple[float, int]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        #: Why the connection can no longer be used (None while it can).
        self.closed: str | None = None
        self.lost = self._loop.create_future()
        #: Event class -> its handler (the events of our calls; the rest are ignored).
        self._handlers: dict[type, Callable[[Any], None]] = {
            DataReceived: self._on_data,
            ResponseReceived: self._on_headers,
            TrailersReceived: self._on_headers,
            StreamReset: self._on_reset,
            ConnectionTerminated: self._on_goaway,
            WindowUpdated: self._on_window,
            RemoteSettingsChanged: self._on_window,
        }

    # ---------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._h2.initiate_connection()
        self._flush()

    def data_received(self, data: bytes) -> None:
        held = self._held
        held.enter()  # answers to clients, and our frames, are sent as it returns
        try:
            self._received(data)
        finally:
            held.leave()

    def _received(self, data: bytes) -> None:
        try:
            events = self._h2.receive_data(data, self._loop.time())
        except h2events.ProtocolError as exc:  # the connection queued its GOAWAY
            self._flush()
            code = int(exc.error_code)
            self._fail(f"protocol error from the worker ({_code_name(code)}): {exc}")
            return
        handlers = self._handlers
        for event in events:
            handle = handlers.get(event.__class__)
            if handle is not None:
                handle(event)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"connection lost ({exc})" if exc is not None else "connection closed"
        self._fail(reason)
        if not self.lost.done():
            self.lost.set_result(None)

    # ---------------------------------------------------------------- calls

    @property
    def usable(self) -> bool:
        """New calls may start here (not closed, no GOAWAY, stream ids left)."""
        return self.closed is None and not self._h2.goaway_received and self._h2.can_open_ids

    def slot_limit(self, most: int) -> int:
        """How many calls a caller allowing ``most`` may have open here: ``most``, or
        fewer if the worker allows fewer, and at least one."""
        return max(1, min(most, self._h2.peer_max_streams))

    async def call(
        self,
        path: bytes,
        payload: bytes | memoryview,
        deadline: float,
        *,
        tell: bool = True,
        owner: str = "",
    ) -> Reply:
        """Send one unary call and wait for its answer (see the module docstring)."""
        future: asyncio.Future[Reply] = self._loop.create_future()

        def resolve(outcome: Reply | ChannelError) -> None:
            if not future.done():
                if isinstance(outcome, ChannelError):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)

        call = self.start(path, payload, deadline, resolve, tell=tell, owner=owner)
        try:
            return await future
        except asyncio.CancelledError:
            self._abandon(call)
            raise

    def start(self, path: bytes, payload: bytes | memoryview, deadline: float,
              on_done: OnDone, release: Callable[[], None] | None = None, *,
              tell: bool = True, owner: str = "") -> Call:  # fmt: skip
        """Send one unary call; ``on_done`` runs once, from the loop, with its outcome
        (``release`` once, just before it). ``tell``: send the worker ``deadline`` as
        ``grpc-timeout``; when False the request headers are the path's constant block and
        ``deadline`` bounds only the gateway's wait. ``owner``: the client the call is made
        for, named to the worker (``reactant-owner``) when the gateway vouches for its
        clients (:class:`Credentials`), so that the worker keeps their shared-memory
        regions apart.

        Raises ``ChannelError`` (unprocessed) when the connection takes no new stream and
        ``DeadlineExceeded`` when ``deadline`` has passed; nothing was sent then.
        """
        if self.closed is not None:
            raise ChannelError(self.closed, unprocessed=True)
        remaining = deadline - self._loop.time()
        if remaining <= 0:
            raise DeadlineExceeded("the deadline passed before the call could be sent")
        credentials = self._credentials
        if not credentials.vouch:
            owner = ""
        prefix = self._prefixes.get((path, owner))
        if prefix is None:
            if len(self._prefixes) >= MAX_PREFIXES:  # one per (path, client): bounded
                self._prefixes.clear()
            prefix = self._prefixes[(path, owner)] = h2client.request_prefix(
                path, self._authority, tls=credentials.tls, extra=credentials.headers(owner)
            )
        block = h2client.encode_request(prefix, encode_grpc_timeout(remaining)) if tell else prefix
        h2c = self._h2
        stream_id = h2c.send_request(block, payload)  # a small request: queued whole
        whole = stream_id is not None
        if stream_id is None:
            if not h2c.can_open:
                raise ChannelError("the connection takes no new streams", unprocessed=True)
            stream_id = h2c.open_stream(block)
        call = self._calls[stream_id] = Call(self, stream_id, on_done, deadline, release)
        if whole:
            call.sent = True
        else:
            call.hold(payload)
            if not self._push(call):
                self._blocked.append(call)
        self._watch(deadline, stream_id)
        self._unsent += 1
        if self._unsent >= FLUSH_EVERY:
            self._flush()
        elif not self._flush_scheduled:
            self._schedule_flush()
        return call

    def close(self) -> None:
        """GOAWAY and close; calls still open fail (as possibly executed)."""
        if self._transport is not None and self.closed is None:
            self._h2.close_connection()
            self._flush()
        self._fail("the gateway closed the connection")

    # ---------------------------------------------------------------- private: sending

    def _push(self, call: Call) -> bool:
        """Queue as much of ``call``'s request as the windows allow; True when all is."""
        h2c, pending = self._h2, call.pending
        while pending:
            if not h2c.send_pieces(call.stream_id, pending, end_stream=True, most=MAX_CHUNK):
                return False
            if pending:
                self._flush()  # a large request: write as it goes
        call.sent = True
        return True

    def _unblock(self) -> None:
        while self._blocked:
            call = self._blocked[0]
            if call.stream_id not in self._calls or call.sent:
                self._blocked.popleft()
                continue
            if not self._push(call):
                return
            self._blocked.popleft()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._held.flush_soon(self._loop, self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._unsent = 0
        data = self._h2.data_to_send()
        if data and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    # ---------------------------------------------------------------- private: ending calls

    def _finish(self, call: Call, reply: Reply | ChannelError) -> None:
        """Forget ``call`` and run its callbacks (once)."""
        self._calls.pop(call.stream_id, None)
        call.chunks = []
        release, call.release = call.release, None
        if release is not None:
            release()
        on_done, call.on_done = call.on_done, None
        if on_done is not None:
            try:
                on_done(reply)
            except Exception:  # the caller's bug: it must not end this connection
                log.exception("handling the answer of stream %d failed", call.stream_id)
        if self.closed is None and not self._calls and not self.usable:
            # Drained after the worker's GOAWAY (or with its stream ids spent): close.
            self._fail("drained")

    def _reset(self, call: Call) -> None:
        """RST_STREAM CANCEL: the worker cancels the call."""
        if self.closed is None:
            self._h2.reset(call.stream_id, ErrorCodes.CANCEL)
            self._schedule_flush()

    def _reset_later(self, call: Call) -> None:
        """Reset ``call``'s stream after :data:`DEADLINE_RESET_GRACE` if the worker has not
        ended it by then (its own deadline should have, if it was told; a call it was not
        told the deadline of waits the same grace, so that a short
        ``request_timeout_seconds`` does not make its reset premature to the worker)."""
        stream_id = call.stream_id

        def reset_if_open() -> None:
            if self.closed is None and stream_id in self._h2.streams:
                self._h2.reset(stream_id, ErrorCodes.CANCEL)
                self._flush()

        self._loop.call_later(DEADLINE_RESET_GRACE, reset_if_open)

    def _watch(self, deadline: float, stream_id: int) -> None:
        """Put a call's deadline in the heap; (re)arm the timer if it is the earliest."""
        heap = self._deadlines
        if len(heap) >= 2 * len(self._calls) + 64:
            # Mostly answered calls' entries: rebuild from the open calls.
            heap[:] = [(c.deadline, sid) for sid, c in self._calls.items() if sid != stream_id]
            heapq.heapify(heap)
        heapq.heappush(heap, (deadline, stream_id))
        if deadline < self._timer_at:
            self._arm(deadline)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self._loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        """The earliest deadline came: expire every call whose deadline has passed."""
        limit = max(self._timer_at, self._loop.time())
        self._timer, self._timer_at = None, math.inf
        heap, calls = self._deadlines, self._calls
        while heap and heap[0][0] <= limit:
            call = calls.get(heapq.heappop(heap)[1])
            if call is not None:  # else answered already
                self._expire(call)
        if heap and self.closed is None:
            self._arm(heap[0][0])

    def _expire(self, call: Call) -> None:
        self._finish(
            call,
            Reply(
                StatusCode.DEADLINE_EXCEEDED,
                "deadline exceeded: the worker did not answer before the deadline",
            ),
        )
        self._reset_later(call)

    def _abandon(self, call: Call) -> None:
        """The caller is gone: reset at once, unless its deadline passed (then the worker
        ends the call itself, see :data:`DEADLINE_RESET_GRACE`)."""
        if call.stream_id not in self._calls:
            return
        if self._loop.time() >= call.deadline:
            self._finish(call, ChannelError("deadline", unprocessed=not call.sent))
            self._reset_later(call)
        else:
            self._reset(call)
            self._finish(call, ChannelError("cancelled", unprocessed=not call.sent))

    def _fail(self, reason: str) -> None:
        """The connection is unusable: every open call fails."""
        if self.closed is None:
            self.closed = reason
        for call in list(self._calls.values()):
            self._finish(call, ChannelError(reason, unprocessed=not call.sent))
        self._blocked.clear()
        self._deadlines.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    # ---------------------------------------------------------------- private: events

    def _on_headers(self, event: ResponseReceived | TrailersReceived) -> None:
        call = self._calls.get(event.stream_id)
        if call is None:
            return
        headers = event.headers
        # Keyed by the tuple's identity: the decoder gives a block that comes again the
        # same tuple, and the entry holds it, so its id is not reused while remembered.
        hit = self._said.get(id(headers))
        if hit is not None and hit[0] is headers:
            said = hit[1]
        else:
            said = _header_fields(headers)
            if len(self._said) >= MAX_BLOCKS_REMEMBERED:
                self._said.clear()  # starts over, as the decoder's own cache does
            self._said[id(headers)] = (headers, said)
        http_status, grpc_status, grpc_message = said
        if grpc_status is not None:
            call.grpc_status = grpc_status
        if grpc_message is not None:
            call.grpc_message = grpc_message
        if http_status is not None and event.__class__ is ResponseReceived:
            call.http_status = http_status
        if event.stream_ended is not None:
            self._finish(call, _reply_of(call))

    def _on_data(self, event: DataReceived) -> None:
        call = self._calls.get(event.stream_id)
        if call is None:
            return
        data = event.data
        call.received += len(data)
        if call.received > self._max_reply + 5:
            self._reset(call)
            self._finish(
                call,
                Reply(
                    StatusCode.RESOURCE_EXHAUSTED,
                    f"the worker's response exceeds {self._max_reply} bytes "
                    "(the gateway's grpc.max_send_msg_bytes); use shared memory for outputs "
                    "this large",
                ),
            )
            return
        call.chunks.append(data)
        if event.stream_ended is not None:  # no trailers: not a gRPC answer
            self._finish(call, _reply_of(call))

    def _on_reset(self, event: StreamReset) -> None:
        """The worker reset the stream, or broke a stream's rule and we reset it."""
        call = self._calls.get(event.stream_id)
        if call is None:
            return
        code = _code_name(event.error_code)
        if event.remote_reset:
            what = f"the worker reset the stream ({code})"
        else:
            what = f"stream error from the worker ({code}); stream reset"
        refused = event.remote_reset and event.error_code == ErrorCodes.REFUSED_STREAM
        self._finish(call, ChannelError(what, unprocessed=refused or not call.sent))

    def _on_goaway(self, event: ConnectionTerminated) -> None:
        # Streams above the worker's last one were never processed; the others are
        # answered as usual, and the connection closes when the last one is.
        reason = f"the worker sent GOAWAY ({_code_name(event.error_code)})"
        for call in list(self._calls.values()):
            if call.stream_id > event.last_stream_id:
                self._finish(call, ChannelError(reason, unprocessed=True))
        if not self._calls:
            self._fail(reason)

    def _on_window(self, event: WindowUpdated | RemoteSettingsChanged) -> None:
        self._unblock()  # a send window grew: blocked requests may go on


def _code_name(code: int) -> str:
    try:
        return ErrorCodes(code).name
    except ValueError:
        return f"HTTP/2 error code {code:#x}"


#: ``(:status, grpc-status, grpc-message)`` of a header block, None where absent.
_Said = tuple[int | None, StatusCode | None, str | None]
#: Distinct header blocks remembered per connection (error messages vary; the rest repeat).
MAX_BLOCKS_REMEMBERED = 64


def _header_fields(headers: tuple[tuple[bytes, bytes], ...]) -> _Said:
    """What a response header block or trailer block says (the last of a repeated field).
    A grpc-status that names no code reads as UNKNOWN; an HTTP status that is not a number
    as 0 (not 200)."""
    http_status = grpc_status = None
    grpc_message = None
    for name, value in headers:
        if name == b"grpc-status":
            grpc_status = parse_grpc_status(value)
        elif name == b"grpc-message":
            grpc_message = unquote(value.decode("ascii", "replace"))
        elif name == b":status":
            http_status = int(value) if value.isdigit() else 0
    return http_status, grpc_status, grpc_message


def _reply_of(call: Call) -> Reply:
    """The gRPC answer of a stream that ended."""
    if call.http_status != 200:
        status = status_for_http(call.http_status)  # gRPC's table (grpcwire.HTTP_TO_GRPC)
        return Reply(status, f"the worker answered HTTP status {call.http_status}, not gRPC")
    if call.grpc_status is None:
        return Reply(StatusCode.INTERNAL, "the worker's answer carried no grpc-status")
    if call.grpc_status != _OK:
        return Reply(call.grpc_status, call.grpc_message)
    chunks = call.chunks
    data = chunks[0] if len(chunks) == 1 else memoryview(b"".join(chunks))
    if len(data) < 5 or data[0] != 0 or int.from_bytes(data[1:5], "big") != len(data) - 5:
        return Reply(
            StatusCode.INTERNAL, "the worker's answer is not one uncompressed gRPC message"
        )
    return Reply(_OK, "", data)
