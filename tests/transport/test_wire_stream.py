"""The task path's stream (``transport/server.py``'s ``ServerStream``): every RPC but the
direct ones.

A real :class:`GuardedServer` on loopback, on an asyncio loop in a thread of this process,
with handlers written for the tests, driven by the hand-written HTTP/2 client of
``tests/h2_client.py``. What must hold:

* a streaming request's messages are read one by one however they were cut into frames,
  and the stream's window is given back as they are read (a client sending more than one
  window gets through);
* an answer larger than the client's windows waits for WINDOW_UPDATE and arrives whole;
* a call past its deadline ends DEADLINE_EXCEEDED (its handler cancelled), a call the
  client resets ends with nothing written (its handler cancelled), a unary handler that
  returns without answering ends INTERNAL -- and every stream slot is given back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import h2.settings
import pytest
from grpclib.const import Cardinality, Handler
from h2_client import H2Client, grpc_message
from threaded_server import ThreadedServer

from reactantserver.status import StatusCode
from reactantserver.transport.core.limits import WireLimits


class StreamServer(ThreadedServer):
    """A GuardedServer with the test's task-path handlers, on a loop in a thread."""

    def __init__(self) -> None:
        # HTTP/2's default stream window, so a test can send more than one window.
        super().__init__(WireLimits(stream_window=65535))
        self.cancelled: list[str] = []

    async def echo(self, stream: Any) -> None:
        async for message in stream:
            await stream.send_message(message)

    async def big(self, stream: Any) -> None:
        size = int(await stream.recv_message())
        await stream.send_message(_pattern(size))

    async def sleep(self, stream: Any) -> None:
        try:  # a reset may come while the message is still being read (a loaded machine)
            await stream.recv_message()
            await asyncio.sleep(30)  # real-clock: a handler that never answers (it is reset)
        except asyncio.CancelledError:
            self.cancelled.append("sleep")
            raise

    async def mute(self, stream: Any) -> None:
        await stream.recv_message()

    def mapping(self) -> dict[str, Handler]:
        bidi, unary = Cardinality.STREAM_STREAM, Cardinality.UNARY_UNARY
        return {
            "/t.S/Echo": Handler(self.echo, bidi, None, None),
            "/t.S/Big": Handler(self.big, unary, None, None),
            "/t.S/Sleep": Handler(self.sleep, unary, None, None),
            "/t.S/Mute": Handler(self.mute, unary, None, None),
        }

    def idle(self) -> bool:
        assert self.server is not None
        return self.until(
            lambda: self.server is not None and self.server.counters.streams_open == 0
        )


@pytest.fixture
def server() -> Iterator[StreamServer]:
    with StreamServer() as s:
        yield s


def _pattern(size: int) -> bytes:
    return bytes(range(251)) * (size // 251) + bytes(range(size % 251))


def _messages(data: bytes) -> list[bytes]:
    out = []
    while data:
        assert data[0] == 0
        size = int.from_bytes(data[1:5], "big")
        out.append(data[5 : 5 + size])
        data = data[5 + size :]
    return out


def _send_within(client: H2Client, sid: int, data: bytes, seconds: float = 10.0) -> bool:
    """Send ``data`` and END_STREAM as the server's windows allow; False if they stay
    shut for ``seconds`` (``H2Client.send`` would wait for ever)."""
    deadline = time.monotonic() + seconds
    while data:
        room = min(client.conn.local_flow_control_window(sid), client.conn.max_outbound_frame_size)
        if room <= 0:
            if time.monotonic() > deadline or not client.pump(0.1):
                return False
            continue
        client.conn.send_data(sid, data[:room], end_stream=len(data) <= room)
        client.flush()
        data = data[room:]
    return True


def test_a_stream_of_messages_past_the_window_is_read_one_by_one(server: StreamServer) -> None:
    """Four 50 kB messages in one stream (three times the server's 64 KiB stream window),
    cut into frames across message boundaries: each is read whole and echoed, in order,
    because the server gives the window back as it reads."""
    sent = [_pattern(50_000 + i) for i in range(4)]
    with H2Client(server.port) as client:
        sid = client.start("/t.S/Echo")
        assert _send_within(client, sid, b"".join(grpc_message(m) for m in sent))
        result = client.wait(sid)
    assert result.grpc_status == 0, result.grpc_message
    assert _messages(result.data) == sent
    assert server.idle()


def test_an_answer_larger_than_the_window_waits_for_window_updates(server: StreamServer) -> None:
    """A 1 MB answer over 64 KiB windows arrives whole, in frames the client allows."""
    with H2Client(server.port) as client:
        result = client.call("/t.S/Big", b"1000000")
    assert result.grpc_status == 0, result.grpc_message
    assert _messages(result.data) == [_pattern(1_000_000)]
    assert max(result.frames) <= 16384
    assert server.idle()


def test_an_answer_past_the_transports_buffer_waits_for_the_client_to_read(
    server: StreamServer,
) -> None:
    """24 MiB answered to a client that allows it all (16 MiB frames, full windows) but
    does not read for a second: the server stops at the transport's high-water mark,
    goes on as the client reads, and nothing is lost."""
    codes = h2.settings.SettingCodes
    huge = 24 * 1024 * 1024
    with H2Client(server.port) as client:
        client.conn.update_settings(
            {codes.MAX_FRAME_SIZE: (1 << 24) - 1, codes.INITIAL_WINDOW_SIZE: (1 << 31) - 1}
        )
        client.conn.increment_flow_control_window((1 << 31) - 1 - 65535)
        client.flush()
        sid = client.start("/t.S/Big")
        client.send(sid, grpc_message(str(huge).encode()), end_stream=True)
        time.sleep(1.0)  # real-clock: not reading: the server's socket and transport buffers fill
        result = client.wait(sid, timeout=60)
    assert result.grpc_status == 0, result.grpc_message
    assert _messages(result.data) == [_pattern(huge)]
    assert server.idle()


def test_a_call_past_its_deadline_ends_deadline_exceeded(server: StreamServer) -> None:
    with H2Client(server.port) as client:
        result = client.call("/t.S/Sleep", b"x", timeout="200m")
    assert result.grpc_status == StatusCode.DEADLINE_EXCEEDED, result.grpc_message
    assert "deadline exceeded" in result.grpc_message
    assert server.until(lambda: server.cancelled == ["sleep"])
    assert server.idle()


def test_a_call_the_client_resets_is_cancelled_and_answered_nothing(server: StreamServer) -> None:
    with H2Client(server.port) as client:
        sid = client.start("/t.S/Sleep")
        client.send(sid, grpc_message(b"x"), end_stream=True)
        assert server.until(lambda: server.server is not None and server.server.tasks)
        client.conn.reset_stream(sid)
        client.flush()
        assert server.until(lambda: server.cancelled == ["sleep"])
        assert server.idle()
        client.pump(0.2)
        assert client.results[sid].headers == {} and client.results[sid].data == b""


def test_a_unary_handler_that_returns_without_answering_ends_internal(
    server: StreamServer,
) -> None:
    with H2Client(server.port) as client:
        result = client.call("/t.S/Mute", b"x")
    assert result.grpc_status == StatusCode.INTERNAL
    assert server.idle()
