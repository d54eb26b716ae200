"""The client's HTTP/2, as much as unary gRPC calls need, sans-IO: bytes in, events and
pieces out, never a socket or a clock.

Why our own
-----------
The client used to keep h2's connection under grpclib's ``Channel`` and reshape both
through their private attributes so that a large tensor was not copied on its way
(h2 and grpclib copy every DATA payload several times, and cut received messages
into 16 KiB frames). With grpclib's public API only, a 38 MB ``ModelInfer`` costs the
client 2.5x the CPU (docs/client.md, "The connection"). This module is that
connection without h2: it sends a message given as pieces -- the caller's tensors
among them -- as DATA frames whose payloads are views of those pieces, and reads
frames by slicing what arrives (a DATA frame spanning reads is passed on a piece per
read: its payload is never gathered here).

It follows the gateway's client to its workers (:mod:`reactantserver.gateway.http2`):
the same events, the same bounds from :mod:`reactantserver.transport.h2rules`, the same
wire numbers (:mod:`~reactantserver.transport.h2wire`) and HPACK blocks
(:mod:`~reactantserver.transport.hpack_blocks`), so that both move onto the transport's
one HTTP/2 core together.

What it implements (RFC 9113, client side): the preface and SETTINGS (acknowledged both
ways); HEADERS and CONTINUATION out and in; DATA out and in with both levels of flow
control (our receive windows replenished with WINDOW_UPDATE once half is used);
RST_STREAM both ways; PING answered; GOAWAY read (streams above the peer's last one are
reported, those at or below it go on) and written; PRIORITY and unknown frames ignored;
PUSH_PROMISE refused (push is off in our SETTINGS); padding stripped; the peer's
SETTINGS_MAX_FRAME_SIZE, INITIAL_WINDOW_SIZE and MAX_CONCURRENT_STREAMS obeyed.

Events (tuples, the kind first)::

    ("headers", stream_id, ((name, value), ...), end_stream)   # bytes pairs
    ("data", stream_id, memoryview, end_stream)                # a view of the bytes read
    ("reset", stream_id, error_code, None)                     # the peer reset it
    ("error", stream_id, error_code, message)                  # we reset it: the peer broke
                                                               # a stream's rule (§5.4.2)
    ("goaway", last_stream_id, error_code, None)
    ("window", 0, None, None)                                  # blocked DATA may go on

A peer that breaks a connection's rule raises :class:`ProtocolError`, whose ``code`` the
caller's GOAWAY carries before it closes the socket.

Bounds (as the server side holds its clients to): a frame longer than the
SETTINGS_MAX_FRAME_SIZE we advertised (judged from its 9-byte header), a header block
past our SETTINGS_MAX_HEADER_LIST_SIZE or spanning more than 64 frames, DATA past a
receive window we granted, a WINDOW_UPDATE of zero or one overflowing a send window (on a
stream: a stream error).

Invariants (``tests/test_client_http2.py``, h2's server side the oracle): whatever we
write parses as valid HTTP/2 for h2 and carries the message unchanged however it was cut
into pieces; we never send more DATA than the peer's windows allow, nor a frame larger
than its SETTINGS_MAX_FRAME_SIZE; what h2 sends we decode to the same headers and data
however the bytes are split into reads.
"""

from __future__ import annotations

import collections

import hpack

from reactantserver.transport import h2rules
from reactantserver.transport.h2rules import Violation
from reactantserver.transport.h2wire import (
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
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE,
    SETTINGS_MAX_HEADER_LIST_SIZE,
    WINDOW_UPDATE,
    frame,
    frame_head,
    take_views,
)
from reactantserver.transport.hpack_blocks import BlockDecoder, encode_headers, hpack_int, literal

Event = tuple[str, int, object, object]
Piece = bytes | memoryview

