"""Received HTTP/2 frames, cut once and cheap to log: for h2's connection, either side.

The ends of ours that receive HTTP/2 through h2's connection and hyperframe's frame
classes use this: the Python client's channel (:mod:`reactantserver.client.channel`) and
h2's server connection as the reference of ours (:func:`.h2conn.h2_reference_connection`).
The server's own connection (:mod:`.h2lean`) cuts frames with the same code but builds no
frame objects (:class:`.h2parse.RawFrameCutter`, a subclass). It imports neither asyncio
nor grpclib, and nothing of ours but :mod:`.h2wire`'s numbers, so the client can use it
without the server's configuration.

* :class:`FrameCutter`: h2's ``FrameBuffer``, except that a frame's length is judged from
  its 9-byte header (h2's own buffer waits for the whole frame first, so a DATA frame
  declaring 16 MiB was buffered although we advertise 1 MiB), a header block is bounded,
  CONTINUATIONs are joined, and each frame's body is copied once.
* :data:`QUIET`: the received frame classes with a ``repr`` that does not copy and
  hex-encode the payload (:func:`_quiet`), and a DATA frame whose payload is a view.
* :func:`route_quiet_frames`: teaches an ``H2Connection``'s dispatch table the quiet
  classes (it dispatches on the exact class).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from h2.frame_buffer import FrameBuffer
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

from . import h2events, h2rules
from .h2wire import CONTINUATION, HEADERS, PUSH_PROMISE

if TYPE_CHECKING:
    from h2.connection import H2Connection

_HEADER_FRAMES = (HEADERS, PUSH_PROMISE, CONTINUATION)


def _quiet(frame_class: type[Frame]) -> type[Frame]:
    """``frame_class`` with a cheap ``repr``: its name, stream and length, nothing else.

    ``H2Connection._receive_frame`` begins with
    ``logger.trace("Received frame: %s", repr(frame))``: the ``repr`` is built before the
    (by default no-op) logger is called. For a DATA frame hyperframe serializes the body
    (a copy) and hex-encodes all of it to show 20 characters: 15-30 us per 16 KiB frame, a
    third of the server's work for a 38 MB inline tensor, and 14 % of the client's; for
    HEADERS, SETTINGS, PING and WINDOW_UPDATE frames it formats the flags and hex-encodes
    the body, a few microseconds per frame and per small request (docs/benchmarks.md has
    the upstream fix). The server's own connection (:mod:`.h2lean`) builds no frames at
    all (:mod:`.h2parse`); h2's connection (the client's, and the server's reference in
    tests and benchmarks) is given the quiet classes (it dispatches on the exact class, so
    each quiet class is routed to h2's handler of its base: :func:`route_quiet_frames`),
    and the DATA one parses its body without a copy.
    """

    def __repr__(self: Frame) -> str:
        return f"{frame_class.__name__}(stream_id={self.stream_id}, {self.body_len} bytes)"

    namespace: dict[str, Any] = {"__repr__": __repr__}
    if frame_class is DataFrame:
        namespace["parse_body"] = _parse_data_body
    return type(f"Quiet{frame_class.__name__}", (frame_class,), namespace)


def _parse_data_body(self: DataFrame, data: memoryview) -> None:
    """hyperframe's DATA ``parse_body`` without its copy of the payload.

    :class:`FrameCutter` hands each frame's body as a ``memoryview`` of a private copy (no
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
QUIET: dict[type[Frame], type[Frame]] = {
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


def route_quiet_frames(conn: H2Connection) -> None:
    """Have h2's ``conn`` handle each quiet frame class as its base (its own handler)."""
    dispatch = conn._frame_dispatch_table
    for base, quiet in QUIET.items():
        dispatch[quiet] = dispatch[base]


class FrameCutter(FrameBuffer):
    """h2's frame buffer, judging a frame's length from its 9-byte header.

    The same frames as h2's own buffer (``server=True``: after checking the client's
    preface; ``server=False``: from the first byte, as a client receives), with four
    changes:

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
    * a frame becomes its quiet subclass (:data:`QUIET`) before its body is parsed.

    CONTINUATION bookkeeping stays h2's (``_update_header_buffer``).
    """

    def __init__(self, max_header_block: int, *, server: bool = True) -> None:
        super().__init__(server=server)
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
        broken = h2rules.frame_size(length, self.max_frame_size)
        if broken is not None:
            raise h2events.FrameTooLargeError(broken.message)
        if header[3] in _HEADER_FRAMES:
            broken = h2rules.header_block(length + self._block_so_far(), self._max_header_block)
            if broken is not None:
                raise h2events.DenialOfServiceError(broken.message)
        return length

    def _block_so_far(self) -> int:
        """The bytes of the header block buffered so far (0 outside a block)."""
        return sum(len(f.data) for f in self._headers_buffer)

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
            raise h2events.ProtocolError(f"Received frame with invalid header: {err}") from err
        quiet = QUIET.get(type(frame))
        if quiet is not None:
            frame.__class__ = quiet  # same layout, a cheap repr (see _quiet)
        try:
            frame.parse_body(memoryview(body))
        except InvalidDataError as err:
            raise h2events.ProtocolError("Received frame with non-compliant data") from err
        except InvalidFrameError as err:
            raise h2events.FrameDataMissingError("Frame data missing or invalid") from err
        whole = self._update_header_buffer(frame)
        return whole if whole is not None else self.__next__()
