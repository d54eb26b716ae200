"""The client's connection to one server: unary gRPC calls over the transport's client
role of HTTP/2 (:mod:`reactantserver.h2.client`, the gateway's too), on asyncio.

Theory of operation
-------------------
:class:`Channel` opens one TCP connection on its first call, and a new one when the last
went away or the server sent GOAWAY. :meth:`Channel.unary` makes one unary call: the
request's HEADERS (a constant block per path, plus ``grpc-timeout``), then its one
message -- the 5-byte gRPC prefix and the pieces its encoder made, a ``ModelInfer``
request's tensors among them -- as DATA frames whose payloads are views of the pieces,
within the server's windows; then it waits for the answer's headers, message and
trailers. The only copy of a tensor sent is the kernel's; an answer's message is copied
once, piece by piece as it is read, into a buffer of its own (the connection slices
frames out of what was read and passes a DATA frame on a piece per read), which the
caller gets as a read-only ``memoryview``.

The asyncio edge is thin: :class:`_Protocol` feeds what the socket reads to the sans-IO
connection, hands its events to the calls waiting for them, and writes what the
connection queued -- small pieces joined into one ``write``, large ones (a tensor's
views) written as they are. It never blocks a call on anything but the server: a call
over the peer's stream limit waits for a stream to end; DATA beyond a window waits for
the WINDOW_UPDATE; a full socket buffer waits for the transport's ``resume_writing``.

Outcomes, in the exceptions :mod:`.status` translates: the server's status other than
OK is grpclib's :class:`~grpclib.exceptions.GRPCError` (its public exception, with the
status and the percent-decoded ``grpc-message``); a stream the server reset is
:class:`~grpclib.exceptions.StreamTerminatedError`; a lost connection is
``ConnectionResetError``; a server breaking HTTP/2 is
:class:`~reactantserver.h2.events.ProtocolError`
(after our GOAWAY). A call cancelled, or past its timeout (``TimeoutError``), resets its
stream (RST_STREAM CANCEL). A call the server did not process -- it said GOAWAY before
the call could open a stream, or naming a last stream below the call's -- goes to a new
connection (RFC 9113 §6.8: it may be retried safely); after :data:`MOVES` connections
that went away without answering anything, it fails (``StreamTerminatedError``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import ssl
import time
from collections.abc import Iterable, Sequence
from urllib.parse import unquote

from grpclib.exceptions import StreamTerminatedError

from ..grpcwire import StatusCode, encode_grpc_timeout, parse_grpc_status, status_for_http
from ..h2.client import ClientConnection, encode_request, request_prefix
from ..h2.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    ProtocolError,
    RemoteSettingsChanged,
    ResponseReceived,
    StreamReset,
    TrailersReceived,
    WindowUpdated,
)
from ..transport.core.limits import WireLimits
from ..transport.grpcerror import grpc_error
from ..transport.tls import ClientTls, check_h2, client_tls

#: Pieces smaller than this are joined into one ``write``; larger ones are written as
#: they are (the transport sends them, or keeps what the socket did not take).
JOIN_BYTES = 64 * 1024


def write_pieces(transport: asyncio.WriteTransport, pieces: Iterable[bytes | memoryview]) -> None:
    """Write ``pieces`` in order: small ones joined into one write, large ones as they are."""
    group: list[bytes | memoryview] = []
    for piece in pieces:
        if len(piece) < JOIN_BYTES:
            group.append(piece)
            continue
        if group:
            transport.write(b"".join(group))
            group = []
        transport.write(piece)
    if group:
        transport.write(group[0] if len(group) == 1 else b"".join(group))


#: A call sends at most this much DATA before it lets the transport say it is full
#: (``pause_writing``): what the socket does not take at once is copied into the
#: transport's buffer, so a large request goes out a chunk at a time.
SEND_CHUNK = 1 << 20


#: Connections a call tries when each says GOAWAY before answering any call (then it
#: fails UNAVAILABLE, and the client's retry policy decides).
MOVES = 3


class _Gone(Exception):
    """The server said GOAWAY before it processed the call (before the call could open
    a stream, or naming a last stream below the call's): it may go to a new connection."""


def _retrieve(task: asyncio.Task[_Protocol]) -> None:
    if not task.cancelled():
        task.exception()


class _Call:
    """One unary call on a connection: what it still has to send, and its answer."""

    __slots__ = ("done", "headers", "message", "pending", "prefix", "stream_id", "wake")

    def __init__(self, stream_id: int, pending: collections.deque[memoryview]) -> None:
        self.stream_id = stream_id
        #: The request's bytes not yet sent.
        self.pending = pending
        #: The answer's gRPC prefix (5 bytes), then its message, as they arrive.
        self.prefix = bytearray()
        self.message = bytearray()
        self.headers: tuple[tuple[bytes, bytes], ...] | None = None
        #: The call's outcome: the message (read-only; None for none), or its exception.
        self.done: asyncio.Future[memoryview | None] = asyncio.get_running_loop().create_future()
        #: Set while the sender waits for a window (or a writable socket).
        self.wake: asyncio.Future[None] | None = None

    def take(self, data: memoryview) -> bool:
        """A piece of the answer's DATA, copied into its message (the only copy: the
        bytes read are let go at once). False when the answer is not one uncompressed
        message of the size its prefix says."""
        prefix = self.prefix
        if len(prefix) < 5:
            need = 5 - len(prefix)
            prefix += data[:need]
            data = data[need:]
            if prefix[0] != 0:
                return False
        self.message += data
        return len(prefix) < 5 or len(self.message) <= int.from_bytes(prefix[1:5], "big")

    def finish(self, trailers: tuple[tuple[bytes, bytes], ...]) -> None:
        """The answer is whole: its outcome from the headers, trailers and message."""
        headers = dict(self.headers or ())
        http = headers.get(b":status")
        if http != b"200":
            # Not a gRPC answer (a proxy's?): gRPC's table says what it means.
            status = status_for_http(int(http)) if http and http.isdigit() else StatusCode.UNKNOWN
            self.fail(grpc_error(status, f"HTTP status {(http or b'none').decode()}"))
            return
        fields = dict(trailers)
        code = fields.get(b"grpc-status")
        if code is None:
            self.fail(grpc_error(StatusCode.UNKNOWN, "the answer carried no grpc-status"))
        elif code != b"0":
            text = unquote(fields.get(b"grpc-message", b"").decode("utf-8", "replace"))
            self.fail(grpc_error(parse_grpc_status(code), text or None))
        elif not self.prefix:
            self.done.set_result(None)
        elif len(self.prefix) < 5 or len(self.message) != int.from_bytes(self.prefix[1:5], "big"):
            self.fail(grpc_error(StatusCode.INTERNAL, "the answer's message was cut short"))
        elif not self.done.done():
            self.done.set_result(memoryview(self.message).toreadonly())
        self.poke()  # the server may answer before the whole request was sent

    def fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)
        self.poke()

    def poke(self) -> None:
        """Wake the sender (a window grew, the socket drained, or the call ended)."""
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)


