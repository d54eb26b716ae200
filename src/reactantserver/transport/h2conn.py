"""The pieces the server's HTTP/2 connection is built from, and its corked writes.

* :func:`new_h2_connection`: the server side of one connection
  (:class:`.h2lean.ServerConnection`) whose *first* SETTINGS frame carries every limit of
  :class:`~.limits.WireLimits` (stream count, header list size, frame size, stream
  window), in force from the first byte.
* :class:`_Settings`: h2's settings record, except that it hides our stream limit from
  a connection-level check (h2 treats one stream too many as a connection error; the
  guard refuses just that stream).
* :class:`_FrameBuffer`: cuts received bytes into frames, judging a frame's length from
  its 9-byte header (h2's own buffer waits for the whole frame first, so a DATA frame
  declaring 16 MiB was buffered although we advertise 1 MiB), bounding a header block,
  joining CONTINUATIONs, copying each frame's body once; the frames are quiet subclasses
  (:func:`_quiet`) whose ``repr`` does not copy and hex-encode the payload.
* :class:`CorkedTransport`: everything written during one pass of the event loop leaves
  in one ``send`` (grpclib alone makes three per unary response; each ``send`` releases
  the GIL, and the event loop then waits on the device thread).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import h2.exceptions
import h2.settings
from h2.frame_buffer import FrameBuffer
from h2.settings import SettingCodes
from hyperframe.exceptions import InvalidDataError, InvalidFrameError, InvalidPaddingError
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from .limits import WireLimits

if TYPE_CHECKING:
    from h2.connection import H2Connection

    from .h2lean import ServerConnection

#: Buffered writes at least this large are sent at once instead of at the end of the pass.
FLUSH_BYTES = 256 * 1024
#: What h2 sees as our stream limit: never reached, since we enforce ours per stream.
_UNCOUNTED = 2**32 + 1
_HEADER_FRAMES = (0x1, 0x5, 0x9)  # HEADERS, PUSH_PROMISE, CONTINUATION


class _Settings(h2.settings.Settings):
    """Our SETTINGS as h2 keeps them, except for the stream count h2 enforces.

    h2 treats a stream past SETTINGS_MAX_CONCURRENT_STREAMS as a *connection* error
    (``TooManyStreamsError``, GOAWAY), which drops every call of a client that raced our
    SETTINGS. RFC 9113 §5.1.2 lets a server refuse just that stream with REFUSED_STREAM,
    which gRPC clients retry; :mod:`.h2guard` does that. The advertised value is
    still ours: it is read through the mapping, not this property.
    """

    @property
    def max_concurrent_streams(self) -> int:
        return _UNCOUNTED

    @max_concurrent_streams.setter
    def max_concurrent_streams(self, value: int) -> None:
        self[SettingCodes.MAX_CONCURRENT_STREAMS] = value


def _quiet(frame_class: type[Frame]) -> type[Frame]:
    """``frame_class`` with a cheap ``repr``: its name, stream and length, nothing else.

    ``H2Connection._receive_frame`` begins with
    ``logger.trace("Received frame: %s", repr(frame))``: the ``repr`` is built before the
    (by default no-op) logger is called. For a DATA frame hyperframe serializes the body
    (a copy) and hex-encodes all of it to show 20 characters: 15-30 us per 16 KiB frame, a
    third of the server's work for a 38 MB inline tensor; for HEADERS, SETTINGS, PING and
    WINDOW_UPDATE frames it formats the flags and hex-encodes the body, a few microseconds
    per frame and per small request (docs/benchmarks.md has the upstream fix). Our own
    connection (:mod:`.h2lean`) builds no ``repr``; the quiet classes stay because the
    DATA one parses its body without a copy, and because h2's connection, the reference
    in tests and benchmarks, is given the same frames (it dispatches on the exact class,
    so each quiet class is routed to h2's handler of its base).
    """

    def __repr__(self: Frame) -> str:
        return f"{frame_class.__name__}(stream_id={self.stream_id}, {self.body_len} bytes)"

    namespace: dict[str, Any] = {"__repr__": __repr__}
    if frame_class is DataFrame:
        namespace["parse_body"] = _parse_data_body
    return type(f"Quiet{frame_class.__name__}", (frame_class,), namespace)


def _parse_data_body(self: DataFrame, data: memoryview) -> None:
    """hyperframe's DATA ``parse_body`` without its copy of the payload.

    :class:`_FrameBuffer` hands each frame's body as a ``memoryview`` of a private copy (no
    one else holds or changes it), and hyperframe would copy the payload once more
    (``tobytes``) -- a sixth of the server's work on a 38 MB inline tensor. The payload
    stays a view of that copy; grpclib joins the views of a message once.
    """
    padding = self.parse_padding_data(data)
    self.data = data[padding : len(data) - self.pad_length]  # type: ignore[assignment]
    self.body_len = len(data)
    if self.pad_length and self.pad_length >= self.body_len:
        raise InvalidPaddingError("Padding is too long.")


#: The received frame classes given a cheap repr, and their quiet subclasses.
_QUIET: dict[type[Frame], type[Frame]] = {
    cls: _quiet(cls)
    for cls in (
        DataFrame,
        HeadersFrame,
        ContinuationFrame,
        SettingsFrame,
        PingFrame,
        WindowUpdateFrame,
        RstStreamFrame,
        GoAwayFrame,
        PriorityFrame,
    )
}


class _FrameBuffer(FrameBuffer):
    """h2's frame buffer, judging a frame's length from its 9-byte header.

    The same frames as h2's own buffer, with four changes:

    * a frame's length is judged from its header, before its body is waited for, and a
      header block (HEADERS plus CONTINUATIONs) is bounded, so nothing larger than the
      advertised frame size is ever allocated;
    * frames are cut straight from the bytes just received: h2 appends every read to one
      growing buffer first (a copy of everything received), slices each frame out of it
      (a second) and hyperframe copies a DATA payload once more (a third) -- together
      over a third of the server's work on a 38 MB inline tensor. Here a frame's body is
      copied once, into a buffer of its own: from the read that holds it whole, or, for a
      frame split between reads, into a buffer allocated at its declared length and
      filled as the reads arrive (:meth:`_next_frame`); a DATA payload stays a view of
      that copy (:func:`_parse_data_body`);
    * a frame becomes its quiet subclass (:data:`_QUIET`) before its body is parsed.

    CONTINUATION bookkeeping stays h2's (``_update_header_buffer``).
    """

    def __init__(self, max_header_block: int) -> None:
        super().__init__(server=True)
        self._max_header_block = max_header_block
        #: What is left of the latest read, not yet cut into frames.
        self._rest = memoryview(b"")
        #: A frame header split between reads (fewer than 9 bytes so far).
        self._head = bytearray()
        #: A frame whose body is split between reads: its header, and its body,
        #: allocated once at its declared length and filled as reads arrive.
        self._header: bytes | memoryview = b""
        self._body: bytearray | None = None
        self._filled = 0

    def add_data(self, data: Any) -> None:  # any bytes-like object, as h2's
        if self._preamble_len:  # the client's preface: h2 checks it ...
            super().add_data(data)
            if self._preamble_len or not self._data:
                return
            data = bytes(self._data)  # ... and what followed it in the same read is ours
            self._data.clear()
        if self._rest:  # h2 always iterates to the end; stay correct if not
            data = self._rest.tobytes() + data
        self._rest = memoryview(data if isinstance(data, bytes) else bytes(data))

    def _judge(self, header: bytes | bytearray | memoryview) -> int:
        """The frame length a 9-byte header declares, refusing what we never accept."""
        length = int.from_bytes(header[:3], "big")
        if length > self.max_frame_size:
            raise h2.exceptions.FrameTooLargeError(
                f"a frame of {length} bytes exceeds the advertised "
                f"SETTINGS_MAX_FRAME_SIZE of {self.max_frame_size}"
            )
        if header[3] in _HEADER_FRAMES:
            block = length + sum(len(f.data) for f in self._headers_buffer)
            if block > self._max_header_block:
                raise h2.exceptions.DenialOfServiceError(
                    f"a header block of more than {self._max_header_block} bytes "
                    "(SETTINGS_MAX_HEADER_LIST_SIZE)"
                )
        return length

    def _next_frame(self) -> tuple[memoryview | bytes, bytes | bytearray]:
        """The next whole frame: (its 9-byte header, a private copy of its body).

        A frame within one read is cut from it (one copy, of the body); a frame split
        between reads has its body allocated once and filled as reads arrive (one copy
        too). StopIteration when no whole frame is left.
        """
        rest = self._rest
        if self._body is None:
            if self._head:  # a header split between reads
                take = 9 - len(self._head)
                self._head += rest[:take]
                rest = rest[take:]
                if len(self._head) < 9:
                    self._rest = rest
                    raise StopIteration
                header: memoryview | bytes = bytes(self._head)
                self._head.clear()
            elif len(rest) >= 9:
                header = rest[:9]
                end = 9 + self._judge(header)
                if len(rest) >= end:  # the whole frame in this read: the usual case
                    self._rest = rest[end:]
                    return header, rest[9:end].tobytes()
                header, rest = bytes(header), rest[9:]
            else:
                self._head += rest
                self._rest = memoryview(b"")
                raise StopIteration
            self._header = header
            self._body = bytearray(self._judge(header))
            self._filled = 0
        body, filled = self._body, self._filled
        take = min(len(body) - filled, len(rest))
        body[filled : filled + take] = rest[:take]
        self._filled = filled = filled + take
        self._rest = rest[take:]
        if filled < len(body):
            raise StopIteration
        self._body = None  # the frame owns it now; nothing writes to it again
        return self._header, body

    def __next__(self) -> Frame:
        header, body = self._next_frame()
        try:
            frame, _ = Frame.parse_frame_header(memoryview(header))
        except (InvalidDataError, InvalidFrameError) as err:
            raise h2.exceptions.ProtocolError(f"Received frame with invalid header: {err}") from err
        quiet = _QUIET.get(type(frame))
        if quiet is not None:
            frame.__class__ = quiet  # same layout, a cheap repr (see _quiet)
        try:
            frame.parse_body(memoryview(body))
        except InvalidDataError as err:
            raise h2.exceptions.ProtocolError("Received frame with non-compliant data") from err
        except InvalidFrameError as err:
            raise h2.exceptions.FrameDataMissingError("Frame data missing or invalid") from err
        whole = self._update_header_buffer(frame)
        return whole if whole is not None else self.__next__()


def new_h2_connection(limits: WireLimits) -> ServerConnection:
    """The server side of one HTTP/2 connection, every limit in its first SETTINGS frame.

    The values are current settings from the start, not pending ones: a peer that sends
    before it has read them is held to limits it could not know, which only ever makes us
    more permissive (larger frames and windows than it assumes), never stricter.
    """
    from .h2lean import ServerConnection  # h2lean builds on this module's frame buffer

    return ServerConnection(limits)


def h2_reference_connection(limits: WireLimits) -> H2Connection:
    """h2's own server connection, configured as ours was before :mod:`.h2lean`: the
    oracle ``tests/test_h2lean.py`` holds :class:`~.h2lean.ServerConnection` to, and the
    baseline of ``benchmarks/bench_h2lean.py``. Not used to serve."""
    from h2.config import H2Configuration
    from h2.connection import H2Connection

    conn = H2Connection(
        config=H2Configuration(
            client_side=False,
            header_encoding="ascii",
            validate_inbound_headers=False,  # ours: framing.request_head
            validate_outbound_headers=False,
            normalize_inbound_headers=False,
            normalize_outbound_headers=False,
        )
    )
    conn.local_settings = _Settings(client=False, initial_values=_local_settings(limits))
    conn.max_inbound_frame_size = limits.max_frame_size
    conn.decoder.max_header_list_size = limits.max_header_list_size
    conn.incoming_buffer = _FrameBuffer(limits.max_header_list_size)
    dispatch = conn._frame_dispatch_table
    for base, quiet in _QUIET.items():
        dispatch[quiet] = dispatch[base]
    return conn


def _local_settings(limits: WireLimits) -> dict[SettingCodes, int]:
    """Our SETTINGS: every limit, in the first SETTINGS frame."""
    return {
        SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
        SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
        SettingCodes.MAX_FRAME_SIZE: limits.max_frame_size,
        SettingCodes.INITIAL_WINDOW_SIZE: limits.stream_window,
        SettingCodes.ENABLE_PUSH: 0,
    }


class CorkedTransport:
    """The parts of an asyncio transport grpclib uses, with writes gathered per loop pass.

    ``write`` appends to a list and, the first time in a pass, schedules ``flush`` with
    ``call_soon``: everything written by the callbacks already queued goes out in one
    ``send``. Past :data:`FLUSH_BYTES` the buffer is sent at once, so big messages are
    not held (nor copied into one huge join).
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._size = 0
        self._scheduled = False

    def write(self, data: bytes) -> None:
        if not data:
            return
        self._pending.append(data)
        self._size += len(data)
        if self._size >= FLUSH_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False  # a flush still scheduled after an early one is a no-op
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        self._size = 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def discard(self) -> None:
        self._pending.clear()
        self._size = 0

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self.flush()  # e.g. a GOAWAY written just before closing
        self._transport.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)
