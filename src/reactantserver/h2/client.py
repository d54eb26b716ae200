"""The client role of our HTTP/2 connection (:mod:`.core`), as much as unary gRPC calls
need: the one connection both of our clients use -- the gateway's to its workers
(:mod:`reactantserver.gateway.channel`) and the Python client's
(:mod:`reactantserver.client.channel`).

Why not h2: a client over h2 cost about 140 us of CPU per unary call, this about 78 us
(docs/benchmarks.md, "The gateway"), and h2 copies every DATA payload several times. Here
a message goes out as views of the caller's pieces and comes in as views of the reads
(with ``pieces``, a DATA frame split across reads is passed on a piece per read).

A request goes out as :meth:`~ClientConnection.open_stream` (its HEADERS) and then
``send_data`` (one buffer) or :meth:`~ClientConnection.send_pieces` (a queue of views, as
much as the windows allow), or, small, in one step (:meth:`~ClientConnection.send_request`).
Our request headers are literals that never enter HPACK's dynamic table
(:func:`encode_request`), so nothing is searched and the worker's decoder table never
changes. Answers arrive as :mod:`.events` events: ``ResponseReceived``,
``DataReceived`` (acknowledged as it arrives), ``TrailersReceived``, ``StreamReset``
(``remote_reset=False``: the worker broke a stream's rule and we reset it),
``ConnectionTerminated`` (its GOAWAY: streams above its last one were not processed),
``WindowUpdated`` and ``RemoteSettingsChanged`` (blocked data may go). What a worker makes
us do for nothing is judged by the connection's :class:`.abuse.AbuseBudget`: past it,
``receive_data`` raises ``DenialOfServiceError`` (ENHANCE_YOUR_CALM), as any connection
error, after which the caller sends the queued GOAWAY and closes the socket.

Invariants (``tests/h2/test_h2client.py``, h2's server side as the oracle): every byte we
write parses as valid HTTP/2 for h2 and carries the message unchanged however it was cut;
whatever h2 sends we decode to the same headers and data however the bytes are split; we
never send more DATA than the peer's windows allow, nor a frame larger than its maximum
frame size; whatever bytes a worker sends are events on our streams or a connection error.
"""

from __future__ import annotations

from . import events as h2events
from .core import Connection
from .events import ConnectionState, ErrorCodes
from .hpack import encode_headers, hpack_int, literal
from .wire import DATA, END_HEADERS, END_STREAM, HEADERS, MAX_STREAM_ID, PREFACE, frame_head


def request_prefix(
    path: bytes,
    authority: bytes,
    *,
    tls: bool = False,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> bytes:
    """The constant part of a gRPC request's header block for ``path`` (RFC 7541 static
    table: 0x83 ``:method POST``, 0x86 ``:scheme http`` or 0x87 ``https`` with ``tls``,
    names 4 ``:path``, 1 ``:authority``, 31 ``content-type``), then ``extra`` headers
    (metadata such as a restricted group's key)."""
    return (b"\x87" if tls else b"\x86").join((b"\x83", encode_headers(
        ((b":path", path), (b":authority", authority), (b"te", b"trailers"),
         (b"content-type", b"application/grpc"), *extra)
    )))  # fmt: skip


#: ``grpc-timeout`` as a literal without indexing, up to its value's length byte.
_TIMEOUT_NAME = literal(b"grpc-timeout", b"")[:-1]


def encode_request(prefix: bytes, grpc_timeout: str | None) -> bytes:
    """A request header block: ``prefix`` (:func:`request_prefix`) and ``grpc-timeout``
    (its value as sent, e.g. ``"250m"``; none for None)."""
    if grpc_timeout is None:
        return prefix
    value = grpc_timeout.encode("ascii")
    return b"".join((prefix, _TIMEOUT_NAME, hpack_int(len(value), 7, 0), value))


class ClientConnection(Connection):
    """One HTTP/2 client connection (module docstring)."""

    client = True

    def initiate_connection(self) -> None:
        """The preface, our SETTINGS and the connection window's growth."""
        self._out.append(PREFACE)
        self._out.append(self._settings_frame())
        self.grow_connection_window()

    @property
    def goaway_received(self) -> bool:
        return self.state == ConnectionState.DRAINING

    @property
    def can_open_ids(self) -> bool:
        """Stream ids are left (2^30 calls per connection; then a new connection)."""
        return self.next_stream_id <= MAX_STREAM_ID

    @property
    def can_open(self) -> bool:
        """A new stream may be opened now (no GOAWAY, ids left, under the peer's limit)."""
        state = self.state
        return (
            state in (ConnectionState.OPEN, ConnectionState.IDLE)
            and self.next_stream_id <= MAX_STREAM_ID
            and len(self.streams) < self.peer_max_streams
        )

    def open_stream(self, header_block: bytes, *, end_stream: bool = False) -> int:
        """Send a request's HEADERS (and CONTINUATIONs); the new stream's id."""
        if not self.can_open:
            raise h2events.ProtocolError("no new stream may be opened on this connection")
        stream_id = self._open(0, end_stream)
        self._queue_block(stream_id, header_block, end_stream)
        return stream_id

    def send_request(self, header_block: bytes, message: bytes | memoryview) -> int | None:
        """A whole small unary request in one step: HEADERS, then one DATA frame holding
        the 5-byte gRPC prefix and ``message`` (not copied), with END_STREAM -- exactly the
        bytes and state of :meth:`open_stream` followed by ``send_data`` of the prefixed
        message, with the checks made once. The new stream's id; None, with nothing
        queued, when the request does not go out that way (no stream may open, the block
        or the DATA frame over the peer's frame size, the message over a window, a table
        size update owed): the caller then takes those two calls, which wait or raise."""
        size = len(message) + 5
        limit = self.max_outbound_frame_size
        if (
            not self.can_open
            or self.table.owed
            or len(header_block) > limit
            or size > limit
            or size > self.peer_initial_window
            or size > self.outbound_flow_control_window
        ):
            return None
        stream_id = self._open(size, True)  # the stream's move and the windows: the core's
        out = self._out
        out.append(frame_head(HEADERS, END_HEADERS, stream_id, len(header_block)))
        out.append(header_block)
        out.append(frame_head(DATA, END_STREAM, stream_id, size))
        out.append(b"\x00" + len(message).to_bytes(4, "big"))
        out.append(message)
        return stream_id

    def reset(self, stream_id: int, code: int = ErrorCodes.CANCEL) -> None:
        """RST_STREAM, if ``stream_id`` is still open: we are done with it."""
        if stream_id in self.streams:
            self.reset_stream(stream_id, code)
