"""The Trio driver: one dispatch loop around the sans-IO core.

``Scheduler`` owns a ``SchedulingPolicy``, an executor and the **table of admitted
requests** (request number -> the callback that answers it), and does only I/O: what
runs next, and when, is the policy's (``policy.py``); the loop asks it at
``trio.current_time()`` and carries out its answer.

Requests: begin -> wait -> finish
---------------------------------
* ``enqueue`` is synchronous: it admits a request through the policy (admission
  errors are raised at once), records the ``answer`` callback and, only when the
  dispatch loop is asleep with nothing to do (or the new deadline is sooner than the
  one it sleeps until), wakes it. Callable from any code on the loop's thread -- a
  Trio task, or an asyncio handler when Trio runs as asyncio's guest -- so a gRPC
  handler queues its request without a Trio task of its own.
* From then on the request is owned by this table until the loop calls its
  ``answer(value, error)`` exactly once: with its result, with the batch's error, with
  ``DeadlineExceeded`` (its deadline passed while queued, or before its batch came
  back), or with ``Unavailable`` at shutdown.
* ``withdraw`` (the caller gave up: client cancel) is synchronous too: a queued
  request never runs; one already in a launched batch has its result dropped.
* ``submit`` is the same for Trio callers: enqueue, wait on an event, withdraw if
  cancelled.

No request has a timer or a cancel scope of its own: the loop knows every queued
deadline (``policy.next_deadline``) and sleeps until its next piece of work or the
soonest deadline, whichever comes first; each time it wakes it fails what expired
(``policy.expire``).

The one loop
------------
``run`` (start it with ``await nursery.start(scheduler.run)``) is one task that keeps up
to ``d`` batches **launched** -- on the device and not landed yet -- where ``d`` is
``scheduler.pipeline_depth`` (1 by default, the CPU's). Each turn it:

1. **tends** the batches in flight (``_tend``): lands those that came back, strictly in
   launch order (charge the device time, ``complete``, ``on_batch``, ``ran`` -- weights
   released --, answer), fails expired queued requests, and runs the dispatch timeout of
   the device's *head* (the oldest launched and not landed);
2. if fewer than ``d`` are in flight and health is ``READY``, takes the policy's next
   batch (failing what it shed), ``prepare``\\ s it (weights resident; not timed) and
   **launches** it;
3. else sleeps until a batch comes back, a request arrives (only when idle), the soonest
   deadline or the head's timeout.

A launch hands a prepared batch to the **device** (:class:`Device`, the one protocol the
loop drives), which later calls back ``_back(flight, outcome, started, finished)`` on
the loop; the executor decides which device a scheduler gets, once, at construction:

* a :class:`BlockingExecutor` (the runtime's) at depth 1: a blocking ``run(batch)`` on
  the one long-lived **device thread** (:class:`~reactantserver.threads.DeviceThread`);
* a :class:`PipelinedExecutor` at depth ``d`` > 1: a blocking ``launch`` (gather, inputs
  to the device in one step, the asynchronous program call) on the launch thread and a
  blocking ``collect`` (outputs to the host, scatter) on the collect thread of a
  :class:`~reactantserver.threads.DevicePipeline`, so a collect blocked on batch N never
  holds up the launch of N+1;
* an :class:`Executor` (the cost model of ``scheduling.simulate``, test fakes) at depth
  1: an ``async execute(batch)`` run as a child task; an :class:`AsyncPipelinedExecutor`
  at depth > 1: ``async launch`` awaited by the loop (never two at once) and ``async
  collect`` as a child task -- fake devices on Trio's (virtual) clock.

Depth 1 is this loop with ``d`` = 1: a batch is launched only onto an idle device, and
the next is taken once it has landed. A batch learned tiny (its cost below
``inline_max_seconds``: the worker sets it on the CPU backend only) is the limiting
case, a launch that **completes at once**: ``run`` is called on the loop itself and the
batch lands on the spot -- for a program of tens of microseconds a thread hand-off costs
more than the program. A batch never measured at its size has cost ``inf``: a slow
program never runs inline. Inline execution is a depth-1 affair.

While the loop waits on something else with batches in flight (weights loading behind
them, or an async ``launch``; ``d`` > 1 only), a **watch** task tends the flight
meanwhile, so batches still land and the head's timeout still runs. Behind a batch in
flight, weights at hand are taken with the executor's ``prepare_now`` (no task at all);
at depth 1 nothing is in flight while a batch is prepared, so no watch is ever needed.

Invariants (``tests/scheduling/test_sched_pipeline.py`` checks them with Hypothesis against an honest
asynchronous fake device in virtual time, and over the real ``DevicePipeline`` threads
with a blocking executor -- what CUDA runs -- whose programs and weight loads finish when
the test says; ``tests/scheduling/test_sched_dispatch.py`` at depth 1):

1. The device is given programs one launch at a time, in launch order, and they are
   landed (completed, answered) in that order; at most ``d`` are launched and not landed.
2. The learned cost is device time, completion to completion: a batch is charged from
   ``max(its launch began, the previous batch's outputs were back)`` to its own outputs
   being back, on the device's clock (the threads' ``perf_counter``, or Trio's for an
   async executor). The charges of back-to-back batches tile the device's busy time
   exactly; host wall time spent waiting for an earlier batch is never charged to a
   later one. At depth 1 that is the run itself, timed where it ran: a hand-off to the
   device thread and back is not the program's cost.
3. The dispatch timeout runs from when a batch became the head (at its launch if none
   was in flight, else when the previous one landed). On overrun its callers get
   ``ExecutionFailed`` at once, health is ``OVERRUN`` (not ready; new requests get
   ``Unavailable``; nothing more is launched) until that batch lands: the device is never
   given work behind a program that may be stuck. The batches launched behind it run
   after it and are answered normally. (An inline batch cannot be timed out: it is known
   to be tiny.)
4. Weights: acquired at ``prepare``, released by ``ran`` only when that batch lands, so
   a model's weights are never evicted or replaced (a version is freed only once the
   weight provider has every release) while a launched batch uses them; a reload's drain
   counts launched batches because their requests stay in the table (``admitted``)
   until they are answered at landing.
5. Shutdown (``close``/``aclose``, or cancelling ``run``): queued requests fail
   ``Unavailable("server shutting down")``, later requests are refused at once; a batch
   already taken is launched -- unless the loop is cancelled while its weights load (its
   in-flight slot is returned, its callers told ``Unavailable``) or while, prepared, it
   waits for an overrunning head (then ``ran`` releases its weights too); every launched
   batch is waited for and landed (shielded: a cancelled loop never abandons the
   device). A ``prepare`` failure fails only its batch (it never reached the device: no
   ``on_batch``); a launch or collect failure (``ResourceExhausted`` for memory) fails
   only its batch, and the loop serves on.
6. ``withdraw`` and deadlines as above: a withdrawn request in a launched batch has its
   result dropped; a deadline passed by the time its batch lands is ``DeadlineExceeded``;
   every admitted request is answered exactly once.

The fair shares lag by at most ``d - 1`` batches (a batch is chosen before the ones in
flight are charged; ``policy.py``). Health is an enum with a read-only property, not a
flag callers can set. All clocks are Trio's, so ``trio.testing.MockClock`` gives exact,
instant simulations.

A lone request needs none of the loop's machinery (the host loop's pass)
--------------------------------------------------------------------------
In the server Trio is asyncio's guest (``transport/guest.py``): waking the dispatch loop
from a gRPC handler is a *wake-up crossing* -- Trio's I/O thread woken through a socket,
a hand-back through asyncio's self-pipe, and Trio's wait handed to that thread again
when the loop sleeps -- about 60 % of the worker's CPU per request at one in flight
(docs/benchmarks.md, "Side by side with Triton"). A batch that will run inline needs
none of it: with ``soon`` given (how to run a function on the host loop's next pass;
the worker passes ``transport.guest.call_soon``), ``enqueue`` does not wake a loop that
sleeps with nothing to do; it arms one **pass** (:meth:`Scheduler._pass`) instead, which
runs after the callback that queued the request -- so every request of the same read is
queued by then -- and is not put off for more (a pass that waited while requests kept
arriving, as this one once did for up to four reads, made a closed loop's clients
convoy: the worker sat idle while a slow client's burst trickled in, then answered it
all at once while the client sat idle; tritonclient at 64 in flight answered 7,053
requests/s that way against 10,189 without, at 0.95x the CPU per request,
docs/benchmarks.md). The pass is the loop's own turn, synchronous:
``_tend``, ``next_batch``, shedding, then for a batch learned tiny whose weights are
acquired without waiting (the executor's optional ``prepare_now``) the launch that
completes at once (``_at_once``: run, land); it repeats while the policy has batches.
Anything else -- a batch that is not tiny or whose weights must load, a deadline sooner
than the loop's sleep -- is handed to the loop (the batch taken is the loop's next,
``_handed``) and the loop is woken: the one crossing, paid only where the loop has work
of its own. A pass runs only while the loop sleeps with nothing to do (``_idle``, so
nothing is in flight) and only at depth 1: the device still gets one execution at a
time, and the policy sees the same calls in the same order.

**The lone lane.** The request that arms a pass, finding nothing queued and nothing
running, is *held* (``_alone``), not queued: ``policy.admit_alone`` makes the same checks
and the same request as ``submit``, and the pass runs it with ``policy.dispatch_alone``,
which leaves the policy exactly as ``submit`` and ``next_batch`` would have (usage lifted
at its arrival, the same decision and shedding; ``tests/scheduling/test_sched_alone.py``)
without passing it through the queue, the candidates' table and the deadline heap. At
one in flight that is every request, and it took a fifth of a lone request's CPU (the
benchmark journal). Coalescing is untouched: a second request before the pass -- the
same read, or any callback before it -- first queues the held one (``_settle_alone``),
and the pass then finds both queued. So does anything else that reads or changes the
policy before the pass (statistics, a withdrawal, a model's update or removal, close,
the loop's turn): outside the span from ``enqueue`` to its pass, no request is held.
With ``send`` given (the worker's ``transport.guest.send_held``), the lane's answer is
sent as soon as it is written, and only then is its batch accounted (``_book``: the
policy's ``complete``, ``on_batch``, the executor's ``ran`` -- the weights' release, the
batch's statistics): the client's turn starts while they run, where the read's one
``send`` would have waited for them. Every other batch is accounted before it is
answered, because an answer may finish the last request of a replaced version and the
version swap it sets off changes the model's batching, which must not take the batch's
cost sample; the lane keeps that order where it matters: anything that reaches the
scheduler from an answer's callback (that swap, a read of the policy, a new request)
first accounts the lane's batch (``_settle_alone``), and nothing else of the pass
follows a lone batch.

Why one module of this size: the normal path, the dispatch timeout, deadlines, the
failure paths and shutdown all answer the same table, and are only checkable side by
side.
"""

