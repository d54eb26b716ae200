"""A forwarded gateway call's states (``gateway/core/callstate.py``) and the Forward that drives them.

The table is checked against the specification written out once more by hand, as a matrix
a reader can check cell by cell: every ``(state, event)`` pair moves to the stated state or
is refused. A property then drives the real :class:`~reactantserver.gateway.forward.Forward`
-- with the real router, admission counts, stream slots (``StreamSlots``) and ``SlotWait``
-- through fakes of the sockets around it, in any order of events: workers answering,
connections going and coming back, clients going away, deadlines passing. No socket and no
event loop: the loop is a clock the test sets, and a task is a coroutine it steps. A real
gateway in front of real workers (failover, deadlines, cancellation, drain) is in
``test_gateway_proxy.py``, ``test_gateway_outage.py`` and ``test_gateway_drain.py``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine, Generator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reactantserver.errors import DeadlineExceeded, LifecycleError, NotFound
from reactantserver.gateway.channel import ChannelError, Reply
from reactantserver.gateway.core import callstate
from reactantserver.gateway.core.callstate import (
    OUTCOME,
    TRANSITIONS,
    CallEvent,
    CallState,
    advance,
    ended,
)
from reactantserver.gateway.core.inflight import Admission, Inflight, StreamSlots
from reactantserver.gateway.core.routing import OUTCOMES, RoundRobinRouter, Ticket
from reactantserver.gateway.core.stats import GatewayStats
from reactantserver.gateway.core.table import ModelSnapshot, WorkerSnapshot, build_table
from reactantserver.gateway.forward import Forward
from reactantserver.gateway.pool import SlotCaller, SlotWait
from reactantserver.protocol import inference as pb

S = CallState
E = CallEvent

#: The call's life written out once more, by hand: a row per state, a column per event,
#: in each cell the state the event moves the call to ("-": refused).
SPECIFICATION = """
              ROUTE   LOOKUP      START  QUEUE         CONNECT     FAILOVER  ANSWER    FAIL    EXPIRE   CANCEL