class _Protocol(asyncio.Protocol):
    """One connection's asyncio edge (module docstring)."""

    def __init__(self, conn: ClientConnection) -> None:
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, _Call] = {}
        #: Why the connection is unusable (None while it is usable).
        self.failure: BaseException | None = None
        self.paused = False
        #: Calls the server answered on this connection.
        self.answered = 0
        #: Calls waiting for a stream slot under the server's SETTINGS_MAX_CONCURRENT_STREAMS.
        self.slots: collections.deque[asyncio.Future[None]] = collections.deque()

    # ---------------------------------------------------------------- asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # A small call must not wait ~40 ms for the peer's delayed ACK.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn.initiate_connection()
        self.flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data, time.monotonic())
        except ProtocolError as exc:  # the connection queued its GOAWAY
            self.flush()
            self._fail(exc)
            assert self.transport is not None
            self.transport.close()
            return
        for event in events:
            self._event(event)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionResetError(f"the connection was lost: {exc or 'closed'}"))

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        for call in self.calls.values():
            call.poke()

    # ---------------------------------------------------------------- events

    def _event(self, event: Event) -> None:
        kind = type(event)
        if kind is WindowUpdated or kind is RemoteSettingsChanged:
            for sending in self.calls.values():
                if sending.pending:
                    sending.poke()
            return
        if isinstance(event, ConnectionTerminated):
            # Calls it did not process, or waiting, go to a new connection.
            for later in [c for c in self.calls.values() if c.stream_id > event.last_stream_id]:
                self._end(later, _Gone())
            self._wake_all()
            return
        if not isinstance(event, (DataReceived, ResponseReceived, TrailersReceived, StreamReset)):
            return
        stream_id = event.stream_id
        call = self.calls.get(stream_id)
        if call is None:
            return
        if isinstance(event, DataReceived):
            if call.headers is None:
                self.conn.reset(stream_id, 1)  # PROTOCOL_ERROR: DATA before HEADERS
                self._end(call, StreamTerminatedError("the answer's DATA came before its HEADERS"))
                return
            if not call.take(event.data):
                self.conn.reset(stream_id, 1)
                message = "the answer is not one uncompressed gRPC message of the size it says"
                self._end(call, grpc_error(StatusCode.INTERNAL, message))
                return
            if event.stream_ended is not None:  # no trailers: finish() says so
                self.calls.pop(stream_id, None)
                self.answered += 1
                call.finish(())
                self._slot_freed()
        elif isinstance(event, StreamReset):
            what = "reset by the server" if event.remote_reset else "reset: a stream error"
            code = int(event.error_code)
            self._end(call, StreamTerminatedError(f"the call's stream was {what} (code {code})"))
        elif isinstance(event, ResponseReceived) and event.stream_ended is None:
            call.headers = event.headers
        else:  # the trailers, or a trailers-only answer: one block says everything
            if call.headers is None:
                call.headers = event.headers
            self.calls.pop(stream_id, None)
            self.answered += 1
            call.finish(event.headers)
            self._slot_freed()

    def _end(self, call: _Call, exc: BaseException) -> None:
        self.calls.pop(call.stream_id, None)
        call.fail(exc)
        self._slot_freed()

    def _fail(self, exc: BaseException) -> None:
        """The connection is done: every call on it fails with ``exc``."""
        if self.failure is None:
            self.failure = exc
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call.fail(exc)
        self._wake_all()

    def _wake_all(self) -> None:
        while self.slots:
            waiter = self.slots.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _slot_freed(self) -> None:
        """A call ended: one waiting for a stream may open it; a connection the server
        sent GOAWAY on closes with its last call."""
        if self.conn.goaway_received and not self.calls and self.transport is not None:
            self.flush()
            self.transport.close()
        while self.slots:
            waiter = self.slots.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def flush(self) -> None:
        pieces = self.conn.pieces_to_send()
        if pieces and self.transport is not None and not self.transport.is_closing():
            write_pieces(self.transport, pieces)

    # ---------------------------------------------------------------- calls

    @property
    def usable(self) -> bool:
        return self.failure is None and not self.conn.goaway_received

    async def call(
        self, header_block: bytes, parts: Sequence[bytes | memoryview]
    ) -> memoryview | None:
        """One unary call: ``b"".join(parts)`` as its message; the answer's message."""
        conn = self.conn
        while self.failure is not None or not conn.can_open:
            if conn.goaway_received:
                raise _Gone  # before the call began: the channel opens a new connection
            if self.failure is not None:
                raise self.failure  # it broke before the call could begin
            waiter = asyncio.get_running_loop().create_future()
            self.slots.append(waiter)
            await waiter
        size = 0
        pending: collections.deque[memoryview] = collections.deque()
        for part in parts:
            view = memoryview(part).cast("B")
            if view.nbytes:
                pending.append(view)
                size += view.nbytes
        pending.appendleft(memoryview(b"\x00" + size.to_bytes(4, "big")))
        stream_id = conn.open_stream(header_block)
        call = self.calls[stream_id] = _Call(stream_id, pending)
        try:
            conn.send_pieces(stream_id, pending, end_stream=True, most=SEND_CHUNK)
            self.flush()
            while call.pending and not call.done.done():
                call.wake = asyncio.get_running_loop().create_future()
                if self.paused or not conn.local_flow_control_window(stream_id):
                    await call.wake
                    continue
                conn.send_pieces(stream_id, pending, end_stream=True, most=SEND_CHUNK)
                self.flush()
            return await call.done
        except BaseException:
            if self.calls.pop(stream_id, None) is not None:
                conn.reset(stream_id)
                self.flush()
                self._slot_freed()
            raise
        finally:
            call.wake = None


