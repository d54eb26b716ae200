"""One HTTP/2 connection for both roles, sans-IO: the stream table, the states and their
transitions, flow control, SETTINGS and one handler per frame type.

Bytes in (:meth:`Connection.receive_data` -> :mod:`.events` events), bytes out (the
``send_*`` methods queue frames; :meth:`Connection.data_to_send` or ``pieces_to_send``
hand them over); never a socket or a loop, the time given by the caller. The roles are
thin subclasses adding their sending API: :class:`.server.ServerConnection` (the worker's
and the gateway's served side) and :class:`.client.ClientConnection` (the gateway's
client to its workers, the Python client's). Frames come from :class:`.parse.FrameReader`;
HPACK is :mod:`.hpack`. Nothing here imports h2: it is the oracle of both roles'
differential tests (``tests/h2/test_h2lean.py``, ``tests/h2/test_h2client.py``).

States (RFC 9113 §5.1), as tables, and each moved in one place: a stream is opened by
the client's HEADERS (OPEN), moves on END_STREAM sent or received and closes on
RST_STREAM either way, per :data:`SERVER_STREAM` / :data:`CLIENT_STREAM` (the client
closes a stream when the server ends it: what is left of a request is not sent), only
through :meth:`Connection._move`; a closed stream leaves :attr:`Connection.streams` at
once and how it closed is remembered (the last 2^16 resets, the last
:data:`MAX_ENDED_STREAMS` normal endings). The connection, per :data:`SERVER_CONNECTION`
/ :data:`CLIENT_CONNECTION` and only through :meth:`Connection._move_connection` (a move
the table lacks is raised there, as the bug it is), is IDLE until its first stream,
OPEN, then CLOSED once a GOAWAY is sent, or, for the server, received (h2's rule: any
later frame but GOAWAY is PROTOCOL_ERROR); a client that receives GOAWAY opens no new
stream and reads the answers of those at or below the peer's last one (DRAINING).

Frames on streams not open (h2's answers): DATA on a closed or half-closed (remote)
stream is answered RST_STREAM(STREAM_CLOSED) by the server, ignored by the client, its
bytes returned to the connection window; HEADERS likewise on a reset stream (RFC 9113
§5.1: the client reset it), and a connection error STREAM_CLOSED after END_STREAM both
ways; on a stream never opened, DATA, HEADERS and WINDOW_UPDATE are connection errors
(NoSuchStreamError), RST_STREAM and PRIORITY ignored once any stream opened. Trailers
without END_STREAM, PUSH_PROMISE, a stream depending on itself: PROTOCOL_ERROR. SETTINGS
are applied and acknowledged at once, PING answered, PRIORITY and unknown frame types
reported, ALTSVC ignored, padding stripped.

Flow control, in one place (:class:`RecvWindow`; :meth:`Connection._sent`, the one debit
of the send windows, for every DATA frame either role sends): DATA past a receive window
we granted is FLOW_CONTROL_ERROR; a window is reopened once half
of it was processed (h2's ``WindowManager`` rule; the server acknowledges as its
handlers read, the client as bytes arrive), and a grant takes effect when the output
holding it is handed out, so that DATA the peer sent before it could know the grant is
still held to the old window. We never send more than the peer's windows allow; its
SETTINGS_INITIAL_WINDOW_SIZE moves every open stream's send window by the difference.
A WINDOW_UPDATE of zero is PROTOCOL_ERROR and one past 2^31-1 FLOW_CONTROL_ERROR: on a
stream a stream error (RST_STREAM, reported as ``StreamReset(remote_reset=False)``: a
reset the peer provoked), on the connection a connection error (h2 makes a zero
increment a connection error on a stream too; the one difference the tests allow).

What the peer makes us do for nothing is judged here, for both roles, by the one
:class:`.abuse.AbuseBudget` of the connection (:attr:`Connection.budget`): the resets as
they come (the peer's of a call just started, those it provokes on a running call) and
the frames for nothing it counts (:attr:`Connection.wasted`: PING, SETTINGS, empty DATA,
frames answered RST_STREAM, and the answers the edge gives for nothing) once per read
(:meth:`Connection.judge`). What only the server's edge knows it says (which calls
started: :meth:`Connection.call_started`; the refusals it answers), and it reads the
verdict (:attr:`Connection.verdict`) to send GOAWAY ENHANCE_YOUR_CALM; the client role
raises :class:`.events.DenialOfServiceError` as its read ends. A connection error
queues GOAWAY with its code and raises :class:`.events.ProtocolError`.
"""

from __future__ import annotations

import collections
from collections import OrderedDict
from collections.abc import Callable, Iterable

from hpack import HPACKError, OversizedHeaderListError

from . import events as h2events
from . import parse as h2parse
from .abuse import AbuseBudget
from .events import (
    ChangedSetting,
    ConnectionState,
    ConnectionTerminated,
    DataReceived,
    ErrorCodes,
    Event,
    InvalidSettingsValueError,
    PingAckReceived,
    PingReceived,
    PriorityUpdated,
    RemoteSettingsChanged,
    RequestReceived,
    ResponseReceived,
    SettingCodes,
    SettingsAcknowledged,
    StreamEnded,
    StreamReset,
    TrailersReceived,
    UnknownFrameReceived,
    WindowUpdated,
)
from .hpack import BlockDecoder, TableEncoder
from .limits import DEFAULT, Abuse, Limits
from .parse import FRAME_NAMES, KNOWN_TYPES, Body, FrameReader, Priority
from .wire import (
    ACK,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    DEFAULT_TABLE,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_FRAME_CEILING,
    MAX_STREAM_ID,
    MAX_WINDOW,
    PADDED,
    PING,
    PRIORITY_FLAG,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame_head,
)

