"""The gateway's request path as sans-IO rules: admission, failover and stream slots.

:mod:`reactantserver.gateway.core.inflight` holds the counts and rules; here they are driven the
way the gateway's I/O drives them (:class:`~reactantserver.gateway.forward.Forward` and
:class:`~reactantserver.gateway.pool.WorkerClient`), with a router sharing the same
registry, by a Hypothesis state machine and by a few plain examples.
"""

from __future__ import annotations

import gc
import math
import weakref

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from reactantserver.errors import LifecycleError
from reactantserver.gateway.core.inflight import (
    Admission,
    Inflight,
    StreamSlots,
    Waiter,
    fails_over,
)
from reactantserver.gateway.core.routing import RoundRobinRouter, Ticket
from reactantserver.gateway.core.table import ModelSnapshot, WorkerSnapshot, build_table
from reactantserver.gateway.pool import SlotWait, WorkerClient

WORKERS = ("w0", "w1", "w2")
#: The ways a call holding a slot can end on its worker.
OUTCOMES = ("ok", "error", "not_found", "unavailable", "unprocessed", "lost")
STATUS = {
    "ok": 0,
    "error": 13,
    "not_found": 5,
    "unavailable": 14,
    "unprocessed": None,
    "lost": None,
}


def _table() -> object:
    return build_table(
        None,
        [
            WorkerSnapshot(
                address=w,
                discipline="fifo",
                models=(
                    ModelSnapshot(name="m", max_batch_size=4, batch_input_name="x", batch_axis=0),
                ),
            )
            for w in WORKERS
        ],
    )


