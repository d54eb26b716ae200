"""HTTP/2 connections a hostile peer cannot stop, slow or fool: grpclib's protocol, guarded.

grpclib does the gRPC work (streams, flow-control bookkeeping, message send and receive)
and our lean HTTP/2 connection (:mod:`.h2lean`, h2's events and errors) does the protocol.
Both trust their peer more than a server facing anyone on the
network may, and this module closes the gaps at the layer where bytes become events --
below any request handler, so every server built on it (the worker's, a gateway's) gets
the same protection, whatever the asyncio/Trio bridge above it looks like.

Theory of operation
-------------------
One :class:`GuardedProtocol` per accepted socket. It builds the HTTP/2 connection itself (so
that every limit is in the first SETTINGS frame), feeds it the bytes, and hands the
events to :class:`_Processor`, grpclib's ``EventsProcessor`` with these changes:

* **Unknown events are ignored.** grpclib raises ``NotImplementedError`` for an h2 event
  it has no handler for (``UnknownFrameReceived``: any frame type it does not know, e.g.
  PRIORITY_UPDATE 0x10, ORIGIN 0xC), which escaped the protocol callback and ended the
  process. RFC 9113 §4.1 and §5.5: unknown frame types MUST be ignored.
* **Requests are judged at HEADERS.** Before a stream gets a handler, its headers pass
  :func:`.framing.request_head` through the sink's ``admit`` (method, content type,
  encoding, ``grpc-timeout``, known path); a refusal is answered trailers-only at once.
  A stream past ``max_concurrent_streams`` is reset with REFUSED_STREAM (clients retry
  it); h2 would instead tear the whole connection down, so its own count is disabled
  (:class:`.h2settings.ServerSettings`) and the limit is enforced here, per stream.
* **Messages are judged as DATA arrives.** A :class:`.framing.MessageFramer` per stream
  reads each 5-byte gRPC prefix the moment it is complete: a declared length over
  ``max_message_bytes`` (or a bad flag, a second message on a unary call, a stream cut
  short) is answered, the stream is reset, the bytes buffered for it are dropped and
  handed back to the connection window, and no more window is granted for it.
* **Frames are judged by their header.** h2 waits for a whole frame before checking its
  length, so a DATA frame declaring 16 MiB was buffered although we advertise 1 MiB;
  :class:`.h2frames.FrameCutter` checks the 9-byte header first: FRAME_SIZE_ERROR, GOAWAY. It
  also bounds a header block (HEADERS plus CONTINUATIONs) to ``max_header_list_size``
  bytes: h2 would buffer up to 64 CONTINUATION frames of any allowed size.
* **What a peer makes us do for nothing is budgeted** (:class:`.abuse.AbuseBudget`, one
  per connection, given the loop's time). A peer may reset a call it started (a client
  cancelling), but a reset frees the stream's slot under ``max_concurrent_streams`` after
  the server began work on it: HTTP/2 "rapid reset" (CVE-2023-44487) opens and resets
  streams as fast as it can, and "MadeYouReset" (CVE-2025-8671) makes the *server* reset
  them, by provoking a stream error on each (a WINDOW_UPDATE overflowing the stream's
  window, a frame on a stream it ended, a malformed request or message). Both kinds of
  reset count against the calls started (more than half, past 200 calls: abuse), and
  frames that ask for nothing -- PING, SETTINGS, empty DATA, frames on reset streams,
  streams past the limit -- against a token bucket. Past either, GOAWAY
  ENHANCE_YOUR_CALM and the connection closes. A stream the server was made to reset
  before its call started (the provoking frame in the same read as its HEADERS) cost
  nothing but the RST_STREAM, and counts as a frame for nothing. The lean connection
  counts the frames it was sent for nothing (:attr:`.h2lean.ServerConnection.wasted`);
  the guard hands the new count to the budget after each read.
* **Connections are bounded in number and time.** :class:`ConnectionTable` caps open
  connections (evicting the oldest one still in its handshake before refusing a new one
  with GOAWAY); each protocol closes itself when the preface and SETTINGS do not arrive
  within ``handshake_timeout``, and sends GOAWAY and closes after ``idle_timeout`` with
  no open stream (both checked by a periodic sweep of the table, not a timer per
  connection). A peer that stops reading our output stops being read (the protocol
  pauses reading while the transport's write buffer is full), so PING or SETTINGS
  floods cannot grow our buffers.
* **Nothing escapes a callback.** A protocol error in the peer's bytes is a clean
  connection error (h2's GOAWAY, then close), counted and logged through the rate-limited
  :class:`~.faultlog.FaultLog`; an exception in our own event handling is logged with its
  traceback and closes that connection only: one bad connection must not end the
  server.

The HTTP/2 connection itself is :mod:`.h2lean`; its first SETTINGS, the early
frame-length check and the corked transport are in :mod:`.h2conn`.

What is deliberately not here: the request handlers (:mod:`.server`), message codecs and
the Trio bridge (:mod:`.grpc`). This module imports grpclib's ``protocol`` module only.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from grpclib.config import Configuration
from grpclib.protocol import Connection, EventsProcessor, Stream

from . import h2events
from .abuse import AbuseBudget
from .faultlog import FaultLog
from .framing import MessageFramer, Refusal
from .h2conn import CorkedTransport, held_writes, new_h2_connection
from .h2events import ErrorCodes
from .h2lean import ServerConnection
from .limits import Fault, WireCounters, WireLimits
from .unary import DirectAdmission, DirectCalls, status_headers

log = logging.getLogger(__name__)

#: Above this much unsent output the peer is not read from (see ``pause_writing``).
WRITE_HIGH_WATER = 4 * 1024 * 1024
#: How long a connection stays open after our GOAWAY, so the frame reaches the peer
#: before the socket closes (closing with unread input makes the kernel send RST, and
#: the peer may then lose the GOAWAY).
GOAWAY_LINGER = 0.25
#: Refused connections lingering at once at most; past it they are closed at once.
MAX_LINGERING = 64
#: Refusals of a request the peer malformed (RFC 9113 §8.1.1: a stream error): each one
#: is a reset the peer provoked, counted in the abuse budget with the others (of a running
#: call: against the calls; at HEADERS, before anything started: as a frame for nothing).
_MALFORMED = frozenset({Fault.BAD_REQUEST, Fault.MALFORMED_MESSAGE})


class Admitted(Protocol):
    """What a sink's ``admit`` returns for a request it will serve."""

    @property
    def unary_request(self) -> bool:
        """Whether the request carries exactly one message (so the framer can check)."""
        ...


