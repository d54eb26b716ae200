"""One ModelInfer on its way through the gateway: from the client's call to a worker's answer.

ModelInfer is the gateway's one hot RPC, and it does no work of its own: read the routing
facts, pick a worker, pass the bytes on, pass the answer back. So it is served without a
task (:mod:`reactantserver.transport.unary`): the connection's event handling hands the
whole request to :meth:`Forward.begin`, which starts the call to the worker
(:meth:`.WorkerClient.start`) and returns; the worker connection's event handling runs
:meth:`Forward._on_reply` with the outcome, which answers the client -- or fails over and
starts again. Per call that is one object here and one record per side, where the task
path (grpclib's server stream, an asyncio task, a deadline wrapper, a future) cost about a
third of the gateway's CPU per request (docs/benchmarks.md, "The gateway").

Where a call stands is one field, its :class:`~.core.callstate.CallState`, moved along the
table of :mod:`.core.callstate` (sans-IO) by each step below -- ROUTE, START, QUEUE, CONNECT,
FAILOVER, ANSWER, FAIL, EXPIRE, CANCEL -- and one handle of what it waits on in that state
(its task, its :class:`~.pool.SlotWait`, its worker stream), which is what CANCEL cancels.

Theory of operation
-------------------
:meth:`Forward.begin`: refuse when draining (UNAVAILABLE) or over the admission cap
(RESOURCE_EXHAUSTED; the rule and the counts are :class:`~.core.inflight.Admission`'s); :func:`~.core.wire.peek_infer` (model name, version, id, input shapes); the route
table's replicas of the model; the version asked for (every worker serves
``records.REPORTED_VERSION``: another is answered here, see :mod:`reactantserver.model_version`); the batch extent of the batch input gives the item count;
``router.choose`` gives a ticket; the bytes go to the ticket's worker with the remaining
deadline. When the worker's stream slots are all taken -- the usual case when clients have
more calls in flight than the gateway opens streams to a worker -- the call waits in the
worker's line without a task (:class:`.pool.SlotWait`): the slot freed by an answer is
handed to it in that answer's event handling, and it is sent from there. Two things make a
call wait in a task (rare): the model is unknown (one single-flight refresh of the route
table, then NOT_FOUND), or the worker's connection is being (re)opened.

The worker's answer is passed back as received: OK with the response bytes untouched, any
other status with its message. Failover to the ticket's next replica happens only when the
worker cannot have executed the request: it answered NOT_FOUND (it does not serve the
model; the table is refreshed too) or UNAVAILABLE (draining, model not ready), or the call
failed before it was completely sent (no connection, refused stream, GOAWAY). A connection
lost after the request was sent answers UNAVAILABLE and is not retried.

The deadline is the client's ``grpc-timeout`` (or ``worker_client.request_timeout_seconds``
when it sent none). The worker is told the client's deadline and only the client's: a call
without one reaches the worker without one, as it would directly -- the worker schedules by
deadline (EDF, shedding), and a deadline the client never set would rank the call there as
more urgent than the same call sent directly (and cost the worker a new header block and a
timer per call). The worker connection's timer per call is the one timer: a worker that
has not answered by then makes the call DEADLINE_EXCEEDED (its stream is reset after a
grace, which is what stops a worker that was not told); a wait for a slot or a connection
ends at the deadline too.

A request of a client's ModelStreamInfer (:class:`StreamForward`) takes exactly this path:
its ``call`` is the stream's :class:`~reactantserver.transport.streaming.StreamedRequest`,
whose answer goes into the client's stream, and whose deadline is the stream's.

Invariants (``tests/gateway/test_gateway_callstate.py`` drives them in any order of events): the
state moves only along :data:`~.core.callstate.TRANSITIONS` and ends in one terminal state; the
client's call is answered at most once and, unless the client went away, exactly once;
``router.release`` runs exactly once per ticket; the gateway's in-flight counts go up once
and down once per call (:meth:`Forward._end`); when the client goes away (reset, lost
connection) the worker's call is cancelled and no answer is written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol, TypeVar

from ..errors import (
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from ..model_version import check_version, parse_version
from ..records import REPORTED_VERSION
from ..status import to_status
from ..transport.streaming import RequestCall
from .calls import CANCELLED, DEADLINE_EXCEEDED, NOT_FOUND, OK
from .channel import Call, ChannelError, Reply
from .core.callstate import OUTCOME, CallEvent, CallState, advance
from .core.inflight import Admission, fails_over
from .core.routing import Router, Ticket
from .core.stats import GatewayStats
from .core.table import Replica, items_of
from .core.wire import InferPeek, peek_infer
from .pool import SlotWait, WorkerClient

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class Gateway(Protocol):
    """What a :class:`Forward` reads and calls of the gateway around it (the proxy,
    :class:`.proxy.Proxy`, is one): stated here so that this module does not import the
    proxy, which imports it."""

    @property
    def stats(self) -> GatewayStats: ...
    @property
    def router(self) -> Router: ...
    @property
    def clients(self) -> Mapping[str, WorkerClient]: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def tasks(self) -> set[asyncio.Task[None]]: ...
    @property
    def draining(self) -> bool: ...
    @property
    def admission(self) -> Admission: ...

    @property
    def timeout(self) -> float:
        """A call's deadline when its client set none (seconds)."""
        ...

    def region_owner(self, owner: str) -> str:
        """The owner to name to the worker for a call of ``owner`` ("" when it has no
        shared-memory region through the gateway: :meth:`.proxy.Proxy.region_owner`)."""
        ...

    @property
    def refresh(self) -> Callable[[float], Awaitable[None]]:
        """Refresh the route table now (single-flight), by the deadline given."""
        ...

    @property
    def refresh_soon(self) -> Callable[[], None]: ...
    def call_ended(self) -> None: ...
    def lost_message(self, client: WorkerClient, exc: ChannelError, request_id: str) -> str: ...
    def not_served(self, model: str) -> NotFound | Unavailable: ...


