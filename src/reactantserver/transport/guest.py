"""Trio as a guest of asyncio: where the two event loops of a process meet.

The gRPC server's connections are asyncio protocols (``h2guard.py``, around our own sans-IO
HTTP/2), and its direct methods answer from the loop's callbacks; asyncio became the host
for grpclib, which runs on asyncio only (its issue #19), whose records (handler tables,
status codes, ``GRPCError``) are all the server still takes from it. Instead of hosting an asyncio loop inside
Trio (trio-asyncio: every call crosses twice, through a queue), a reactantserver process
runs the standard-library asyncio loop and starts Trio as its *guest*
(``trio.lowlevel.start_guest_run``). Both run on the main thread and take turns: Trio's
scheduler runs in short ticks that asyncio schedules as ordinary callbacks, and Trio's
I/O wait happens in a helper thread that hands readiness back through
``loop.call_soon_threadsafe``. Trio still owns the structure of the process -- every
nursery, the dispatch loop, the lifecycle, the signals; asyncio hosts the server's
connections and the calls they run, and nothing else.

Theory of operation
-------------------
:func:`run` is the process's entry point: ``run(main, *args)`` starts a fresh asyncio
loop (the standard one, on purpose: uvloop's ``call_later`` rounds delays under 1 ms to
0, which breaks sub-millisecond deadlines), starts ``main`` as the Trio guest, and
returns what ``main`` returns (or raises what it raises) once the Trio run is over and
the asyncio tasks it left behind were cancelled. The asyncio loop never outlives Trio,
and Trio never outlives the loop.

Crossing from Trio to asyncio is free: Trio code runs inside an asyncio callback, so it
may call any synchronous asyncio API of the running loop (``loop.create_task``,
``future.set_result``) directly. :func:`aio` awaits an asyncio awaitable from Trio:
cancelling the Trio side cancels the asyncio task and waits for it to finish (so nothing
it owns outlives the Trio scope), and its result or exception comes back.

Crossing from asyncio to Trio: Trio's run state belongs to the thread for the whole
guest run, so asyncio code on the main thread may call Trio's *synchronous* primitives
directly -- ``trio.current_time()``, ``Event.set()``, ``CancelScope.cancel()``,
``Nursery.start_soon`` -- and Trio supports exactly that in guest mode: a task made
runnable from the host schedules Trio's next tick (when Trio sleeps in its I/O thread,
that thread is woken: one *wake-up crossing*, 80-110 us on a 2-core machine, paid
only when Trio was idle). This is how a ModelInfer handler queues a request and wakes
the dispatch loop without a hop (``worker/grpc.py``). For an ordered call on Trio's
next tick from any thread, use :meth:`TrioPortal.call_soon`; to run an async function
as a Trio task and await it, :meth:`TrioPortal.run` (a task in the portal's nursery
under its own cancel scope; cancelling the asyncio caller cancels that scope). Hot
paths cross once per *batch* of work, not once per request.

Invariants: every Trio task started through a portal has the portal's nursery as its
parent; an asyncio task awaited through :func:`aio` has finished before :func:`aio`
returns or raises; :func:`run` returns only after the Trio run has finished.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import outcome
import trio

from .h2conn import held_writes

T = TypeVar("T")

__all__ = ["TrioPortal", "aio", "call_soon", "run", "send_held"]


def run(
    main: Callable[..., Awaitable[T]],
    *args: Any,
    clock: trio.abc.Clock | None = None,
    instruments: Sequence[trio.abc.Instrument] = (),
) -> T:
    """Run ``main(*args)`` as a Trio guest of a new standard asyncio loop; its result.

    Blocks until the Trio run has finished, then cancels and awaits whatever asyncio
    tasks remain and closes the loop (``asyncio.run`` semantics). ``clock`` and
    ``instruments`` are ``trio.run``'s, so that pytest-trio can use this as its runner
    (``tests/conftest.py``: tests marked ``guest`` run exactly as the server does).
    """
    # An explicit loop factory: whatever event loop policy is installed, the host is the
    # standard selector loop.
    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        return runner.run(_host(main, args, clock, instruments))


async def _host(
    main: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    clock: trio.abc.Clock | None,
    instruments: Sequence[trio.abc.Instrument],
) -> T:
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[outcome.Outcome[T]] = loop.create_future()
    outer = getattr(_HOST, "loop", None)
    _HOST.loop = loop

    def done(result: outcome.Outcome[T]) -> None:
        if not finished.done():
            finished.set_result(result)

    trio.lowlevel.start_guest_run(
        main,
        *args,
        run_sync_soon_threadsafe=loop.call_soon_threadsafe,
        run_sync_soon_not_threadsafe=loop.call_soon,
        done_callback=done,
        # The standard loop only uses signal.set_wakeup_fd when add_signal_handler is
        # called, which reactantserver never does: Trio owns signal handling.
        host_uses_signal_set_wakeup_fd=False,
        clock=clock,
        instruments=instruments,
    )
    try:
        # Shielded: an asyncio-side cancellation (Ctrl-C through asyncio.run's handler)
        # must not leave the Trio run behind; Trio's own signal handling decides how to stop.
        result = await asyncio.shield(finished)
    finally:
        _HOST.loop = outer
    return result.unwrap()


#: The host loop of the guest run on this thread (:func:`call_soon`; tests run servers
#: in threads of their own, each with its own loop).
_HOST = threading.local()


def call_soon(fn: Callable[[], object]) -> bool:
    """Run ``fn()`` on the host loop's next pass, after the callback running now, and say
    True; False, with nothing scheduled, outside a guest run (a plain ``trio.run``).

    No crossing: the host loop runs it as any ready callback, Trio asleep or not, and the
    connection writes it makes leave as it returns, in one ``send`` per connection, as a
    read's do (:class:`.h2conn.HeldWrites`). The dispatch loop runs its tiny batches this
    way (``scheduling/dispatch.py``, "A lone request...").

    Called inside a connection's read with nothing else ready on the loop, ``fn`` runs as
    that read returns instead (``HeldWrites.run_after``): the same order -- the next pass
    would run it first of all, before the I/O it polls for -- without the pass itself (a
    zero-timeout ``epoll_wait``, the loop's bookkeeping: about 5 % of a lone request's
    CPU, docs/benchmarks.md). asyncio offers no public "is anything else ready?"; its
    loop's ready queue (``_ready``, CPython's since 3.4) is read where it exists, and
    everything is deferred where it does not.
    """
    loop: asyncio.AbstractEventLoop | None = getattr(_HOST, "loop", None)
    if loop is None:
        return False
    held = held_writes()
    if held.depth and not getattr(loop, "_ready", True):
        held.run_after(fn)  # its writes are held with the read's
    else:
        loop.call_soon(_holding_writes, fn)
    return True


def send_held() -> None:
    """Send what this thread's protocol callbacks have written so far, now, rather than
    as the outermost callback returns (:meth:`.h2conn.HeldWrites.send_now`): the
    dispatch loop's pass calls it once a lone request is answered, so the answer leaves
    before the bookkeeping that decides nothing in it (``scheduling/dispatch.py``)."""
    held_writes().send_now()


def _holding_writes(fn: Callable[[], object]) -> None:
    held = held_writes()
    held.enter()
    try:
        fn()
    finally:
        held.leave()


async def aio(awaitable: Awaitable[T]) -> T:
    """From Trio, await an asyncio coroutine or future running on the host loop.

    Cancelling the caller cancels the asyncio task and waits (shielded) until it has
    finished, then re-raises the cancellation.
    """
    future = asyncio.ensure_future(awaitable)
    if not future.done():
        token = trio.lowlevel.current_trio_token()
        settled = trio.Event()
        future.add_done_callback(lambda _: token.run_sync_soon(settled.set))
        try:
            await settled.wait()
        except trio.Cancelled:
            future.cancel()
            with trio.CancelScope(shield=True):
                await settled.wait()
            raise
    return future.result()


class TrioPortal:
    """The asyncio side's way into Trio: calls run on Trio's loop, tasks in one nursery.

    Create it inside Trio (``TrioPortal(nursery)``); use it from asyncio code running on
    the same host loop.
    """

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._token = trio.lowlevel.current_trio_token()

    @property
    def token(self) -> trio.lowlevel.TrioToken:
        return self._token

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on Trio's next tick (thread-safe, FIFO)."""
        self._token.run_sync_soon(fn, *args)

    async def run(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """From asyncio, run ``await fn(*args)`` as a Trio task in the portal's nursery.

        Cancelling the asyncio caller cancels the Trio task's scope; the caller then
        raises ``asyncio.CancelledError`` at once (the Trio task finishes on its own,
        still supervised by the nursery).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        scope = trio.CancelScope()

        async def task() -> None:
            with scope:
                try:
                    value = await fn(*args)
                except Exception as exc:
                    if not future.done():
                        future.set_exception(exc)
                    return
                except BaseException:
                    # Cancelled: the asyncio caller is gone or the nursery is closing.
                    if not future.done():
                        future.cancel()
                    raise
                if not future.done():
                    future.set_result(value)
            if scope.cancelled_caught and not future.done():
                future.cancel()

        self._token.run_sync_soon(self._nursery.start_soon, task)
        try:
            return await future
        except asyncio.CancelledError:
            self._token.run_sync_soon(scope.cancel)
            raise
