"""Streams of unary requests (``transport/streaming.py``), the transport of ModelStreamInfer.

A real :class:`GuardedServer` on loopback, on an asyncio loop in a thread of this process,
serving stream methods whose handlers are written for the tests, driven by the
hand-written HTTP/2 client of ``tests/h2_client.py`` over a real socket. What must hold:

* every request whose message completed is answered once, in the order the requests
  arrived, whatever order the handler answers them in, errors in their place; the call
  ends OK once the client ended its side and everything is written;
* messages are cut out of the DATA however it was framed, one larger than the stream
  window included;
* a client that sends without reading pauses the stream at ``stream_requests`` requests
  owed: no more requests begin and the client's window stays shut, until it reads;
* a deadline, a reset, an oversized message end the call and withdraw every request
  owed, exactly once; a drain ends it after what is owed;
* every stream slot is given back.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import h2.errors
import h2.settings
import pytest
from h2_client import H2Client, grpc_message
from threaded_server import ThreadedServer

from reactantserver.status import StatusCode
from reactantserver.transport.core.limits import WireLimits
from reactantserver.transport.streaming import StreamCall, StreamedRequest, StreamHandler

ECHO, HELD, BUG = "/t.S/Echo", "/t.S/Held", "/t.S/Bug"
#: The test server's bounds: the default HTTP/2 window, so a test can fill it.
LIMITS = WireLimits(stream_window=65535, stream_requests=8, max_message_bytes=1 << 20)


def _error(message: bytes | memoryview, code: int, text: str) -> list[bytes | memoryview]:
    return [b"E", bytes([code]), text.encode()]


def _head(size: int) -> bytes:
    return b""  # the answer's pieces are the stream's response message


class StreamServer(ThreadedServer):
    """A GuardedServer with the tests' stream methods, on a loop in a thread."""

    def __init__(self, limits: WireLimits = LIMITS) -> None:
        super().__init__(limits)
        self.streams: list[StreamCall] = []
        #: HELD's requests as they began (the test answers them), and the requests of
        #: any method whose work was withdrawn, by message.
        self.held: list[tuple[StreamedRequest, bytes]] = []
        self.withdrawn: list[bytes] = []
        self.begun = 0

    def _opened(self, stream: StreamCall) -> None:
        self.streams.append(stream)

    def _echo(self, request: StreamedRequest, message: bytes | memoryview) -> None:
        self.begun += 1
        if bytes(message).startswith(b"fail"):
            request.fail(StatusCode.INVALID_ARGUMENT, f"refused {bytes(message)!r}")
        else:
            request.answer([b"A", message])

    def _held(self, request: StreamedRequest, message: bytes | memoryview) -> None:
        self.begun += 1
        data = bytes(message)
        request.on_cancel = lambda: self.withdrawn.append(data)
        self.held.append((request, data))

    def _bug(self, request: StreamedRequest, message: bytes | memoryview) -> None:
        raise RuntimeError("a bug of ours")

    def mapping(self) -> dict[str, StreamHandler]:
        def handler(begin: Callable[[StreamedRequest, bytes | memoryview], None]) -> StreamHandler:
            return StreamHandler(begin, _head, _error, opened=self._opened)

        return {ECHO: handler(self._echo), HELD: handler(self._held), BUG: handler(self._bug)}

    def on_loop(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's loop and return what it returned."""
        assert self.loop is not None
        done = threading.Event()
        box: list[Any] = []

        def run() -> None:
            box.append(fn())
            done.set()

        self.loop.call_soon_threadsafe(run)
        assert done.wait(10)
        return box[0]

    def idle(self) -> bool:
        return self.until(
            lambda: self.server is not None and self.server.counters.streams_open == 0
        )


@pytest.fixture
def server() -> Iterator[StreamServer]:
    with StreamServer() as s:
        yield s


def _messages(data: bytes) -> list[bytes]:
    out = []
    while data:
        assert data[0] == 0
        size = int.from_bytes(data[1:5], "big")
        out.append(data[5 : 5 + size])
        data = data[5 + size :]
    return out


def _wait_messages(client: H2Client, sid: int, count: int) -> list[bytes]:
    """Read until ``count`` whole messages arrived on ``sid`` (or the stream finished)."""
    result = client.results[sid]
    for _ in range(500):
        data = result.data
        done = len(_messages_prefix(data)) >= count
        if done or result.finished or not client.pump(0.02):
            break
    return _messages_prefix(result.data)


def _messages_prefix(data: bytes) -> list[bytes]:
    """The whole messages at the front of ``data`` (the last may still be arriving)."""
    out = []
    while len(data) >= 5:
        size = int.from_bytes(data[1:5], "big")
        if len(data) < 5 + size:
            break
        out.append(data[5 : 5 + size])
        data = data[5 + size :]
    return out


def test_answers_leave_in_request_order_whatever_order_they_are_answered_in(
    server: StreamServer,
) -> None:
    """Five requests answered last to first, the third with an error: the client reads
    them first to last, the error in its place, and the call ends OK after END_STREAM."""
    with H2Client(server.port) as client:
        sid = client.start(HELD)
        client.send(sid, b"".join(grpc_message(b"r%d" % i) for i in range(5)))
        assert server.until(lambda: len(server.held) == 5)

        def answer_backwards() -> None:
            for request, data in reversed(server.held):
                if data == b"r2":
                    request.fail(StatusCode.NOT_FOUND, "no r2 here")
                else:
                    request.answer([b"A", data])

        server.on_loop(answer_backwards)
        client.end(sid)
        result = client.wait(sid)
    assert result.grpc_status == 0, result.grpc_message
    assert _messages(result.data) == [b"Ar0", b"Ar1", b"E\x05no r2 here", b"Ar3", b"Ar4"]
    assert server.withdrawn == []
    assert server.idle()


def test_messages_are_cut_out_of_the_data_however_it_is_framed(server: StreamServer) -> None:
    """Small messages several to a frame and split across frames, and one of 200 kB --
    three times the stream window, so it arrives only because its bytes are acknowledged
    as they come: each is answered whole, in order."""
    sent = [b"m%d" % i * (i + 1) for i in range(40)] + [b"", bytes(200_000), b""]
    wire = b"".join(grpc_message(m) for m in sent)
    tail = [b"", b"one byte a frame", b""]  # empty messages too
    with H2Client(server.port) as client:
        sid = client.start(ECHO)
        for at in range(0, len(wire), 7777):  # frames that cut prefixes and bodies
            assert client.send(sid, wire[at : at + 7777])
        for byte in b"".join(grpc_message(m) for m in tail):
            assert client.send(sid, bytes([byte]))
        client.end(sid)
        result = client.wait(sid, timeout=30)
    assert result.grpc_status == 0, result.grpc_message
    assert _messages(result.data) == [b"A" + m for m in sent + tail]
    assert server.idle()


def test_a_client_that_sends_without_reading_is_paused_until_it_reads(
    server: StreamServer,
) -> None:
    """A client whose window for our answers is shut (it reads nothing) sends 2,000
    requests, three stream windows' worth. The server begins ``stream_requests`` (8) of
    them, then stops acknowledging: the client's window closes after one stream window
    and stays shut, the rest kept unread. When the client reads, every request is
    answered, in order, and the call ends OK."""
    codes = h2.settings.SettingCodes
    messages = [b"%05d" % i + bytes(95) for i in range(2000)]
    wire = b"".join(grpc_message(m) for m in messages)
    with H2Client(server.port) as client:
        client.conn.update_settings({codes.INITIAL_WINDOW_SIZE: 0})  # no DATA for us
        client.flush()
        assert client.round_trip()  # the server has our settings
        sid = client.start(ECHO)
        sent = 0
        while sent < len(wire):
            room = min(client.conn.local_flow_control_window(sid), 16384, len(wire) - sent)
            if room <= 0:
                # Everything the server sent before this PING's ACK has been read: a
                # WINDOW_UPDATE it sent would be counted now.
                assert client.round_trip()
                if client.conn.local_flow_control_window(sid) <= 0:
                    break
                continue
            client.conn.send_data(sid, wire[sent : sent + room])
            client.flush()
            sent += room
        (stream,) = server.streams
        assert sent < len(wire)  # paused: the client could not send everything
        assert sent <= 65535 + server.on_loop(lambda: server.begun * 100)
        assert server.on_loop(lambda: (server.begun, stream.owed, stream.paused)) == (8, 8, True)
        assert server.on_loop(lambda: stream.kept) == sent - 8 * 105
        assert client.results[sid].data == b""
        # The client reads: its window opens, answers flow, the stream resumes.
        client.conn.update_settings({codes.INITIAL_WINDOW_SIZE: 1 << 20})
        client.flush()
        assert client.send(sid, wire[sent:], end_stream=True)
        result = client.wait(sid, timeout=60)
    assert result.grpc_status == 0, result.grpc_message
    assert _messages(result.data) == [b"A" + m for m in messages]
    assert server.begun == 2000
    assert server.idle()


def test_tiny_frames_kept_while_paused_are_gathered_into_one_buffer(
    server: StreamServer,
) -> None:
    """A paused stream fed 3,000 one-byte DATA frames keeps them as one buffer, not a
    view per frame."""
    codes = h2.settings.SettingCodes
    with H2Client(server.port) as client:
        client.conn.update_settings({codes.INITIAL_WINDOW_SIZE: 0})
        client.flush()
        assert client.round_trip()
        sid = client.start(ECHO)
        client.send(sid, b"".join(grpc_message(b"x") for _ in range(8)))  # 8 owed: paused
        for _ in range(3000):
            client.conn.send_data(sid, b"\0")
        client.flush()
        (stream,) = server.streams
        assert server.until(lambda: stream.kept == 3000)
        assert server.on_loop(lambda: len(stream._chunks)) == 0  # all in the one buffer


def test_a_deadline_ends_the_call_and_withdraws_what_is_owed(server: StreamServer) -> None:
    """Two requests held past the call's 200 ms grpc-timeout: the call ends
    DEADLINE_EXCEEDED, both withdrawn once, nothing else written."""
    with H2Client(server.port) as client:
        sid = client.start(HELD, timeout="200m")
        client.send(sid, grpc_message(b"a") + grpc_message(b"b"))
        result = client.wait(sid)
    assert result.grpc_status == StatusCode.DEADLINE_EXCEEDED
    assert result.grpc_message == "deadline exceeded (grpc-timeout '200m')"
    assert result.data == b""
    assert server.withdrawn == [b"a", b"b"]
    assert server.idle()


def test_a_reset_withdraws_every_request_owed_and_writes_nothing(server: StreamServer) -> None:
    with H2Client(server.port) as client:
        sid = client.start(HELD)
        client.send(sid, b"".join(grpc_message(b"%d" % i) for i in range(3)))
        assert server.until(lambda: len(server.held) == 3)
        server.on_loop(lambda: server.held[0][0].answer([b"late"]))  # ready, not written
        client.conn.reset_stream(sid)
        client.flush()
        assert server.until(lambda: len(server.withdrawn) == 2)
        assert server.idle()
        assert client.round_trip()
    assert server.withdrawn == [b"1", b"2"]  # the answered one has nothing to withdraw
    assert client.results[sid].headers == {} and client.results[sid].data == b""


def test_an_oversized_message_ends_the_call_after_the_answers_before_it(
    server: StreamServer,
) -> None:
    """Two requests answered, then a prefix declaring more than max_message_bytes: the
    call ends RESOURCE_EXHAUSTED before the body is accepted, the answers already
    written stay written, and a request still owed is withdrawn."""
    with H2Client(server.port) as client:
        sid = client.start(HELD)
        client.send(sid, grpc_message(b"a") + grpc_message(b"b"))
        assert server.until(lambda: len(server.held) == 2)
        server.on_loop(lambda: server.held[0][0].answer([b"A"]))
        assert _wait_messages(client, sid, 1) == [b"A"]
        client.send(sid, grpc_message(b"", length=(1 << 20) + 1))
        result = client.wait(sid)
    assert result.grpc_status == StatusCode.RESOURCE_EXHAUSTED
    assert result.grpc_message == (
        "request message of 1048577 bytes exceeds the limit of 1048576 bytes "
        "(endpoints.max_message_bytes); use shared memory for inputs this large"
    )
    assert _messages(result.data) == [b"A"]
    assert server.withdrawn == [b"b"]
    assert server.idle()


def test_a_bug_in_a_handler_is_answered_internal_in_the_stream(server: StreamServer) -> None:
    with H2Client(server.port) as client:
        sid = client.start(BUG)
        client.send(sid, grpc_message(b"x") + grpc_message(b"y"), end_stream=True)
        result = client.wait(sid)
    assert result.grpc_status == 0, result.grpc_message
    assert _messages(result.data) == [b"E\x0dinternal error"] * 2
    assert server.idle()


def test_a_drain_ends_the_call_once_nothing_is_owed(server: StreamServer) -> None:
    """Draining a stream with a request held ends it only after that answer is written,
    with the drain's status, though the client never ended its side."""
    with H2Client(server.port) as client:
        sid = client.start(HELD)
        client.send(sid, grpc_message(b"a"))
        assert server.until(lambda: len(server.held) == 1)
        (stream,) = server.streams
        server.on_loop(lambda: stream.drain(StatusCode.UNAVAILABLE, "stopping"))
        assert client.round_trip()
        assert not client.results[sid].finished
        server.on_loop(lambda: server.held[0][0].answer([b"A"]))
        result = client.wait(sid)
    assert (result.grpc_status, result.grpc_message) == (StatusCode.UNAVAILABLE, "stopping")
    assert _messages(result.data) == [b"A"]
    assert server.idle()


def test_the_stream_methods_run_no_task(server: StreamServer) -> None:
    """A stream is a record of its connection: no asyncio task runs for it or its
    requests."""
    with H2Client(server.port) as client:
        sid = client.start(HELD)
        client.send(sid, grpc_message(b"a") + grpc_message(b"b"))
        assert server.until(lambda: len(server.held) == 2)
        tasks = server.on_loop(lambda: len(asyncio.all_tasks()))
        server.on_loop(lambda: [r.answer([b"A"]) for r, _ in server.held])
        client.end(sid)
        result = client.wait(sid)
    assert tasks == 1  # the server's own main task
    assert result.grpc_status == 0


def test_requests_a_reset_withdraws_count_in_the_abuse_budget(server: StreamServer) -> None:
    """Streams of eight requests each, reset as soon as sent: every request counts as a
    call started and reset early, so the connection gets GOAWAY ENHANCE_YOUR_CALM after
    about 200 such requests -- 23 streams, where counting streams alone would allow 200
    (1,600 requests begun and thrown away)."""
    with H2Client(server.port) as client:
        opened = 0
        while opened < 40 and client.connection.goaway is None:
            sid = client.start(HELD)
            client.send(sid, b"".join(grpc_message(b"%d" % i) for i in range(8)))
            begun = 8 * (opened + 1)
            assert server.until(lambda: server.begun == begun)  # noqa: B023
            client.conn.reset_stream(sid)
            client.flush()
            opened += 1
            assert client.round_trip() or client.connection.goaway is not None
        assert client.connection.goaway is not None
        assert client.connection.goaway[0] == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    assert opened == 23  # 23 x 9 = 207 calls started, every one reset at once
    assert len(server.withdrawn) == server.begun == 8 * 23
