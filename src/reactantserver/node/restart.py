"""When to restart a child that exited: capped exponential backoff and a restart budget.

Theory of operation
-------------------
Sans-IO: the supervisor tells a ``RestartPolicy`` when its child started and when it
exited, with the current time, and gets back a decision. Nothing here sleeps or reads a
clock, so the rules are tested on plain numbers (tests/node/test_node_restart.py).

The rules (one policy per child):

* A run that lasted at least ``stable_seconds`` (60) was healthy: the count of
  consecutive failures starts again from zero.
* Every exit outside a shutdown is a failure, whatever its status (a worker is meant to
  run until it is told to stop). After the *n*-th consecutive failure the child is
  restarted after ``min(2 ** (n - 1), cap)`` seconds (1, 2, 4, ... 30).
* With ``max_restarts`` > 0, the failure that would need restart number
  ``max_restarts + 1`` in a row is the end: the policy answers ``GiveUp`` and the
  supervisor stops the node with exit status 1, leaving the next step to whatever runs
  it (a container restart policy, Kubernetes). 0 restarts forever.

Invariants (tests/node/test_node_restart.py, Hypothesis): a delay is never more than the cap
nor less than 1 s; a child that keeps failing fast gets delays 1, 2, 4, ... capped; a
stable run always resets the sequence to 1 s; with a budget of *m*, ``GiveUp`` comes
exactly at the (*m*+1)-th consecutive fast failure and never earlier.
"""

from __future__ import annotations

import attrs

BACKOFF_CAP_SECONDS = 30.0
STABLE_SECONDS = 60.0


@attrs.frozen
class Restart:
    """Start the child again after ``delay`` seconds; it is restart number ``attempt`` in
    a row."""

    delay: float
    attempt: int


@attrs.frozen
class GiveUp:
    """The child failed ``failures`` times in a row, more than the budget allows."""

    failures: int
    max_restarts: int


Decision = Restart | GiveUp


class RestartPolicy:
    """One child's restart bookkeeping (see the module doc)."""

    def __init__(
        self,
        max_restarts: int = 0,
        *,
        cap: float = BACKOFF_CAP_SECONDS,
        stable_seconds: float = STABLE_SECONDS,
    ) -> None:
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0 (0 = forever); got {max_restarts}")
        self.max_restarts = max_restarts
        self.cap = cap
        self.stable_seconds = stable_seconds
        #: Consecutive failures so far (reset by a stable run).
        self.failures = 0
        self._started_at: float | None = None

    def started(self, now: float) -> None:
        self._started_at = now

    def exited(self, now: float) -> Decision:
        """The child exited at ``now`` (not because the node is stopping)."""
        if self._started_at is not None and now - self._started_at >= self.stable_seconds:
            self.failures = 0
        self._started_at = None
        self.failures += 1
        if self.max_restarts and self.failures > self.max_restarts:
            return GiveUp(self.failures, self.max_restarts)
        return Restart(min(2.0 ** (self.failures - 1), self.cap), self.failures)