class RequestSink(Protocol):
    """The request layer above a connection (one per connection): :mod:`.server`."""

    def admit(
        self, headers: Sequence[tuple[str, str]], peer: str, now: float
    ) -> Admitted | Refusal:
        """Judge a request from its headers alone (sync, no I/O); ``now``: the loop time
        they were read at."""
        ...

    def accept(self, stream: Stream, admitted: Any, release: Callable[[], None]) -> None:
        """Start serving an admitted stream; call ``release`` once when it is done."""
        ...

    def cancel(self, stream: Stream) -> None:
        """Stop serving ``stream`` (reset by the peer, or refused by the framer)."""
        ...

    def close(self) -> None:
        """The connection is gone: stop serving every stream."""
        ...


class ConnectionTable:
    """Every open connection of one server, the connection limit, and the fault tally."""

    def __init__(self, limits: WireLimits, counters: WireCounters, faults: FaultLog) -> None:
        self.limits = limits
        self.counters = counters
        self.faults = faults
        self._open: dict[GuardedProtocol, None] = {}
        #: Open connections whose handshake is not complete, oldest first.
        self._handshaking: dict[GuardedProtocol, None] = {}
        self._lingering = 0

    def __len__(self) -> int:
        return len(self._open)

    def fault(self, fault: Fault, peer: str, detail: str) -> None:
        self.counters.faults[fault] += 1
        self.faults.report(fault, peer, detail)

    def admit(self, protocol: GuardedProtocol) -> bool:
        """Take a new connection in, making room if one is still in its handshake."""
        if len(self._open) >= self.limits.max_connections:
            if not self._handshaking:
                self.counters.connections_refused += 1
                self.fault(
                    Fault.TOO_MANY_CONNECTIONS,
                    protocol.peer,
                    f"refused: {len(self._open)} connections are open "
                    f"({self.limits.names.max_connections})",
                )
                return False
            victim = next(iter(self._handshaking))
            self.counters.connections_evicted += 1
            self.fault(
                Fault.TOO_MANY_CONNECTIONS,
                victim.peer,
                "closed in its handshake to make room for a new connection "
                f"({self.limits.names.max_connections})",
            )
            victim.abort()
        self._open[protocol] = None
        self._handshaking[protocol] = None
        self.counters.connections_open = len(self._open)
        self.counters.connections_accepted += 1
        return True

    def handshaken(self, protocol: GuardedProtocol) -> None:
        self._handshaking.pop(protocol, None)

    def closed(self, protocol: GuardedProtocol) -> None:
        self._open.pop(protocol, None)
        self._handshaking.pop(protocol, None)
        self.counters.connections_open = len(self._open)

    def sweep(self, now: float) -> None:
        """Close connections past their handshake or idle timeout (``now``: loop time).

        One periodic sweep instead of a timer per connection: a cancelled asyncio timer
        stays in the loop's heap until its time comes, so a timer per connection would
        let a client that churns connections pile up cancelled timers for as long as
        ``idle_timeout``.
        """
        for protocol in list(self._handshaking):
            if now - protocol.opened_at < self.limits.handshake_timeout:
                break  # admission order: the rest are younger
            protocol.handshake_expired()
        for protocol in list(self._open):
            if protocol.idle_expired(now):
                self.counters.connections_idle_closed += 1
                protocol.goaway()

    def linger(self) -> bool:
        """Reserve a slot for a refused connection to linger in (False: none left)."""
        if self._lingering >= MAX_LINGERING:
            return False
        self._lingering += 1
        return True

    def unlinger(self) -> None:
        self._lingering -= 1

    def goaway(self) -> None:
        """GOAWAY on every connection: "open no new streams here"."""
        for protocol in list(self._open):
            protocol.goaway()

    def close(self) -> None:
        for protocol in list(self._open):
            protocol.abort()