INFER_PATH = b"/inference.GRPCInferenceService/ModelInfer"
RPC = "ModelInfer"

# The states and events, bound once (the call path reads no enum class attribute).
ARRIVED = CallState.ARRIVED
ENDED = CallState.ANSWERED  # the first terminal state: ``state >= ENDED`` is "ended"
ROUTE, LOOKUP, START, QUEUE = CallEvent.ROUTE, CallEvent.LOOKUP, CallEvent.START, CallEvent.QUEUE
CONNECT, FAILOVER, ANSWER = CallEvent.CONNECT, CallEvent.FAILOVER, CallEvent.ANSWER
FAIL, EXPIRE, CANCEL = CallEvent.FAIL, CallEvent.EXPIRE, CallEvent.CANCEL


class Forward:
    """One ModelInfer through the gateway (module docstring): the I/O that drives one
    call's :class:`~.core.callstate.CallState` along :data:`~.core.callstate.TRANSITIONS`."""

    __slots__ = ("_admitted", "_call", "_client", "_data", "_deadline", "_model", "_peek",
                 "_proxy", "_sent_at", "_started", "_state", "_ticket", "_waiting")  # fmt: skip

    #: The RPC the call is counted under.
    rpc = RPC

    def __init__(
        self, proxy: Gateway, call: RequestCall, data: bytes | memoryview, now: float
    ) -> None:
        self._proxy = proxy
        self._call = call
        self._data = data
        self._started = now
        self._deadline = call.deadline if call.deadline is not None else now + proxy.timeout
        #: Where the call stands: the one field that says it (:mod:`.core.callstate`).
        self._state = ARRIVED
        #: What the call waits on in its state, which ``CANCEL`` cancels: the task
        #: (REFRESHING, CONNECTING), the place in line (WAITING_SLOT), the worker's stream
        #: (SENT); None in the others.
        self._waiting: Call | SlotWait | asyncio.Task[None] | None = None
        self._model = ""
        self._peek: InferPeek | None = None
        #: The router's ticket (from ROUTED on): the worker, the replicas left to fail
        #: over to, what :meth:`.Router.release` gives back.
        self._ticket: Ticket | None = None
        self._client: WorkerClient | None = None
        self._sent_at = 0.0
        #: Admitted under the cap (counted in ``admission.infer``).
        self._admitted = False

    @property
    def state(self) -> CallState:
        """Where the call stands (:class:`~.core.callstate.CallState`)."""
        return self._state

    # ---------------------------------------------------------------- the call's steps

    def begin(self) -> None:
        """ARRIVED: admit, then route and send (ROUTE), or refresh the table first
        (LOOKUP, a task)."""
        proxy = self._proxy
        admission = proxy.admission
        self._call.on_cancel = self._cancelled
        if proxy.draining:
            admission.enter()
            self._fail(
                Unavailable("the gateway is shutting down; retry (another gateway, or later)")
            )
            return
        self._admitted = admission.admit()  # counted in flight either way
        try:
            if not self._admitted:
                raise ResourceExhausted(
                    f"{admission.infer} ModelInfer calls are in flight at the gateway; "
                    f"the limit is {admission.cap} (grpc.max_concurrent_requests_per_worker x "
                    f"{len(proxy.clients)} workers); retry later"
                )
            self._peek = peek = peek_infer(self._data)
            if not peek.model:
                raise InvalidArgument("ModelInfer: model_name is empty")
            if peek.version:  # malformed: refused before the lookup, as a worker does
                parse_version(peek.version)
            replicas = proxy.router.table.replicas(peek.model)
            if replicas:
                self._route(replicas, self._started)
            else:
                self._state = advance(self._state, LOOKUP)
                self._wait(self._refresh_then_route())
        except Exception as exc:
            self._fail(exc)

    async def _refresh_then_route(self) -> None:
        """REFRESHING: one refresh (single-flight), then route (ROUTE) or fail."""
        proxy = self._proxy
        await proxy.refresh(self._deadline)
        assert self._peek is not None
        replicas = proxy.router.table.replicas(self._peek.model)
        if not replicas:
            raise proxy.not_served(self._peek.model)
        self._route(replicas, proxy.loop.time())

    def _route(self, replicas: tuple[Replica, ...], now: float) -> None:
        """Count the request's items (by the first replica's batch input) and take a
        ticket from the router (ROUTE), then send."""
        peek = self._peek
        assert peek is not None
        self._model = peek.model
        if peek.version:
            # Checked here, not by the worker: its NOT_FOUND would read as "this worker
            # does not serve the model" and fail the call over to every other replica.
            check_version(peek.model, REPORTED_VERSION, peek.version)
        first = replicas[0]
        items = items_of(first, peek.shape_of(first.batch_input_name))
        self._ticket = self._proxy.router.choose(peek.model, items, now, replicas)
        self._state = advance(self._state, ROUTE)
        self._send(now)

    def _send(self, now: float) -> None:
        """ROUTED: start the call on the ticket's worker (START), or line up for one of
        its stream slots (QUEUE), or wait in a task for its connection (CONNECT)."""
        ticket = self._ticket
        assert ticket is not None and ticket.worker is not None
        proxy = self._proxy
        self._client = client = proxy.clients[ticket.worker]
        self._sent_at = now
        try:
            started = client.start(
                INFER_PATH,
                self._data,
                self._deadline,
                self._on_reply,
                tell=self._call.deadline is not None,
                owner=proxy.region_owner(self._call.owner),
            )
        except ChannelError as exc:
            self._on_reply(exc)
            return
        if started is not None:
            self._state = advance(self._state, START)
            self._waiting = started
            return
        wait = client.wait_for_slot(self._deadline, self)
        if wait is not None:
            self._state = advance(self._state, QUEUE)
            self._waiting = wait
        else:
            self._state = advance(self._state, CONNECT)
            self._wait(self._send_when_ready(client, holding=False))

    def granted(self) -> None:
        """WAITING_SLOT: a stream slot came free for this call (in the event handling of
        the worker connection that freed it): send it there (START), or, the connection
        gone meanwhile, wait for the next one holding the slot (CONNECT)."""
        client = self._client
        assert client is not None
        try:
            started = self._start(client.start, holding=True)
        except ChannelError as exc:
            self._on_reply(exc)
            return
        except Exception as exc:  # the deadline passed
            self._fail(exc)
            return
        if started is None:
            self._state = advance(self._state, CONNECT)
            self._wait(self._send_when_ready(client, holding=True))
        else:
            self._state = advance(self._state, START)
            self._waiting = started

    def expired(self, exc: DeadlineExceeded) -> None:
        """WAITING_SLOT: the deadline passed in line (EXPIRE); nothing was sent."""
        self._fail(exc)

    async def _send_when_ready(self, client: WorkerClient, *, holding: bool) -> None:
        """CONNECTING: once connected (and holding a slot), START."""
        try:
            started = await self._start(client.start_when_ready, holding=holding)
        except ChannelError as exc:
            self._on_reply(exc)
            return
        self._state = advance(self._state, START)
        self._waiting = started

    def _start(self, start: Callable[..., _T], *, holding: bool) -> _T:
        """This call's request to its worker, through ``start``: the pool's
        :meth:`~.WorkerClient.start` (at once) or ``start_when_ready`` (awaited)."""
        return start(
            INFER_PATH,
            self._data,
            self._deadline,
            self._on_reply,
            tell=self._call.deadline is not None,
            owner=self._proxy.region_owner(self._call.owner),
            holding=holding,
        )

    def _on_reply(self, outcome: Reply | ChannelError) -> None:
        """The worker's answer (SENT), or why there is none (any state that tried to
        send): answer the client (ANSWER, FAIL, EXPIRE), or fail over (FAILOVER)."""
        state = self._state
        if state >= ENDED:
            return  # the client went away; the call was cancelled
        self._waiting = None
        proxy = self._proxy
        ticket, client = self._ticket, self._client
        assert ticket is not None and client is not None
        now = proxy.loop.time()
        try:
            if isinstance(outcome, ChannelError):
                proxy.refresh_soon()
                if fails_over(None, unprocessed=outcome.unprocessed) and (
                    proxy.router.failover(ticket) is not None
                ):
                    self._state = advance(state, FAILOVER)
                    self._send(now)
                    return
                assert self._peek is not None
                raise Unavailable(proxy.lost_message(client, outcome, self._peek.id))
            proxy.stats.worker_call(self.rpc, client.name, now - self._sent_at)
            status = outcome.status
            if status == OK:
                self._end(ANSWER, OK, now)
                self._call.answer_framed(outcome.framed)  # the worker's bytes, as they came
                return
            if fails_over(status):
                if status == NOT_FOUND:
                    proxy.refresh_soon()
                if proxy.router.failover(ticket) is not None:
                    self._state = advance(state, FAILOVER)
                    self._send(now)
                    return
            self._end(EXPIRE if status == DEADLINE_EXCEEDED else FAIL, status, now)
            self._call.fail(status, outcome.message)
        except Exception as exc:
            self._fail(exc)

    # ---------------------------------------------------------------- waiting

    def _wait(self, step: Coroutine[Any, Any, None]) -> None:
        """Run ``step`` (a coroutine that continues the call) in a task of its own: what
        the call waits on until the step moves it on."""
        self._waiting = task = self._proxy.loop.create_task(self._guarded(step))
        self._proxy.tasks.add(task)
        task.add_done_callback(self._proxy.tasks.discard)

    async def _guarded(self, step: Coroutine[Any, Any, None]) -> None:
        try:
            await step
        except asyncio.CancelledError:
            pass  # the client went away (_cancelled) or the gateway is closing
        except Exception as exc:
            self._fail(exc)

    # ---------------------------------------------------------------- endings

    def _fail(self, exc: Exception) -> None:
        """End the call with the status of ``exc`` (the gateway's own outcome): FAIL, or
        EXPIRE for a deadline."""
        if self._state >= ENDED:
            return
        status = to_status(exc, rpc=self.rpc)  # INTERNAL, with the traceback, if not ours
        code = status.code.value
        self._end(EXPIRE if isinstance(exc, DeadlineExceeded) else FAIL, code)
        self._call.fail(code, status.message)

    def _cancelled(self) -> None:
        """The client reset the call or its connection went (CANCEL; EXPIRE if its
        deadline passed): cancel what the call waits on."""
        if self._state >= ENDED:
            return
        expired = self._proxy.loop.time() >= self._deadline
        if expired:
            self._end(EXPIRE, DEADLINE_EXCEEDED)
        else:
            self._end(CANCEL, CANCELLED)
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.cancel()

    def _end(self, event: CallEvent, code: int, now: float | None = None) -> None:
        """Move to the terminal state of ``event`` and account the call's end, once: the
        ticket (with the state's outcome), the counts, the statistics."""
        self._state = state = advance(self._state, event)
        proxy = self._proxy
        if self._ticket is not None:
            proxy.router.release(self._ticket, OUTCOME[state])
        proxy.admission.leave(self._admitted)
        if now is None:
            now = proxy.loop.time()
        proxy.stats.finish(self.rpc, self._model, code, now - self._started)
        proxy.call_ended()


class StreamForward(Forward):
    """One request of a client's ModelStreamInfer, forwarded as a ModelInfer of its own
    (routed, failed over and answered like one) and answered in the client's stream;
    counted under ModelStreamInfer."""

    __slots__ = ()
    rpc = "ModelStreamInfer"