from __future__ import annotations

import collections
import enum
import inspect
import logging
import math
import time
from collections.abc import Callable, Hashable, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar, runtime_checkable

import attrs
import outcome
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
from reactantserver.threads import DevicePipeline, DeviceThread

from .policy import SchedulingPolicy
from .records import Batch, Decision, PolicyStatistics, Request

log = logging.getLogger(__name__)

SHUTTING_DOWN = "server shutting down"

#: ``answer(value, error)``: how the dispatch loop answers one request, exactly once.
AnswerFn = Callable[[Any, BaseException | None], object]

#: The batches' ``group`` type an executor reads (``Batch[ServedModel]`` in the worker).
G = TypeVar("G")

# ------------------------------------------------------------------ executors
# The shapes an executor comes in; ``_device`` turns one into the loop's ``Device``.


class Executor(Protocol[G]):
    """Depth 1 on Trio's clock: a simulated cost model, or a test's fake."""

    async def prepare(self, batch: Batch[G]) -> None:
        """Make ``batch.model``'s weights resident. Not counted as compute time."""

    async def execute(self, batch: Batch[G]) -> Sequence[Any]:
        """Run ``batch`` on the device; one result per request, in request order."""
        ...


@runtime_checkable
class BlockingExecutor(Protocol[G]):
    """Depth 1, one blocking call per batch: the runtime's."""

    async def prepare(self, batch: Batch[G]) -> None:
        """Make ``batch.model``'s weights resident. Not counted as compute time."""

    def run(self, batch: Batch[G]) -> Sequence[Any]:
        """Gather, execute, scatter; blocking. Called on the device thread, or inline on
        the loop for a tiny program. One result per request, in request order."""
        ...

    def ran(self, batch: Batch[G]) -> None:
        """Back on the loop after ``run``, whatever its outcome (release, statistics)."""


