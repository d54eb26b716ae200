"""HTTP/2 connections a hostile peer cannot stop, slow or fool: the server's asyncio edge.

Our HTTP/2 connection (:mod:`..h2.core`, sans-IO) does the protocol; this module is the
thin asyncio layer around it and closes, at the layer where bytes become events, the gaps
a server facing anyone on the network must close -- for every server built on it (the
worker's, a gateway's), whatever the asyncio/Trio bridge above it looks like.

Theory of operation
-------------------
One :class:`GuardedProtocol` per accepted socket builds the connection (every limit in its
first SETTINGS frame), feeds it the bytes, writes what comes out, and hands the events to
:class:`_Processor`, a table from event class to handler:

* **Unknown events are ignored** (RFC 9113 §5.5: unknown frame types, e.g. ORIGIN 0xC),
  as are PING, SETTINGS ACK and PRIORITY (the connection answers PING itself).
* **Requests are judged at HEADERS.** Before a stream gets a handler, its headers pass
  :func:`.core.framing.request_head` through the sink's ``admit`` (method, content type,
  encoding, ``grpc-timeout``, known path); a refusal is answered trailers-only at once.
  A stream past ``max_concurrent_streams`` is reset with REFUSED_STREAM (clients retry
  it) instead of tearing the whole connection down: the limit is enforced here, per
  stream.
* **Messages are judged as DATA arrives.** A :class:`.core.framing.MessageFramer` per stream
  reads each 5-byte gRPC prefix the moment it is complete: a declared length over
  ``max_message_bytes`` (or a bad flag, a second message on a unary call, a stream cut
  short) is answered, the stream is reset, the bytes buffered for it are dropped and
  handed back to the connection window, and no more window is granted for it.
* **Frames are judged by their header** (:class:`..h2.parse.FrameReader`): a DATA frame
  declaring 16 MiB when we advertise 1 MiB is FRAME_SIZE_ERROR before its body arrives,
  and a header block is bounded to ``max_header_list_size`` bytes.
* **What a peer makes us do for nothing is budgeted** (:class:`..h2.abuse.AbuseBudget`, one
  per connection, kept by the connection itself, :mod:`..h2.core`, given the loop's time;
  its docstring says why and how): calls reset by the peer soon after they started
  (rapid reset, CVE-2023-44487) and calls the server was made to reset on a stream error
  the peer provoked (MadeYouReset, CVE-2025-8671) count against the calls started;
  frames that ask for nothing (PING, SETTINGS, empty DATA, frames on reset streams,
  streams past the limit) against a token bucket, judged after each read's events
  (:meth:`..h2.core.Connection.judge`). This edge only says what the connection cannot
  see -- which calls started (:meth:`..h2.core.Connection.call_started`), the streams it
  refused for nothing, the requests inside a stream's call -- and reads the verdict:
  past either rule, GOAWAY ENHANCE_YOUR_CALM and the connection closes.
* **Connections are bounded in number and time.** :class:`ConnectionTable` caps open
  connections: a new one past the cap closes the oldest still in its handshake, else the
  one idle the longest (no working call: only calls still waiting for their request
  message, or none), and is refused with GOAWAY only when every connection is doing
  work -- so connections that merely hold calls open cannot lock new clients out. Each
  protocol closes itself when the preface and SETTINGS do not arrive within
  ``handshake_timeout``, and sends GOAWAY and closes after ``idle_timeout`` without a
  working call (a unary call works from the end of its request message, a streaming one
  from its HEADERS). A unary call whose request message is not complete ``body_timeout``
  after its HEADERS is answered DEADLINE_EXCEEDED and reset (issue 41: such calls kept
  their connections open forever). All three are checked by a periodic sweep of the
  table, not a timer per connection.
* **Answers a peer does not read are bounded.** A peer that stops reading our output
  stops being read (the protocol pauses reading while the transport's write buffer is
  full, and answers wait), so PING or SETTINGS floods cannot grow our buffers. The
  answers waiting for its windows or its reading are counted per connection
  (:meth:`GuardedProtocol.answer_waits`): one that would leave more than
  ``max_unsent_bytes`` waiting fails with RESOURCE_EXHAUSTED (its bytes freed; one
  answer alone may always wait), and when none of them moves for ``send_timeout`` the
  connection is closed, freeing them all (issue 41: 32 answers of 8 MiB, unread, held
  256 MiB per connection).
* **Nothing escapes a callback.** A protocol error in the peer's bytes is a clean
  connection error (GOAWAY, our FIN, then close once the peer stops sending:
  :meth:`GuardedProtocol.fail`), counted and logged through the rate-limited
  :class:`~.core.faultlog.FaultLog`; an exception in our own event handling is logged with its
  traceback and closes that connection only: one bad connection must not end the
  server.

Calls are served two ways, both released through :meth:`_Processor._released` (which
frees the stream's slot): a *direct* method (:mod:`.unary`, ModelInfer) by the event
handlers themselves, without a task; any other by the sink (:mod:`.server`), whose
``accept`` returns the :class:`Receiver` the stream's events go to (a task's stream, or a
stream method's call record, :mod:`.streaming`, which reports the requests it begins and
the ones a reset withdraws to the abuse budget: :meth:`GuardedProtocol.calls_started`,
:meth:`GuardedProtocol.calls_reset`). What the connection
queued goes to the :class:`.h2conn.CorkedTransport` (:meth:`GuardedProtocol.flush`): one
``send`` per read, or per loop pass.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from reactantserver.status import StatusCode

from ..h2 import events as h2events
from ..h2.core import Verdict
from ..h2.events import ErrorCodes
from ..h2.server import ServerConnection
from .core.auth import Peer
from .core.faultlog import FaultLog
from .core.framing import MessageFramer, Refusal, RequestHead
from .core.limits import Fault, WireCounters, WireLimits
from .h2conn import CorkedTransport, held_writes
from .tls import certificate_names, negotiated_h2
from .unary import DirectAdmission, DirectCalls, status_headers

log = logging.getLogger(__name__)

#: Above this much unsent output the peer is not read from (see ``pause_writing``).
WRITE_HIGH_WATER = 4 * 1024 * 1024
#: How long a connection stays open after our GOAWAY, so the frame reaches the peer
#: before the socket closes (closing with unread input makes the kernel send RST, and
#: the peer may then lose the GOAWAY).
GOAWAY_LINGER = 0.25
#: How long a connection that broke the protocol is still read from, its bytes dropped,
#: after our GOAWAY and FIN (:meth:`GuardedProtocol.fail`), unless the peer closes first.
ERROR_LINGER = 1.0
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

    @property
    def head(self) -> RequestHead:
        """What the request's headers said (the framer reads ``compressed``)."""
        ...