#: A frame type's handler: (the connection, flags, stream id, body, the events so far).
_Handler = Callable[["Connection", int, int, Body, list[Event]], None]
#: Closed streams whose reset is remembered (as many as h2 remembers closed streams): a
#: frame that arrives late on one is a stream error, where a forgotten one would be a
#: connection error ending every call of the peer (a client's cancel races its own DATA).
MAX_RESET_STREAMS = 2**16
#: Closed streams whose normal ending is remembered: the latest only (h2's 2^16 held
#: about 6 MB per long-lived connection).
MAX_ENDED_STREAMS = 1024


# ---------------------------------------------------------------------- SETTINGS


def local_settings(limits: Limits) -> dict[SettingCodes, int]:
    """Our SETTINGS: every limit of ``limits``, in force from our first SETTINGS frame
    (the stream count is enforced by refusing one stream too many, not as a connection
    error: :mod:`.server`)."""
    return {
        SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
        SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
        SettingCodes.MAX_FRAME_SIZE: limits.max_frame_size,
        SettingCodes.INITIAL_WINDOW_SIZE: limits.stream_window,
        SettingCodes.ENABLE_PUSH: 0,
    }


def check_received(code: int, value: int) -> None:
    """A setting received from the peer, against its range (RFC 9113 §6.5.2, RFC 8441 §3):
    :class:`~.events.InvalidSettingsValueError` with the code RFC 9113 gives."""
    if code == SettingCodes.INITIAL_WINDOW_SIZE:
        bad, invalid = value > MAX_WINDOW, ErrorCodes.FLOW_CONTROL_ERROR
    elif code == SettingCodes.MAX_FRAME_SIZE:
        bad, invalid = not DEFAULT_FRAME <= value <= MAX_FRAME_CEILING, ErrorCodes.PROTOCOL_ERROR
    elif code in (SettingCodes.ENABLE_PUSH, SettingCodes.ENABLE_CONNECT_PROTOCOL):
        bad, invalid = value not in (0, 1), ErrorCodes.PROTOCOL_ERROR
    else:
        return
    if bad:
        raise InvalidSettingsValueError(f"Setting {code} has invalid value {value}", invalid)


def initial_settings(client: bool) -> dict[SettingCodes | int, int]:
    """One side's SETTINGS before any frame changes them: HTTP/2's defaults (ENABLE_PUSH
    by the side's role), in h2's order (our first SETTINGS frame is h2's, byte for byte)."""
    return {
        SettingCodes.HEADER_TABLE_SIZE: DEFAULT_TABLE,
        SettingCodes.ENABLE_PUSH: int(client),
        SettingCodes.INITIAL_WINDOW_SIZE: DEFAULT_WINDOW,
        SettingCodes.MAX_FRAME_SIZE: DEFAULT_FRAME,
        SettingCodes.ENABLE_CONNECT_PROTOCOL: 0,
    }


# ---------------------------------------------------------------------- streams


class StreamState:
    """A stream's states (RFC 9113 §5.1; idle and reserved are never kept). Plain ints,
    as :class:`.events.ConnectionState`: read per frame."""

    OPEN = 1
    HALF_CLOSED_REMOTE = 2
    HALF_CLOSED_LOCAL = 3
    CLOSED = 4


class Move:
    """What moves a stream from one state to the next."""

    SEND_END = 1  # we sent END_STREAM
    RECV_END = 2  # the peer sent END_STREAM
    RESET = 3  # RST_STREAM, sent or received


_S = StreamState
#: (state, move) -> next state. A move not in the table is refused before it is made
#: (:meth:`Connection._sendable`; a received frame's handler checks the state first).
SERVER_STREAM: dict[tuple[int, int], int] = {
    (_S.OPEN, Move.SEND_END): _S.HALF_CLOSED_LOCAL,
    (_S.OPEN, Move.RECV_END): _S.HALF_CLOSED_REMOTE,
    (_S.HALF_CLOSED_REMOTE, Move.SEND_END): _S.CLOSED,
    (_S.HALF_CLOSED_LOCAL, Move.RECV_END): _S.CLOSED,
    (_S.OPEN, Move.RESET): _S.CLOSED,
    (_S.HALF_CLOSED_REMOTE, Move.RESET): _S.CLOSED,
    (_S.HALF_CLOSED_LOCAL, Move.RESET): _S.CLOSED,
}
#: The client's: the server's END_STREAM closes the stream whatever we still had to send.
CLIENT_STREAM = {**SERVER_STREAM, (_S.OPEN, Move.RECV_END): _S.CLOSED}

#: Each role's table by move, derived once: (END_STREAM sent, received, RST_STREAM),
#: state -> next.
_MOVES = {
    role: tuple(
        {s: t for (s, m), t in table.items() if m == mv}
        for mv in (Move.SEND_END, Move.RECV_END, Move.RESET)
    )
    for role, table in ((False, SERVER_STREAM), (True, CLIENT_STREAM))
}


class ConnectionMove:
    """What moves the connection from one state (:class:`.events.ConnectionState`) to
    the next."""

    STREAM_OPENED = 1  # a stream opened: the peer's HEADERS (server), ours (client)
    ALTSVC_RECEIVED = 2  # h2's server leaves its idle state on an ALTSVC frame
    GOAWAY_SENT = 3
    GOAWAY_RECEIVED = 4


