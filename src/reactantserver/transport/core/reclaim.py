"""Giving memory back after a hostile burst, so RSS returns near its baseline.

When thousands of streams end at once -- a client that opened many half-sent calls and
left, or a flood of refused requests -- their objects are freed, but the process keeps
their memory: connections, streams and cancelled tasks form reference cycles
that only Python's cycle collector frees, and what is freed goes back to the C heap, not
to the operating system. A server that survived an attack with its RSS 100 MB higher
looks, to an operator, like one that leaks.

Theory of operation
-------------------
:class:`ReclaimPolicy` is sans-IO: the server's periodic tick gives it the number of
open streams and the running total of client faults, and it answers whether to reclaim
now. It says yes once a *burst is over*: the open streams fell by at least
``stream_drop`` from their peak since the last reclaim, or at least ``fault_burst``
client faults arrived and none during the last tick. A normal workload (a few hundred
streams, no faults) never triggers it; a continuing attack triggers it at most once,
after it stops. :func:`release_memory` does the reclaim: a full ``gc.collect()`` and,
with glibc, ``malloc_trim(0)``, which returns free heap pages to the operating system.
The collection pauses the event loop (tens of milliseconds on a large heap), which is
why it runs only after bursts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

#: Open streams that must have ended since the peak for a reclaim.
STREAM_DROP = 1024
#: Client faults in a burst that make a reclaim worthwhile once the burst ends.
FAULT_BURST = 256


class ReclaimPolicy:
    """Decides when a burst is over (see the module docstring); given numbers, no clock."""

    def __init__(self, *, stream_drop: int = STREAM_DROP, fault_burst: int = FAULT_BURST) -> None:
        self._stream_drop = stream_drop
        self._fault_burst = fault_burst
        self._peak = 0
        self._faults_seen = 0
        self._faults_reclaimed = 0

    def due(self, open_streams: int, peak_streams: int, faults_total: int) -> bool:
        """One tick: whether to reclaim now (and, if so, start counting afresh).

        ``peak_streams`` is the most streams open at once since the previous tick.
        """
        self._peak = max(self._peak, peak_streams, open_streams)
        fault_burst_over = (
            faults_total == self._faults_seen
            and faults_total - self._faults_reclaimed >= self._fault_burst
        )
        self._faults_seen = faults_total
        if self._peak - open_streams >= self._stream_drop or fault_burst_over:
            self._peak = open_streams
            self._faults_reclaimed = faults_total
            return True
        return False


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc: nothing to trim with
        return None
    return trim


_TRIM = _malloc_trim()


def release_memory() -> None:
    """Free cyclic garbage, then hand free heap pages back to the operating system."""
    freed = gc.collect()
    if _TRIM is not None:
        _TRIM(0)
    log.debug("reclaimed memory after a burst: %d objects in cycles freed", freed)
