"""The server side of an HTTP/2 connection, our own: sans-IO, without h2's per-frame layers.

Why
---
h2's ``H2Connection`` implements all of HTTP/2 for either side and pays for it on every
frame: two state machines stepped per event (connection and stream), a frame object built
and serialized for every frame we send, an HPACK encoder that searches its table and
Huffman-codes every header we send, and trace logging whose arguments are built although
the logger is off. For a small unary gRPC call that was ~100 us of the worker's ~280-840 us
of CPU (docs/benchmarks.md, Table 3). :class:`ServerConnection` does the same job for a
gRPC *server* in plain Python: see docs/benchmarks.md ("The lean HTTP/2 connection") for
the measured gain.

What it is
----------
Bytes in (``receive_data`` -> events), bytes out (``send_*`` queue frames,
``data_to_send`` hands them over); never a socket or a loop: :mod:`.h2guard` is the
asyncio edge that feeds it. Its methods keep the names and arguments of h2's
``H2Connection`` that the edge calls; its events, exceptions and codes are our own
(:mod:`.h2events`: slotted events with h2's names and fields, ``ProtocolError`` and its
subclasses carrying the GOAWAY's error code), and nothing here imports h2 or hyperframe:
h2 is the oracle of ``tests/test_h2lean.py`` only. Received bytes are cut into frames by
:class:`.h2parse.FrameReader` (preface check, frame length judged from the header, header
blocks bounded, CONTINUATION joined, each body copied at most once) as ``(type,
flags, stream id, body)``, no frame objects: the type byte picks a handler, which reads
its fields by slicing (:mod:`.h2parse`, which refuses a malformed frame as h2 and
hyperframe do, in their order); a DATA payload is a view of the read. Frames we send are
written as bytes directly.

Semantics (RFC 9113, server side; as h2 behaves, except where noted):

* streams: client-initiated, odd and increasing ids (else PROTOCOL_ERROR); idle -> open ->
  half-closed (remote) on END_STREAM -> closed when we end it too or on RST_STREAM either
  way. A closed stream leaves :attr:`streams` at once (h2 keeps it until its next new
  stream) and how it closed is remembered (the last 2^16 resets, as h2, but only the last
  1024 normal endings: :data:`MAX_ENDED_STREAMS`), so a frame on it gets h2's answer:
  DATA -> RST_STREAM STREAM_CLOSED (its bytes still count against, and are returned to,
  the connection window); HEADERS -> RST_STREAM STREAM_CLOSED after a reset, connection
  error STREAM_CLOSED after END_STREAM; WINDOW_UPDATE and RST_STREAM -> ignored.
  HEADERS or DATA on a half-closed (remote) stream -> RST_STREAM STREAM_CLOSED.
  Trailers without END_STREAM -> PROTOCOL_ERROR.
* flow control both ways: inbound DATA past a window -> FLOW_CONTROL_ERROR; our windows are
  reopened by :meth:`ServerConnection.acknowledge_received_data` once half a window is
  consumed (h2's ``WindowManager`` rule); WINDOW_UPDATE past 2^31-1 -> FLOW_CONTROL_ERROR,
  a zero increment -> PROTOCOL_ERROR, each a stream error on a stream (RST_STREAM, a reset
  the peer provoked, budgeted by the guard) and a connection error on the connection
  (RFC 9113 §6.9; h2 makes a zero increment a connection error on a stream too). We never
  send more than the peer's windows allow.
* SETTINGS applied and acknowledged at once (INITIAL_WINDOW_SIZE shifts every open
  stream's send window; MAX_FRAME_SIZE bounds our frames; HEADER_TABLE_SIZE: see HPACK);
  PING answered; PRIORITY reported; PUSH_PROMISE -> PROTOCOL_ERROR; unknown frame types
  reported (UnknownFrameReceived) and otherwise ignored; ALTSVC ignored; padding stripped.
* the client's preface must be followed by its SETTINGS frame (RFC 9113 §3.4): any other
  first frame is a connection error, PROTOCOL_ERROR (h2 does not check this).
* what the peer makes us do for nothing is reported, not judged: the frames that asked
  for nothing are counted (:attr:`~ServerConnection.wasted`), the streams we reset on a
  stream error it provoked are events; the guard's abuse budget (:mod:`.abuse`) is given
  the time and judges both -- MadeYouReset (CVE-2025-8671) resets and frame floods.
* GOAWAY either way closes the connection state: any later frame but GOAWAY is a
  PROTOCOL_ERROR, and nothing more may be sent but GOAWAY.
* a connection error queues GOAWAY (last stream id, error code) and raises.

What it refuses or leaves out: opening streams (a server never does; no push), priority
trees (reported, not kept), SETTINGS_MAX_CONCURRENT_STREAMS as a connection error (the
guard refuses one stream too many with REFUSED_STREAM, see :class:`.h2settings.ServerSettings`),
header validation (ours is :func:`.framing.request_head`, as with h2's ``H2_CONFIG``),
and the stream-level WINDOW_UPDATE on a half-closed (remote) stream (h2 sends one; the
peer may send nothing more on it).

HPACK (:mod:`.hpack_blocks`, shared with the gateway's client): received blocks are
decoded by ``hpack.Decoder`` (bounded by SETTINGS_MAX_HEADER_LIST_SIZE), a block that cannot
change the dynamic table once per connection while the table stays as it was. Our header
blocks are literals that never enter the dynamic table (static-table name index where there
is one, raw strings), so no table is searched, the peer's decoder table never changes, and
a block does not depend on what was sent before. When the peer lowers SETTINGS_HEADER_TABLE_SIZE below the 4096 bytes an encoder
starts with, the next block begins with a dynamic table size update (RFC 7541 §4.2).

Invariant (tests/test_h2lean.py): for the same client bytes, the events (class names and
key fields) and whether a connection error was raised (and its code) are those of h2's
``H2Connection`` -- except where noted above (a zero WINDOW_UPDATE on a stream, the first
frame after the preface), which that test leaves out and checks on its own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from enum import IntEnum

from hpack import HPACKError, OversizedHeaderListError

from . import h2events, h2parse, h2rules
from .h2events import (
    ConnectionState,
    ConnectionTerminated,
    DataReceived,
    ErrorCodes,
    Event,
    PingAckReceived,
    PingReceived,
    PriorityUpdated,
    RemoteSettingsChanged,
    RequestReceived,
    SettingCodes,
    SettingsAcknowledged,
    StreamEnded,
    StreamReset,
    TrailersReceived,
    UnknownFrameReceived,
    WindowUpdated,
)
from .h2parse import ALTSVC, FRAME_NAMES, KNOWN_TYPES, Body, FrameReader, Priority
from .h2settings import Settings, check_received, local_settings
from .h2wire import (
    ACK,
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_WINDOW,
    PING,
    PRIORITY,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame_head,
)
from .hpack_blocks import BlockDecoder, encode_headers, hpack_int
from .limits import WireLimits

#: A frame type's handler: (flags, stream id, body, the events so far).
_Handler = Callable[[int, int, Body, list[Event]], None]
#: The dynamic table size an HPACK encoder starts with (SETTINGS_HEADER_TABLE_SIZE default).
DEFAULT_TABLE = 4096
#: Closed streams whose ending is remembered. Those reset (RST_STREAM either way): as many
#: as h2 remembers closed streams of any kind -- a frame that arrives late on one is a
#: stream error, answered RST_STREAM(STREAM_CLOSED), where a forgotten one would be a
#: connection error ending every call of the peer (a client's cancel races its own DATA).
MAX_RESET_STREAMS = 2**16
#: Those ended normally (END_STREAM both ways): the latest only. A frame on one is a
#: connection error either way (STREAM_CLOSED while it is remembered, then PROTOCOL_ERROR
#: for a stream id too low, as h2 past its 2^16), and a busy connection ends one per call:
#: h2's 2^16 of them held about 6 MB per long-lived connection, on the worker and the
#: gateway alike.
MAX_ENDED_STREAMS = 1024


def _window_update(stream_id: int, increment: int) -> bytes:
    return frame_head(WINDOW_UPDATE, 0, stream_id, 4) + increment.to_bytes(4, "big")


def _rst(stream_id: int, code: int) -> bytes:
    return frame_head(RST_STREAM, 0, stream_id, 4) + int(code).to_bytes(4, "big")


def _ascii_field(name: bytes, value: bytes) -> tuple[str, str]:
    """A header's name and value as text (grpclib's ``header_encoding``);
    UnicodeDecodeError for a byte that is not ASCII."""
    return name.decode("ascii"), value.decode("ascii")


# ---------------------------------------------------------------------- HPACK (ours)


class _BlockCache:
    """Encoded blocks of the constant header lists (keyed by the list object itself).

    ``unary.ANSWER_HEADERS`` and ``OK_TRAILERS`` are module constants sent on every
    call; their blocks are table-independent, so each is encoded once. A list is keyed by
    identity and kept alive here, so an id is never reused by another list; only lists
    passed to :meth:`remember` are cached.
    """

    def __init__(self) -> None:
        self._blocks: dict[int, tuple[object, bytes]] = {}

    def remember(self, headers: Sequence[tuple[str, str]]) -> None:
        self._blocks[id(headers)] = (headers, encode_headers(headers))

    def get(self, headers: object) -> bytes | None:
        hit = self._blocks.get(id(headers))
        return hit[1] if hit is not None and hit[0] is headers else None


#: Header lists sent on every call, registered by their owners (:mod:`.server`).
CONSTANT_BLOCKS = _BlockCache()


# ---------------------------------------------------------------------- streams


class StreamState(IntEnum):
    OPEN = 1
    HALF_CLOSED_REMOTE = 2
    HALF_CLOSED_LOCAL = 3
    CLOSED = 4


class ClosedBy(IntEnum):
    END = 1  # END_STREAM both ways
    RESET = 2  # RST_STREAM either way


class _Window:
    """Our receive window, reopened as h2's ``WindowManager`` does (half-window rule)."""

    __slots__ = ("max_size", "processed", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.max_size = size
        self.processed = 0

    def consumed(self, n: int) -> None:
        self.size -= n
        if self.size < 0:
            broken = h2rules.received(n, self.size + n, "a receive window")
            assert broken is not None
            raise h2events.FlowControlError(broken.message)

    def opened(self, n: int) -> None:
        self.size += n
        if self.size > MAX_WINDOW:
            raise h2events.FlowControlError(f"window of {self.size} bytes past 2^31-1")
        if self.size > self.max_size:
            self.max_size = self.size

    def processed_bytes(self, n: int) -> int:
        """The increment to announce after the application processed ``n`` bytes."""
        self.processed += n
        processed = self.processed
        if not processed:
            return 0
        if (self.size == 0 and processed > min(1024, self.max_size // 4)) or (
            processed >= self.max_size // 2
        ):
            increment = min(processed, self.max_size - self.size)
            self.processed = 0
            self.size += increment
            return increment
        return 0


class _StateMachine:
    """Where ``headers_sent`` lives for h2's callers (``stream.state_machine``)."""

    __slots__ = ("headers_sent", "state")

    def __init__(self) -> None:
        self.headers_sent = False
        self.state = StreamState.OPEN


class H2Stream:
    """One stream's state: the subset of h2's ``H2Stream`` its callers read."""

    __slots__ = ("recv_window", "send_window", "state_machine", "stream_id")

    def __init__(self, stream_id: int, send_window: int, recv_window: int) -> None:
        self.stream_id = stream_id
        self.state_machine = _StateMachine()
        self.send_window = send_window
        self.recv_window = _Window(recv_window)

    @property
    def open(self) -> bool:
        return self.state_machine.state is not StreamState.CLOSED

    @property
    def closed(self) -> bool:
        return self.state_machine.state is StreamState.CLOSED


class _ConnectionStateMachine:
    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = ConnectionState.IDLE


# ---------------------------------------------------------------------- the connection


class ServerConnection:
    """The server side of one HTTP/2 connection (module docstring)."""

    def __init__(self, limits: WireLimits) -> None:
        self.local_settings = Settings(client=False, initial_values=local_settings(limits))
        self.remote_settings = Settings(client=True)
        self.state_machine = _ConnectionStateMachine()
        self.streams: dict[int, H2Stream] = {}
        self.highest_inbound_stream_id = 0
        self.max_outbound_frame_size = self.remote_settings.max_frame_size
        #: The peer's SETTINGS_INITIAL_WINDOW_SIZE, read per new stream.
        self._initial_send_window = self.remote_settings.initial_window_size
        self.outbound_flow_control_window = DEFAULT_WINDOW
        self._recv_window = _Window(DEFAULT_WINDOW)
        self._stream_window = limits.stream_window
        self._blocks = BlockDecoder(_ascii_field, limits.max_header_list_size)
        self.reader = FrameReader(
            server=True,
            max_frame_size=limits.max_frame_size,
            max_header_block=limits.max_header_list_size,
        )
        self._out: list[bytes | memoryview] = []
        #: The closed streams remembered (oldest first): reset, and ended normally.
        self._resets: OrderedDict[int, None] = OrderedDict()
        self._endings: OrderedDict[int, None] = OrderedDict()
        #: Frames that asked for nothing (PING, SETTINGS, DATA without payload or
        #: END_STREAM, a frame on a closed stream answered RST_STREAM), counted for the
        #: guard's abuse budget (:mod:`.abuse`, which is given the time). The streams we
        #: reset on a stream error the peer provoked are reported as events
        #: (``StreamReset`` with ``remote_reset`` False), which the guard budgets.
        self.wasted = 0
        #: A dynamic table size update owed at the start of our next header block.
        self._table_update: bytes = b""
        self._table_size = DEFAULT_TABLE
        # A handler per frame type: (flags, stream id, body, events).
        self._dispatch: dict[int, _Handler] = {
            DATA: self._on_data,
            HEADERS: self._on_headers,
            PRIORITY: self._on_priority,
            RST_STREAM: self._on_rst_stream,
            SETTINGS: self._on_settings,
            PUSH_PROMISE: self._on_push_promise,
            PING: self._on_ping,
            GOAWAY: self._on_goaway,
            WINDOW_UPDATE: self._on_window_update,
            CONTINUATION: self._on_continuation,
            ALTSVC: self._on_altsvc,
        }

    # ------------------------------------------------------------------ output

    def initiate_connection(self) -> None:
        body = b"".join(
            int(code).to_bytes(2, "big") + value.to_bytes(4, "big")
            for code, value in self.local_settings.items()
        )
        self._out.append(frame_head(SETTINGS, 0, 0, len(body)) + body)

    def data_to_send(self) -> bytes:
        """Everything queued to send, in order, as one ``bytes`` (then forgotten)."""
        out = self._out
        if not out:
            return b""
        data = b"".join(out) if len(out) > 1 or not isinstance(out[0], bytes) else out[0]
        out.clear()
        return data

    def _sendable(self, stream_id: int) -> H2Stream:
        """The stream we may send on now, or h2's exception for why not."""
        if self.state_machine.state is ConnectionState.CLOSED:
            raise h2events.ProtocolError("the connection is closed (GOAWAY)")
        stream = self.streams.get(stream_id)
        if stream is None:
            raise self._missing(stream_id)
        state = stream.state_machine.state
        if state is StreamState.HALF_CLOSED_LOCAL:  # we ended it: h2's error, too
            raise h2events.ProtocolError(f"stream {stream_id} was ended by this side")
        if state is StreamState.CLOSED:
            raise h2events.StreamClosedError(stream_id)
        return stream

    def _end_local(self, stream: H2Stream) -> None:
        sm = stream.state_machine
        if sm.state is StreamState.HALF_CLOSED_REMOTE:
            self._close(stream, ClosedBy.END)
        else:
            sm.state = StreamState.HALF_CLOSED_LOCAL

    def send_headers(
        self,
        stream_id: int,
        headers: Iterable[tuple[str, str]],
        end_stream: bool = False,
    ) -> None:
        stream = self._sendable(stream_id)
        sm = stream.state_machine
        if sm.headers_sent and not end_stream:
            raise h2events.ProtocolError("Trailers must have END_STREAM set")
        block = CONSTANT_BLOCKS.get(headers)
        if block is None:
            block = encode_headers(headers)
        if self._table_update:
            block = self._table_update + block
            self._table_update = b""
        flags = END_STREAM if end_stream else 0
        limit = self.max_outbound_frame_size
        if len(block) <= limit:
            self._out.append(frame_head(HEADERS, flags | END_HEADERS, stream_id, len(block)))
            self._out.append(block)
        else:
            first, rest = block[:limit], block[limit:]
            self._out.append(frame_head(HEADERS, flags, stream_id, len(first)) + first)
            while rest:
                piece, rest = rest[:limit], rest[limit:]
                last = END_HEADERS if not rest else 0
                self._out.append(frame_head(CONTINUATION, last, stream_id, len(piece)) + piece)
        sm.headers_sent = True
        if end_stream:
            self._end_local(stream)

    def send_data(
        self,
        stream_id: int,
        data: bytes | memoryview,
        end_stream: bool = False,
    ) -> None:
        stream = self._sendable(stream_id)
        size = len(data) if isinstance(data, bytes) else memoryview(data).nbytes
        if size > self.max_outbound_frame_size:
            raise h2events.FrameTooLargeError(
                f"Cannot send frame size {size}, max is {self.max_outbound_frame_size}"
            )
        if size > stream.send_window or size > self.outbound_flow_control_window:
            raise h2events.FlowControlError(
                f"Cannot send {size} bytes, flow control window is "
                f"{min(stream.send_window, self.outbound_flow_control_window)}"
            )
        stream.send_window -= size
        self.outbound_flow_control_window -= size
        self._out.append(frame_head(DATA, END_STREAM if end_stream else 0, stream_id, size))
        if size:
            self._out.append(data)
        if end_stream:
            self._end_local(stream)

    def send_answer(
        self,
        stream_id: int,
        headers: Sequence[tuple[str, str]],
        data: Sequence[bytes | memoryview],
        size: int,
        trailers: Sequence[tuple[str, str]],
    ) -> bool:
        """A whole small answer in one step: HEADERS, one DATA frame holding ``data``
        (``size`` bytes, sent as the pieces they are) and the trailers with END_STREAM --
        exactly what ``send_headers``, ``send_data`` and ``send_headers(end_stream=True)``
        would queue, with the stream checked once. ``headers`` and ``trailers`` must be
        constant lists (:data:`CONSTANT_BLOCKS`). False, with nothing queued, when any of
        that does not hold as the three calls need it (headers sent already, a block or
        ``size`` over the frame size, ``size`` over a window, a table size update owed):
        the caller takes the three-call path, which raises what h2 would.
        """
        stream = self._sendable(stream_id)
        head = CONSTANT_BLOCKS.get(headers)
        tail = CONSTANT_BLOCKS.get(trailers)
        limit = self.max_outbound_frame_size
        if (
            head is None
            or tail is None
            or self._table_update
            or stream.state_machine.headers_sent
            or size > limit
            or len(head) > limit
            or len(tail) > limit
            or size > stream.send_window
            or size > self.outbound_flow_control_window
        ):
            return False
        stream.send_window -= size
        self.outbound_flow_control_window -= size
        out = self._out
        out.append(frame_head(HEADERS, END_HEADERS, stream_id, len(head)))
        out.append(head)
        out.append(frame_head(DATA, 0, stream_id, size))
        out.extend(data)
        out.append(frame_head(HEADERS, END_STREAM | END_HEADERS, stream_id, len(tail)))
        out.append(tail)
        stream.state_machine.headers_sent = True
        self._end_local(stream)
        return True

    def reset_stream(self, stream_id: int, error_code: ErrorCodes | int = 0) -> None:
        if self.state_machine.state is ConnectionState.CLOSED:
            raise h2events.ProtocolError("the connection is closed (GOAWAY)")
        stream = self.streams.get(stream_id)
        if stream is None:
            raise self._missing(stream_id)
        self._out.append(_rst(stream_id, error_code))
        self._close(stream, ClosedBy.RESET)

    def local_flow_control_window(self, stream_id: int) -> int:
        stream = self.streams.get(stream_id)
        if stream is None:
            raise self._missing(stream_id)
        return min(self.outbound_flow_control_window, stream.send_window)

    def increment_flow_control_window(self, increment: int) -> None:
        """Grow the connection's receive window (our streams' start at our SETTINGS')."""
        if not 1 <= increment <= MAX_WINDOW:
            raise ValueError("Flow control increment must be between 1 and 2^31-1")
        self._recv_window.opened(increment)
        self._out.append(_window_update(0, increment))

    def acknowledge_received_data(self, acknowledged_size: int, stream_id: int) -> None:
        if acknowledged_size < 0:
            raise ValueError("Cannot acknowledge negative data")
        increment = self._recv_window.processed_bytes(acknowledged_size)
        if increment:
            self._out.append(_window_update(0, increment))
        stream = self.streams.get(stream_id)
        # No WINDOW_UPDATE for a stream the peer has ended: it may send nothing more.
        if stream is not None and stream.state_machine.state is not StreamState.HALF_CLOSED_REMOTE:
            increment = stream.recv_window.processed_bytes(acknowledged_size)
            if increment:
                self._out.append(_window_update(stream_id, increment))

    def close_connection(
        self,
        error_code: ErrorCodes | int = 0,
        additional_data: bytes | None = None,
        last_stream_id: int | None = None,
    ) -> None:
        last = self.highest_inbound_stream_id if last_stream_id is None else last_stream_id
        extra = additional_data or b""
        body = last.to_bytes(4, "big") + int(error_code).to_bytes(4, "big") + extra
        self._out.append(frame_head(GOAWAY, 0, 0, len(body)) + body)
        self.state_machine.state = ConnectionState.CLOSED

    # ------------------------------------------------------------------ input

    def receive_data(self, data: bytes) -> list[Event]:
        events: list[Event] = []
        self.reader.feed(data)
        dispatch = self._dispatch
        try:
            for kind, flags, sid, body in self.reader:
                if self.state_machine.state is not ConnectionState.SERVER_OPEN:
                    self._check_state(kind, flags, body)
                handler = dispatch.get(kind)
                if handler is None:
                    self._on_unknown(kind, flags, sid, body, events)
                else:
                    handler(flags, sid, body, events)
        except h2events.ProtocolError as err:
            self.close_connection(err.error_code)  # a connection error: GOAWAY, its code
            raise
        return events

    def _check_state(self, kind: int, flags: int, body: Body) -> None:
        """h2's connection states: after GOAWAY either way only GOAWAY (and frames of
        unknown type, and a CONTINUATION outside a header block, which h2 judges by its
        stream alone) may arrive; before the first request, no DATA or RST_STREAM. h2
        checks a frame's body before its state (:func:`.h2parse.check_body`). (That the
        preface is followed by the peer's SETTINGS, RFC 9113 §3.4, which h2 does not
        check, is the reader's rule: :class:`.h2parse.FrameReader`.)"""
        if self.state_machine.state is ConnectionState.CLOSED:
            if kind not in (GOAWAY, CONTINUATION) and kind in KNOWN_TYPES:
                h2parse.check_body(kind, flags, body)
                if kind == HEADERS:  # h2 decodes a block before it looks at the state
                    self._decode(h2parse.headers(flags, body)[0])
                raise h2events.ProtocolError(f"{FRAME_NAMES[kind]} received after GOAWAY")
        elif kind in (DATA, RST_STREAM):
            h2parse.check_body(kind, flags, body)
            raise h2events.ProtocolError(
                f"{FRAME_NAMES[kind]} received before any stream was opened"
            )

    def _close(self, stream: H2Stream, how: ClosedBy) -> None:
        stream.state_machine.state = StreamState.CLOSED
        sid = stream.stream_id
        self.streams.pop(sid, None)
        if how is ClosedBy.RESET:
            closed, limit = self._resets, MAX_RESET_STREAMS
        else:
            closed, limit = self._endings, MAX_ENDED_STREAMS
        closed[sid] = None
        if len(closed) > limit:
            closed.popitem(last=False)  # O(1): the ordered dict's linked list

    def _closed_how(self, sid: int) -> ClosedBy | None:
        """How a closed stream closed, while it is remembered (else None)."""
        if sid in self._resets:
            return ClosedBy.RESET
        return ClosedBy.END if sid in self._endings else None

    def _is_idle(self, sid: int) -> bool:
        """Whether a stream not in :attr:`streams` was never opened (else: closed).

        Even ids are ours to open, and we never do: each of them is idle.
        """
        return not sid % 2 or sid > self.highest_inbound_stream_id

    def _missing(self, sid: int) -> h2events.ProtocolError:
        """h2's error for a stream not in :attr:`streams`: idle, or closed."""
        if self._is_idle(sid):
            return h2events.NoSuchStreamError(sid)
        return h2events.StreamClosedError(sid)

    def _decode(self, block: bytes) -> tuple[tuple[str, str], ...] | None:
        """A header block's headers (remembered per block while the table cannot have
        changed: :class:`.hpack_blocks.BlockDecoder`, which gives a block that comes again
        the same tuple again); h2's errors for a bad or oversized block. None for a block
        whose names or values are not all ASCII: h2 decodes the block first and finds that
        only where it builds the event (:meth:`_text`)."""
        try:
            return self._blocks.decode(block)
        except OversizedHeaderListError as err:
            raise h2events.DenialOfServiceError(f"Oversized header block: {err}") from err
        except UnicodeDecodeError:
            return None
        except (HPACKError, IndexError, TypeError) as err:
            raise h2events.ProtocolError(f"Error decoding header block: {err}") from err

    @staticmethod
    def _text(headers: tuple[tuple[str, str], ...] | None) -> tuple[tuple[str, str], ...]:
        """The headers an event carries; a connection error if they are not ASCII (h2
        lets its UnicodeDecodeError escape here, which grpclib does not catch)."""
        if headers is None:
            raise h2events.ProtocolError("a header name or value that is not ASCII")
        return headers

    def _on_headers(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        block, fields = h2parse.headers(flags, body)
        # Decoded first, whatever the stream's state, as h2 does: it keeps the decoder's
        # table in step, and a bad block is the error h2 reports before the stream's.
        headers = self._decode(block)
        stream = self.streams.get(sid)
        if stream is None:
            if sid <= self.highest_inbound_stream_id:
                how = self._closed_how(sid)
                if how is ClosedBy.RESET:
                    self.wasted += 1
                    self._out.append(_rst(sid, ErrorCodes.STREAM_CLOSED))
                    return
                if how is ClosedBy.END:
                    raise h2events.StreamClosedError(sid)
                raise h2events.StreamIDTooLowError(sid, self.highest_inbound_stream_id)
            if not sid % 2:
                raise h2events.ProtocolError("Invalid stream ID for peer.")
            self.highest_inbound_stream_id = sid
            if self.state_machine.state is ConnectionState.IDLE:
                self.state_machine.state = ConnectionState.SERVER_OPEN
            stream = H2Stream(sid, self._initial_send_window, self._stream_window)
            self.streams[sid] = stream
            # h2 gives a list of str pairs (with grpclib's header_encoding); ours is the
            # decoder's tuple, the same object each time a block comes again (what
            # :meth:`.server._Calls.admit` remembers its verdict by).
            headers = self._text(headers)
            event: RequestReceived | TrailersReceived = RequestReceived(sid, headers)
        else:
            if stream.state_machine.state is StreamState.HALF_CLOSED_REMOTE:
                self._reset_on_error(stream, events)
                return
            if not flags & END_STREAM:
                raise h2events.ProtocolError("Trailers must have END_STREAM set")
            event = TrailersReceived(sid, self._text(headers))
        events.append(event)
        if flags & END_STREAM:
            ended = StreamEnded(stream_id=sid)
            event.stream_ended = ended
            events.append(ended)
            self._end_remote(stream)
        if fields is not None:
            priority = self._priority(sid, fields)
            event.priority_updated = priority
            events.append(priority)

    def _end_remote(self, stream: H2Stream) -> None:
        sm = stream.state_machine
        if sm.state is StreamState.HALF_CLOSED_LOCAL:
            self._close(stream, ClosedBy.END)
        else:
            sm.state = StreamState.HALF_CLOSED_REMOTE

    def _reset_on_error(self, stream: H2Stream, events: list[Event]) -> None:
        """A frame the stream's state forbids: RST_STREAM STREAM_CLOSED (a stream error)."""
        self._out.append(_rst(stream.stream_id, ErrorCodes.STREAM_CLOSED))
        self._close(stream, ClosedBy.RESET)
        events.append(
            StreamReset(
                stream_id=stream.stream_id,
                error_code=ErrorCodes.STREAM_CLOSED,
                remote_reset=False,
            )
        )

    def _on_data(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        payload, length = h2parse.data(flags, body)
        self._recv_window.consumed(length)
        stream = self.streams.get(sid)
        if stream is None or stream.state_machine.state is StreamState.HALF_CLOSED_REMOTE:
            if stream is None and self._is_idle(sid):
                raise h2events.NoSuchStreamError(sid)
            # Closed or half-closed (remote): its bytes go back to the connection window.
            increment = self._recv_window.processed_bytes(length)
            if increment:
                self._out.append(_window_update(0, increment))
            if stream is not None:
                self._reset_on_error(stream, events)
            else:
                self.wasted += 1
                self._out.append(_rst(sid, ErrorCodes.STREAM_CLOSED))
            return
        stream.recv_window.consumed(length)
        if not length and not flags & END_STREAM:
            self.wasted += 1  # carries nothing and ends nothing
        # A view of the read (or of the one copy of a frame split between reads).
        event = DataReceived(sid, payload, length)
        events.append(event)
        if flags & END_STREAM:
            ended = StreamEnded(stream_id=sid)
            event.stream_ended = ended
            events.append(ended)
            self._end_remote(stream)

    def _on_rst_stream(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        code = h2parse.rst_stream(body)
        stream = self.streams.get(sid)
        if stream is None:
            return  # idle (h2 ignores it too) or already closed (RFC 9113 §5.1: ignore)
        self._close(stream, ClosedBy.RESET)
        events.append(
            StreamReset(stream_id=sid, error_code=h2events.error_code(code), remote_reset=True)
        )

    def _on_window_update(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        increment = h2parse.window_update(body)
        if not sid:  # a zero increment or an overflow: a connection error (RFC 9113 §6.9)
            broken = h2rules.window_update(increment, self.outbound_flow_control_window, 0)
            if broken is not None:
                raise h2events.ProtocolError(broken.message, h2events.error_code(broken.code))
            self.outbound_flow_control_window += increment
            events.append(WindowUpdated(stream_id=0, delta=increment))
            return
        stream = self.streams.get(sid)
        if stream is None:
            if self._is_idle(sid):
                raise h2events.NoSuchStreamError(sid)
            return  # closed: ignored
        broken = h2rules.window_update(increment, stream.send_window, sid)
        if broken is not None:  # a stream error (RFC 9113 §6.9, §6.9.1): the guard budgets it
            code = h2events.error_code(broken.code)
            self._out.append(_rst(sid, code))
            self._close(stream, ClosedBy.RESET)
            events.append(StreamReset(stream_id=sid, error_code=code, remote_reset=False))
            return
        stream.send_window += increment
        events.append(WindowUpdated(stream_id=sid, delta=increment))

    def _on_settings(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        values = h2parse.settings(flags, body)
        self.wasted += 1  # one each way per connection is due; a flood is not
        if flags & ACK:
            events.append(SettingsAcknowledged(changed_settings={}))  # ours never change
            return
        for code, value in values.items():
            check_received(code, value, from_client=True)
        remote = self.remote_settings
        changes = remote.apply(values)
        events.append(RemoteSettingsChanged(changed_settings=changes))
        window = changes.get(SettingCodes.INITIAL_WINDOW_SIZE)
        if window is not None:
            self._initial_send_window = remote.initial_window_size
            delta = window.new_value - (window.original_value or DEFAULT_WINDOW)
            for stream in self.streams.values():
                stream.send_window += delta
                if stream.send_window > MAX_WINDOW:
                    raise h2events.FlowControlError(
                        f"SETTINGS_INITIAL_WINDOW_SIZE takes stream {stream.stream_id}'s "
                        "window past 2^31-1"
                    )
        if SettingCodes.MAX_FRAME_SIZE in changes:
            self.max_outbound_frame_size = remote.max_frame_size
        table = changes.get(SettingCodes.HEADER_TABLE_SIZE)
        if table is not None and table.new_value < self._table_size:
            self._table_size = table.new_value
            self._table_update = hpack_int(table.new_value, 5, 0x20)
        self._out.append(frame_head(SETTINGS, ACK, 0, 0))

    def _on_ping(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        opaque = h2parse.ping(body)
        self.wasted += 1
        if flags & ACK:
            events.append(PingAckReceived(ping_data=opaque))
            return
        events.append(PingReceived(ping_data=opaque))
        self._out.append(frame_head(PING, ACK, 0, 8) + opaque)

    def _on_goaway(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        last, code, extra = h2parse.goaway(body)
        self.state_machine.state = ConnectionState.CLOSED
        self._out.clear()  # nothing more may be sent (h2 drops its unsent output too)
        events.append(
            ConnectionTerminated(
                error_code=h2events.error_code(code),
                last_stream_id=last,
                additional_data=extra or None,
            )
        )

    def _priority(self, sid: int, fields: Priority) -> PriorityUpdated:
        depends_on, weight, exclusive = fields
        if depends_on == sid:
            raise h2events.ProtocolError(f"Stream {sid} may not depend on itself")
        # The byte holds weight - 1.
        return PriorityUpdated(sid, depends_on=depends_on, weight=weight + 1, exclusive=exclusive)

    def _on_priority(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        events.append(self._priority(sid, h2parse.priority(body)))

    def _on_push_promise(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        h2parse.push_promise(flags, body)
        raise h2events.ProtocolError("Received pushed stream")

    def _on_continuation(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        """A CONTINUATION outside a header block (those within one were joined to it:
        :class:`.h2parse.FrameReader`): h2's error for its stream's state."""
        if sid not in self.streams:
            if self._is_idle(sid):
                raise h2events.NoSuchStreamError(sid)
            if sid in self._resets:  # a stream error, as h2
                self.wasted += 1
                self._out.append(_rst(sid, ErrorCodes.STREAM_CLOSED))
                return
            raise h2events.StreamClosedError(sid)
        raise h2events.ProtocolError("Received a CONTINUATION frame outside a header block")

    def _on_altsvc(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        h2parse.altsvc(body)  # checked as h2 does, then ignored (a server's right, RFC 7838)
        if self.state_machine.state is ConnectionState.IDLE:
            # h2 leaves its idle state on an ALTSVC (to its "client open", which takes
            # what our open state takes): DATA or RST_STREAM then meet the stream's rules.
            self.state_machine.state = ConnectionState.SERVER_OPEN

    def _on_unknown(self, kind: int, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        """A frame of a type we do not know: reported, and otherwise ignored."""
        events.append(UnknownFrameReceived(type=kind, flags=flags, stream_id=sid, body=bytes(body)))