class Receiver(Protocol):
    """A served stream, as the connection's events reach it (:class:`.server.ServerStream`)."""

    def received(self, data: memoryview, flow_controlled_length: int) -> None:
        """A DATA payload the framer accepted (acknowledged once it is read)."""
        ...

    def ended(self) -> None:
        """The peer ended the stream after a whole message."""
        ...

    def wake(self) -> None:
        """A window grew or the transport drained: a blocked send may go on."""
        ...

    def drop(self) -> int:
        """Forget what was received and not read; the flow-controlled bytes of it."""
        ...


class RequestSink(Protocol):
    """The request layer above a connection (one per connection): :mod:`.server`."""

    def admit(
        self, headers: Sequence[tuple[str, str]], peer: str, now: float
    ) -> Admitted | Refusal:
        """Judge a request from its headers alone (sync, no I/O); ``now``: the loop time
        they were read at."""
        ...

    def accept(
        self, guard: GuardedProtocol, sid: int, admitted: Any, release: Callable[[], None]
    ) -> Receiver:
        """Start serving an admitted stream; call ``release`` once when it is done."""
        ...

    def cancel(self, sid: int) -> None:
        """Stop serving stream ``sid`` (reset by the peer, or refused by the framer)."""
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
            victim = next(iter(self._handshaking), None)
            why = "in its handshake"
            if victim is None:
                victim = self._idlest()
                why = "without a working call"
            if victim is None:
                self.counters.connections_refused += 1
                self.fault(
                    Fault.TOO_MANY_CONNECTIONS,
                    protocol.peer,
                    f"refused: {len(self._open)} connections are open, each with a call at "
                    f"work ({self.limits.names.max_connections})",
                )
                return False
            self.counters.connections_evicted += 1
            self.fault(
                Fault.TOO_MANY_CONNECTIONS,
                victim.peer,
                f"closed {why} to make room for a new connection "
                f"({self.limits.names.max_connections})",
            )
            victim.abort()
        self._open[protocol] = None
        self._handshaking[protocol] = None
        self.counters.connections_open = len(self._open)
        self.counters.connections_accepted += 1
        return True

    def _idlest(self) -> GuardedProtocol | None:
        """The open connection without a working call the longest, if any (a scan, made
        only when the table is full)."""
        found: GuardedProtocol | None = None
        oldest = float("inf")
        for protocol in self._open:
            since = protocol.evictable_since()
            if since is not None and since < oldest:
                found, oldest = protocol, since
        return found

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
            elif protocol.send_stalled(now):
                protocol.send_expired()
            else:
                protocol.expire_bodies(now)

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


