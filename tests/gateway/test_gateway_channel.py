"""The gateway's worker connections (``gateway.channel``, ``gateway.pool``) on real sockets.

Two kinds of peer on 127.0.0.1: a grpclib server (what a worker runs) for the normal paths,
and a scripted h2 server for what a worker does rarely (GOAWAY naming a last stream,
REFUSED_STREAM). Each test is a plain function running its own asyncio loop.

Invariants checked: answers and statuses come back as sent (non-ASCII messages too); the
``grpc-timeout`` sent is the remaining time (none when the caller says not to tell the
worker); a deadline resets the stream and answers DEADLINE_EXCEEDED; a cancelled caller
resets its stream and the server's handler is cancelled; at most ``max_streams`` calls are
on the wire at once and waiters time out without sending; ``unprocessed`` is true exactly
when the worker cannot have run the call; a lost connection is replaced on the next call.

Every test runs on a virtual clock (``clocks.VirtualClockLoop``: the loop's time jumps to
the next timer whenever nothing is ready), so each deadline, grace and timer is checked at
the exact virtual second it is due, whatever the machine's load; a test waits for a
worker's state through ``Worker.changes``, never by sleeping.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
from clocks import Changes, VirtualClockLoop
from grpclib import GRPCError
from grpclib.const import Cardinality, Handler, Status
from grpclib.metadata import decode_timeout
from grpclib.server import Server, Stream

from reactantserver.errors import DeadlineExceeded
from reactantserver.gateway.calls import RawCodec
from reactantserver.gateway.channel import (
    DEADLINE_RESET_GRACE,
    FLUSH_EVERY,
    ChannelError,
    Reply,
    WorkerConnection,
)
from reactantserver.gateway.pool import WorkerClient
from reactantserver.h2.events import ErrorCodes

REFUSED_STREAM = ErrorCodes.REFUSED_STREAM


class _Server(Server):
    """grpclib's server, keeping its connections so that a test can cut them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.protocols: list[Any] = []

    def _protocol_factory(self) -> Any:
        protocol = super()._protocol_factory()
        self.protocols.append(protocol)
        return protocol


class Worker:
    """A grpclib server with a few raw-bytes methods; records what it saw."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.cancelled = 0
        self.calls = 0
        self.deadlines: list[float | None] = []
        self.release = asyncio.Event()
        self.changes = Changes()  # told each time the counts above move
        self.server: _Server | None = None
        self.port = 0

    async def echo(self, stream: Stream[Any, Any]) -> None:
        data = await stream.recv_message()
        self.calls += 1
        self.changes.notify()
        await stream.send_message(data[::-1])

    async def fail(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        raise GRPCError(Status.RESOURCE_EXHAUSTED, "queue full: réessayez, 100% sûr")

    async def hold(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        self.calls += 1
        self.deadlines.append(stream.deadline.time_remaining() if stream.deadline else None)
        self.active += 1
        self.peak = max(self.peak, self.active)
        self.changes.notify()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1
            self.changes.notify()
        await stream.send_message(b"released")

    async def big(self, stream: Stream[Any, Any]) -> None:
        size = int(await stream.recv_message())
        await stream.send_message(b"b" * size)

    async def start(self, port: int = 0) -> None:
        methods: dict[str, Callable[[Stream[Any, Any]], Awaitable[None]]] = {
            "Echo": self.echo,
            "Fail": self.fail,
            "Hold": self.hold,
            "Big": self.big,
        }
        mapping = {
            f"/t.T/{name}": Handler(func, Cardinality.UNARY_UNARY, None, None)
            for name, func in methods.items()
        }

        class Servable:
            def __mapping__(self) -> dict[str, Handler]:
                return mapping

        self.server = _Server([Servable()], codec=RawCodec(1 << 31, 1 << 31))
        await self.server.start("127.0.0.1", port)
        assert self.server._server is not None
        self.port = self.server._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop and cut every connection (what a killed worker looks like to the gateway)."""
        assert self.server is not None
        self.server.close()
        for protocol in self.server.protocols:
            if getattr(protocol, "connection", None) is not None:
                protocol.connection.close()
        await self.server.wait_closed()


