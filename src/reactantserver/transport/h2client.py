"""The client role of HTTP/2, as much as unary gRPC calls need, sans-IO: the one
connection both of our clients use -- the gateway's to its workers
(:mod:`reactantserver.gateway.channel`) and the Python client's
(:mod:`reactantserver.client.channel`). Bytes in, events and pieces out, never a socket
or a clock.

Why not h2
----------
h2 implements all of HTTP/2 for any peer and pays for it on every frame: a frame object
per frame, a state machine step per event, a debug ``repr`` of each frame, and an HPACK
encoder that searches its table linearly for every header it sends. A client over h2 cost
about 140 us of CPU per unary call (a third of the gateway's budget per forwarded request);
one over this module costs about 78 us for the same calls (docs/benchmarks.md, "The
gateway"). And h2 copies every DATA payload several times: the Python client over it
spent 2.5x the CPU on a 38 MB ``ModelInfer`` (docs/client.md, "The connection"). Here a
message goes out as DATA frames whose payloads are views of the caller's pieces, and
comes in as views of the reads.

What it implements (RFC 9113, client side): the connection preface and SETTINGS (acknowledged
both ways); HEADERS and CONTINUATION out and in; DATA out and in with both levels of flow
control (our receive windows are replenished with WINDOW_UPDATE as data arrives); RST_STREAM
both ways; PING answered; GOAWAY read (streams above the peer's last one are reported as
unprocessed; those at or below it go on, unlike h2, which stops reading at a GOAWAY) and
written; PRIORITY and unknown frame types ignored; PUSH_PROMISE refused
(push is disabled in our SETTINGS); padding stripped; the peer's SETTINGS_MAX_FRAME_SIZE,
SETTINGS_INITIAL_WINDOW_SIZE and SETTINGS_MAX_CONCURRENT_STREAMS obeyed. DATA, HEADERS or
WINDOW_UPDATE on a stream we never opened is a connection error (RFC 9113 §5.1); late
frames on a stream we reset or that ended are ignored.

HPACK (:mod:`reactantserver.transport.hpack_blocks`, shared with the worker's server side):
our request headers are written as literals that never enter the dynamic table
(:func:`encode_request`), so nothing is searched and the worker's decoder table never
changes; the worker's header blocks are decoded with the ``hpack`` library (every block,
also those of streams we reset, so that the decoder's table stays in step), and a block that
cannot change the table -- the worker's answers are literals too -- once per connection.

Theory of operation
-------------------
:class:`ClientConnection` takes bytes in (:meth:`~ClientConnection.receive`, returning
events) and queues bytes out (:meth:`~ClientConnection.data_to_send`, one buffer, or
:meth:`~ClientConnection.pieces_to_send`, the pieces as queued); it never touches a
socket or a clock. Events are tuples, first element the kind:

``("headers", stream_id, ((name, value), ...), end_stream)`` (a tuple: the decoder's own,
shared by every block of the same bytes)
``("data", stream_id, memoryview, end_stream)``  -- a view of the bytes read
``("reset", stream_id, error_code, None)``
``("error", stream_id, error_code, message)`` -- we reset the stream: the peer broke a
stream's rule (a stream error, RFC 9113 §5.4.2)
``("goaway", last_stream_id, error_code, None)``
``("window", 0, None, None)``                 -- send windows grew: blocked data may go

A request goes out as :meth:`~ClientConnection.open_stream` (its HEADERS) and then
:meth:`~ClientConnection.send_data` (one buffer) or :meth:`~ClientConnection.send_pieces`
(a queue of views, as much as the windows allow), or, small, in one step
(:meth:`~ClientConnection.send_request`).

Frames are cut from the reads by :class:`~reactantserver.transport.h2parse.FrameReader`,
the worker's server side's reader in the client role: it judges a frame's length from its
9-byte header, a frame's stream id against its type, and the peer's first frame (its
SETTINGS, RFC 9113 §3.4), and hands over each header block whole, its CONTINUATIONs
joined. A DATA frame that arrived whole in one read is a view of that read; one split
across reads is gathered, or, with ``pieces`` (the Python client, whose answers may be
tens of MB), passed on a piece per read, each a ``data`` event (END_STREAM on the last).

A peer that breaks the protocol raises :class:`~reactantserver.transport.h2events.ProtocolError`
or a subclass of it (a connection error), whose ``error_code`` is the HTTP/2 error code for
the GOAWAY the caller sends before it closes the socket; the connection is then unusable.

What a worker makes us do for nothing is budgeted as the worker's server side budgets its
clients (:class:`~reactantserver.transport.abuse.AbuseBudget`, one per connection, given
the time with each read): PING and SETTINGS frames (each owes an answer), DATA frames that
carry nothing and end nothing, and the streams we reset on a stream error it provoked,
against the calls we started on the connection. Past the budget, :meth:`receive` raises
a ``DenialOfServiceError``, ENHANCE_YOUR_CALM (the caller sends GOAWAY and drops the
connection, as for any other connection error).

Bounds (:mod:`reactantserver.transport.h2rules`, the rules the server side holds its
clients to, with the same limits, :class:`~reactantserver.transport.limits.WireLimits`;
the reader's and ours): a frame longer than the SETTINGS_MAX_FRAME_SIZE we advertised is
FRAME_SIZE_ERROR, judged from its header before its body is buffered; a header block is
bounded in bytes (our SETTINGS_MAX_HEADER_LIST_SIZE, also advertised) and in frames (64),
ENHANCE_YOUR_CALM and PROTOCOL_ERROR; DATA past the receive window we granted, the
stream's or the connection's, is FLOW_CONTROL_ERROR; a WINDOW_UPDATE of zero is
PROTOCOL_ERROR and one overflowing a send window FLOW_CONTROL_ERROR -- on a stream a
stream error (RST_STREAM, the call fails as if the worker had reset it), on stream 0 a
connection error.

Invariants (``tests/test_h2client.py``, against h2's server side as the oracle, and its
client side for frames on streams not open): every byte we write parses as valid HTTP/2
for h2 and carries the message unchanged however it was cut into pieces; whatever h2
sends we decode to the same headers and data however the bytes are split; we never send
more DATA than the peer's windows allow, nor a frame larger than its maximum frame size;
whatever bytes a worker sends are events on our streams or a connection error (the fuzz
there).
"""

