"""The client's HTTP/2 connection: grpclib's ``Channel``, cheap for large messages.

Why
---
A 38 MB inline tensor cost the client as much CPU as the server (155-164 ms per call,
docs/benchmarks.md "38 MB inline"), almost none of it protobuf: h2, hyperframe and
grpclib copied (and h2 formatted) every byte several times on its way in and out. This
module keeps grpclib's client (its call ``Stream``, events, deadlines, status handling)
and h2's connection (its state machines and flow-control accounting), and changes how
bytes become frames and frames become bytes, through their extension points: the
channel's protocol factory, the protocol's ``connection_made``, the connection's
``create_stream``, h2's ``incoming_buffer`` and frame dispatch table. Nothing is patched
globally; other grpclib channels in the process are unaffected.

Receiving
---------
* Our SETTINGS (the first frame) allow DATA frames of :data:`MAX_FRAME` bytes and the
  stream window grpclib's ``Configuration`` asks for, in force from the first byte
  (grpclib keeps HTTP/2's 16 KiB frames, and announces the window in a second SETTINGS
  frame): a 38 MB answer from our server arrives in ~150 frames instead of ~2,300, and
  h2's per-frame work is paid that many times.
* Received bytes are cut into frames by
  :class:`~reactantserver.client.h2frames.HyperframeReader` (``server=False``: no
  preface), no body copied that arrived whole in one read, a DATA payload a view of the
  read (or of the one copy of a frame split between reads), every frame of a quiet class
  whose ``repr`` does not hex-encode the payload (h2 builds a received frame's ``repr``
  for its no-op trace log: 14 % of the client's CPU on a 38 MB answer). grpclib then
  joins a message's payloads once.

Sending
-------
grpclib's ``send_message`` encodes a message into one ``bytes`` and concatenates the
5-byte gRPC prefix to it (a copy); its stream cuts that into frame-sized ``bytes`` (a
copy); h2 and hyperframe copy each frame four more times (a ``memoryview`` payload
into ``bytes``, the body join, the header join, the output buffer and its ``bytes()``).
Here a unary request goes out through :func:`send_unary`: the message as the pieces its
encoder made (:meth:`.wire.InferRequestWire.parts`: the tensors are the caller's
arrays), the prefix a piece of its own, each DATA frame a :class:`Payload` -- a list of
``memoryview`` slices of those pieces that h2 measures with ``len`` and passes along
untouched, so its windows and stream states are kept as for any payload -- and written
to the transport as its 9-byte header and the slices themselves
(:class:`_H2Connection`, :func:`write_pieces`). The kernel's copy is the only one. (A
``grpclib`` stream's own ``send_data`` -- its ``send_message`` for streaming calls --
gets the same frames.) Control frames (HEADERS, WINDOW_UPDATE, SETTINGS, ...) are
serialized by hyperframe as before, and small pieces are joined into one write.

:func:`send_unary` replaces grpclib's ``Stream.send_message`` for one unary request,
setting the same call-state flags and counters (grpclib keeps them in private
attributes, as the server's ``ServerStream.send_unary_reply`` does on its side); grpclib's
``SendMessage`` event is not dispatched (nothing listens on this channel).

Invariant (tests/test_client_channel.py): the bytes written for any sequence of sends
are those h2's own connection writes for the joined message, and a connection's received
bytes give the events h2's own buffer gives.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import time
from collections.abc import Iterable, Sequence
from typing import Any

import grpclib.client
import h2.settings
from grpclib.client import Channel, Handler
from grpclib.exceptions import ProtocolError
from grpclib.protocol import Connection, EventsProcessor, H2Protocol, Stream
from grpclib.utils import Wrapper
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.settings import SettingCodes
from hyperframe.frame import DataFrame, Frame

from reactantserver.client.h2frames import HyperframeReader, route_quiet_frames
from reactantserver.transport.h2wire import (
    DATA,
    DEFAULT_WINDOW,
    END_STREAM,
    frame_head,
    take_views,
)

#: Our SETTINGS_MAX_FRAME_SIZE: the largest frame the server may send us (HTTP/2's default
#: is 16 KiB; our server sends at most 256 KiB, gRPC's C core up to what is allowed).
MAX_FRAME = 1 << 20
#: Our SETTINGS_MAX_HEADER_LIST_SIZE (h2's default), which also bounds a received header block.
MAX_HEADER_LIST = 1 << 16
#: Pieces smaller than this are joined into one ``write``; larger ones are written as
#: they are (the transport sends them, or keeps what the socket did not take).
JOIN_BYTES = 64 * 1024

Piece = bytes | memoryview


class Payload:
    """A DATA frame's payload as ``memoryview`` slices of the message, not joined.

    h2 measures a payload with ``len`` (flow control, frame size) and stores it in its
    ``DataFrame``; it copies a ``memoryview`` into ``bytes`` first, and this is not one.
    :meth:`_H2Connection._prepare_for_sending` writes the slices themselves.
    """

    __slots__ = ("nbytes", "views")

    def __init__(self, views: list[memoryview], nbytes: int) -> None:
        self.views = views
        self.nbytes = nbytes

    def __len__(self) -> int:
        return self.nbytes


class Pieces:
    """The bytes still to send of a message given as pieces, taken a frame at a time."""

    def __init__(self, pieces: Iterable[Piece]) -> None:
        views = (memoryview(p).cast("B") for p in pieces)
        self._rest = collections.deque(v for v in views if v.nbytes)
        #: Bytes not taken yet.
        self.left = sum(v.nbytes for v in self._rest)

    def take(self, size: int) -> Payload:
        """The next ``size`` bytes (at most :attr:`left`), as views of the pieces."""
        views, taken = take_views(self._rest, size)
        self.left -= taken
        return Payload(views, taken)


class _H2Connection(H2Connection):
    """h2's client connection, queueing what it sends as a list of pieces.

    A DATA frame carrying a :class:`Payload` is queued as its 9-byte header and the
    payload's slices; every other frame as hyperframe serializes it. h2's own output
    buffer (``_data_to_send``) is written by ``initiate_connection`` alone, before anything
    else is queued, so it is taken first.
    """

    def __init__(self, config: H2Configuration) -> None:
        super().__init__(config=config)
        self._pieces: list[Piece] = []

    def _prepare_for_sending(self, frames: list[Frame]) -> None:
        for frame in frames:
            payload = frame.data if type(frame) is DataFrame else None
            if isinstance(payload, Payload) and "PADDED" not in frame.flags:
                flags = END_STREAM if "END_STREAM" in frame.flags else 0
                self._pieces.append(frame_head(DATA, flags, frame.stream_id, payload.nbytes))
                self._pieces.extend(payload.views)
            else:
                self._pieces.append(frame.serialize())

    def pieces_to_send(self) -> list[Piece]:
        """Everything queued to send, in order (then forgotten), without joining it."""
        pieces = self._pieces
        self._pieces = []
        if self._data_to_send:
            pieces.insert(0, bytes(self._data_to_send))
            self._data_to_send = bytearray()
        return pieces

    def data_to_send(self, amount: int | None = None) -> bytes:
        """h2's ``data_to_send``: what is queued, as one ``bytes``."""
        data = b"".join(self.pieces_to_send())
        if amount is not None and len(data) > amount:
            self._pieces.append(data[amount:])
            data = data[:amount]
        return data

    def clear_outbound_data_buffer(self) -> None:
        super().clear_outbound_data_buffer()
        self._pieces = []


