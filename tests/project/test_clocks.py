"""The suite's waiting tools (``tests/clocks.py``) do what the tests rely on.

Invariants: on ``VirtualClockLoop`` time moves only when nothing is ready, straight to the
next timer, so a timer fires at exactly its due time and never while loopback I/O is still
in flight; ``Changes.until`` returns at the first change that makes its predicate true;
``wait_until`` and ``trio_wait_until`` return at once when the condition holds and fail
after their timeout saying what was awaited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
import trio
import trio.testing
from clocks import Changes, VirtualClockLoop, trio_wait_until, wait_until

T = TypeVar("T")


def _virtual(main: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(main)


def test_the_virtual_loop_jumps_to_each_timer_exactly() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        fired: list[float] = []
        for due in (3600.0, 0.25, 7.0):
            loop.call_at(start + due, lambda: fired.append(loop.time() - start))
        await asyncio.sleep(3600.0)  # virtual-clock: an hour, at once
        return fired

    assert _virtual(main()) == [0.25, 7.0, 3600.0]


def test_loopback_io_in_flight_completes_before_time_moves() -> None:
    """A round trip over a real loopback socket, with a timer due 1 virtual second
    later: the answer comes at the virtual instant the question was sent."""

    async def main() -> tuple[bytes, float, bool]:
        loop = asyncio.get_running_loop()

        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(await reader.readexactly(5))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        timer = loop.call_later(1.0, lambda: None)
        start = loop.time()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"hello")
        answer = await reader.readexactly(5)
        took = loop.time() - start
        writer.close()
        server.close()
        await server.wait_closed()
        pending = not timer.cancelled() and loop.time() < timer.when()
        timer.cancel()
        return answer, took, pending

    assert _virtual(main()) == (b"hello", 0.0, True)


def test_changes_wake_the_waiter_once_its_condition_holds() -> None:
    async def main() -> list[int]:
        changes = Changes()
        state = [0]
        seen: list[int] = []

        async def waiter() -> None:
            await changes.until(lambda: state[0] >= 2)
            seen.append(state[0])

        task = asyncio.ensure_future(waiter())
        for value in (1, 2, 3):
            await asyncio.sleep(0)
            state[0] = value
            changes.notify()
        await task
        return seen

    assert _virtual(main()) == [2]


def test_wait_until_returns_at_once_or_says_what_it_waited_for() -> None:
    wait_until(lambda: True, timeout=0)
    with pytest.raises(AssertionError, match="not reached in 0 s: the state 42"):
        wait_until(lambda: False, timeout=0, what=lambda: "the state 42")


async def test_trio_wait_until_times_out_on_the_tests_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    await trio_wait_until(lambda: True)
    start = trio.current_time()
    with pytest.raises(AssertionError, match="not reached in 30 s: never"):
        await trio_wait_until(lambda: False, 30, "never")
    assert trio.current_time() - start == pytest.approx(30, abs=0.02)