def run(test: Callable[[], Awaitable[None]]) -> None:
    """``test`` on a selector loop, as the gateway runs (not the loop trio-asyncio's
    policy would make, once another test module imported it), with a virtual clock: a
    test that hangs fails after 60 virtual seconds, at once."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        runner.run(asyncio.wait_for(test(), 60))


def now() -> float:
    return asyncio.get_running_loop().time()


def deadline(seconds: float = 10.0) -> float:
    return asyncio.get_running_loop().time() + seconds


def test_answers_and_statuses_come_back_as_sent() -> None:
    async def main() -> None:
        worker = Worker()
        await worker.start()
        client = WorkerClient(f"127.0.0.1:{worker.port}", "w0")
        reply = await client.call(b"/t.T/Echo", b"hello", deadline())
        assert (reply.status, bytes(reply.payload)) == (0, b"olleh")
        reply = await client.call(b"/t.T/Fail", b"x", deadline())
        assert (reply.status, reply.message) == (8, "queue full: réessayez, 100% sûr")
        reply = await client.call(b"/t.T/Nope", b"x", deadline())
        assert reply.status == 12
        assert client.label == f"w0 (127.0.0.1:{worker.port})"
        await client.wait_closed()
        await worker.stop()

    run(main)


def test_the_remaining_deadline_is_sent_and_enforced() -> None:
    """grpc-timeout carries the time left when the stream opens; at the deadline a worker
    that keeps silent is not waited for: the call is answered DEADLINE_EXCEEDED by the
    gateway, then and not before. (A grpclib worker enforces the same deadline itself and
    cancels its handler: the next test's worker is not told one.)"""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        timeouts: list[bytes] = []
        server = await loop.create_server(
            lambda: ScriptedWorker(["ok", "silent"], timeouts=timeouts), "127.0.0.1", 0
        )
        client = WorkerClient(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
        await client.call(b"/t.T/A", b"warm", deadline(30))  # connected
        started = now()
        reply = await client.call(b"/t.T/A", b"x", deadline(0.2))
        assert reply.status == 4 and "deadline" in reply.message
        assert now() - started == pytest.approx(0.2, abs=1e-9)  # at the deadline, not before
        assert [decode_timeout(t.decode()) for t in timeouts] == [
            pytest.approx(30, abs=1e-6),
            pytest.approx(0.2, abs=1e-6),  # all of it: no time passed before it was sent
        ]
        await client.wait_closed()
        server.close()
        await server.wait_closed()

    run(main)


def test_a_deadline_the_worker_is_not_told_is_the_gateways_alone() -> None:
    """``tell=False``: no grpc-timeout reaches the worker; at the deadline the call is
    answered DEADLINE_EXCEEDED and, after the grace, its stream is reset (the worker's
    handler is cancelled)."""

    async def main() -> None:
        worker = Worker()
        await worker.start()
        client = WorkerClient(f"127.0.0.1:{worker.port}")
        started = now()
        reply = await client.call(b"/t.T/Hold", b"x", deadline(0.2), tell=False)
        answered = now()
        assert reply.status == 4
        assert answered - started == pytest.approx(0.2, abs=1e-9)
        assert worker.deadlines == [None]
        await worker.changes.until(lambda: worker.cancelled == 1)
        assert now() - answered == pytest.approx(DEADLINE_RESET_GRACE, abs=1e-9)
        await client.wait_closed()
        await worker.stop()

    run(main)


def test_a_cancelled_caller_resets_its_stream() -> None:
    async def main() -> None:
        worker = Worker()
        await worker.start()
        client = WorkerClient(f"127.0.0.1:{worker.port}")
        task = asyncio.ensure_future(client.call(b"/t.T/Hold", b"x", deadline()))
        started = now()
        await worker.changes.until(lambda: worker.active == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await worker.changes.until(lambda: worker.cancelled == 1)
        assert now() == started  # by the reset, not by a timer
        assert client.statistics().active_streams == 0
        await client.wait_closed()
        await worker.stop()

    run(main)


def test_stream_slots_bound_the_calls_on_the_wire() -> None:
    """With max_streams 2, five calls put at most two on the wire; the others wait in
    order and go out as slots free; a waiter whose deadline passes is refused without
    ever being sent."""

    async def main() -> None:
        worker = Worker()
        await worker.start()
        client = WorkerClient(f"127.0.0.1:{worker.port}", max_streams=2)
        calls = [
            asyncio.ensure_future(client.call(b"/t.T/Hold", b"x", deadline())) for _ in range(5)
        ]
        await worker.changes.until(lambda: worker.active == 2)
        await asyncio.sleep(0.05)  # virtual-clock: all in flight has settled meanwhile
        stats = client.statistics()
        assert (worker.active, stats.active_streams, stats.waiting) == (2, 2, 3)
        started = now()
        with pytest.raises(DeadlineExceeded, match="max_concurrent_streams"):
            await client.call(b"/t.T/Echo", b"late", deadline(0.05))
        assert now() - started == pytest.approx(0.05, abs=1e-9)
        assert worker.calls == 2
        worker.release.set()
        replies = await asyncio.gather(*calls)
        assert [bytes(r.payload) for r in replies] == [b"released"] * 5
        assert worker.peak == 2
        assert client.statistics().active_streams == 0
        await client.wait_closed()
        await worker.stop()

    run(main)


async def _hold_a_slot(worker: Worker, client: WorkerClient) -> asyncio.Future[Reply]:
    """A call the worker holds (until ``worker.release``), once it is there: with
    ``max_streams=1`` the client's one stream slot is taken."""
    holding = asyncio.ensure_future(client.call(b"/t.T/Hold", b"x", deadline()))
    await worker.changes.until(lambda: worker.active == 1)
    return holding


def test_a_waiter_without_a_task_takes_its_turn_in_the_same_line() -> None:
    """``wait_for_slot`` (a forwarded call's wait): waiters without a task share one line
    with coroutine waiters, first come first served; a freed slot is handed over in the
    event handling that freed it (``granted`` runs holding it, ``start(..., holding=True)``
    sends the call there); a cancelled waiter leaves the line and is never granted; one
    whose deadline passes is told so, naming the key, and nothing of it is sent; every slot
    comes back."""

    async def main() -> None:
        worker = Worker()
        await worker.start()
        client = WorkerClient(f"127.0.0.1:{worker.port}", max_streams=1)
        order: list[str] = []
        outcomes: dict[str, Reply | ChannelError] = {}
        expired: list[DeadlineExceeded] = []

        def answered(name: str) -> Callable[[Reply | ChannelError], None]:
            def on_done(outcome: Reply | ChannelError) -> None:
                order.append(f"{name} answered")
                outcomes[name] = outcome
                worker.changes.notify()

            return on_done

        class InLine:  # a caller in line (a pool.SlotCaller)
            def __init__(self, name: str) -> None:
                self.name = name

            def granted(self) -> None:
                name = self.name
                order.append(f"{name} granted")
                call = client.start(
                    b"/t.T/Echo", name.encode(), deadline(), answered(name), holding=True
                )
                assert call is not None

            def expired(self, exc: DeadlineExceeded) -> None:
                expired.append(exc)

        # No connection yet: such a caller waits in a task (start_when_ready).
        assert client.wait_for_slot(deadline(), InLine("x")) is None
        holding = await _hold_a_slot(worker, client)
        assert client.start(b"/t.T/Echo", b"a", deadline(), answered("a")) is None

        async def coroutine() -> None:
            await client.call(b"/t.T/Echo", b"c", deadline())
            order.append("c answered")

        a = client.wait_for_slot(deadline(), InLine("a"))
        c = asyncio.ensure_future(coroutine())
        await asyncio.sleep(0.01)  # virtual-clock: c has run and is in line behind a
        gone = client.wait_for_slot(deadline(), InLine("gone"))
        client.wait_for_slot(deadline(0.05), InLine("late"))
        b = client.wait_for_slot(deadline(), InLine("b"))
        assert a is not None and gone is not None and b is not None
        assert client.statistics().waiting == 5
        gone.cancel()
        gone.cancel()  # twice: a no-op
        await asyncio.sleep(0.049)  # virtual-clock: just before late's deadline
        assert expired == []
        await asyncio.sleep(0.002)  # virtual-clock: just after it
        assert [type(e) for e in expired] == [DeadlineExceeded]
        assert "worker_client.max_concurrent_streams" in str(expired[0])
        assert client.statistics().waiting == 3
        worker.release.set()
        await holding
        await c
        await worker.changes.until(lambda: "b answered" in order)
        # One slot: a's answer hands it to c (sent by its task), c's answer to b -- before
        # c's coroutine, woken by that answer, has run again.
        assert order == ["a granted", "a answered", "b granted", "c answered", "b answered"]
        assert {name: bytes(r.payload) for name, r in outcomes.items()} == {"a": b"a", "b": b"b"}  # type: ignore[union-attr]
        assert worker.calls == 4  # the hold, a, c and b: neither the cancelled nor the late
        b.cancel()  # after its grant: a no-op
        stats = client.statistics()
        assert (stats.active_streams, stats.waiting) == (0, 0)
        await client.wait_closed()
        await worker.stop()

    run(main)


def test_waiters_in_line_expire_by_their_own_deadlines() -> None:
    """Deadlines in line are in any order (clients set their own): each waiter is told at
    its deadline, earliest first, by the line's one timer -- one with a later deadline
    than those behind it does not hold them up, and one still in its time stays."""

    async def main() -> None:
        worker = Worker()
        await worker.start()
        client = WorkerClient(f"127.0.0.1:{worker.port}", max_streams=1)
        holding = await _hold_a_slot(worker, client)
        told: list[tuple[str, float]] = []
        loop = asyncio.get_running_loop()
        waits = {}
        for name, seconds in [("c", 0.3), ("a", 0.05), ("b", 0.15), ("patient", 30.0)]:
            at = deadline(seconds)

            class Caller:
                def granted(self) -> None:
                    pass

                def expired(self, exc: DeadlineExceeded, name: str = name, at: float = at) -> None:
                    told.append((name, loop.time() - at))

            waits[name] = client.wait_for_slot(at, Caller())
        await asyncio.sleep(0.5)  # virtual-clock: past the three short deadlines
        assert [name for name, _ in told] == ["a", "b", "c"]
        assert all(late == pytest.approx(0, abs=1e-9) for _, late in told)  # each when due
        assert client.statistics().waiting == 1
        waits["patient"].cancel()  # type: ignore[union-attr]
        assert client.statistics().waiting == 0
        worker.release.set()
        await holding
        assert worker.calls == 1 and client.statistics().active_streams == 0
        await client.wait_closed()
        await worker.stop()

    run(main)


def test_a_slot_granted_after_the_connection_went_is_kept_for_the_next_one() -> None:
    """A waiter handed a slot when the connection has just failed (its calls' slots coming
    back as they fail) cannot send there: ``start(..., holding=True)`` says None, the slot
    still held, and the call goes out on the next connection
    (``start_when_ready(holding=True)``)."""

    async def main() -> None:
        worker = Worker()
        await worker.start()
        client = WorkerClient(f"127.0.0.1:{worker.port}", max_streams=1)
        holding = await _hold_a_slot(worker, client)
        started: list[object] = []

        class Caller:
            def granted(self) -> None:
                started.append(client.start(b"/t.T/Echo", b"y", deadline(), print, holding=True))

            def expired(self, exc: DeadlineExceeded) -> None:
                started.append(exc)

        wait = client.wait_for_slot(deadline(), Caller())
        assert wait is not None
        port = worker.port
        await worker.stop()
        with pytest.raises(ChannelError):
            await holding
        assert started == [None]
        assert client.statistics().active_streams == 1  # the granted slot, still held
        again = Worker()
        await again.start(port)
        future: asyncio.Future[Reply | ChannelError] = asyncio.get_running_loop().create_future()
        await client.start_when_ready(
            b"/t.T/Echo", b"next", deadline(), future.set_result, holding=True
        )
        reply = await future
        assert isinstance(reply, Reply) and bytes(reply.payload) == b"txen"
        assert client.statistics().active_streams == 0
        await client.wait_closed()
        await again.stop()

    run(main)


def test_no_connection_means_unprocessed() -> None:
    async def main() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        client = WorkerClient(f"127.0.0.1:{port}")
        with pytest.raises(ChannelError, match="cannot connect") as caught:
            await client.call(b"/t.T/Echo", b"x", deadline())
        assert caught.value.unprocessed
        assert client.statistics().connect_failures == 1

    run(main)


def test_a_lost_connection_fails_calls_in_flight_as_possibly_run_then_reconnects() -> None:
    async def main() -> None:
        worker = Worker()
        await worker.start()
        client = WorkerClient(f"127.0.0.1:{worker.port}")
        task = asyncio.ensure_future(client.call(b"/t.T/Hold", b"x", deadline()))
        await worker.changes.until(lambda: worker.active == 1)
        port = worker.port
        await worker.stop()
        with pytest.raises(ChannelError) as caught:
            await task
        assert not caught.value.unprocessed  # sent in full: it may have run
        with pytest.raises(ChannelError) as refused:
            await client.call(b"/t.T/Echo", b"x", deadline())
        assert refused.value.unprocessed
        again = Worker()
        await again.start(port)
        reply = await client.call(b"/t.T/Echo", b"back", deadline())
        assert bytes(reply.payload) == b"kcab"
        assert client.statistics().connects == 3
        await client.wait_closed()
        await again.stop()

    run(main)


def test_large_messages_both_ways_and_the_reply_limit() -> None:
    async def main() -> None:
        worker = Worker()
        await worker.start()
        client = WorkerClient(f"127.0.0.1:{worker.port}", max_reply_bytes=30_000_000)
        payload = bytes(range(256)) * 80_000  # 20 MB: past every window
        reply = await client.call(b"/t.T/Echo", payload, deadline(30))
        assert reply.status == 0 and bytes(reply.payload) == payload[::-1]
        reply = await client.call(b"/t.T/Big", b"31000000", deadline(30))
        assert reply.status == 8 and "grpc.max_send_msg_bytes" in reply.message
        reply = await client.call(b"/t.T/Echo", b"still fine", deadline())
        assert bytes(reply.payload) == b"enif llits"
        await client.wait_closed()
        await worker.stop()

    run(main)


class ScriptedWorker(asyncio.Protocol):
    """An h2 server that answers each stream per ``script``: "ok", "refuse" (RST_STREAM
    REFUSED_STREAM), "goaway" (GOAWAY naming the stream before it as the last), or "drain"
    (GOAWAY naming this stream as the last, then its answer), or "silent" (no answer ever);
    ``resets`` gets the loop's time of each RST_STREAM, ``timeouts`` each request's
    grpc-timeout."""

    def __init__(
        self,
        script: list[str],
        resets: list[float] | None = None,
        timeouts: list[bytes] | None = None,
    ) -> None:
        self.script = script
        self.resets = resets if resets is not None else []
        self.timeouts = timeouts if timeouts is not None else []
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.conn.initiate_connection()
        transport.write(self.conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                self.timeouts.extend(v for k, v in event.headers if k == b"grpc-timeout")
            if isinstance(event, h2.events.StreamReset):
                self.resets.append(asyncio.get_running_loop().time())
            if isinstance(event, h2.events.StreamEnded):
                action = self.script.pop(0)
                sid = event.stream_id
                if action == "ok":
                    self.conn.send_headers(sid, [(b":status", b"200")])
                    self.conn.send_data(sid, b"\x00\x00\x00\x00\x02ok")
                    self.conn.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
                elif action == "refuse":
                    self.conn.reset_stream(sid, REFUSED_STREAM)
                elif action == "goaway":
                    self.conn.close_connection(last_stream_id=sid - 2)
                elif action == "drain":
                    # GOAWAY naming this stream as the last, then its answer: a graceful
                    # drain (h2 cannot send on after its own GOAWAY, so the frame is raw).
                    goaway = sid.to_bytes(4, "big") + (0).to_bytes(4, "big")
                    self.transport.write(b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" + goaway)
                    self.conn.send_headers(sid, [(b":status", b"200")])
                    self.conn.send_data(sid, b"\x00\x00\x00\x00\x05after")
                    self.conn.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
        self.transport.write(self.conn.data_to_send())


def test_refused_streams_and_goaway_are_unprocessed() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        script = ["ok", "refuse", "goaway", "ok"]
        server = await loop.create_server(lambda: ScriptedWorker(script), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = WorkerClient(f"127.0.0.1:{port}")
        assert bytes((await client.call(b"/t.T/A", b"", deadline())).payload) == b"ok"
        with pytest.raises(ChannelError, match="REFUSED_STREAM") as refused:
            await client.call(b"/t.T/A", b"", deadline())
        assert refused.value.unprocessed
        with pytest.raises(ChannelError, match="GOAWAY") as goaway:
            await client.call(b"/t.T/A", b"", deadline())
        assert goaway.value.unprocessed
        # The GOAWAY'd connection is replaced: a new one answers.
        reply = await client.call(b"/t.T/A", b"", deadline())
        assert isinstance(reply, Reply) and reply.status == 0
        assert client.statistics().connects == 2
        await client.wait_closed()
        server.close()
        await server.wait_closed()

    run(main)


def test_a_graceful_goaway_lets_the_calls_in_flight_finish() -> None:
    """The worker's GOAWAY names the stream in flight as the last it will process: that call
    is answered on the old connection, and the next call opens a new one."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        script = ["drain", "ok"]
        server = await loop.create_server(lambda: ScriptedWorker(script), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = WorkerClient(f"127.0.0.1:{port}")
        reply = await client.call(b"/t.T/A", b"", deadline())
        assert (reply.status, bytes(reply.payload)) == (0, b"after")
        reply = await client.call(b"/t.T/A", b"", deadline())
        assert bytes(reply.payload) == b"ok"
        assert client.statistics().connects == 2
        await client.wait_closed()
        server.close()
        await server.wait_closed()

    run(main)


def test_probes_do_not_wait_for_a_stream_slot() -> None:
    """A worker holding every slot with slow calls still answers the prober at once."""

    async def main() -> None:
        worker = Worker()
        await worker.start()
        client = WorkerClient(f"127.0.0.1:{worker.port}", max_streams=1)
        held = asyncio.ensure_future(client.call(b"/t.T/Hold", b"x", deadline()))
        await worker.changes.until(lambda: worker.active == 1)
        started = now()
        reply = await client.call(b"/t.T/Echo", b"probe", deadline(0.5), probe=True)
        assert bytes(reply.payload) == b"eborp"
        assert now() == started  # at once: no timer ran
        with pytest.raises(DeadlineExceeded):  # an ordinary call waits for the slot
            await client.call(b"/t.T/Echo", b"x", deadline(0.05))
        assert now() - started == pytest.approx(0.05, abs=1e-9)
        worker.release.set()
        assert bytes((await held).payload) == b"released"
        await client.wait_closed()
        await worker.stop()

    run(main)


def test_an_expired_call_is_reset_only_if_the_worker_does_not_end_it() -> None:
    """At its deadline a call is answered DEADLINE_EXCEEDED at once, but its stream is reset
    only after DEADLINE_RESET_GRACE -- the worker has the same deadline and normally ends
    the call itself -- so expired calls do not look like a rapid-reset attack to it."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        resets: list[float] = []
        server = await loop.create_server(
            lambda: ScriptedWorker(["silent"], resets), "127.0.0.1", 0
        )
        port = server.sockets[0].getsockname()[1]
        client = WorkerClient(f"127.0.0.1:{port}")
        started = loop.time()
        reply = await client.call(b"/t.T/A", b"", deadline(0.05))
        answered = loop.time()
        assert reply.status == 4 and answered - started == pytest.approx(0.05, abs=1e-9)
        await asyncio.sleep(DEADLINE_RESET_GRACE - 0.001)  # virtual-clock: just before it
        assert resets == []  # not yet: the worker may still end it
        await asyncio.sleep(0.002)  # virtual-clock: just after it
        assert resets == [pytest.approx(answered + DEADLINE_RESET_GRACE, abs=1e-9)]
        await client.wait_closed()
        server.close()
        await server.wait_closed()

    run(main)


def test_one_timer_expires_every_call_at_its_own_deadline() -> None:
    """The connection's one timer (a heap of deadlines, not a timer per call) answers each
    unanswered call DEADLINE_EXCEEDED at its own deadline, whatever order the deadlines
    arrive in (a later call with an earlier deadline re-arms it), never before; and the
    entries of answered calls do not pile up: after many answered calls the heap holds no
    more than twice the open calls plus a constant."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        offsets = [0.30, 0.10, 0.45, 0.05, 0.20, 0.35, 0.15]
        server = await loop.create_server(
            lambda: ScriptedWorker(["ok"] * 500 + ["silent"] * len(offsets)), "127.0.0.1", 0
        )
        port = server.sockets[0].getsockname()[1]
        client = WorkerClient(f"127.0.0.1:{port}", max_streams=64)
        for _ in range(500):  # answered calls with a long deadline each
            assert (await client.call(b"/t.T/A", b"", deadline(30.0))).status == 0
        conn = client._conn
        assert conn is not None and not conn._calls
        assert len(conn._deadlines) <= 64

        started = loop.time()
        answered: dict[float, float] = {}

        async def one(offset: float) -> None:
            reply = await client.call(b"/t.T/A", b"", started + offset)
            assert reply.status == 4, reply
            answered[offset] = loop.time() - started

        await asyncio.gather(*(one(offset) for offset in offsets))
        for offset, took in answered.items():
            assert took == pytest.approx(offset, abs=1e-9), (offset, took)
        by_deadline = sorted(answered, key=answered.__getitem__)
        assert by_deadline == sorted(offsets)
        await client.wait_closed()
        server.close()
        await server.wait_closed()

    run(main)


class _RecordingTransport(asyncio.Transport):
    """Records what is written."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def test_a_burst_of_calls_is_written_every_flush_every_calls_not_only_at_the_end() -> None:
    """Calls started in one pass of the event loop are written together at the end of the
    pass, or as soon as FLUSH_EVERY of them wait: a burst does not hold its first calls
    back until the gateway has handled its last (the worker would sit idle meanwhile)."""

    async def main() -> None:
        conn = WorkerConnection("worker:1", max_reply_bytes=1 << 20)
        transport = _RecordingTransport()
        conn.connection_made(transport)
        await asyncio.sleep(0)
        transport.writes.clear()
        burst = 2 * FLUSH_EVERY + 3
        for _ in range(burst):
            conn.start(b"/t.T/A", b"x", deadline(), lambda outcome: None)
        # Still in the same pass: the first two groups of FLUSH_EVERY are on the wire.
        assert len(transport.writes) == 2
        await asyncio.sleep(0)  # the end of the pass: the rest, in one write
        assert len(transport.writes) == 3
        streams = [
            [f for f in _frames(write) if f[0] == 0x1] for write in transport.writes
        ]  # HEADERS frames: one per call
        assert [len(s) for s in streams] == [FLUSH_EVERY, FLUSH_EVERY, 3]
        conn.close()

    run(main)


def _frame(kind: int, payload: bytes) -> bytes:
    """One HTTP/2 frame on stream 0, no flags."""
    return len(payload).to_bytes(3, "big") + bytes([kind, 0]) + bytes(4) + payload


def test_the_slot_limit_follows_the_workers_word() -> None:
    """A connection takes up to ``max(1, min(ours, the worker's
    SETTINGS_MAX_CONCURRENT_STREAMS))`` calls (what pool.WorkerClient grants slots by),
    and none after the worker's GOAWAY."""

    async def main() -> None:
        conn = WorkerConnection("worker:1", max_reply_bytes=1 << 20)
        conn.connection_made(_RecordingTransport())
        assert conn.usable and conn.slot_limit(32) == 32
        conn.data_received(_frame(0x4, (3).to_bytes(2, "big") + (3).to_bytes(4, "big")))
        assert conn.slot_limit(32) == 3 and conn.slot_limit(2) == 2
        conn.data_received(_frame(0x4, (3).to_bytes(2, "big") + (0).to_bytes(4, "big")))
        assert conn.slot_limit(32) == 1  # at least one
        conn.data_received(_frame(0x7, bytes(8)))  # GOAWAY, last stream 0, NO_ERROR
        assert not conn.usable
        conn.close()

    run(main)


def _frames(data: bytes) -> list[tuple[int, int]]:
    """(type, stream id) of each HTTP/2 frame in ``data``."""
    out = []
    at = 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at : at + 3], "big")
        out.append((data[at + 3], int.from_bytes(data[at + 5 : at + 9], "big") & 0x7FFFFFFF))
        at += 9 + length
    return out