#: Our SETTINGS_MAX_FRAME_SIZE: a 38 MB answer from our server arrives in ~150 frames (it
#: sends at most 256 KiB in one), not HTTP/2's default ~2,300 of 16 KiB.
MAX_FRAME = 1 << 20
#: Our SETTINGS_MAX_HEADER_LIST_SIZE (h2's default), which also bounds a header block.
MAX_HEADER_LIST = 1 << 16


class ProtocolError(Exception):
    """The peer broke HTTP/2 (a connection error); ``code``: the GOAWAY's error code."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code

    @classmethod
    def of(cls, broken: Violation | None) -> ProtocolError:
        assert broken is not None  # the caller's own comparison found the violation
        return cls(broken.message, broken.code)


def request_block(path: str, authority: str) -> bytes:
    """The constant part of a gRPC request's header block (RFC 7541 static table: 0x83
    ``:method POST``, 0x86 ``:scheme http``), every other field a literal that never
    enters the server's table; :func:`with_timeout` adds the call's deadline."""
    return b"\x83\x86" + encode_headers(
        ((b":path", path.encode()), (b":authority", authority.encode()),
         (b"te", b"trailers"), (b"content-type", b"application/grpc"))
    )  # fmt: skip


#: ``grpc-timeout`` as a literal without indexing, up to its value's length byte.
_TIMEOUT_NAME = literal(b"grpc-timeout", b"")[:-1]


def with_timeout(block: bytes, seconds: float | None) -> bytes:
    """``block`` with a ``grpc-timeout`` of ``seconds`` (in whole milliseconds, rounded
    up; none for ``None``)."""
    if seconds is None:
        return block
    value = b"%dm" % max(1, -int(-seconds * 1000 // 1))
    return b"".join((block, _TIMEOUT_NAME, hpack_int(len(value), 7, 0), value))


def _raw_field(name: bytes, value: bytes) -> tuple[bytes, bytes]:
    return name, value


class _Stream:
    __slots__ = ("granting", "recv_left", "recv_unacked", "send_window")

    def __init__(self, send_window: int, recv_window: int) -> None:
        self.send_window = send_window
        #: What the peer may still send (granted less received), what it sent since our
        #: last WINDOW_UPDATE, and what queued WINDOW_UPDATEs grant once they leave.
        self.recv_left = recv_window
        self.recv_unacked = 0
        self.granting = 0


class ClientConnection:
    """One HTTP/2 client connection's state (module docstring). ``stream_window`` and
    ``connection_window``: the receive windows we grant."""

    def __init__(
        self,
        *,
        stream_window: int = DEFAULT_WINDOW,
        connection_window: int = DEFAULT_WINDOW,
        max_frame: int = MAX_FRAME,
        max_header_list: int = MAX_HEADER_LIST,
    ) -> None:
        self._out: list[Piece] = []
        self._in = bytearray()  # a frame split across reads, until its end arrives
        self._need = 0  # ... and how many bytes that takes
        # A DATA frame passed on as it arrives: payload bytes still to come, its stream
        # (0: nobody listens), whether it ends the stream.
        self._split_left = 0
        self._split_stream = 0
        self._split_end = False
        self._decoder: BlockDecoder[tuple[bytes, bytes]] = BlockDecoder(_raw_field, max_header_list)
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1
        self._stream_window = stream_window
        self._connection_window = connection_window
        self._max_frame_in = max_frame
        self._max_header_list = max_header_list
        # The connection's receive window, as for a stream (:class:`_Stream`); a grant
        # counts once the WINDOW_UPDATE leaves (:meth:`data_to_send`).
        self._recv_left = connection_window
        self._recv_unacked = 0
        self._granting = 0
        self._grants: list[_Stream] = []
        # What the peer allows us.
        self.peer_max_frame = DEFAULT_FRAME
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_streams = MAX_WINDOW
        self.send_window = DEFAULT_WINDOW
        # A header block in progress: (stream id, end_stream, fragments), and its bytes.
        self._block: tuple[int, bool, list[bytes]] | None = None
        self._block_size = 0
        #: The peer's GOAWAY came: no new streams on this connection.
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
                (SETTINGS_MAX_HEADER_LIST_SIZE, self._max_header_list),
            )
        )
        self._out += (PREFACE, frame(SETTINGS, 0, 0, settings))
        grow = self._connection_window - DEFAULT_WINDOW
        if grow > 0:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, grow.to_bytes(4, "big")))

    @property
    def open_streams(self) -> int:
        return len(self._streams)

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
        self._streams[stream_id] = _Stream(self.peer_initial_window, self._stream_window)
        limit = self.peer_max_frame
        flags = END_STREAM if end_stream else 0
        if len(header_block) <= limit:
            self._out.append(frame(HEADERS, flags | END_HEADERS, stream_id, header_block))
            return stream_id
        view = memoryview(header_block)
        self._out.append(frame(HEADERS, flags, stream_id, view[:limit]))
        for start in range(limit, len(view), limit):
            last = start + limit >= len(view)
            chunk = view[start : start + limit]
            self._out.append(frame(CONTINUATION, END_HEADERS if last else 0, stream_id, chunk))
        return stream_id

    def is_open(self, stream_id: int) -> bool:
        """Whether ``stream_id`` is open (neither side has ended or reset it)."""
        return stream_id in self._streams

    def window(self, stream_id: int) -> int:
        """Bytes of DATA that may be sent on ``stream_id`` now (0 for an unknown stream)."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        return max(0, min(stream.send_window, self.send_window))

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
            raise ProtocolError(f"stream {stream_id} is not open")
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
        self._out.append(frame(GOAWAY, 0, 0, bytes(4) + code.to_bytes(4, "big")))

    def data_to_send(self) -> list[Piece]:
        """Everything queued to send, in order, as the pieces it was queued as (a DATA
        payload: views of the caller's pieces); the WINDOW_UPDATEs in it take effect now."""
        if self._granting:
            self._recv_left += self._granting
            self._granting = 0
        if self._grants:
            for stream in self._grants:
                stream.recv_left += stream.granting
                stream.granting = 0
            self._grants.clear()
        out = self._out
        self._out = []
        return out

    # ---------------------------------------------------------------- receiving

    def receive(self, data: bytes) -> list[Event]:
        """Feed bytes read from the socket; the events they complete.

        Payloads are views of what was read, never copied here. A DATA frame split
        across reads is passed on a piece per read (its windows judged from its header,
        the last piece carrying its END_STREAM); any other frame split across reads is
        gathered in a buffer of its own, only its bytes, whose views are handed out as
        they are (the buffer is then replaced, never reused).
        """
        events: list[Event] = []
        view = memoryview(data)
        start = 0
        while True:
            if self._split_left:
                start = self._split_more(view, start, events)
                if self._split_left:
                    return events
            elif self._in:
                missing = self._need - len(self._in)
                if len(data) - start < missing:
                    self._in += view[start:]
                    return events
                self._in += view[start : start + missing]
                start += missing
                if self._need == 9:  # its header is whole: its length is known now
                    head = self._in
                    length = self._judge(head, 0)
                    if length and head[3] == DATA and not head[4] & PADDED and self._block is None:
                        self._in = bytearray()
                        self._split_open(head[4], FRAME_HEAD.unpack_from(head)[4], length)
                        continue
                    self._need += length
                    if length:
                        continue
                gathered = self._in
                self._in = bytearray()
                self._frames(gathered, 0, events)  # exactly the one frame
            else:
                self._frames(data, start, events)
                return events

    def _judge(self, buffer: bytes | bytearray, pos: int) -> int:
        """The length of the frame whose header is at ``pos``, judged before its body is
        waited for: not over our frame size, nor a header block over our list size."""
        high, low, kind = buffer[pos], buffer[pos + 1], buffer[pos + 3]
        length = buffer[pos + 2] | high << 16 | low << 8
        if length > self._max_frame_in:
            raise ProtocolError.of(h2rules.frame_size(length, self._max_frame_in))
        if kind in _BLOCK_KINDS and length + self._block_size > self._max_header_list:
            self._refuse_block(length)
        return length

    def _frames(self, buffer: bytes | bytearray, pos: int, events: list[Event]) -> None:
        """Every whole frame of ``buffer`` from ``pos``; then the start of a DATA frame
        passed on, or the rest kept for the next read."""
        view = memoryview(buffer)
        end = len(buffer)
        unpack = FRAME_HEAD.unpack_from
        while end - pos >= 9:
            high, low, kind, flags, stream_id = unpack(buffer, pos)
            length = high << 8 | low
            if end - pos < 9 + length or length > self._max_frame_in:
                self._judge(buffer, pos)
                if kind == DATA and not flags & PADDED and self._block is None:
                    self._split_open(flags, stream_id, length)
                    pos = self._split_more(view, pos + 9, events)
                break
            stream_id &= MAX_STREAM_ID
            payload = view[pos + 9 : pos + 9 + length]
            pos += 9 + length
            if kind == DATA and self._block is None:  # the usual frame, at once
                if self._account(flags, stream_id, length):
                    data = _unpad(payload) if flags & PADDED else payload
                    events.append(("data", stream_id, data, bool(flags & END_STREAM)))
            else:
                self._frame_in(kind, flags, stream_id, payload, events)
        if pos < end:
            self._in += view[pos:]
            self._need = 9 if end - pos < 9 else 9 + self._judge(buffer, pos)

    def _split_open(self, flags: int, stream_id: int, length: int) -> None:
        """An unpadded DATA frame of ``length`` bytes whose header came without all its
        payload: judged and counted now, its payload passed on as it comes."""
        stream_id &= MAX_STREAM_ID
        self._split_stream = stream_id if self._account(flags, stream_id, length) else 0
        self._split_end = bool(flags & END_STREAM)
        self._split_left = length

    def _split_more(self, view: memoryview, start: int, events: list[Event]) -> int:
        """The next piece of a DATA frame passed on, from ``view`` at ``start``; where
        the read goes on after it."""
        taken = min(self._split_left, len(view) - start)
        if not taken:
            return start
        self._split_left -= taken
        if self._split_stream:  # 0: a stream we reset, nobody listens
            end = self._split_end and not self._split_left
            events.append(("data", self._split_stream, view[start : start + taken], end))
        return start + taken

    def _frame_in(
        self, kind: int, flags: int, stream_id: int, payload: memoryview, events: list[Event]
    ) -> None:
        if kind in _BLOCK_KINDS and len(payload) + self._block_size > self._max_header_list:
            self._refuse_block(len(payload))
        if self._block is not None and kind != CONTINUATION:
            raise ProtocolError("a header block was interrupted by another frame")
        if kind == DATA:
            if self._account(flags, stream_id, len(payload)):
                data = _unpad(payload) if flags & PADDED else payload
                events.append(("data", stream_id, data, bool(flags & END_STREAM)))
        elif kind == HEADERS:
            if stream_id == 0:
                raise ProtocolError("HEADERS on stream 0")
            fragment = _unpad(payload) if flags & PADDED else payload
            if flags & PRIORITY_FLAG:
                fragment = fragment[5:]
            if flags & END_HEADERS:
                self._headers_in(stream_id, bool(flags & END_STREAM), bytes(fragment), events)
            else:
                self._block = (stream_id, bool(flags & END_STREAM), [bytes(fragment)])
                self._block_size = len(payload)
        elif kind == CONTINUATION:
            if self._block is None or self._block[0] != stream_id:
                raise ProtocolError("CONTINUATION without its HEADERS")
            block_id, end, fragments = self._block
            fragments.append(bytes(payload))
            self._block_size += len(payload)
            broken = h2rules.block_frames(len(fragments))
            if broken is not None:
                raise ProtocolError.of(broken)
            if flags & END_HEADERS:
                self._block = None
                self._block_size = 0
                self._headers_in(block_id, end, b"".join(fragments), events)
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
            self._window_update(stream_id, payload, events)
        elif kind == PUSH_PROMISE:
            raise ProtocolError("PUSH_PROMISE although push is disabled")
        # PRIORITY and unknown frame types are ignored (RFC 9113 §5.5).

    def _window_update(self, stream_id: int, payload: memoryview, events: list[Event]) -> None:
        if len(payload) != 4:
            raise ProtocolError("WINDOW_UPDATE of the wrong size")
        increment = int.from_bytes(payload, "big") & MAX_WINDOW
        if stream_id == 0:
            broken = h2rules.window_update(increment, self.send_window, 0)
            if broken is not None:
                raise ProtocolError.of(broken)
            self.send_window += increment
        else:
            stream = self._streams.get(stream_id)
            if stream is None:
                if increment == 0 and stream_id >= self._next_id:  # never opened
                    raise ProtocolError(f"a WINDOW_UPDATE of 0 on idle stream {stream_id}")
                return  # closed: late frames are ignored (RFC 9113 §6.9)
            broken = h2rules.window_update(increment, stream.send_window, stream_id)
            if broken is not None:
                del self._streams[stream_id]
                self._out.append(frame(RST_STREAM, 0, stream_id, broken.code.to_bytes(4, "big")))
                events.append(("error", stream_id, broken.code, broken.message))
                return
            stream.send_window += increment
        events.append(("window", 0, None, None))

    def _account(self, flags: int, stream_id: int, flow: int) -> bool:
        """A DATA frame of ``flow`` bytes (padding included) on ``stream_id``, against the
        receive windows we granted, replenished with WINDOW_UPDATE once half is used; its
        END_STREAM closes the stream. Whether anyone listens (False: a stream we reset)."""
        left = self._recv_left - flow
        if left < 0:
            raise ProtocolError.of(h2rules.received(flow, self._recv_left, "the connection"))
        self._recv_left = left
        unacked = self._recv_unacked + flow
        if unacked >= self._connection_window // 2:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, unacked.to_bytes(4, "big")))
            self._granting += unacked
            unacked = 0
        self._recv_unacked = unacked
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id >= self._next_id or stream_id == 0:
                raise ProtocolError(f"DATA on stream {stream_id}, which was never opened")
            return False  # a stream we reset: the connection window is all that counts
        left = stream.recv_left - flow
        if left < 0:
            raise ProtocolError.of(h2rules.received(flow, stream.recv_left, f"stream {stream_id}"))
        stream.recv_left = left
        if flags & END_STREAM:
            del self._streams[stream_id]
            return True
        unacked = stream.recv_unacked + flow
        if unacked >= self._stream_window // 2:
            self._out.append(frame(WINDOW_UPDATE, 0, stream_id, unacked.to_bytes(4, "big")))
            stream.granting += unacked
            self._grants.append(stream)
            unacked = 0
        stream.recv_unacked = unacked
        return True

    def _refuse_block(self, length: int) -> None:
        """A HEADERS, PUSH_PROMISE or CONTINUATION of ``length`` bytes that takes its
        header block past our SETTINGS_MAX_HEADER_LIST_SIZE."""
        raise ProtocolError.of(
            h2rules.header_block(self._block_size + length, self._max_header_list)
        )

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
            # SETTINGS_HEADER_TABLE_SIZE limits an encoder table we never use.
        self._out.append(frame(SETTINGS, ACK, 0))
        events.append(("window", 0, None, None))


#: The frames a header block is made of.
_BLOCK_KINDS = frozenset({HEADERS, PUSH_PROMISE, CONTINUATION})


def _unpad(payload: memoryview) -> memoryview:
    """A PADDED frame's payload without its padding."""
    if not payload or payload[0] >= len(payload):
        raise ProtocolError("padding longer than the frame")
    return payload[1 : len(payload) - payload[0]]
