"""The Trio driver: one device execution at a time, around the sans-IO core.

``Scheduler`` owns a ``SchedulingPolicy`` and an ``Executor`` and does only I/O:

* ``submit`` admits a request through the policy (admission errors are raised at
  once), then waits for its answer. Leaving the wait early -- the caller's cancel
  scope, or the request's own ``deadline`` -- cancels a queued request (it never
  executes); a request already in a running batch has its result dropped.
* ``run`` (start it with ``await nursery.start(scheduler.run)``) is the dispatch
  loop: ask the policy for the next batch at ``trio.current_time()``, fail what it
  shed, ``prepare`` (weights resident; not timed), ``execute`` (timed: the learned
  cost), deliver the per-request results, ``complete``. While a batch executes the
  loop may start ``prefetch`` for the model the policy expects next.
* ``dispatch_timeout_seconds``: ``execute`` runs in a child task and the loop waits
  for it at most that long. On overrun the batch's callers get ``ExecutionFailed``
  at once, health becomes ``OVERRUN`` (not ready; new submits get ``Unavailable``)
  and the loop waits for the device to return *before* anything else runs: the
  device is never given a second execution. The real executor runs JAX with
  ``trio.to_thread.run_sync`` without abandoning the thread, so "return" means the
  device really finished.
* Shutdown (``close``/``aclose``, or cancelling ``run``): queued requests fail with
  ``Unavailable("server shutting down")``, the running execution is waited for,
  later submits fail at once.

Health is an enum with a read-only property, not a flag callers can set. All
clocks are Trio's, so ``trio.testing.MockClock`` gives exact, instant simulations.

Why one module of this size: the normal path, the dispatch timeout, the failure paths
and shutdown all answer the same table of waiters, and are only checkable side by side.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs
import trio

from reactantserver.config import SchedulerConfig
from reactantserver.errors import (
    DeadlineExceeded,
    ExecutionFailed,
    InvalidArgument,
    NotFound,
    RequestError,
    Unavailable,
)

from .policy import SchedulingPolicy
from .records import Batch, PolicyStatistics, Request

log = logging.getLogger(__name__)

SHUTTING_DOWN = "server shutting down"


class Executor(Protocol):
    """What the dispatch loop drives: the runtime, or a simulated cost model."""

    async def prepare(self, batch: Batch) -> None:
        """Make ``batch.model``'s weights resident. Not counted as compute time."""

    async def execute(self, batch: Batch) -> Sequence[Any]:
        """Run ``batch`` on the device; one result per request, in request order."""
        ...


@runtime_checkable
class Prefetcher(Protocol):
    """Optional executor extension: start loading ``model``'s weights early."""

    async def prefetch(self, model: str) -> None: ...


class Health(enum.Enum):
    """Readiness of the dispatch loop, as the admin endpoint reports it."""

    STARTING = "starting"  # constructed, run() not started yet
    READY = "ready"
    OVERRUN = "overrun"  # an execution overran dispatch_timeout_seconds and has not returned
    CLOSED = "closed"


@attrs.frozen
class SchedulerStatistics:
    """The driver's state plus the policy's counters."""

    health: Health
    #: The model whose batch is on the device right now, if any.
    executing: str | None
    #: Executions that overran dispatch_timeout_seconds.
    overruns: int
    #: Batches whose prepare or execute raised (overruns included).
    failed_dispatches: int
    policy: PolicyStatistics

    @property
    def ready(self) -> bool:
        return self.health is Health.READY


