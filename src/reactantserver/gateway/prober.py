"""Discovery: which worker serves which model, asked every ``health_interval_seconds``.

Theory of operation
-------------------
A probe round asks every worker three questions, all workers at once, each worker within
:func:`probe_timeout` seconds:

1. ``ServerReady`` -- may it take requests at all?
2. ``RepositoryIndex`` (every model, with its state) -- which models are ``READY`` there?
3. ``ModelControlStatus`` -- per model the batch input and axis (to count items), the max
   batch size, weight bytes and the cumulative compute and rows counters (the learned cost
   per item). A worker without the control service (a plain Triton server behind the
   gateway) still routes: its requests count one item each.

The answers become :class:`~.core.table.WorkerSnapshot`\\ s, :func:`~.core.table.build_table` makes the
next immutable :class:`~.core.table.RouteTable` from them and the previous one, and the router
gets it with ``update`` -- one assignment, so a request sees the old table or the new one,
never a mixture. A worker that does not answer, or answers not ready, serves nothing in the
new table; it comes back on the first round it answers ready. Joins and departures are
logged once each.

Rounds run one at a time (a lock). Besides the periodic ones, the request path asks for a
round through :class:`Refresher` when it meets a model the table does not know, a NOT_FOUND
from a worker, or a connection failure (single flight, at most one a second).

**Wedge exit.** When no worker has answered a probe for ``wedge_exit_rounds x
health_interval_seconds`` seconds, after some worker had answered once, :meth:`Prober.run`
raises :class:`GatewayWedged` and the gateway exits non-zero, for its supervisor to
restart it (a gateway that can reach no worker is more likely broken itself -- a lost
network namespace, exhausted descriptors -- than every worker at once). 0 disables it.
The limit is counted in time, not in rounds (:class:`WedgeWatch`, sans-IO, given
``now``): rounds the request path asks for (one a second at most under traffic) would
otherwise use the budget up in a few seconds, so the gateway would give up after 9.6 s
under traffic and 29.4 s without. The periodic loop wakes at the limit, probes once more,
and exits only if that round got no answer either.

**Time the loop had, not time that passed.** The probes, the timers and every client
share one thread. A request that held the gateway's loop for seconds (issue 41: 2.5 s
decoding one SystemSharedMemoryRegister) made every probe of that round miss its
deadline, and the gateway concluded "no worker answered for 6.0 s" and exited -- its
own stall, judged as the workers' silence. So a :class:`LoopLag` meter, fed by a Trio task
that wakes every :data:`LAG_PERIOD` seconds, counts how late the loop let it wake (a
stall in progress included), and the watch counts silence *minus* that time; and a round
during which the loop was held up for a quarter of the probe timeout or more judges no
worker it got no answer from: each keeps what the last round said of it (a worker that
is down is judged by the next round).

**What the log says.** A worker's first ready answer is ``worker w0 is ready: routing to
it``; a worker that was ready and stops answering, ``left the route table`` (a warning).
A worker not answering yet at start is no warning -- workers compile before they answer,
and a connection refused then is the normal course of a start: after
:data:`STARTUP_GRACE_SECONDS` without a ready answer from one, one info line says the
gateway is still waiting for it and why. The gateway's own ``gateway ready`` line comes
when it goes from no worker ready to one (not on the first round: the ``gateway
started`` line says that).

**Shared-memory registrations follow the workers.** The gateway remembers every region it
registered (:class:`Registrations`); when it reaches a worker over a new connection (the
worker joined or restarted), it registers them all there before the worker is routed to,
so a region registered through the gateway works on every worker that serves.

The probe calls run on the asyncio loop (:mod:`.pool`); this module's Trio side awaits them
with :func:`~reactantserver.transport.guest.aio`, once per round.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

import attrs
import trio

from ..grpcwire import StatusCode
from ..protocol import inference as pb
from ..protocol import reactant_control as cpb
from ..transport import guest
from .channel import ChannelError, Reply
from .core.routing import Router
from .core.table import ModelSnapshot, RouteTable, WorkerSnapshot, build_table
from .pool import WorkerClient

log = logging.getLogger(__name__)

SERVER_READY = b"/inference.GRPCInferenceService/ServerReady"
REPOSITORY_INDEX = b"/inference.GRPCInferenceService/RepositoryIndex"
MODEL_CONTROL_STATUS = b"/reactant_control.ControlService/ModelControlStatus"
SHM_REGISTER = b"/inference.GRPCInferenceService/SystemSharedMemoryRegister"
#: The least time between two rounds the request path asks for.
REFRESH_INTERVAL = 1.0
#: How long a worker may go without a ready answer after the gateway started before the
#: log says the gateway is still waiting for it (once, at info: a slow start is no fault).
STARTUP_GRACE_SECONDS = 60.0


class GatewayWedged(Exception):
    """No worker answered for ``wedge_exit_rounds x health_interval_seconds`` seconds: the
    gateway should restart."""


#: Seconds between two wake-ups of the loop-lag meter's task.
LAG_PERIOD = 0.1


class LoopLag:
    """How long the event loop was held up: the seconds by which a task that sleeps
    ``period`` seconds at a time woke up late, summed (sans-IO: given ``now``).

    ``beat(now)`` is the task waking; ``held(now)`` is the sum so far, with the hold-up
    still in progress (a wake-up overdue by now) included, so a reader that runs before
    the late task does still counts it. Only differences of ``held`` mean anything.
    """

    def __init__(self, now: float, period: float = LAG_PERIOD) -> None:
        self.period = period
        self.last = now
        self.stalled = 0.0

    def beat(self, now: float) -> None:
        self.stalled += max(0.0, now - self.last - self.period)
        self.last = now

    def held(self, now: float) -> float:
        return self.stalled + max(0.0, now - self.last - self.period)


class WedgeWatch:
    """When the gateway counts as wedged: no probe answered for ``limit`` seconds of time
    the loop had since the last one that was (sans-IO: every call is given ``now`` and
    ``held``, the :class:`LoopLag` reading at ``now``).

    Nothing counts before the first answer (the workers may still be starting), and a
    ``limit`` of 0 disables it. However many rounds ran meanwhile -- periodic ones, or the
    request path's -- only the time since the last answer matters, less the time the
    gateway's own loop was held up meanwhile (module docstring).
    """

    def __init__(self, limit: float) -> None:
        self.limit = limit
        #: When a round last got an answer from some worker (None: never yet).
        self.last_answer: float | None = None
        #: The loop's held-up seconds (``LoopLag.held``) at that answer.
        self.held_at_answer = 0.0

    def observe(self, now: float, answered: bool, held: float = 0.0) -> None:
        """A round ended at ``now``; ``answered``: some worker answered it."""
        if answered:
            self.last_answer = now
            self.held_at_answer = held

    def deadline(self, held: float = 0.0) -> float | None:
        """When the gateway is wedged unless a worker answers first, or the loop is held up
        again (None: it cannot be)."""
        if self.limit <= 0 or self.last_answer is None:
            return None
        return self.last_answer + self.limit + (held - self.held_at_answer)

    def wedged(self, now: float, held: float = 0.0) -> bool:
        deadline = self.deadline(held)
        return deadline is not None and now >= deadline

    def silent_for(self, now: float, held: float = 0.0) -> float:
        """Seconds of loop time since the last answer (0 before the first)."""
        if self.last_answer is None:
            return 0.0
        return now - self.last_answer - (held - self.held_at_answer)


def probe_timeout(interval: float) -> float:
    """How long one worker may take to answer a round (the original's 8 s watchdog, less
    when probes are more frequent, never under 0.5 s)."""
    return min(8.0, max(0.5, interval))


@attrs.frozen(kw_only=True)
class WorkerProbe:
    """What the last round learned about one worker (for metrics, fan-out, readiness)."""

    address: str
    name: str
    #: It answered the round's questions (ready or not).
    answered: bool = False
    ready: bool = False
    #: Why it did not answer, or why it is not ready.
    problem: str = "not probed yet"


class Registrations:
    """Shared-memory regions registered through the gateway, to register on newcomers.

    ``replayed`` remembers, per worker, the connection count at the last replay: a higher
    count means a new connection, possibly a restarted worker with no regions.

    ``lock`` orders a replay against the fanned-out SystemSharedMemoryRegister/Unregister:
    without it a replay that read the table before a client's unregister could register a
    region on a worker after the unregister had removed it there (a region left behind that
    the client believes gone).
    """

    def __init__(self) -> None:
        #: (owner, region name) -> the registration request as the client sent it.
        self.regions: dict[tuple[str, str], bytes] = {}
        #: owner -> how many of those are its (read per forwarded ModelInfer: O(1)).
        self._owned: collections.Counter[str] = collections.Counter()
        self.replayed: dict[str, int] = {}
        self.lock = asyncio.Lock()

    def registered(self, owner: str, name: str, request: bytes) -> None:
        if (owner, name) not in self.regions:
            self._owned[owner] += 1
        self.regions[(owner, name)] = request

    def unregistered(self, owner: str, name: str) -> None:
        """``owner``'s region ``name`` is gone (all of ``owner``'s for ``name=""``)."""
        entries = [(owner, name)] if name else [e for e in self.regions if e[0] == owner]
        for entry in entries:
            if self.regions.pop(entry, None) is not None:
                self._owned[owner] -= 1
                if not self._owned[owner]:
                    del self._owned[owner]

    def owns(self, owner: str) -> bool:
        return owner in self._owned


async def _call(client: WorkerClient, path: bytes, payload: bytes, deadline: float) -> Reply:
    reply = await client.call(path, payload, deadline, probe=True)
    if reply.status not in (StatusCode.OK, StatusCode.UNIMPLEMENTED):
        raise ChannelError(f"{path.decode().rsplit('/', 1)[1]}: status {reply.status}: "
                           f"{reply.message}", unprocessed=True)  # fmt: skip
    return reply


async def probe_worker(
    client: WorkerClient, timeout: float, registrations: Registrations
) -> tuple[WorkerSnapshot, WorkerProbe]:
    """One worker's answers as a snapshot (asyncio side; never raises)."""
    deadline = asyncio.get_running_loop().time() + timeout
    try:
        ready_reply = await _call(client, SERVER_READY, b"", deadline)
        ready = pb.ServerReadyResponse().parse(bytes(ready_reply.payload)).ready
        index_reply = await _call(client, REPOSITORY_INDEX, b"", deadline)
        index = pb.RepositoryIndexResponse().parse(bytes(index_reply.payload))
        control_reply = await _call(client, MODEL_CONTROL_STATUS, b"", deadline)
        if ready and registrations.regions:
            await _replay(client, registrations, deadline)
    except Exception as exc:  # the worker is unreachable, or answers nonsense
        problem = str(exc) or type(exc).__name__
        return (
            WorkerSnapshot(address=client.address, name=client.name, ready=False),
            WorkerProbe(address=client.address, name=client.name, problem=problem),
        )
    control = (
        cpb.ModelControlStatusResponse().parse(bytes(control_reply.payload))
        if control_reply.status == StatusCode.OK
        else cpb.ModelControlStatusResponse()
    )
    status = {m.name: m for m in control.models}
    models = []
    for entry in index.models:
        known = status.get(entry.name)
        models.append(
            ModelSnapshot(
                name=entry.name,
                ready=entry.state == "READY",
                loaded=known is not None,
                pinned=known is not None and known.residency == cpb.Residency.PINNED_DEVICE,
                weight_nbytes=known.weight_nbytes if known else 0,
                max_batch_size=known.max_batch_size if known else 0,
                batch_input_name=known.batch_input_name if known else "",
                batch_axis=known.batch_axis if known else 0,
                queue_depth=known.queue_depth if known else 0,
                total_compute_seconds=known.total_compute_seconds if known else 0.0,
                requests_served=known.requests_served if known else 0,
                rows_served=known.rows_served if known else 0,
                dispatch_count=known.dispatch_count if known else 0,
            )
        )
    snapshot = WorkerSnapshot(
        address=client.address,
        name=client.name,
        ready=ready,
        discipline=control.discipline,
        residency_mode=control.residency_mode or "self_managed",
        weight_cache_max_bytes=control.weight_cache_max_bytes,
        models=tuple(models),
    )
    problem = "" if ready else "ServerReady answers false (starting, draining or no model)"
    probe = WorkerProbe(
        address=client.address, name=client.name, answered=True, ready=ready, problem=problem
    )
    return snapshot, probe


