"""The corked writes of our HTTP/2 connections' asyncio edges.

:class:`CorkedTransport`: everything written during one read's callback, or else
during one pass of the event loop, leaves in one ``send`` (a unary answer is written in
three steps; each ``send`` releases the GIL, and the event loop then waits on the
device thread). :class:`HeldWrites` says which: writes made inside a connection's
``data_received`` go out as it returns.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

__all__ = [
    "FLUSH_BYTES",
    "CorkedTransport",
    "HeldWrites",
    "held_writes",
]

#: Buffered writes at least this large are sent at once instead of at the end of the pass.
FLUSH_BYTES = 256 * 1024


class HeldWrites:
    """The flushes owed when the protocol callback running on this thread returns.

    A connection's ``data_received`` runs between :meth:`enter` and :meth:`leave`; a cork
    written to meanwhile owes its flush here (:meth:`flush_soon`), run as the outermost
    callback returns: the writes a read provokes leave in one ``send`` per connection,
    without the extra loop pass a ``call_soon`` costs (about 2 % of a forwarded request's
    CPU). A write made anywhere else (a timer, a task) flushes by ``call_soon``. One per
    thread (:func:`held_writes`): each thread runs its own loop.

    A callback may also owe *work* to its own end (:meth:`run_after`): the host loop's
    pass of the dispatch loop (``guest.call_soon``) runs there, after the whole read has
    been handled and before the flushes, so its answers leave in the read's ``send``.
    """

    def __init__(self) -> None:
        self.depth = 0
        self._owed: list[Callable[[], None]] = []
        self._after: list[Callable[[], object]] = []

    def flush_soon(self, loop: asyncio.AbstractEventLoop, flush: Callable[[], None]) -> None:
        """Run ``flush`` when the protocol callback running now returns or, outside one, on
        the loop's next pass (``call_soon``)."""
        if self.depth:
            self._owed.append(flush)
        else:
            loop.call_soon(flush)

    def run_after(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` as the outermost protocol callback running now returns, before its
        flushes (what ``fn`` writes is held with the rest). Only inside one (``depth``)."""
        assert self.depth, "run_after outside a protocol callback"
        self._after.append(fn)

    def enter(self) -> None:
        """A protocol callback starts (pair with :meth:`leave` in ``finally``)."""
        self.depth += 1

    def leave(self) -> None:
        """It returned: the outermost one runs the work owed to its end
        (:meth:`run_after`), then every owed flush."""
        if self.depth == 1 and self._after:
            self._run_after()
        self.depth -= 1
        if not self.depth and self._owed:
            self.send_now()

    def send_now(self) -> None:
        """Run every flush owed so far, now: what was written until here leaves in one
        ``send`` per connection before the callback goes on (a lone request's answer,
        ahead of its batch's bookkeeping: ``scheduling/dispatch.py``). A write made after
        it owes its flush again, as any write does."""
        owed, self._owed = self._owed, []
        for flush in owed:
            try:
                flush()
            except Exception:  # one connection's failure is not the others'
                log.exception("writing a connection's output failed")

    def _run_after(self) -> None:
        while self._after:  # work that owes more work runs it too, in order
            after, self._after = self._after, []
            for fn in after:
                try:
                    fn()
                except Exception:  # as asyncio's handler would for a callback of its own
                    log.exception("work run at the end of a protocol callback failed")


_PER_THREAD = threading.local()


def held_writes() -> HeldWrites:
    """This thread's :class:`HeldWrites` (made on first use).

    A connection takes it once, when it is made on its loop's thread, and keeps the plain
    object: an attribute of a ``threading.local`` costs about four times a plain one to
    read (384 against 95 ns per enter and leave), and every read and every write asks.
    """
    held: HeldWrites | None = getattr(_PER_THREAD, "held", None)
    if held is None:
        held = _PER_THREAD.held = HeldWrites()
    return held


class CorkedTransport:
    """An asyncio transport's writes, gathered per loop pass.

    ``write`` appends to a list and, the first time, owes ``flush`` to the protocol
    callback running now (:func:`held_writes`) or, outside one, schedules it with ``call_soon``:
    everything written until then goes out in one ``send``. Past :data:`FLUSH_BYTES` the
    buffer is sent at once, so big messages are not held (nor copied into one huge join).
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held = held_writes()  # made on the loop's thread
        self._pending: list[bytes] = []
        self._size = 0
        self._scheduled = False
        #: The connection's output is over (:meth:`end`): nothing more is written.
        self._ended = False

    def write(self, data: bytes) -> None:
        if not data:
            return
        self._pending.append(data)
        self._size += len(data)
        if self._size >= FLUSH_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._held.flush_soon(self._loop, self.flush)

    def flush(self) -> None:
        self._scheduled = False  # a flush still scheduled after an early one is a no-op
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        self._size = 0
        if not self._ended and not self._transport.is_closing():
            self._transport.write(data)

    def end(self) -> bool:
        """Send what is corked, then our FIN where the transport can half-close; what is
        written later is dropped. Whether the FIN went: not under TLS, which cannot
        half-close, nor on a transport already closing.

        The peer may still write, and the protocol goes on reading.
        """
        self.flush()
        self._ended = True
        if self._transport.is_closing() or not self._transport.can_write_eof():
            return False
        self._transport.write_eof()
        return True

    def discard(self) -> None:
        self._pending.clear()
        self._size = 0

    def close(self) -> None:
        self.flush()  # e.g. a GOAWAY written just before closing
        self._transport.close()