def write_pieces(transport: asyncio.WriteTransport, pieces: Iterable[Piece]) -> None:
    """Write ``pieces`` in order: small ones joined into one write, large ones as they are."""
    group: list[Piece] = []
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


class _Stream(Stream):
    """grpclib's stream, sending a message's DATA frames as views of its pieces."""

    _h2_connection: _H2Connection

    async def send_data(self, data: bytes, end_stream: bool = False) -> None:
        await self.send_pieces((data,), end_stream=end_stream)

    async def send_pieces(self, pieces: Iterable[Piece], end_stream: bool = False) -> None:
        """grpclib's ``send_data`` for the concatenation of ``pieces``: frame by frame
        within the peer's windows and frame size, each frame a :class:`Payload`."""
        assert self.id is not None
        h2_conn = self._h2_connection
        message = Pieces(pieces)
        while True:
            await self.connection.write_ready.wait()
            window = h2_conn.local_flow_control_window(self.id)
            if not window > 0:  # it can be negative after the peer shrank it
                self.window_updated.clear()
                await self.window_updated.wait()
                continue  # other streams may have used the connection window meanwhile
            size = min(window, h2_conn.max_outbound_frame_size, message.left)
            payload: Any = message.take(size)  # h2 declares bytes | memoryview
            last = not message.left
            h2_conn.send_data(self.id, payload, end_stream=end_stream and last)
            write_pieces(self._transport, h2_conn.pieces_to_send())
            self.data_sent += size
            self.connection.data_sent += size
            self.connection.data_send_process()
            if last:
                return