_C, _M = ConnectionState, ConnectionMove
#: The server's connection: (state, move) -> next state. A GOAWAY either way ends it
#: (h2's rule: after the peer's, any frame but GOAWAY is PROTOCOL_ERROR, and we send
#: nothing more); a move not in the table is a bug of ours (:meth:`Connection._move_connection`
#: raises): every caller checks the state first.
SERVER_CONNECTION: dict[tuple[int, int], int] = {
    (_C.IDLE, _M.STREAM_OPENED): _C.OPEN,
    (_C.OPEN, _M.STREAM_OPENED): _C.OPEN,
    (_C.IDLE, _M.ALTSVC_RECEIVED): _C.OPEN,
    (_C.OPEN, _M.ALTSVC_RECEIVED): _C.OPEN,
    **{(s, _M.GOAWAY_SENT): _C.CLOSED for s in (_C.IDLE, _C.OPEN, _C.CLOSED)},
    **{(s, _M.GOAWAY_RECEIVED): _C.CLOSED for s in (_C.IDLE, _C.OPEN, _C.CLOSED)},
}
#: The client's: the peer's GOAWAY leaves it DRAINING (no new stream; those at or below
#: the peer's last one are still answered), ours CLOSED; an ALTSVC changes nothing.
CLIENT_CONNECTION: dict[tuple[int, int], int] = {
    (_C.IDLE, _M.STREAM_OPENED): _C.OPEN,
    (_C.OPEN, _M.STREAM_OPENED): _C.OPEN,
    **{(s, _M.ALTSVC_RECEIVED): s for s in (_C.IDLE, _C.OPEN, _C.DRAINING)},
    **{(s, _M.GOAWAY_SENT): _C.CLOSED for s in (_C.IDLE, _C.OPEN, _C.DRAINING, _C.CLOSED)},
    **{(s, _M.GOAWAY_RECEIVED): _C.DRAINING for s in (_C.IDLE, _C.OPEN, _C.DRAINING)},
    (_C.CLOSED, _M.GOAWAY_RECEIVED): _C.CLOSED,
}
_CONNECTION = {False: SERVER_CONNECTION, True: CLIENT_CONNECTION}

#: A verdict of the abuse budget: the rule the peer broke (its fault) and why.
Verdict = tuple[Abuse, str]


class RecvWindow:
    """A receive window (a stream's or the connection's): what the peer may still send
    (``left``), what was processed since our last grant, and grants queued but not yet
    handed out (``granting``: they take effect in :meth:`Connection._granted`)."""

    __slots__ = ("granting", "left", "max_size", "processed")

    def __init__(self, size: int) -> None:
        self.left = size
        self.max_size = size
        self.processed = 0
        self.granting = 0

    def overrun(self, n: int, stream_id: int) -> None:
        """``n`` bytes arrived with fewer left: FLOW_CONTROL_ERROR (the caller compared)."""
        where = f"stream {stream_id}" if stream_id else "the connection"
        raise h2events.FlowControlError(  # RFC 9113 §6.9.1
            f"flow control window exceeded by {n - self.left} bytes ({where})"
        )

    def processed_bytes(self, n: int) -> int:
        """The increment to grant after ``n`` more bytes were processed (h2's rule: half
        the window, or less when it is shut)."""
        processed = self.processed + n
        self.processed = processed
        if not processed:
            return 0
        size = self.left + self.granting
        if processed >= self.max_size // 2 or (
            size == 0 and processed > min(1024, self.max_size // 4)
        ):
            increment = min(processed, self.max_size - size)
            self.processed = 0
            self.granting += increment
            return increment
        return 0


class Stream(RecvWindow):
    """One open stream: its state, our send window, (what it is) its receive window, and
    when its call started (the server role: :meth:`Connection.call_started`; None before,
    and on the client's streams)."""

    __slots__ = (
        "headers_received", "headers_sent", "send_window", "started_at", "state", "stream_id"
    )  # fmt: skip

    def __init__(self, stream_id: int, send_window: int, recv_window: int) -> None:
        self.stream_id = stream_id
        self.state = StreamState.OPEN
        self.headers_sent = False
        self.headers_received = False
        self.send_window = send_window
        self.left = self.max_size = recv_window
        self.processed = self.granting = 0
        self.started_at: float | None = None


def _window_update_error(
    increment: int, window: int, stream_id: int
) -> h2events.ProtocolError | None:
    """What a WINDOW_UPDATE of ``increment`` on a send window of ``window`` bytes breaks
    (stream 0: the connection's; RFC 9113 §6.9, §6.9.1): a zero increment, PROTOCOL_ERROR,
    or a window past 2^31-1, FLOW_CONTROL_ERROR. On a stream a stream error (h2 makes a
    zero increment a connection error even there), on the connection a connection error."""
    if increment and window + increment <= MAX_WINDOW:
        return None
    where = f"stream {stream_id}" if stream_id else "the connection"
    if increment == 0:
        return h2events.ProtocolError(f"a WINDOW_UPDATE of 0 on {where}")
    return h2events.FlowControlError(f"a WINDOW_UPDATE takes {where}'s send window past 2^31-1")


def _rst(stream_id: int, code: int) -> bytes:
    return frame_head(RST_STREAM, 0, stream_id, 4) + int(code).to_bytes(4, "big")


def _ascii_field(name: bytes, value: bytes) -> tuple[str, str]:
    """A header as text (grpclib's ``header_encoding``); UnicodeDecodeError if not ASCII."""
    return name.decode("ascii"), value.decode("ascii")


def _raw_field(name: bytes, value: bytes) -> tuple[bytes, bytes]:
    return name, value


