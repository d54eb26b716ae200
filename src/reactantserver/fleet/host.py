"""The host's cores as a resource of the fleet simulator: what makes a batch slower under load.

Why
---
A worker measured at idle owns the machine: its event loop, its device thread and XLA's
threads each get a core when they want one. Under load they share the host's cores with
every other worker on the machine, the gateway and (in a benchmark) the load generator, and
each of them runs slower by the share it gets. On a 2-core machine with three CPU workers, a
gateway and a client, an execution took 1.9-2.3x its idle time (issue 45) and the simulator,
which charged device time only, predicted 3-4.6x the requests/s the fleet served. The fix is
not a fudge factor on the costs: it is to simulate the cores.

Theory of operation
-------------------
A :class:`HostModel` is one machine: ``cores`` cores, of which ``background`` are busy with
work that is not ours (measured by ``calibrate`` before it starts). Work on it runs on
*threads* -- a worker's event loop, its device thread, its copy engine; the gateway's loop;
a load generator's loop -- and each thread runs its *jobs* one at a time, in the order they
were submitted (an event loop, a device thread and a copy engine all do). A job is an amount
of CPU work (core-seconds) and a *width*, the most cores it can use at once: 1 for Python on
one thread, more for an XLA CPU execution that spreads a matrix product over the pool.

The cores are shared among the threads that have a job by **processor sharing with
caps** (water filling): if the runnable widths fit in ``cores - background``, each job
runs at its width; otherwise every job gets the same share ``s``, capped at its width, with
``sum(min(width, s)) = cores - background``. A job's completion time therefore depends on
what else runs: the model is event driven -- :meth:`advance` moves every running job on
by its rate since the last change, :meth:`next_completion` says when the next one ends --
and it is sans-IO: given ``now``, returning what finished. The simulator keeps one pending
event per host and ignores stale ones (:attr:`version`).

What it does not model: the GIL between a worker's loop and its device thread (each is a
thread of its own here), time slices (a share is fluid: a scheduler runs a short job to
the end instead, which changes no mean), and cache or memory-bandwidth contention (they show
up as a lower share measured in ``background``, or not at all).

Invariants (``tests/planning/test_fleet_host.py``): work is conserved (a job finishes exactly when
its work has been done at the rates it was given); the cores given out never exceed
``cores - background`` and never exceed a job's width; a thread runs one job at a time, in
submission order; with the widths fitting, every job finishes ``work / width`` after it
started, as at idle.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Hashable, Mapping

import attrs

__all__ = ["HostCosts", "HostModel", "Hosts", "share_rates"]

#: Work below this many core-seconds counts as done (float residue of rate x time).
_EPSILON = 1e-12


@attrs.frozen(kw_only=True)
class HostCosts:
    """What one worker spends on its host's cores besides the device, at idle.

    ``calibrate`` measures each figure on a live worker with nothing else running: the CPU
    of the worker's event-loop thread per request and per execution (least squares over
    runs with different batch fills), the cores an execution's work needs (from how much
    longer it takes with one core left to it: XLA's pool on the CPU backend spins while
    it waits, so the CPU its threads burn alone overstates it), the CPU of its other
    threads per second of weight loading, and the cores the machine had free.
    """

    #: Loop CPU per request: decoding it and encoding its answer (half each way).
    request_seconds: float = 0.0
    #: Loop CPU per execution: the dispatch decision, gathering inputs, the hand-off.
    batch_seconds: float = 0.0
    #: Host cores an execution's work needs (XLA's threads on the CPU backend; 0: a device
    #: of its own, a GPU, whose execution time does not depend on the host).
    execution_threads: float = 0.0
    #: Host cores a weight load keeps busy (1: a copy by the CPU; 0: DMA).
    load_threads: float = 0.0
    #: Executions whose cost is below this run inline on the worker's event loop (the
    #: worker's ``scheduler.inline_max_seconds`` on the CPU backend; 0 on a GPU).
    inline_seconds: float = 0.0


@attrs.frozen(kw_only=True)
class Hosts:
    """The machines a simulated fleet runs on, and what shares their cores besides the
    workers (``FleetWorker.host`` names each worker's).

    A gateway and a load generator on one of the hosts spend their CPU per request there
    (half on the way in, half on the way out), and a wake-up's more on each way that finds
    their loop idle (an event loop with requests queued serves them from one wake-up: one
    epoll, one read, one write for several); on a host of their own (``None``) they cost
    no time beyond ``network_delay``.
    """

    #: Host name -> its cores.
    cores: Mapping[str, float]
    #: Host name -> threads of other processes that want a core (the mean run-queue
    #: length besides ours): they take their fair share.
    background: Mapping[str, float] = attrs.field(factory=dict)
    #: The gateway's host, and its CPU per request (one event-loop thread).
    gateway: str | None = None
    gateway_seconds: float = 0.0
    gateway_wake_seconds: float = 0.0
    #: The load generator's host, and its CPU per request (one event-loop thread).
    clients: str | None = None
    client_seconds: float = 0.0
    client_wake_seconds: float = 0.0

    def model(self, name: str) -> HostModel:
        return HostModel(name, self.cores[name], self.background.get(name, 0.0))


def share_rates(widths: list[float], capacity: float, background: float = 0.0) -> list[float]:
    """Cores given to jobs of these widths on ``capacity`` cores beside ``background``
    always-runnable threads of other processes (each wanting one core; a fraction is an
    average): each job its width when everything fits, else an equal share ``s`` capped
    at each width (and at 1 for a background thread) with the total exactly ``capacity``
    (water filling)."""
    total = math.fsum(widths) + background
    if total <= capacity:
        return list(widths)
    # (width, count, index): the background is one entry of width 1 and count b.
    items = sorted(
        [(w, 1.0, i) for i, w in enumerate(widths)]
        + ([(1.0, background, -1)] if background > 0 else [])
    )
    rates = [0.0] * len(widths)
    left, remaining = capacity, len(widths) + background
    share = capacity / remaining
    for width, count, i in items:
        share = left / remaining
        if width <= share:
            if i >= 0:
                rates[i] = width
            left -= width * count
            remaining -= count
            continue
        # Every job from here on is wider than the share: each gets the share.
        break
    for width, _, i in items:
        if i >= 0 and rates[i] == 0.0:
            rates[i] = min(width, share)
    return rates


class _Thread:
    """One thread of a host: its running job (``work`` left, ``width``, ``token``; no job
    when ``running`` is False), the jobs queued behind it, the cores it gets now, and the
    core-seconds it has done."""

    __slots__ = ("busy", "index", "name", "queue", "rate", "running", "token", "width", "work")

    def __init__(self, name: str, index: int) -> None:
        self.name = name
        #: The order it first appeared in.
        self.index = index
        self.running = False
        self.work = 0.0
        self.width = 1.0
        self.token: Hashable = None
        #: (work, width, token) of the jobs waiting behind the running one.
        self.queue: deque[tuple[float, float, Hashable]] = deque()
        self.rate = 0.0
        self.busy = 0.0


class HostModel:
    """One machine's cores shared by threads (see the module docstring).

    Cost: the simulator calls it several times per simulated request, so the running
    threads are kept in a list (in the order each thread first appeared: the order
    :meth:`advance` reports in) with their job's figures on the thread itself; the shares
    are recomputed only when the running jobs change, and a job that starts while
    everything still fits just gets its width (the others keep theirs). Every figure is the
    same float arithmetic, in the same order, as the job-by-job account before it
    (``tests/planning/test_planning_pinned.py`` pins a simulation's figures to the bit).
    """

    def __init__(self, name: str, cores: float, background: float = 0.0) -> None:
        if not cores > 0:
            raise ValueError(f"host {name}: cores must be > 0; got {cores}")
        if not background >= 0:
            raise ValueError(f"host {name}: background must be >= 0 threads; got {background}")
        self.name = name
        self.cores = cores
        self.capacity = cores
        self.background = background
        #: Every thread seen, in the order it first appeared.
        self._threads: dict[str, _Thread] = {}
        #: The threads that have a job, in that order, and their jobs' widths.
        self._running: list[_Thread] = []
        self._widths: list[float] = []
        #: Whether every running job gets its width (no sharing).
        self._fits = True
        self._now = 0.0
        #: Changes whenever completion times may have changed: an event the simulator
        #: scheduled for an older version is stale.
        self.version = 0

    @property
    def busy(self) -> dict[str, float]:
        """Core-seconds done so far, per thread (accounting for reports)."""
        return {name: th.busy for name, th in self._threads.items()}

    def submit(self, now: float, thread: str, work: float, width: float, token: Hashable) -> None:
        """Queue a job of ``work`` core-seconds, at most ``width`` cores, on ``thread``."""
        if not width > 0:
            raise ValueError(f"job width must be > 0; got {width}")
        if now > self._now:
            self._progress(now)
        th = self._threads.get(thread)
        if th is None:
            th = self._threads[thread] = _Thread(thread, len(self._threads))
        work = max(0.0, work)
        if th.running:
            th.queue.append((work, width, token))
            return
        th.running = True
        th.work, th.width, th.token = work, width, token
        running, widths = self._running, self._widths
        at = len(running)
        if at and running[-1].index > th.index:
            at = bisect.bisect(running, th.index, key=_index)
        running.insert(at, th)
        widths.insert(at, width)
        if self._fits and math.fsum(widths) + self.background <= self.capacity:
            # Everything still fits: the others keep their widths, this one gets its own.
            th.rate = width
            self.version += 1
        else:
            self._share()

    def advance(self, now: float) -> list[Hashable]:
        """Run every job on to ``now``; return the tokens of the jobs that finished (by
        thread, in submission order). The next job of each such thread starts at once."""
        if now > self._now:
            self._progress(now)
        done: list[Hashable] = []
        for th in self._running:
            # The running job is done with no work left, or so little that it would end
            # within a nanosecond (the float residue of rate x time: it must not re-arm an
            # event at the same time); the residue is counted as done. Jobs of no work
            # queued behind it finish now as well; any other waits for its own turn.
            work = th.work
            if work > _EPSILON and work > th.rate * 1e-9:
                continue
            th.busy += work
            done.append(th.token)
            queue = th.queue
            th.running = False
            while queue:
                work, width, token = queue.popleft()
                if work <= _EPSILON:
                    th.busy += work
                    done.append(token)
                    continue
                th.running = True
                th.work, th.width, th.token = work, width, token
                break
        if done:
            running = self._running = [th for th in self._running if th.running]
            self._widths = [th.width for th in running]
            self._share()
        return done

    def next_completion(self) -> float:
        """When the next job finishes if nothing changes (``inf``: nothing runs)."""
        soonest = math.inf
        now = self._now
        for th in self._running:
            rate = th.rate
            if rate > 0:
                t = now + th.work / rate
                if t < soonest:
                    soonest = t
        return soonest

    def busy_seconds(self, now: float) -> float:
        """Core-seconds done by every thread up to ``now`` (changes nothing)."""
        elapsed = max(0.0, now - self._now)
        # fsum: the same total on every Python (sum() of floats is compensated from 3.12).
        running = math.fsum(min(th.work, th.rate * elapsed) for th in self._running)
        return math.fsum(th.busy for th in self._threads.values()) + running

    def running(self) -> dict[str, float]:
        """Thread -> the cores its current job gets now."""
        return {th.name: th.rate for th in self._running}

    def queued(self, thread: str) -> int:
        """Jobs on ``thread``, the running one included."""
        th = self._threads.get(thread)
        return 0 if th is None else int(th.running) + len(th.queue)

    def _progress(self, now: float) -> None:
        elapsed = now - self._now
        for th in self._running:
            done = th.rate * elapsed
            work = th.work
            if done >= work:
                done = work
            th.work = work - done
            th.busy += done
        self._now = now

    def _share(self) -> None:
        """Every running job's cores (share_rates) from ``_running`` and ``_widths``."""
        widths = self._widths
        self._fits = math.fsum(widths) + self.background <= self.capacity
        rates = widths if self._fits else share_rates(widths, self.capacity, self.background)
        for th, rate in zip(self._running, rates, strict=True):
            th.rate = rate
        self.version += 1


def _index(th: _Thread) -> int:
    return th.index