class _Connection(Connection):
    """grpclib's connection, whose streams are :class:`_Stream`."""

    def create_stream(
        self, *, stream_id: int | None = None, wrapper: Wrapper | None = None
    ) -> Stream:
        return _Stream(
            self, self._connection, self._transport, stream_id=stream_id, wrapper=wrapper
        )


class _Protocol(H2Protocol):
    """grpclib's client protocol over :class:`_H2Connection`, configured as the module
    docstring says before its first SETTINGS frame is written."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # A small call must not wait ~40 ms for the peer's delayed ACK (as grpclib).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _H2Connection(self.h2_config)
        conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: 100,  # h2's default for a client
                SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
                SettingCodes.MAX_FRAME_SIZE: MAX_FRAME,
                SettingCodes.INITIAL_WINDOW_SIZE: self.config.http2_stream_window_size,
            },
        )
        conn.max_inbound_frame_size = MAX_FRAME
        conn.incoming_buffer = HyperframeReader(MAX_HEADER_LIST, server=False)  # type: ignore[assignment]
        route_quiet_frames(conn)
        conn.initiate_connection()
        raise_by = self.config.http2_connection_window_size - DEFAULT_WINDOW
        if raise_by > 0:
            conn.increment_flow_control_window(raise_by)
        self.connection = _Connection(conn, transport, config=self.config)
        self.connection.flush()
        self.connection.initialize()
        self.processor = EventsProcessor(self.handler, self.connection)


class ClientChannel(Channel):
    """grpclib's ``Channel`` whose connections are built as the module docstring says."""

    def _protocol_factory(self) -> H2Protocol:
        return _Protocol(Handler(), self._config, self._h2_config)


async def send_unary(call: grpclib.client.Stream[Any, Any], parts: Sequence[Piece]) -> None:
    """Send a unary call's one message, ``b"".join(parts)``, and end the request.

    ``call`` is a stream of a :class:`ClientChannel` (``channel.request(...)``); this is
    its ``send_message(message, end=True)`` with the message given as its pieces, which
    are never joined (module docstring).
    """
    if call._cardinality.client_streaming:
        raise ProtocolError("send_unary sends the one message of a unary request")
    if call._send_message_done:
        raise ProtocolError("Message was already sent")
    if not call._send_request_done:
        await call.send_request()
    stream = call._stream
    assert isinstance(stream, _Stream), "a call of a ClientChannel"
    size = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
    with call._wrapper:
        await stream.send_pieces((struct.pack(">?I", False, size), *parts), end_stream=True)
    call._send_message_done = True
    call._end_done = True
    call._messages_sent += 1
    stream.connection.messages_sent += 1
    stream.connection.last_message_sent = time.monotonic()