class _Processor(EventsProcessor):
    """grpclib's events processor with the checks of the module docstring."""

    handler: RequestSink  # type: ignore[assignment]

    def __init__(self, sink: RequestSink, connection: Connection, guard: GuardedProtocol) -> None:
        super().__init__(sink, connection)  # type: ignore[arg-type]
        self._guard = guard
        self._limits = guard.limits
        self._counters = guard.table.counters
        self._h2: ServerConnection = connection._connection  # type: ignore[assignment]
        #: Calls to direct methods (:mod:`.unary`): no grpclib stream, no task.
        self.direct = DirectCalls(
            self._h2, connection, guard.peer, guard.fault, self._released, guard.now
        )
        self._framers: dict[int, MessageFramer] = {}
        #: The setting that bounds a request message here, named when one is refused.
        self._message_key = guard.limits.names.max_message_bytes
        #: When each running call started (loop time), for the premature-reset rule.
        self._started: dict[int, float] = {}
        #: What the peer made us do for nothing, judged (module docstring); calls started
        #: are counted into it here (``budget.streams``), the rest through :meth:`tally`.
        self.budget = AbuseBudget(guard.opened_at)
        #: The lean connection, and its count of frames for nothing the budget was told of.
        self.lean = self._h2
        self.seen_wasted = 0
        #: Event class -> its handler (grpclib's ``processors``; grpclib's ``process``, which
        #: raises for an event it has no handler for, is not used), emptied on close so that
        #: the loop over one read's events stops handling them once the connection closed.
        self.handlers: dict[type, Any] = self.processors

    # ------------------------------------------------------------------ streams

    def process_request_received(self, event: h2events.RequestReceived) -> None:
        sid = event.stream_id
        state = self._h2.streams.get(sid)
        if state is None or state.closed:
            # The peer reset it within the same read (HEADERS and RST_STREAM together):
            # nothing was started, nothing is owed, and h2 would refuse to reset it again.
            return
        open_calls = len(self.streams) + len(self.direct.calls)
        if open_calls >= self._limits.max_concurrent_streams:
            self._h2.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
            self._guard.fault(
                Fault.TOO_MANY_STREAMS,
                f"stream {sid} refused: {open_calls} calls are open on the connection "
                f"({self._limits.names.max_concurrent_streams})",
            )
            self._judged(self.budget.wasted_frames(1, self._guard.read_at), Fault.FRAME_FLOOD)
            return
        now = self._guard.read_at
        decision = self.handler.admit(event.headers, self._guard.peer, now)  # type: ignore[arg-type]
        if isinstance(decision, Refusal):
            self._answer(sid, decision)
            self._guard.fault(decision.fault, decision.message)
            if decision.fault in _MALFORMED:  # refused before it started: an answer for nothing
                self._judged(self.budget.wasted_frames(1, now), Fault.FRAME_FLOOD)
            return
        if isinstance(decision, DirectAdmission):
            self._started[sid] = now
            self.budget.streams += 1
            self._framers[sid] = MessageFramer(
                self._limits.max_message_bytes, unary=True, setting=self._message_key
            )
            self._count_opened()
            self.direct.open(sid, decision)  # released through self._released
            return
        stream = self.connection.create_stream(stream_id=sid)
        self._started[sid] = now
        self.budget.streams += 1
        release = self.register(stream)
        self._framers[sid] = MessageFramer(
            self._limits.max_message_bytes,
            unary=decision.unary_request,
            setting=self._message_key,
        )
        self.handler.accept(stream, decision, release)

    def register(self, stream: Stream) -> Callable[[], None]:
        sid = stream.id
        assert sid is not None
        return self._opened(sid, super().register(stream))

    def _opened(self, sid: int, release: Callable[[], None]) -> Callable[[], None]:
        """Count a grpclib stream that got a handler; its release (``release``: grpclib's
        part). A direct call is counted alike and released by :meth:`_released`."""
        self._count_opened()
        return lambda: self._released(sid, release)

    def _count_opened(self) -> None:
        counters = self._counters
        counters.streams_open += 1
        if counters.streams_open > counters.streams_peak:
            counters.streams_peak = counters.streams_open
        self._guard.busy()

    def _released(self, sid: int, release: Callable[[], None] | None = None) -> None:
        """A stream's handler is done with it (once per stream that got one)."""
        self._counters.streams_open -= 1
        self._framers.pop(sid, None)
        self._started.pop(sid, None)
        if release is not None:
            release()
        # A handler that finished while the peer is still sending (no END_STREAM yet)
        # asks it to stop (RFC 9113 §8.1), so that h2 forgets the stream: a peer could
        # otherwise keep answered streams open past our limit.
        state = self._h2.streams.get(sid)
        if state is not None and not state.closed and not self.connection.is_closing():
            self._h2.reset_stream(sid, ErrorCodes.NO_ERROR)
            self.connection.flush()
        if not self.streams and not self.direct.calls:
            self._guard.idle()

    def process_data_received(self, event: h2events.DataReceived) -> None:
        sid = event.stream_id
        framer = self._framers.get(sid)
        if framer is not None:
            refusal = framer.feed(event.data)
            if refusal is not None:
                self._refuse(sid, refusal, event.flow_controlled_length)
                return
        if sid in self.direct.calls:
            self.direct.data(sid, event.data, event.flow_controlled_length)  # type: ignore[arg-type]
            self.connection.data_received += len(event.data)
            return
        if not event.flow_controlled_length:
            # A DATA frame with no payload and no padding (legal anywhere in a stream) holds
            # nothing to read or acknowledge; handed on, grpclib's buffer would take it for
            # the end of the stream (its end mark is an entry of no flow-controlled bytes)
            # and a handler reading across it would read short.
            return
        super().process_data_received(event)

    def process_stream_ended(self, event: h2events.StreamEnded) -> None:
        sid = event.stream_id
        framer = self._framers.pop(sid, None)
        if framer is not None:
            refusal = framer.end()
            if refusal is not None:
                self._refuse(sid, refusal, 0)
                return
        if sid in self.direct.calls:
            self.connection.streams_succeeded += 1
            self.direct.ended(sid, self._guard.read_at)
            return
        super().process_stream_ended(event)

    def process_window_updated(self, event: h2events.WindowUpdated) -> None:
        # Most peers send a WINDOW_UPDATE or two per call; with only direct calls open
        # (nothing waits in grpclib's streams) and no answer blocked, it changes nothing.
        if self.streams:
            super().process_window_updated(event)
        if self.direct.blocked:
            self.direct.window(event.stream_id)

    def process_stream_reset(self, event: h2events.StreamReset) -> None:
        self._framers.pop(event.stream_id, None)
        started = self._started.pop(event.stream_id, None)
        self.direct.cancel(event.stream_id)
        super().process_stream_reset(event)
        budget = self.budget
        if event.remote_reset:
            if started is not None:
                self._judged(budget.peer_reset(started, self._guard.now()), Fault.RAPID_RESET)
        elif started is not None:  # the peer made us reset a running call (MadeYouReset)
            self._judged(budget.provoked_resets(1), Fault.RAPID_RESET)
        else:  # ... or a stream whose call never started: an RST_STREAM for nothing
            self._judged(budget.wasted_frames(1, self._guard.read_at), Fault.FRAME_FLOOD)

    def tally(self) -> None:
        """Hand the budget the frames for nothing the lean connection counted."""
        wasted = self.lean.wasted - self.seen_wasted
        self.seen_wasted = self.lean.wasted
        self._judged(self.budget.wasted_frames(wasted, self._guard.read_at), Fault.FRAME_FLOOD)

    def _judged(self, verdict: str | None, fault: Fault) -> None:
        """Past the budget (a verdict): GOAWAY ENHANCE_YOUR_CALM, once."""
        if verdict is None or self._guard.closing:
            return
        self._guard.fault(fault, f"{verdict}; connection closed with GOAWAY ENHANCE_YOUR_CALM")
        self._guard.goaway(ErrorCodes.ENHANCE_YOUR_CALM, b"too much work asked for nothing")

    def process_remote_settings_changed(self, event: h2events.RemoteSettingsChanged) -> None:
        # The peer's first SETTINGS frame (after its preface) completes the handshake.
        self._guard.handshake_done()
        super().process_remote_settings_changed(event)
        self.direct.resume()  # its initial window may have grown

    def resume(self) -> None:
        """The transport drained: answers waiting for it go on."""
        self.direct.resume()

    def close(self, reason: str = "Connection closed") -> None:
        self.handlers.clear()  # before grpclib drops it: events still queued are ignored
        super().close(reason)
        self.direct.close()

    # ------------------------------------------------------------------ refusing

    def _refuse(self, sid: int, refusal: Refusal, unacked: int) -> None:
        """Answer ``refusal`` on a stream with a handler, drop it and what it buffered."""
        self._framers.pop(sid, None)
        self._answer(sid, refusal)
        self._guard.fault(refusal.fault, refusal.message)
        if refusal.fault in _MALFORMED:
            self._judged(self.budget.provoked_resets(1), Fault.RAPID_RESET)
        stream = self.streams.get(sid)
        if stream is not None:
            unacked += stream.buffer.unacked_size()  # drains the buffer's queue
            self.handler.cancel(stream)
        self.direct.cancel(sid)  # its DATA was acknowledged as it came
        if unacked:
            # The stream is closed now, so this opens the connection window only: the
            # bytes are dropped, not consumed, and the stream gets no more window.
            self._h2.acknowledge_received_data(unacked, sid)

    def _answer(self, sid: int, refusal: Refusal) -> None:
        """A trailers-only answer (or trailers, after headers), then "stop sending"."""
        state = self._h2.streams.get(sid)
        if state is None or state.closed:
            return
        headers = status_headers(
            refusal.code,
            refusal.message,
            headers_sent=state.state_machine.headers_sent,
            http_status=refusal.http_status,
            extra=refusal.headers,
        )
        self._h2.send_headers(sid, headers, end_stream=True)
        if not state.closed:  # the peer may still be sending: RST_STREAM NO_ERROR
            self._h2.reset_stream(sid, ErrorCodes.NO_ERROR)


