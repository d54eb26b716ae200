"""Unary calls served by the connection's event handling: no task, no stream object.

A *direct* method (a :class:`DirectHandler` in the server's mapping, next to grpclib
``Handler``\\ s) is served without the per-call machinery of the task path
(:mod:`.server`): no asyncio task, no stream object with its buffer and wake-ups, no
deadline timer. The connection's events processor (:mod:`.h2guard`) collects the request
message as its DATA arrives and, when the stream ends, calls the handler synchronously
with a :class:`UnaryCall` and the message; the handler answers later -- from any callback
on the loop -- with :meth:`UnaryCall.answer` or :meth:`UnaryCall.fail`, exactly once. It
is made for a handler that only passes the call on (the gateway forwarding ModelInfer to a
worker: the answer arrives in the worker connection's ``data_received``), where the task
path's machinery was a third of the work per call.

Theory of operation
-------------------
One :class:`DirectCalls` per connection holds its direct calls by stream id. Everything
the wire checks (:mod:`.h2guard`: the stream limit, the headers, the message framing and
size, premature resets) applies unchanged; this module adds, per call:

* **Receiving.** DATA payloads are kept as the views the connection parsed (no copy) and
  acknowledged at once: the framer has already bounded the stream to one message of at
  most ``max_message_bytes``. At END_STREAM the handler gets the message without its
  5-byte prefix: a view of the one payload that holds it, or the payloads joined once.
* **Compressed messages.** A call with ``grpc-encoding`` whose message carries the
  compressed flag is inflated before its handler sees it (:mod:`.core.compression`), a step
  per pass of the loop, within the message limit; a refusal answers the call and the
  handler never runs. Its answer's headers say what is accepted (``grpc-accept-encoding``).
* **Deadlines.** A call whose deadline passed before its message was complete is answered
  DEADLINE_EXCEEDED without reaching the handler. After that the deadline
  (:attr:`UnaryCall.deadline`, loop time) is the handler's to keep: the gateway's worker
  connection already runs a timer per call, and a second one here would double the cost.
* **Answering.** :meth:`UnaryCall.answer` writes the initial headers, the message framed
  from its pieces in DATA frames of at most :data:`SEND_CHUNK` bytes and the OK trailers,
  as far as the peer's flow-control windows allow; the rest waits, without a task, for
  WINDOW_UPDATE (:meth:`DirectCalls.window`) or for the transport to drain
  (:meth:`DirectCalls.resume`). An answer that fits one frame and the windows -- nearly
  every one -- is queued in one step (``send_answer`` of the lean connection: the same
  bytes, the stream checked once). :meth:`UnaryCall.fail` answers trailers-only.
* **Cancelling.** When the peer resets the stream or the connection goes, the call's
  :attr:`UnaryCall.on_cancel` runs (once, if the handler set one and had not answered):
  the handler drops its work. Nothing is written for such a call.
* **Releasing.** Every call is released exactly once -- answered in full, failed,
  cancelled or refused -- through the processor's release callback (given to
  :class:`DirectCalls`, called with the stream id), which frees its slot under
  ``max_concurrent_streams``. A forgotten call keeps no reference to its handler's
  ``on_cancel``, so a handler object and its call leave no cycle behind.

Exceptions from a handler or its ``on_cancel`` are our bugs: logged with their traceback,
the call answered INTERNAL with the fixed message; they never reach the connection.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

import attrs
from grpclib.metadata import encode_grpc_message

from reactantserver.errors import bounded
from reactantserver.grpcwire import StatusCode
from reactantserver.status import INTERNAL_MESSAGE

from ..h2 import events as h2events
from ..h2.server import CONSTANT_BLOCKS
from .core.compression import Inflater, accepting
from .core.framing import HeadersPassed, Refusal
from .core.limits import Fault

if TYPE_CHECKING:
    from ..h2.server import ServerConnection

log = logging.getLogger(__name__)

#: The initial headers and the OK trailers of every unary answer (built once).
ANSWER_HEADERS = [(":status", "200"), ("content-type", "application/grpc+proto")]
OK_TRAILERS = [("grpc-status", "0")]
#: The initial headers of the answer to a compressed request (:mod:`.core.compression`).
ACCEPTING_ANSWER_HEADERS = accepting(ANSWER_HEADERS)
# Sent on every call: their (table-independent) HPACK blocks are encoded once.
CONSTANT_BLOCKS.remember(ANSWER_HEADERS)
CONSTANT_BLOCKS.remember(OK_TRAILERS)
CONSTANT_BLOCKS.remember(ACCEPTING_ANSWER_HEADERS)
#: The most answer bytes handed to the connection as one DATA frame (see server.py).
SEND_CHUNK = 256 * 1024


@attrs.frozen
class DirectHandler:
    """A mapping entry served without a task (module docstring): ``func(call, message)``
    starts the work and returns; the call is answered later through ``call``."""

    func: Callable[[UnaryCall, bytes | memoryview], None]


@attrs.frozen(eq=False)
class DirectAdmission(HeadersPassed[DirectHandler, float]):
    """A request for a direct method whose headers passed; its deadline is loop time."""

    unary_request = True


def send_frames(h2: ServerConnection, sid: int, pending: collections.deque[memoryview],
                output: Output) -> bool:  # fmt: skip
    """Queue ``pending`` on stream ``sid`` in DATA frames, at most :data:`SEND_CHUNK`
    bytes at a time, each handed to the transport at once (bounded memory), as far as the
    windows and the transport allow: False when it must wait for a WINDOW_UPDATE or a
    drained transport, True once all is queued. The frames' payloads are the pieces'
    views, not copied."""
    while pending:
        if not output.writable or not h2.send_pieces(
            sid, pending, end_stream=False, most=SEND_CHUNK
        ):
            output.flush()
            return False
        if pending:
            output.flush()
    return True


def _flags(chunks: list[memoryview]) -> int:
    """The flags byte of the message in a stream's DATA payloads (the framer has seen
    its whole prefix)."""
    return next(chunk[0] for chunk in chunks if len(chunk))


def _message(chunks: list[memoryview]) -> bytes | memoryview:
    """The message of a stream's DATA payloads, without its 5-byte prefix: a view of the
    one payload that holds it, else the payloads after the prefix joined once."""
    if len(chunks) == 1:
        return chunks[0][5:]
    skip = 5
    parts: list[memoryview] = []
    for chunk in chunks:
        if skip >= len(chunk):
            skip -= len(chunk)
            continue
        parts.append(chunk[skip:] if skip else chunk)
        skip = 0
    return b"".join(parts)


def message_size(parts: Sequence[bytes | memoryview]) -> int:
    """The bytes of the message ``b"".join(parts)``, without joining them."""
    size = 0
    for part in parts:
        size += len(part) if isinstance(part, bytes) else part.nbytes
    return size


def framed(
    parts: Sequence[bytes | memoryview], size: int | None = None
) -> tuple[tuple[bytes | memoryview, ...], int]:
    """A gRPC message's pieces: its 5-byte prefix, then ``parts`` as they are (none
    copied), and its size in bytes, prefix included. ``size``: the message's, when the
    caller knows it (:func:`message_size` otherwise)."""
    if size is None:
        size = message_size(parts)
    return (b"\x00" + size.to_bytes(4, "big"), *parts), size + 5


def message_pieces(
    parts: Sequence[bytes | memoryview],
) -> tuple[collections.deque[memoryview], int]:
    """A gRPC message (:func:`framed`) as byte views, and its size in bytes, prefix
    included."""
    pieces, size = framed(parts)
    return byte_views(pieces), size


def byte_views(pieces: Iterable[bytes | memoryview]) -> collections.deque[memoryview]:
    """The non-empty ``pieces`` as flat byte views (none copied), in order."""
    return collections.deque(memoryview(p).cast("B") for p in pieces if len(p))


def status_headers(code: int, message: str | None, *, headers_sent: bool, http_status: int = 200,
                   extra: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:  # fmt: skip
    """The header block that ends a call with ``code`` (and ``message``, if not None):
    trailers after the initial headers, or a trailers-only answer (``:status`` and
    content type first)."""
    status = [("grpc-status", str(int(code))), *extra]
    if message is not None:
        status.insert(1, ("grpc-message", _grpc_message(message)))
    if headers_sent:
        return status
    return [(":status", str(http_status)), ("content-type", "application/grpc+proto"), *status]


#: Bytes of an encoded ``grpc-message`` at most: clients' metadata limits (gRPC's default is
#: 8 KiB for all of a response's headers) must leave room for the rest.
MAX_GRPC_MESSAGE = 4096


def _grpc_message(message: str) -> str:
    """``message`` percent-encoded for ``grpc-message``, bounded (:func:`reactantserver.errors.bounded`,
    then tighter if its encoding is still too long: non-ASCII text encodes up to 9x)."""
    encoded: str = encode_grpc_message(bounded(message))
    if len(encoded) > MAX_GRPC_MESSAGE:
        encoded = encode_grpc_message(bounded(message, MAX_GRPC_MESSAGE // 9))
    return encoded


class Output(Protocol):
    """The connection's asyncio side, as the calls write through it (:mod:`.h2guard`)."""

    #: The transport takes writes (False while the peer reads slower than we write).
    writable: bool

    def flush(self) -> None:
        """Hand what the connection queued to the transport."""
        ...