class _Waiter:
    """The answer slot of one submitted request."""

    __slots__ = ("error", "event", "value")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class Scheduler:
    """Queue requests per model and run them on one device (see the module docstring)."""

    def __init__(
        self,
        config: SchedulerConfig,
        executor: Executor,
        *,
        policy: SchedulingPolicy | None = None,
    ) -> None:
        self.config = config
        self._policy = policy if policy is not None else SchedulingPolicy(config)
        self._executor = executor
        self._timeout = config.dispatch_timeout_seconds
        if self._timeout <= 0:
            self._timeout = math.inf
        self._waiters: dict[int, _Waiter] = {}
        self._wakeup = trio.Event()
        self._stopped = trio.Event()
        self._started = False
        self._health = Health.STARTING
        self._executing: Batch | None = None
        self._prefetching = False
        self._overruns = 0
        self._failed = 0

    # ------------------------------------------------------------ the registry

    @property
    def policy(self) -> SchedulingPolicy:
        """The sans-IO core (read it; mutate models through this class)."""
        return self._policy

    def add_model(
        self,
        name: str,
        compiled_batch_sizes: Sequence[int] = (),
        *,
        coalescable: bool = True,
        weight: float | None = None,
        max_batch_size: int | None = None,
    ) -> None:
        """Register a model (see ``SchedulingPolicy.add_model``)."""
        self._policy.add_model(
            name,
            compiled_batch_sizes,
            coalescable=coalescable,
            weight=weight,
            max_batch_size=max_batch_size,
        )

    def update_model(
        self,
        name: str,
        *,
        compiled_batch_sizes: Sequence[int] | None = None,
        coalescable: bool | None = None,
        max_batch_size: int | None = None,
    ) -> None:
        """Change a model's batching; queued requests that no longer fit are refused."""
        refused = self._policy.update_model(
            name,
            compiled_batch_sizes=compiled_batch_sizes,
            coalescable=coalescable,
            max_batch_size=max_batch_size,
        )
        for request in refused:
            self._fail(
                request.seq,
                InvalidArgument(
                    f"model {name!r} was updated while the request waited and can no longer "
                    f"run a batch extent of {request.rows}"
                ),
            )

    def remove_model(self, name: str) -> None:
        """Unregister a model; its queued requests fail with ``NotFound``."""
        for request in self._policy.remove_model(name):
            self._fail(request.seq, NotFound(f"model {name!r} was unloaded"))

    def set_weight(self, name: str, weight: float) -> None:
        self._policy.set_weight(name, weight)

    def seed_cost(self, model: str, batch_size: int, seconds: float) -> None:
        """Record a warm-up measurement of ``model`` at ``batch_size``."""
        self._policy.seed_cost(model, batch_size, seconds)

    # ---------------------------------------------------------------- requests

    async def submit(
        self,
        model: str,
        payload: Any = None,
        *,
        rows: int = 1,
        deadline: float | None = None,
        group: Hashable = None,
        committed: bool = False,
    ) -> Any:
        """Queue one request and return the executor's result for it.

        ``deadline`` is an absolute ``trio.current_time()``; when it passes first the
        request is withdrawn and ``DeadlineExceeded`` is raised. Admission errors
        (``NotFound``, ``BatchTooLarge``, ``QueueFull``, ``Unavailable``...) are raised
        before anything is queued.
        """
        if self._health is Health.OVERRUN:
            raise Unavailable(
                "the device is still busy with an execution that exceeded "
                f"scheduler.dispatch_timeout_seconds={self.config.dispatch_timeout_seconds}; "
                "not ready"
            )
        now = trio.current_time()
        request = self._policy.submit(
            model,
            payload,
            now=now,
            rows=rows,
            deadline=deadline,
            group=group,
            committed=committed,
        )
        waiter = _Waiter()
        self._waiters[request.seq] = waiter
        self._wakeup.set()
        try:
            if deadline is None:  # the common case: no cancel scope to build and tear down
                await waiter.event.wait()
            else:
                with trio.move_on_at(deadline):
                    await waiter.event.wait()
        finally:
            if not waiter.event.is_set():
                # Cancelled or out of time. Queued: it never runs. Already in a
                # running batch: without a waiter its result is dropped.
                self._waiters.pop(request.seq, None)
                self._policy.cancel(request)
        if not waiter.event.is_set():
            raise DeadlineExceeded(
                f"model {model!r}: deadline passed after "
                f"{trio.current_time() - now:.3f} s waiting for the device"
            )
        if waiter.error is not None:
            # Shared executor errors are raised by several callers; start each
            # raise with a fresh traceback.
            raise waiter.error.with_traceback(None)
        return waiter.value

    # ------------------------------------------------------------------- state

    @property
    def health(self) -> Health:
        return self._health

    @property
    def ready(self) -> bool:
        """True while the loop runs and no execution is overrunning."""
        return self._health is Health.READY

    def peek_next(self) -> str | None:
        """The model most likely to run after the current batch (see the policy)."""
        return self._policy.peek_next(trio.current_time())

    def statistics(self) -> SchedulerStatistics:
        return SchedulerStatistics(
            health=self._health,
            executing=self._executing.model if self._executing is not None else None,
            overruns=self._overruns,
            failed_dispatches=self._failed,
            policy=self._policy.statistics(trio.current_time()),
        )

    # ---------------------------------------------------------------- lifetime

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The dispatch loop. Returns after ``close()`` once the device is idle."""
        if self._started:
            raise RuntimeError("Scheduler.run() can only be started once")
        self._started = True
        try:
            async with trio.open_nursery() as nursery:
                if self._health is Health.STARTING:
                    self._health = Health.READY
                task_status.started()
                await self._loop(nursery)
        finally:
            self._shut(running=True)
            self._stopped.set()

    def close(self) -> None:
        """Refuse new work and fail queued work; the running execution finishes."""
        self._shut(running=False)
        self._wakeup.set()

    async def aclose(self) -> None:
        """``close()``, then wait until ``run`` has returned (the device is idle)."""
        self.close()
        if self._started:
            await self._stopped.wait()

    def _shut(self, *, running: bool) -> None:
        self._health = Health.CLOSED
        if not self._policy.closed:
            for request in self._policy.close():
                self._fail(request.seq, Unavailable(SHUTTING_DOWN))
        if running:
            # run() is exiting: whatever still waits (a batch cut short by
            # cancellation) will never be answered by the device.
            for seq in list(self._waiters):
                self._fail(seq, Unavailable(SHUTTING_DOWN))

    # ---------------------------------------------------------------- the loop

    async def _loop(self, nursery: trio.Nursery) -> None:
        policy = self._policy
        while not policy.closed:
            decision = policy.next_batch(trio.current_time())
            for request in decision.shed:
                self._fail(request.seq, _shed_error(request))
            if decision.batch is None:
                # No checkpoint since next_batch: a submit cannot have slipped in.
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            await self._dispatch(nursery, decision.batch)

    async def _dispatch(self, nursery: trio.Nursery, batch: Batch) -> None:
        policy = self._policy
        self._executing = batch
        try:
            try:
                await self._executor.prepare(batch)
            except Exception as exc:
                self._failed += 1
                self._fail_batch(batch, _executor_error(batch, "preparing", exc))
                policy.complete(batch, 0.0, trio.current_time(), ok=False)
                return
            start = trio.current_time()
            done = trio.Event()
            outcome: list[Any] = []
            nursery.start_soon(self._execute, batch, outcome, done)
            self._maybe_prefetch(nursery)
            with trio.move_on_after(self._timeout):
                await done.wait()
            if not done.is_set():
                self._overruns += 1
                self._failed += 1
                self._health = Health.OVERRUN
                log.error(
                    "model %r: batch %d (size %d) exceeded dispatch_timeout_seconds=%s; "
                    "not ready until the device returns",
                    batch.model,
                    batch.seq,
                    batch.size,
                    self.config.dispatch_timeout_seconds,
                )
                self._fail_batch(
                    batch,
                    lambda: ExecutionFailed(
                        f"model {batch.model!r}: execution exceeded "
                        f"scheduler.dispatch_timeout_seconds="
                        f"{self.config.dispatch_timeout_seconds}"
                    ),
                )
                # Never hand the device a second execution: wait for this one.
                await done.wait()
                if self._health is Health.OVERRUN:
                    self._health = Health.READY
                    log.warning("model %r: the overrunning execution returned", batch.model)
                policy.complete(batch, trio.current_time() - start, trio.current_time(), ok=False)
                return
            elapsed = trio.current_time() - start
            result = outcome[0]
            if isinstance(result, Exception):
                self._failed += 1
                self._fail_batch(batch, _executor_error(batch, "executing", result))
                policy.complete(batch, elapsed, trio.current_time(), ok=False)
                return
            if len(result) != len(batch.requests):
                self._failed += 1
                self._fail_batch(
                    batch,
                    lambda: ExecutionFailed(
                        f"model {batch.model!r}: the executor returned {len(result)} results "
                        f"for {len(batch.requests)} requests"
                    ),
                )
                policy.complete(batch, elapsed, trio.current_time(), ok=False)
                return
            for request, value in zip(batch.requests, result, strict=True):
                waiter = self._waiters.pop(request.seq, None)
                if waiter is not None:  # None: the caller left; drop the result
                    waiter.value = value
                    waiter.event.set()
            policy.complete(batch, elapsed, trio.current_time())
        finally:
            self._executing = None

    async def _execute(self, batch: Batch, outcome: list[Any], done: trio.Event) -> None:
        try:
            outcome.append(await self._executor.execute(batch))
        except Exception as exc:
            outcome.append(exc)
        finally:
            done.set()

    def _maybe_prefetch(self, nursery: trio.Nursery) -> None:
        executor = self._executor
        if self._prefetching or not isinstance(executor, Prefetcher):
            return
        model = self._policy.peek_next(trio.current_time())
        if model is None:
            return
        self._prefetching = True

        async def prefetch() -> None:
            try:
                await executor.prefetch(model)
            except Exception:
                log.warning("prefetch of model %r failed", model, exc_info=True)
            finally:
                self._prefetching = False

        nursery.start_soon(prefetch)

    # ----------------------------------------------------------------- answers

    def _fail(self, seq: int, error: BaseException) -> None:
        waiter = self._waiters.pop(seq, None)
        if waiter is not None:
            waiter.error = error
            waiter.event.set()

    def _fail_batch(self, batch: Batch, make_error: Callable[[], BaseException]) -> None:
        for request in batch.requests:
            self._fail(request.seq, make_error())


def _shed_error(request: Request) -> DeadlineExceeded:
    return DeadlineExceeded(
        f"model {request.model!r}: shed at dispatch, the request could not finish before "
        "its deadline"
    )


def _executor_error(batch: Batch, stage: str, exc: Exception) -> Callable[[], BaseException]:
    """Per-request errors for an executor failure; logs unexpected ones once."""
    if isinstance(exc, RequestError):
        # Ours, with a message meant for the caller (e.g. NotResident): pass it on.
        return lambda: exc
    log.error(
        "model %r: %s batch %d (size %d) failed",
        batch.model,
        stage,
        batch.seq,
        batch.size,
        exc_info=exc,
    )
    name = type(exc).__name__
    return lambda: ExecutionFailed(
        f"model {batch.model!r}: {stage} the batch failed ({name}); see the worker log"
    )