class _Call:
    """One call as the test sees it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.admitted = False
        self.ticket: Ticket | None = None
        #: "waiting" (in a worker's line), "holding" (a slot on ticket.worker), "ended".
        self.phase = "new"
        self.wait: _Wait | None = None
        self.visited: list[str] = []
        self.endings: list[str] = []


class _Wait(Waiter):
    """A call's place in a line, as the pool's waiters are: granted -> holds the slot."""

    __slots__ = ("call", "gone", "joined", "machine")

    def __init__(self, machine: InflightMachine, call: _Call, deadline: float) -> None:
        super().__init__(deadline)
        self.machine = machine
        self.call = call
        machine.joins += 1
        self.joined = machine.joins
        #: The caller went without leaving the line (a cancelled coroutine whose cleanup
        #: has not run yet): a slot handed to it is passed on.
        self.gone = False

    def grant(self) -> bool:
        if self.gone:
            return False
        self.machine.holding(self.call)
        return True

    def expire(self) -> None:
        if not self.gone:
            self.machine.end(self.call, "deadline")


class InflightMachine(RuleBasedStateMachine):
    """Calls through the admission rule, a round-robin router and three workers' stream
    slots, ended every way the gateway ends them.

    Invariants, checked after every step:

    * every call the gateway took ends exactly once -- answered, refused, failed,
      cancelled or expired -- and none is lost: at the end of every run, once the calls
      left are answered, the admission counts, every worker's load and every line are 0
      or empty;
    * ``admission.calls`` is the number of calls not yet ended and ``admission.infer``
      the number of those admitted; ``infer`` never exceeds the cap, and a call is
      refused (counted in ``shed``) only when it would have;
    * the router's load on a worker is the number of unended calls whose ticket is on
      that worker (the registry the pool's slots live in is the same object);
    * a worker's ``slots.active`` is the number of calls holding a slot there, and when
      a slot is taken it is within the limit in force (a freed slot passes to the first
      live waiter without changing the count); each slot is released exactly once, on
      every path: answer, error, cancel, deadline;
    * a worker's line holds exactly the calls waiting there (and the gone ones not yet
      cleaned up), in arrival order, each marked waiting;
    * a call never goes to the same worker twice, and fails over only after an outcome
      that proves the worker did not run it (NOT_FOUND, UNAVAILABLE, not completely sent).
    """

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.inflight = Inflight()
        self.router = RoundRobinRouter(_table(), work_basis="requests", inflight=self.inflight)  # type: ignore[arg-type]
        self.admission = Admission(cap=5)
        self.limit = dict.fromkeys(WORKERS, 2)
        self.calls: list[_Call] = []
        self.gone: list[_Wait] = []
        self.joins = 0

    # ------------------------------------------------------------ the I/O's moves

    def slots(self, worker: str) -> StreamSlots:
        return self.inflight.worker(worker).slots

    def send(self, call: _Call) -> None:
        """Forward._send: take a slot on the ticket's worker, or line up for one."""
        assert call.ticket is not None and call.ticket.worker is not None
        worker = call.ticket.worker
        assert worker not in call.visited, "a call went to the same worker twice"
        call.visited.append(worker)
        slots = self.slots(worker)
        if slots.take(self.limit[worker]):
            assert slots.active <= self.limit[worker]
            self.holding(call)
        else:
            call.phase = "waiting"
            call.wait = _Wait(self, call, self.now + 1.0)
            slots.join(call.wait)

    def holding(self, call: _Call) -> None:
        call.phase, call.wait = "holding", None

    def release(self, worker: str) -> None:
        """WorkerClient._release: the slot passes to the first live waiter, or frees."""
        slots = self.slots(worker)
        while (wait := slots.release()) is not None:
            if wait.grant():
                return

    def end(self, call: _Call, how: str) -> None:
        assert call.phase != "ended" and not call.endings, f"call {call.n} ended twice"
        call.endings.append(how)
        call.phase, call.wait = "ended", None
        if call.ticket is not None:
            self.router.release(call.ticket, "ok" if how == "ok" else "error")
        self.admission.leave(call.admitted)

    def live(self, phase: str) -> list[_Call]:
        return [c for c in self.calls if c.phase == phase]

    # ------------------------------------------------------------ rules

    @rule(cap=st.integers(0, 6))
    def set_cap(self, cap: int) -> None:
        self.admission.cap = cap

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 3))
    def set_limit(self, worker: str, limit: int) -> None:
        """The worker advertised another SETTINGS_MAX_CONCURRENT_STREAMS."""
        self.limit[worker] = limit

    @rule()
    def arrive(self) -> None:
        call = _Call(len(self.calls))
        self.calls.append(call)
        before = self.admission.infer
        if not self.admission.admit():
            assert self.admission.cap and before >= self.admission.cap
            self.end(call, "refused")
            return
        call.admitted = True
        call.ticket = self.router.choose("m", 1, self.now)
        self.send(call)

    @precondition(lambda self: self.live("holding"))
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES))
    def worker_answers(self, data: st.DataObject, outcome: str) -> None:
        call = data.draw(st.sampled_from(self.live("holding")))
        assert call.ticket is not None and call.ticket.worker is not None
        self.release(call.ticket.worker)  # before the outcome is handled, as the channel does
        status = STATUS[outcome]
        if (
            fails_over(status, unprocessed=outcome == "unprocessed")
            and self.router.failover(call.ticket) is not None
        ):
            self.send(call)
            return
        self.end(call, outcome)

    @precondition(lambda self: self.live("holding") or self.live("waiting"))
    @rule(data=st.data())
    def client_cancels(self, data: st.DataObject) -> None:
        call = data.draw(st.sampled_from(self.live("holding") + self.live("waiting")))
        assert call.ticket is not None and call.ticket.worker is not None
        worker = call.ticket.worker
        if call.phase == "waiting":
            assert call.wait is not None
            self.slots(worker).leave(call.wait)
        else:
            self.release(worker)  # the worker's call is reset: its slot goes back
        self.end(call, "cancelled")

    @precondition(lambda self: self.live("waiting"))
    @rule(data=st.data())
    def waiter_vanishes(self, data: st.DataObject) -> None:
        """A coroutine waiting for a slot is cancelled; its cleanup runs later."""
        call = data.draw(st.sampled_from(self.live("waiting")))
        assert call.wait is not None
        call.wait.gone = True
        self.gone.append(call.wait)
        self.end(call, "cancelled")

    @precondition(lambda self: self.gone)
    @rule()
    def cleanup_runs(self) -> None:
        wait = self.gone.pop(0)
        assert wait.call.ticket is not None and wait.call.ticket.worker is not None
        self.slots(wait.call.ticket.worker).leave(wait)

    @rule(dt=st.sampled_from([0.25, 0.5, 1.0]))
    def time_passes(self, dt: float) -> None:
        """The pool's one timer: every waiter past its deadline is told."""
        self.now += dt
        for worker in WORKERS:
            slots = self.slots(worker)
            for wait in slots.expire(self.now):
                assert wait.deadline <= self.now and not wait.waiting
                wait.expire()
            assert slots.next_deadline() > self.now

    # ------------------------------------------------------------ invariants

    @invariant()
    def counts_are_the_calls(self) -> None:
        open_calls = [c for c in self.calls if c.phase != "ended"]
        assert self.admission.calls == len(open_calls)
        assert self.admission.infer == sum(c.admitted for c in open_calls)
        for worker in WORKERS:
            on = [c for c in open_calls if c.ticket is not None and c.ticket.worker == worker]
            assert self.router.requests(worker) == len(on)
            slots = self.slots(worker)
            assert slots.active == sum(c.phase == "holding" for c in on)
            waiting = {id(c.wait) for c in on if c.phase == "waiting"}
            in_line = [w for w in slots.line if not w.gone]  # type: ignore[attr-defined]
            assert {id(w) for w in in_line} == waiting and len(in_line) == len(waiting)
            joined = [w.joined for w in slots.line]  # type: ignore[attr-defined]
            assert joined == sorted(joined)  # arrival order
            assert all(w.waiting for w in slots.line)

    @invariant()
    def ended_once(self) -> None:
        for call in self.calls:
            assert len(call.endings) == (call.phase == "ended")

    def teardown(self) -> None:
        """Nothing lost: answer every call still holding a slot (its waiters then get the
        slots in turn) and let every deadline pass; everything returns to zero."""
        while holding := self.live("holding"):
            self.worker_answers_ok(holding[0])
        self.now += 10.0
        for worker in WORKERS:
            for wait in self.slots(worker).expire(self.now):
                wait.expire()
        for call in self.calls:
            assert call.phase == "ended" and len(call.endings) == 1
        assert (self.admission.calls, self.admission.infer) == (0, 0)
        for worker in WORKERS:
            slots = self.slots(worker)
            assert (slots.active, len(slots.line), self.router.requests(worker)) == (0, 0, 0)
            assert slots.next_deadline() == math.inf

    def worker_answers_ok(self, call: _Call) -> None:
        assert call.ticket is not None and call.ticket.worker is not None
        self.release(call.ticket.worker)
        self.end(call, "ok")