class Answers(Output, Protocol):
    """The connection's count of answer bytes waiting for the peer (:mod:`.h2guard`)."""

    def answer_waits(self, delta: int) -> None:
        """``delta`` more (negative: fewer) answer bytes wait for the peer."""
        ...

    def room_for(self, size: int) -> bool:
        """Whether an answer of ``size`` bytes may wait (``max_unsent_bytes``)."""
        ...

    def unread_refusal(self, size: int) -> str:
        """The message of an answer refused for the unread ones before it."""
        ...


def waiting_bytes(pending: collections.deque[memoryview]) -> int:
    """The bytes of an answer's views not yet handed to the connection."""
    return sum(view.nbytes for view in pending)


class UnaryCall:
    """One direct call, from its complete request to its answer (module docstring)."""

    __slots__ = ("_calls", "_chunks", "_done", "_handler", "_pending", "_waiting", "deadline",
                 "head", "on_cancel", "owner", "received_at", "stream_id")  # fmt: skip

    def __init__(self, calls: DirectCalls, stream_id: int, admitted: DirectAdmission) -> None:
        self._calls = calls
        #: The handler, until the message is handed to it.
        self._handler: DirectHandler | None = admitted.handler
        self.stream_id = stream_id
        #: What the request's headers said (path, timeout as sent, user agent).
        self.head = admitted.head
        #: Loop time by which the call must be answered (None: no deadline).
        self.deadline = admitted.deadline
        #: Whose shared-memory regions the call may use (:mod:`.core.auth`).
        self.owner = admitted.owner
        #: Loop time of the read that completed the request (set when it is handed over).
        self.received_at = 0.0
        #: Set by the handler: runs once if the call is cancelled before it is answered.
        self.on_cancel: Callable[[], None] | None = None
        self._chunks: list[memoryview] = []
        #: The answer's bytes not yet handed to the connection (flow control), and how many
        #: of them the connection counts as waiting.
        self._pending: collections.deque[memoryview] | None = None
        self._waiting = 0
        self._done = False

    @property
    def path(self) -> str:
        return self.head.path

    @property
    def peer(self) -> str:
        """The client's address (``host:port``)."""
        return self._calls.peer

    def __repr__(self) -> str:
        return f"UnaryCall({self.path}, stream {self.stream_id} of {self.peer})"

    @property
    def done(self) -> bool:
        """Answered (or being answered), failed or cancelled: nothing more may be sent."""
        return self._done

    def answer(self, parts: Sequence[bytes | memoryview], size: int | None = None) -> None:
        """Answer OK with the message ``b"".join(parts)`` (of ``size`` bytes, when the
        caller knows it). The pieces are not joined here: a small answer's are copied
        once, into the connection's write; a larger one's frames take views of them
        (``DirectCalls.answer``)."""
        self._answer(*framed(parts, size))

    def answer_framed(self, framed: bytes | memoryview) -> None:
        """Answer OK with a message already in gRPC's framing (its 5-byte prefix, then the
        message: what a proxy received), sent as the view it is."""
        view = framed if type(framed) is memoryview else memoryview(framed)
        self._answer((view,), view.nbytes)

    def _answer(self, pending: Sequence[bytes | memoryview], size: int) -> None:
        if self._done:
            return  # cancelled meanwhile: nobody to answer
        self._done = True
        self._calls.answer(self, pending, size)

    def fail(self, code: int, message: str) -> None:
        """Answer ``code`` with ``message`` (trailers-only)."""
        if self._done:
            return
        self._done = True
        self._calls.fail(self, code, message)


