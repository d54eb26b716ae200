"""The server role of our HTTP/2 connection (:mod:`.h2core`): what a gRPC server sends.

Why our own: h2's ``H2Connection`` pays on every frame for being all of HTTP/2 for any
peer (two state machines per event, a frame object per frame sent, an HPACK encoder that
searches its table): about 100 us of the worker's 280-840 us of CPU per small unary call
(docs/benchmarks.md, "The lean HTTP/2 connection"). :class:`ServerConnection` keeps the
method names and arguments of h2's that the asyncio edge (:mod:`.h2guard`) calls, and its
events and errors carry h2's names and fields: for the same client bytes they are h2's
(``tests/test_h2lean.py``), except where :mod:`.h2core` says we differ on purpose.

What the server role leaves out: opening streams (no push), priority trees (reported, not
kept), SETTINGS_MAX_CONCURRENT_STREAMS as a connection error (the guard refuses one stream
too many with REFUSED_STREAM, RFC 9113 §5.1.2), header validation (ours is
:func:`.framing.request_head`), and the WINDOW_UPDATE h2 sends on a half-closed (remote)
stream (the peer may send nothing more on it). Our header blocks never touch HPACK's
dynamic table; the constant ones are encoded once (:data:`CONSTANT_BLOCKS`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from . import h2events
from .h2core import Connection
from .h2wire import DATA, END_HEADERS, END_STREAM, HEADERS, frame_head
from .hpack_blocks import encode_headers


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


class ServerConnection(Connection):
    """The server side of one HTTP/2 connection (module docstring)."""

    client = False

    def initiate_connection(self) -> None:
        self._out.append(self._settings_frame())

    def send_headers(
        self, stream_id: int, headers: Iterable[tuple[str, str]], end_stream: bool = False
    ) -> None:
        stream = self._sendable(stream_id)
        if stream.headers_sent and not end_stream:
            raise h2events.ProtocolError("Trailers must have END_STREAM set")
        block = CONSTANT_BLOCKS.get(headers)
        self._queue_block(
            stream_id, encode_headers(headers) if block is None else block, end_stream
        )
        stream.headers_sent = True
        if end_stream:
            self._move(stream, self._on_send_end)

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
            or stream.headers_sent
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
        stream.headers_sent = True
        self._move(stream, self._on_send_end)
        return True