def _peer_name(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer or "")


class GuardedProtocol(asyncio.Protocol):
    """One server connection; see the module docstring."""

    def __init__(self, table: ConnectionTable, sink: RequestSink) -> None:
        self.table = table
        self.limits = table.limits
        self._sink = sink
        self.peer = ""
        self.connection: Connection | None = None
        self._processor: _Processor | None = None
        self._transport: asyncio.Transport | None = None
        self._cork: CorkedTransport | None = None
        #: This thread's owed flushes (the protocol is made on its loop's thread).
        self._held = held_writes()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handshaken = False
        #: GOAWAY sent or the connection refused: input is no longer read.
        self._closing = False
        self._streams_open = False
        #: Loop times: when the connection was accepted, and since when it has no stream.
        self.opened_at = 0.0
        self._idle_since = 0.0
        #: Loop time of the latest read: when the frames being handled arrived (one clock
        #: reading per read, for every request in it).
        self.read_at = 0.0

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._loop = loop = asyncio.get_running_loop()
        self.peer = _peer_name(transport)
        self.opened_at = self._idle_since = loop.time()
        try:
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                # Small unary answers must not wait ~40 ms for the peer's delayed ACK.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
            if not self.table.admit(self):
                self._refuse_connection()
                return
            self._cork = CorkedTransport(transport, loop)
            conn = new_h2_connection(self.limits)
            conn.initiate_connection()
            conn.increment_flow_control_window(self.limits.connection_window - 65535)
            self.connection = Connection(
                conn,  # type: ignore[arg-type]  # the subset of H2Connection grpclib uses
                self._cork,  # type: ignore[arg-type]
                config=Configuration().__for_server__(),
            )
            self._processor = _Processor(self._sink, self.connection, self)
            self.connection.flush()
        except Exception:
            log.exception("setting up the connection from %s failed; closing it", self.peer)
            self.abort()

    def data_received(self, data: bytes) -> None:
        if self._closing or self.connection is None or self._processor is None:
            return
        self.read_at = self.now()
        held = self._held
        held.enter()  # what this read provokes is sent as it returns
        try:
            self._received(self.connection, self._processor, data)
        finally:
            held.leave()

    def _received(self, connection: Connection, processor: _Processor, data: bytes) -> None:
        try:
            events = connection.feed(data)
        except h2events.ProtocolError as exc:
            kind = (
                Fault.FRAME_TOO_LARGE
                if isinstance(exc, h2events.FrameTooLargeError)
                else Fault.PROTOCOL_ERROR
            )
            self.fault(kind, f"{exc or type(exc).__name__}; connection closed with GOAWAY")
            self.abort()  # h2 has queued its GOAWAY; abort flushes it first
            return
        except Exception as exc:
            # h2 choked on the bytes themselves (a header value that is not ASCII, ...);
            # its header-compression state is now unknown, so the connection must end.
            self.fault(
                Fault.PROTOCOL_ERROR,
                f"undecodable input ({type(exc).__name__}: {exc}); connection closed with GOAWAY",
            )
            try:
                connection._connection.close_connection(ErrorCodes.PROTOCOL_ERROR)
            except Exception:  # h2 is in a state where it cannot even say so
                log.debug("no GOAWAY for %s", self.peer, exc_info=True)
            self.abort()
            return
        try:
            connection.flush()
            handlers = processor.handlers
            for event in events:
                handle = handlers.get(event.__class__)
                if handle is not None:
                    handle(event)
                # Any other event -- UnknownFrameReceived above all -- has no meaning for a
                # gRPC server and is ignored, as RFC 9113 §5.5 requires for unknown frames.
            if processor.lean.wasted != processor.seen_wasted:
                processor.tally()
            connection.flush()
        except Exception:
            log.exception("serving the connection from %s failed; closing it", self.peer)
            self.abort()

    def pause_writing(self) -> None:
        # The peer does not read what we write: stop reading what it writes, so that
        # answers it provokes (PING and SETTINGS ACKs, refusals) cannot pile up here.
        if self.connection is not None:
            self.connection.pause_writing()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self.connection is not None:
            self.connection.resume_writing()
        if self._processor is not None:
            self._processor.resume()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.table.closed(self)
        if self._cork is not None:
            self._cork.discard()
        if self._processor is not None:
            try:
                self._processor.close("Connection lost")
            except Exception:
                log.exception("closing the connection from %s failed", self.peer)

    # ------------------------------------------------------------------ processor hooks

    def fault(self, fault: Fault, detail: str) -> None:
        self.table.fault(fault, self.peer, detail)

    def now(self) -> float:
        """The loop's clock (the one the timeouts use)."""
        return self._loop.time() if self._loop is not None else 0.0

    @property
    def closing(self) -> bool:
        """GOAWAY sent or the connection refused: input is no longer read."""
        return self._closing

    def handshake_done(self) -> None:
        if not self._handshaken:
            self._handshaken = True
            self.table.handshaken(self)

    def busy(self) -> None:
        self._streams_open = True

    def idle(self) -> None:
        self._streams_open = False
        if self._loop is not None:
            self._idle_since = self._loop.time()

    # ------------------------------------------------------------------ timeouts (swept)

    def handshake_expired(self) -> None:
        self.fault(
            Fault.HANDSHAKE_TIMEOUT,
            f"no HTTP/2 preface and SETTINGS within {self.limits.handshake_timeout:g} s "
            f"({self.limits.names.handshake_timeout}); connection closed",
        )
        self.abort()

    def idle_expired(self, now: float) -> bool:
        return (
            self._handshaken
            and not self._streams_open
            and not self._closing
            and now - self._idle_since >= self.limits.idle_timeout
        )

    # ------------------------------------------------------------------ closing

    def goaway(self, error: ErrorCodes = ErrorCodes.NO_ERROR, debug: bytes | None = None) -> None:
        """GOAWAY (no new streams), then close after :data:`GOAWAY_LINGER`.

        Streams already running are not cut short by the GOAWAY itself; whoever calls
        this has let them finish (a graceful stop) or has none (idle).
        """
        if self._closing or self.connection is None or self.connection.is_closing():
            return
        self._closing = True
        try:
            self.connection._connection.close_connection(error, debug)
            self.connection.flush()
        except Exception:  # h2 is already in a closed state
            log.debug("GOAWAY not sent to %s", self.peer, exc_info=True)
        assert self._loop is not None
        self._loop.call_later(GOAWAY_LINGER, self.abort)

    def abort(self) -> None:
        """Close now: cancel the connection's calls, flush what is queued, close."""
        self._closing = True
        self.table.closed(self)
        if self._processor is not None:
            if self.connection is not None and not self.connection.is_closing():
                self.connection.flush()
            self._processor.close("Connection closed by the server")
        elif self._transport is not None:
            self._transport.close()

    def _refuse_connection(self) -> None:
        """Past ``max_connections``: GOAWAY saying why, then close (after a linger)."""
        assert self._transport is not None and self._loop is not None
        self._closing = True
        conn = new_h2_connection(self.limits)
        conn.initiate_connection()
        conn.close_connection(
            ErrorCodes.NO_ERROR,
            f"too many connections ({self.limits.names.max_connections} is "
            f"{self.limits.max_connections}); retry later".encode(),
            last_stream_id=0,
        )
        self._transport.write(conn.data_to_send())
        if self.table.linger():
            transport = self._transport

            def close() -> None:
                self.table.unlinger()
                transport.close()

            self._loop.call_later(GOAWAY_LINGER, close)
        else:
            self._transport.close()
