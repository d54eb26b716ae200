"""Waiting for a sans-IO policy's state to change: one event, re-armed on every change.

A Trio driver asks its policy a question ("may this command start?", "is the gate
open?"); when the answer is "not yet" it waits until *something* changed and asks again.
:class:`Changes` is that wait. The driver calls :meth:`Changes.notify` after every event
that may change an answer (a release, a finished load, a drained version); waiters take
:attr:`Changes.event` *before* they ask, so a change between the question and the wait
is never lost (there is no checkpoint in between).

Each notify wakes every waiter, which then re-asks the policy: the policies' questions
are a few dictionary reads, and the waits are rare (control commands, version gates),
so waking them all is simpler than keeping a queue per question, and cannot starve one.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

__all__ = ["Changes"]


class Changes:
    """A condition without a lock: wait until a predicate over some state holds."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = trio.Event()

    @property
    def event(self) -> trio.Event:
        """The event the next :meth:`notify` sets (take it before asking the question)."""
        return self._event

    def notify(self) -> None:
        """Something changed: wake every waiter."""
        self._event.set()
        self._event = trio.Event()

    async def until(self, ready: Callable[[], bool]) -> None:
        """Return once ``ready()`` is true (checked now, then after each change)."""
        while True:
            changed = self._event
            if ready():
                return
            await changed.wait()
