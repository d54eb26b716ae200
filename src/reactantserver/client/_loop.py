"""Where the engine runs when the caller is not on asyncio: a private loop thread.

The client's connection runs on asyncio only. The blocking ``Client`` and ``AsyncClient`` under Trio
therefore run their :class:`~.core.Core` on a private asyncio loop on a daemon thread
(:class:`LoopThread`), one per client, and hand it coroutines with
``asyncio.run_coroutine_threadsafe``:

* a blocking caller waits on the returned ``concurrent.futures.Future``; an interrupt
  (``KeyboardInterrupt``) cancels the call on the loop before propagating;
* a Trio caller waits with :func:`trio_await`: the future's completion wakes the Trio
  task through its ``TrioToken`` (no thread is parked per call), and cancelling the Trio
  task cancels the asyncio task, which resets the HTTP/2 stream so the server drops the
  request too.

Why not share the caller's loops (the server runs Trio as the guest of an asyncio
loop)? A client cannot assume its Trio caller has an asyncio host, and the blocking
``Client`` needs a loop thread anyway. One mechanism serves both, costs one thread per client and a thread hop
per call (tens of microseconds, against a gRPC round trip of hundreds), and leaves the
caller's Trio run untouched.

This module imports neither trio nor sniffio at import time: a client that never meets
Trio never loads it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")

#: How long closing waits for the loop thread to finish its last work.
CLOSE_TIMEOUT = 10.0


class LoopThread:
    """A private asyncio event loop running forever on a daemon thread."""

    def __init__(self, name: str = "reactantserver-client") -> None:
        # Not asyncio.new_event_loop(): an installed event loop policy (uvloop's, say)
        # would decide the loop. A plain selector loop is all the connection needs.
        self.loop: asyncio.AbstractEventLoop = asyncio.SelectorEventLoop()
        self._closed = False
        started = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(started,), name=name, daemon=True)
        self._thread.start()
        started.wait()

    def _main(self, started: threading.Event) -> None:
        self.loop.call_soon(started.set)
        self.loop.run_forever()

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Schedule ``coro`` on the loop; its future."""
        if self._closed:
            coro.close()
            raise RuntimeError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the loop and wait for it (blocking the calling thread)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking Client cannot be called from its own loop")
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            # KeyboardInterrupt (or a failure of the call itself: then a no-op).
            future.cancel()
            raise

    def close(self, final: Callable[[], None] | None = None) -> None:
        """Run ``final`` on the loop, cancel what still runs there, stop and join (idempotent)."""
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            if final is not None:
                final()
            current = asyncio.current_task()
            pending = [t for t in asyncio.all_tasks() if t is not current]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            try:
                asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(CLOSE_TIMEOUT)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(CLOSE_TIMEOUT)
        if not self._thread.is_alive():
            self.loop.close()


async def trio_await(future: concurrent.futures.Future[_T]) -> _T:
    """Wait in Trio for ``future``; cancelling the waiting task cancels the future."""
    import trio

    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_: object) -> None:
        try:
            token.run_sync_soon(done.set)
        except trio.RunFinishedError:
            pass  # the Trio run ended meanwhile; nobody is waiting any more

    future.add_done_callback(wake)
    try:
        await done.wait()
    except BaseException:
        future.cancel()
        raise
    return future.result()
