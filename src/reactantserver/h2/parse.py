"""Received HTTP/2 frames read straight from their bytes, for either role.

:class:`FrameReader` cuts frames from the reads (lengths judged from the 9-byte header,
header blocks bounded and joined, each body copied at most once) and yields ``(type,
flags, stream_id, body)``; the connection (:mod:`.core`, both roles) dispatches on the
type byte to one handler per frame type, which reads its fields with this module's
parsers, by slicing -- no frame object per frame (hyperframe's cost a fifth of the
gateway's server-side CPU at 16 calls in flight). The tests' h2 reference reads through
it too (``tests/h2frames.py`` builds hyperframe frames from what it yields).

Errors: exactly h2's for each malformed frame
---------------------------------------------
h2's buffer and hyperframe refuse a malformed frame with h2's exceptions, and this module
with ours of the same names and codes (:mod:`.events`), checked in the same order
(tests/h2/test_h2lean.py and tests/h2/test_h2conn.py feed both the same bytes):

0. the client's connection preface (server role; :meth:`FrameReader.feed`) ->
   ``ProtocolError("Invalid HTTP/2 preamble.")``; and, after (2), a first frame that is
   not the peer's SETTINGS -> ``ProtocolError`` (RFC 9113 §3.4; h2 does not check this);
1. from the 9-byte header, before the body is waited for (FrameReader._judge): a frame
   longer than our SETTINGS_MAX_FRAME_SIZE -> ``FrameTooLargeError``; a header block past
   the bound -> ``DenialOfServiceError``;
2. the stream id against the type (hyperframe's constructors): DATA, HEADERS, PRIORITY,
   RST_STREAM, PUSH_PROMISE and CONTINUATION on stream 0, or SETTINGS, PING and GOAWAY on
   a stream -> ``ProtocolError("Received frame with invalid header: ...")``;
3. the body (hyperframe's ``parse_body``; here the parsers below): a body too short, or of
   the wrong size for its type -> ``FrameDataMissingError``; a value the type forbids (a
   SETTINGS ACK with a payload, a WINDOW_UPDATE increment past 2^31-1, a promised
   stream id that is 0 or odd) -> ``ProtocolError("Received frame with non-compliant
   data")``; padding as long as the body -> ``ProtocolError("Received frame with invalid
   padding.")``;
4. the header block (h2's ``_update_header_buffer``): anything but a CONTINUATION on the
   block's stream while a block is open -> ``ProtocolError("Invalid frame during header
   block.")``, *after* that frame's own body was checked (3); more than 64 frames in one
   block -> ``ProtocolError("Too many continuation frames received.")``;
5. then the connection's own rules (h2core), which see a body that passed (3): a handler
   parses its body before it changes any state, and a frame refused by the connection's
   state alone is checked with :func:`check_body` first.

Header blocks: a HEADERS or PUSH_PROMISE without END_HEADERS is checked (3) and held;
CONTINUATIONs on its stream are joined to it, and the whole block is yielded as one frame
of the first one's type, flags and stream, with END_HEADERS set and PADDED cleared: its
body is the priority fields (HEADERS with PRIORITY) or the promised stream id
(PUSH_PROMISE), then the joined block -- a frame the handler reads as if it had arrived
whole.
"""

from __future__ import annotations

from collections.abc import Callable

from . import events as h2events
from .wire import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    FRAME_HEAD,
    GOAWAY,
    HEADERS,
    MAX_STREAM_ID,
    MAX_WINDOW,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
)

#: A received frame's body: a view of the read that held it whole, or of the one copy made
#: of a frame split between reads; nothing writes to either again.
Body = memoryview
#: A received frame, as :class:`FrameReader` yields it: type, flags, stream id, body.
RawFrame = tuple[int, int, int, Body]
#: A PRIORITY frame's (or a HEADERS frame's) priority fields: the stream depended on, the
#: weight byte as sent (weight - 1) and the exclusive bit.
Priority = tuple[int, int, bool]

