"""Rate-limited logging of client mistakes: one line per kind per interval, with a count.

A hostile or broken client can make thousands of mistakes a second; logging each one
would let it flood the log (and spend the server's CPU on formatting). A client's
mistake is also never worth a traceback: the status it got says what to fix, and the
traceback would only show our own, correct, code refusing it.

Theory of operation
-------------------
:class:`FaultLog` keeps, per :class:`~.limits.Fault` kind, when it may next write a line
and how many occurrences it held back since its last line. :meth:`FaultLog.report`
writes the first occurrence of a kind at once (with the peer and the detail), then holds
back further ones of that kind until ``interval`` seconds have passed; the next line of
that kind says how many were held back. :meth:`FaultLog.flush`, called periodically by
the server, writes the held-back counts of kinds whose interval is over, so a burst's
count is reported even if the burst stopped. It is given a clock (``now``) instead of
reading one, so tests drive it with plain numbers.

Invariants (``tests/transport/test_faultlog.py``): at most one line per kind per ``interval``;
every report is accounted for exactly once, in a line or in a later line's count, once
``flush`` runs after the interval; no line carries a traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .limits import Fault

log = logging.getLogger("reactantserver.transport.clients")

#: Seconds between two lines about the same kind of client mistake.
DEFAULT_INTERVAL = 30.0


class _Kind:
    __slots__ = ("held", "latest", "next_line_at", "window_start")

    def __init__(self) -> None:
        self.next_line_at = 0.0
        self.window_start = 0.0
        self.held = 0
        self.latest = ""


class FaultLog:
    """One log line per fault kind per ``interval``; see the module docstring."""

    def __init__(
        self,
        *,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        emit: Callable[[str], None] | None = None,
    ) -> None:
        self._interval = interval
        self._clock = clock
        self._emit = emit if emit is not None else self._log
        self._kinds: dict[Fault, _Kind] = {}

    @staticmethod
    def _log(line: str) -> None:
        log.info("%s", line)

    def report(self, fault: Fault, peer: str, detail: str) -> None:
        """One client mistake of kind ``fault`` by ``peer`` (``host:port``)."""
        now = self._clock()
        kind = self._kinds.get(fault)
        if kind is None:
            kind = self._kinds[fault] = _Kind()
        where = f" from {peer}" if peer else ""
        if now < kind.next_line_at:
            kind.held += 1
            kind.latest = f"{where}: {detail}"
            return
        line = f"client error [{fault.value}]{where}: {detail}"
        if kind.held:
            line += f" ({kind.held} more since the last line)"
        self._emit(line)
        kind.held = 0
        kind.window_start = now
        kind.next_line_at = now + self._interval

    def flush(self) -> None:
        """Write the held-back counts of every kind whose interval is over."""
        now = self._clock()
        for fault, kind in self._kinds.items():
            if kind.held and now >= kind.next_line_at:
                self._emit(
                    f"client error [{fault.value}]: {kind.held} more in the last "
                    f"{now - kind.window_start:.0f} s (latest{kind.latest})"
                )
                kind.held = 0
                kind.window_start = now
                kind.next_line_at = now + self._interval

    def pending(self) -> bool:
        """Whether some count is held back (the server keeps its flush timer only then)."""
        return any(kind.held for kind in self._kinds.values())