class Channel:
    """Unary gRPC calls to ``host:port`` over one HTTP/2 connection at a time; the
    receive windows granted: ``stream_window`` per call, ``connection_window`` in all."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        stream_window: int,
        connection_window: int,
        tls: ClientTls | ssl.SSLContext | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.host = host
        self.port = port
        #: TLS to the server (None: cleartext h2c); a ``ClientTls`` is read again for each
        #: new connection when its files changed.
        self.tls = tls
        #: Headers sent with every call (a restricted group's key).
        self._extra = tuple((k.lower().encode(), v.encode()) for k, v in metadata)
        self._authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._stream_window = stream_window
        self._connection_window = connection_window
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Task[_Protocol] | None = None
        #: path -> its request header block without the deadline.
        self._blocks: dict[str, bytes] = {}

    async def unary(
        self, path: str, parts: Sequence[bytes | memoryview], *, timeout: float | None = None
    ) -> memoryview | None:
        """Call ``path`` with the message ``b"".join(parts)`` (never joined here); the
        answer's message, read-only (None when the server sent none). ``timeout``: seconds, sent as
        ``grpc-timeout`` (rounded down: :func:`reactantserver.grpcwire.encode_grpc_timeout`,
        so the server gives up no later than we do) and kept here (``TimeoutError``)."""
        block = self._blocks.get(path)
        if block is None:
            block = self._blocks[path] = request_prefix(
                path.encode(), self._authority.encode(), tls=self.tls is not None, extra=self._extra
            )
        block = encode_request(block, None if timeout is None else encode_grpc_timeout(timeout))
        async with asyncio.timeout(timeout):
            barren = 0
            while barren < MOVES:
                protocol = await self._connected()
                try:
                    return await protocol.call(block, parts)
                except _Gone:
                    barren += not protocol.answered
            raise StreamTerminatedError(f"{MOVES} connections went away without answering a call")

    async def _connected(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and protocol.usable:
            return protocol
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
            # Its failure is raised to the calls awaiting it; none may be left to.
            self._connecting.add_done_callback(_retrieve)
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None

    async def _connect(self) -> _Protocol:
        old = self._protocol
        if old is not None and old.transport is not None and not old.calls:
            old.transport.close()  # done (GOAWAY or failed); with calls, it closes after them
        limits = WireLimits(
            stream_window=self._stream_window, connection_window=self._connection_window
        )
        conn = ClientConnection(limits, time.monotonic(), pieces=True)
        loop = asyncio.get_running_loop()
        context, server_hostname = client_tls(self.tls, self.host)
        transport, protocol = await loop.create_connection(
            lambda: _Protocol(conn),
            self.host,
            self.port,
            ssl=context,
            server_hostname=server_hostname,
        )
        check_h2(transport, f"{self.host}:{self.port}")
        self._protocol = protocol
        return protocol

    def close(self) -> None:
        """GOAWAY and close the connection (calls on it fail)."""
        if self._connecting is not None:
            self._connecting.cancel()
            self._connecting = None
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            with contextlib.suppress(RuntimeError):  # the loop may be closing
                protocol.conn.close_connection()
                protocol.flush()
            protocol.transport.close()
