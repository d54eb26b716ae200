"""Direct unary calls (``transport/unary.py``): served by the connection, no task per call.

A real :class:`GuardedServer` on loopback, on an asyncio loop in a thread of this process,
with direct handlers written for the tests, driven by the hand-written HTTP/2 client of
``tests/h2_client.py``. What must hold, whatever the handler does:

* the message reaches the handler whole and without its prefix; the answer reaches the
  client byte for byte, also when it is larger than the client's windows or than what the
  transport may buffer (it then waits for WINDOW_UPDATE / for the client to read);
* an answer given later, from any callback on the loop, goes out;
* every call ends with exactly one status: the handler's, INTERNAL for a handler that
  raised, DEADLINE_EXCEEDED for a call whose deadline passed before its message was
  complete (the handler never sees it), the wire's refusal for a bad message;
* a client that resets its call, or goes away, makes ``on_cancel`` run once and nothing is
  written for the call; every call's stream slot is given back (``streams_open`` returns to
  0) and direct calls count against ``max_concurrent_streams`` like any other.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import weakref
from collections.abc import Iterator
from typing import Any

import h2.errors
import h2.settings
import pytest
from grpclib.const import Cardinality, Handler
from h2_client import H2Client, grpc_message, request_headers
from threaded_server import ThreadedServer

from reactantserver.gateway.calls import RawCodec
from reactantserver.status import StatusCode
from reactantserver.transport.core.limits import WireLimits
from reactantserver.transport.server import GuardedServer, _Calls
from reactantserver.transport.unary import DirectAdmission, DirectHandler, UnaryCall

BIG = 3 * 1024 * 1024 + 17  # past the default 64 KiB windows and several SEND_CHUNKs
HUGE = 24 * 1024 * 1024  # past the transport's high-water mark and the socket buffers


class DirectServer(ThreadedServer):
    """A GuardedServer with the test's direct handlers, on a loop in a thread."""

    def __init__(self, **limits: Any) -> None:
        super().__init__(WireLimits(**limits))
        self.cancelled: list[str] = []
        self.held: list[UnaryCall] = []
        self.seen: list[bytes] = []
        self.jobs: list[weakref.ref[_Job]] = []

    # ------------------------------------------------------------------ handlers

    def echo(self, call: UnaryCall, message: bytes | memoryview) -> None:
        self.seen.append(bytes(message))
        call.answer((message,))

    def later(self, call: UnaryCall, message: bytes | memoryview) -> None:
        assert self.loop is not None
        self.loop.call_later(0.05, call.answer, (b"later:", bytes(message)))

    def big(self, call: UnaryCall, message: bytes | memoryview) -> None:
        size = int(bytes(message))
        call.answer((_pattern(size // 2), _pattern(size - size // 2)))

    def hold(self, call: UnaryCall, message: bytes | memoryview) -> None:
        self.held.append(call)
        call.on_cancel = lambda: self.cancelled.append(call.path)

    def fail(self, call: UnaryCall, message: bytes | memoryview) -> None:
        call.fail(StatusCode.NOT_FOUND, "no such thing: ask for another")

    def job(self, call: UnaryCall, message: bytes | memoryview) -> None:
        """A handler object per call that holds the call and is its ``on_cancel`` (the
        gateway's Forward, the worker's _Infer): answered 50 ms later unless reset."""
        job = _Job(call, self.cancelled)
        self.jobs.append(weakref.ref(job))
        assert self.loop is not None
        self.loop.call_later(0.05, job.finish)

    def twice(self, call: UnaryCall, message: bytes | memoryview) -> None:
        call.answer((b"first",))
        call.fail(StatusCode.INTERNAL, "second")
        call.answer((b"third",))

    def boom(self, call: UnaryCall, message: bytes | memoryview) -> None:
        raise RuntimeError("a bug in the handler")

    # ------------------------------------------------------------------ the server

    def mapping(self) -> dict[str, Handler | DirectHandler]:
        table: dict[str, Handler | DirectHandler] = {
            f"/t.S/{name.capitalize()}": DirectHandler(getattr(self, name))
            for name in ("echo", "later", "big", "hold", "fail", "twice", "boom", "job")
        }

        async def plain(stream: Any) -> None:  # the task path, beside the direct one
            message = await stream.recv_message()
            await stream.send_message(message)

        table["/t.S/Plain"] = Handler(plain, Cardinality.UNARY_UNARY, None, None)
        return table

    def streams_open(self) -> int:
        assert self.server is not None
        return self.server.counters.streams_open


class _Job:
    def __init__(self, call: UnaryCall, cancelled: list[str]) -> None:
        self.call = call
        self.cancelled = cancelled
        call.on_cancel = self.cancel

    def finish(self) -> None:
        self.call.answer((b"done",))

    def cancel(self) -> None:
        self.cancelled.append(self.call.path)


def _pattern(size: int) -> bytes:
    return bytes(range(251)) * (size // 251) + bytes(range(size % 251))


def _message(result: Any) -> bytes:
    data = result.data
    assert data[0] == 0 and int.from_bytes(data[1:5], "big") == len(data) - 5
    return data[5:]


@pytest.fixture
def server() -> Iterator[DirectServer]:
    with DirectServer() as s:
        yield s


def test_a_direct_call_gets_the_message_whole_and_answers_it(server: DirectServer) -> None:
    """The handler sees the message without its prefix; the client gets the answer with
    its headers, one message and OK trailers -- on several streams at once."""
    with H2Client(server.port) as client:
        sids = [client.start("/t.S/Echo") for _ in range(5)]
        for i, sid in enumerate(sids):
            client.send(sid, grpc_message(b"hello %d" % i), end_stream=True)
        for i, sid in enumerate(sids):
            result = client.wait(sid)
            assert result.http_status == 200
            assert result.headers["content-type"] == "application/grpc+proto"
            assert result.grpc_status == 0, result.grpc_message
            assert _message(result) == b"hello %d" % i
    assert sorted(server.seen) == sorted(b"hello %d" % i for i in range(5))
    assert server.until(lambda: server.streams_open() == 0)


def test_a_message_split_over_many_frames_arrives_whole(server: DirectServer) -> None:
    """DATA frames of 16 KiB (the client's default) carry a 1 MB message; the prefix may
    sit in a frame of its own."""
    payload = _pattern(1_000_003)
    with H2Client(server.port) as client:
        sid = client.start("/t.S/Echo")
        message = grpc_message(payload)
        client.send(sid, message[:3])
        client.send(sid, message[3:], end_stream=True)
        result = client.wait(sid, timeout=30)
    assert result.grpc_status == 0, result.grpc_message
    assert _message(result) == payload


def test_an_answer_given_later_from_a_callback_goes_out(server: DirectServer) -> None:
    with H2Client(server.port) as client:
        result = client.call("/t.S/Later", b"x")
    assert result.grpc_status == 0
    assert _message(result) == b"later:x"


def test_an_answer_past_the_clients_windows_waits_for_window_updates(
    server: DirectServer,
) -> None:
    """64 KiB windows (HTTP/2's default): the answer goes out window by window as the client
    acknowledges; every byte arrives, in order, in frames the client allows."""
    with H2Client(server.port) as client:
        result = client.call("/t.S/Big", str(BIG).encode(), wait=60)
    assert result.grpc_status == 0, result.grpc_message
    assert _message(result) == _pattern(BIG // 2) + _pattern(BIG - BIG // 2)
    assert max(result.frames) <= 16384


def test_an_answer_to_a_client_that_does_not_read_waits_for_it(server: DirectServer) -> None:
    """Large windows, a client that reads nothing for a while: the answer stops at the
    transport's high-water mark instead of piling up, and resumes when the client reads."""
    codes = h2.settings.SettingCodes
    with H2Client(server.port) as client:
        client.conn.update_settings({codes.INITIAL_WINDOW_SIZE: (1 << 31) - 1})
        client.conn.increment_flow_control_window((1 << 31) - 1 - 65535)
        client.flush()
        sid = client.start("/t.S/Big")
        client.send(sid, grpc_message(str(HUGE).encode()), end_stream=True)
        time.sleep(1.0)  # real-clock: not reading: the server's socket and transport buffers fill
        result = client.wait(sid, timeout=60)
    assert result.grpc_status == 0, result.grpc_message
    assert _message(result) == _pattern(HUGE // 2) + _pattern(HUGE - HUGE // 2)
    assert server.until(lambda: server.streams_open() == 0)


def test_statuses_one_per_call(server: DirectServer, caplog: pytest.LogCaptureFixture) -> None:
    """The handler's failure as given; the first answer of a handler that answers twice; a
    handler that raises: INTERNAL with the fixed message, the traceback in the log."""
    with H2Client(server.port) as client:
        failed = client.call("/t.S/Fail", b"")
        twice = client.call("/t.S/Twice", b"")
        with caplog.at_level(logging.ERROR):
            boom = client.call("/t.S/Boom", b"")
        plain = client.call("/t.S/Plain", b"task path")
    assert failed.grpc_status == StatusCode.NOT_FOUND
    assert failed.grpc_message == "no such thing: ask for another"
    assert failed.http_status == 200 and not failed.data  # trailers-only
    assert twice.grpc_status == 0 and _message(twice) == b"first"
    assert boom.grpc_status == StatusCode.INTERNAL and boom.grpc_message == "internal error"
    assert "a bug in the handler" in caplog.text
    assert plain.grpc_status == 0 and _message(plain) == b"task path"
    assert server.until(lambda: server.streams_open() == 0)


def test_a_client_reset_cancels_the_call_once(server: DirectServer) -> None:
    """RST_STREAM from the client: ``on_cancel`` runs once, the slot is free, an answer
    given afterwards writes nothing, and the connection goes on serving."""
    with H2Client(server.port) as client:
        sid = client.start("/t.S/Hold")
        client.send(sid, grpc_message(b"wait"), end_stream=True)
        assert server.until(lambda: len(server.held) == 1)
        client.conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
        client.flush()
        assert server.until(lambda: server.cancelled == ["/t.S/Hold"])
        assert server.until(lambda: server.streams_open() == 0)
        call = server.held[0]
        assert call.done
        assert server.loop is not None
        server.loop.call_soon_threadsafe(call.answer, (b"too late",))
        after = client.call("/t.S/Echo", b"still here")
        assert after.grpc_status == 0 and _message(after) == b"still here"
        assert not client.results[sid].data
    assert server.cancelled == ["/t.S/Hold"]


def test_a_finished_call_leaves_no_cycle_for_the_collector(server: DirectServer) -> None:
    """A handler object that is the call's ``on_cancel`` (a bound method) is freed when the
    call ends -- answered or reset -- by reference counting alone: the call forgets its
    cancel hook, so no handler-call cycle is left for the cyclic collector, whose passes
    cost every request a few microseconds when each one leaves such a cycle."""
    gc.collect()
    gc.disable()
    try:
        with H2Client(server.port) as client:
            answered = [client.start("/t.S/Job") for _ in range(3)]
            for sid in answered:
                client.send(sid, grpc_message(b"go"), end_stream=True)
            reset = client.start("/t.S/Job")
            client.send(reset, grpc_message(b"go"), end_stream=True)
            assert server.until(lambda: len(server.jobs) == 4)
            client.conn.reset_stream(reset, h2.errors.ErrorCodes.CANCEL)
            client.flush()
            for sid in answered:
                assert _message(client.wait(sid)) == b"done"
            assert server.until(lambda: server.cancelled == ["/t.S/Job"])
            assert server.until(lambda: all(job() is None for job in server.jobs))
    finally:
        gc.enable()


def test_a_lost_connection_cancels_its_calls(server: DirectServer) -> None:
    with H2Client(server.port) as client:
        for _ in range(3):
            sid = client.start("/t.S/Hold")
            client.send(sid, grpc_message(b"wait"), end_stream=True)
        assert server.until(lambda: len(server.held) == 3)
    assert server.until(lambda: len(server.cancelled) == 3)
    assert server.until(lambda: server.streams_open() == 0)


def test_a_deadline_that_passes_before_the_message_is_complete(server: DirectServer) -> None:
    """grpc-timeout 100m, the message's last byte after 300 ms: DEADLINE_EXCEEDED, and the
    handler never saw the call."""
    with H2Client(server.port) as client:
        sid = client.start("/t.S/Echo", timeout="100m")
        message = grpc_message(b"slow")
        client.send(sid, message[:4])
        assert server.until(lambda: server.streams_open() == 1)  # its deadline counts now
        time.sleep(0.3)  # real-clock: the server's 100 ms deadline passes mid-message
        client.send(sid, message[4:], end_stream=True)
        result = client.wait(sid)
    assert result.grpc_status == StatusCode.DEADLINE_EXCEEDED
    assert "deadline" in result.grpc_message
    assert server.seen == []


def test_a_bad_message_is_refused_before_the_handler() -> None:
    """The wire's checks apply to direct calls: a declared length past the limit is
    RESOURCE_EXHAUSTED at the prefix; the handler never runs."""
    with DirectServer(max_message_bytes=1000) as server, H2Client(server.port) as client:
        sid = client.start("/t.S/Echo")
        client.send(sid, grpc_message(b"", length=5000))
        result = client.wait(sid)
        assert result.grpc_status == StatusCode.RESOURCE_EXHAUSTED
        assert server.seen == []
        assert server.until(lambda: server.streams_open() == 0)


def test_direct_calls_count_against_the_stream_limit() -> None:
    """Two held direct calls fill ``max_concurrent_streams: 2``: the third stream is
    refused (REFUSED_STREAM); once one is cancelled, a new one is served."""
    with DirectServer(max_concurrent_streams=2) as server, H2Client(server.port) as client:
        held = []
        for _ in range(2):
            sid = client.start("/t.S/Hold")
            client.send(sid, grpc_message(b"wait"), end_stream=True)
            held.append(sid)
        assert server.until(lambda: len(server.held) == 2)
        # The client's h2 enforces the server's limit too: lift it on the client's side.
        third = client.conn.get_next_available_stream_id()
        client.conn.remote_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = 10
        client.start("/t.S/Echo")
        assert client.wait(third).reset == h2.errors.ErrorCodes.REFUSED_STREAM
        client.conn.reset_stream(held[0], h2.errors.ErrorCodes.CANCEL)
        client.flush()
        assert server.until(lambda: len(server.cancelled) == 1)
        after = client.call("/t.S/Echo", b"room again")
        assert after.grpc_status == 0 and _message(after) == b"room again"


def test_a_repeated_header_block_is_judged_once_and_each_deadline_is_its_own() -> None:
    """The connection's decoder hands a repeated header block back as the same tuple, and
    the sink keeps its verdict: without a deadline the next call gets the same admission
    (nothing in it differs); with ``grpc-timeout`` each call's deadline counts from its own
    arrival; a new block, or the same headers in a list, is judged afresh."""

    async def main() -> None:
        path = "/t.T/Direct"
        server = GuardedServer(
            {path: DirectHandler(lambda call, message: None)},
            codec=RawCodec(1 << 20, 1 << 20),
            limits=WireLimits(),
        )
        sink = _Calls(server)
        plain = tuple(request_headers(path))
        first = sink.admit(plain, "peer", 1.0)
        assert isinstance(first, DirectAdmission) and first.deadline is None
        assert sink.admit(plain, "peer", 2.0) is first
        assert sink.admit(list(plain), "peer", 3.0) is not first  # not known by identity
        timed = tuple(request_headers(path, timeout="500m"))
        early, late = sink.admit(timed, "peer", 1.0), sink.admit(timed, "peer", 2.0)
        assert isinstance(early, DirectAdmission) and isinstance(late, DirectAdmission)
        assert (early.deadline, late.deadline) == (1.5, 2.5)
        again = sink.admit(plain, "peer", 4.0)
        assert isinstance(again, DirectAdmission) and again.deadline is None

    asyncio.run(main())
