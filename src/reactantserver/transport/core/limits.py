"""What the wire layer allows a peer, and what it counts: limits, fault kinds, statistics.

Plain records, no I/O and no asyncio or grpclib, so the worker, its metrics collector and
a future gateway import them freely.

:class:`WireLimits` is everything a hardened gRPC server bounds per peer, frozen at
startup: connections, streams per connection, handshake and idle timeouts, message and
frame sizes, flow-control windows. The operator sets the first five in ``endpoints:``
(:meth:`WireLimits.from_endpoints`); frame size and windows are fixed here, with the
reasons beside them.

:class:`Fault` names each kind of client mistake the wire layer detects. It is the label
of ``worker_grpc_client_errors_total{kind}`` and the key of the rate-limited log
(:mod:`.faultlog`), so an operator sees *what* hostile or broken clients do, not only
that something failed.

:class:`WireCounters` holds the live counts (plain integers, updated on the event loop
only) and :meth:`WireCounters.statistics` snapshots them as a frozen
:class:`WireStatistics` for the collector.

Invariants: every bound is finite; ``connections_open`` never exceeds
``max_connections``; each counter only grows except the two ``*_open`` gauges.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from reactantserver.config.schema import EndpointsConfig, GatewayGrpcConfig
from reactantserver.h2.limits import DEFAULT as H2_DEFAULT

#: HTTP/2's own bounds (RFC 9113 §6.5.2): frame size in [2^14, 2^24 - 1], windows < 2^31.
_MIN_FRAME, _MAX_FRAME, _MAX_WINDOW = 1 << 14, (1 << 24) - 1, (1 << 31) - 1


def _between(low: int, high: int) -> Callable[[object, Any, int], None]:
    def check(_: object, attribute: Any, value: int) -> None:
        if not low <= value <= high:
            raise ValueError(f"{attribute.name} must be in [{low}, {high}], got {value}")

    return check


def _positive(_: object, attribute: Any, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


@attrs.frozen(kw_only=True)
class SettingNames:
    """The configuration keys that set a :class:`WireLimits`, for the messages that refuse
    a peer: each names the setting of the process that says it (a worker's ``endpoints:``,
    a gateway's ``grpc:``), so that an operator changes the right file. The idle timeout
    refuses nothing (an idle connection gets GOAWAY NO_ERROR) and has no name here."""

    max_connections: str = "endpoints.max_connections"
    max_concurrent_streams: str = "endpoints.max_concurrent_streams"
    handshake_timeout: str = "endpoints.handshake_timeout_seconds"
    max_message_bytes: str = "endpoints.max_message_bytes"
    body_timeout: str = "endpoints.body_timeout_seconds"
    send_timeout: str = "endpoints.send_timeout_seconds"
    max_unsent_bytes: str = "endpoints.max_unsent_bytes"


#: A gateway's: its ``grpc:`` section sets the same bounds for its own clients.
GATEWAY_SETTING_NAMES = SettingNames(
    max_connections="grpc.max_connections",
    max_concurrent_streams="grpc.max_concurrent_streams",
    handshake_timeout="grpc.handshake_timeout_seconds",
    max_message_bytes="grpc.max_recv_msg_bytes",
    body_timeout="grpc.body_timeout_seconds",
    send_timeout="grpc.send_timeout_seconds",
    max_unsent_bytes="grpc.max_unsent_bytes",
)


@attrs.frozen(kw_only=True)
class WireLimits:
    """Per-peer bounds of one gRPC server (see ``docs/grpc.md``, "What the worker checks")."""

    #: Open connections at most (``endpoints.max_connections``).
    max_connections: int = attrs.field(default=256, validator=_between(1, 1 << 20))
    #: SETTINGS_MAX_CONCURRENT_STREAMS, advertised and enforced per stream.
    max_concurrent_streams: int = attrs.field(
        default=H2_DEFAULT.max_concurrent_streams, validator=_between(1, _MAX_WINDOW)
    )
    #: Seconds a new connection has to send the preface and its first SETTINGS.
    handshake_timeout: float = attrs.field(default=10.0, validator=_positive)
    #: Seconds a connection may stay without a working call (one whose request message
    #: is complete, or a streaming one) before GOAWAY: calls still waiting for their
    #: request message do not keep it open.
    idle_timeout: float = attrs.field(default=300.0, validator=_positive)
    #: Seconds a unary call has from its HEADERS to the end of its request message.
    body_timeout: float = attrs.field(default=60.0, validator=_positive)
    #: Seconds answers may wait on a peer that reads none of them before the connection
    #: is closed.
    send_timeout: float = attrs.field(default=60.0, validator=_positive)
    #: Bytes of answers one connection may have waiting for its peer to read them; an
    #: answer that would wait past it fails with RESOURCE_EXHAUSTED (one answer alone
    #: always may wait, whatever its size).
    max_unsent_bytes: int = attrs.field(default=64 << 20, validator=_between(1, 1 << 40))
    #: Largest gRPC message, checked at the 5-byte length prefix.
    max_message_bytes: int = attrs.field(default=512 << 20, validator=_between(1, 1 << 40))
    #: SETTINGS_MAX_FRAME_SIZE: a large tensor then arrives in a few frames instead of
    #: thousands of 16 KiB ones, each of which costs h2 Python work. A DATA frame past it
    #: is a connection error (FRAME_SIZE_ERROR), detected from its 9-byte header.
    max_frame_size: int = attrs.field(
        default=H2_DEFAULT.max_frame_size, validator=_between(_MIN_FRAME, _MAX_FRAME)
    )
    #: Connection flow-control window: what all of a connection's streams may have sent
    #: and the server not yet consumed (grpclib's default is 4 MiB).
    connection_window: int = attrs.field(
        default=H2_DEFAULT.connection_window, validator=_between(65535, _MAX_WINDOW)
    )
    #: Initial stream window: what one stream may have buffered before its handler reads
    #: it. 16 MiB lets a 16 MiB tensor arrive without waiting for window updates.
    stream_window: int = attrs.field(
        default=H2_DEFAULT.stream_window, validator=_between(65535, _MAX_WINDOW)
    )
    #: Requests owed at most on one stream of a stream method (ModelStreamInfer): begun
    #: and not yet written out. At the bound the stream pauses: no more of what arrives
    #: is acknowledged, so the client's window closes (:mod:`..streaming`).
    stream_requests: int = attrs.field(default=32, validator=_between(1, 1 << 20))
    #: Bytes of request messages owed at most on one such stream (a message larger than
    #: it still runs, alone). 64 MiB: four stream windows.
    stream_bytes: int = attrs.field(default=64 << 20, validator=_between(1, 1 << 40))
    #: SETTINGS_MAX_HEADER_LIST_SIZE (h2's default): decoded header bytes per request.
    max_header_list_size: int = attrs.field(
        default=H2_DEFAULT.max_header_list_size, validator=_between(1024, 1 << 24)
    )
    #: The keys that set the configurable bounds, as refusals name them.
    names: SettingNames = SettingNames()

    @classmethod
    def from_endpoints(cls, endpoints: EndpointsConfig) -> WireLimits:
        """A worker's: its ``endpoints:`` section."""
        return cls(
            max_connections=endpoints.max_connections,
            max_concurrent_streams=endpoints.max_concurrent_streams,
            handshake_timeout=endpoints.handshake_timeout_seconds,
            idle_timeout=endpoints.idle_timeout_seconds,
            max_message_bytes=endpoints.max_message_bytes,
            body_timeout=endpoints.body_timeout_seconds,
            send_timeout=endpoints.send_timeout_seconds,
            max_unsent_bytes=endpoints.max_unsent_bytes,
        )

    @classmethod
    def from_gateway_grpc(cls, grpc: GatewayGrpcConfig) -> WireLimits:
        """A gateway's, toward its clients: its ``grpc:`` section (a request message is
        bounded by ``grpc.max_recv_msg_bytes``)."""
        return cls(
            max_connections=grpc.max_connections,
            max_concurrent_streams=grpc.max_concurrent_streams,
            handshake_timeout=grpc.handshake_timeout_seconds,
            idle_timeout=grpc.idle_timeout_seconds,
            max_message_bytes=grpc.max_recv_msg_bytes,
            body_timeout=grpc.body_timeout_seconds,
            send_timeout=grpc.send_timeout_seconds,
            max_unsent_bytes=grpc.max_unsent_bytes,
            names=GATEWAY_SETTING_NAMES,
        )

    def worst_case_buffered_bytes(self) -> int:
        """What peers could make the server buffer at most, summed over every stream.

        Per stream, a message is held until it is complete (at most
        ``max_message_bytes``) plus what was sent ahead of the reader (at most one stream
        window); per connection, at most ``max_concurrent_streams`` streams. A stream
        method's call (ModelStreamInfer) holds, besides, the requests it owes: up to
        ``stream_requests`` of them and about ``stream_bytes`` of their messages, which
        this sum of request bytes does not count.
        """
        per_stream = self.max_message_bytes + self.stream_window
        return self.max_connections * self.max_concurrent_streams * per_stream


class Fault(enum.Enum):
    """A kind of client mistake the wire layer detects; the value is the metric label."""

    #: An HTTP/2 protocol violation (bad preface, frame on a closed stream, flow control
    #: exceeded, undecodable headers...): GOAWAY with the error code, connection closed.
    PROTOCOL_ERROR = "protocol_error"
    #: A frame larger than the advertised SETTINGS_MAX_FRAME_SIZE: GOAWAY FRAME_SIZE_ERROR.
    FRAME_TOO_LARGE = "frame_too_large"
    #: No preface and SETTINGS within ``handshake_timeout``: connection closed.
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    #: A connection past ``max_connections``: refused with GOAWAY, or evicted while in
    #: its handshake.
    TOO_MANY_CONNECTIONS = "too_many_connections"
    #: A stream past ``max_concurrent_streams``: RST_STREAM REFUSED_STREAM.
    TOO_MANY_STREAMS = "too_many_streams"
    #: Most of a connection's calls reset by the peer right after they started ("rapid
    #: reset", CVE-2023-44487) or reset by the server on stream errors the peer provoked
    #: ("MadeYouReset", CVE-2025-8671): GOAWAY ENHANCE_YOUR_CALM, connection closed.
    RAPID_RESET = "rapid_reset"
    #: More frames that ask for nothing (PING, SETTINGS, empty DATA, frames on reset
    #: streams, streams past the limit) than the connection's budget: GOAWAY
    #: ENHANCE_YOUR_CALM, connection closed (:mod:`reactantserver.h2.abuse`).
    FRAME_FLOOD = "frame_flood"
    #: Not a gRPC request: ``:method``, ``:path``, ``content-type`` or ``te`` wrong.
    BAD_REQUEST = "bad_request"
    #: A ``:path`` no service here implements: UNIMPLEMENTED.
    UNKNOWN_METHOD = "unknown_method"
    #: A ``grpc-timeout`` header that is not 1-8 digits and a unit: INVALID_ARGUMENT.
    BAD_TIMEOUT = "bad_timeout"
    #: The call's deadline had passed when it arrived: DEADLINE_EXCEEDED.
    EXPIRED_ON_ARRIVAL = "expired_on_arrival"
    #: A ``grpc-encoding`` other than identity: UNIMPLEMENTED.
    UNSUPPORTED_ENCODING = "unsupported_encoding"
    #: A message framing error (compressed flag without an encoding, unknown flags,
    #: cut short by END_STREAM, missing, or a second message on a unary call).
    MALFORMED_MESSAGE = "malformed_message"
    #: A length prefix over ``max_message_bytes``: RESOURCE_EXHAUSTED.
    MESSAGE_TOO_LARGE = "message_too_large"
    #: The socket failed under us in a way that is not a plain disconnect.
    TRANSPORT_ERROR = "transport_error"
    #: A call of a restricted API group without its key or allowed certificate
    #: (UNAUTHENTICATED / PERMISSION_DENIED), or a ``reactant-owner`` not from the gateway.
    UNAUTHORIZED = "unauthorized"
    #: A TLS client that did not negotiate HTTP/2 (ALPN ``h2``): connection closed.
    TLS_REFUSED = "tls_refused"
    #: A unary call's request message did not arrive within ``body_timeout`` of its
    #: HEADERS: DEADLINE_EXCEEDED, the stream reset.
    BODY_TIMEOUT = "body_timeout"
    #: Answers waited ``send_timeout`` for a peer that read none of them: connection closed.
    SEND_TIMEOUT = "send_timeout"
    #: An answer would have left more than ``max_unsent_bytes`` waiting on its connection
    #: for the peer to read: RESOURCE_EXHAUSTED.
    UNREAD_ANSWERS = "unread_answers"


@attrs.frozen
class WireStatistics:
    """A snapshot of :class:`WireCounters` (what the metrics collector reads)."""

    connections_open: int = 0
    connections_accepted: int = 0
    #: New connections refused at ``max_connections``.
    connections_refused: int = 0
    #: Connections closed in their handshake to make room for a new one.
    connections_evicted: int = 0
    #: Connections closed by the idle timeout.
    connections_idle_closed: int = 0
    #: Calls (streams with a running handler) now.
    streams_open: int = 0
    #: Client mistakes by :class:`Fault` value, every kind present (0 when none was seen),
    #: so a reader lists the kinds without importing this module.
    faults: Mapping[str, int] = attrs.field(factory=dict)


class WireCounters:
    """The live counts behind :class:`WireStatistics`; event-loop thread only."""

    __slots__ = (
        "connections_accepted",
        "connections_evicted",
        "connections_idle_closed",
        "connections_open",
        "connections_refused",
        "faults",
        "streams_open",
        "streams_peak",
    )

    def __init__(self) -> None:
        self.connections_open = 0
        self.connections_accepted = 0
        self.connections_refused = 0
        self.connections_evicted = 0
        self.connections_idle_closed = 0
        self.streams_open = 0
        #: Most streams open at once since the server last looked (it resets this).
        self.streams_peak = 0
        self.faults: Counter[Fault] = Counter()

    def statistics(self) -> WireStatistics:
        return WireStatistics(
            connections_open=self.connections_open,
            connections_accepted=self.connections_accepted,
            connections_refused=self.connections_refused,
            connections_evicted=self.connections_evicted,
            connections_idle_closed=self.connections_idle_closed,
            streams_open=self.streams_open,
            faults={fault.value: self.faults.get(fault, 0) for fault in Fault},
        )
