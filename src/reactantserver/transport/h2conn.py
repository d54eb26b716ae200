"""The HTTP/2 connection as a hardened server configures it, and its corked writes.

Two pieces the connection layer (:mod:`.h2guard`) builds on, each a small adjustment of
h2 or asyncio with the reason beside it:

* :func:`new_h2_connection`: an h2 server connection whose *first* SETTINGS frame
  carries every limit of :class:`~.limits.WireLimits` (stream count, header list size,
  frame size, stream window), in force from the first byte. Two h2 behaviours are
  changed, each in one small subclass: :class:`_Settings` hides our stream limit from
  h2's own check (h2 treats one stream too many as a connection error; the guard
  refuses just that stream), and :class:`_FrameBuffer` judges a frame's length from its
  9-byte header (h2 waits for the whole frame first, so a DATA frame declaring 16 MiB
  was buffered although we advertise 1 MiB) and bounds a header block; it also hands h2
  its DATA frames as :class:`_DataFrame`, whose ``repr`` does not copy and hex-encode the
  whole payload (h2 builds every received frame's ``repr`` for a trace log that is off).
* :class:`CorkedTransport`: everything written during one pass of the event loop leaves
  in one ``send`` (grpclib alone makes three per unary response; each ``send`` releases
  the GIL, and the event loop then waits on the device thread).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h2.config
import h2.exceptions
import h2.settings
from h2.connection import H2Connection
from h2.frame_buffer import FrameBuffer
from h2.settings import SettingCodes
from hyperframe.frame import DataFrame

from .limits import WireLimits

#: Buffered writes at least this large are sent at once instead of at the end of the pass.
FLUSH_BYTES = 256 * 1024
#: h2's configuration for a server, as grpclib sets it (header validation is ours).
H2_CONFIG = h2.config.H2Configuration(
    client_side=False,
    header_encoding="ascii",
    validate_inbound_headers=False,
    validate_outbound_headers=False,
    normalize_inbound_headers=False,
    normalize_outbound_headers=False,
)
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


class _DataFrame(DataFrame):
    """A received DATA frame whose ``repr`` is cheap.

    ``H2Connection._receive_frame`` begins with
    ``logger.trace("Received frame: %s", repr(frame))``: the ``repr`` is built before the
    (by default no-op) logger is called, and hyperframe's DATA ``repr`` serializes the
    body (a copy) and hex-encodes all of it to show 20 characters: 15-30 us per 16 KiB
    frame, a third of the server's work for a 38 MB inline tensor (docs/benchmarks.md has
    the upstream fix). h2 dispatches on the exact class, so :func:`new_h2_connection`
    routes this class to h2's own DATA handler; nothing else changes.
    """

    def _body_repr(self) -> str:
        return f"<{len(self.data)} bytes>"


class _FrameBuffer(FrameBuffer):
    """h2's frame buffer, judging a frame's length from its 9-byte header."""

    def __init__(self, max_header_block: int) -> None:
        super().__init__(server=True)
        self._max_header_block = max_header_block

    def __next__(self) -> Any:
        data = self._data
        if len(data) >= 9:
            length = int.from_bytes(data[:3], "big")
            if length > self.max_frame_size:
                raise h2.exceptions.FrameTooLargeError(
                    f"a frame of {length} bytes exceeds the advertised "
                    f"SETTINGS_MAX_FRAME_SIZE of {self.max_frame_size}"
                )
            if data[3] in _HEADER_FRAMES:
                block = length + sum(len(f.data) for f in self._headers_buffer)
                if block > self._max_header_block:
                    raise h2.exceptions.DenialOfServiceError(
                        f"a header block of more than {self._max_header_block} bytes "
                        "(SETTINGS_MAX_HEADER_LIST_SIZE)"
                    )
        frame = super().__next__()
        if type(frame) is DataFrame:
            frame.__class__ = _DataFrame  # same layout, a cheap repr (its docstring)
        return frame


def new_h2_connection(limits: WireLimits) -> H2Connection:
    """An h2 server connection whose first SETTINGS frame carries every limit.

    The values are h2's *current* settings from the start, not pending ones: a peer
    that sends before it has read them is held to limits it could not know, which only
    ever makes us more permissive (larger frames and windows than it assumes), never
    stricter.
    """
    conn = H2Connection(config=H2_CONFIG)
    conn.local_settings = _Settings(
        client=False,
        initial_values={
            SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
            SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
            SettingCodes.MAX_FRAME_SIZE: limits.max_frame_size,
            SettingCodes.INITIAL_WINDOW_SIZE: limits.stream_window,
            SettingCodes.ENABLE_PUSH: 0,
        },
    )
    conn.max_inbound_frame_size = limits.max_frame_size
    conn.decoder.max_header_list_size = limits.max_header_list_size
    conn.incoming_buffer = _FrameBuffer(limits.max_header_list_size)
    dispatch = conn._frame_dispatch_table
    dispatch[_DataFrame] = dispatch[DataFrame]
    return conn


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
