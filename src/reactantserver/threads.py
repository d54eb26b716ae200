"""Where blocking work runs: worker threads, or inline when a test says so.

Every Trio driver that has blocking work -- compiling, reading files, transfers, device
executions, model.py hooks -- calls it through a :data:`ThreadRunner` it was given,
``await run(fn, *args) -> fn(*args)``. In production that is :func:`in_threads`: a
worker thread under the driver's own ``trio.CapacityLimiter``, so the event loop keeps
serving and no kind of work queues behind another. Tests of the drivers on virtual time
inject a runner that calls ``fn`` inline between two checkpoints (``tests/conftest.py``'s
``inline``): then time cannot pass while work is "in flight", and after
``trio.testing.wait_all_tasks_blocked()`` whatever has not happened will not happen
until the test acts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio

__all__ = ["ThreadRunner", "in_threads"]

#: ``await run(fn, *args)`` returns ``fn(*args)``, run somewhere that may block.
ThreadRunner = Callable[..., Awaitable[Any]]


def in_threads(limiter: trio.CapacityLimiter | None = None) -> ThreadRunner:
    """Run blocking calls in worker threads, at most ``limiter``'s tokens at a time
    (Trio's default limiter when ``None``)."""
    # A partial, not a wrapping coroutine: no extra frame for every resume on the hot path.
    return partial(trio.to_thread.run_sync, limiter=limiter)