ALTSVC = 0xA
#: Frames one header block may span at most, its HEADERS (or PUSH_PROMISE) included (h2's
#: ``CONTINUATION_BACKLOG``): a flood of tiny CONTINUATIONs costs a frame's work each.
MAX_BLOCK_FRAMES = 64
#: The frame types HTTP/2 (and RFC 7838's ALTSVC) define, by name; others are extensions.
FRAME_NAMES = {
    DATA: "DATA",
    HEADERS: "HEADERS",
    PRIORITY: "PRIORITY",
    RST_STREAM: "RST_STREAM",
    SETTINGS: "SETTINGS",
    PUSH_PROMISE: "PUSH_PROMISE",
    PING: "PING",
    GOAWAY: "GOAWAY",
    WINDOW_UPDATE: "WINDOW_UPDATE",
    CONTINUATION: "CONTINUATION",
    ALTSVC: "ALTSVC",
}
KNOWN_TYPES = frozenset(FRAME_NAMES)

_ON_A_STREAM = frozenset({DATA, HEADERS, PRIORITY, RST_STREAM, PUSH_PROMISE, CONTINUATION})
_ON_THE_CONNECTION = frozenset({SETTINGS, PING, GOAWAY})
_BLOCK_KINDS = frozenset({HEADERS, PUSH_PROMISE, CONTINUATION})
#: What is left of a read that is all taken: no view of it, so that it can go as soon as
#: the frames cut from it are done with (not only at the next read).
_NOTHING = memoryview(b"")


def _stream_id_fits(kind: int, sid: int) -> bool:
    """hyperframe's rule: a stream's frames name one, the connection's name none."""
    return sid != 0 if kind in _ON_A_STREAM else not (sid and kind in _ON_THE_CONNECTION)


def _missing(detail: str) -> h2events.FrameDataMissingError:
    return h2events.FrameDataMissingError(f"Frame data missing or invalid: {detail}")


def _noncompliant(detail: str) -> h2events.ProtocolError:
    return h2events.ProtocolError(f"Received frame with non-compliant data: {detail}")


def _bad_padding() -> h2events.ProtocolError:
    return h2events.ProtocolError("Received frame with invalid padding.")


def _u32(body: Body, at: int) -> int:
    return int.from_bytes(body[at : at + 4], "big")


def _padding(flags: int, body: Body) -> tuple[int, int]:
    """The pad length and where the fields after the pad-length byte start."""
    if not flags & PADDED:
        return 0, 0
    if not body:
        raise _missing("Invalid Padding data")
    return body[0], 1


# ---------------------------------------------------------------------- the parsers


def data(flags: int, body: Body) -> tuple[memoryview, int]:
    """A DATA frame's payload (a view of ``body``, no copy) and its flow-controlled length
    (the whole body: payload, padding and the pad-length byte)."""
    if not flags & PADDED:
        return body, len(body)
    pad = _padding(flags, body)[0]
    if pad and pad >= len(body):
        raise _bad_padding()
    return body[1 : len(body) - pad], len(body)


def priority_fields(body: Body, at: int) -> Priority:
    """The 5 priority bytes at ``at``: (depends on, weight byte, exclusive)."""
    word = _u32(body, at)
    return word & 0x7FFFFFFF, body[at + 4], bool(word >> 31)


def headers(flags: int, body: Body) -> tuple[bytes, Priority | None]:
    """A HEADERS frame's header block fragment and its priority fields (None without the
    PRIORITY flag)."""
    if not flags & (PADDED | PRIORITY_FLAG):
        return bytes(body), None
    pad, start = _padding(flags, body)
    rest = len(body) - start  # hyperframe's body length: after the pad-length byte
    fields = None
    if flags & PRIORITY_FLAG:
        if rest < 5:
            raise _missing("Invalid Priority data")
        fields = priority_fields(body, start)
        start += 5
    if pad and pad >= rest:
        raise _bad_padding()
    return bytes(body[start : len(body) - pad]), fields


