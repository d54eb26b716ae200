"""The sans-IO scheduling core: per-model queues, three disciplines, coalescing, shedding.

``SchedulingPolicy`` holds every scheduling rule and no I/O: it is given ``now``
(seconds, any monotonic clock) with each event and returns decisions. The Trio
driver (``dispatch.Scheduler``) and the simulators call it the same way, which is
why a workload can be replayed under virtual time and why the Hypothesis state
machine in ``tests/scheduling/test_sched_properties.py`` can drive it directly.

Events and decisions::

    submit(model, payload, now=...)  -> Request      (or an admission error)
    cancel(request)                  -> bool         (True: it was queued, now it never runs)
    expire(now)                      -> requests     (queued ones whose deadline has passed)
    next_deadline()                  -> float        (the soonest deadline still queued; inf)
    next_batch(now)                  -> Decision     (a Batch to run, plus requests shed)
    complete(batch, seconds, now)    -> None         (feeds the usage and cost EMAs)
    peek_next(now)                   -> model | None (for weight prefetch)

    admit_alone(model, payload, now=...) -> Request | None   (the lone lane, below)
    dispatch_alone(request, now)     -> Decision     (= enqueue_held, then next_batch)
    enqueue_held(request)            -> None         (= what submit queued at its arrival)

**The lone lane.** A request that finds nothing queued and nothing running is the usual
case at low load, and for it the queue, the candidates' table and the deadline heap are
only passed through. ``admit_alone`` admits it (the same checks, errors and request as
``submit``) without queueing it; ``dispatch_alone`` then decides it in one step, leaving
every counter, usage and cost as ``submit`` followed by ``next_batch`` would (the
property in ``tests/scheduling/test_sched_alone.py``), and ``enqueue_held`` queues it
instead when another request comes first. The driver (``dispatch.Scheduler``) holds
such a request only until the pass that runs it.

**One batch at a time** -- or ``max_in_flight`` of them. After ``next_batch`` hands
out a batch, the next call to ``next_batch`` must wait for ``complete`` of that batch (a
``LifecycleError`` otherwise): the core models a single device. A pipelined driver
(``dispatch.py``, ``scheduler.pipeline_depth``) constructs the core with
``max_in_flight=d``: up to ``d`` batches are handed out and not completed; the driver
completes them in the order the device ran them (a batch that never reached the device,
its ``prepare`` failed, may complete out of that order). A
batch chosen while others are in flight is chosen before their device time is charged
to the fair accounts: the fair shares lag by at most ``d - 1`` batches.

**Order of a decision.** (1) Committed requests (meta-model sub-calls, queued at the
front of their model's queue) go first, oldest first. (2) Otherwise the discipline
picks a model among the *candidates* (models with queued work). (3) The model's
coalescing window is planned at a compiled size (``batching.plan_batch``) and that
prefix of its queue is taken. (4) Taken requests that cannot meet their deadline
are shed: ``now + margin >= deadline`` where ``margin`` is the learned cost of the
batch under ``edf`` and 0 otherwise (and always 0 for committed requests); the
survivors run at the smallest compiled size that holds them. If every taken
request was shed the core decides again, so a decision returns either a batch or
an empty set of queues.

**Deadlines while queued.** Every queued request with a deadline is also in a heap by
deadline, so the driver can sleep until the soonest one (``next_deadline``) and fail
those that passed (``expire``, which marks them ``SHED``) without a timer per request.
The heap drops entries that left the queue lazily and is rebuilt when they outnumber
the queued ones.

**Disciplines.** ``fifo``: the model whose head is oldest. ``edf``: the model holding
the soonest deadline anywhere in its queue (no deadline = least urgent), then the
oldest head; queues themselves are never reordered. ``fair`` (the default)::

    priority_i = clamp(w_i / W - u_i / U, -cap, cap) / cost_i[B_i]

the highest wins (ties: older head). ``u_i`` is model i's device time, an EMA with
half-life ``ema_halflife_seconds``; ``cap`` is ``recency_penalty_cap``; ``cost_i[B_i]``
the learned cost of the batch it would run. A model behind its weighted share has a
positive gap and beats every model ahead of it; among those behind, the one that
closes the most gap per device second wins.

**Where we depart from the original, and why.**

* ``W`` and ``U`` sum over the candidates, not over every loaded model. With the
  original's sums, idle models dilute the weight shares of busy ones: with 100 models
  loaded and two busy, both busy models sit far above a 1 % "share", both gaps clamp
  at ``-cap``, and ``-cap / cost`` makes the *more expensive* model win every time --
  a cheap model then gets about 1 % of the device. Over the candidates the gaps sum
  to zero, and the comparison is among the models actually competing.
* A model that (re)joins the candidates has its usage lifted to the current service
  level: ``u_i := max(u_i, w_i * L)`` where ``L`` is the smallest ``u_j / w_j`` among the
  candidates at the last decision (decayed to now). This is start-time fair
  queueing's ``S = max(F, V)`` in EMA units. Without it a model returning from idle
  with a near-zero EMA would own the device until its EMA caught up (tens of seconds
  at the default half-life) while every other backlogged model waited, and a model
  that ran alone on an idle device would afterwards be penalised for it. With it, a
  newcomer competes as if it had been as far behind as the most-behind contender --
  no banked credit -- while a model that really did exceed its share keeps that debt.
* ``coalescing_discount`` is gone: it multiplied every candidate's cost by the same
  factor and so never changed a decision.
* Survivors of shedding run at the smallest size that holds them, not the planned size.
* A request larger than every compiled size is refused at admission
  (``BatchTooLarge``); a full queue refuses with ``QueueFull`` (RESOURCE_EXHAUSTED,
  not the original's INTERNAL). Committed sub-calls bypass the queue cap: refusing
  one would waste the work its meta request already did, and they are bounded by
  ``meta_concurrency``.

**Cost of a decision.** Candidates live in ``candidates.CandidateTable``, a dense numpy
table rewritten only for models that changed since the last decision; a decision is
a constant number of vectorised operations over the candidates, plus planning the
winner's batch (bounded by its largest compiled size). Nothing is proportional to
the number of models loaded. A lone candidate (the usual case at low load) is chosen
without the table: only its plan is made, and its slot is rewritten when a second
candidate joins (every reader of the table refreshes it first).

**Invariants** (the executable spec in ``tests/scheduling/test_sched_properties.py``): every
request leaves ``QUEUED`` exactly once; requests of a model are dispatched in
queue order; batches respect the compiled sizes and the cap and never split a
request; queues never exceed ``max_queue_depth`` (committed requests aside).

Why one module of this size: the class holds every scheduling rule, and the invariants
above are about its fields together (h11's ``_state.py`` habit); the parts that stand on
their own -- batch planning, cost EMAs, queues, the candidate table -- are modules of
their own.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Hashable, Iterable, Sequence
from types import MappingProxyType
from typing import Any

from reactantserver.config import SchedulerConfig
from reactantserver.errors import (
    BatchTooLarge,
    ConfigError,
    DeadlineExceeded,
    InvalidArgument,
    LifecycleError,
    NotFound,
    QueueFull,
    Unavailable,
)

from .batching import Plan, plan_batch, shrink_size
from .candidates import CandidateTable
from .cost import CostTable, decayed
from .queues import ModelQueue
from .records import (
    Batch,
    Decision,
    ModelStatistics,
    PolicyStatistics,
    Request,
    RequestState,
)


class _Model:
    """Everything the core knows about one model. Private: statistics() is the view."""

    __slots__ = (
        "cancelled",
        "coalescable",
        "compute_seconds",
        "costs",
        "dispatches",
        "failures",
        "max_batch_size",
        "name",
        "plan",
        "queue",
        "rejected",
        "requests",
        "rows",
        "shed",
        "sizes",
        "stamp",
        "usage",
        "weight",
    )

    def __init__(
        self,
        name: str,
        sizes: tuple[int, ...],
        coalescable: bool,
        weight: float,
        max_batch_size: int,
        alpha: float,
    ) -> None:
        self.name = name
        self.sizes = sizes
        self.coalescable = coalescable
        self.weight = weight
        self.max_batch_size = max_batch_size
        self.queue = ModelQueue()
        self.costs = CostTable(alpha)
        self.usage = 0.0
        self.stamp = 0.0
        self.plan: Plan | None = None
        self.requests = self.rows = self.dispatches = self.failures = 0
        self.shed = self.cancelled = self.rejected = 0
        self.compute_seconds = 0.0

    def plan_next(self) -> Plan:
        """The batch this model would run now (its queue must not be empty)."""
        if not self.coalescable:
            head = self.queue.head
            return Plan(size=head.rows, count=1, rows=head.rows)
        return plan_batch(self.sizes, (r.rows for r in self.queue.window()), self.max_batch_size)

    def plan_alone(self, rows: int) -> Plan:
        """``plan_next`` for a queue that holds one request of ``rows`` rows."""
        if not self.coalescable:
            return Plan(size=rows, count=1, rows=rows)
        return plan_batch(self.sizes, (rows,), self.max_batch_size)

    def effective_max_batch(self) -> int:
        if not self.sizes:
            return 0
        top = self.sizes[-1]
        return top if self.max_batch_size <= 0 else min(top, self.max_batch_size)


def _check_sizes(name: str, sizes: Iterable[int]) -> tuple[int, ...]:
    out = tuple(sorted(set(sizes)))
    if any(not isinstance(s, int) or s < 1 for s in out):
        raise InvalidArgument(
            f"model {name!r}: compiled batch sizes must be positive integers; got {list(out)}"
        )
    return out


def check_weight(name: str, weight: float) -> float:
    """``weight`` if it is a valid fair share (finite, > 0), else ``InvalidArgument``.

    The one check of a share weight: the scheduler's registry and SetModelPolicy both
    call it, so a weight refused over gRPC and one refused here read the same.
    """
    if not (math.isfinite(weight) and weight > 0):
        raise InvalidArgument(f"model {name!r}: weight must be finite and > 0, got {weight!r}")
    return float(weight)


def _check_cap(name: str, cap: int) -> int:
    if cap < 0:
        raise InvalidArgument(f"model {name!r}: max_batch_size must be >= 0; got {cap}")
    return cap


class SchedulingPolicy:
    """The scheduling core (see the module docstring for the rules)."""

    def __init__(self, config: SchedulerConfig, *, max_in_flight: int = 1) -> None:
        if max_in_flight < 1:
            raise ConfigError(f"scheduler.pipeline_depth: must be >= 1; got {max_in_flight}")
        if config.ema_halflife_seconds <= 0:
            raise ConfigError(
                f"scheduler.ema_halflife_seconds: must be > 0; got {config.ema_halflife_seconds}"
            )
        if config.max_queue_depth < 1:
            raise ConfigError(
                f"scheduler.max_queue_depth: must be >= 1; got {config.max_queue_depth}"
            )
        if not 0.0 < config.cost_ema_alpha <= 1.0:
            raise ConfigError(
                f"scheduler.cost_ema_alpha: must be in (0, 1]; got {config.cost_ema_alpha}"
            )
        self.config = config
        self.discipline = config.discipline
        self._halflife = config.ema_halflife_seconds
        self._cap = config.recency_penalty_cap
        self._models: dict[str, _Model] = {}
        self._table = CandidateTable(self._halflife)
        self._dirty: set[_Model] = set()
        self._committed: list[tuple[int, Request]] = []
        #: (deadline, seq, request) of queued requests with a deadline (lazy deletion).
        self._deadlines: list[tuple[float, int, Request]] = []
        self._request_seq = itertools.count()
        self._batch_seq = itertools.count()
        #: Batches handed out and not completed, in the order they were handed out.
        self._running: dict[int, tuple[Batch, _Model]] = {}
        self.max_in_flight = max_in_flight
        self._closed = False
        # The fair service level L (smallest usage/weight among candidates at the
        # last fair decision), stored like a usage: a value and the time it was read.
        self._level = 0.0
        self._level_stamp = 0.0
        self._queued = 0
        self._totals = {"requests": 0, "rows": 0, "dispatches": 0, "shed": 0}
        self._total_compute = 0.0

    # ------------------------------------------------------------------ models

    def add_model(
        self,
        name: str,
        compiled_batch_sizes: Sequence[int] = (),
        *,
        coalescable: bool = True,
        weight: float | None = None,
        max_batch_size: int | None = None,
    ) -> None:
        """Register ``name``. Unset ``weight``/``max_batch_size`` come from the config.

        ``compiled_batch_sizes`` empty means one program that takes any batch extent:
        such a model never coalesces. ``coalescable=False`` (an unbatched tensor)
        also runs each request alone, at its own extent, which must be a compiled size.
        """
        if name in self._models:
            raise LifecycleError(f"model {name!r} is already registered with the scheduler")
        defaults = self.config.for_model(name)
        sizes = _check_sizes(name, compiled_batch_sizes)
        self._models[name] = _Model(
            name,
            sizes,
            coalescable and bool(sizes),
            check_weight(name, defaults.weight if weight is None else weight),
            _check_cap(name, defaults.max_batch_size if max_batch_size is None else max_batch_size),
            self.config.cost_ema_alpha,
        )

    def update_model(
        self,
        name: str,
        *,
        compiled_batch_sizes: Sequence[int] | None = None,
        coalescable: bool | None = None,
        max_batch_size: int | None = None,
    ) -> tuple[Request, ...]:
        """Change a model's batching in place (a version swap); its queue is kept.

        New compiled sizes forget the learned costs (seed them again). Queued
        requests the new sizes cannot run are removed and returned, for the caller
        to fail (``BatchTooLarge`` / ``InvalidArgument``).
        """
        m = self._get(name)
        if compiled_batch_sizes is not None:
            m.sizes = _check_sizes(name, compiled_batch_sizes)
            m.costs.clear()
        if coalescable is not None or compiled_batch_sizes is not None:
            wanted = m.coalescable if coalescable is None else coalescable
            m.coalescable = wanted and bool(m.sizes)
        if max_batch_size is not None:
            m.max_batch_size = _check_cap(name, max_batch_size)
        refused = [r for r in m.queue if self._admission_problem(m, r.rows) is not None]
        for request in refused:
            m.queue.remove(request)
            request.state = RequestState.REMOVED
        self._queued -= len(refused)
        self._touched(m)
        return tuple(refused)

    def remove_model(self, name: str) -> tuple[Request, ...]:
        """Unregister ``name``; returns its queued requests (now ``REMOVED``) to fail."""
        m = self._get(name)
        del self._models[name]
        self._table.discard(m)
        self._dirty.discard(m)
        dropped = m.queue.drain()
        for request in dropped:
            request.state = RequestState.REMOVED
        self._queued -= len(dropped)
        return tuple(dropped)

    def set_weight(self, name: str, weight: float) -> None:
        """Change ``name``'s fair share (takes effect at the next decision)."""
        m = self._get(name)
        m.weight = check_weight(name, weight)
        self._touched(m)

    def seed_cost(self, model: str, batch_size: int, seconds: float) -> None:
        """Set the learned cost of ``model`` at ``batch_size`` (warm-up measurement)."""
        m = self._get(model)
        m.costs.seed(batch_size, seconds)
        self._touched(m)

    def has_model(self, name: str) -> bool:
        return name in self._models

    @property
    def models(self) -> tuple[str, ...]:
        """Registered model names, in registration order."""
        return tuple(self._models)

    # ---------------------------------------------------------------- requests

    def submit(
        self,
        model: str,
        payload: Any = None,
        *,
        now: float,
        rows: int = 1,
        deadline: float | None = None,
        group: Hashable = None,
        committed: bool = False,
    ) -> Request:
        """Admit one request or raise why not (``NotFound``, ``BatchTooLarge``,
        ``InvalidArgument``, ``DeadlineExceeded``, ``QueueFull``, ``Unavailable``)."""
        m, request = self._admit(model, payload, now, rows, deadline, group, committed)
        self._queue(m, request)
        return request

    def _admit(
        self,
        model: str,
        payload: Any,
        now: float,
        rows: int,
        deadline: float | None,
        group: Hashable,
        committed: bool,
    ) -> tuple[_Model, Request]:
        """``submit``'s checks, in order, and the request they admit (not queued yet)."""
        if self._closed:
            raise Unavailable("server shutting down")
        m = self._models.get(model)
        if m is None:
            raise NotFound(f"model {model!r} is not loaded")
        problem = self._admission_problem(m, rows)
        if problem is not None:
            raise problem
        if deadline is not None and deadline <= now:
            raise DeadlineExceeded(f"model {model!r}: the request's deadline had already passed")
        if not committed and len(m.queue) >= self.config.max_queue_depth:
            m.rejected += 1
            raise QueueFull(model, self.config.max_queue_depth)
        request = Request(
            seq=next(self._request_seq),
            model=model,
            payload=payload,
            rows=rows,
            arrival=now,
            deadline=deadline,
            group=group,
            committed=committed,
        )
        return m, request

    def _queue(self, m: _Model, request: Request) -> None:
        """Queue an admitted request (``submit``'s second half, at its arrival)."""
        if not m.queue:
            self._join(m, request.arrival)
        m.queue.push(request)
        self._queued += 1
        self._dirty.add(m)
        if request.committed:
            heapq.heappush(self._committed, (request.seq, request))
        deadline = request.deadline
        if deadline is not None:
            heap = self._deadlines
            if len(heap) > 2 * self._queued + 64:
                heap[:] = [e for e in heap if e[2].state is RequestState.QUEUED]
                heapq.heapify(heap)
            heapq.heappush(heap, (deadline, request.seq, request))

    # ------------------------------------------------------- the lone lane

    def admit_alone(
        self,
        model: str,
        payload: Any = None,
        *,
        now: float,
        rows: int = 1,
        deadline: float | None = None,
        group: Hashable = None,
    ) -> Request | None:
        """``submit`` for a request that finds nothing queued and nothing running (the
        lone lane, module docstring): the same checks (raising the same errors) and the
        same request, which is *held*, not queued. None, admitting nothing, when
        something is queued or running. Follow at once -- before anything else is asked
        of the policy -- with ``dispatch_alone`` (it runs now) or ``enqueue_held`` (it
        queues as ``submit`` would have queued it at its arrival)."""
        if self._queued or self._running:
            return None
        return self._admit(model, payload, now, rows, deadline, group, False)[1]

    def enqueue_held(self, request: Request) -> None:
        """Queue a held request (``admit_alone``) as ``submit`` would have at its arrival."""
        self._queue(self._models[request.model], request)

    def dispatch_alone(self, request: Request, now: float) -> Decision:
        """``enqueue_held`` then ``next_batch(now)``, in one step for the one request there
        is: the same decision and the same state after it (the model's usage lifted at
        the request's arrival, the service level set at ``now``, the same shedding, the
        same ``Batch``), without the queue and the candidates' table it would only pass
        through. The executable spec: ``tests/scheduling/test_sched_alone.py``."""
        if self._queued or self._running:
            raise LifecycleError("dispatch_alone needs nothing queued and nothing running")
        m = self._models[request.model]
        self._lift(m, request.arrival)
        self._lone_level(m, now)
        plan = m.plan_alone(request.rows)
        deadline = request.deadline
        if deadline is not None:
            margin = m.costs.estimate(plan.size) if self.discipline == "edf" else 0.0
            if now + margin >= deadline:
                request.state = RequestState.SHED
                m.shed += 1
                self._totals["shed"] += 1
                return Decision(None, (request,))
        request.state = RequestState.DISPATCHED
        return Decision(self._dispatch(m, (request,), plan.size, plan.rows, now), ())

    def cancel(self, request: Request) -> bool:
        """Remove a queued request; ``False`` if it is no longer queued."""
        if request.state is not RequestState.QUEUED:
            return False
        m = self._models[request.model]
        m.queue.remove(request)
        request.state = RequestState.CANCELLED
        m.cancelled += 1
        self._queued -= 1
        self._touched(m)
        return True

    def expire(self, now: float) -> tuple[Request, ...]:
        """Remove the queued requests whose deadline is ``<= now`` (now ``SHED``).

        They never run; the driver answers each with DEADLINE_EXCEEDED.
        """
        heap = self._deadlines
        if not heap or heap[0][0] > now:
            return ()
        expired: list[Request] = []
        while heap and heap[0][0] <= now:
            request = heapq.heappop(heap)[2]
            if request.state is not RequestState.QUEUED:
                continue  # already dispatched, cancelled or removed
            m = self._models[request.model]
            m.queue.remove(request)
            request.state = RequestState.SHED
            m.shed += 1
            self._totals["shed"] += 1
            self._queued -= 1
            self._touched(m)
            expired.append(request)
        return tuple(expired)

    def next_deadline(self) -> float:
        """The soonest deadline among queued requests (``inf`` when none has one)."""
        heap = self._deadlines
        while heap and heap[0][2].state is not RequestState.QUEUED:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def next_batch(self, now: float) -> Decision:
        """Choose, plan and take the next batch (see the module docstring)."""
        if len(self._running) >= self.max_in_flight:
            last = next(reversed(self._running.values()))[0]
            raise LifecycleError(
                f"next_batch called while batch {last.seq} of model {last.model!r} is still "
                f"running ({len(self._running)} in flight, at most {self.max_in_flight}); "
                "complete() it first"
            )
        shed: list[Request] = []
        edf = self.discipline == "edf"
        while self._table:
            # A lone candidate wins whatever its slot says (``_choose``): nothing to compare.
            self._refresh(compare=len(self._table) > 1)
            m = self._committed_model(exclude=None) or self._choose(now)
            plan = m.plan if m.plan is not None else m.plan_next()
            taken = m.queue.take(plan.count)
            margin = m.costs.estimate(plan.size) if edf else 0.0
            survivors: list[Request] = []
            for request in taken:
                slack = 0.0 if request.committed else margin
                if request.deadline is not None and now + slack >= request.deadline:
                    request.state = RequestState.SHED
                    shed.append(request)
                else:
                    request.state = RequestState.DISPATCHED
                    survivors.append(request)
            m.shed += len(taken) - len(survivors)
            self._totals["shed"] += len(taken) - len(survivors)
            self._queued -= len(taken)
            self._touched(m)
            if not survivors:
                continue
            rows = plan.rows
            size = plan.size
            if len(survivors) < len(taken):
                rows = sum(r.rows for r in survivors)
                size = shrink_size(m.sizes, plan.size, rows) if m.coalescable else plan.size
            return Decision(self._dispatch(m, tuple(survivors), size, rows, now), tuple(shed))
        return Decision(None, tuple(shed))

    def _dispatch(
        self, m: _Model, requests: tuple[Request, ...], size: int, rows: int, now: float
    ) -> Batch:
        """The batch of ``requests`` (dispatched) at ``size``, now running."""
        learned = m.costs.fastest(size)
        batch = Batch(
            seq=next(self._batch_seq),
            model=m.name,
            size=size,
            requests=requests,
            rows=rows,
            group=requests[0].group,
            started=now,
            cost=math.inf if learned is None else learned,
        )
        self._running[batch.seq] = (batch, m)
        return batch

    def complete(
        self, batch: Batch, compute_seconds: float, now: float, *, ok: bool = True
    ) -> None:
        """Account a finished batch: usage always (the device was busy), cost and
        served counters only when ``ok`` (a failed or timed-out run is no cost sample)."""
        entry = self._running.get(batch.seq)
        if entry is None or entry[0] is not batch:
            raise LifecycleError(f"complete() of batch {batch.seq}, which is not the running one")
        m: _Model | None = self._running.pop(batch.seq)[1]
        seconds = max(compute_seconds, 0.0)
        self._totals["dispatches"] += 1
        self._total_compute += seconds
        if ok:
            self._totals["requests"] += len(batch.requests)
            self._totals["rows"] += batch.rows
        if m is None or self._models.get(m.name) is not m:
            return  # removed (or replaced) while it ran: nothing left to account to
        m.usage = decayed(m.usage, m.stamp, now, self._halflife) + seconds
        m.stamp = now
        m.dispatches += 1
        m.compute_seconds += seconds
        if ok:
            m.costs.observe(batch.size, seconds)
            m.requests += len(batch.requests)
            m.rows += batch.rows
        else:
            m.failures += 1
        self._touched(m)

    def peek_next(self, now: float) -> str | None:
        """The model most likely to run after the running batch (for weight prefetch).

        The same choice ``next_batch`` would make now, skipping the running model
        (its weights are resident already). Takes nothing from any queue.
        """
        # By name: if the running model was replaced meanwhile, its successor's
        # weights are the ones the cache holds under that name.
        last = next(reversed(self._running.values()), None)
        running = None if last is None else self._models.get(last[0].model)
        committed = self._committed_model(exclude=running)
        if committed is not None:
            return committed.name
        if not self._table:
            return None
        self._refresh()
        slot, _ = self._table.select(self.discipline, now=now, cap=self._cap, exclude=running)
        return None if slot < 0 else self._table.keys[slot].name

    def close(self) -> tuple[Request, ...]:
        """Refuse every later submit; returns all queued requests (now ``REMOVED``)."""
        self._closed = True
        dropped: list[Request] = []
        for m in self._models.values():
            dropped.extend(m.queue.drain())
            self._table.discard(m)
        for request in dropped:
            request.state = RequestState.REMOVED
        self._dirty.clear()
        self._committed.clear()
        self._deadlines.clear()
        self._queued = 0
        return tuple(dropped)

    # ----------------------------------------------------------- introspection

    @property
    def running(self) -> Batch | None:
        """The oldest batch handed out and not yet completed."""
        first = next(iter(self._running.values()), None)
        return None if first is None else first[0]

    @property
    def queued(self) -> int:
        """Requests queued over all models."""
        return self._queued

    @property
    def closed(self) -> bool:
        return self._closed

    def queue_depth(self, model: str) -> int:
        return len(self._get(model).queue)

    def queued_requests(self, model: str) -> tuple[Request, ...]:
        """A model's queue, in the order it will run."""
        return tuple(self._get(model).queue)

    def usage(self, model: str, now: float) -> float:
        """``model``'s fair account (recent device seconds) decayed to ``now``."""
        m = self._get(model)
        return decayed(m.usage, m.stamp, now, self._halflife)

    def priorities(self, now: float) -> dict[str, float]:
        """The fair priority of every candidate now (under any discipline)."""
        if not self._table:
            return {}
        self._refresh()
        usage = self._table.decayed_usage(now)
        values = self._table.fair_priorities(usage, self._cap)
        return {m.name: float(v) for m, v in zip(self._table.keys, values, strict=True)}

    def statistics(self, now: float) -> PolicyStatistics:
        """A frozen snapshot of every counter (``now`` decays the usages)."""
        models = {
            m.name: ModelStatistics(
                name=m.name,
                weight=m.weight,
                max_batch_size=m.effective_max_batch(),
                queue_depth=len(m.queue),
                queued_rows=m.queue.rows,
                requests=m.requests,
                rows=m.rows,
                dispatches=m.dispatches,
                compute_seconds=m.compute_seconds,
                shed=m.shed,
                cancelled=m.cancelled,
                rejected=m.rejected,
                failures=m.failures,
                usage=decayed(m.usage, m.stamp, now, self._halflife),
                costs=tuple(m.costs.items()),
                fastest=tuple(
                    (size, m.costs.fastest(size) or cost) for size, cost in m.costs.items()
                ),
            )
            for m in self._models.values()
        }
        return PolicyStatistics(
            discipline=self.discipline,
            models=MappingProxyType(models),
            queued=self._queued,
            requests=self._totals["requests"],
            rows=self._totals["rows"],
            dispatches=self._totals["dispatches"],
            compute_seconds=self._total_compute,
            shed=self._totals["shed"],
            running=running.model if (running := self.running) is not None else None,
        )

    # ----------------------------------------------------------------- private

    def _get(self, name: str) -> _Model:
        m = self._models.get(name)
        if m is None:
            raise NotFound(f"model {name!r} is not loaded")
        return m

    def _admission_problem(self, m: _Model, rows: int) -> Exception | None:
        if rows < 1:
            return InvalidArgument(f"model {m.name!r}: a request needs at least 1 row; got {rows}")
        if not m.sizes:
            return None
        if m.coalescable:
            if rows > m.sizes[-1]:
                return BatchTooLarge(m.name, rows, m.sizes)
            return None
        if rows not in m.sizes:
            listed = ", ".join(str(s) for s in m.sizes)
            return InvalidArgument(
                f"model {m.name!r} cannot pad or coalesce (a tensor has no batch axis), so a "
                f"request's batch extent must be one of the compiled sizes ({listed}); got {rows}"
            )
        return None

    def _join(self, m: _Model, now: float) -> None:
        """``m`` gains queued work: lift its usage to the service level, add its slot."""
        self._lift(m, now)
        self._table.add(m)

    def _lift(self, m: _Model, now: float) -> None:
        """``m``'s usage lifted to the service level at ``now`` (the module docstring)."""
        level = decayed(self._level, self._level_stamp, now, self._halflife)
        current = decayed(m.usage, m.stamp, now, self._halflife)
        m.usage = max(current, m.weight * level)
        m.stamp = now

    def _touched(self, m: _Model) -> None:
        """``m`` changed: leave the candidates if its queue emptied, else refresh later."""
        if m.queue:
            if m in self._table:
                self._dirty.add(m)
        else:
            self._table.discard(m)
            self._dirty.discard(m)
            m.plan = None

    def _refresh(self, *, compare: bool = True) -> None:
        """Rewrite the table slots of models that changed since the last decision.

        Without ``compare`` (``next_batch`` with a lone candidate) only their plans are
        made: the slots stay dirty, rewritten by the next refresh that compares."""
        if not compare:
            for m in self._dirty:
                m.plan = m.plan_next()
            return
        edf = self.discipline == "edf"
        for m in self._dirty:
            m.plan = plan = m.plan_next()
            self._table.write(
                self._table.slot(m),
                weight=m.weight,
                usage=m.usage,
                stamp=m.stamp,
                cost=m.costs.estimate(plan.size),
                deadline=m.queue.soonest_deadline() if edf else math.inf,
                head=m.queue.head.seq,
            )
        self._dirty.clear()

    def _choose(self, now: float) -> _Model:
        table = self._table
        if len(table) == 1:
            # One candidate (the usual case at low load): the discipline has nothing to
            # compare, and a few vectorised operations on one element cost more than
            # the rest of the decision. Only ``fair``'s service level needs updating.
            only: _Model = table.keys[0]
            self._lone_level(only, now)
            return only
        slot, usage = table.select(self.discipline, now=now, cap=self._cap)
        if usage is not None:
            self._level = table.service_level(usage)
            self._level_stamp = now
        chosen: _Model = table.keys[slot]
        return chosen

    def _lone_level(self, only: _Model, now: float) -> None:
        """The service level after choosing the one candidate there is (``fair`` only)."""
        if self.discipline == "fair":
            self._level = decayed(only.usage, only.stamp, now, self._halflife) / only.weight
            self._level_stamp = now

    def _committed_model(self, exclude: _Model | None) -> _Model | None:
        """The model holding the oldest queued committed request (skipping ``exclude``)."""
        heap = self._committed
        while heap and heap[0][1].state is not RequestState.QUEUED:
            heapq.heappop(heap)
        if not heap:
            return None
        if exclude is None:
            return self._models[heap[0][1].model]
        live = [r for _, r in heap if r.state is RequestState.QUEUED and r.model != exclude.name]
        if not live:
            return None
        return self._models[min(live, key=lambda r: r.seq).model]
