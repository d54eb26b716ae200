"""One worker as the gateway talks to it: its connection, its stream slots, its counters.

Theory of operation
-------------------
A :class:`WorkerClient` owns at most one live :class:`~.channel.WorkerConnection` to its
worker. The connection is opened on the first call (one attempt at a time: concurrent
callers wait for the same attempt) and again after it is lost; a failed attempt fails the
calls that waited for it with ``ChannelError(unprocessed=True)`` -- nothing was sent.

Stream slots bound what is in flight to one worker: at most
``worker_client.max_concurrent_streams`` calls (or the worker's own advertised
``SETTINGS_MAX_CONCURRENT_STREAMS``, if lower) hold a slot; the others wait in arrival order
(first come, first served) until a slot frees or their deadline passes (then
``DeadlineExceeded``; nothing was sent). The wait is bounded in length too: every caller is
an inbound gateway call, which the gateway's admission cap already bounds.

The slot counts and the line are :class:`~.core.inflight.StreamSlots` (sans-IO: it decides who
holds a slot, who waits, who is next and whose deadline passed, given ``now``); this class
carries its decisions out. One line, two kinds of waiter: a coroutine
(:meth:`WorkerClient.call`, :meth:`WorkerClient.start_when_ready`) awaits a future; a
forwarded ModelInfer waits as a :class:`SlotWait`, without a task -- a freed slot is handed
to it synchronously, from the event handling of the worker connection that freed it, and it
starts its call there (:meth:`WorkerClient.start`, ``holding=True``). Their deadlines are
one heap under one timer, armed for the earliest. More calls in flight than slots is the usual case
for a busy gateway (64 requests in flight from its clients against 32 slots to the worker),
and a task, a future, a timer and their wake-ups per waiting call were a quarter of the
gateway's CPU there (docs/benchmarks.md, "Client shapes").

Entry points: :meth:`WorkerClient.call` (a coroutine's call: the fan-out, the prober, the
proxy's other RPCs); and for a forwarded call, the three its state machine
(:mod:`.core.callstate`) needs -- :meth:`~WorkerClient.start` (now, on a free or a granted
slot), :meth:`~WorkerClient.wait_for_slot` (in line, no task) and
:meth:`~WorkerClient.start_when_ready` (in a task, for the connection) -- with
:meth:`~WorkerClient.leave_line` and :meth:`~WorkerClient.slot_deadline` for its
:class:`SlotWait`.

Everything runs on the asyncio loop's thread; nothing here locks.

Invariants: a slot is taken and returned exactly once per call that took one (a waiter
cancelled after being handed a slot gives it back); ``active`` never exceeds the slot
limit in force when each slot was granted; at most one connection attempt is in flight;
a :class:`SlotWait` is in the line exactly while it waits, and ends once: granted,
expired or cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from typing import Protocol

import attrs

from ..config.rules import split_host_port
from ..errors import DeadlineExceeded
from ..transport.core.limits import WireLimits
from ..transport.tls import ClientTls, check_h2, client_tls
from .channel import (
    CONNECT_TIMEOUT,
    LIMITS,
    Call,
    ChannelError,
    Credentials,
    OnDone,
    Reply,
    WorkerConnection,
)
from .core.inflight import StreamSlots, Waiter, WorkerInflight

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class ClientStatistics:
    """One worker's connection and stream counts, for metrics."""

    address: str
    name: str
    connected: bool
    active_streams: int
    waiting: int
    stream_limit: int
    calls: int
    connects: int
    connect_failures: int


class SlotCaller(Protocol):
    """Who waits in a :class:`SlotWait` (a forwarded call, :class:`~.forward.Forward`)."""

    def granted(self) -> None:
        """Handed a stream slot, which it now holds: start the call on it
        (:meth:`WorkerClient.start` with ``holding=True``)."""

    def expired(self, exc: DeadlineExceeded) -> None:
        """The deadline passed in line; nothing was sent."""