def push_promise(flags: int, body: Body) -> tuple[int, bytes]:
    """A PUSH_PROMISE frame's promised stream id and header block fragment."""
    pad, start = _padding(flags, body)
    if len(body) < start + 4:
        raise _missing("Invalid PUSH_PROMISE body")
    promised = _u32(body, start)
    if promised == 0 or promised % 2:
        raise _noncompliant(f"Invalid PUSH_PROMISE promised stream id: {promised}")
    if pad and pad >= len(body):
        raise _bad_padding()
    return promised, bytes(body[start + 4 : len(body) - pad])


def priority(flags: int, body: Body) -> Priority:
    """A PRIORITY frame's fields."""
    if len(body) != 5:
        raise _missing(f"PRIORITY must have 5 byte body: actual length {len(body)}.")
    return priority_fields(body, 0)


def rst_stream(flags: int, body: Body) -> int:
    """A RST_STREAM frame's error code."""
    if len(body) != 4:
        raise _missing(f"RST_STREAM must have 4 byte body: actual length {len(body)}.")
    return _u32(body, 0)


def settings(flags: int, body: Body) -> dict[int, int]:
    """A SETTINGS frame's values by code (a repeated code: its last value, in the place of
    its first), empty for an ACK."""
    if flags & ACK:
        if body:
            raise _noncompliant(f"SETTINGS ack frame must not have payload: got {len(body)} bytes")
        return {}
    if len(body) % 6:
        raise _missing("Invalid SETTINGS body")
    return {
        int.from_bytes(body[at : at + 2], "big"): _u32(body, at + 2)
        for at in range(0, len(body), 6)
    }


def ping(flags: int, body: Body) -> bytes:
    """A PING frame's opaque data."""
    if len(body) != 8:
        raise _missing(f"PING frame must have 8 byte length: got {len(body)}")
    return bytes(body)


def goaway(flags: int, body: Body) -> tuple[int, int, bytes]:
    """A GOAWAY frame's last stream id (as sent, reserved bit included, as hyperframe reads
    it), error code and additional data."""
    if len(body) < 8:
        raise _missing("Invalid GOAWAY body.")
    return _u32(body, 0), _u32(body, 4), bytes(body[8:])


def window_update(flags: int, body: Body) -> int:
    """A WINDOW_UPDATE frame's increment (0..2^31-1; the reserved bit is not masked, as
    hyperframe). A zero increment is the connection's to judge (RFC 9113 §6.9: a stream
    error on a stream, a connection error on the connection; h2 refuses it here)."""
    if len(body) != 4:
        raise _missing(f"WINDOW_UPDATE frame must have 4 byte length: got {len(body)}")
    increment = int.from_bytes(body, "big")  # read per WINDOW_UPDATE: two per call
    if increment > MAX_WINDOW:
        raise _noncompliant("WINDOW_UPDATE increment must be between 1 to 2^31-1")
    return increment


def altsvc(flags: int, body: Body) -> None:
    """Check an ALTSVC frame's body (origin length, origin); its fields are not used."""
    if len(body) < 2 or len(body) < 2 + int.from_bytes(body[:2], "big"):
        raise _missing("Invalid ALTSVC frame body.")


def check_body(kind: int, flags: int, body: Body) -> None:
    """Raise what a frame's body alone earns (step 3), whatever its type: for a frame
    refused by the state it arrives in, whose body h2 has checked first."""
    parse = _PARSERS.get(kind)
    if parse is not None:
        parse(flags, body)


#: Each frame type's parser (the connection calls them by name; :func:`check_body` here).
_PARSERS: dict[int, Callable[[int, Body], object]] = {
    DATA: data,
    HEADERS: headers,
    PRIORITY: priority,
    RST_STREAM: rst_stream,
    SETTINGS: settings,
    PUSH_PROMISE: push_promise,
    PING: ping,
    GOAWAY: goaway,
    WINDOW_UPDATE: window_update,
    ALTSVC: altsvc,
}


# ---------------------------------------------------------------------- the reader

