"""Streams of unary requests served without a task: ``ModelStreamInfer``.

A *stream method* (a :class:`StreamHandler` in the server's mapping) carries many
independent requests on one HTTP/2 stream, each answered by exactly one message on the
same stream, and the call ends with its status once the client has ended its side and
every request is answered (Triton's ``ModelStreamInfer`` for a model that answers once per
request). Serving it needs no task either: each request takes the path of a unary direct
call (:mod:`.unary`), begun synchronously when its message is complete and answered later
from any callback on the loop.

Theory of operation
-------------------
One :class:`StreamCall` per stream, made by the sink (:mod:`.server`) when the request's
headers pass, is the stream's ``Receiver`` in the connection's event handling
(:mod:`.h2guard`: ``received``, ``ended``, ``wake``, ``drop``). Everything the wire checks
applies unchanged: the framer bounds each message to ``max_message_bytes`` (an oversized
one ends the whole call with RESOURCE_EXHAUSTED before its body is accepted, as gRPC
does), the abuse budget counts the stream, a reset or a lost connection cancels it.

* **Requests.** Messages are cut out of the DATA as they complete: a message inside one
  DATA payload stays a view of it; one that spans payloads is joined once. Each becomes a
  :class:`StreamedRequest` -- what a handler of one request needs of its call
  (:class:`RequestCall`: ``answer``, ``answer_framed``, ``fail``, ``on_cancel``,
  ``deadline``, ``peer``, ``received_at``; a :class:`.unary.UnaryCall` has the same) --
  handed to ``handler.begin`` at once. The request's deadline is the call's
  (``grpc-timeout``); the request's own ``timeout`` parameter is the handler's to read.
  On a call with a ``grpc-encoding``, a message flagged compressed is inflated first
  (:mod:`.core.compression`: within the message limit, a step per pass of the loop), keeping
  its place in the order; a refusal (a bomb, a broken stream) answers that request.
* **Order.** Answers leave in the order the requests arrived, as Triton writes them for a
  model that is not decoupled: an answer that is ready waits behind an earlier one that
  is not, and an error answers in its request's place too. A client that sets no ids can
  match answers to requests by position.
* **Bounds: the stream pauses.** At most ``limits.stream_requests`` requests, and about
  ``limits.stream_bytes`` bytes of their messages, are *owed* on one stream: begun (or
  answered) and not yet written out. At either bound the stream is paused: what arrives
  is kept as it came, not cut into requests and not acknowledged, so the client's window
  closes within one stream window (``limits.stream_window``) and it stops sending. As
  answers leave the stream resumes: the kept bytes are cut into requests, and the
  window reopens once they are all begun. A client that sends without reading closes our
  send window on its side: its answers wait, what is owed stays at the bound, and the
  server holds at most the owed requests, one stream window of kept bytes and the
  message being received. Small DATA payloads are gathered into one buffer while kept,
  so a window of one-byte frames is one buffer, not millions of views.
* **Answering.** Each answer is the handler's message wrapped into the stream's response
  message (``handler.head``: for ModelStreamInfer the head of a
  ``ModelStreamInferResponse`` before the ``ModelInferResponse`` pieces, which are not
  joined; ``handler.error`` for a failed request), framed from its pieces in DATA frames of at most :data:`.unary.SEND_CHUNK` bytes as the windows
  allow; the rest waits for WINDOW_UPDATE or a drained transport (``wake``), without a
  task. The response headers go with the first answer.
* **Ending.** Once the client has ended its side and nothing is owed or kept: OK
  trailers. The call's deadline has one timer: past it every request still owed is
  withdrawn (its ``on_cancel``), answers not yet written are dropped, and the call ends
  DEADLINE_EXCEEDED. A reset by the client, a refusal by the framer or a lost
  connection withdraws every request owed and writes nothing. :meth:`StreamCall.drain`
  (a server stopping) ends the call with the given status as soon as nothing is owed.
* **Releasing.** Every stream is released exactly once, through the sink's release
  callback, which frees its slot under ``max_concurrent_streams``.
* **Held and unread** (:mod:`.h2guard`). A stream counts as a working call only while it
  owes requests: an open stream with nothing owed leaves its connection to the idle
  timeout and to eviction when the connection table is full. Answers waiting for the
  client's window count in the connection's unread answers (``max_unsent_bytes``,
  ``send_timeout``), as a unary call's do.

Exceptions from a handler or an ``on_cancel`` are our bugs: logged with their traceback,
the request answered (in the stream) INTERNAL with the fixed message.

Invariants (``tests/transport/test_wire_streaming.py``): every request whose message completed is
answered exactly once in the stream, in arrival order, unless the call ended first; then
it is withdrawn exactly once. What is owed never exceeds ``stream_requests`` requests;
what is kept, one stream window beyond the message being received (HTTP/2 flow control
holds the client to it once no more is acknowledged).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import attrs

from reactantserver.grpcwire import StatusCode
from reactantserver.status import INTERNAL_MESSAGE

from ..h2 import events as h2events
from .core.compression import Inflater
from .core.framing import HeadersPassed, Refusal, take_bytes
from .core.limits import WireLimits
from .unary import (
    ACCEPTING_ANSWER_HEADERS,
    ANSWER_HEADERS,
    OK_TRAILERS,
    message_pieces,
    send_frames,
    status_headers,
    waiting_bytes,
)

if TYPE_CHECKING:
    from .h2guard import GuardedProtocol

log = logging.getLogger(__name__)

#: DATA payloads smaller than this are gathered into one buffer while they are kept.
GATHER_BELOW = 1024

Pieces = Sequence[bytes | memoryview]


class RequestCall(Protocol):
    """One request as its handler sees it, on its own call (:class:`.unary.UnaryCall`) or
    on a stream (:class:`StreamedRequest`): answered once, cancelled through ``on_cancel``."""

    #: Loop time by which the call must be answered (None: the client set none).
    deadline: float | None
    #: Loop time of the read that completed the request.
    received_at: float
    #: Set by the handler: runs once if the request is cancelled before it is answered.
    on_cancel: Callable[[], None] | None
    #: Who the call is (:mod:`.core.auth`): whose shared-memory regions it may name.
    owner: str

    @property
    def peer(self) -> str: ...
    @property
    def done(self) -> bool: ...
    def answer(self, parts: Pieces, size: int | None = None) -> None: ...
    def answer_framed(self, framed: bytes | memoryview) -> None: ...
    def fail(self, code: int, message: str) -> None: ...


@attrs.frozen
class StreamHandler:
    """A mapping entry for a stream of unary requests (module docstring)."""

    #: ``begin(request, message)``: start one request's work and return; it is answered
    #: later through ``request``.
    begin: Callable[[StreamedRequest, bytes | memoryview], None]
    #: ``head(n)``: the bytes that make an answer of ``n`` bytes the stream's response
    #: message (for ModelStreamInfer, the tag and length of ``infer_response``).
    head: Callable[[int], bytes]
    #: The stream's response message carrying a request's error: ``error(message, code,
    #: text)``, ``message`` the request's own bytes.
    error: Callable[[bytes | memoryview, int, str], list[bytes | memoryview]]
    #: Called with each new stream (in the sink's ``accept``): where the server keeps its
    #: streams, to drain them. It may set the stream's ``on_close``.
    opened: Callable[[StreamCall], None] | None = None


@attrs.frozen(eq=False)
class StreamAdmission(HeadersPassed[StreamHandler, float]):
    """A request for a stream method whose headers passed; its deadline (loop time) is
    the whole call's, and every request of the stream is its owner's."""

    unary_request = False


class StreamedRequest:
    """One request on a stream, from its complete message to its answer (module
    docstring); its handler answers it like a unary call."""

    __slots__ = ("_answer", "_done", "_message", "_stream", "deadline", "on_cancel",
                 "owner", "received_at", "size")  # fmt: skip

    def __init__(self, stream: StreamCall, message: bytes | memoryview, size: int) -> None:
        self._stream: StreamCall | None = stream
        #: The request's bytes, until it is answered (the error answer names its id).
        self._message: bytes | memoryview | None = message
        #: Its bytes on the wire (prefix included): what it counts against the bound.
        self.size = size
        self.deadline = stream.deadline
        self.owner = stream.owner
        self.received_at = stream.read_at
        self.on_cancel: Callable[[], None] | None = None
        #: The answer, framed as the stream's response message, until it is written.
        self._answer: collections.deque[memoryview] | None = None
        self._done = False

    @property
    def peer(self) -> str:
        return self._stream.peer if self._stream is not None else ""

    @property
    def done(self) -> bool:
        """Answered, failed or withdrawn: nothing more may be sent for it."""
        return self._done

    def __repr__(self) -> str:
        return f"StreamedRequest({self._stream!r})"

    def answer(self, parts: Pieces, size: int | None = None) -> None:
        """Answer with the message ``b"".join(parts)`` (wrapped for the stream; the
        pieces are not joined). ``size`` is not needed: the views are counted as they
        are made."""
        stream = self._settle()
        if stream is not None:
            views: collections.deque[memoryview] = collections.deque()
            size = 0
            for part in parts:
                view = memoryview(part).cast("B")
                if view.nbytes:
                    views.append(view)
                    size += view.nbytes
            views.appendleft(stream.prefix(size))
            self._answer = views
            stream.settled()

    def answer_framed(self, framed: bytes | memoryview) -> None:
        """Answer with a message in gRPC's framing (a worker's answer, as it came)."""
        stream = self._settle()
        if stream is not None:
            view = memoryview(framed).cast("B")
            self._answer = collections.deque((stream.prefix(view.nbytes - 5), view[5:]))
            stream.settled()

    def fail(self, code: int, message: str) -> None:
        """Answer the request's error in the stream (the call goes on)."""
        request = self._message
        stream = self._settle()
        if stream is not None:
            assert request is not None
            self._answer, _ = message_pieces(stream.handler.error(request, code, message))
            stream.settled()

    def _settle(self) -> StreamCall | None:
        if self._done:
            return None  # withdrawn meanwhile, or answered already
        self._done = True
        self._message = None
        self.on_cancel = None
        return self._stream

    def withdraw(self) -> None:
        """The call ended before this request was answered: its handler drops its work."""
        self._stream = None
        self._message = None
        self._answer = None
        if self._done:
            return
        self._done = True
        on_cancel, self.on_cancel = self.on_cancel, None
        if on_cancel is not None:
            try:
                on_cancel()
            except Exception:
                log.exception("cancelling a streamed request failed")


