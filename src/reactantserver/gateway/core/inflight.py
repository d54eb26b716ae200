"""What is in flight at the gateway, and the rules that read it: sans-IO, one count each.

The gateway's request path decides three things for every call, and each decision reads a
count of what is in flight. The counts and the rules live here, in plain objects with no
asyncio, no socket and no clock (a time is always given as ``now``), so that a property
test can drive them (``tests/gateway/test_gateway_inflight.py``); the I/O around them -- the
proxy's :class:`~..forward.Forward`, the pool's :class:`~..pool.WorkerClient`, the
router -- only carries out what they decide:

**Admission** (:class:`Admission`, one per gateway). Every call the gateway serves is
counted from arrival to answer (``calls``); a ModelInfer is also counted in ``infer``
once admitted, and is refused -- RESOURCE_EXHAUSTED, counted in ``shed`` -- when ``infer``
has reached the cap (``grpc.max_concurrent_requests_per_worker`` x workers; 0: no cap).
:class:`~.stats.GatewayStats` and the metrics read these numbers; nobody keeps another.

**Load and stream slots** (:class:`WorkerInflight`, one per worker, from the
:class:`Inflight` registry that the router and the pool share). ``load`` is what the
router accounts: ModelInfer requests routed to the worker and not yet released, with
their items and work (its routing policies read it). ``slots`` is the worker
connection's :class:`StreamSlots`: at most ``limit`` calls hold a stream slot (the
gateway's ``worker_client.max_concurrent_streams``, or fewer when the worker advertises
fewer), the others wait in one line, first come first served, each until its deadline.
A freed slot passes to the first live waiter directly (``active`` unchanged), so a
waiter can never be overtaken by a later arrival.

**Failover** (:func:`fails_over`, and :meth:`.routing.Router.failover` over a ticket's
replica order, which never repeats a worker): a call goes to its next replica only when
the worker cannot have executed it -- it answered NOT_FOUND or UNAVAILABLE, or the call
failed before it was completely sent.

Invariants (``tests/gateway/test_gateway_inflight.py`` states and checks them): every admitted
call ends exactly once; the counts go up once and down once per call and are 0 when
nothing is in flight; ``slots.active`` never exceeds the limit in force when each slot
was taken, and a slot is released exactly once on every path (answer, error, cancel,
deadline); a waiter is in the line exactly while it waits; a call never goes to the same
worker twice.
"""

from __future__ import annotations

import collections
import heapq
import math

from reactantserver.errors import LifecycleError
from reactantserver.grpcwire import StatusCode

#: Worker statuses after which the request cannot have run (NOT_FOUND, UNAVAILABLE).
FAILOVER_STATUSES = frozenset({StatusCode.NOT_FOUND, StatusCode.UNAVAILABLE})


def fails_over(status: int | None, *, unprocessed: bool = False) -> bool:
    """May a call go to its next replica after this outcome? ``status`` is the worker's
    gRPC status, None when the call got no answer (then ``unprocessed``: the worker cannot
    have run it, as nothing was completely sent)."""
    if status is None:
        return unprocessed
    return status in FAILOVER_STATUSES


class Admission:
    """The gateway's calls in flight and its admission cap (module docstring)."""

    __slots__ = ("calls", "cap", "infer", "shed")

    def __init__(self, cap: int = 0) -> None:
        #: ModelInfer calls in flight at most (0: no cap).
        self.cap = cap
        #: Calls being served now (every RPC).
        self.calls = 0
        #: ModelInfer calls admitted and not yet answered.
        self.infer = 0
        #: ModelInfer calls refused by the cap.
        self.shed = 0

    def enter(self) -> None:
        """A call arrived (any RPC but ModelInfer: :meth:`admit`); :meth:`leave` once when
        it is answered."""
        self.calls += 1

    def admit(self) -> bool:
        """A ModelInfer arrived (counted as :meth:`enter` does): admit it under the cap
        (True), or refuse it and count it shed; :meth:`leave` once either way."""
        self.calls += 1
        if self.cap and self.infer >= self.cap:
            self.shed += 1
            return False
        self.infer += 1
        return True

    def leave(self, admitted: bool) -> None:
        """The call that :meth:`enter` counted is answered (``admitted``: :meth:`admit`
        said True for it)."""
        self.calls -= 1
        if admitted:
            self.infer -= 1
        if self.calls < 0 or self.infer < 0:
            raise LifecycleError("gateway admission: a call left twice")


