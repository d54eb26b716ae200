"""How a connection that broke the protocol closes (``GuardedProtocol.fail``), on a fake
transport that records what the protocol does to it.

Invariants: the GOAWAY is written, then (where the transport can half-close) the FIN;
nothing is written after them, not even what ending the connection's calls would write;
the peer's later bytes are dropped unread; the socket closes when the peer closes or
``ERROR_LINGER`` after the error, whichever comes first; the connection leaves the
table at once and gives its linger slot back when the socket closes. Under TLS (a
transport that cannot half-close) the same holds without the FIN. The same close over
real sockets, with a real client that must see the GOAWAY and a clean end of stream:
``tests/transport/test_wire_regressions.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from reactantserver.transport import h2guard
from reactantserver.transport.core.faultlog import FaultLog
from reactantserver.transport.core.limits import Fault, WireCounters, WireLimits
from reactantserver.transport.h2guard import ConnectionTable, GuardedProtocol

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
GOAWAY = 0x7


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + sid.to_bytes(4, "big") + payload


class FakeTransport(asyncio.Transport):
    """The transport calls a server connection makes, recorded in order."""

    def __init__(self, *, half_close: bool) -> None:
        super().__init__()
        self.half_close = half_close
        self.events: list[tuple[str, bytes]] = []
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 4242) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closing, "written after close"
        self.events.append(("write", bytes(data)))

    def can_write_eof(self) -> bool:
        return self.half_close

    def write_eof(self) -> None:
        assert self.half_close
        self.events.append(("fin", b""))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.events.append(("close", b""))

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def frame_types(self) -> list[int]:
        """The type of each frame written, in order."""
        return _types(b"".join(data for kind, data in self.events if kind == "write"))

    def after_goaway(self) -> list[str]:
        """What happened after the write that carried the GOAWAY."""
        for i, (kind, data) in enumerate(self.events):
            if kind == "write" and _has_goaway(data):
                return [k for k, _ in self.events[i + 1 :]]
        raise AssertionError(f"no GOAWAY written: {self.events}")


def _types(data: bytes) -> list[int]:
    kinds, at = [], 0
    while at + 9 <= len(data):
        kinds.append(data[at + 3])
        at += 9 + int.from_bytes(data[at : at + 3], "big")
    return kinds


def _has_goaway(data: bytes) -> bool:
    return GOAWAY in _types(data)


class Sink:
    """A request sink that admits nothing (the test's calls never get that far)."""

    closed = False

    def admit(self, *args: Any) -> Any:
        raise AssertionError("no request is expected")

    def accept(self, *args: Any) -> Any:
        raise AssertionError("no request is expected")

    def cancel(self, sid: int) -> None:
        raise AssertionError("no request is expected")

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("half_close", [True, False], ids=["tcp", "tls"])
def test_a_connection_error_closes_in_stages(
    half_close: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(h2guard, "ERROR_LINGER", 0.05)
    asyncio.run(_stages(half_close))


async def _stages(half_close: bool) -> None:
    counters = WireCounters()
    table = ConnectionTable(WireLimits(), counters, FaultLog(emit=lambda line: None))
    transport = FakeTransport(half_close=half_close)
    sink = Sink()
    protocol = GuardedProtocol(table, sink)
    protocol.connection_made(transport)
    protocol.data_received(PREFACE + frame(0x4, 0, 0))  # the preface and empty SETTINGS
    assert len(table) == 1
    protocol.data_received(frame(0x0, 0x1, 3, b"\0\0\0\0\0"))  # DATA on an idle stream
    assert counters.faults[Fault.PROTOCOL_ERROR] == 1
    assert len(table) == 0  # out of the table at once
    assert sink.closed  # its calls are ended
    protocol.data_received(frame(0x6, 0, 0, bytes(8)))  # a PING: dropped, not answered
    await asyncio.sleep(0)
    assert transport.after_goaway() == (["fin"] if half_close else [])
    assert transport.frame_types()[-1] == GOAWAY
    assert not transport.closing
    # The peer closing first would end it now: asyncio closes the transport itself when
    # eof_received returns a false value.
    assert not protocol.eof_received()
    await asyncio.sleep(0.2)  # real-clock: ERROR_LINGER (0.05 s) is an asyncio timer
    assert transport.after_goaway() == (["fin", "close"] if half_close else ["close"])
    assert table.linger()  # the slot came back: 64 are free again
    assert [table.linger() for _ in range(63)] == [True] * 63
    protocol.connection_lost(None)
