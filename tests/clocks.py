"""Waiting in tests without betting on the real clock.

Three tools, one each for the three kinds of wait a test has (``tests/project/test_suite_hygiene.py``
holds every other real-clock sleep in tests to a ``# real-clock: <reason>`` comment):

- :func:`wait_until` -- a condition another thread or process brings about (a server
  answering, a log line, a file): polled until it holds, returning as soon as it does,
  failing after ``timeout`` with what was awaited. The one such helper of the suite;
  :func:`trio_wait_until` is the same inside a Trio test (on ``autojump_clock`` its
  polls and its timeout are virtual).
- :class:`Changes` -- a condition inside the test's own asyncio loop (a fake worker has
  a call, a callback ran): the fake calls :meth:`Changes.notify` where its state moves
  and the test awaits :meth:`Changes.until`; nothing is polled (the asyncio twin of
  ``reactantserver.changes.Changes``, which Trio drivers use).
- :class:`VirtualClockLoop` -- timeouts and deadlines under test in asyncio code that
  reads the loop's clock (``loop.time()``, ``call_at``, ``call_later``, ``asyncio.sleep``):
  an asyncio selector loop whose clock is virtual and jumps to the next timer whenever the
  loop is idle -- pytest-trio's ``autojump_clock`` for asyncio. Real sockets work (the
  selector is real); what the loop waits for must come from the loop itself (every peer
  a server or client in this loop, no threads), since time jumps as soon as nothing is
  ready. Trio code uses pytest-trio's ``autojump_clock`` instead.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable
from typing import Any

import trio

#: Seconds between two looks at a :func:`wait_until` condition.
POLL = 0.01


def wait_until(
    predicate: Callable[[], bool], timeout: float = 60.0, what: str | Callable[[], object] = ""
) -> None:
    """Return once ``predicate()`` is true; fail after ``timeout`` real seconds (a bound for
    a broken run, not a timing: a loaded machine only makes it return later), saying
    ``what`` (called then, if a function: the state to show)."""
    give_up = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= give_up:
            said = what() if callable(what) else what
            raise AssertionError(f"not reached in {timeout} s: {said or predicate}")
        time.sleep(POLL)  # real-clock: the poll of a condition another thread or process sets


async def trio_wait_until(
    predicate: Callable[[], bool], timeout: float = 60.0, what: str = ""
) -> None:
    """:func:`wait_until` in a Trio task."""
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(POLL)  # real-clock: the poll of a condition (virtual on autojump)
        return
    raise AssertionError(f"not reached in {timeout} s: {what or predicate}")


class Changes:
    """Wakes the test's waiters each time a fake says its state changed."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` is true, looking again at each :meth:`notify`."""
        while not predicate():
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter


class _AutojumpSelector(selectors.DefaultSelector):
    """The loop's real selector, except that waiting for the next timer with nothing
    ready moves the loop's virtual clock to it instead of sleeping."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        ready: list[tuple[Any, int]] = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: only I/O (or a call from a thread) can wake it
            blocked: list[tuple[Any, int]] = super().select(None)
            return blocked
        self._loop.now += timeout
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on virtual time that jumps to the next timer whenever it is idle:
    ``loop.time()`` starts at 1000.0 and moves only by those jumps, so a deadline fires
    exactly when it is due, after everything it could race with has run."""

    def __init__(self) -> None:
        self.now = 1000.0
        super().__init__(_AutojumpSelector(self))

    def time(self) -> float:
        return self.now


__all__ = ["POLL", "Changes", "VirtualClockLoop", "trio_wait_until", "wait_until"]
