"""The connection table's rules (admission, eviction, timeouts) and the asyncio error
handler, without sockets: fake connections record what the table does to them.

The same rules are exercised over real sockets in ``tests/transport/test_wire_regressions.py``;
here each one is pinned down exactly, on a clock the test sets.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import pytest

from reactantserver.transport.core.faultlog import FaultLog
from reactantserver.transport.core.limits import Fault, WireCounters, WireLimits
from reactantserver.transport.h2guard import ConnectionTable


@attrs.define(eq=False)
class FakeConnection:
    """What the table calls on a connection, recorded."""

    table: ConnectionTable
    peer: str
    opened_at: float
    handshaken: bool = False
    idle_since: float | None = None  # None: a call is open
    events: list[str] = attrs.field(factory=list)

    def abort(self) -> None:
        self.events.append("abort")
        self.table.closed(self)  # type: ignore[arg-type]

    def goaway(self) -> None:
        self.events.append("goaway")

    def handshake_expired(self) -> None:
        self.events.append("handshake timeout")
        self.abort()

    def idle_expired(self, now: float) -> bool:
        limit = self.table.limits.idle_timeout
        return self.handshaken and self.idle_since is not None and now - self.idle_since >= limit

    def evictable_since(self) -> float | None:
        return self.idle_since

    def send_stalled(self, now: float) -> bool:
        return False

    def expire_bodies(self, now: float) -> None:
        pass


def table(**limits: Any) -> tuple[ConnectionTable, WireCounters, list[str]]:
    counters, lines = WireCounters(), []
    t = ConnectionTable(WireLimits(**limits), counters, FaultLog(emit=lines.append))
    return t, counters, lines


def connect(t: ConnectionTable, name: str, at: float) -> tuple[FakeConnection, bool]:
    conn = FakeConnection(t, name, at)
    return conn, t.admit(conn)  # type: ignore[arg-type]


def test_past_the_limit_the_oldest_handshaking_connection_makes_room() -> None:
    t, counters, _ = table(max_connections=2)
    a, _ = connect(t, "a", 0)
    b, _ = connect(t, "b", 1)
    t.handshaken(a)  # type: ignore[arg-type]
    c, admitted = connect(t, "c", 2)
    assert admitted and b.events == ["abort"] and a.events == []
    assert len(t) == 2 and counters.connections_evicted == 1
    t.handshaken(c)  # type: ignore[arg-type]
    d, admitted = connect(t, "d", 3)  # nobody left in a handshake: refused
    assert not admitted and d.events == []
    assert counters.connections_refused == 1 and counters.connections_open == 2
    assert counters.faults[Fault.TOO_MANY_CONNECTIONS] == 2


def test_past_the_limit_the_connection_idle_the_longest_makes_room() -> None:
    """Issue 41: connections that only hold calls open (or none) locked every new client
    out at max_connections. Now a new connection closes the one without a working call
    the longest; it is refused only when every connection has a call at work."""
    t, counters, _ = table(max_connections=3)
    conns = [connect(t, name, 0)[0] for name in ("a", "b", "c")]
    for conn, idle_since in zip(conns, (5.0, 2.0, None), strict=True):
        t.handshaken(conn)  # type: ignore[arg-type]
        conn.idle_since = idle_since
    d, admitted = connect(t, "d", 10)
    assert admitted and conns[1].events == ["abort"] and conns[0].events == []
    t.handshaken(d)  # type: ignore[arg-type]
    _, admitted = connect(t, "e", 11)  # d has a call at work (the fake's default): a goes
    assert admitted and conns[0].events == ["abort"]
    assert counters.connections_evicted == 2 and counters.connections_open == 3


def test_the_sweep_closes_expired_handshakes_and_idle_connections() -> None:
    t, counters, _ = table(handshake_timeout=10, idle_timeout=100)
    old, _ = connect(t, "old", 0)
    young, _ = connect(t, "young", 5)
    busy, _ = connect(t, "busy", 1)
    idle, _ = connect(t, "idle", 1)
    for conn in (busy, idle):
        conn.handshaken = True
        t.handshaken(conn)  # type: ignore[arg-type]
    idle.idle_since = 2
    t.sweep(now=9.9)
    assert old.events == young.events == []
    t.sweep(now=10.0)
    assert old.events == ["handshake timeout", "abort"] and young.events == []
    t.sweep(now=101.9)
    assert idle.events == [] and young.events == ["handshake timeout", "abort"]
    t.sweep(now=102.0)
    assert idle.events == ["goaway"] and busy.events == []
    assert counters.connections_idle_closed == 1


def test_refused_connections_linger_only_up_to_a_bound() -> None:
    t, _, _ = table()
    slots = [t.linger() for _ in range(70)]
    assert slots.count(True) == 64 and slots[-1] is False
    t.unlinger()
    assert t.linger()


def test_the_asyncio_error_handler_logs_instead_of_raising(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from grpclib.encoding.proto import ProtoCodec

    from reactantserver.transport.h2guard import GuardedProtocol
    from reactantserver.transport.server import GuardedServer
    from reactantserver.worker.grpc import _loop_errors

    server = GuardedServer({}, codec=ProtoCodec(), limits=WireLimits())
    handle = _loop_errors(server)
    protocol = GuardedProtocol(server.table, None)  # type: ignore[arg-type]
    protocol.peer = "10.1.2.3:4"
    with caplog.at_level(logging.INFO):
        handle(
            None,
            {
                "message": "Fatal read error on socket transport",
                "exception": TimeoutError(110, "Connection timed out"),
                "protocol": protocol,
            },
        )
        handle(None, {"message": "Exception in callback", "exception": ValueError("our bug")})
    assert server.counters.faults[Fault.TRANSPORT_ERROR] == 1
    transport_line, bug = caplog.records
    assert transport_line.exc_info is None and "10.1.2.3:4" in transport_line.getMessage()
    assert bug.levelno == logging.ERROR and bug.exc_info is not None