TestInflightMachine = InflightMachine.TestCase
TestInflightMachine.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)


def test_a_freed_slot_passes_to_the_first_waiter_not_a_newcomer() -> None:
    slots = StreamSlots()
    assert slots.take(1) and not slots.take(1)
    first, second = Waiter(5.0), Waiter(3.0)
    assert slots.join(first)  # the earliest deadline so far
    assert slots.join(second)  # earlier still
    assert slots.release() is first and slots.active == 1
    assert not slots.take(1)  # held by ``first`` now; ``second`` still waits
    assert slots.release() is second
    assert slots.release() is None and slots.active == 0
    with pytest.raises(LifecycleError):
        slots.release()


def test_waiters_expire_by_their_own_deadlines() -> None:
    slots = StreamSlots()
    slots.take(1)
    late, early, gone = Waiter(2.0), Waiter(1.0), Waiter(0.5)
    for wait in (late, early, gone):
        slots.join(wait)
    slots.leave(gone)
    assert slots.next_deadline() == 1.0
    assert slots.expire(0.9) == []
    assert slots.expire(1.0) == [early]
    assert list(slots.line) == [late] and slots.next_deadline() == 2.0


def test_admission_refuses_at_the_cap_and_counts_the_refusal() -> None:
    admission = Admission(cap=2)
    admission.enter()  # another RPC: in flight, not under the cap
    assert admission.admit() and admission.admit() and not admission.admit()
    assert (admission.calls, admission.infer, admission.shed) == (4, 2, 1)
    admission.leave(False)  # the refused one
    admission.leave(True)
    assert admission.admit()
    admission.leave(True)
    admission.leave(True)
    admission.leave(False)
    assert (admission.calls, admission.infer, admission.shed) == (0, 0, 1)
    with pytest.raises(LifecycleError):
        admission.leave(False)


@pytest.mark.parametrize(
    ("status", "unprocessed", "expected"),
    [(0, False, False), (13, False, False), (5, False, True), (14, False, True),
     (4, False, False), (None, True, True), (None, False, False)],
)  # fmt: skip
def test_fails_over_only_when_the_worker_cannot_have_run_the_call(
    status: int | None, unprocessed: bool, expected: bool
) -> None:
    assert fails_over(status, unprocessed=unprocessed) is expected


def test_router_and_pool_share_one_count_per_worker() -> None:
    inflight = Inflight()
    router = RoundRobinRouter(_table(), work_basis="requests", inflight=inflight)  # type: ignore[arg-type]
    ticket = router.choose("m", 3, 0.0)
    assert ticket.worker is not None
    load = inflight.worker(ticket.worker).load
    assert (load.requests, load.items) == (1, 3)
    router.release(ticket)
    assert (load.requests, load.items) == (0, 0)


def test_an_ended_slot_wait_keeps_nothing_of_its_call_alive() -> None:
    """The line drops a granted or cancelled wait's deadline entry lazily: until then the
    entry must not hold the call (its Forward, request and ticket) -- held, calls
    outlived their answers and fed the cyclic collector's passes."""

    class Caller:
        def granted(self) -> None:
            self.started = True

        def expired(self, exc: Exception) -> None:
            raise AssertionError("not expected")

    client = WorkerClient("127.0.0.1:1")
    slots = client.inflight.slots
    assert slots.take(1)
    callers = [Caller(), Caller()]
    refs = [weakref.ref(c) for c in callers]
    waits = [SlotWait(client, 10.0, c) for c in callers]
    for wait in waits:
        slots.join(wait)
    granted = slots.release()
    assert granted is waits[0] and granted.grant() and callers[0].started
    waits[1].cancel()
    del callers, granted, waits
    gc.disable()  # reference counting alone must free them
    try:
        assert [ref() for ref in refs] == [None, None]
    finally:
        gc.enable()
    assert slots.next_deadline() == math.inf  # the stale entries go when next looked at