class Connection:
    """One HTTP/2 connection's state (module docstring); the roles subclass it.

    ``limits``: what we advertise and hold the peer to; ``now``: the clock's reading when
    the connection is made (the client's budget); ``pieces``: a DATA frame split across
    reads is passed on a piece per read (:class:`.parse.FrameReader`).
    """

    #: The client role (set by the subclass): headers as bytes, its own abuse budget.
    client = False
    #: Frame type byte -> its handler (set below the class).
    _handlers: tuple[_Handler, ...] = ()

    def __init__(
        self, limits: Limits | None = None, now: float = 0.0, *, pieces: bool = False
    ) -> None:
        limits = limits if limits is not None else DEFAULT
        client = self.client
        #: Ours (all sent in our first SETTINGS frame, never changed), and the peer's.
        self.local_settings = initial_settings(client) | local_settings(limits)
        self.remote_settings = initial_settings(not client)
        #: Where the connection starts in its table (:data:`SERVER_CONNECTION`,
        #: :data:`CLIENT_CONNECTION`); it moves only by :meth:`_move_connection`.
        self.state = ConnectionState.IDLE
        #: The role's stream transition table, by move (:meth:`_move`).
        self._on_send_end, self._on_recv_end, self._on_reset = _MOVES[client]
        self.streams: dict[int, Stream] = {}
        #: The peer's highest stream id (server), and the next one we open (client).
        self.highest_inbound_stream_id = 0
        self.next_stream_id = 1
        # What the peer allows us.
        self.max_outbound_frame_size = DEFAULT_FRAME
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_streams = MAX_WINDOW
        self.outbound_flow_control_window = DEFAULT_WINDOW
        # What we allow the peer.
        self.inbound = RecvWindow(DEFAULT_WINDOW)
        self._stream_window = limits.stream_window
        self._connection_window = limits.connection_window
        self._grants: list[RecvWindow] = []
        convert = _raw_field if client else _ascii_field
        self._blocks: BlockDecoder[object] = BlockDecoder(convert, limits.max_header_list_size)
        self.reader = FrameReader(
            not client, limits.max_frame_size, limits.max_header_list_size, pieces=pieces
        )
        self._out: list[bytes | memoryview] = []
        #: The closed streams remembered (oldest first): reset, and ended normally.
        self._resets: OrderedDict[int, None] = OrderedDict()
        self._endings: OrderedDict[int, None] = OrderedDict()
        #: What the peer made us do for nothing, judged by the connection's one abuse
        #: budget (module docstring): the frames for nothing counted so far, and how
        #: many of them the budget was handed (:meth:`judge`); the budget's first
        #: verdict, once it is spent; the time of the read being handled.
        self.wasted = 0
        self.wasted_judged = 0
        self.budget = AbuseBudget(now)
        self.verdict: Verdict | None = None
        self._now = now
        #: The client's DATA bytes read so far in this read (acknowledged as it ends).
        self._arrived = 0
        #: Our side of the peer's HPACK table: the constant blocks through it (the
        #: server role), and the size updates owed at the start of our next block.
        self.table = TableEncoder(DEFAULT_TABLE)

    # ------------------------------------------------------------------ output

    def _settings_frame(self) -> bytes:
        """Our SETTINGS: every limit, in force from the first byte."""
        body = b"".join(
            int(code).to_bytes(2, "big") + value.to_bytes(4, "big")
            for code, value in self.local_settings.items()
        )
        return frame_head(SETTINGS, 0, 0, len(body)) + body

    def data_to_send(self) -> bytes:
        """Everything queued to send, in order, as one ``bytes``; the grants in it take
        effect now (module docstring)."""
        if self._grants:
            self._granted()
        out = self._out
        if not out:
            return b""
        data = out[0] if len(out) == 1 and isinstance(out[0], bytes) else b"".join(out)
        out.clear()
        return data

    def pieces_to_send(self) -> list[bytes | memoryview]:
        """Everything queued, as the pieces it was queued as (DATA payloads are views of
        the caller's bytes, not copied); the grants in it take effect now."""
        if self._grants:
            self._granted()
        out, self._out = self._out, []
        return out

    def _granted(self) -> None:
        for window in self._grants:
            window.left += window.granting
            window.granting = 0
        self._grants.clear()

    def _grant(self, window: RecvWindow, stream_id: int, increment: int) -> None:
        """Queue a WINDOW_UPDATE ``window`` already counts in ``granting``."""
        self._out.append(frame_head(WINDOW_UPDATE, 0, stream_id, 4) + increment.to_bytes(4, "big"))
        self._grants.append(window)

    def _sendable(self, stream_id: int) -> Stream:
        """The stream we may send on now, or the exception for why not (h2's)."""
        if self.state == ConnectionState.CLOSED:
            raise h2events.ProtocolError("the connection is closed (GOAWAY)")
        stream = self.streams.get(stream_id)
        if stream is None:
            raise self._missing(stream_id)
        if stream.state == StreamState.HALF_CLOSED_LOCAL:  # we ended it: h2's error, too
            raise h2events.ProtocolError(f"stream {stream_id} was ended by this side")
        return stream

    def _move(self, stream: Stream, moves: dict[int, int]) -> None:
        """The one place a stream's state changes: ``moves`` is a column of the role's
        transition table (END_STREAM sent, received, or RST_STREAM either way: ``_on_*``)
        and gives its next state. A stream that closes leaves :attr:`streams` at once,
        remembered as reset or as ended (the latest :data:`MAX_RESET_STREAMS`, and
        :data:`MAX_ENDED_STREAMS`). A move not in the table is a KeyError: a bug, as the
        callers check the state first."""
        state = stream.state = moves[stream.state]
        if state == StreamState.CLOSED:
            sid = stream.stream_id
            del self.streams[sid]
            if moves is self._on_reset:
                closed, bound = self._resets, MAX_RESET_STREAMS
            else:
                closed, bound = self._endings, MAX_ENDED_STREAMS
            closed[sid] = None
            if len(closed) > bound:
                closed.popitem(last=False)

    def _sent(self, stream: Stream, size: int, end: bool) -> None:
        """``size`` bytes of DATA queued on ``stream``, the last of them with END_STREAM
        when ``end``: the one place the send windows are debited (every DATA frame of
        both roles: :meth:`send_pieces`, the server's whole answer
        :meth:`.server.ServerConnection.send_answer` and the client's whole request
        :meth:`.client.ClientConnection.send_request`), and the stream's move. The
        callers checked the windows (:meth:`_within_windows` or their own fast path)."""
        stream.send_window -= size
        self.outbound_flow_control_window -= size
        if end:
            self._move(stream, self._on_send_end)

    def _open(self, sent: int = 0, end: bool = False) -> int:
        """A stream we open, its id (the client role: push is off, the server opens
        none; the caller queues its HEADERS): the next id, the connection's move, one
        call more for the budget (the client's calls start as it opens them); with
        ``end``, ``sent`` bytes of DATA queued with the HEADERS are debited and
        END_STREAM moves it (:meth:`_sent`). The caller checked that a stream may open
        (``can_open``)."""
        stream_id = self.next_stream_id
        self.next_stream_id = stream_id + 2
        stream = Stream(stream_id, self.peer_initial_window, self._stream_window)
        self.streams[stream_id] = stream
        stream.headers_sent = True
        if self.state != ConnectionState.OPEN:
            self._move_connection(ConnectionMove.STREAM_OPENED)
        self.budget.streams += 1
        if end:
            self._sent(stream, sent, True)
        return stream_id

    def _move_connection(self, move: int) -> None:
        """The one place the connection's state changes, by the role's table
        (:data:`SERVER_CONNECTION`, :data:`CLIENT_CONNECTION`); a move the table does not
        hold is a bug of ours (the callers check the state first), raised here."""
        state = _CONNECTION[self.client].get((self.state, move))
        if state is None:
            raise RuntimeError(
                f"connection move {move} in state {self.state}: not in the "
                f"{'client' if self.client else 'server'}'s table (a bug)"
            )
        self.state = state

    def _queue_block(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        """HEADERS (and CONTINUATIONs past the peer's frame size) carrying ``block``."""
        if self.table.owed:
            block = self.table.take_updates() + block
        flags = END_STREAM if end_stream else 0
        limit, size, out = self.max_outbound_frame_size, len(block), self._out
        for start in range(0, size or 1, limit):  # HEADERS, then CONTINUATIONs if need be
            chunk = block[start : start + limit]
            last = END_HEADERS if start + limit >= size else 0
            kind = CONTINUATION if start else HEADERS
            out.append(frame_head(kind, (0 if start else flags) | last, stream_id, len(chunk)))
            out.append(chunk)

    def _within_windows(self, stream: Stream, size: int) -> None:
        if size > stream.send_window or size > self.outbound_flow_control_window:
            raise h2events.FlowControlError(
                f"Cannot send {size} bytes, flow control window is "
                f"{min(stream.send_window, self.outbound_flow_control_window)}"
            )

    def send_data(self, stream_id: int, data: bytes | memoryview, end_stream: bool = False) -> None:
        """DATA frames carrying all of ``data``, not copied (FlowControlError past a window,
        nothing queued: the caller checks :meth:`local_flow_control_window`)."""
        view = memoryview(data).cast("B")
        self._within_windows(self._sendable(stream_id), view.nbytes)
        pending = collections.deque((view,) if view.nbytes else ())
        self.send_pieces(stream_id, pending, end_stream=end_stream)

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
        stream = self._sendable(stream_id)
        room = min(stream.send_window, self.outbound_flow_control_window, most)
        limit = self.max_outbound_frame_size
        out = self._out
        sent = 0
        while pending and room > 0:
            views: list[memoryview] = []  # the next frame's payload: views off the front
            size = left = min(room, limit)
            while pending and left:
                view = pending[0]
                if view.nbytes <= left:
                    views.append(pending.popleft())
                    left -= view.nbytes
                else:  # split: its rest stays in front
                    views.append(view[:left])
                    pending[0] = view[left:]
                    left = 0
            size -= left
            flags = END_STREAM if end_stream and not pending else 0
            out.append(frame_head(DATA, flags, stream_id, size))
            out += views
            room -= size
            sent += size
        if end_stream and not pending and not sent:  # an empty message's end
            out.append(frame_head(DATA, END_STREAM, stream_id, 0))
        self._sent(stream, sent, end_stream and not pending)
        return sent

    def local_flow_control_window(self, stream_id: int) -> int:
        """Bytes of DATA that may be sent on ``stream_id`` now (0 if it is not open)."""
        stream = self.streams.get(stream_id)
        window = 0 if stream is None else stream.send_window
        return max(0, min(self.outbound_flow_control_window, window))

    def reset_stream(self, stream_id: int, error_code: ErrorCodes | int = 0) -> None:
        if self.state == ConnectionState.CLOSED:
            raise h2events.ProtocolError("the connection is closed (GOAWAY)")
        stream = self.streams.get(stream_id)
        if stream is None:
            raise self._missing(stream_id)
        self._out.append(_rst(stream_id, error_code))
        self._move(stream, self._on_reset)

    def grow_connection_window(self) -> None:
        """Grant the peer the connection window our limits give (HTTP/2 opens every
        connection's at 65,535 bytes, and SETTINGS cannot move it: RFC 9113 §6.9.2); both
        roles, right after ``initiate_connection``."""
        grow = self._connection_window - DEFAULT_WINDOW
        if grow > 0:
            self.increment_flow_control_window(grow)

    def increment_flow_control_window(self, increment: int) -> None:
        """Grow the connection's receive window (the streams' start at our SETTINGS')."""
        inbound = self.inbound
        size = inbound.left + inbound.granting + increment
        if not 1 <= increment <= MAX_WINDOW or size > MAX_WINDOW:
            raise ValueError(f"a receive window of {size} bytes is past 2^31-1")
        inbound.granting += increment
        inbound.max_size = max(inbound.max_size, size)
        self._grant(inbound, 0, increment)

    def acknowledge_received_data(self, acknowledged_size: int, stream_id: int) -> None:
        """``acknowledged_size`` bytes of DATA on ``stream_id`` were processed: the
        windows reopen by the rule of :class:`RecvWindow` (a stream the peer ended gets
        no more window: it may send nothing more)."""
        if acknowledged_size < 0:
            raise ValueError("Cannot acknowledge negative data")
        increment = self.inbound.processed_bytes(acknowledged_size)
        if increment:
            self._grant(self.inbound, 0, increment)
        stream = self.streams.get(stream_id)
        if stream is not None and stream.state != StreamState.HALF_CLOSED_REMOTE:
            increment = stream.processed_bytes(acknowledged_size)
            if increment:
                self._grant(stream, stream_id, increment)

    def close_connection(
        self,
        error_code: ErrorCodes | int = 0,
        additional_data: bytes | None = None,
        last_stream_id: int | None = None,
    ) -> None:
        """GOAWAY: the last stream of the peer's we processed (by default its highest;
        the client processes none) and why."""
        last = self.highest_inbound_stream_id if last_stream_id is None else last_stream_id
        body = last.to_bytes(4, "big") + int(error_code).to_bytes(4, "big")
        body += additional_data or b""
        self._out.append(frame_head(GOAWAY, 0, 0, len(body)) + body)
        self._move_connection(ConnectionMove.GOAWAY_SENT)

    # ------------------------------------------------------------------ the abuse budget

    def _charge(self, verdict: str | None, fault: Abuse) -> None:
        """Keep the budget's first verdict (``fault``: the rule it broke)."""
        if verdict is not None and self.verdict is None:
            self.verdict = (fault, verdict)

    def judge(self, now: float) -> Verdict | None:
        """Hand the budget the frames for nothing counted since the last judgement (the
        server's edge calls this once it has handled a read's events, so that the calls
        they started earn their credit first; the client role's reads are judged as
        they end); the budget's verdict, once it is spent (the resets were judged as
        they came)."""
        wasted = self.wasted - self.wasted_judged
        if wasted:
            self.wasted_judged = self.wasted
            self._charge(self.budget.wasted_frames(wasted, now), Abuse.FRAME_FLOOD)
        return self.verdict

    def call_started(self, stream_id: int, now: float) -> None:
        """The server's edge started a call on ``stream_id`` (it admitted the request)
        at ``now``: one call more for the budget, and the time its premature-reset rule
        reads if the peer resets the stream (the client's calls start as it opens them)."""
        self.streams[stream_id].started_at = now
        self.budget.streams += 1

    def calls_started(self, count: int) -> None:
        """``count`` requests begun inside one stream's call (a stream method's): each
        counts as a call started, as a unary call would."""
        self.budget.streams += count

    def calls_reset(self, started: Iterable[float], now: float) -> Verdict | None:
        """Requests inside a stream's call that the peer's reset withdrew, with the time
        each began: each judged as a call reset then would be; the verdict, if spent."""
        for at in started:
            self._charge(self.budget.peer_reset(at, now), Abuse.RAPID_RESET)
        return self.verdict

    def answered_for_nothing(self) -> None:
        """The edge answered a stream whose call never started (refused past the stream
        limit, or a request the peer malformed: RFC 9113 §8.1.1): a frame for nothing,
        judged with the read's others (:meth:`judge`)."""
        self.wasted += 1

    def refused_malformed(self) -> Verdict | None:
        """The edge refused a running call on a message the peer malformed (a stream
        error it provoked, RFC 9113 §8.1.1): judged with the resets; the verdict, if
        spent."""
        self._charge(self.budget.provoked_resets(1), Abuse.RAPID_RESET)
        return self.verdict

    # ------------------------------------------------------------------ input

    def receive_data(self, data: bytes, now: float = 0.0) -> list[Event]:
        """Feed bytes read at ``now`` (seconds of any monotonic clock: the abuse budget's);
        the events they complete. Payloads are views of the reads. The client role's
        reads are judged as they end (its calls start as it opens them, never while a
        read's events are handled): past the budget, DenialOfServiceError."""
        events: list[Event] = []
        reader = self.reader
        reader.feed(data)
        next_frame, handlers = reader.next_frame, self._handlers
        self._now = now
        opened = ConnectionState.OPEN
        try:
            while (frame := next_frame()) is not None:
                kind, flags, sid, body = frame
                if self.state != opened:
                    self._check_state(kind, flags, body)
                handlers[kind](self, flags, sid, body, events)
            if self._arrived:  # the client's DATA of this read, processed as it arrived
                increment = self.inbound.processed_bytes(self._arrived)
                self._arrived = 0
                if increment:
                    self._grant(self.inbound, 0, increment)
            if self.client and (self.wasted != self.wasted_judged or self.verdict is not None):
                verdict = self.judge(now)
                if verdict is not None:
                    raise h2events.DenialOfServiceError(verdict[1])
        except h2events.ProtocolError as err:
            self.close_connection(err.error_code)  # a connection error: GOAWAY, its code
            raise
        return events

    def _check_state(self, kind: int, flags: int, body: Body) -> None:
        """The connection's states (h2's): after GOAWAY only GOAWAY (and frames of
        unknown type, and a CONTINUATION outside a header block, judged by its stream)
        may arrive; before the first stream, no DATA or RST_STREAM. A frame's body is
        checked before its state (:func:`.parse.check_body`), as h2 does."""
        state = self.state
        if state == ConnectionState.CLOSED:
            if kind not in (GOAWAY, CONTINUATION) and kind in KNOWN_TYPES:
                h2parse.check_body(kind, flags, body)
                if kind == HEADERS:  # h2 decodes a block before it looks at the state
                    self._decode(h2parse.headers(flags, body)[0])
                raise h2events.ProtocolError(f"{FRAME_NAMES[kind]} received after GOAWAY")
        elif state == ConnectionState.IDLE and kind in (DATA, RST_STREAM):
            h2parse.check_body(kind, flags, body)
            raise h2events.ProtocolError(
                f"{FRAME_NAMES[kind]} received before any stream was opened"
            )

    def _is_idle(self, sid: int) -> bool:
        """Whether a stream not in :attr:`streams` was never opened (else: closed). The
        peer opens odd ids (the server role) and none (the client's: push is off)."""
        if self.client:
            return not sid % 2 or sid >= self.next_stream_id
        return not sid % 2 or sid > self.highest_inbound_stream_id

    def _missing(self, sid: int) -> h2events.ProtocolError:
        """h2's error for a stream not in :attr:`streams`: idle, or closed."""
        if self._is_idle(sid):
            return h2events.NoSuchStreamError(sid)
        return h2events.StreamClosedError(sid)

    def _decode(self, block: bytes) -> tuple[object, ...] | None:
        """A header block's headers; None for one that is not all ASCII (the server's
        text headers)."""
        try:
            return self._blocks.decode(block)
        except Exception as err:
            return self._undecodable(err)

    @staticmethod
    def _undecodable(err: Exception) -> None:
        """h2's error for a block the decoder refused (``None`` for one that decoded but
        is not ASCII: h2 finds that only where it builds the event)."""
        if isinstance(err, OversizedHeaderListError):
            raise h2events.DenialOfServiceError(f"Oversized header block: {err}") from err
        if isinstance(err, UnicodeDecodeError):
            return None
        if isinstance(err, (HPACKError, IndexError, TypeError)):
            raise h2events.ProtocolError(f"Error decoding header block: {err}") from err
        raise err

    def _late(self, sid: int, events: list[Event]) -> None:
        """HEADERS on a stream not in :attr:`streams` (module docstring)."""
        if self._is_idle(sid):
            raise h2events.NoSuchStreamError(sid)
        if sid in self._resets:
            if not self.client:
                self._answer_closed(sid)
        elif sid in self._endings:
            raise h2events.StreamClosedError(sid)
        elif not self.client:
            raise h2events.StreamIDTooLowError(sid, self.highest_inbound_stream_id)

    def _on_headers(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        if flags & (PADDED | PRIORITY_FLAG):
            block, fields = h2parse.headers(flags, body)
        else:
            block, fields = bytes(body), None
        # Decoded first, whatever the stream's state, as h2 does: it keeps the decoder's
        # table in step, and a bad block is the error h2 reports before the stream's.
        headers: tuple[object, ...] | None
        try:
            headers = self._blocks.decode(block)
        except Exception as err:  # mapped to h2's errors (or None: not ASCII)
            headers = self._undecodable(err)
        stream = self.streams.get(sid)
        kind: type[RequestReceived | ResponseReceived | TrailersReceived]
        if stream is None:
            if self.client or sid <= self.highest_inbound_stream_id:
                return self._late(sid, events)
            if not sid % 2:
                raise h2events.ProtocolError("Invalid stream ID for peer.")
            self.highest_inbound_stream_id = sid
            if self.state != ConnectionState.OPEN:  # the first stream
                self._move_connection(ConnectionMove.STREAM_OPENED)
            stream = Stream(sid, self.peer_initial_window, self._stream_window)
            stream.headers_received = True
            self.streams[sid] = stream
            kind = RequestReceived
        elif stream.state == StreamState.HALF_CLOSED_REMOTE:
            return self._reset_on_error(stream, events)
        elif not stream.headers_received:
            stream.headers_received = True
            kind = ResponseReceived
        elif not flags & END_STREAM:
            raise h2events.ProtocolError("Trailers must have END_STREAM set")
        else:
            kind = TrailersReceived
        if headers is None:  # h2 finds it where it builds the event
            raise h2events.ProtocolError("a header name or value that is not ASCII")
        event = kind(sid, headers)
        events.append(event)
        if flags & END_STREAM:
            self._end_remote(stream, event, events)
        if fields is not None:
            priority = self._priority(sid, fields)
            event.priority_updated = priority
            events.append(priority)

    def _end_remote(
        self,
        stream: Stream,
        event: RequestReceived | ResponseReceived | TrailersReceived | DataReceived,
        events: list[Event],
    ) -> None:
        """END_STREAM on ``event``'s frame: StreamEnded, and the stream's move."""
        ended = StreamEnded(stream.stream_id)
        event.stream_ended = ended
        events.append(ended)
        self._move(stream, self._on_recv_end)

    def _reset_on_error(
        self, stream: Stream, events: list[Event], code: ErrorCodes | int = ErrorCodes.STREAM_CLOSED
    ) -> None:
        """A stream error the peer provoked (by default a frame the stream's state
        forbids): RST_STREAM with ``code``, reported as an event and budgeted -- the reset
        of a running call (every client stream is one) against the calls, that of a
        stream whose call never started (the provoking frame read with its HEADERS) as
        a frame for nothing."""
        self._out.append(_rst(stream.stream_id, code))
        self._move(stream, self._on_reset)
        if self.client or stream.started_at is not None:
            self._charge(self.budget.provoked_resets(1), Abuse.RAPID_RESET)
        else:
            self.wasted += 1
        events.append(StreamReset(stream_id=stream.stream_id, error_code=code, remote_reset=False))

    def _answer_closed(self, sid: int) -> None:
        """A frame on a stream we reset and forgot: RST_STREAM STREAM_CLOSED, for nothing."""
        self.wasted += 1
        self._out.append(_rst(sid, ErrorCodes.STREAM_CLOSED))

    def _on_data(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        if flags & PADDED:
            payload, length = h2parse.data(flags, body)
        else:
            payload, length = body, len(body)
        inbound = self.inbound
        if length > inbound.left:
            inbound.overrun(length, 0)
        inbound.left -= length
        stream = self.streams.get(sid)
        if stream is None or stream.state == StreamState.HALF_CLOSED_REMOTE:
            return self._data_not_open(sid, stream, length, events)
        if length > stream.left:
            stream.overrun(length, sid)
        stream.left -= length
        if not length and not flags & END_STREAM:
            self.wasted += 1  # carries nothing and ends nothing
        event = DataReceived(sid, payload, length)
        events.append(event)
        if flags & END_STREAM:
            self._end_remote(stream, event, events)
        elif self.client and length:  # the client processes what arrives as it arrives
            increment = stream.processed_bytes(length)
            if increment:
                self._grant(stream, sid, increment)
        if self.client:  # the connection's window: once per read (receive_data)
            self._arrived += length

    def _data_not_open(
        self, sid: int, stream: Stream | None, length: int, events: list[Event]
    ) -> None:
        """DATA on a stream closed or half-closed (remote): a connection error on one
        never opened, else its bytes go back to the connection window (module docstring)."""
        if stream is None and self._is_idle(sid):
            raise h2events.NoSuchStreamError(sid)
        increment = self.inbound.processed_bytes(length)
        if increment:
            self._grant(self.inbound, 0, increment)
        if stream is not None:
            return self._reset_on_error(stream, events)
        if not self.client:  # h2's answer; the client ignores it (it reset or ended it)
            self._answer_closed(sid)

    def _on_rst_stream(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        code = h2parse.rst_stream(flags, body)
        stream = self.streams.get(sid)
        if stream is None:
            return  # idle once a stream opened (h2 ignores it too) or closed (ignored)
        self._move(stream, self._on_reset)
        events.append(
            StreamReset(stream_id=sid, error_code=h2events.error_code(code), remote_reset=True)
        )
        if stream.started_at is not None:  # a running call the peer reset (server role)
            self._charge(self.budget.peer_reset(stream.started_at, self._now), Abuse.RAPID_RESET)

    def _on_window_update(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        increment = h2parse.window_update(flags, body)
        if not sid:  # a zero increment or an overflow: a connection error (RFC 9113 §6.9)
            broken = _window_update_error(increment, self.outbound_flow_control_window, 0)
            if broken is not None:
                raise broken
            self.outbound_flow_control_window += increment
            events.append(WindowUpdated(stream_id=0, delta=increment))
            return
        stream = self.streams.get(sid)
        if stream is None:
            if self._is_idle(sid):
                raise h2events.NoSuchStreamError(sid)
            return  # closed: ignored
        broken = _window_update_error(increment, stream.send_window, sid)
        if broken is not None:  # a stream error (RFC 9113 §6.9, §6.9.1)
            return self._reset_on_error(stream, events, broken.error_code)
        stream.send_window += increment
        events.append(WindowUpdated(stream_id=sid, delta=increment))

    def _on_settings(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        values = h2parse.settings(flags, body)
        self.wasted += 1  # one each way per connection is due; a flood is not
        if flags & ACK:
            events.append(SettingsAcknowledged(changed_settings={}))  # ours never change
            return
        for code, value in values.items():
            check_received(code, value)
        changes: dict[SettingCodes | int, ChangedSetting] = {}
        for code, value in values.items():
            key = h2events.setting_code(code)
            changes[key] = ChangedSetting(self.remote_settings.get(key), value)
            self.remote_settings[key] = value
        window = changes.get(SettingCodes.INITIAL_WINDOW_SIZE)
        if window is not None:
            delta = window.new_value - self.peer_initial_window
            self.peer_initial_window = window.new_value
            for stream in self.streams.values():
                stream.send_window += delta
                if stream.send_window > MAX_WINDOW:
                    raise h2events.FlowControlError(
                        f"SETTINGS_INITIAL_WINDOW_SIZE takes stream {stream.stream_id}'s "
                        "window past 2^31-1"
                    )
        remote = self.remote_settings
        self.max_outbound_frame_size = remote[SettingCodes.MAX_FRAME_SIZE]
        self.peer_max_streams = remote.get(SettingCodes.MAX_CONCURRENT_STREAMS, MAX_WINDOW)
        table = changes.get(SettingCodes.HEADER_TABLE_SIZE)
        if table is not None and table.new_value < self.table.size:
            self.table.resize(table.new_value)
        self._out.append(frame_head(SETTINGS, ACK, 0, 0))
        events.append(RemoteSettingsChanged(changed_settings=changes))

    def _on_ping(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        opaque = h2parse.ping(flags, body)
        self.wasted += 1
        if flags & ACK:
            events.append(PingAckReceived(ping_data=opaque))
            return
        events.append(PingReceived(ping_data=opaque))
        self._out.append(frame_head(PING, ACK, 0, 8) + opaque)

    def _on_goaway(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        last, code, extra = h2parse.goaway(flags, body)
        # The client drains (no new streams; those at or below ``last`` are answered);
        # for the server, as for h2, the connection is over: nothing more may be sent.
        self._move_connection(ConnectionMove.GOAWAY_RECEIVED)
        if not self.client:
            self._out.clear()
        events.append(
            ConnectionTerminated(
                error_code=h2events.error_code(code),
                last_stream_id=last & MAX_STREAM_ID,
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
        events.append(self._priority(sid, h2parse.priority(flags, body)))

    def _on_push_promise(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        h2parse.push_promise(flags, body)
        raise h2events.ProtocolError("Received pushed stream")

    def _on_continuation(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        """A CONTINUATION outside a header block (those within one were joined to it):
        h2's error for its stream's state."""
        if sid not in self.streams:
            if self._is_idle(sid):
                raise h2events.NoSuchStreamError(sid)
            if sid in self._resets:  # a stream error, as h2
                return self._answer_closed(sid)
            raise h2events.StreamClosedError(sid)
        raise h2events.ProtocolError("Received a CONTINUATION frame outside a header block")

    def _on_altsvc(self, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        h2parse.altsvc(flags, body)  # checked as h2 does, then ignored (RFC 7838)
        # h2's server leaves its idle state on an ALTSVC: DATA or RST_STREAM then meet
        # the stream's rules (the client's table keeps its state).
        self._move_connection(ConnectionMove.ALTSVC_RECEIVED)

    def _on_unknown(self, kind: int, flags: int, sid: int, body: Body, events: list[Event]) -> None:
        """A frame of a type we do not know: reported, and otherwise ignored."""
        events.append(UnknownFrameReceived(type=kind, flags=flags, stream_id=sid, body=bytes(body)))


#: Frame type byte -> its handler: ``_on_data`` for DATA, ``_on_rst_stream`` for
#: RST_STREAM..., :meth:`Connection._on_unknown` for a type HTTP/2 does not define.
Connection._handlers = tuple(
    getattr(Connection, "_on_" + FRAME_NAMES[k].lower())
    if k in FRAME_NAMES
    else lambda conn, *frame, kind=k: conn._on_unknown(kind, *frame)
    for k in range(256)
)