class Load:
    """Routed and not yet released, on one worker or one (model, worker) pair: requests,
    their items, and their work in the router's basis."""

    __slots__ = ("items", "requests", "work")

    def __init__(self) -> None:
        self.requests = 0
        self.items = 0
        self.work = 0.0

    def add(self, items: int, work: float) -> None:
        self.requests += 1
        self.items += items
        self.work += work

    def remove(self, items: int, work: float) -> None:
        self.requests -= 1
        self.items -= items
        self.work -= work
        if self.requests < 0 or self.items < 0:
            raise LifecycleError("gateway router: in-flight count went negative")
        if self.requests == 0:
            self.items = 0
            self.work = 0.0  # no float residue once idle


class Waiter:
    """A place in a :class:`StreamSlots` line: its deadline, and whether it still waits
    (in the line: True; granted, expired or gone: False). The I/O that owns the line
    says what happens when the line decides, in :meth:`grant` and :meth:`expire`."""

    __slots__ = ("deadline", "waiting")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.waiting = False

    def grant(self) -> bool:
        """:meth:`StreamSlots.release` handed this waiter the slot: start on it (True),
        or False when the caller turned out to be gone (the slot is then released again)."""
        raise NotImplementedError

    def expire(self) -> None:
        """:meth:`StreamSlots.expire` took this waiter out of the line at its deadline."""
        raise NotImplementedError


class StreamSlots:
    """One worker connection's stream slots and the line for them (module docstring).

    The caller gives the limit in force at each :meth:`take` (the worker may lower it);
    a waiter joins with :meth:`join`, leaves with :meth:`leave` (gone) or :meth:`expire`
    (its deadline passed); :meth:`release` frees a slot or passes it to the first waiter.
    Deadlines are kept in a heap, so the I/O needs one timer, for :meth:`next_deadline`.
    """

    __slots__ = ("_arrivals", "_heap", "active", "line")

    def __init__(self) -> None:
        #: Slots held now.
        self.active = 0
        #: Waiters in arrival order (only those waiting).
        self.line: collections.deque[Waiter] = collections.deque()
        #: ``(deadline, arrival, waiter)``, a heap; entries of waiters no longer waiting
        #: are dropped when they reach the top, or when it is rebuilt at twice the line.
        self._heap: list[tuple[float, int, Waiter]] = []
        self._arrivals = 0

    def take(self, limit: int) -> bool:
        """Take a slot now if one is free under ``limit`` and nobody waits for one."""
        if self.active < limit and not self.line:
            self.active += 1
            return True
        return False

    def join(self, waiter: Waiter) -> bool:
        """Line ``waiter`` up; True when its deadline is now the earliest in the line
        (the I/O's timer should move to it)."""
        waiter.waiting = True
        self.line.append(waiter)
        heap = self._heap
        if len(heap) >= 2 * len(self.line) + 64:
            heap[:] = [entry for entry in heap if entry[2].waiting]
            heapq.heapify(heap)
        self._arrivals += 1
        heapq.heappush(heap, (waiter.deadline, self._arrivals, waiter))
        return heap[0][2] is waiter

    def leave(self, waiter: Waiter) -> None:
        """``waiter`` is gone before being granted a slot (a no-op if it was)."""
        if waiter.waiting:
            waiter.waiting = False
            self.line.remove(waiter)

    def release(self) -> Waiter | None:
        """A slot holder is done: the waiter the slot passes to (out of the line, the
        slot now its own), or None when nobody waits and the slot is free."""
        if self.line:
            waiter = self.line.popleft()
            waiter.waiting = False
            return waiter
        self.active -= 1
        if self.active < 0:
            raise LifecycleError("gateway stream slots: a slot was released twice")
        return None

    def expire(self, now: float) -> list[Waiter]:
        """The waiters whose deadline is at or before ``now``, out of the line."""
        heap = self._heap
        out = []
        while heap and heap[0][0] <= now:
            waiter = heapq.heappop(heap)[2]
            if waiter.waiting:
                self.leave(waiter)
                out.append(waiter)
        return out

    def next_deadline(self) -> float:
        """The earliest deadline of a waiter still in line (inf when none)."""
        heap = self._heap
        while heap and not heap[0][2].waiting:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf


class WorkerInflight:
    """One worker's counts (module docstring): the router's ``load`` and the worker
    connection's stream ``slots``."""

    __slots__ = ("load", "slots")

    def __init__(self) -> None:
        self.load = Load()
        self.slots = StreamSlots()


class Inflight:
    """Worker address -> its :class:`WorkerInflight`, made on first use: the one registry
    that the router accounts in and the pool's clients wait in (the metrics read both
    through their statistics)."""

    __slots__ = ("_workers",)

    def __init__(self) -> None:
        self._workers: dict[str, WorkerInflight] = {}

    def worker(self, address: str) -> WorkerInflight:
        found = self._workers.get(address)
        if found is None:
            found = self._workers[address] = WorkerInflight()
        return found
