"""One abuse budget per connection: what a peer may make the server do for nothing.

Why
---
An HTTP/2 peer can make a server work without asking it for anything it serves, and the
stream limit alone does not bound it:

* **Rapid reset** (CVE-2023-44487): open calls and reset them at once. Each reset frees
  its stream's slot under SETTINGS_MAX_CONCURRENT_STREAMS after the server began work.
* **MadeYouReset** (CVE-2025-8671): the same, with the *server* sending the resets: the
  peer provokes a stream error on each call it opened (a WINDOW_UPDATE that overflows the
  stream's window, DATA or HEADERS on a stream it already ended, a malformed request) and
  the server, resetting the stream as the protocol says, frees the slot just the same. A
  budget that counts only the peer's own RST_STREAM frames never sees it.
* **Floods of frames that ask for nothing**: PING and SETTINGS (each one owes an ACK),
  DATA frames without payload or END_STREAM (CVE-2019-9518), frames on streams already
  reset (each one owes an RST_STREAM), streams past the limit (each one owes a
  REFUSED_STREAM).

Theory of operation
-------------------
:class:`AbuseBudget` is sans-IO: told what happened and *given* ``now``, it answers
``None`` (within budget) or the reason the connection is past it. Its one caller is
the HTTP/2 connection, :mod:`.core`, for both roles: it keeps the verdict, which the
server's edge (:mod:`..transport.h2guard`) reads to send GOAWAY ENHANCE_YOUR_CALM and close, and on
which the client role raises (its caller then sends the GOAWAY). Two rules, one budget:

1. **Calls ended for nothing** (Envoy's premature-reset rule, widened): a call reset by
   the peer within :data:`PREMATURE_RESET_SECONDS` of its start, and a running call reset
   on a stream error the peer provoked (a correct peer never provokes one), both count.
   Past :data:`RESET_MIN_STREAMS` calls, more such endings than half the calls is abuse:
   a client that cancels now and then, or whose deadlines expire under load, stays far
   below half.
2. **Frames for nothing**: a token bucket of :data:`FLOOD_BURST` tokens, refilled at
   :data:`FLOOD_RATE` per second and by :data:`FLOOD_PER_CALL` per call started (a client
   that pings once per answer, as gRPC's flow-control probes do, never runs dry); each
   wasted frame takes one. A stream the server was made to reset before its call started
   (the provoking frame read with its HEADERS) cost only that RST_STREAM and counts here.
   An empty bucket is abuse.

Invariants (``tests/h2/test_abuse.py``): the verdict depends only on the counts and the times
given; a connection's calls answered normally never spend the budget; within either rule's
bound no verdict is given, past it one is, on the event that crossed it.
"""

from __future__ import annotations

#: A peer's reset this soon after its call started counts as premature.
PREMATURE_RESET_SECONDS = 1.0
#: Calls a connection must have started before its stream endings are judged.
RESET_MIN_STREAMS = 200
#: Wasted frames a connection may send at once (the bucket's size).
FLOOD_BURST = 500
#: Wasted frames per second a connection may send for ever (the bucket's refill).
FLOOD_RATE = 100.0
#: Wasted frames each call started earns (a PING per answer, a WINDOW_UPDATE's SETTINGS...).
FLOOD_PER_CALL = 2


class AbuseBudget:
    """One connection's budget (module docstring); every method is given ``now``."""

    __slots__ = ("_at", "_credited", "_tokens", "peer_resets", "provoked", "streams", "wasted")

    def __init__(self, now: float) -> None:
        #: Calls started on the connection (streams that got a handler), counted by the caller.
        self.streams = 0
        #: Calls the peer reset prematurely, and streams the server was made to reset.
        self.peer_resets = 0
        self.provoked = 0
        #: Wasted frames so far (for the message; the bucket decides).
        self.wasted = 0
        self._tokens = float(FLOOD_BURST)
        self._at = now
        #: :attr:`streams` when the bucket was last refilled.
        self._credited = 0

    def peer_reset(self, started_at: float, now: float) -> str | None:
        """The peer reset a call that started at ``started_at``."""
        if now - started_at >= PREMATURE_RESET_SECONDS:
            return None
        self.peer_resets += 1
        return self._judge_streams()

    def provoked_resets(self, count: int) -> str | None:
        """The server reset ``count`` streams on stream errors the peer provoked."""
        self.provoked += count
        return self._judge_streams()

    def wasted_frames(self, count: int, now: float) -> str | None:
        """The peer sent ``count`` frames that asked for nothing (module docstring)."""
        self.wasted += count
        credit = (now - self._at) * FLOOD_RATE + (self.streams - self._credited) * FLOOD_PER_CALL
        self._tokens = min(float(FLOOD_BURST), self._tokens + credit) - count
        self._at = now
        self._credited = self.streams
        if self._tokens >= 0:
            return None
        return (
            f"{self.wasted} frames that asked for nothing (PING, SETTINGS, empty DATA, frames "
            f"on reset streams, streams past the limit) against {self.streams} calls: more "
            f"than {FLOOD_BURST} at once or {FLOOD_RATE:g} a second"
        )

    def _judge_streams(self) -> str | None:
        ended = self.peer_resets + self.provoked
        if self.streams < RESET_MIN_STREAMS or 2 * ended <= self.streams:
            return None
        return (
            f"{ended} of {self.streams} calls ended for nothing: {self.peer_resets} reset by "
            f"the peer within {PREMATURE_RESET_SECONDS:g} s of their start, {self.provoked} "
            "reset by the server on stream errors the peer provoked"
        )