@runtime_checkable
class PreparesNow(Protocol[G]):
    """Optional executor extension: ``prepare`` when it needs no waiting."""

    def prepare_now(self, batch: Batch[G]) -> bool:
        """``prepare`` ``batch`` synchronously if its weights are acquired without a wait
        (resident, nothing in the way), True; else nothing is done and False."""
        ...


@runtime_checkable
class PipelinedExecutor(Protocol[G]):
    """A :class:`BlockingExecutor` whose ``run`` splits in two, for ``pipeline_depth`` > 1."""

    async def prepare(self, batch: Batch[G]) -> None: ...

    def launch(self, batch: Batch[G]) -> Any:
        """Gather, inputs to the device in one step, the asynchronous program call; returns
        a handle as soon as the program is queued (on the launch thread, in order)."""

    def collect(self, batch: Batch[G], handle: Any) -> Sequence[Any]:
        """Wait for ``launch``'s outputs to reach the host and scatter them: one result per
        request (on the collect thread, in launch order)."""
        ...

    def ran(self, batch: Batch[G]) -> None:
        """Back on the loop when the batch has landed, whatever its outcome."""


class AsyncPipelinedExecutor(Protocol[G]):
    """:class:`PipelinedExecutor` as coroutines: a fake device on Trio's (virtual) clock."""

    async def prepare(self, batch: Batch[G]) -> None: ...

    async def launch(self, batch: Batch[G]) -> Any: ...

    async def collect(self, batch: Batch[G], handle: Any) -> Sequence[Any]: ...

    def ran(self, batch: Batch[G]) -> None: ...


#: Any executor shape the scheduler accepts.
AnyExecutor = (
    Executor[Any] | BlockingExecutor[Any] | PipelinedExecutor[Any] | AsyncPipelinedExecutor[Any]
)


def can_pipeline(executor: object) -> bool:
    """Whether ``executor`` splits a batch into ``launch`` and ``collect``."""
    return callable(getattr(executor, "launch", None)) and callable(
        getattr(executor, "collect", None)
    )


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
    #: Batches run inline on the dispatch loop / on the device thread (or a child task).
    inline_dispatches: int = 0
    threaded_dispatches: int = 0
    #: The models of every batch launched and not landed yet, oldest (the device's head,
    #: ``executing``) first; at most ``pipeline_depth``.
    in_flight: tuple[str, ...] = ()
    #: Batches launched and landed through the pipeline (``pipeline_depth`` > 1).
    pipelined_dispatches: int = 0
    #: Of the inline batches, those a pass of the host loop ran (the loop asleep).
    passed_dispatches: int = 0
    #: Of those, the ones of a request that came alone: it never entered the queue (the
    #: lone lane, module docstring).
    lone_dispatches: int = 0

    @property
    def ready(self) -> bool:
        return self.health is Health.READY


#: The outcome of a launched batch not back yet.
_PENDING: Any = object()

#: ``back(flight, outcome, started, finished)``: a device is done with ``flight``.
Back = Callable[["Flight", outcome.Outcome[Any], float, float], None]


@attrs.define(eq=False)
class Flight:
    """One launched batch, from its launch to its landing."""

    batch: Batch[Any]
    #: Trio time when it became the device's head (its dispatch timeout runs from here).
    head_since: float = math.inf
    #: ``(outcome, launch began, outputs back)`` once it is back (the device's clock).
    result: Any = _PENDING
    overran: bool = False