from __future__ import annotations

import collections

import hpack

from . import h2events, h2parse, h2rules
from .abuse import AbuseBudget
from .h2parse import FrameReader
from .h2rules import Violation
from .h2wire import (
    ACK,
    CANCEL,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_FRAME_CEILING,
    MAX_STREAM_ID,
    MAX_WINDOW,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_HEADER_TABLE_SIZE,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE,
    SETTINGS_MAX_HEADER_LIST_SIZE,
    WINDOW_UPDATE,
    frame,
    frame_head,
    take_views,
)
from .hpack_blocks import BlockDecoder, encode_headers, hpack_int, literal
from .limits import WireLimits

Event = tuple[str, int, object, object]
#: What goes out: our frames' bytes and views of the caller's DATA.
Piece = bytes | memoryview


def request_prefix(path: bytes, authority: bytes) -> bytes:
    """The constant part of a gRPC request's header block for ``path`` (RFC 7541 static
    table: 0x83 ``:method POST``, 0x86 ``:scheme http``, names 4 ``:path``, 1 ``:authority``,
    31 ``content-type``)."""
    return b"\x83\x86" + encode_headers(
        ((b":path", path), (b":authority", authority), (b"te", b"trailers"),
         (b"content-type", b"application/grpc"))
    )  # fmt: skip


#: ``grpc-timeout`` as a literal without indexing, up to its value's length byte.
_TIMEOUT_NAME = literal(b"grpc-timeout", b"")[:-1]


def encode_request(prefix: bytes, grpc_timeout: str | None) -> bytes:
    """A request header block: ``prefix`` (:func:`request_prefix`) and ``grpc-timeout``
    (its value as sent, e.g. ``"250m"``; none for None)."""
    if grpc_timeout is None:
        return prefix
    value = grpc_timeout.encode("ascii")
    return b"".join((prefix, _TIMEOUT_NAME, hpack_int(len(value), 7, 0), value))


def _raw_field(name: bytes, value: bytes) -> tuple[bytes, bytes]:
    return name, value


class _Stream:
    __slots__ = ("granting", "recv_left", "recv_unacked", "send_window")

    def __init__(self, send_window: int, recv_window: int) -> None:
        self.send_window = send_window
        #: What the peer may still send on the stream (what we granted, less what came),
        #: what it sent since our last WINDOW_UPDATE, and the WINDOW_UPDATEs queued but
        #: not yet handed out (:meth:`ClientConnection.data_to_send`).
        self.recv_left = recv_window
        self.recv_unacked = 0
        self.granting = 0


