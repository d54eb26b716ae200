"""One model's queue: FIFO with a committed prefix and a lazily cleaned deadline heap.

Layout of ``ModelQueue._items`` (a deque)::

    [ committed sub-calls, in arrival order | regular requests, in arrival order ]

Committed requests (meta-model sub-calls whose parent is already running) go to the
front, behind earlier committed ones, so they run before anything the discipline
would pick; regular requests append. Nothing else ever reorders a queue: FIFO within
a model holds for every discipline, EDF included.

EDF needs the soonest deadline *anywhere* in the queue, not just at the head. A heap
of ``(deadline, seq, request)`` gives it in O(log n); entries of requests that left
the queue are discarded when they surface at the top, and the heap is rebuilt from the
queued requests whenever a push finds it more than twice the queue's length (+16), so
removal stays O(1) on the heap side and the heap -- with the requests and payloads its
entries hold -- stays bounded by the queue under every discipline, also those that never
read it.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterator

from .records import Request, RequestState


class ModelQueue:
    """The queued requests of one model (see the module docstring)."""

    __slots__ = ("_committed", "_deadlines", "_items", "_rows")

    def __init__(self) -> None:
        self._items: deque[Request] = deque()
        self._committed = 0
        self._rows = 0
        self._deadlines: list[tuple[float, int, Request]] = []

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._items)

    @property
    def rows(self) -> int:
        """Rows waiting in total."""
        return self._rows

    @property
    def head(self) -> Request:
        """The request that runs first (the queue must not be empty)."""
        return self._items[0]

    def push(self, request: Request) -> None:
        """Queue ``request``: committed ones behind earlier committed ones, others last."""
        if request.committed:
            # deque.insert is O(min(i, n - i)); the committed prefix is tiny
            # (at most one per in-flight meta request).
            self._items.insert(self._committed, request)
            self._committed += 1
        else:
            self._items.append(request)
        self._rows += request.rows
        if request.deadline is not None:
            if len(self._deadlines) > 2 * len(self._items) + 16:
                self._prune()
            heapq.heappush(self._deadlines, (request.deadline, request.seq, request))

    def remove(self, request: Request) -> None:
        """Take ``request`` out from anywhere in the queue (it must be in it)."""
        self._items.remove(request)  # identity: Request has eq=False
        if request.committed:
            self._committed -= 1
        self._rows -= request.rows

    def window(self) -> Iterator[Request]:
        """The coalescing window: the leading run of requests in the head's group."""
        if not self._items:
            return iter(())
        group = self._items[0].group
        return itertools.takewhile(lambda r: r.group == group, self._items)

    def take(self, count: int) -> list[Request]:
        """Pop the first ``count`` requests."""
        taken = [self._items.popleft() for _ in range(count)]
        for request in taken:
            if request.committed:
                self._committed -= 1
            self._rows -= request.rows
        return taken

    def drain(self) -> list[Request]:
        """Pop everything, in queue order."""
        taken = list(self._items)
        self._items.clear()
        self._committed = 0
        self._rows = 0
        self._deadlines.clear()
        return taken

    def soonest_deadline(self) -> float:
        """The earliest deadline among queued requests (``inf`` if none has one)."""
        heap = self._deadlines
        while heap and heap[0][2].state is not RequestState.QUEUED:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def _prune(self) -> None:
        """Keep only the entries of queued requests: stale ones (requests taken or
        removed while not at the heap's top) would otherwise pile up under a live top."""
        self._deadlines = [e for e in self._deadlines if e[2].state is RequestState.QUEUED]
        heapq.heapify(self._deadlines)
