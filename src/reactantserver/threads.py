"""Where blocking work runs: worker threads, the device thread, or inline when a test says so.

Every Trio driver that has blocking work -- compiling, reading files, transfers, device
executions, model.py hooks -- calls it through a :data:`ThreadRunner` it was given,
``await run(fn, *args) -> fn(*args)``. In production that is :func:`in_threads`: a
worker thread under the driver's own ``trio.CapacityLimiter``, so the event loop keeps
serving and no kind of work queues behind another. Tests of the drivers on virtual time
inject a runner that calls ``fn`` inline between two checkpoints (``tests/conftest.py``'s
``inline``): then time cannot pass while work is "in flight", and after
``trio.testing.wait_all_tasks_blocked()`` whatever has not happened will not happen
until the test acts.

Device executions are different: they run one at a time on long-lived threads owned by
a task of the dispatch loop's nursery, handed over synchronously (no Trio task per job),
their outcome coming back as one callback on Trio's loop -- :data:`PipelineDone`,
``done(outcome, started, finished)``, stamped on the threads with one clock
(``time.perf_counter``): when the job began and when its outputs were back, which is
what the dispatch loop charges as device time. Two shapes share that answer:

* :class:`DeviceThread` (``scheduler.pipeline_depth`` 1): one thread runs each job whole
  (gather, execute, scatter), one at a time. Keeping one thread also keeps every device
  call on the same OS thread.
* :class:`DevicePipeline` (depth > 1): two threads. The *launch* thread runs each batch's
  launch (gather, the inputs' transfer, the asynchronous program call; it returns as
  soon as the program is queued on the device) and hands the result to the *collect*
  thread, which waits for the outputs to reach the host. So launches run one at a time
  in submission order, collects run one at a time in the same order, and a collect that
  blocks on batch N's outputs never holds up the launch of batch N+1.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import outcome
import trio

__all__ = ["DevicePipeline", "DeviceThread", "PipelineDone", "ThreadRunner", "in_threads"]

#: ``await run(fn, *args)`` returns ``fn(*args)``, run somewhere that may block.
ThreadRunner = Callable[..., Awaitable[Any]]


def in_threads(limiter: trio.CapacityLimiter | None = None) -> ThreadRunner:
    """Run blocking calls in worker threads, at most ``limiter``'s tokens at a time
    (Trio's default limiter when ``None``)."""
    # A partial, not a wrapping coroutine: no extra frame for every resume on the hot path.
    return partial(trio.to_thread.run_sync, limiter=limiter)


#: ``done(outcome, started, finished)``: a device job's outcome (a pipelined job's: the
#: collect's, or the launch's error), when it began and when it finished
#: (``time.perf_counter``, on the threads).
PipelineDone = Callable[[outcome.Outcome[Any], float, float], object]


class _OwnedThreads:
    """Threads whose life is one Trio task's: :meth:`run` starts each of ``bodies`` in a
    ``to_thread`` call and, once cancelled, refuses new jobs and puts ``None`` on ``inbox``
    (the queue jobs arrive on), which ends the threads after the jobs already handed over.
    """

    def __init__(
        self, inbox: queue.SimpleQueue[Any], bodies: tuple[Callable[[], None], ...]
    ) -> None:
        self._inbox = inbox
        self._bodies = bodies
        self._token: trio.lowlevel.TrioToken | None = None
        self._closed = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the threads until cancelled; then finish every submitted job and end them."""
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            # Each thread's whole life is one to_thread call, which cannot be abandoned:
            # the nursery (and so this task) waits for the threads to end.
            for body in self._bodies:
                nursery.start_soon(partial(trio.to_thread.run_sync, body))
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._closed = True
                self._inbox.put(None)


class DeviceThread(_OwnedThreads):
    """One long-lived thread running blocking jobs one at a time, owned by a Trio task.

    Start it with ``await nursery.start(device.run)``; the thread lives as long as that
    task. :meth:`submit` hands over a job from the loop's thread (Trio or asyncio code);
    ``done(outcome, started, finished)`` is then called on Trio's loop when the job has
    returned.
    Cancelling the owner lets the job in progress finish (a device call cannot be
    interrupted), delivers its outcome, then ends the thread: a job is never abandoned.
    """

    def __init__(self, name: str = "reactantserver-device") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], PipelineDone] | None] = (
            queue.SimpleQueue()
        )
        super().__init__(self._jobs, (self._serve,))

    def submit(self, job: Callable[[], Any], done: PipelineDone) -> None:
        """Run ``job()`` on the thread, then ``done(outcome, started, finished)`` on Trio's
        loop. Raises ``RuntimeError`` once the owner has been cancelled."""
        if self._closed or self._token is None:
            raise RuntimeError("the device thread is not running")
        self._jobs.put((job, done))

    def _serve(self) -> None:
        threading.current_thread().name = self._name
        token = self._token
        assert token is not None
        while (item := self._jobs.get()) is not None:
            job, done = item
            started = time.perf_counter()
            result = outcome.capture(job)
            token.run_sync_soon(done, result, started, time.perf_counter())


class DevicePipeline(_OwnedThreads):
    """A launch thread and a collect thread, owned by a Trio task (see the module docstring).

    Start it with ``await nursery.start(pipeline.run)``. :meth:`submit` hands over one
    job, ``launch()`` then ``collect(handle)``; ``done(outcome, started, finished)`` comes
    back on Trio's loop. A launch that raises skips its collect: its error is the outcome.
    Cancelling the owner lets every job already submitted launch, collect and deliver its
    outcome, then ends both threads: a launched job is never abandoned.
    """

    def __init__(
        self, names: tuple[str, str] = ("reactantserver-device", "reactantserver-collect")
    ) -> None:
        self._names = names
        self._launches: queue.SimpleQueue[
            tuple[Callable[[], Any], Callable[[Any], Any], PipelineDone] | None
        ] = queue.SimpleQueue()
        self._collects: queue.SimpleQueue[
            tuple[Callable[[Any], Any], outcome.Outcome[Any], float, PipelineDone] | None
        ] = queue.SimpleQueue()
        # The launch thread passes the closing None on to the collector.
        super().__init__(self._launches, (self._launch_thread, self._collect_thread))

    def submit(
        self, launch: Callable[[], Any], collect: Callable[[Any], Any], done: PipelineDone
    ) -> None:
        """Launch then collect on the threads; ``done(outcome, started, finished)`` on Trio's
        loop. Raises ``RuntimeError`` once the owner has been cancelled."""
        if self._closed or self._token is None:
            raise RuntimeError("the device pipeline is not running")
        self._launches.put((launch, collect, done))

    def _launch_thread(self) -> None:
        threading.current_thread().name = self._names[0]
        while (item := self._launches.get()) is not None:
            launch, collect, done = item
            started = time.perf_counter()
            handle = outcome.capture(launch)
            self._collects.put((collect, handle, started, done))
        self._collects.put(None)

    def _collect_thread(self) -> None:
        threading.current_thread().name = self._names[1]
        token = self._token
        assert token is not None
        while (item := self._collects.get()) is not None:
            collect, handle, started, done = item
            result = (
                outcome.capture(collect, handle.value)
                if isinstance(handle, outcome.Value)
                else handle
            )
            token.run_sync_soon(done, result, started, time.perf_counter())