#: A DATA body whole in its read is a view of the read when it is at least 1/VIEW_SHARE of it
#: (so a view keeps at most this many times its size alive), else a copy.
VIEW_SHARE = 4


class FrameReader:
    """Received bytes cut into frames, ``(type, flags, stream id, body)``, for either role.

    ``server``: the peer is a client, whose connection preface is checked first (by
    :meth:`feed`); in both roles the peer's first frame must be its SETTINGS (RFC 9113
    §3.4). ``max_frame_size`` and ``max_header_block``: the SETTINGS_MAX_FRAME_SIZE and
    SETTINGS_MAX_HEADER_LIST_SIZE we advertised. Use: :meth:`feed` each read, then
    iterate the frames it completed (the checks and their order: the module docstring).

    Each body is a ``memoryview`` copied at most once: a frame whole in one read is a
    view of that read (a ``bytes`` nothing changes), but for a DATA frame under
    :data:`VIEW_SHARE` of it, which is copied: a DATA payload is the one body a caller
    keeps, and a view would keep the whole read alive (a peer could otherwise make us
    hold a read's worth of memory per small DATA frame); a frame split between reads has its
    body allocated once, at the length its header declares (judged first, so nothing
    longer than we advertised is ever allocated), and filled as the reads arrive.

    ``pieces`` (the Python client's choice): an unpadded DATA frame split between reads
    is yielded a piece per read, each a DATA frame of its own (END_STREAM on the last),
    by the same view-or-copy rule -- a large answer is then never gathered here.
    """

    def __init__(
        self, server: bool, max_frame_size: int, max_header_block: int, *, pieces: bool = False
    ) -> None:
        self.max_frame_size = max_frame_size
        self.max_header_block = max_header_block
        #: Pass a DATA frame split between reads on a piece per read (below).
        self._pieces = pieces
        #: The DATA frame being passed on: its flags, stream id and payload bytes to come.
        self._split_flags = 0
        self._split_sid = 0
        self._split_left = 0
        #: What is still to come of the client's connection preface.
        self._preface = PREFACE if server else b""
        #: The peer's first frame (its SETTINGS) has arrived.
        self._settled = False
        #: Nothing is held over and the first frame came: the usual path may cut frames.
        self._plain = False
        #: What is left of the latest read, not yet cut into frames, and the read's length.
        self._rest = memoryview(b"")
        self._read = 0
        #: A frame header split between reads (fewer than 9 bytes so far).
        self._head = b""
        #: A frame whose body is split between reads: its header, and its body, allocated
        #: once at its declared length and filled as the reads arrive.
        self._header = b""
        self._body: bytearray | None = None
        self._filled = 0
        #: The open header block: its first frame's type, flags and stream id, the body
        #: prefix its joined frame gets, its fragments so far and their total length.
        self._block: tuple[int, int, int, bytes] | None = None
        self._fragments: list[bytes | memoryview] = []
        self._block_len = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """One read, to be cut by iterating (views of it stay valid: a ``bytes`` is
        kept as it is, anything else is copied once)."""
        data = data if isinstance(data, bytes) else bytes(data)
        if self._preface:
            take = min(len(self._preface), len(data))
            if data[:take] != self._preface[:take]:
                raise h2events.ProtocolError("Invalid HTTP/2 preamble.")
            self._preface = self._preface[take:]
            data = data[take:]
        if self._rest:  # the frames of the previous read were not all taken
            data = self._rest.tobytes() + data
        self._rest = memoryview(data)
        self._read = len(data)

    def next_frame(self) -> RawFrame | None:
        """The next frame the reads so far complete; None when there is none (feed the
        next read)."""
        # The usual frame first: whole in what is left of the read, nothing held over,
        # nothing to refuse. It is cut here with one unpack; anything else (a frame split
        # between reads, a block to join, the first frame, a frame some rule refuses)
        # takes the general path below from the same bytes, which gives the same frame
        # or the error. The usual end of a read (all of it taken) is the first test.
        rest = self._rest
        if self._plain and not rest:
            self._rest = _NOTHING  # no view of the read kept: it can go
            return None
        if self._plain and len(rest) >= 9:
            high, low, kind, flags, sid = FRAME_HEAD.unpack_from(rest)
            length = high << 8 | low
            end = 9 + length
            sid &= MAX_STREAM_ID
            if (
                end <= len(rest)
                and length <= self.max_frame_size
                # _stream_id_fits, written out: most frames of every call come this way
                and (sid != 0 if kind in _ON_A_STREAM else not (sid and kind in _ON_THE_CONNECTION))
                and (
                    kind not in _BLOCK_KINDS
                    or (flags & END_HEADERS and length <= self.max_header_block)
                )
            ):
                self._rest = rest[end:]
                if kind != DATA or length * VIEW_SHARE >= self._read:
                    return kind, flags, sid, rest[9:end]
                return kind, flags, sid, memoryview(rest[9:end].tobytes())
        try:
            return self._general()
        except StopIteration:  # no whole frame left in what was fed
            return None
        finally:  # the state the usual path needs, read once here rather than per frame
            self._plain = (
                self._settled
                and self._body is None
                and self._block is None
                and not self._split_left
                and not self._head
            )

    def _general(self) -> RawFrame:
        """The next frame by the general path (the module docstring's checks in order)."""
        while True:
            if self._split_left:
                return self._piece()
            cut = self._next_frame()
            if cut is None:  # a DATA frame passed on a piece per read begins
                continue
            header, body = cut
            kind, flags = header[3], header[4]
            sid = int.from_bytes(header[5:9], "big") & MAX_STREAM_ID
            if not _stream_id_fits(kind, sid):
                raise h2events.ProtocolError(
                    f"Received frame with invalid header: {FRAME_NAMES[kind]} on stream {sid}"
                )
            if not self._settled:
                self._first(kind, flags)
            if self._block is not None:
                whole = self._continue_block(kind, flags, sid, body)
                if whole is not None:
                    return whole
            elif kind in (HEADERS, PUSH_PROMISE) and not flags & END_HEADERS:
                self._open_block(kind, flags, sid, body)
            else:
                return kind, flags, sid, body

    def _first(self, kind: int, flags: int) -> None:
        """The peer's first frame: its SETTINGS, or a connection error (RFC 9113 3.4)."""
        if kind != SETTINGS or flags & ACK:
            name = FRAME_NAMES.get(kind, f"a frame of type {kind:#x}")
            if kind == SETTINGS:
                name = "a SETTINGS acknowledgement"
            raise h2events.ProtocolError(
                f"the peer's first frame was {name}, not its SETTINGS frame (RFC 9113 section 3.4)"
            )
        self._settled = True

    def _judge(self, header: bytes | memoryview) -> int:
        """The frame length a 9-byte header declares, refusing what we never accept."""
        length = int.from_bytes(header[:3], "big")
        if length > self.max_frame_size:  # RFC 9113 §4.2
            raise h2events.FrameTooLargeError(
                f"a frame of {length} bytes exceeds the advertised SETTINGS_MAX_FRAME_SIZE "
                f"of {self.max_frame_size}"
            )
        if header[3] in _BLOCK_KINDS and length + self._block_len > self.max_header_block:
            raise h2events.DenialOfServiceError(  # §10.5.1: ENHANCE_YOUR_CALM
                f"a header block of more than {self.max_header_block} bytes "
                "(SETTINGS_MAX_HEADER_LIST_SIZE)"
            )
        return length

    def _next_frame(self) -> tuple[bytes | memoryview, Body] | None:
        """The next whole frame: (its 9-byte header, its body); None when a DATA frame
        is to be passed on a piece per read (``pieces``). StopIteration when no whole
        frame is left."""
        rest = self._rest
        if self._body is None:
            if self._head:  # a header split between reads
                take = 9 - len(self._head)
                self._head += rest[:take].tobytes()
                rest = rest[take:]
                if len(self._head) < 9:
                    self._rest = _NOTHING  # the read is all taken: let it go
                    raise StopIteration
                header: bytes | memoryview = self._head
                self._head = b""
            elif len(rest) >= 9:
                header = rest[:9]
                end = 9 + self._judge(header)
                if len(rest) >= end:  # the whole frame in this read: the usual case
                    self._rest = rest[end:]
                    if (end - 9) * VIEW_SHARE >= self._read:
                        return header, rest[9:end]
                    return header, memoryview(rest[9:end].tobytes())
                header, rest = header.tobytes(), rest[9:]
            else:
                self._head = rest.tobytes()
                self._rest = _NOTHING
                raise StopIteration
            length = self._judge(header)
            if self._pieces and self._split(header, length):
                self._rest = rest
                return None
            self._header = bytes(header)
            self._body = bytearray(length)
            self._filled = 0
        body, filled = self._body, self._filled
        take = min(len(body) - filled, len(rest))
        body[filled : filled + take] = rest[:take]
        self._filled = filled = filled + take
        if filled < len(body):
            self._rest = _NOTHING
            raise StopIteration
        self._rest = rest[take:]
        self._body = None  # the frame owns it now; nothing writes to it again
        return self._header, memoryview(body)

    def _split(self, header: bytes | memoryview, length: int) -> bool:
        """Whether the frame of ``header``, whose body is not all here, is a DATA frame
        to pass on a piece per read (unpadded, on a stream, no block open, the peer's
        SETTINGS come); if so, it is now the one being passed on."""
        sid = int.from_bytes(header[5:9], "big") & MAX_STREAM_ID
        if header[3] != DATA or header[4] & PADDED or not sid:
            return False
        if not self._settled or self._block is not None:
            return False
        self._split_flags, self._split_sid, self._split_left = header[4], sid, length
        return True

    def _piece(self) -> RawFrame:
        """The next piece of the DATA frame being passed on: what this read holds of it."""
        rest = self._rest
        take = min(self._split_left, len(rest))
        if not take:
            self._rest = _NOTHING  # a view of the read kept here would keep it alive
            raise StopIteration
        self._split_left -= take
        self._rest = rest[take:]
        flags = self._split_flags if not self._split_left else self._split_flags & ~END_STREAM
        if take * VIEW_SHARE >= self._read:
            return DATA, flags, self._split_sid, rest[:take]
        return DATA, flags, self._split_sid, memoryview(rest[:take].tobytes())

    def _open_block(self, kind: int, flags: int, sid: int, body: Body) -> None:
        """A HEADERS or PUSH_PROMISE without END_HEADERS: checked now (as h2 parses it
        on arrival) and held until its last CONTINUATION."""
        if kind == HEADERS:
            fragment, fields = headers(flags, body)
            start = 1 if flags & PADDED else 0  # the priority fields follow the pad length
            prefix = b"" if fields is None else bytes(body[start : start + 5])
        else:
            promised, fragment = push_promise(flags, body)
            prefix = promised.to_bytes(4, "big")
        self._block = (kind, flags, sid, prefix)
        self._fragments = [fragment]
        self._block_len = len(fragment)

    def _continue_block(self, kind: int, flags: int, sid: int, body: Body) -> RawFrame | None:
        """The next frame while a header block is open: the joined block once the
        CONTINUATION with END_HEADERS arrives, else None (h2's rules: module docstring)."""
        assert self._block is not None
        first_kind, first_flags, first_sid, prefix = self._block
        if kind != CONTINUATION or sid != first_sid:
            check_body(kind, flags, body)  # its own errors first, as h2's buffer
            raise h2events.ProtocolError("Invalid frame during header block.")
        self._fragments.append(body)
        self._block_len += len(body)
        if len(self._fragments) > MAX_BLOCK_FRAMES:
            raise h2events.ProtocolError("Too many continuation frames received.")
        if not flags & END_HEADERS:
            return None
        joined = b"".join([prefix, *self._fragments])
        self._block, self._fragments, self._block_len = None, [], 0
        return first_kind, (first_flags & ~PADDED) | END_HEADERS, first_sid, memoryview(joined)