class SlotWait(Waiter):
    """A caller in line for a stream slot without a task (:meth:`WorkerClient.wait_for_slot`):
    ``caller.granted`` runs once, holding the slot, when one is handed to it;
    ``caller.expired`` once, with why, if its deadline passes first; neither after
    :meth:`cancel`."""

    __slots__ = ("_client", "caller")

    def __init__(self, client: WorkerClient, deadline: float, caller: SlotCaller) -> None:
        self.deadline = deadline  # Waiter's fields, set here: one per call that waits
        self.waiting = False
        self._client = client
        self.caller: SlotCaller | None = caller

    def cancel(self) -> None:
        """The caller is gone: leave the line (after a grant, a no-op)."""
        self._client.leave_line(self)
        self.caller = None

    def expire(self) -> None:
        caller, self.caller = self.caller, None
        if caller is not None:
            caller.expired(self._client.slot_deadline())

    def grant(self) -> bool:
        """Handed a slot (already out of the line): the call starts on it."""
        caller, self.caller = self.caller, None
        # Ended either way: the line's deadline entry for this wait (dropped lazily,
        # :class:`~.core.inflight.StreamSlots`) keeps nothing of its call alive -- a call held
        # there outlived its answer and fed the cyclic collector's passes.
        if caller is not None:
            try:
                caller.granted()
            except (
                Exception
            ):  # the caller's bug: it must not reach the connection that freed the slot
                log.exception("starting a call on a freed stream slot failed")
        return True


class _FutureWait(Waiter):
    """A coroutine's place in the line (:meth:`WorkerClient._acquire`): a future."""

    __slots__ = ("future",)

    def __init__(self, deadline: float, future: asyncio.Future[None]) -> None:
        super().__init__(deadline)
        self.future = future

    def expire(self) -> None:
        if not self.future.done():
            self.future.set_exception(DeadlineExceeded("deadline"))

    def grant(self) -> bool:
        """Handed a slot: False when the coroutine is gone (cancelled), to pass it on."""
        if self.future.done():
            return False
        self.future.set_result(None)
        return True


