"""Corked writes and the flushes a protocol callback owes (``transport/h2conn.py``).

Invariants: a cork written to inside a connection's callback sends everything written
in one ``send`` as the outermost callback returns (not before, and before any other
callback of the loop runs), or earlier where the callback asks (``send_now``: what was
written so far); written to outside one, it sends on the loop's next pass;
a flush that fails does not keep the others from running; each thread keeps its own
owed flushes; a cork's end (with a FIN where the transport can half-close) follows
everything written before it, and nothing written after it is sent.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from reactantserver.transport.h2conn import CorkedTransport, held_writes


class _Socket:
    """The part of an asyncio transport a cork uses: what was sent, send by send."""

    def __init__(self, fail: bool = False, half_close: bool = True) -> None:
        self.sent: list[bytes] = []
        self.fail = fail
        self.half_close = half_close

    def write(self, data: bytes) -> None:
        if self.fail:
            raise RuntimeError("the socket is gone")
        self.sent.append(data)

    def is_closing(self) -> bool:
        return False

    def can_write_eof(self) -> bool:
        return self.half_close

    def write_eof(self) -> None:
        self.sent.append(b"<FIN>")


def _cork(socket: _Socket, loop: asyncio.AbstractEventLoop) -> CorkedTransport:
    return CorkedTransport(socket, loop)  # type: ignore[arg-type]


def test_writes_inside_a_callback_leave_as_it_returns() -> None:
    asyncio.run(_inside())


async def _inside() -> None:
    loop = asyncio.get_running_loop()
    a, b = _Socket(), _Socket()
    cork_a, cork_b = _cork(a, loop), _cork(b, loop)
    ran_between: list[bool] = []
    held = held_writes()
    held.enter()
    try:
        loop.call_soon(lambda: ran_between.append(True))
        cork_a.write(b"one")
        held.enter()  # a nested callback: only the outermost flushes
        cork_b.write(b"two")
        held.leave()
        cork_a.write(b"three")
        assert a.sent == [] and b.sent == []
    finally:
        held.leave()
    assert a.sent == [b"onethree"] and b.sent == [b"two"]
    assert ran_between == []  # sent before the loop ran anything else
    await asyncio.sleep(0)
    assert a.sent == [b"onethree"]  # nothing was left scheduled to send twice


def test_writes_outside_a_callback_leave_on_the_next_pass() -> None:
    asyncio.run(_outside())


async def _outside() -> None:
    loop = asyncio.get_running_loop()
    socket = _Socket()
    cork = _cork(socket, loop)
    cork.write(b"a")
    cork.write(b"b")
    assert socket.sent == []
    await asyncio.sleep(0)
    assert socket.sent == [b"ab"]


def test_a_failing_flush_does_not_keep_the_others(caplog: pytest.LogCaptureFixture) -> None:
    asyncio.run(_failing(caplog))


async def _failing(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.get_running_loop()
    broken, fine = _Socket(fail=True), _Socket()
    held = held_writes()
    held.enter()
    try:
        _cork(broken, loop).write(b"lost")
        _cork(fine, loop).write(b"kept")
    finally:
        with caplog.at_level(logging.ERROR, logger="reactantserver.transport.h2conn"):
            held.leave()
    assert fine.sent == [b"kept"]
    assert "writing a connection's output failed" in caplog.text
    assert held.depth == 0


def test_each_thread_owes_its_own_flushes() -> None:
    """A loop on another thread, writing while this thread is inside a callback,
    flushes on its own loop's next pass, never from this thread's callback."""
    socket = _Socket()
    seen: list[list[bytes]] = []

    theirs: list[object] = []

    def other_thread() -> None:
        theirs.append(held_writes())

        async def write() -> None:
            cork = _cork(socket, asyncio.get_running_loop())
            cork.write(b"x")
            await asyncio.sleep(0)
            seen.append(list(socket.sent))  # sent by its own loop's pass

        asyncio.run(write())

    held = held_writes()
    held.enter()
    try:
        thread = threading.Thread(target=other_thread, name="other")
        thread.start()
        thread.join()
    finally:
        held.leave()
    assert seen == [[b"x"]]
    assert theirs[0] is not held and held_writes() is held  # one per thread, kept


def test_work_owed_to_a_callback_runs_as_it_returns_before_its_flushes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    asyncio.run(_after(caplog))


async def _after(caplog: pytest.LogCaptureFixture) -> None:
    """``run_after``: the work runs once, at the outermost ``leave`` (not at a nested
    one), in order, with what it writes sent together with the callback's own writes in
    one ``send``; work it owes in turn runs too; a failing piece is logged and the rest
    still runs."""
    loop = asyncio.get_running_loop()
    socket = _Socket()
    cork = _cork(socket, loop)
    ran: list[str] = []
    held = held_writes()

    def answer() -> None:
        ran.append("answer")
        cork.write(b"answer")
        held.run_after(lambda: ran.append("owed by the answer"))

    def broken() -> None:
        ran.append("broken")
        raise RuntimeError("a bug in the work")

    held.enter()
    try:
        cork.write(b"read;")
        held.run_after(answer)
        held.run_after(broken)
        held.enter()
        held.leave()  # nested: nothing runs yet
        assert ran == [] and socket.sent == []
    finally:
        with caplog.at_level(logging.ERROR, logger="reactantserver.transport.h2conn"):
            held.leave()
    assert ran == ["answer", "broken", "owed by the answer"]
    assert socket.sent == [b"read;answer"]  # one send: the read's writes and the answer's
    assert "work run at the end of a protocol callback failed" in caplog.text
    assert held.depth == 0
    held.enter()
    held.leave()
    assert ran == ["answer", "broken", "owed by the answer"]  # nothing left over


def test_send_now_sends_what_was_written_so_far_and_later_writes_wait_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    asyncio.run(_send_now(caplog))


async def _send_now(caplog: pytest.LogCaptureFixture) -> None:
    """``send_now`` inside a callback: what every cork was written so far leaves at once,
    one ``send`` each, a failing one logged without keeping the others; what is written
    after it is held again and leaves as the outermost callback returns; nothing is sent
    twice."""
    loop = asyncio.get_running_loop()
    socket, broken = _Socket(), _Socket(fail=True)
    cork = _cork(socket, loop)
    held = held_writes()
    held.enter()
    try:
        cork.write(b"headers;")
        cork.write(b"answer")
        _cork(broken, loop).write(b"lost")
        with caplog.at_level(logging.ERROR, logger="reactantserver.transport.h2conn"):
            held.send_now()
        assert socket.sent == [b"headers;answer"]  # before the callback returned
        assert "writing a connection's output failed" in caplog.text
        cork.write(b"later")
        assert socket.sent == [b"headers;answer"]
    finally:
        held.leave()
    assert socket.sent == [b"headers;answer", b"later"]
    await asyncio.sleep(0)
    assert socket.sent == [b"headers;answer", b"later"]
    assert held.depth == 0


def test_the_fin_follows_what_was_written_and_nothing_after_it_is_sent() -> None:
    asyncio.run(_fin())


async def _fin() -> None:
    loop = asyncio.get_running_loop()
    plain, tls = _Socket(), _Socket(half_close=False)
    cork, cork_tls = _cork(plain, loop), _cork(tls, loop)
    for c in (cork, cork_tls):
        c.write(b"goaway")
    assert cork.end()
    assert not cork_tls.end()  # TLS cannot half-close: no FIN, but the output is over too
    cork.write(b"late")
    cork_tls.write(b"more")
    await asyncio.sleep(0)
    assert plain.sent == [b"goaway", b"<FIN>"]
    assert tls.sent == [b"goaway"]
