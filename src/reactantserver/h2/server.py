"""The server role of our HTTP/2 connection (:mod:`.core`): what a gRPC server sends.

Why our own: h2's ``H2Connection`` pays on every frame for being all of HTTP/2 for any
peer (two state machines per event, a frame object per frame sent, an HPACK encoder that
searches its table): about 100 us of the worker's 280-840 us of CPU per small unary call
(docs/benchmarks.md, "The lean HTTP/2 connection"). :class:`ServerConnection` keeps the
method names and arguments of h2's that the asyncio edge (:mod:`..transport.h2guard`) calls, and its
events and errors carry h2's names and fields: for the same client bytes they are h2's
(``tests/h2/test_h2lean.py``), except where :mod:`.core` says we differ on purpose.

What the server role leaves out: opening streams (no push), priority trees (reported, not
kept), SETTINGS_MAX_CONCURRENT_STREAMS as a connection error (the guard refuses one stream
too many with REFUSED_STREAM, RFC 9113 §5.1.2), header validation (ours is
:func:`..transport.core.framing.request_head`), and the WINDOW_UPDATE h2 sends on a half-closed (remote)
stream (the peer may send nothing more on it). The constant header lists of every
answer go through HPACK's dynamic table (:data:`CONSTANT_BLOCKS`,
:class:`.hpack.TableEncoder`: three bytes an answer once the first has indexed
them); every other block is literals that never touch it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from . import events as h2events
from .core import Connection
from .hpack import encode_headers
from .wire import DATA, DEFAULT_FRAME, END_HEADERS, END_STREAM, HEADERS, frame_head


class _ConstantLists:
    """The header lists sent on every call, registered by their owners (:mod:`..transport.unary`):
    ``ANSWER_HEADERS`` and ``OK_TRAILERS``. Each connection sends them through the peer's
    dynamic table (:class:`.hpack.TableEncoder`): after the first answer, an
    answer's headers and trailers are three bytes. A list is known by identity and kept
    alive here, so an id is never reused by another list."""

    def __init__(self) -> None:
        self._lists: dict[int, object] = {}

    def remember(self, headers: Sequence[tuple[str, str]]) -> None:
        # Its block, whatever the table holds, is at most its literals: one frame.
        assert len(encode_headers(headers)) <= DEFAULT_FRAME, "a constant list fits a frame"
        self._lists[id(headers)] = headers

    def __contains__(self, headers: object) -> bool:
        return self._lists.get(id(headers)) is headers


#: Header lists sent on every call, registered by their owners (:mod:`..transport.unary`).
CONSTANT_BLOCKS = _ConstantLists()


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
        # Encoded as it is queued: the order of the blocks on the wire is the order the
        # peer's decoder reads them (a size update owed opens the block: _queue_block).
        self._queue_block(
            stream_id,
            self.table.encode(headers)  # type: ignore[arg-type]  # a registered list
            if headers in CONSTANT_BLOCKS
            else encode_headers(headers),
            end_stream,
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
        table = self.table
        if (
            table.owed
            or headers not in CONSTANT_BLOCKS
            or trailers not in CONSTANT_BLOCKS
            or stream.headers_sent
            or size > self.max_outbound_frame_size
            or size > stream.send_window
            or size > self.outbound_flow_control_window
        ):
            return False
        # Encoded only now that nothing can refuse the answer (an entry the encoder adds
        # must reach the peer); a constant list's block is far below any frame size.
        head = table.encode(headers)
        tail = table.encode(trailers)
        out = self._out
        out.append(frame_head(HEADERS, END_HEADERS, stream_id, len(head)))
        out.append(head)
        out.append(frame_head(DATA, 0, stream_id, size))
        out.extend(data)
        out.append(frame_head(HEADERS, END_STREAM | END_HEADERS, stream_id, len(tail)))
        out.append(tail)
        stream.headers_sent = True
        self._sent(stream, size, True)  # the windows' debit and the stream's move
        return True