class WorkerClient:
    """One worker's connection and stream slots (see the module docstring)."""

    def __init__(
        self,
        address: str,
        name: str = "",
        *,
        max_streams: int = 32,
        max_reply_bytes: int = 512 * 1024 * 1024,
        limits: WireLimits = LIMITS,
        inflight: WorkerInflight | None = None,
        tls: ClientTls | None = None,
        key: bytes = b"",
    ) -> None:
        parsed = split_host_port(address)
        if parsed is None:
            raise ValueError(f"expected host:port, got {address!r}")
        host, port = parsed
        self.address = address
        self.name = name or address
        self._host = host.strip("[]")
        self._port = port
        self._max_streams = max_streams
        self._max_reply = max_reply_bytes
        #: What its connections advertise to the worker and hold it to (:data:`.channel.LIMITS`).
        self._limits = limits
        #: TLS to the worker (None: cleartext), and what every request carries.
        self.tls = tls
        self.credentials = Credentials(tls=tls is not None, key=key)
        self._conn: WorkerConnection | None = None
        #: Replaced connections still finishing their calls.
        self._draining: set[WorkerConnection] = set()
        self._connecting: asyncio.Future[WorkerConnection] | None = None
        #: The loop the connections run on (known once one is opened): asked once, as
        #: Python 3.11's ``asyncio.get_running_loop`` makes a ``getpid`` system call.
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The worker's in-flight counts (shared with the router, :mod:`.core.inflight`): its
        #: stream slots and their line are decided there; one timer here, for the line's
        #: earliest deadline -- as the worker connection keeps its calls' deadlines.
        self.inflight = inflight if inflight is not None else WorkerInflight()
        self._slots: StreamSlots = self.inflight.slots
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._calls = 0
        self._connects = 0
        self._connect_failures = 0

    @property
    def label(self) -> str:
        """How messages name the worker: ``name (address)``, or the address alone."""
        return self.address if self.name == self.address else f"{self.name} ({self.address})"

    def statistics(self) -> ClientStatistics:
        conn = self._conn
        return ClientStatistics(
            address=self.address,
            name=self.name,
            connected=conn is not None and conn.usable,
            active_streams=self._slots.active,
            waiting=len(self._slots.line),
            stream_limit=self._limit(),
            calls=self._calls,
            connects=self._connects,
            connect_failures=self._connect_failures,
        )

    async def call(
        self,
        path: bytes,
        payload: bytes | memoryview,
        deadline: float,
        *,
        probe: bool = False,
        tell: bool = True,
        owner: str = "",
    ) -> Reply:
        """One unary call to ``path`` with ``payload``; see :mod:`.channel` for outcomes
        (and for ``tell``: send ``deadline`` to the worker).

        ``probe`` calls (the prober's) take no stream slot: a worker busy with
        ``max_concurrent_streams`` slow calls must still answer its probes, or it would be
        taken out of the route table for being busy. They still count against the worker's
        own stream limit, which a worker sets above the gateway's (128 against 32).
        """
        if not probe:
            await self._acquire(deadline)
        try:
            self._calls += 1
            conn = await self._usable(deadline)
            return await conn.call(path, payload, deadline, tell=tell, owner=owner)
        finally:
            if not probe:
                self._release()

    def start(
        self,
        path: bytes,
        payload: bytes | memoryview,
        deadline: float,
        on_done: OnDone,
        *,
        tell: bool = True,
        owner: str = "",
        holding: bool = False,
    ) -> Call | None:
        """Start a call at once, if the connection is up and a stream slot free (or held
        already: ``holding``, a :class:`SlotWait` was granted one). None if it would have
        to wait: for a slot (:meth:`wait_for_slot`) or the connection
        (:meth:`start_when_ready`; a slot held stays held). ``on_done`` runs once with the
        outcome; raises as :meth:`.WorkerConnection.start` (nothing sent, the slot given
        back)."""
        conn = self._conn
        if conn is None or not conn.usable:
            return None
        if not holding and not self._slots.take(conn.slot_limit(self._max_streams)):
            return None
        return self._start(conn, path, payload, deadline, on_done, tell, owner)

    def wait_for_slot(self, deadline: float, caller: SlotCaller) -> SlotWait | None:
        """Line up for a stream slot without a task, when :meth:`start` said to wait and a
        connection is up: ``caller.granted`` runs once, from the loop, holding a slot, or
        ``caller.expired`` once when ``deadline`` passes first. None when there is no
        usable connection: then wait with :meth:`start_when_ready`."""
        conn = self._conn
        if conn is None or not conn.usable or self._loop is None:
            return None
        wait = SlotWait(self, deadline, caller)
        self._join(wait)
        return wait

    def leave_line(self, wait: SlotWait) -> None:
        """``wait``'s caller is gone: out of the line (a no-op once granted or expired)."""
        self._slots.leave(wait)

    def slot_deadline(self) -> DeadlineExceeded:
        """Why a wait for one of this worker's stream slots ended at its deadline."""
        return DeadlineExceeded(
            f"the deadline passed while waiting for one of the {self._limit()} streams "
            f"to worker {self.label} (worker_client.max_concurrent_streams)"
        )

    def _join(self, wait: SlotWait | _FutureWait) -> None:
        """Line up ``wait``; the timer moves to its deadline if that is now the earliest."""
        if self._slots.join(wait) and wait.deadline < self._timer_at:
            self._arm(wait.deadline)

    def _arm(self, when: float) -> None:
        assert self._loop is not None
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self._loop.call_at(when, self._expire_waits)

    def _expire_waits(self) -> None:
        """The earliest deadline in line came: every waiter past its deadline is told."""
        assert self._loop is not None
        now = max(self._timer_at, self._loop.time())
        self._timer, self._timer_at = None, math.inf
        for wait in self._slots.expire(now):
            wait.expire()
        when = self._slots.next_deadline()
        if when < math.inf:
            self._arm(when)

    async def start_when_ready(
        self,
        path: bytes,
        payload: bytes | memoryview,
        deadline: float,
        on_done: OnDone,
        *,
        tell: bool = True,
        holding: bool = False,
        owner: str = "",
    ) -> Call:
        """:meth:`start`, after waiting (until ``deadline``) for a slot (unless ``holding``
        one already: ``start(..., holding=True)`` said None) and a connection."""
        if not holding:
            await self._acquire(deadline)
        try:
            conn = await self._usable(deadline)
        except BaseException:
            self._release()
            raise
        return self._start(conn, path, payload, deadline, on_done, tell, owner)

    def _start(
        self,
        conn: WorkerConnection,
        path: bytes,
        payload: bytes | memoryview,
        deadline: float,
        on_done: OnDone,
        tell: bool,
        owner: str = "",
    ) -> Call:
        """Start a call holding a slot; the slot is returned before ``on_done`` runs."""
        self._calls += 1
        try:
            return conn.start(
                path, payload, deadline, on_done, self._release, tell=tell, owner=owner
            )
        except BaseException:
            self._release()
            raise

    def close(self) -> None:
        """Close the connections (calls still open on them fail)."""
        for conn in (self._conn, *self._draining):
            if conn is not None:
                conn.close()
        self._conn = None

    async def wait_closed(self) -> None:
        conns = [c for c in (self._conn, *self._draining) if c is not None]
        self.close()
        for conn in conns:
            await conn.lost

    # ---------------------------------------------------------------- stream slots

    def _limit(self) -> int:
        conn = self._conn
        if conn is None or not conn.usable:
            return self._max_streams
        return self._limit_of(conn)

    def _limit_of(self, conn: WorkerConnection) -> int:
        """Stream slots on a usable connection: ours, or fewer if the worker allows fewer."""
        return conn.slot_limit(self._max_streams)

    async def _acquire(self, deadline: float) -> None:
        if self._slots.take(self._limit()):
            return
        self._loop = loop = asyncio.get_running_loop()
        wait = _FutureWait(deadline, loop.create_future())
        self._join(wait)
        try:
            await wait.future
        except asyncio.CancelledError:
            if wait.future.done() and not wait.future.cancelled():
                self._release()  # handed a slot just as we were cancelled: pass it on
            raise
        except DeadlineExceeded:
            raise self.slot_deadline() from None
        finally:
            self._slots.leave(wait)  # a no-op once granted or expired

    def _release(self) -> None:
        """A slot holder is done: the slot passes to the first waiter still there."""
        while (wait := self._slots.release()) is not None:
            if wait.grant():
                return

    # ---------------------------------------------------------------- the connection

    async def _usable(self, deadline: float) -> WorkerConnection:
        """The live connection, opened (or reopened) first if there is none."""
        conn = self._conn
        if conn is None or not conn.usable:
            conn = await self._connection(deadline)
        return conn

    async def _connection(self, deadline: float) -> WorkerConnection:
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        attempt = self._connecting
        loop = asyncio.get_running_loop()
        remaining = deadline - loop.time()
        try:
            return await asyncio.wait_for(asyncio.shield(attempt), timeout=max(0.0, remaining))
        except TimeoutError:
            raise DeadlineExceeded(
                f"the deadline passed while connecting to worker {self.label}"
            ) from None

    async def _connect(self) -> WorkerConnection:
        self._loop = loop = asyncio.get_running_loop()
        self._connects += 1
        try:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    context, server_hostname = client_tls(self.tls, self._host)
                    transport, conn = await loop.create_connection(
                        lambda: WorkerConnection(
                            self.address,
                            max_reply_bytes=self._max_reply,
                            limits=self._limits,
                            credentials=self.credentials,
                        ),
                        self._host,
                        self._port,
                        proto=socket.IPPROTO_TCP,
                        ssl=context,
                        server_hostname=server_hostname,
                    )
                    check_h2(transport, f"worker {self.label}")
            except (OSError, TimeoutError) as exc:
                self._connect_failures += 1
                raise ChannelError(
                    f"cannot connect to worker {self.label}: {exc or type(exc).__name__}",
                    unprocessed=True,
                ) from None
            old = self._conn
            self._conn = conn
            if old is not None and old.closed is None:
                # The old connection stopped taking new calls (the worker's GOAWAY): its
                # calls in flight finish there, and it closes itself once they have.
                self._draining.add(old)
                old.lost.add_done_callback(lambda _: self._draining.discard(old))
            return conn
        finally:
            self._connecting = None