class DirectCalls:
    """The direct calls of one connection (module docstring)."""

    def __init__(
        self,
        h2: ServerConnection,
        guard: Answers,
        peer: str,
        fault: Callable[[Fault, str], None],
        released: Callable[[int], None],
        clock: Callable[[], float],
        *,
        message_limit: tuple[int, str] = (0, ""),
        later: Callable[[Callable[[], None]], object] | None = None,
    ) -> None:
        self._h2 = h2
        #: The connection's asyncio side: ``flush`` and ``writable``.
        self._guard = guard
        self._peer = peer
        #: Reports a client's mistake (the connection's fault log and counters).
        self._fault = fault
        #: Frees a call's stream slot (by stream id), once, when the call is forgotten.
        self._released = released
        #: The loop's clock, read where a deadline is judged.
        self._clock = clock
        #: What a compressed message may inflate to, and the setting that says so.
        self._limit, self._limit_key = message_limit
        #: Runs a callback on a later pass of the loop (the next step of an inflation).
        self._later = later
        #: The open calls by stream id (the processor reads it: which streams are direct).
        self.calls: dict[int, UnaryCall] = {}
        #: Answers waiting for the peer's window or a drained transport, in order (read,
        #: not changed, by the processor: while it is empty a WINDOW_UPDATE changes nothing).
        self.blocked: dict[int, UnaryCall] = {}

    @property
    def peer(self) -> str:
        return self._peer

    # ---------------------------------------------------------------- the processor's side

    def open(self, stream_id: int, admitted: DirectAdmission) -> None:
        """A stream whose headers admitted it to a direct method."""
        self.calls[stream_id] = UnaryCall(self, stream_id, admitted)

    def data(self, stream_id: int, data: memoryview, flow_controlled_length: int) -> None:
        """A DATA payload the framer accepted: kept, and acknowledged at once."""
        self.calls[stream_id]._chunks.append(data)
        if flow_controlled_length:
            self._h2.acknowledge_received_data(flow_controlled_length, stream_id)

    def ended(self, stream_id: int, now: float) -> None:
        """END_STREAM after a whole message (read at loop time ``now``): hand it to the
        handler, unless its deadline has passed by now (the clock read again: a deadline
        shorter than the handling of the read is not met)."""
        call = self.calls[stream_id]
        handler, call._handler = call._handler, None
        assert handler is not None  # END_STREAM ends a stream once
        chunks, call._chunks = call._chunks, []
        call.received_at = now
        if call.deadline is not None and self._clock() >= call.deadline:
            text = (
                "deadline exceeded before the call started "
                f"(grpc-timeout {call.head.timeout_text!r})"
            )
            self._fault(Fault.EXPIRED_ON_ARRIVAL, text)
            call.fail(StatusCode.DEADLINE_EXCEEDED, text)
            return
        message = _message(chunks)
        if call.head.compressed and _flags(chunks) == 1:
            setting = self._limit_key or "the message limit"
            inflater = Inflater(message, call.head.encoding, self._limit, setting)
            self._inflate(call, handler, inflater)
            return
        self._handle(call, handler, message)

    def _handle(self, call: UnaryCall, handler: DirectHandler, message: bytes | memoryview) -> None:
        try:
            handler.func(call, message)
        except Exception:
            log.exception("%s failed with an unexpected error", call.path)
            call.fail(StatusCode.INTERNAL, INTERNAL_MESSAGE)

    def _inflate(self, call: UnaryCall, handler: DirectHandler, inflater: Inflater) -> None:
        """One step of a compressed message's inflation (:mod:`.core.compression`); the next
        on a later pass of the loop, so the other calls are served in between. A call
        reset or gone meanwhile is dropped."""
        if call.done or self.calls.get(call.stream_id) is not call:
            return
        result = inflater.step()
        if result is None:
            if self._later is None:  # no loop to come back on: finish it now
                result = inflater.run()
            else:
                self._later(lambda: self._inflate(call, handler, inflater))
                return
        if isinstance(result, Refusal):
            self._fault(result.fault, result.message)
            call.fail(result.code, result.message)
            return
        self._handle(call, handler, result)

    def cancel(self, stream_id: int) -> None:
        """The peer reset the stream, or it was refused: the handler drops its work."""
        call = self.calls.get(stream_id)
        if call is None:
            return
        already, on_cancel = call._done, call.on_cancel
        call._done = True
        self._forget(call)
        if not already and on_cancel is not None:
            try:
                on_cancel()
            except Exception:
                log.exception("cancelling %s failed", call.path)

    def window(self, stream_id: int) -> None:
        """The peer's window grew (stream 0: the connection's): blocked answers go on
        (the processor calls it only while one is blocked)."""
        if stream_id:
            call = self.blocked.pop(stream_id, None)
            if call is not None:
                self._pump(call)
        else:
            self.resume()

    def resume(self) -> None:
        """The transport drained (or a window grew): every blocked answer goes on."""
        blocked, self.blocked = self.blocked, {}
        for call in blocked.values():
            if call.stream_id in self.calls:
                self._pump(call)

    def close(self) -> None:
        """The connection is gone: every call still open is cancelled."""
        for stream_id in list(self.calls):
            self.cancel(stream_id)

    # ---------------------------------------------------------------- answering

    def answer(self, call: UnaryCall, pending: Sequence[bytes | memoryview], size: int) -> None:
        """Send ``pending`` (``size`` bytes: the framed message, in pieces) and OK's
        trailers: a small answer whole, in one step (its pieces joined into the write),
        a larger one frame by frame, each frame's payload views of the pieces."""
        sid = call.stream_id
        if sid not in self.calls:
            return
        conn = self._h2
        try:
            headers = ACCEPTING_ANSWER_HEADERS if call.head.compressed else ANSWER_HEADERS
            # A small answer goes out whole, in one step (else frame by frame, below).
            if size <= SEND_CHUNK and conn.send_answer(sid, headers, pending, size, OK_TRAILERS):
                self._guard.flush()
                self._forget(call)
                return
            if not self._guard.room_for(size):  # unread answers before it: not one more
                self.fail(call, StatusCode.RESOURCE_EXHAUSTED, self._guard.unread_refusal(size))
                return
            conn.send_headers(sid, headers)
        except h2events.ProtocolError:
            self._gone(call)
            return
        call._pending = byte_views(pending)
        self._pump(call)

    def fail(self, call: UnaryCall, code: int, message: str) -> None:
        if call.stream_id not in self.calls:
            return
        try:
            self._h2.send_headers(
                call.stream_id, status_headers(code, message, headers_sent=False), end_stream=True
            )
        except h2events.ProtocolError:
            self._gone(call)
            return
        self._guard.flush()
        self._forget(call)

    def _gone(self, call: UnaryCall) -> None:
        """The stream or the connection closed under an answer (our GOAWAY, a reset the
        processor has not seen yet): nobody to answer; the call is only released."""
        log.debug("%r: closed before its answer", call)
        self._forget(call)

    def _pump(self, call: UnaryCall) -> None:
        """Send what the windows allow of ``call``'s answer; its trailers once all is out."""
        try:
            self._pump_frames(call)
        except h2events.ProtocolError:
            self._gone(call)

    def _pump_frames(self, call: UnaryCall) -> None:
        conn = self._h2
        sid = call.stream_id
        assert call._pending is not None
        if not send_frames(conn, sid, call._pending, self._guard):
            self.blocked[sid] = call  # until a WINDOW_UPDATE or the transport drains
            left = waiting_bytes(call._pending)
            if left != call._waiting:
                self._guard.answer_waits(left - call._waiting)
                call._waiting = left
            return
        if call._waiting:
            self._guard.answer_waits(-call._waiting)
            call._waiting = 0
        call._pending = None
        conn.send_headers(sid, OK_TRAILERS, end_stream=True)
        self._guard.flush()
        self._forget(call)

    def _forget(self, call: UnaryCall) -> None:
        sid = call.stream_id
        if self.calls.pop(sid, None) is None:
            return
        self.blocked.pop(sid, None)
        if call._waiting:  # cancelled, or the stream closed, with part of it unsent
            self._guard.answer_waits(-call._waiting)
            call._waiting = 0
        call._handler = None
        call._pending = None
        call._chunks = []
        # The handler's cancel hook is usually its own bound method: kept, it would tie
        # the handler and the call into a cycle that only the cyclic collector frees.
        call.on_cancel = None
        try:
            self._released(sid)
        except Exception:
            log.exception("releasing stream %d of %s failed", sid, self._peer)
