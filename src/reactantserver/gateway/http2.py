"""The client side of HTTP/2, as much as unary gRPC calls need, sans-IO.

Why not h2
----------
h2 implements all of HTTP/2 for any peer and pays for it on every frame: a frame object
per frame, a state machine step per event, a debug ``repr`` of each frame, and an HPACK
encoder that searches its table linearly for every header it sends. A client over h2 cost
about 140 us of CPU per unary call (a third of the gateway's budget per forwarded request);
one over this module costs about 78 us for the same calls (docs/benchmarks.md, "The
gateway"). It does what a unary gRPC client needs and nothing else.

What it implements (RFC 9113, client side): the connection preface and SETTINGS (acknowledged
both ways); HEADERS and CONTINUATION out and in; DATA out and in with both levels of flow
control (our receive windows are replenished with WINDOW_UPDATE as data arrives); RST_STREAM
both ways; PING answered; GOAWAY read (streams above the peer's last one are reported as
unprocessed; those at or below it go on, unlike h2, which stops reading at a GOAWAY) and
written; PRIORITY and unknown frame types ignored; PUSH_PROMISE refused
(push is disabled in our SETTINGS); padding stripped; the peer's SETTINGS_MAX_FRAME_SIZE,
SETTINGS_INITIAL_WINDOW_SIZE and SETTINGS_MAX_CONCURRENT_STREAMS obeyed.

HPACK (:mod:`reactantserver.transport.hpack_blocks`, shared with the worker's server side):
our request headers are written as literals that never enter the dynamic table
(:func:`encode_request`), so nothing is searched and the worker's decoder table never
changes; the worker's header blocks are decoded with the ``hpack`` library (every block,
also those of streams we reset, so that the decoder's table stays in step), and a block that
cannot change the table -- the worker's answers are literals too -- once per connection.

Theory of operation
-------------------
:class:`ClientConnection` takes bytes in (:meth:`~ClientConnection.receive`, returning
events) and queues bytes out (:meth:`~ClientConnection.data_to_send`); it never touches a
socket or a clock. Events are tuples, first element the kind:

``("headers", stream_id, ((name, value), ...), end_stream)`` (a tuple: the decoder's own,
shared by every block of the same bytes)
``("data", stream_id, memoryview, end_stream)``  -- a view of the bytes read
``("reset", stream_id, error_code)``
``("goaway", last_stream_id, error_code)``
``("window", 0, None)``                       -- send windows grew: blocked data may go

A peer that breaks the protocol raises :class:`ProtocolError`; the connection is then
unusable (the caller closes the socket).

Invariants (``tests/test_gateway_http2.py``, against h2's server side as the oracle): every
byte we write parses as valid HTTP/2 for h2; whatever h2 sends we decode to the same
headers and data however the bytes are split; we never send more DATA than the peer's
windows allow, nor a frame larger than its maximum frame size.
"""

from __future__ import annotations

import hpack
from hpack.hpack import DEFAULT_MAX_HEADER_LIST_SIZE

from ..transport.h2wire import (
    ACK,
    CANCEL,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    FRAME_HEAD,
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
    WINDOW_UPDATE,
    frame,
    frame_head,
)
from ..transport.hpack_blocks import BlockDecoder, encode_headers, hpack_int, literal

Event = tuple[str, int, object, object]


class ProtocolError(Exception):
    """The peer broke HTTP/2; the connection cannot continue."""


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
    """A request header block: ``prefix`` (:func:`request_prefix`) and ``grpc-timeout``."""
    if grpc_timeout is None:
        return prefix
    value = grpc_timeout.encode("ascii")
    return b"".join((prefix, _TIMEOUT_NAME, hpack_int(len(value), 7, 0), value))


def _raw_field(name: bytes, value: bytes) -> tuple[bytes, bytes]:
    return name, value


class _Stream:
    __slots__ = ("recv_unacked", "send_window")

    def __init__(self, send_window: int) -> None:
        self.send_window = send_window
        self.recv_unacked = 0