ARRIVED       ROUTED  REFRESHING  -      -             -           -         -         FAILED  EXPIRED  CANCELLED
REFRESHING    ROUTED  -           -      -             -           -         -         FAILED  EXPIRED  CANCELLED
ROUTED        -       -           SENT   WAITING_SLOT  CONNECTING  ROUTED    -         FAILED  EXPIRED  CANCELLED
WAITING_SLOT  -       -           SENT   -             CONNECTING  ROUTED    -         FAILED  EXPIRED  CANCELLED
CONNECTING    -       -           SENT   -             -           ROUTED    -         FAILED  EXPIRED  CANCELLED
SENT          -       -           -      -             -           ROUTED    ANSWERED  FAILED  EXPIRED  CANCELLED
ANSWERED      -       -           -      -             -           -         -         -       -        -
FAILED        -       -           -      -             -           -         -         -       -        -
EXPIRED       -       -           -      -             -           -         -         -       -        -
CANCELLED     -       -           -      -             -           -         -         -       -        -
"""


def _expected() -> dict[tuple[CallState, CallEvent], CallState]:
    header, *rows = SPECIFICATION.strip().splitlines()
    events = [CallEvent[name] for name in header.split()]
    expected = {}
    for row in rows:
        state, *cells = row.split()
        assert len(cells) == len(events), row
        for event, cell in zip(events, cells, strict=True):
            if cell != "-":
                expected[CallState[state], event] = CallState[cell]
    return expected


EXPECTED = _expected()

#: A legal way from a new call to each state.
PATHS = {
    S.ARRIVED: [],
    S.REFRESHING: [E.LOOKUP],
    S.ROUTED: [E.ROUTE],
    S.WAITING_SLOT: [E.ROUTE, E.QUEUE],
    S.CONNECTING: [E.ROUTE, E.CONNECT],
    S.SENT: [E.ROUTE, E.START],
    S.ANSWERED: [E.ROUTE, E.START, E.ANSWER],
    S.FAILED: [E.FAIL],
    S.EXPIRED: [E.ROUTE, E.QUEUE, E.EXPIRE],
    S.CANCELLED: [E.LOOKUP, E.CANCEL],
}


def test_the_specification_names_every_state_and_event() -> None:
    header, *rows = SPECIFICATION.strip().splitlines()
    assert [CallEvent[n] for n in header.split()] == list(CallEvent)
    assert [CallState[r.split()[0]] for r in rows] == list(CallState)


def test_the_table_is_exactly_the_specification() -> None:
    assert dict(TRANSITIONS) == EXPECTED


@pytest.mark.parametrize("state", list(CallState), ids=lambda s: s.name)
@pytest.mark.parametrize("event", list(CallEvent), ids=lambda e: e.name)
def test_every_pair_is_either_a_transition_or_an_error(state: CallState, event: CallEvent) -> None:
    reached = S.ARRIVED
    for step in PATHS[state]:
        reached = advance(reached, step)
    assert reached is state
    if (state, event) in EXPECTED:
        assert advance(state, event) is EXPECTED[state, event]
    else:
        with pytest.raises(LifecycleError, match=f"event {event.name} is not allowed in state"):
            advance(state, event)


def test_the_terminal_states_are_the_routers_outcomes() -> None:
    """Four terminal states, one per outcome the router accounts; ``ended`` says which."""
    terminal = [s for s in CallState if ended(s)]
    assert terminal == [S.ANSWERED, S.FAILED, S.EXPIRED, S.CANCELLED]
    assert set(OUTCOME) == set(terminal)
    assert sorted(OUTCOME.values()) == sorted(OUTCOMES)
    assert not any((s, e) in TRANSITIONS for s in terminal for e in CallEvent)


@given(events=st.lists(st.sampled_from(list(CallEvent)), max_size=40))
def test_any_events_reach_at_most_one_terminal_state(events: list[CallEvent]) -> None:
    """Whatever events come, in whatever order (a refused one changes nothing), a call
    moves only along the table, enters a terminal state at most once, and never leaves it."""
    state = S.ARRIVED
    entered = 0
    for event in events:
        try:
            after = advance(state, event)
        except LifecycleError:
            assert (state, event) not in TRANSITIONS
            continue
        assert TRANSITIONS[state, event] is after
        assert not ended(state)
        entered += ended(after)
        state = after
    assert entered == (1 if ended(state) else 0)


# ---------------------------------------------------------------- the Forward, in any order

WORKERS = ("w0", "w1")
#: Stream slots per worker: few, so that calls wait in line.
SLOTS = 1


def _request(model: str) -> bytes:
    return bytes(
        pb.ModelInferRequest(
            model_name=model,
            id="r",
            inputs=[pb.ModelInferRequestInferInputTensor(name="x", shape=[2, 3])],
        )
    )


class Gate:
    """What a fake coroutine awaits; the test opens it with a value or an exception."""

    def __init__(self, client: FakeClient | None, holding: bool, deadline: float) -> None:
        self.client = client
        self.holding = holding
        self.deadline = deadline
        self.open = False
        #: Opened with a slot taken for it (a task that waited for a slot and a connection).
        self.took = False
        self.error: BaseException | None = None

    def __await__(self) -> Generator[Gate, None, None]:
        yield self
        if self.error is not None:
            raise self.error


class FakeTask:
    """An asyncio task as the Forward uses one: stepped by the test; a cancel is
    delivered at its next step, as asyncio does."""

    def __init__(self, coro: Coroutine[Any, Any, None]) -> None:
        self.coro = coro
        #: The Forward whose step it runs.
        self.owner = coro.cr_frame.f_locals["self"]  # type: ignore[attr-defined]
        self.gate: Gate | None = None
        self.started = False
        self.cancelling = False
        self.done = False
        self.callbacks: list[Callable[[FakeTask], None]] = []

    def add_done_callback(self, fn: Callable[[FakeTask], None]) -> None:
        self.callbacks.append(fn)

    def cancel(self) -> None:
        self.cancelling = True

    @property
    def runnable(self) -> bool:
        return not self.done and (
            not self.started or self.cancelling or (self.gate is not None and self.gate.open)
        )

    def step(self) -> None:
        try:
            if not self.started:  # (cancelled or not: asyncio would start it first too)
                self.started = True
                self.gate = self.coro.send(None)
                if not self.cancelling:
                    return
            if self.cancelling:
                self.cancelling = False
                self.gate = self.coro.throw(asyncio.CancelledError())
            else:
                self.gate = self.coro.send(None)
        except (StopIteration, asyncio.CancelledError):
            self.done = True
            for fn in self.callbacks:
                fn(self)


class FakeLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self.tasks: list[FakeTask] = []

    def time(self) -> float:
        return self.now

    def create_task(self, coro: Coroutine[Any, Any, None]) -> FakeTask:
        task = FakeTask(coro)
        self.tasks.append(task)
        return task


class FakeStream:
    """A worker stream as the Forward sees one (:class:`.channel.Call`): it holds a slot,
    which goes back before ``on_done`` runs, once."""

    def __init__(
        self, client: FakeClient, deadline: float, on_done: Callable[[Reply | ChannelError], None]
    ) -> None:
        self.client = client
        self.deadline = deadline
        self.on_done: Callable[[Reply | ChannelError], None] | None = on_done

    def finish(self, outcome: Reply | ChannelError) -> None:
        on_done, self.on_done = self.on_done, None
        assert on_done is not None, "a stream finished twice"
        self.client.streams.remove(self)
        self.client.release()
        on_done(outcome)

    def cancel(self) -> None:
        if self.on_done is not None:  # the caller is gone: reset, and told so
            self.finish(ChannelError("cancelled", unprocessed=False))


class FakeClient:
    """One worker as the Forward uses it (:class:`.pool.WorkerClient`'s forward path),
    over the real stream slots and ``SlotWait``; its connection is up or down."""

    def __init__(self, name: str, world: World) -> None:
        self.name = self.address = name
        self.world = world
        self.slots = StreamSlots()
        self.up = True
        self.streams: list[FakeStream] = []

    def start(
        self,
        path: bytes,
        payload: bytes | memoryview,
        deadline: float,
        on_done: Callable[[Reply | ChannelError], None],
        *,
        tell: bool = True,
        owner: str = "",
        holding: bool = False,
    ) -> FakeStream | None:
        if not holding:  # the Forward's first try on this worker (its _send)
            self.world.visits.setdefault(on_done.__self__, []).append(self.name)  # type: ignore[attr-defined]
        if not self.up:
            return None
        if not holding and not self.slots.take(SLOTS):
            return None
        return self._open(deadline, on_done)

    def _open(self, deadline: float, on_done: Callable[[Reply | ChannelError], None]) -> FakeStream:
        if not self.up:  # went since the caller looked: nothing sent, the slot back
            self.release()
            raise ChannelError("the connection takes no new streams", unprocessed=True)
        if self.world.loop.now >= deadline:
            self.release()
            raise DeadlineExceeded("the deadline passed before the call could be sent")
        stream = FakeStream(self, deadline, on_done)
        self.streams.append(stream)
        return stream

    def wait_for_slot(self, deadline: float, caller: SlotCaller) -> SlotWait | None:
        if not self.up:
            return None
        wait = SlotWait(self, deadline, caller)  # type: ignore[arg-type]
        self.slots.join(wait)
        return wait

    def leave_line(self, wait: SlotWait) -> None:
        self.slots.leave(wait)

    def slot_deadline(self) -> DeadlineExceeded:
        return DeadlineExceeded("the deadline passed while waiting for a stream")

    async def start_when_ready(
        self,
        path: bytes,
        payload: bytes | memoryview,
        deadline: float,
        on_done: Callable[[Reply | ChannelError], None],
        *,
        tell: bool = True,
        holding: bool = False,
        owner: str = "",
    ) -> FakeStream:
        gate = Gate(self, holding, deadline)
        try:
            await gate  # opened with a slot held (taken for it unless holding one)
        except BaseException:
            if holding or gate.took:
                self.release()
            raise
        return self._open(deadline, on_done)

    def release(self) -> None:
        while (wait := self.slots.release()) is not None:
            if wait.grant():
                return


class ClientCall:
    """The client's side of one call (a :class:`.transport.unary.UnaryCall`)."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.owner = ""
        self.on_cancel: Callable[[], None] | None = None
        self.answers: list[int] = []
        self.messages: list[str] = []
        self.gone = False

    def answer_framed(self, framed: bytes | memoryview) -> None:
        self.answers.append(0)

    def fail(self, code: int, message: str) -> None:
        self.answers.append(code)
        self.messages.append(message)


class CountingRouter(RoundRobinRouter):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.released: dict[int, int] = {}
        self.tickets: list[Ticket] = []

    def choose(self, *args: Any, **kwargs: Any) -> Ticket:
        ticket = super().choose(*args, **kwargs)
        self.tickets.append(ticket)
        return ticket

    def release(self, ticket: Ticket, outcome: Any = "ok") -> None:
        self.released[ticket.seq] = self.released.get(ticket.seq, 0) + 1
        super().release(ticket, outcome)


class World:
    """The gateway around the Forwards (:class:`.forward.Gateway`), made of fakes and the
    real router and counts."""

    def __init__(self) -> None:
        self.loop = FakeLoop()
        self.admission = Admission(cap=6)
        self.stats = GatewayStats(admission=self.admission)
        self.inflight = Inflight()
        table = build_table(
            None,
            [
                WorkerSnapshot(
                    address=w,
                    discipline="fifo",
                    models=(
                        ModelSnapshot(
                            name="m", max_batch_size=4, batch_input_name="x", batch_axis=0
                        ),
                    ),
                )
                for w in WORKERS
            ],
        )
        self.router = CountingRouter(table, work_basis="requests", inflight=self.inflight)
        self.clients = {w: FakeClient(w, self) for w in WORKERS}
        self.tasks: set[FakeTask] = set()
        self.draining = False
        self.timeout = 5.0
        self.calls: list[tuple[ClientCall, Forward]] = []
        #: Forward -> the workers it was sent to (routed or failed over to), in order.
        self.visits: dict[Forward, list[str]] = {}
        self.refreshes: list[Gate] = []

    def region_owner(self, owner: str) -> str:
        return ""

    @property
    def refresh(self) -> Callable[[float], Coroutine[Any, Any, None]]:
        async def refresh(deadline: float) -> None:
            gate = Gate(None, False, deadline)
            self.refreshes.append(gate)
            await gate

        return refresh

    @property
    def refresh_soon(self) -> Callable[[], None]:
        return lambda: None

    def call_ended(self) -> None:
        pass

    def lost_message(self, client: Any, exc: ChannelError, request_id: str) -> str:
        return f"lost: {exc}"

    def not_served(self, model: str) -> NotFound:
        return NotFound(f"no worker serves {model!r}")

    def close(self) -> None:
        for task in self.loop.tasks:
            if not task.done:
                if not task.started:
                    task.coro.send(None)  # so that the step it wraps is closed with it
                task.coro.close()

    # ---------------------------------------------------------------- what can happen

    def waits_on_anything(self, forward: Forward) -> bool:
        """Does ``forward`` still hold a stream, a place in line, or a task not cancelled?"""
        return (
            any(s.on_done.__self__ is forward for s in self.streams() if s.on_done is not None)  # type: ignore[attr-defined]
            or any(w.caller is forward for c in self.clients.values() for w in c.slots.line)  # type: ignore[attr-defined]
            or any(t.owner is forward and not (t.done or t.cancelling) for t in self.loop.tasks)
        )

    def streams(self) -> list[FakeStream]:
        return [s for c in self.clients.values() for s in c.streams]

    def gates(self) -> list[Gate]:
        """The gates tasks wait on now, not yet opened."""
        return [
            t.gate
            for t in self.loop.tasks
            if not t.done and t.gate is not None and not t.gate.open and not t.cancelling
        ]

    def open_gate(self, gate: Gate, how: str) -> bool:
        """Open ``gate``: "ok" (connected, with a slot: only if one can be had), or with a
        connection failure or the deadline."""
        if how == "ok":
            client = gate.client
            if client is not None:
                if not client.up or not (gate.holding or client.slots.take(SLOTS)):
                    return False
                gate.took = not gate.holding
        elif how == "refused":
            gate.error = ChannelError("cannot connect", unprocessed=True)
        else:
            gate.error = DeadlineExceeded("the deadline passed while connecting")
        gate.open = True
        return True

    def tick(self, seconds: float) -> None:
        """Time passes: lines expire their waiters, the connections their calls."""
        self.loop.now += seconds
        now = self.loop.now
        for client in self.clients.values():
            for wait in client.slots.expire(now):
                wait.expire()
        for stream in self.streams():
            if stream.deadline <= now and stream.on_done is not None:
                stream.finish(Reply(4, "deadline exceeded"))
        for gate in self.gates():
            if gate.deadline <= now:
                self.open_gate(gate, "deadline")


OUTCOMES_OF_A_STREAM: list[Callable[[], Reply | ChannelError]] = [
    lambda: Reply(0),
    lambda: Reply(5, "not here"),  # NOT_FOUND: fails over
    lambda: Reply(14, "draining"),  # UNAVAILABLE: fails over
    lambda: Reply(3, "bad input"),  # INVALID_ARGUMENT: answered as it is
    lambda: Reply(4, "deadline"),
    lambda: ChannelError("refused", unprocessed=True),  # fails over
    lambda: ChannelError("lost", unprocessed=False),  # may have run: UNAVAILABLE
]


def _step(world: World, data: st.DataObject) -> None:
    possible = ["arrive", "arrive", "tick"]
    if world.streams():
        possible += ["answer", "answer"]
    if any(not gone and not call.answers for (call, _), gone in _live(world)):
        possible.append("client goes")
    if any(t.runnable for t in world.loop.tasks):
        possible += ["run", "run"]
    if world.gates() or any(not g.open for g in world.refreshes):
        possible.append("open")
    possible += ["connection lost", "connection back"]
    action = data.draw(st.sampled_from(possible))
    if action == "arrive":
        model = data.draw(st.sampled_from(["m", "m", "m", "unknown"]))
        deadline = data.draw(st.sampled_from([None, 1.0, 3.0]))
        call = ClientCall(None if deadline is None else world.loop.now + deadline)
        forward = Forward(world, call, _request(model), world.loop.now)  # type: ignore[arg-type]
        world.calls.append((call, forward))
        forward.begin()
    elif action == "tick":
        world.tick(data.draw(st.sampled_from([0.1, 0.5, 2.0])))
    elif action == "answer":
        stream = data.draw(st.sampled_from(world.streams()))
        stream.finish(data.draw(st.sampled_from(OUTCOMES_OF_A_STREAM))())
    elif action == "client goes":
        call = data.draw(
            st.sampled_from([c for (c, _), gone in _live(world) if not gone and not c.answers])
        )
        call.gone = True
        assert call.on_cancel is not None
        call.on_cancel()
        forward = next(f for c, f in world.calls if c is call)
        assert ended(forward.state) and not world.waits_on_anything(forward)
    elif action == "run":
        data.draw(st.sampled_from([t for t in world.loop.tasks if t.runnable])).step()
    elif action == "open":
        gates = world.gates() + [g for g in world.refreshes if not g.open]
        gate = data.draw(st.sampled_from(gates))
        ways = ["ok", "deadline"] if gate.client is None else ["ok", "refused", "deadline"]
        world.open_gate(gate, data.draw(st.sampled_from(ways)))  # a refresh is not refused
    else:
        client = data.draw(st.sampled_from(list(world.clients.values())))
        if action == "connection lost":
            client.up = False
            for stream in list(client.streams):
                if stream.on_done is not None:
                    stream.finish(
                        ChannelError("connection lost", unprocessed=data.draw(st.booleans()))
                    )
        else:
            client.up = True


def _live(world: World) -> list[tuple[tuple[ClientCall, Forward], bool]]:
    return [((c, f), c.gone) for c, f in world.calls]


def _settle(world: World) -> None:
    """Everything that is still waiting gets its end: connections back, the clock past
    every deadline, the workers answering, the tasks run."""
    for client in world.clients.values():
        client.up = True
    for _ in itertools.count():
        assert _ < 1000, "the calls did not settle"
        world.tick(100.0)
        for gate in world.refreshes:
            if not gate.open:
                world.open_gate(gate, "ok")
        for stream in world.streams():
            if stream.on_done is not None:
                stream.finish(Reply(0))
        runnable = [t for t in world.loop.tasks if t.runnable]
        for task in runnable:
            task.step()
        if not runnable and not world.streams() and not world.gates():
            break


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_every_call_ends_once_whatever_the_order_of_events(data: st.DataObject) -> None:
    """Whatever the order in which calls arrive, workers answer (OK, an error, NOT_FOUND or
    UNAVAILABLE, a refused or lost stream), connections go and come back, clients go away,
    tasks run and deadlines pass -- once everything has had its end: every call is in
    exactly one terminal state, moved only along the table (an illegal move would answer
    INTERNAL, and none does); a client that stayed got exactly one answer, one that went
    got none; the call's state says which (ANSWERED: the worker's OK; FAILED or EXPIRED:
    an error status, or nothing if the client had gone at its deadline; CANCELLED:
    nothing); every ticket was released exactly once; every stream slot came back and
    nobody is left in a line; the admission counts are back to zero."""
    world = World()
    try:
        for _ in range(data.draw(st.integers(1, 60))):
            _step(world, data)
        _settle(world)
    finally:
        world.close()  # an example Hypothesis stops half-way leaves tasks unrun
    for call, forward in world.calls:
        state = forward.state
        assert ended(state), state
        assert 13 not in call.answers, call.messages  # INTERNAL: the Forward's own bug
        if call.gone:
            assert call.answers == [] and state in (S.CANCELLED, S.EXPIRED)
        else:
            assert len(call.answers) == 1
            assert (call.answers[0] == 0) == (state is S.ANSWERED)
            assert state is not S.CANCELLED
            if state is S.EXPIRED:
                assert call.answers == [4]
            if call.messages and call.messages[0] in ("not here", "draining"):
                assert sorted(world.visits[forward]) == sorted(WORKERS)  # failed over to all
        visits = world.visits.get(forward, [])
        assert len(set(visits)) == len(visits)  # never the same worker twice
    router = world.router
    assert sorted(router.released) == sorted(t.seq for t in router.tickets)
    assert set(router.released.values()) <= {1}
    for w in WORKERS:
        assert world.inflight.worker(w).load.requests == 0
    for client in world.clients.values():
        assert client.slots.active == 0 and not client.slots.line and not client.streams
    assert (world.admission.calls, world.admission.infer) == (0, 0)
    assert all(t.done for t in world.loop.tasks) and not world.tasks


def _tables_in(text: str) -> dict[tuple[CallState, CallEvent], CallState]:
    """The ``state event next ...`` rows of a table in prose ("any live": each live state)."""
    live = [s for s in CallState if not ended(s)]
    found: dict[tuple[CallState, CallEvent], CallState] = {}
    for line in text.splitlines():
        words = line.split()
        if line.lstrip().startswith("any live"):
            words = ["*", *words[2:]]
        if len(words) < 3 or words[1] not in CallEvent.__members__:
            continue
        if words[0] != "*" and words[0] not in CallState.__members__:
            continue
        states = live if words[0] == "*" else [CallState[words[0]]]
        for state in states:
            found[state, CallEvent[words[1]]] = CallState[words[2]]
    return found


@pytest.mark.parametrize("where", ["docs/architecture.md", "callstate"])
def test_the_tables_in_the_docs_are_the_table(where: str) -> None:
    """The table in docs/architecture.md and in the module's docstring say what the code does."""
    if where == "callstate":
        text = callstate.__doc__ or ""
    else:
        text = (Path(__file__).resolve().parents[2] / where).read_text()
    assert _tables_in(text) == dict(TRANSITIONS)