class _Processor:
    """The connection's events, each to its handler (the checks of the module docstring)."""

    def __init__(self, sink: RequestSink, guard: GuardedProtocol, h2: ServerConnection) -> None:
        self.sink = sink
        self._guard = guard
        self._h2 = h2
        self._limits = guard.limits
        self._counters = guard.table.counters
        #: Calls to direct methods (:mod:`.unary`): no task, no stream object.
        self.direct = DirectCalls(
            h2,
            guard,
            guard.peer,
            guard.fault,
            self._released,
            guard.now,
            message_limit=(guard.limits.max_message_bytes, guard.limits.names.max_message_bytes),
            later=guard.later,
        )
        #: The sink's calls (every other method), by stream id.
        self.streams: dict[int, Receiver] = {}
        self._framers: dict[int, MessageFramer] = {}
        #: The setting that bounds a request message here, named when one is refused.
        self._message_key = guard.limits.names.max_message_bytes
        #: Unary calls whose request message is not complete yet: when their HEADERS came
        #: (loop time), for ``body_timeout``.
        self._receiving: dict[int, float] = {}
        #: Calls at work: a unary one from the end of its request message, a streaming
        #: one from its HEADERS; the connection is idle while there is none.
        self.working: set[int] = set()
        #: Event class -> its handler; any other event is ignored. Emptied on close, so
        #: that the loop over one read's events stops handling them once the connection
        #: closed.
        self.handlers: dict[type, Callable[[Any], None]] = {
            h2events.RequestReceived: self.request_received,
            h2events.DataReceived: self.data_received,
            h2events.StreamEnded: self.stream_ended,
            h2events.WindowUpdated: self.window_updated,
            h2events.StreamReset: self.stream_reset,
            h2events.RemoteSettingsChanged: self.settings_changed,
            h2events.ConnectionTerminated: self.connection_terminated,
        }

    # ------------------------------------------------------------------ streams

    def request_received(self, event: h2events.RequestReceived) -> None:
        sid = event.stream_id
        if sid not in self._h2.streams:  # the connection forgets a stream as it closes
            # The peer reset it within the same read (HEADERS and RST_STREAM together):
            # nothing was started, nothing is owed, and it cannot be reset again.
            return
        open_calls = len(self.streams) + len(self.direct.calls)
        if open_calls >= self._limits.max_concurrent_streams:
            self._h2.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
            self._guard.fault(
                Fault.TOO_MANY_STREAMS,
                f"stream {sid} refused: {open_calls} calls are open on the connection "
                f"({self._limits.names.max_concurrent_streams})",
            )
            self._h2.answered_for_nothing()
            return
        now = self._guard.read_at
        decision = self.sink.admit(event.headers, self._guard.peer, now)
        if isinstance(decision, Refusal):
            self._answer(sid, decision)
            self._guard.fault(decision.fault, decision.message)
            if decision.fault in _MALFORMED:  # refused before it started: an answer for nothing
                self._h2.answered_for_nothing()
            return
        self._h2.call_started(sid, now)  # for the abuse budget (module docstring)
        self._framers[sid] = MessageFramer(
            self._limits.max_message_bytes,
            unary=decision.unary_request,
            setting=self._message_key,
            compressed=decision.head.compressed,
        )
        counters = self._counters
        counters.streams_open += 1
        if counters.streams_open > counters.streams_peak:
            counters.streams_peak = counters.streams_open
        if decision.unary_request:
            self._receiving[sid] = now
        else:
            self._working(sid)
        if isinstance(decision, DirectAdmission):
            self.direct.open(sid, decision)  # released through self._released
        else:
            self.streams[sid] = self.sink.accept(
                self._guard, sid, decision, lambda: self._released(sid)
            )

    def _working(self, sid: int) -> None:
        if not self.working:
            self._guard.busy()
        self.working.add(sid)

    def call_works(self, sid: int) -> None:
        """A running call (a stream method's, with requests owed) is at work."""
        if sid in self.streams:
            self._working(sid)

    def call_rests(self, sid: int) -> None:
        """A running call has nothing to do until its client sends more (a stream method's
        with no request owed): it keeps the connection neither busy nor unevictable."""
        if sid in self.working:
            self.working.discard(sid)
            if not self.working:
                self._guard.idle()

    def _released(self, sid: int) -> None:
        """A stream's handler is done with it (once per stream that got one)."""
        self._counters.streams_open -= 1
        self._framers.pop(sid, None)
        self._receiving.pop(sid, None)
        self.working.discard(sid)
        h2 = self._h2
        # What the handler did not read is dropped, not consumed: the connection's window
        # gets it back. A handler that finished while the peer is still sending (no
        # END_STREAM yet) asks it to stop (RFC 9113 §8.1), so that the connection forgets
        # the stream: a peer could otherwise keep answered streams open past our limit.
        stream = self.streams.pop(sid, None)
        unread = stream.drop() if stream is not None else 0
        still_open = sid in h2.streams
        if (unread or still_open) and not self._guard.is_closing():
            if unread:
                h2.acknowledge_received_data(unread, sid)
            if still_open:
                h2.reset_stream(sid, ErrorCodes.NO_ERROR)
            self._guard.flush()
        if not self.working:
            self._guard.idle()

    def data_received(self, event: h2events.DataReceived) -> None:
        sid = event.stream_id
        framer = self._framers.get(sid)
        if framer is not None:
            refusal = framer.feed(event.data)
            if refusal is not None:
                self._refuse(sid, refusal, event.flow_controlled_length)
                return
        if sid in self.direct.calls:
            self.direct.data(sid, event.data, event.flow_controlled_length)
            return
        if not event.flow_controlled_length:
            return  # a DATA frame with no payload and no padding: nothing to read or ack
        stream = self.streams.get(sid)
        if stream is not None:
            stream.received(event.data, event.flow_controlled_length)
        else:  # a stream already answered: its bytes are dropped, the window given back
            self._h2.acknowledge_received_data(event.flow_controlled_length, sid)

    def stream_ended(self, event: h2events.StreamEnded) -> None:
        sid = event.stream_id
        framer = self._framers.pop(sid, None)
        if framer is not None:
            refusal = framer.end()
            if refusal is not None:
                self._refuse(sid, refusal, 0)
                return
        if self._receiving.pop(sid, None) is not None:
            self._working(sid)  # its request message is complete: the call is at work
        if sid in self.direct.calls:
            self.direct.ended(sid, self._guard.read_at)
            return
        stream = self.streams.get(sid)
        if stream is not None:
            stream.ended()

    def window_updated(self, event: h2events.WindowUpdated) -> None:
        # Most peers send a WINDOW_UPDATE or two per call; with only direct calls open
        # and no answer blocked, it changes nothing.
        sid = event.stream_id
        if not sid:
            for stream in self.streams.values():
                stream.wake()
        elif (waiting := self.streams.get(sid)) is not None:
            waiting.wake()
        if self.direct.blocked:
            self.direct.window(sid)

    def stream_reset(self, event: h2events.StreamReset) -> None:
        sid = event.stream_id
        self._framers.pop(sid, None)
        self._receiving.pop(sid, None)
        self.direct.cancel(sid)
        if sid in self.streams:
            self.sink.cancel(sid)
        # The connection judged the reset as it came (the peer's of a call just started,
        # or one it provoked; module docstring): past the budget, GOAWAY here.
        self._judged(self._h2.verdict)

    def judge(self) -> None:
        """Once a read's events are handled: the connection's budget judges the frames
        for nothing it counted in them (the calls they started earned their credit)."""
        self._judged(self._h2.judge(self._guard.read_at))

    def _judged(self, verdict: Verdict | None) -> None:
        """Past the budget (its verdict: the rule broken and why): GOAWAY
        ENHANCE_YOUR_CALM, once, counted as the wire fault of the same name."""
        if verdict is None or self._guard.closing:
            return
        abuse, why = verdict
        self._guard.fault(
            Fault(abuse.value), f"{why}; connection closed with GOAWAY ENHANCE_YOUR_CALM"
        )
        self._guard.goaway(ErrorCodes.ENHANCE_YOUR_CALM, b"too much work asked for nothing")

    def expire_bodies(self, now: float) -> None:
        """Answer DEADLINE_EXCEEDED, and reset, every unary call whose request message is
        not complete ``body_timeout`` seconds after its HEADERS (``now``: loop time)."""
        timeout = self._limits.body_timeout
        late = [sid for sid, since in self._receiving.items() if now - since >= timeout]
        for sid in late:
            self._receiving.pop(sid, None)
            self._refuse(
                sid,
                Refusal(
                    StatusCode.DEADLINE_EXCEEDED,
                    f"the request message did not arrive within {timeout:g} s of the call's "
                    f"headers ({self._limits.names.body_timeout})",
                    Fault.BODY_TIMEOUT,
                ),
                0,
            )
        if late:
            self._guard.flush()

    def settings_changed(self, event: h2events.RemoteSettingsChanged) -> None:
        # The peer's first SETTINGS frame (after its preface) completes the handshake.
        self._guard.handshake_done()
        self.resume()  # its initial window may have grown

    def connection_terminated(self, event: h2events.ConnectionTerminated) -> None:
        self._guard.abort()  # the peer's GOAWAY: its calls are over

    def resume(self) -> None:
        """The transport drained (or windows grew): answers waiting for it go on."""
        for stream in self.streams.values():
            stream.wake()
        self.direct.resume()

    def close(self) -> None:
        self.handlers.clear()  # events still queued in this read are ignored
        self.sink.close()
        self.direct.close()

    # ------------------------------------------------------------------ refusing

    def _refuse(self, sid: int, refusal: Refusal, unacked: int) -> None:
        """Answer ``refusal`` on a stream with a handler, drop it and what it buffered."""
        self._framers.pop(sid, None)
        self._receiving.pop(sid, None)
        self._answer(sid, refusal)
        self._guard.fault(refusal.fault, refusal.message)
        if refusal.fault in _MALFORMED:
            self._judged(self._h2.refused_malformed())
        stream = self.streams.get(sid)
        if stream is not None:
            unacked += stream.drop()
            self.sink.cancel(sid)
        self.direct.cancel(sid)  # its DATA was acknowledged as it came
        if unacked:
            # The stream is closed now, so this opens the connection window only: the
            # bytes are dropped, not consumed, and the stream gets no more window.
            self._h2.acknowledge_received_data(unacked, sid)

    def _answer(self, sid: int, refusal: Refusal) -> None:
        """A trailers-only answer (or trailers, after headers), then "stop sending"."""
        state = self._h2.streams.get(sid)
        if state is None:
            return
        headers = status_headers(
            refusal.code,
            refusal.message,
            headers_sent=state.headers_sent,
            http_status=refusal.http_status,
            extra=refusal.headers,
        )
        self._h2.send_headers(sid, headers, end_stream=True)
        if sid in self._h2.streams:  # the peer may still be sending: RST_STREAM NO_ERROR
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
        #: Who the client is (its certificate under mutual TLS, else the connection).
        self.identity = Peer()
        #: The HTTP/2 connection (made in ``connection_made``, unless refused).
        self.h2: ServerConnection | None = None
        self._processor: _Processor | None = None
        self._transport: asyncio.Transport | None = None
        self._cork: CorkedTransport | None = None
        #: This thread's owed flushes (the protocol is made on its loop's thread).
        self._held = held_writes()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The transport takes writes (False between ``pause_writing`` and
        #: ``resume_writing``: answers wait, frame by frame).
        self.writable = True
        self._handshaken = False
        #: GOAWAY sent or the connection refused: input is no longer read.
        self._closing = False
        #: Our output ended after a connection error (:meth:`fail`): nothing more is written.
        self._shut = False
        #: Some call is at work (see ``_Processor.working``): the connection is not idle.
        self._streams_open = False
        #: Bytes of answers waiting for the peer (windows, or its reading) that are not yet
        #: handed to the connection, and when some of them last moved (loop time).
        self.unsent = 0
        self._moved_at = 0.0
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
        alpn = negotiated_h2(transport)
        if alpn is False:  # TLS without ALPN h2: not a gRPC client (RFC 9113 §3.2)
            self.fault(
                Fault.TLS_REFUSED,
                "the TLS client did not negotiate HTTP/2 (ALPN h2); connection closed",
            )
            self._closing = True
            transport.abort()
            return
        if alpn:
            self.identity = Peer(certificate_names(transport), self.identity.connection)
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
            self.h2 = h2 = ServerConnection(self.limits, self.opened_at)
            h2.initiate_connection()
            h2.grow_connection_window()
            self._processor = _Processor(self._sink, self, h2)
            self.flush()
        except Exception:
            log.exception("setting up the connection from %s failed; closing it", self.peer)
            self.abort()

    def data_received(self, data: bytes) -> None:
        if self._closing or self.h2 is None or self._processor is None:
            return
        self.read_at = self.now()
        held = self._held
        held.enter()  # what this read provokes is sent as it returns
        try:
            self._received(self.h2, self._processor, data)
        finally:
            held.leave()

    def _received(self, h2: ServerConnection, processor: _Processor, data: bytes) -> None:
        try:
            events = h2.receive_data(data, self.read_at)
        except h2events.ProtocolError as exc:
            kind = (
                Fault.FRAME_TOO_LARGE
                if isinstance(exc, h2events.FrameTooLargeError)
                else Fault.PROTOCOL_ERROR
            )
            self.fault(kind, f"{exc or type(exc).__name__}; connection closed with GOAWAY")
            self.fail()  # the connection has queued its GOAWAY
            return
        except Exception as exc:  # a bug of ours the bytes found: the state is unknown
            self.fault(
                Fault.PROTOCOL_ERROR,
                f"undecodable input ({type(exc).__name__}: {exc}); connection closed with GOAWAY",
            )
            h2.close_connection(ErrorCodes.PROTOCOL_ERROR)
            self.fail()
            return
        try:
            handlers = processor.handlers
            for event in events:
                handle = handlers.get(event.__class__)
                if handle is not None:
                    handle(event)
            if h2.wasted != h2.wasted_judged:
                processor.judge()
            self.flush()
        except Exception:
            log.exception("serving the connection from %s failed; closing it", self.peer)
            self.abort()

    def flush(self) -> None:
        """Hand what the connection queued to the (corked) transport."""
        data = self.h2.data_to_send()  # type: ignore[union-attr]  # (set up before any call)
        if data:
            self._cork.write(data)  # type: ignore[union-attr]

    def is_closing(self) -> bool:
        """The transport is closing or closed, or our output ended (:meth:`fail`): nothing
        written reaches the peer."""
        return self._shut or self._transport is None or self._transport.is_closing()

    def pause_writing(self) -> None:
        # The peer does not read what we write: stop reading what it writes, so that
        # answers it provokes (PING and SETTINGS ACKs, refusals) cannot pile up here.
        self.writable = False
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self.writable = True
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
                self._processor.close()
            except Exception:
                log.exception("closing the connection from %s failed", self.peer)

    # ------------------------------------------------------------------ processor hooks

    def fault(self, fault: Fault, detail: str) -> None:
        self.table.fault(fault, self.peer, detail)

    def now(self) -> float:
        """The loop's clock (the one the timeouts use)."""
        return self._loop.time() if self._loop is not None else 0.0

    def later(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on a later pass of the loop (a long job's next step)."""
        assert self._loop is not None
        self._loop.call_soon(callback)

    @property
    def closing(self) -> bool:
        """GOAWAY sent or the connection refused: input is no longer read."""
        return self._closing

    def call_works(self, sid: int) -> None:
        """Stream ``sid`` has requests owed (:mod:`.streaming`): it counts as working."""
        if self._processor is not None:
            self._processor.call_works(sid)

    def call_rests(self, sid: int) -> None:
        """Stream ``sid`` owes nothing: it does not count as working (idle timeout and
        eviction see through it)."""
        if self._processor is not None:
            self._processor.call_rests(sid)

    def calls_started(self, count: int) -> None:
        """Requests begun inside a stream method's call (:mod:`.streaming`): each counts
        in the abuse budget as a call started, as a unary call would."""
        if self.h2 is not None:
            self.h2.calls_started(count)

    def calls_reset(self, started: Sequence[float]) -> None:
        """Requests inside a stream method's call that the peer's reset withdrew, with the
        loop time each began: each is judged as a unary call reset then would be."""
        if self._processor is not None and self.h2 is not None:
            self._processor._judged(self.h2.calls_reset(started, self.now()))

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

    def evictable_since(self) -> float | None:
        """Since when the connection has had no working call (None: it has one, or it is
        closing): what the table evicts by when it is full."""
        if self._streams_open or self._closing:
            return None
        return self._idle_since

    # ------------------------------------------------------------------ unread answers

    def answer_waits(self, delta: int) -> None:
        """``delta`` more (negative: fewer) answer bytes wait for the peer; any that left
        count as the answers moving (for ``send_timeout``)."""
        if delta < 0 or not self.unsent:
            self._moved_at = self.now()
        self.unsent += delta

    def room_for(self, size: int) -> bool:
        """Whether an answer of ``size`` bytes may wait for the peer (``max_unsent_bytes``;
        the first one always may)."""
        return not self.unsent or self.unsent + size <= self.limits.max_unsent_bytes

    def unread_refusal(self, size: int) -> str:
        """Why an answer of ``size`` bytes is not sent (counted as a fault here)."""
        text = (
            f"the client has not read the {self.unsent} bytes of answers already waiting on "
            f"this connection; an answer of {size} more bytes would pass "
            f"{self.limits.names.max_unsent_bytes} ({self.limits.max_unsent_bytes}): read the "
            "answers, or send fewer calls at once"
        )
        self.fault(Fault.UNREAD_ANSWERS, text)
        return text

    def send_stalled(self, now: float) -> bool:
        return (
            bool(self.unsent)
            and not self._closing
            and now - self._moved_at >= self.limits.send_timeout
        )

    def send_expired(self) -> None:
        """Answers waited ``send_timeout`` with none of them read: close the connection
        (its calls end, their bytes are freed)."""
        self.fault(
            Fault.SEND_TIMEOUT,
            f"{self.unsent} bytes of answers waited {self.limits.send_timeout:g} s for the "
            f"client to read any of them ({self.limits.names.send_timeout}); connection closed",
        )
        self.abort()

    def expire_bodies(self, now: float) -> None:
        if self._processor is not None and not self._closing:
            self._processor.expire_bodies(now)

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
        if self._closing or self.h2 is None or self.is_closing():
            return
        self._closing = True
        self.h2.close_connection(error, debug)
        self.flush()
        assert self._loop is not None
        self._loop.call_later(GOAWAY_LINGER, self.abort)

    def abort(self) -> None:
        """Close now: flush what is queued, cancel the connection's calls, close."""
        self._closing = True
        self.table.closed(self)
        if self._processor is not None and self._cork is not None:
            if not self.is_closing():
                self.flush()
            self._cork.close()  # sends what is corked (a GOAWAY), then closes
            self._processor.close()
        elif self._transport is not None:
            self._transport.close()

    def fail(self) -> None:
        """A connection error, its GOAWAY queued: end every call, send the GOAWAY and our
        FIN, then go on reading (and dropping) the peer's bytes until it closes, or for
        :data:`ERROR_LINGER` at most.

        Closing the socket at once would leave bytes the peer already sent unread, and
        the kernel answers a close with unread input by RST, which throws away whatever
        of ours it has not yet put on the wire: the GOAWAY, and its reason, could be
        lost. Closing in stages (our side first, then the socket once the peer is done)
        is what RFC 9112 §9.6 describes for the same problem in HTTP/1.1. Under TLS,
        which cannot half-close, the GOAWAY goes without a FIN and the socket closes
        when the linger ends (a gRPC client closes on the GOAWAY first). Past
        :data:`MAX_LINGERING` connections lingering at once, it closes now.
        """
        transport, cork, processor = self._transport, self._cork, self._processor
        if transport is None or cork is None or processor is None or self.is_closing():
            self.abort()
            return
        if not self.table.linger():
            self.abort()
            return
        self._closing = True
        self.table.closed(self)
        self.flush()
        cork.end()
        self._shut = True
        processor.close()
        assert self._loop is not None

        def close() -> None:
            self.table.unlinger()
            transport.close()

        self._loop.call_later(ERROR_LINGER, close)

    def _refuse_connection(self) -> None:
        """Past ``max_connections``: GOAWAY saying why, then close (after a linger)."""
        assert self._transport is not None and self._loop is not None
        self._closing = True
        conn = ServerConnection(self.limits)
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
