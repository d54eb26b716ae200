"""Received HTTP/2 frames as hyperframe's frame objects, for h2's connection, either side.

Test-only (src/ imports neither h2 nor hyperframe): h2's server connection, the reference
of ours in tests and benchmarks (``tests/h2_reference.py``, ``tests/h2/test_h2conn.py``), is
fed through this. Frames are cut by the one reader every end of ours uses
(:class:`~reactantserver.h2.parse.FrameReader`:
the preface, a frame's length judged from its 9-byte header, header blocks bounded and
joined, each body copied at most once); this module only turns what it yields into
hyperframe frames, through hyperframe's public methods.

* :class:`HyperframeReader`: what h2's connection takes as its ``incoming_buffer``; the
  reader's errors become h2's own exceptions (what h2's ``receive_data`` handles).
* :data:`QUIET`: the received frame classes with a ``repr`` that does not copy and
  hex-encode the payload (:func:`_quiet`), and a DATA frame whose payload is a view.
* :func:`route_quiet_frames`: teaches an ``H2Connection``'s dispatch table the quiet
  classes (it dispatches on the exact class).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import h2.exceptions
from hyperframe.exceptions import InvalidDataError, InvalidFrameError, InvalidPaddingError
from hyperframe.frame import (
    FRAMES,
    ContinuationFrame,
    DataFrame,
    ExtensionFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from reactantserver.h2 import events as h2events
from reactantserver.h2.parse import FrameReader, RawFrame
from reactantserver.h2.wire import DEFAULT_FRAME

if TYPE_CHECKING:
    from h2.connection import H2Connection


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

    :class:`HyperframeReader` hands each frame's body as a ``memoryview`` of the read that
    held it, or of the one copy made of a frame split between reads (nothing changes
    either), and hyperframe would copy the payload once more (``tobytes``) -- a sixth of
    the server's work on a 38 MB inline tensor. The payload stays a view; grpclib joins
    the views of a message once.
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


#: Our reader's exceptions as h2's, most specific first.
_AS_H2: tuple[tuple[type[h2events.ProtocolError], type[h2.exceptions.ProtocolError]], ...] = (
    (h2events.FrameTooLargeError, h2.exceptions.FrameTooLargeError),
    (h2events.FrameDataMissingError, h2.exceptions.FrameDataMissingError),
    (h2events.DenialOfServiceError, h2.exceptions.DenialOfServiceError),
    (h2events.ProtocolError, h2.exceptions.ProtocolError),
)


def _as_h2(err: h2events.ProtocolError) -> h2.exceptions.ProtocolError:
    kind = next(theirs for ours, theirs in _AS_H2 if isinstance(err, ours))
    return kind(str(err))


class HyperframeReader:
    """h2's ``incoming_buffer``, cut by :class:`~reactantserver.h2.parse.FrameReader`:
    each frame it yields becomes its hyperframe frame (the quiet subclass, :data:`QUIET`),
    with h2's errors for what the reader or hyperframe refuses. ``server``: the peer is a
    client (its preface is checked)."""

    def __init__(self, max_header_block: int, *, server: bool = True) -> None:
        self.reader = FrameReader(server, DEFAULT_FRAME, max_header_block)

    @property
    def max_frame_size(self) -> int:
        return self.reader.max_frame_size

    @max_frame_size.setter
    def max_frame_size(self, value: int) -> None:  # h2 sets it before every read's frames
        self.reader.max_frame_size = value

    def add_data(self, data: bytes) -> None:
        try:
            self.reader.feed(data)
        except h2events.ProtocolError as err:
            raise _as_h2(err) from err

    def __iter__(self) -> HyperframeReader:
        return self

    def __next__(self) -> Frame:
        try:
            raw: RawFrame | None = self.reader.next_frame()
        except h2events.ProtocolError as err:
            raise _as_h2(err) from err
        if raw is None:
            raise StopIteration
        kind, flags, sid, body = raw
        known = FRAMES.get(kind)
        if known is None:
            return ExtensionFrame(type=kind, stream_id=sid, flag_byte=flags, body=bytes(body))
        frame = QUIET.get(known, known)(sid)  # the reader has checked the stream id
        frame.parse_flags(flags)
        try:
            frame.parse_body(body)
        except InvalidDataError as err:
            raise h2.exceptions.ProtocolError("Received frame with non-compliant data") from err
        except InvalidFrameError as err:
            raise h2.exceptions.FrameDataMissingError("Frame data missing or invalid") from err
        return frame