class StreamCall:
    """One stream of a stream method (module docstring)."""

    def __init__(
        self,
        guard: GuardedProtocol,
        sid: int,
        admitted: StreamAdmission,
        limits: WireLimits,
        loop: asyncio.AbstractEventLoop,
        release: Callable[[], None],
    ) -> None:
        assert guard.h2 is not None
        self._guard = guard
        self._h2 = guard.h2
        self._loop = loop
        self.id = sid
        self.handler = admitted.handler
        self.head = admitted.head
        self.deadline = admitted.deadline
        self.owner = admitted.owner
        self.peer = guard.peer
        self._max_requests = limits.stream_requests
        self._max_bytes = limits.stream_bytes
        self._release_slot: Callable[[], None] | None = release
        #: Set by whoever keeps the stream (``StreamHandler.opened``): runs once at its end.
        self.on_close: Callable[[], None] | None = None
        #: Requests owed, in arrival order, and the bytes of their messages.
        self._owed: collections.deque[StreamedRequest] = collections.deque()
        self._owed_bytes = 0
        #: Received and not yet cut into requests: payload views (or gathered bytes),
        #: small payloads gathered in ``_gather``, their size, the length of the message
        #: being cut (-1: its prefix is not read yet), and flow-controlled bytes not yet
        #: acknowledged.
        self._chunks: collections.deque[bytes | memoryview] = collections.deque()
        self._gather = bytearray()
        self._kept = 0
        self._length = -1
        self._flags = 0
        self._unacked = 0
        #: What a compressed message may inflate to, and the setting that says so; the
        #: answers' initial headers (they say what is accepted when the call has an
        #: encoding: the gRPC compression spec's rule).
        self._inflate_limit = (limits.max_message_bytes, limits.names.max_message_bytes)
        self._answer_headers = (
            ACCEPTING_ANSWER_HEADERS if admitted.head.compressed else ANSWER_HEADERS
        )
        #: The head answer's bytes not yet handed to the connection, and how many of them
        #: the connection counts as waiting for the client (``answer_waits``).
        self._pending: collections.deque[memoryview] | None = None
        self._waiting = 0
        self._headers_sent = False
        self._peer_ended = False
        #: The status to end with once nothing is owed (:meth:`drain`).
        self._ending: tuple[int, str] | None = None
        self._released = False
        #: Re-entrancy: an answer settled inside ``_advance`` asks for another pass.
        self._busy = False
        self._again = False
        self._timer: asyncio.TimerHandle | None = None
        if admitted.deadline is not None:
            self._timer = loop.call_at(admitted.deadline, self._expired)
        if admitted.handler.opened is not None:
            admitted.handler.opened(self)
        # Nothing owed yet: an open stream alone keeps its connection neither busy nor
        # safe from eviction (h2guard), or a client could pin connections with empty ones.
        guard.call_rests(sid)

    def __repr__(self) -> str:
        return f"StreamCall({self.head.path}, stream {self.id} of {self.peer})"

    @property
    def read_at(self) -> float:
        return self._guard.read_at

    @property
    def owed(self) -> int:
        """Requests begun (or answered) and not yet written out."""
        return len(self._owed)

    @property
    def kept(self) -> int:
        """Bytes received and not yet cut into requests."""
        return self._kept

    @property
    def paused(self) -> bool:
        """At a bound: what arrives is kept, not cut into requests nor acknowledged."""
        return len(self._owed) >= self._max_requests or self._owed_bytes >= self._max_bytes

    # ---------------------------------------------------------------- the connection's side

    def received(self, data: memoryview, flow_controlled_length: int) -> None:
        """A DATA payload the framer accepted."""
        self._unacked += flow_controlled_length
        if not self._kept and not self.paused and not self._busy:
            # Nothing kept: cut the whole messages straight out of this payload. Answers
            # settled meanwhile are written by the pass below, once for the payload.
            self._busy = True
            try:
                data = self._cut_from(data)
            finally:
                self._busy = False
        if data:
            self._keep(data)
        self._advance()

    def ended(self) -> None:
        """The client ended its side (after whole messages: the framer checked)."""
        self._peer_ended = True
        self._advance()

    def wake(self) -> None:
        """A window grew or the transport drained: a blocked answer may go on."""
        if self._pending is not None:
            self._advance()

    def drop(self) -> int:
        """Forget what was kept; the flow-controlled bytes not acknowledged."""
        self._chunks.clear()
        self._gather = bytearray()
        self._kept = 0
        unacked, self._unacked = self._unacked, 0
        return unacked

    def cancel(self) -> None:
        """Reset by the client or refused by the framer: every request owed is withdrawn,
        nothing is written. Each one not yet answered counts in the connection's abuse
        budget as a call the peer reset (a stream must not let a client start and cancel
        32 requests for the price of one reset)."""
        if not self._released:
            self._guard.calls_reset([r.received_at for r in self._owed if not r.done])
        self._close()

    def close(self) -> None:
        """The connection is gone: every request owed is withdrawn."""
        self._close()

    # ---------------------------------------------------------------- the server's side

    def drain(self, code: int, message: str) -> None:
        """End the call with ``code`` and ``message`` as soon as nothing is owed (the
        server stops). Never ends it within this call: the caller may be the sink's
        ``accept``, before the connection knows the stream."""
        if self._ending is None:
            self._ending = (code, message)
        self._loop.call_soon(self._advance)

    def settled(self) -> None:
        """A request owed was answered: write what is ready (called by the request)."""
        self._advance()

    def prefix(self, size: int) -> memoryview:
        """The gRPC prefix and the handler's head of a response message around an answer
        of ``size`` bytes."""
        head = self.handler.head(size)
        return memoryview(b"\x00" + (size + len(head)).to_bytes(4, "big") + head)

    # ---------------------------------------------------------------- receiving

    def _keep(self, data: memoryview) -> None:
        if len(data) < GATHER_BELOW:
            self._gather += data
        else:
            if self._gather:
                self._chunks.append(bytes(self._gather))
                self._gather.clear()
            self._chunks.append(data)
        self._kept += len(data)

    def _cut_from(self, data: memoryview) -> memoryview:
        """Begin each whole message at the front of ``data`` while not paused; the rest."""
        pos, end = 0, len(data)
        owed, most = self._owed, self._max_requests  # (self.paused, inlined: per message)
        while (
            end - pos >= 5
            and len(owed) < most
            and self._owed_bytes < self._max_bytes
            and not self._released
        ):
            length = int.from_bytes(data[pos + 1 : pos + 5], "big")
            if end - pos - 5 < length:
                break
            start = pos + 5
            flags, pos = data[pos], start + length
            self._begin(data[start:pos], length + 5, flags)
        return data[pos:]

    def _take(self, n: int) -> bytes | memoryview:
        """The next ``n`` kept bytes: a view when they lie in one piece."""
        if not n:
            return b""  # an empty message (proto3: all fields at their defaults)
        if self._gather:
            self._chunks.append(bytes(self._gather))
            self._gather.clear()
        self._kept -= n
        chunks = self._chunks
        first = chunks[0]
        if len(first) >= n:
            if len(first) == n:
                chunks.popleft()
            else:
                chunks[0] = memoryview(first)[n:]
            return memoryview(first)[:n]
        return take_bytes(chunks, n)

    def _cut_kept(self) -> None:
        """Begin the whole messages among the kept bytes while not paused."""
        while not self.paused and not self._released:
            if self._length < 0:
                if self._kept < 5:
                    return
                prefix = bytes(self._take(5))
                self._flags, self._length = prefix[0], int.from_bytes(prefix[1:], "big")
            if self._kept < self._length:
                return
            length, self._length = self._length, -1
            self._begin(self._take(length), length + 5, self._flags)

    def _begin(self, message: bytes | memoryview, size: int, flags: int) -> None:
        """A request whose message is complete: it is owed from now on, in its place."""
        request = StreamedRequest(self, message, size)
        self._owed.append(request)
        self._owed_bytes += size
        self._guard.calls_started(1)
        if len(self._owed) == 1:
            self._guard.call_works(self.id)  # owed something: at work (h2guard's idle rule)
        if flags == 1:  # (the framer lets the flag through only on a call with an encoding)
            limit, setting = self._inflate_limit
            self._inflate(request, Inflater(message, self.head.encoding, limit, setting))
        else:
            self._handle(request, message)

    def _handle(self, request: StreamedRequest, message: bytes | memoryview) -> None:
        try:
            self.handler.begin(request, message)
        except Exception:
            log.exception("%s failed with an unexpected error", self.head.path)
            request.fail(StatusCode.INTERNAL, INTERNAL_MESSAGE)

    def _inflate(self, request: StreamedRequest, inflater: Inflater) -> None:
        """One step of a compressed request's inflation (:mod:`.core.compression`), the next
        on a later pass of the loop, so that other calls are served in between; the
        request keeps its place in the stream's order meanwhile. Inflated, it counts
        against the stream's bound by its inflated size; refused (a bomb, a broken
        stream), it is answered with the refusal in the stream, which goes on."""
        if request.done or self._released:
            return  # withdrawn meanwhile
        result = inflater.step()
        if result is None:
            self._loop.call_soon(self._inflate, request, inflater)
            return
        if isinstance(result, Refusal):
            self._guard.fault(result.fault, result.message)
            request.fail(result.code, result.message)
            return
        grown = len(result) + 5 - request.size
        request.size += grown
        self._owed_bytes += grown
        request._message = result  # what an error answer reads the request's id from
        self._handle(request, result)

    def _acknowledge(self) -> None:
        """Give the window back for what arrived, unless the stream is paused (what is
        kept then is a message still arriving, which must be let in whatever its size)."""
        if self._unacked and not self.paused and not self._released:
            self._h2.acknowledge_received_data(self._unacked, self.id)
            self._unacked = 0

    # ---------------------------------------------------------------- the one step

    def _advance(self) -> None:
        """Write the answers that are ready, in order; cut and begin kept messages while
        not paused; give the window back; end the call when it is over."""
        if self._busy:
            self._again = True
            return
        if self._released:
            return
        self._busy = True
        try:
            while True:
                self._again = False
                blocked = not self._write_ready()
                if self._released:
                    break
                self._cut_kept()
                self._acknowledge()
                if self._again:
                    continue  # a request begun here was answered at once: write it
                if not blocked:
                    self._end_if_over()
                break
        except h2events.ProtocolError:
            # The stream or the connection closed under an answer (our GOAWAY, a reset
            # the processor has not seen yet): nobody to answer.
            log.debug("%r: closed before its answers", self)
            self._close()
        finally:
            self._busy = False
        self._guard.flush()

    def _write_ready(self) -> bool:
        """Write the answers at the head of the line as far as the windows allow; False
        when the next must wait for a window or the transport."""
        owed = self._owed
        h2, sid = self._h2, self.id
        while owed:
            head = owed[0]
            if self._pending is None:
                if head._answer is None:
                    return True  # the head is not answered yet: the rest waits behind it
                self._pending, head._answer = head._answer, None
                if not self._headers_sent:
                    h2.send_headers(sid, self._answer_headers)
                    self._headers_sent = True
            if not send_frames(h2, sid, self._pending, self._guard):
                self._count_waiting(waiting_bytes(self._pending))
                return False
            self._count_waiting(0)
            self._pending = None
            owed.popleft()
            self._owed_bytes -= head.size
            head._stream = None
            if not owed:
                self._guard.call_rests(sid)
        return True

    def _count_waiting(self, left: int) -> None:
        """The head answer has ``left`` bytes waiting for the client: the connection's
        count of unread answers (h2guard: ``max_unsent_bytes``, ``send_timeout``)."""
        if left != self._waiting:
            self._guard.answer_waits(left - self._waiting)
            self._waiting = left

    def _end_if_over(self) -> None:
        if self._owed:
            return
        if self._ending is not None:
            code, message = self._ending
            self._finish(code, message)
        elif self._peer_ended and not self._kept:
            self._finish(StatusCode.OK, None)

    def _expired(self) -> None:
        """The call's deadline passed with requests owed or the stream still open."""
        self._timer = None
        if self._released:
            return
        self._withdraw_all()
        text = f"deadline exceeded (grpc-timeout {self.head.timeout_text!r})"
        try:
            self._finish(StatusCode.DEADLINE_EXCEEDED, text)
        except h2events.ProtocolError:
            self._close()
        self._guard.flush()

    def _finish(self, code: int, message: str | None) -> None:
        """End the call with ``code`` (trailers; trailers-only if nothing was sent)."""
        if code == StatusCode.OK and message is None and self._headers_sent:
            headers: Sequence[tuple[str, str]] = OK_TRAILERS
        else:
            headers = status_headers(code, message, headers_sent=self._headers_sent)
        self._h2.send_headers(self.id, headers, end_stream=True)
        self._close()

    # ---------------------------------------------------------------- endings

    def _withdraw_all(self) -> None:
        owed, self._owed = self._owed, collections.deque()
        self._owed_bytes = 0
        self._pending = None
        self._count_waiting(0)
        self._guard.call_rests(self.id)
        for request in owed:
            request.withdraw()

    def _close(self) -> None:
        """Release the stream, once: requests still owed are withdrawn."""
        if self._released:
            return
        self._released = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._withdraw_all()
        release, self._release_slot = self._release_slot, None
        on_close, self.on_close = self.on_close, None
        for callback in (on_close, release):
            if callback is not None:
                try:
                    callback()
                except Exception:
                    log.exception("closing %r failed", self)