class ClientConnection:
    """One HTTP/2 client connection's state (see the module docstring); ``limits``: what
    we advertise and hold the peer to (the frame size, the header list size, the windows;
    the same defaults as the server side's); ``now``: the clock's reading (the one
    :meth:`receive` is given) when the connection is made; ``pieces``: a DATA frame split
    across reads is passed on a piece per read, not gathered (module docstring)."""

    def __init__(
        self, limits: WireLimits | None = None, now: float = 0.0, *, pieces: bool = False
    ) -> None:
        limits = limits if limits is not None else WireLimits()
        self._out: list[Piece] = []
        #: Cuts the peer's bytes into frames and checks what the frame headers alone
        #: show (the server side's reader, in the client role: module docstring).
        self._reader = FrameReader(
            False, limits.max_frame_size, limits.max_header_list_size, pieces=pieces
        )
        self._decoder: BlockDecoder[tuple[bytes, bytes]] = BlockDecoder(
            _raw_field, limits.max_header_list_size
        )
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1
        # What we advertise: our receive windows (the frame size and the header list
        # size are the reader's).
        self._stream_window = limits.stream_window
        self._connection_window = limits.connection_window
        #: The connection's receive window as the peer knows it: what it may still send,
        #: what it sent since our last WINDOW_UPDATE, and what we granted in
        #: WINDOW_UPDATEs queued but not yet handed out. A grant takes effect when our
        #: output leaves (:meth:`data_to_send`): bytes read before then were sent without
        #: it, so DATA beyond what the peer had been granted is caught however the reads fall.
        self._recv_left = limits.connection_window
        self._recv_unacked = 0
        self._granting = 0
        #: Streams with a WINDOW_UPDATE queued, not yet handed out.
        self._grants: list[_Stream] = []
        # What the peer allows us.
        self.peer_max_frame = DEFAULT_FRAME
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_streams = MAX_WINDOW
        self.send_window = DEFAULT_WINDOW
        #: The peer's GOAWAY: no new streams on this connection.
        self.goaway_received = False
        #: What the peer made us do for nothing (module docstring); ``streams`` counts
        #: the streams we opened, ``_now`` is the time :meth:`receive` was given.
        self.budget = AbuseBudget(now)
        self._now = now

    # ---------------------------------------------------------------- sending

    def initiate(self) -> None:
        """The preface, our SETTINGS and the connection window's growth."""
        settings = b"".join(
            key.to_bytes(2, "big") + value.to_bytes(4, "big")
            for key, value in (
                (SETTINGS_ENABLE_PUSH, 0),
                (SETTINGS_INITIAL_WINDOW_SIZE, self._stream_window),
                (SETTINGS_MAX_FRAME_SIZE, self._reader.max_frame_size),
                (SETTINGS_MAX_HEADER_LIST_SIZE, self._reader.max_header_block),
            )
        )
        self._out.append(PREFACE)
        self._out.append(frame(SETTINGS, 0, 0, settings))
        grow = self._connection_window - DEFAULT_WINDOW
        if grow > 0:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, grow.to_bytes(4, "big")))

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def can_open_ids(self) -> bool:
        """Stream ids are left (2^30 calls per connection; then a new connection)."""
        return self._next_id <= MAX_STREAM_ID

    @property
    def can_open(self) -> bool:
        """A new stream may be opened now (no GOAWAY, ids left, under the peer's limit)."""
        return (
            not self.goaway_received
            and self._next_id <= MAX_STREAM_ID
            and len(self._streams) < self.peer_max_streams
        )

    def open_stream(self, header_block: bytes, *, end_stream: bool = False) -> int:
        """Send a request's HEADERS (and CONTINUATIONs); the new stream's id."""
        if not self.can_open:
            raise h2events.ProtocolError("no new stream may be opened on this connection")
        stream_id = self._next_id
        self._next_id += 2
        self._streams[stream_id] = _Stream(self.peer_initial_window, self._stream_window)
        self.budget.streams += 1
        limit = self.peer_max_frame
        flags = END_STREAM if end_stream else 0
        if len(header_block) <= limit:
            self._out.append(frame(HEADERS, flags | END_HEADERS, stream_id, header_block))
        else:
            view = memoryview(header_block)
            self._out.append(frame(HEADERS, flags, stream_id, view[:limit]))
            for start in range(limit, len(view), limit):
                last = start + limit >= len(view)
                chunk = view[start : start + limit]
                self._out.append(frame(CONTINUATION, END_HEADERS if last else 0, stream_id, chunk))
        return stream_id

    def send_request(self, header_block: bytes, message: bytes | memoryview) -> int | None:
        """A whole small unary request in one step: HEADERS, then one DATA frame holding
        the 5-byte gRPC prefix and ``message`` (not copied), with END_STREAM -- exactly the
        bytes and state of :meth:`open_stream` followed by :meth:`send_data` of the
        prefixed message, with the checks made once. The new stream's id; None, with
        nothing queued, when the request does not go out that way (no stream may open,
        the block or the DATA frame over the peer's frame size, the message over a
        window): the caller then takes those two calls, which wait or raise."""
        size = len(message) + 5
        limit = self.peer_max_frame
        if (
            not self.can_open
            or len(header_block) > limit
            or size > limit
            or size > self.peer_initial_window
            or size > self.send_window
        ):
            return None
        stream_id = self._next_id
        self._next_id += 2
        self._streams[stream_id] = _Stream(self.peer_initial_window - size, self._stream_window)
        self.budget.streams += 1
        self.send_window -= size
        out = self._out
        out.append(frame_head(HEADERS, END_HEADERS, stream_id, len(header_block)))
        out.append(header_block)
        out.append(frame_head(DATA, END_STREAM, stream_id, size))
        out.append(b"\x00" + len(message).to_bytes(4, "big"))
        out.append(message)
        return stream_id

    def is_open(self, stream_id: int) -> bool:
        """Whether ``stream_id`` is open (neither side has ended or reset it yet)."""
        return stream_id in self._streams

    def window(self, stream_id: int) -> int:
        """Bytes of DATA that may be sent on ``stream_id`` now (0 for an unknown stream)."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        return max(0, min(stream.send_window, self.send_window))

    def send_data(self, stream_id: int, data: bytes | memoryview, *, end_stream: bool) -> None:
        """DATA frames carrying all of ``data`` (the caller checked :meth:`window`)."""
        stream = self._streams.get(stream_id)
        if stream is None:
            raise h2events.StreamClosedError(stream_id)
        size = len(data)
        if size > min(stream.send_window, self.send_window):
            raise h2events.FlowControlError("DATA larger than the flow-control window")
        stream.send_window -= size
        self.send_window -= size
        limit = self.peer_max_frame
        out = self._out
        if size <= limit:
            out.append(frame_head(DATA, END_STREAM if end_stream else 0, stream_id, size))
            out.append(data)  # not copied here: data_to_send joins everything once
            return
        view = memoryview(data)
        for start in range(0, size, limit):
            last = start + limit >= size
            chunk = view[start : start + limit]
            out.append(
                frame_head(DATA, END_STREAM if end_stream and last else 0, stream_id, len(chunk))
            )
            out.append(chunk)

    def send_pieces(
        self,
        stream_id: int,
        pending: collections.deque[memoryview],
        *,
        end_stream: bool,
        most: int = MAX_WINDOW,
    ) -> int:
        """DATA frames taking from the front of ``pending`` (byte views, left with what
        did not go) as much as the windows allow, and at most ``most`` bytes, each frame
        at most the peer's frame size and its payload views of the pieces (not copied).
        The frame that empties ``pending`` ends the stream when ``end_stream``. The
        number of bytes sent."""
        stream = self._streams.get(stream_id)
        if stream is None:
            raise h2events.StreamClosedError(stream_id)
        room = min(stream.send_window, self.send_window, most)
        limit = self.peer_max_frame
        out = self._out
        sent = 0
        while pending and room > 0:
            views, size = take_views(pending, min(room, limit))
            flags = END_STREAM if end_stream and not pending else 0
            out.append(frame_head(DATA, flags, stream_id, size))
            out += views
            room -= size
            sent += size
        if end_stream and not pending and not sent:  # an empty message's end
            out.append(frame_head(DATA, END_STREAM, stream_id, 0))
        stream.send_window -= sent
        self.send_window -= sent
        return sent

    def reset(self, stream_id: int, code: int = CANCEL) -> None:
        """RST_STREAM: we are done with ``stream_id`` (late frames for it are ignored)."""
        if self._streams.pop(stream_id, None) is not None:
            self._out.append(frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big")))

    def close(self, code: int = NO_ERROR) -> None:
        """GOAWAY: we open no more streams (the peer learns our last stream was none)."""
        payload = (0).to_bytes(4, "big") + code.to_bytes(4, "big")
        self._out.append(frame(GOAWAY, 0, 0, payload))

    def data_to_send(self) -> bytes:
        """Everything queued to send, as one buffer (empty when nothing is). The
        WINDOW_UPDATEs in it take effect now: the peer may send what they grant."""
        if self._granting or self._grants:
            self._granted()
        out = self._out
        if not out:
            return b""
        data = out[0] if len(out) == 1 and isinstance(out[0], bytes) else b"".join(out)
        out.clear()
        return data

    def pieces_to_send(self) -> list[Piece]:
        """Everything queued to send, in order, as the pieces it was queued as (a DATA
        payload: views of the caller's pieces, not copied); the WINDOW_UPDATEs in it
        take effect now, as with :meth:`data_to_send`."""
        if self._granting or self._grants:
            self._granted()
        out = self._out
        self._out = []
        return out

    def _granted(self) -> None:
        """The queued WINDOW_UPDATEs leave now: what they grant may be sent."""
        self._recv_left += self._granting
        self._granting = 0
        for stream in self._grants:
            stream.recv_left += stream.granting
            stream.granting = 0
        self._grants.clear()

    @property
    def pending_bytes(self) -> int:
        return sum(len(chunk) for chunk in self._out)

    # ---------------------------------------------------------------- receiving

    def receive(self, data: bytes, now: float) -> list[Event]:
        """Feed bytes read from the socket at ``now`` (for the abuse budget, in seconds of
        any monotonic clock); the events they complete.

        Payloads are views of the bytes read (DATA is not copied here); a frame split
        across reads waits in the reader for its end (a DATA frame, with ``pieces``, is
        passed on a piece per read).
        """
        self._now = now
        reader = self._reader
        reader.feed(data)
        events: list[Event] = []
        for kind, flags, stream_id, payload in reader:
            # The usual frames (two HEADERS and a DATA per call) at once.
            if kind == DATA:
                self._data_in(flags, stream_id, payload, events)
            elif kind == HEADERS and not flags & (PADDED | PRIORITY_FLAG):
                self._headers_in(stream_id, bool(flags & END_STREAM), bytes(payload), events)
            else:
                self._frame_in(kind, flags, stream_id, payload, events)
        return events

    def _frame_in(
        self, kind: int, flags: int, stream_id: int, payload: memoryview, events: list[Event]
    ) -> None:
        if kind == HEADERS:  # a whole header block (the reader joins CONTINUATIONs)
            block, _ = h2parse.headers(flags, payload)
            self._headers_in(stream_id, bool(flags & END_STREAM), block, events)
        elif kind == RST_STREAM:
            code = h2parse.rst_stream(payload)
            if self._streams.pop(stream_id, None) is not None:
                events.append(("reset", stream_id, code, None))
        elif kind == SETTINGS:
            self._wasted()  # one each way per connection is due; a flood is not
            values = h2parse.settings(flags, payload)
            if not flags & ACK:
                self._settings_in(values, events)
        elif kind == PING:
            self._wasted()  # we send none: an ACK is as unasked for
            opaque = h2parse.ping(payload)
            if not flags & ACK:
                self._out.append(frame(PING, ACK, 0, opaque))
        elif kind == GOAWAY:
            last, code, _ = h2parse.goaway(payload)
            self.goaway_received = True
            events.append(("goaway", last & MAX_STREAM_ID, code, None))
        elif kind == WINDOW_UPDATE:
            self._window_in(stream_id, payload, events)
        elif kind == CONTINUATION:
            raise h2events.ProtocolError("CONTINUATION without its HEADERS")
        elif kind == PUSH_PROMISE:
            raise h2events.ProtocolError("PUSH_PROMISE although push is disabled")
        # PRIORITY and unknown frame types are ignored (RFC 9113 5.5).

    def _window_in(self, stream_id: int, payload: memoryview, events: list[Event]) -> None:
        if len(payload) != 4:
            raise h2events.FrameDataMissingError("WINDOW_UPDATE of the wrong size")
        increment = int.from_bytes(payload, "big") & MAX_WINDOW
        if stream_id == 0:
            broken = h2rules.window_update(increment, self.send_window, 0)
            if broken is not None:
                raise _error(broken)
            self.send_window += increment
        else:
            stream = self._streams.get(stream_id)
            if stream is None:
                if self._is_idle(stream_id):
                    raise h2events.NoSuchStreamError(stream_id)
                return  # closed: late frames are ignored (RFC 9113 §6.9)
            broken = h2rules.window_update(increment, stream.send_window, stream_id)
            if broken is not None:
                self._stream_error(stream_id, broken, events)
                return
            stream.send_window += increment
        events.append(("window", 0, None, None))

    def _data_in(
        self, flags: int, stream_id: int, payload: memoryview, events: list[Event]
    ) -> None:
        flow = len(payload)  # padding counts against the windows too
        if not flow and not flags & END_STREAM:
            self._wasted()  # carries nothing and ends nothing
        left = self._recv_left - flow
        if left < 0:  # past the window we granted
            raise _error(h2rules.received(flow, self._recv_left, "the connection"))
        self._recv_left = left
        unacked = self._recv_unacked + flow
        if unacked >= self._connection_window // 2:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, unacked.to_bytes(4, "big")))
            self._granting += unacked
            unacked = 0
        self._recv_unacked = unacked
        stream = self._streams.get(stream_id)
        if stream is None:
            if self._is_idle(stream_id):
                raise h2events.NoSuchStreamError(stream_id)
            return  # a stream we reset: the connection window is all that counts
        left = stream.recv_left - flow
        if left < 0:
            raise _error(h2rules.received(flow, stream.recv_left, f"stream {stream_id}"))
        stream.recv_left = left
        data = h2parse.data(flags, payload)[0] if flags & PADDED else payload
        end = bool(flags & END_STREAM)
        if end:
            del self._streams[stream_id]
        else:
            unacked = stream.recv_unacked + flow
            if unacked >= self._stream_window // 2:
                self._out.append(frame(WINDOW_UPDATE, 0, stream_id, unacked.to_bytes(4, "big")))
                stream.granting += unacked
                self._grants.append(stream)
                unacked = 0
            stream.recv_unacked = unacked
        events.append(("data", stream_id, data, end))

    def _stream_error(self, stream_id: int, broken: Violation, events: list[Event]) -> None:
        """The peer broke a stream's rule: RST_STREAM with its code, the stream forgotten,
        and an ``error`` event for whoever waits on it (RFC 9113 §5.4.2)."""
        del self._streams[stream_id]
        self._out.append(frame(RST_STREAM, 0, stream_id, broken.code.to_bytes(4, "big")))
        events.append(("error", stream_id, broken.code, broken.message))
        self._judge(self.budget.provoked_resets(1))

    def _is_idle(self, stream_id: int) -> bool:
        """``stream_id`` was never opened (by us: the peer may open none, push being
        disabled): DATA, HEADERS or WINDOW_UPDATE on it is a connection error (RFC 9113
        §5.1, as the server side and h2 hold it; RST_STREAM and PRIORITY are ignored)."""
        return stream_id >= self._next_id or not stream_id & 1

    def _wasted(self) -> None:
        """The peer sent a frame that asks for nothing (module docstring)."""
        self._judge(self.budget.wasted_frames(1, self._now))

    def _judge(self, verdict: str | None) -> None:
        """Past the abuse budget (a verdict): a connection error, ENHANCE_YOUR_CALM."""
        if verdict is not None:
            raise h2events.DenialOfServiceError(verdict)

    def _headers_in(self, stream_id: int, end: bool, block: bytes, events: list[Event]) -> None:
        try:
            headers = self._decoder.decode(block)
        except hpack.HPACKError as exc:
            raise h2events.ProtocolError(f"undecodable header block: {exc}") from None
        if stream_id not in self._streams:
            if self._is_idle(stream_id):
                raise h2events.NoSuchStreamError(stream_id)
            return  # decoded for the table's sake; nobody waits for it
        if end:
            del self._streams[stream_id]
        events.append(("headers", stream_id, headers, end))

    def _settings_in(self, values: dict[int, int], events: list[Event]) -> None:
        for key, value in values.items():
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise h2events.FlowControlError("SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self._streams.values():
                    stream.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= MAX_FRAME_CEILING:
                    raise h2events.ProtocolError(f"SETTINGS_MAX_FRAME_SIZE {value} out of range")
                self.peer_max_frame = value
            elif key == SETTINGS_MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
            elif key == SETTINGS_HEADER_TABLE_SIZE:
                pass  # limits an encoder table we never use
        self._out.append(frame(SETTINGS, ACK, 0))
        events.append(("window", 0, None, None))


def _error(broken: Violation | None) -> h2events.ProtocolError:
    """The connection error for a rule's violation (the caller's own comparison already
    found one)."""
    assert broken is not None
    return h2events.ProtocolError(broken.message, broken.code)