async def _replay(client: WorkerClient, registrations: Registrations, deadline: float) -> None:
    async with registrations.lock:
        connects = client.statistics().connects
        if registrations.replayed.get(client.address) == connects:
            return
        for (owner, name), request in list(registrations.regions.items()):
            reply = await client.call(SHM_REGISTER, request, deadline, probe=True, owner=owner)
            if reply.status != StatusCode.OK:
                log.warning(
                    "could not register shared-memory region %r on worker %s (it joined or "
                    "reconnected): status %d: %s",
                    name,
                    client.label,
                    reply.status,
                    reply.message,
                )
        registrations.replayed[client.address] = connects


class Prober:
    """The periodic probe and the on-demand round (see the module docstring)."""

    def __init__(
        self,
        clients: Sequence[WorkerClient],
        router: Router,
        *,
        interval: float,
        wedge_exit_rounds: int = 0,
        registrations: Registrations | None = None,
        on_table: Callable[[RouteTable], None] | None = None,
        gather: Callable[[], Awaitable[list[tuple[WorkerSnapshot, WorkerProbe]]]] | None = None,
    ) -> None:
        """``gather`` runs one round's probes (default: every client's, on the asyncio
        side); a test gives a fake one and drives the prober in virtual time."""
        self.clients = tuple(clients)
        self.router = router
        self.interval = interval
        self.timeout = probe_timeout(interval)
        self.wedge_exit_rounds = wedge_exit_rounds
        self.wedge = WedgeWatch(wedge_exit_rounds * interval)
        #: The loop's hold-ups (started by :meth:`run`; none while it is not running).
        self.lag: LoopLag | None = None
        #: What the last round said of each worker, kept for a round that cannot judge it.
        self._snapshots: dict[str, WorkerSnapshot] = {}
        self.registrations = registrations if registrations is not None else Registrations()
        self.probes: Mapping[str, WorkerProbe] = {
            c.address: WorkerProbe(address=c.address, name=c.name) for c in self.clients
        }
        self.rounds = 0
        self._on_table = on_table
        self._gather_round = gather if gather is not None else self._gather
        self._lock = trio.Lock()
        #: When the first round began (the start-up grace counts from it).
        self._started_at: float | None = None
        #: Workers that answered ready once, and those the log said it still waits for.
        self._seen_ready: set[str] = set()
        self._waiting_said: set[str] = set()

    @property
    def table(self) -> RouteTable:
        return self.router.table

    def answering(self) -> tuple[WorkerClient, ...]:
        """The workers that answered the last round (ready or not), in configured order."""
        return tuple(c for c in self.clients if self.probes[c.address].answered)

    def ready(self) -> tuple[bool, str]:
        """Readiness of the gateway: at least one worker ready (for /readyz and Health)."""
        if any(p.ready for p in self.probes.values()):
            return True, ""
        problems = "; ".join(f"{p.name}: {p.problem}" for p in self.probes.values())
        return False, f"no worker is ready ({problems})"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Probe every ``interval`` seconds until cancelled (first round before ``started``);
        raise :class:`GatewayWedged` when :attr:`wedge` says so after a round."""
        self.lag = LoopLag(trio.current_time())
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._measure_lag, self.lag)
                await self.probe_round()
                task_status.started()
                why = await self._rounds()
                nursery.cancel_scope.cancel()
        finally:
            self.lag = None
        raise GatewayWedged(why)

    async def _rounds(self) -> str:
        """The periodic rounds, until the watch says the gateway is wedged: why."""
        while True:
            wake = trio.current_time() + self.interval
            deadline = self.wedge.deadline(self._held())
            if deadline is not None:
                wake = min(wake, deadline)  # a last round at the limit, not up to a period late
            await trio.sleep_until(wake)
            await self.probe_round()
            now = trio.current_time()
            held = self._held()
            if self.wedge.wedged(now, held):
                return (
                    f"no worker answered for {self.wedge.silent_for(now, held):.1f} s "
                    f"(wedge_exit_rounds {self.wedge_exit_rounds} x health_interval_seconds "
                    f"{self.interval:g}); exiting to be restarted"
                )

    @staticmethod
    async def _measure_lag(lag: LoopLag) -> None:
        while True:
            await trio.sleep(lag.period)
            lag.beat(trio.current_time())

    def _held(self) -> float:
        return 0.0 if self.lag is None else self.lag.held(trio.current_time())

    async def probe_round(self) -> RouteTable:
        """One round now (waits for a round already running, then runs its own)."""
        async with self._lock:
            if self._started_at is None:
                self._started_at = trio.current_time()
            held_before = self._held()
            results = await self._gather_round()
            now = trio.current_time()
            held = self._held()
            if held - held_before >= self.timeout / 4:
                results = self._unjudged(results, held - held_before)
            snapshots = [snapshot for snapshot, _ in results]
            self._snapshots = {snapshot.address: snapshot for snapshot in snapshots}
            probes = {probe.address: probe for _, probe in results}
            self._log_changes(probes, now)
            self.probes = probes
            table = build_table(self.router.table, snapshots)
            self.router.update(table)
            self.rounds += 1
            self.wedge.observe(now, any(p.answered for p in probes.values()), held)
            if self._on_table is not None:
                self._on_table(table)
            return table

    def _unjudged(
        self, results: Sequence[tuple[WorkerSnapshot, WorkerProbe]], held: float
    ) -> list[tuple[WorkerSnapshot, WorkerProbe]]:
        """A round during which the loop was held up for ``held`` seconds: a worker it got
        no answer from keeps what the last round said of it (module docstring)."""
        out = []
        for snapshot, probe in results:
            before = self._snapshots.get(probe.address)
            if probe.answered or before is None:
                out.append((snapshot, probe))
                continue
            log.info(
                "worker %s did not answer a probe round during which the gateway's own loop "
                "was held up for %.1f s; not judged by it",
                probe.name,
                held,
            )
            out.append((before, self.probes.get(probe.address, probe)))
        return out

    async def _gather(self) -> list[tuple[WorkerSnapshot, WorkerProbe]]:
        return list(
            await guest.aio(
                asyncio.gather(
                    *(probe_worker(c, self.timeout, self.registrations) for c in self.clients)
                )
            )
        )

    def _log_changes(self, probes: Mapping[str, WorkerProbe], now: float) -> None:
        was_ready = any(p.ready for p in self.probes.values())
        for address, probe in probes.items():
            before = self.probes.get(address)
            if probe.ready:
                self._seen_ready.add(address)
            elif address not in self._seen_ready and address not in self._waiting_said:
                assert self._started_at is not None
                if now - self._started_at >= STARTUP_GRACE_SECONDS:
                    self._waiting_said.add(address)
                    log.info(
                        "still waiting for worker %s, %.0f s after the gateway started: %s",
                        probe.name,
                        now - self._started_at,
                        probe.problem,
                    )
            if before is None or before.ready == probe.ready:
                continue
            if probe.ready:
                log.info("worker %s is ready: routing to it", probe.name)
            else:
                log.warning("worker %s left the route table: %s", probe.name, probe.problem)
        ready = sum(p.ready for p in probes.values())
        if ready and not was_ready and self.rounds > 0:
            log.info("gateway ready: %d of %d workers ready", ready, len(probes))


class Refresher:
    """The request path's way to ask for a probe round: single flight, at most one a second.

    Lives on the asyncio side. ``run_round`` crosses into Trio (a
    :class:`~reactantserver.transport.guest.TrioPortal` call of :meth:`Prober.probe_round`);
    callers that arrive while a round runs wait for that round, and a call within
    :data:`REFRESH_INTERVAL` of the last round's end returns at once.
    """

    def __init__(
        self,
        run_round: Callable[[], Awaitable[object]],
        *,
        interval: float = REFRESH_INTERVAL,
        on_request: Callable[[bool], None] | None = None,
    ) -> None:
        self._run_round = run_round
        self._interval = interval
        self._on_request = on_request
        self._running: asyncio.Future[None] | None = None
        self._last = -float("inf")

    async def refresh(self, deadline: float) -> None:
        """A round, if due, waited for at most until ``deadline`` (``loop.time()``)."""
        running = self._start()
        if running is None:
            return
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(asyncio.shield(running), max(0.0, deadline - loop.time()))
        except TimeoutError:
            return

    def soon(self) -> None:
        """A round, if due, without waiting for it."""
        self._start()

    def _start(self) -> asyncio.Future[None] | None:
        loop = asyncio.get_running_loop()
        if self._running is not None:
            if self._on_request is not None:
                self._on_request(False)
            return self._running
        if loop.time() - self._last < self._interval:
            if self._on_request is not None:
                self._on_request(False)
            return None
        if self._on_request is not None:
            self._on_request(True)
        self._running = asyncio.ensure_future(self._round())
        return self._running

    async def _round(self) -> None:
        try:
            await self._run_round()
        except Exception:
            log.exception("an on-demand probe round failed")
        finally:
            self._last = asyncio.get_running_loop().time()
            self._running = None