class Device(Protocol):
    """What the loop drives: the one protocol between it and the device.

    ``waits`` says whether ``launch`` may wait (then a watch tends the flight
    meanwhile). ``run`` owns the device's threads or tasks (started in the loop's nursery);
    ``launch`` hands over one prepared batch and returns once the device has it; its
    outcome comes back later as ``back(flight, outcome, started, finished)`` on the loop,
    ``started``/``finished`` on the device's own clock. A device that can no longer take
    work (its owner cancelled: shutting down) answers ``Unavailable`` through ``back``.
    """

    waits: bool

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the device until cancelled; every launch handed over still comes back."""

    async def launch(self, flight: Flight) -> None: ...


class _OnThreads:
    """A blocking executor on the device's threads: at depth 1 ``run`` on the one
    :class:`~reactantserver.threads.DeviceThread`; deeper, ``launch`` then ``collect`` on
    a :class:`~reactantserver.threads.DevicePipeline`. Both answer ``back`` the same way."""

    waits = False

    def __init__(self, executor: Any, back: Back, *, depth: int) -> None:
        self._executor = executor
        self._back = back
        self._threads: DeviceThread | DevicePipeline = (
            DeviceThread() if depth == 1 else DevicePipeline()
        )
        self.run = self._threads.run

    async def launch(self, flight: Flight) -> None:
        executor, batch, back = self._executor, flight.batch, partial(self._back, flight)
        try:
            if isinstance(self._threads, DeviceThread):
                self._threads.submit(partial(executor.run, batch), back)
            else:
                self._threads.submit(
                    partial(executor.launch, batch), partial(executor.collect, batch), back
                )
        except RuntimeError:  # the threads' owner is cancelled: shutting down
            back(outcome.Error(Unavailable(SHUTTING_DOWN)), 0.0, 0.0)


class _OnTasks:
    """An async executor on Trio's clock: ``execute`` (depth 1), or ``launch`` awaited by
    the loop and ``collect`` (depth > 1), in child tasks of ``run``."""

    def __init__(self, executor: Any, back: Back, *, split: bool) -> None:
        self._executor = executor
        self._back = back
        self._split = split
        #: The loop awaits an async ``launch``: a watch tends the flight meanwhile.
        self.waits = split
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def launch(self, flight: Flight) -> None:
        nursery = self._nursery
        assert nursery is not None
        started = trio.current_time()
        if not self._split:
            nursery.start_soon(self._finish, flight, self._executor.execute, (), started)
            return
        try:
            with trio.CancelScope(shield=True):  # a launch is never cut in half
                handle = await self._executor.launch(flight.batch)
        except Exception as exc:
            self._back(flight, outcome.Error(exc), started, trio.current_time())
            return
        nursery.start_soon(self._finish, flight, self._executor.collect, (handle,), started)

    async def _finish(
        self, flight: Flight, step: Callable[..., Any], args: tuple[Any, ...], started: float
    ) -> None:
        try:
            # Shielded: a launched batch is never abandoned, not even by a cancelled run.
            with trio.CancelScope(shield=self._split):
                result: outcome.Outcome[Any] = outcome.Value(await step(flight.batch, *args))
        except Exception as exc:
            result = outcome.Error(exc)
        except BaseException:
            # Cancelled (abrupt shutdown): its callers hear so, and it still lands.
            self._back(
                flight, outcome.Error(Unavailable(SHUTTING_DOWN)), started, trio.current_time()
            )
            raise
        self._back(flight, result, started, trio.current_time())


def _device(executor: Any, depth: int, back: Back) -> tuple[Device, bool]:
    """The device ``executor`` is driven through at ``depth``, and whether it blocks."""
    if depth > 1:
        if inspect.iscoroutinefunction(getattr(executor, "launch", None)):
            return _OnTasks(executor, back, split=True), False
        return _OnThreads(executor, back, depth=depth), True
    if isinstance(executor, BlockingExecutor):
        return _OnThreads(executor, back, depth=1), True
    return _OnTasks(executor, back, split=False), False


class Scheduler:
    """Queue requests per model and run them on one device (see the module docstring).

    ``on_batch(batch, seconds)``, when given, is called on the loop exactly once per
    batch that reached the device -- ok or failed, overruns included; not a batch whose
    ``prepare`` failed -- right after the policy's ``complete``, with the seconds of
    device time that batch is charged (the same seconds ``complete`` learned). An
    exception it raises is logged and does not disturb the loop.

    ``pipeline_depth`` (default: ``config.pipeline_depth``, unset meaning 1) is how many
    batches may be launched and not landed; above 1 it needs an executor that splits a
    batch (``launch``/``collect``), else the loop runs at depth 1 (logged). An injected
    ``policy`` must allow as many in flight (``max_in_flight``).

    ``soon(fn)`` runs ``fn`` on the host loop's next pass and says True, or says False
    where there is no host loop (plain Trio): with it, batches that run inline are run by
    a pass of the host loop, without waking the dispatch loop (module docstring). Only
    at depth 1 with a blocking executor and inline execution on.

    ``send()``, with ``soon``, sends what the answers have written so far (the host
    loop's held writes, ``transport.guest.send_held``): a request run by the lone lane
    is answered, sent, and only then is its batch accounted (module docstring, "The lone
    lane").
    """

    def __init__(
        self,
        config: SchedulerConfig,
        executor: AnyExecutor,
        *,
        policy: SchedulingPolicy | None = None,
        inline_max_seconds: float | None = None,
        on_batch: Callable[[Batch[Any], float], None] | None = None,
        pipeline_depth: int | None = None,
        soon: Callable[[Callable[[], object]], bool] | None = None,
        send: Callable[[], object] | None = None,
    ) -> None:
        self.config = config
        depth = pipeline_depth if pipeline_depth is not None else config.pipeline_depth or 1
        if depth < 1:
            raise ValueError(f"scheduler.pipeline_depth must be >= 1; got {depth}")
        if depth > 1 and not can_pipeline(executor):
            log.info(
                "scheduler.pipeline_depth=%d: %s has no launch/collect; running at depth 1",
                depth,
                type(executor).__name__,
            )
            depth = 1
        if policy is not None and policy.max_in_flight < depth:
            raise ValueError(
                f"the policy allows {policy.max_in_flight} batch(es) in flight, "
                f"pipeline_depth is {depth}"
            )
        #: Batches launched and not landed at most (1: no pipeline).
        self.pipeline_depth = depth
        #: Called on the loop once per batch that reached the device (ok or failed,
        #: overruns included), right after ``policy.complete``, with the seconds of
        #: device time the batch is charged.
        self._on_batch = on_batch
        self._policy = (
            policy if policy is not None else SchedulingPolicy(config, max_in_flight=depth)
        )
        self._executor: Any = executor
        #: The one device the loop drives, and whether it runs blocking calls (threads).
        self._device, self._blocking = _device(executor, depth, self._back)
        #: ``ran`` at landing (every shape but ``execute``, which releases for itself).
        self._ran: Callable[[Batch[Any]], None] | None = (
            getattr(executor, "ran", None) if self._blocking or depth > 1 else None
        )
        #: Blocking ``run`` on the loop, for a launch that completes at once.
        self._run_inline: Callable[[Batch[Any]], Sequence[Any]] | None = (
            executor.run if isinstance(executor, BlockingExecutor) and depth == 1 else None
        )
        #: Launched batches not landed yet, in launch order; the oldest is the head.
        self._flight: collections.deque[Flight] = collections.deque()
        #: When the last landed batch's outputs were back (the device's clock).
        self._last_back = -math.inf
        #: Batches learned to cost less than this run inline (0: never). The worker
        #: passes 0 off the CPU backend; by default the configured value.
        self._inline_max = (
            config.inline_max_seconds if inline_max_seconds is None else inline_max_seconds
        )
        if self._run_inline is None:
            self._inline_max = 0.0
        self._timeout = config.dispatch_timeout_seconds
        if self._timeout <= 0:
            self._timeout = math.inf
        #: Runs a pass on the host loop (None: every batch is the dispatch loop's).
        self._soon = soon if self._inline_max > 0 else None
        #: Sends the answers written so far (None: they leave as the pass returns).
        self._send = send
        #: The lone lane's batch whose answer is being sent, not accounted yet:
        #: (batch, seconds, now) for ``_book``.
        self._unbooked: tuple[Batch[Any], float, float] | None = None
        #: A pass is armed (one at a time).
        self._pass_armed = False
        #: A batch a pass took and left to the loop: the loop's next (depth 1 only).
        self._handed: Batch[Any] | None = None
        #: The executor's ``prepare_now``, if it has one (asked once: a runtime-checkable
        #: Protocol's ``isinstance`` costs more than the pass it would be asked in).
        self._prepare_now = executor.prepare_now if isinstance(executor, PreparesNow) else None
        self._passed = 0
        self._lone = 0
        #: ``trio.current_time``, read straight from the run's clock while ``run`` runs:
        #: the function looks the run and its clock up on every call (three frames), and
        #: a request's path reads the time three times (``enqueue``, the pass, landing).
        self._time: Callable[[], float] = trio.current_time
        #: A request admitted alone and held for the armed pass, which runs it without the
        #: queue (``policy.dispatch_alone``); None otherwise. Anything that reads or
        #: changes the policy before that pass queues it first (``_settle_alone``).
        self._alone: Request | None = None
        #: The table: request number -> its answer callback, from enqueue to answer.
        self._answers: dict[int, AnswerFn] = {}
        # The loop's sleep: the event that ends it, whether it waits for work at all
        # (``_idle``) and the time it wakes on its own (``_wake_at``; -inf: not asleep).
        self._wakeup = trio.Event()
        self._idle = False
        self._wake_at = -math.inf
        self._stopped = trio.Event()
        self._started = False
        self._health = Health.STARTING
        #: The batch being prepared (or run inline), not launched yet.
        self._executing: Batch[Any] | None = None
        self._prefetching = False
        self._overruns = 0
        self._failed = 0
        self._inline = 0
        self._threaded = 0
        self._pipelined = 0

    # ------------------------------------------------------------ the registry

    @property
    def policy(self) -> SchedulingPolicy:
        """The sans-IO core (read it; mutate models through this class)."""
        self._settle_alone()
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
        self._settle_alone()
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
        self._settle_alone()
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
        self._settle_alone()
        for request in self._policy.remove_model(name):
            self._fail(request.seq, NotFound(f"model {name!r} was unloaded"))

    def set_weight(self, name: str, weight: float) -> None:
        self._settle_alone()
        self._policy.set_weight(name, weight)

    def seed_cost(self, model: str, batch_size: int, seconds: float) -> None:
        """Record a warm-up measurement of ``model`` at ``batch_size``."""
        self._settle_alone()
        self._policy.seed_cost(model, batch_size, seconds)

    # ---------------------------------------------------------------- requests

    def enqueue(
        self,
        model: str,
        payload: Any = None,
        *,
        answer: AnswerFn,
        rows: int = 1,
        deadline: float | None = None,
        group: Hashable = None,
        committed: bool = False,
    ) -> Request:
        """Admit one request; ``answer(value, error)`` is called exactly once, later.

        Synchronous (see the module docstring). ``deadline`` is an absolute
        ``trio.current_time()``. Admission errors (``NotFound``, ``BatchTooLarge``,
        ``QueueFull``, ``DeadlineExceeded``, ``Unavailable``...) are raised here, and
        then ``answer`` is never called.
        """
        if self._health is Health.OVERRUN:
            raise Unavailable(
                "the device is still busy with an execution that exceeded "
                f"scheduler.dispatch_timeout_seconds={self.config.dispatch_timeout_seconds}; "
                "not ready"
            )
        if self._unbooked is not None:  # an answer's callback asks: account its batch first
            self._book()
        if self._alone is not None:  # a second request before the pass: both queue
            self._settle_alone()
        elif self._idle and self._soon is not None and not self._pass_armed and not committed:
            # Alone: nothing queued, nothing running, no pass armed yet. Held for the pass
            # this arms, which runs it without the queue (module docstring).
            alone = self._policy.admit_alone(
                model, payload, now=self._time(), rows=rows, deadline=deadline,
                group=group,
            )  # fmt: skip
            if alone is not None:
                self._answers[alone.seq] = answer
                self._alone = alone
                self._arm_pass()
                if self._soon is None:  # no host loop after all: the loop's queue
                    self._settle_alone()
                return alone
        request = self._policy.submit(
            model,
            payload,
            now=self._time(),
            rows=rows,
            deadline=deadline,
            group=group,
            committed=committed,
        )
        self._answers[request.seq] = answer
        if self._idle and self._soon is not None:
            # The loop sleeps with nothing to do: a pass of the host loop runs it.
            if not self._pass_armed:
                self._arm_pass()
        elif self._idle or (deadline is not None and deadline < self._wake_at):
            # The one wake-up crossing, only when the loop sleeps (or must wake sooner).
            self._wake()
        return request

    def withdraw(self, request: Request) -> None:
        """The caller gave up: a queued request never runs, a running one's result is
        dropped, and it will not be answered. No effect once answered."""
        if self._answers.pop(request.seq, None) is not None:
            self._settle_alone()
            self._policy.cancel(request)

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
        """``enqueue`` for a Trio caller: its result, or raise its error.

        Cancelling the caller withdraws the request. When ``deadline`` passes first the
        dispatch loop answers ``DeadlineExceeded``.
        """
        done = trio.Event()
        slot: list[Any] = []

        def answer(value: Any, error: BaseException | None) -> None:
            slot.append((value, error))
            done.set()

        request = self.enqueue(
            model,
            payload,
            answer=answer,
            rows=rows,
            deadline=deadline,
            group=group,
            committed=committed,
        )
        try:
            await done.wait()
        except BaseException:
            if not done.is_set():
                self.withdraw(request)
            raise
        value, error = slot[0]
        if error is not None:
            # Shared executor errors are raised by several callers; start each
            # raise with a fresh traceback.
            raise error.with_traceback(None)
        return value

    # ------------------------------------------------------------------- state

    @property
    def health(self) -> Health:
        return self._health

    @property
    def ready(self) -> bool:
        """True while the loop runs and no execution is overrunning."""
        return self._health is Health.READY

    @property
    def admitted(self) -> int:
        """Requests in the table: queued, or in a batch being prepared, running or
        launched and not landed, and not answered yet."""
        return len(self._answers)

    def peek_next(self) -> str | None:
        """The model most likely to run after the current batch (see the policy)."""
        self._settle_alone()
        return self._policy.peek_next(trio.current_time())

    def statistics(self) -> SchedulerStatistics:
        self._settle_alone()
        flight = tuple(f.batch.model for f in self._flight)
        executing = self._executing.model if self._executing is not None else None
        return SchedulerStatistics(
            health=self._health,
            executing=flight[0] if flight else executing,
            overruns=self._overruns,
            failed_dispatches=self._failed,
            policy=self._policy.statistics(trio.current_time()),
            inline_dispatches=self._inline,
            threaded_dispatches=self._threaded,
            in_flight=flight or ((executing,) if executing is not None else ()),
            pipelined_dispatches=self._pipelined,
            passed_dispatches=self._passed,
            lone_dispatches=self._lone,
        )

    # ---------------------------------------------------------------- lifetime

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The dispatch loop. Returns after ``close()`` once the device is idle."""
        if self._started:
            raise RuntimeError("Scheduler.run() can only be started once")
        self._started = True
        self._time = trio.lowlevel.current_clock().current_time
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._device.run)
                if self._health is Health.STARTING:
                    self._health = Health.READY
                task_status.started()
                try:
                    await self._loop(nursery)
                finally:
                    # Every launched batch lands before run() goes on: never abandoned.
                    with trio.CancelScope(shield=True):
                        await self._drain()
                nursery.cancel_scope.cancel()  # the device's owner and any prefetch
        finally:
            self._shut(running=True)
            self._stopped.set()
            self._time = trio.current_time

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
        self._settle_alone()
        self._health = Health.CLOSED
        if not self._policy.closed:
            for request in self._policy.close():
                self._fail(request.seq, Unavailable(SHUTTING_DOWN))
        if running:
            # run() is exiting: whatever still waits (a batch cut short by
            # cancellation) will never be answered by the device.
            for seq in list(self._answers):
                self._fail(seq, Unavailable(SHUTTING_DOWN))

    # ---------------------------------------------------------------- the loop

    async def _loop(self, nursery: trio.Nursery) -> None:
        """Tend the flight, then take and launch a batch while fewer than
        ``pipeline_depth`` are in flight and health is ``READY``; else sleep."""
        policy = self._policy
        flight = self._flight
        depth = self.pipeline_depth
        while not policy.closed:
            now = trio.current_time()
            self._tend(now)
            if len(flight) >= depth or self._health is Health.OVERRUN:
                # Woken when a batch comes back (or by a sooner deadline).
                await self._sleep(self._until(), idle=False)
                continue
            batch, self._handed = self._handed, None
            if batch is None:
                decision = policy.next_batch(now)
                for request in decision.shed:
                    self._fail(request.seq, _shed_error(request))
                batch = decision.batch
            if batch is None:
                # No checkpoint since next_batch: nothing can have slipped in.
                await self._sleep(self._until(), idle=True)
                continue
            await self._launch(nursery, batch)

    async def _drain(self) -> None:
        """Tend the flight until every launched batch has landed (run is ending)."""
        while self._flight:
            self._tend(trio.current_time())
            if self._flight:
                await self._sleep(self._until(), idle=False)

    def _tend(self, now: float) -> None:
        """Land what came back (launch order), fail expired queued requests, run the head's
        dispatch timeout. ``_until`` then says when to look again."""
        self._settle_alone()
        flight = self._flight
        while flight and flight[0].result is not _PENDING:
            head = flight.popleft()
            result, started, ended = head.result
            self._land(head.batch, result, started, ended, head.overran, False)
            if flight:
                flight[0].head_since = now
        self._expire(now)
        if flight and not flight[0].overran and now >= flight[0].head_since + self._timeout:
            flight[0].overran = True
            self._overran(flight[0].batch)

    def _until(self) -> float:
        """When the loop must look again on its own: the soonest queued deadline, or the
        head's timeout if sooner."""
        until = self._policy.next_deadline()
        if self._flight and not self._flight[0].overran:
            until = min(until, self._flight[0].head_since + self._timeout)
        return until

    async def _sleep(self, until: float, *, idle: bool) -> None:
        """Sleep until ``_wakeup`` is set or ``until``. ``idle``: waiting for work, so
        any new request wakes it; otherwise only a sooner deadline (or a batch coming
        back) does."""
        self._wakeup = wakeup = trio.Event()
        self._idle = idle
        self._wake_at = until
        try:
            if until == math.inf:
                await wakeup.wait()
            else:
                with trio.move_on_at(until):
                    await wakeup.wait()
        finally:
            self._idle = False
            self._wake_at = -math.inf

    def _wake(self) -> None:
        """End the loop's sleep (the wake-up crossing, from the host loop)."""
        self._idle = False
        self._wake_at = -math.inf
        self._wakeup.set()

    async def _watch(self) -> None:
        """Tend the flight while the loop waits on something else (a load behind it)."""
        while True:
            self._tend(trio.current_time())
            await self._sleep(self._until(), idle=False)

    async def _watched(self, fn: Callable[[Any], Any], arg: Any) -> None:
        """``await fn(arg)``; with batches in flight, the watch tends them meanwhile."""
        if not self._flight:
            await fn(arg)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch)
            result = await outcome.acapture(fn, arg)
            nursery.cancel_scope.cancel()
        result.unwrap()

    # ------------------------------------------------------------- launching

    async def _launch(self, nursery: trio.Nursery, batch: Batch[Any]) -> None:
        """Prepare ``batch`` (weights acquired), then launch it: on the loop when it is
        tiny (it lands at once), else onto the device, queued for landing."""
        self._executing = batch
        try:
            if not await self._prepared(batch):
                return
            if self._inline_now(batch):
                self._at_once(batch)
                return
        finally:
            self._executing = None
        # The head may have overrun while this batch's weights were loading: nothing is
        # launched until it lands.
        try:
            while self._health is Health.OVERRUN:
                self._tend(trio.current_time())
                if self._health is Health.OVERRUN:
                    await self._sleep(self._until(), idle=False)
        except BaseException:
            # Cancelled while waiting (shutdown): the batch never reaches the device, so
            # it is given back here -- its weights released, its in-flight slot returned,
            # its callers told -- or the pin would stop every later control command.
            self._unlaunched(batch)
            raise
        flight = Flight(batch)
        if self._device.waits:
            await self._watched(self._device.launch, flight)
        else:
            await self._device.launch(flight)
        if not self._flight:
            flight.head_since = trio.current_time()
        self._flight.append(flight)
        self._maybe_prefetch(nursery)

    async def _prepared(self, batch: Batch[Any]) -> bool:
        """``prepare`` ``batch`` (weights acquired; not timed); on failure fail only its
        requests, charge nothing (it never reached the device) and say False. Behind a
        batch in flight, weights at hand are taken at once (``prepare_now``)."""
        try:
            if not self._flight:
                await self._executor.prepare(batch)
            elif self._prepare_now is None or not self._prepare_now(batch):
                await self._watched(self._executor.prepare, batch)
        except Exception as exc:
            self._failed += 1
            self._policy.complete(batch, 0.0, trio.current_time(), ok=False)
            self._fail_batch(batch, _executor_error(batch, "preparing", exc))
            return False
        except BaseException:
            # Cancelled while its weights loaded (shutdown): nothing was acquired (a
            # prepare that raises holds nothing); its in-flight slot is returned.
            self._policy.complete(batch, 0.0, trio.current_time(), ok=False)
            self._fail_batch(batch, lambda: Unavailable(SHUTTING_DOWN))
            raise
        return True

    def _inline_now(self, batch: Batch[Any]) -> bool:
        """Whether ``batch`` runs inline on the loop (its learned cost is tiny)."""
        return self._inline_max > 0 and (
            batch.cost < self._inline_max or self._inline_max == math.inf
        )

    def _at_once(self, batch: Batch[Any], *, lone: bool = False) -> None:
        """The launch that completes at once: ``run`` on the loop, timed, landed (a lone
        request's answer sent before ``ran``: ``_land``)."""
        run = self._run_inline
        assert run is not None
        started = time.perf_counter()
        try:
            result: outcome.Outcome[Sequence[Any]] = outcome.Value(run(batch))
        except Exception as exc:
            result = outcome.Error(exc)
        self._land(batch, result, started, time.perf_counter(), False, True, lone=lone)

    def _unlaunched(self, batch: Batch[Any]) -> None:
        """Give back a prepared batch that will never be launched (see ``_launch``): no
        device time (and no ``on_batch``: it never reached the device), weights released."""
        self._policy.complete(batch, 0.0, trio.current_time(), ok=False)
        if self._ran is not None:
            self._ran(batch)
        self._fail_batch(batch, lambda: Unavailable(SHUTTING_DOWN))

    def _back(
        self, flight: Flight, result: outcome.Outcome[Any], started: float, ended: float
    ) -> None:
        """On the loop: the device is done with ``flight``; the loop (or the watch) lands
        it in launch order."""
        flight.result = (result, started, ended)
        self._wakeup.set()

    # ------------------------------------------------------ the host loop's pass

    def _arm_pass(self) -> None:
        assert self._soon is not None
        if self._soon(self._pass):
            self._pass_armed = True
        else:  # no host loop (plain Trio): the loop's own way, from now on
            self._soon = None
            self._wake()

    def _pass(self) -> None:
        """The loop's turn, run by the host loop while the loop sleeps with nothing to do,
        for batches that run inline (module docstring, "A lone request..."); hand the
        loop the rest. A request held alone runs first, without the queue."""
        self._pass_armed = False
        alone, self._alone = self._alone, None
        policy = self._policy
        if not self._idle:
            if alone is not None:
                policy.enqueue_held(alone)
            return  # woken meanwhile (a close, a sooner deadline): the queue is the loop's
        if alone is not None:
            if policy.closed or self._health is not Health.READY:
                policy.enqueue_held(alone)
            elif not self._took(policy.dispatch_alone(alone, self._time()), lone=True):
                return
        # Nothing queued: a turn would find no batch and no deadline; the pass ends, and
        # the answers it wrote leave without waiting for that turn.
        while policy.queued and self._idle and not policy.closed and self._health is Health.READY:
            now = self._time()
            self._expire(now)  # the loop's _tend: nothing is in flight while it is idle
            if not self._took(policy.next_batch(now)):
                return

    def _took(self, decision: Decision, *, lone: bool = False) -> bool:
        """Carry out a pass's decision: fail what it shed and run its batch inline, or
        hand the batch (one that does not run inline, or whose weights are not at hand)
        to the loop. False when the pass must end there."""
        for request in decision.shed:
            self._fail(request.seq, _shed_error(request))
        batch = decision.batch
        if batch is None:
            if self._policy.next_deadline() < self._wake_at:
                self._wake()  # the loop must wake for a queued deadline sooner
            return False
        prepare_now = self._prepare_now
        if not self._inline_now(batch) or prepare_now is None or not prepare_now(batch):
            self._handed = batch  # the loop prepares and launches it
            self._wake()
            return False
        self._executing = batch
        try:
            self._passed += 1
            self._lone += lone
            self._at_once(batch, lone=lone)
        finally:
            self._executing = None
        return True

    def _settle_alone(self) -> None:
        """Queue the request held alone, if any, as ``submit`` would have at its arrival:
        from here on it is the queue's, like any other (a second request came, or
        something reads or changes the policy before the pass). Likewise account the lone
        batch whose answer is being sent, if any (``_book``)."""
        if self._unbooked is not None:
            self._book()
        if self._alone is not None:
            alone, self._alone = self._alone, None
            self._policy.enqueue_held(alone)

    def _book(self) -> None:
        """Account the lone lane's batch, answered and sent before it (``_land``): the
        policy's ``complete``, ``on_batch``, then ``ran`` -- what ``_deliver`` and
        ``_land`` do before answering any other batch."""
        unbooked, self._unbooked = self._unbooked, None
        assert unbooked is not None
        batch, seconds, now = unbooked
        try:
            self._complete(batch, seconds, now)
        finally:
            if self._ran is not None:
                self._ran(batch)

    # --------------------------------------------------------------- landing

    def _land(
        self,
        batch: Batch[Any],
        result: outcome.Outcome[Sequence[Any]],
        started: float,
        ended: float,
        overran: bool,
        inline: bool,
        *,
        lone: bool = False,
    ) -> None:
        """Charge, complete, release and answer one batch that came back (launch order):
        a flight's, or one run at once (``inline``). The lone lane's batch (``lone``, run
        by a pass with ``send`` given) that came back with its values is answered and sent
        first, then accounted (``_book``): the policy's ``complete``, ``on_batch`` and
        ``ran`` decide nothing in its answer, and the client need not wait for them."""
        seconds = max(0.0, ended - max(started, self._last_back))
        self._last_back = max(self._last_back, ended)
        if inline:
            self._inline += 1
        else:
            self._threaded += 1
            if self.pipeline_depth > 1:
                self._pipelined += 1
        send = self._send if lone else None  # (a lone batch ran inline: never overran)
        if (
            send is not None
            and isinstance(result, outcome.Value)
            and len(result.value) == len(batch.requests)
        ):
            # The lone lane: answered and sent first, accounted right after (``_book``;
            # anything that reaches the policy meanwhile -- a version swap the answer sets
            # off -- accounts it first: ``_settle_alone``).
            now = self._time()
            self._unbooked = (batch, seconds, now)
            try:
                self._answer(batch, result.value, now)
                send()
            finally:
                if self._unbooked is not None:
                    self._book()
            return
        if self._ran is not None:
            self._ran(batch)
        now = self._time()
        if overran:
            self._complete(batch, seconds, now, ok=False)
            if self._health is Health.OVERRUN:
                self._health = Health.READY
                log.warning("model %r: the overrunning execution returned", batch.model)
            return
        self._deliver(batch, result, seconds, now)

    def _overran(self, batch: Batch[Any]) -> None:
        """The head overran ``dispatch_timeout_seconds``: fail its callers now; not ready
        until it lands (``_land``)."""
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
                f"scheduler.dispatch_timeout_seconds={self.config.dispatch_timeout_seconds}"
            ),
        )

    def _expire(self, now: float) -> None:
        for request in self._policy.expire(now):
            self._fail(
                request.seq,
                DeadlineExceeded(
                    f"model {request.model!r}: deadline passed after "
                    f"{now - request.arrival:.3f} s waiting for the device"
                ),
            )

    def _deliver(
        self, batch: Batch, result: outcome.Outcome[Sequence[Any]], elapsed: float, now: float
    ) -> None:
        """Account a batch, then answer its requests from its outcome.

        Accounting comes first: an answer may finish the last request of a replaced
        version, and the version swap it sets off changes the model's batching, which
        must not receive this batch's cost sample.
        """
        if isinstance(result, outcome.Error):
            error = result.error
            if not isinstance(error, Exception):
                raise error
            self._failed += 1
            self._complete(batch, elapsed, now, ok=False)
            self._fail_batch(batch, _executor_error(batch, "executing", error))
            return
        assert isinstance(result, outcome.Value)
        values = result.value
        if len(values) != len(batch.requests):
            self._failed += 1
            self._complete(batch, elapsed, now, ok=False)
            self._fail_batch(
                batch,
                lambda: ExecutionFailed(
                    f"model {batch.model!r}: the executor returned {len(values)} results "
                    f"for {len(batch.requests)} requests"
                ),
            )
            return
        self._complete(batch, elapsed, now)
        self._answer(batch, values, now)

    def _answer(self, batch: Batch, values: Sequence[Any], now: float) -> None:
        """Answer a batch's requests with its values (one each, in order), or with
        ``DeadlineExceeded`` where the request's deadline passed before ``now``."""
        answers = self._answers
        for request, value in zip(batch.requests, values, strict=True):
            answer = answers.pop(request.seq, None)
            if answer is None:
                continue  # withdrawn: the caller left; drop the result
            if request.deadline is not None and now >= request.deadline:
                answer(
                    None,
                    DeadlineExceeded(
                        f"model {request.model!r}: deadline passed after "
                        f"{now - request.arrival:.3f} s (the batch came back too late)"
                    ),
                )
            else:
                answer(value, None)

    def _complete(self, batch: Batch, seconds: float, now: float, *, ok: bool = True) -> None:
        """``policy.complete`` of a batch that reached the device, then ``on_batch`` (see
        the class docstring) with the same seconds."""
        self._policy.complete(batch, seconds, now, ok=ok)
        if self._on_batch is not None:
            try:
                self._on_batch(batch, seconds)
            except Exception:
                log.exception("on_batch hook failed for model %r", batch.model)

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
        answer = self._answers.pop(seq, None)
        if answer is not None:
            answer(None, error)

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