class ClientConnection:
    """One HTTP/2 client connection's state (see the module docstring)."""

    def __init__(
        self,
        *,
        stream_window: int = 16 * 1024 * 1024,
        connection_window: int = 64 * 1024 * 1024,
        max_frame_size: int = 1024 * 1024,
    ) -> None:
        self._out: list[bytes | memoryview] = []
        self._in = bytearray()  # a frame split across reads, until its end arrives
        self._need = 0  # ... and how many bytes that takes
        self._decoder: BlockDecoder[tuple[bytes, bytes]] = BlockDecoder(
            _raw_field, DEFAULT_MAX_HEADER_LIST_SIZE
        )
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1
        # What we advertise: our receive windows and frame size.
        self._stream_window = stream_window
        self._connection_window = connection_window
        self._max_frame_in = max_frame_size
        self._recv_unacked = 0
        # What the peer allows us.
        self.peer_max_frame = DEFAULT_FRAME
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_streams = MAX_WINDOW
        self.send_window = DEFAULT_WINDOW
        # A header block in progress: (stream id, end_stream, fragments).
        self._block: tuple[int, bool, list[bytes]] | None = None
        #: The peer's GOAWAY: no new streams on this connection.
        self.goaway_received = False

    # ---------------------------------------------------------------- sending

    def initiate(self) -> None:
        """The preface, our SETTINGS and the connection window's growth."""
        settings = b"".join(
            key.to_bytes(2, "big") + value.to_bytes(4, "big")
            for key, value in (
                (SETTINGS_ENABLE_PUSH, 0),
                (SETTINGS_INITIAL_WINDOW_SIZE, self._stream_window),
                (SETTINGS_MAX_FRAME_SIZE, self._max_frame_in),
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
            raise ProtocolError("no new stream may be opened on this connection")
        stream_id = self._next_id
        self._next_id += 2
        self._streams[stream_id] = _Stream(self.peer_initial_window)
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
        self._streams[stream_id] = _Stream(self.peer_initial_window - size)
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
            raise ProtocolError(f"stream {stream_id} is not open")
        size = len(data)
        if size > min(stream.send_window, self.send_window):
            raise ProtocolError("DATA larger than the flow-control window")
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

    def reset(self, stream_id: int, code: int = CANCEL) -> None:
        """RST_STREAM: we are done with ``stream_id`` (late frames for it are ignored)."""
        if self._streams.pop(stream_id, None) is not None:
            self._out.append(frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big")))

    def close(self, code: int = NO_ERROR) -> None:
        """GOAWAY: we open no more streams (the peer learns our last stream was none)."""
        payload = (0).to_bytes(4, "big") + code.to_bytes(4, "big")
        self._out.append(frame(GOAWAY, 0, 0, payload))

    def data_to_send(self) -> bytes:
        """Everything queued to send, as one buffer (empty when nothing is)."""
        out = self._out
        if not out:
            return b""
        data = out[0] if len(out) == 1 and isinstance(out[0], bytes) else b"".join(out)
        out.clear()
        return data

    @property
    def pending_bytes(self) -> int:
        return sum(len(chunk) for chunk in self._out)

    # ---------------------------------------------------------------- receiving

    def receive(self, data: bytes) -> list[Event]:
        """Feed bytes read from the socket; the events they complete.

        Payloads are views of the bytes read (DATA is not copied here); a frame split
        across reads waits in a buffer for its end.
        """
        if self._in:
            self._in += data
            if len(self._in) < self._need:
                return []
            data = bytes(self._in)
            self._in.clear()
        view = memoryview(data)
        events: list[Event] = []
        pos = 0
        end = len(data)
        unpack = FRAME_HEAD.unpack_from
        while end - pos >= 9:
            high, low, kind, flags, stream_id = unpack(data, pos)
            length = high << 8 | low
            if length > MAX_FRAME_CEILING:
                raise ProtocolError(f"a frame of {length} bytes")
            if end - pos < 9 + length:
                break
            stream_id &= MAX_STREAM_ID
            payload = view[pos + 9 : pos + 9 + length]
            pos += 9 + length
            if kind == DATA and self._block is None:  # the usual frame, at once
                self._data_in(flags, stream_id, payload, events)
            else:
                self._frame_in(kind, flags, stream_id, payload, events)
        if pos < end:
            self._in += view[pos:]
            left = end - pos
            self._need = 9 if left < 9 else 9 + int.from_bytes(data[pos : pos + 3], "big")
        return events

    def _frame_in(
        self, kind: int, flags: int, stream_id: int, payload: memoryview, events: list[Event]
    ) -> None:
        if self._block is not None and kind != CONTINUATION:
            raise ProtocolError("a header block was interrupted by another frame")
        if kind == DATA:
            self._data_in(flags, stream_id, payload, events)
        elif kind == HEADERS:
            if stream_id == 0:
                raise ProtocolError("HEADERS on stream 0")
            fragment = _unpad(payload) if flags & PADDED else payload
            if flags & PRIORITY_FLAG:
                fragment = fragment[5:]
            if flags & END_HEADERS:  # a whole block in one frame: the usual
                self._headers_in(stream_id, bool(flags & END_STREAM), bytes(fragment), events)
            else:
                self._block = (stream_id, bool(flags & END_STREAM), [bytes(fragment)])
        elif kind == CONTINUATION:
            if self._block is None or self._block[0] != stream_id:
                raise ProtocolError("CONTINUATION without its HEADERS")
            self._block[2].append(bytes(payload))
            if flags & END_HEADERS:
                self._end_block(events)
        elif kind == RST_STREAM:
            if len(payload) != 4:
                raise ProtocolError("RST_STREAM of the wrong size")
            if self._streams.pop(stream_id, None) is not None:
                events.append(("reset", stream_id, int.from_bytes(payload, "big"), None))
        elif kind == SETTINGS:
            if not flags & ACK:
                self._settings_in(payload, events)
        elif kind == PING:
            if not flags & ACK:
                self._out.append(frame(PING, ACK, 0, bytes(payload)))
        elif kind == GOAWAY:
            if len(payload) < 8:
                raise ProtocolError("GOAWAY too short")
            last = int.from_bytes(payload[:4], "big") & MAX_STREAM_ID
            self.goaway_received = True
            events.append(("goaway", last, int.from_bytes(payload[4:8], "big"), None))
        elif kind == WINDOW_UPDATE:
            if len(payload) != 4:
                raise ProtocolError("WINDOW_UPDATE of the wrong size")
            increment = int.from_bytes(payload, "big") & MAX_WINDOW
            if stream_id == 0:
                self.send_window += increment
                if self.send_window > MAX_WINDOW:
                    raise ProtocolError("the connection's send window overflowed")
            else:
                stream = self._streams.get(stream_id)
                if stream is None:
                    return
                stream.send_window += increment
            events.append(("window", 0, None, None))
        elif kind == PUSH_PROMISE:
            raise ProtocolError("PUSH_PROMISE although push is disabled")
        # PRIORITY and unknown frame types are ignored (RFC 9113 5.5).

    def _data_in(
        self, flags: int, stream_id: int, payload: memoryview, events: list[Event]
    ) -> None:
        flow = len(payload)  # padding counts against the windows too
        self._recv_unacked += flow
        if self._recv_unacked >= self._connection_window // 2:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, self._recv_unacked.to_bytes(4, "big")))
            self._recv_unacked = 0
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # a stream we reset: the connection window is all that counts
        data = _unpad(payload) if flags & PADDED else payload
        end = bool(flags & END_STREAM)
        if end:
            del self._streams[stream_id]
        else:
            stream.recv_unacked += flow
            if stream.recv_unacked >= self._stream_window // 2:
                increment = stream.recv_unacked.to_bytes(4, "big")
                self._out.append(frame(WINDOW_UPDATE, 0, stream_id, increment))
                stream.recv_unacked = 0
        events.append(("data", stream_id, data, end))

    def _end_block(self, events: list[Event]) -> None:
        assert self._block is not None
        stream_id, end, fragments = self._block
        self._block = None
        self._headers_in(stream_id, end, b"".join(fragments), events)

    def _headers_in(self, stream_id: int, end: bool, block: bytes, events: list[Event]) -> None:
        try:
            headers = self._decoder.decode(block)
        except hpack.HPACKError as exc:
            raise ProtocolError(f"undecodable header block: {exc}") from None
        if stream_id not in self._streams:
            return  # decoded for the table's sake; nobody waits for it
        if end:
            del self._streams[stream_id]
        events.append(("headers", stream_id, headers, end))

    def _settings_in(self, payload: memoryview, events: list[Event]) -> None:
        if len(payload) % 6:
            raise ProtocolError("SETTINGS of the wrong size")
        for at in range(0, len(payload), 6):
            key = int.from_bytes(payload[at : at + 2], "big")
            value = int.from_bytes(payload[at + 2 : at + 6], "big")
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError("SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self._streams.values():
                    stream.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= MAX_FRAME_CEILING:
                    raise ProtocolError(f"SETTINGS_MAX_FRAME_SIZE {value} out of range")
                self.peer_max_frame = value
            elif key == SETTINGS_MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
            elif key == SETTINGS_HEADER_TABLE_SIZE:
                pass  # limits an encoder table we never use
        self._out.append(frame(SETTINGS, ACK, 0))
        events.append(("window", 0, None, None))


def _unpad(payload: memoryview) -> memoryview:
    """A PADDED frame's payload without its padding (the callers test the flag: most
    frames have none)."""
    if not payload or payload[0] >= len(payload):
        raise ProtocolError("padding longer than the frame")
    return payload[1 : len(payload) - payload[0]]
