"""Where one forwarded ModelInfer stands, sans-IO: one table of legal transitions.

This module decides; it never touches a socket, a clock, a task or an event loop.
:class:`~reactantserver.gateway.forward.Forward` drives it: each step of a call's I/O (a
ticket taken, a stream opened, a place in a worker's line, a connection awaited, the
worker's answer, the client gone) is an event, and the call's one state field moves along
:data:`TRANSITIONS`, one row per legal ``(state, event)`` pair::

    state          event      next           meaning
    ------------   --------   ------------   ---------------------------------------------
    ARRIVED        ROUTE      ROUTED         the model is in the route table: a ticket names
                                             the worker
    ARRIVED        LOOKUP     REFRESHING     the model is not in the table: one refresh of
                                             it (single-flight), in a task
    REFRESHING     ROUTE      ROUTED         the refreshed table has it: a ticket
    ROUTED         START      SENT           a slot and the connection were free: the
                                             request is on a stream to the worker
    ROUTED         QUEUE      WAITING_SLOT   the connection is up, every stream slot taken:
                                             in the worker's line (no task)
    ROUTED         CONNECT    CONNECTING     no usable connection: a task waits for a slot
                                             and the connection
    WAITING_SLOT   START      SENT           a freed slot was handed over and the request
                                             sent on it, in the event handling that freed it
    WAITING_SLOT   CONNECT    CONNECTING     handed a slot, but the connection went: a task
                                             waits for the next one, holding the slot
    CONNECTING     START      SENT           connected (and a slot held): sent
    ROUTED         FAILOVER   ROUTED         the worker cannot have run it (not sent in full,
    WAITING_SLOT   FAILOVER   ROUTED         refused, NOT_FOUND, UNAVAILABLE) and the ticket
    CONNECTING     FAILOVER   ROUTED         has another replica: the next worker, sent as
    SENT           FAILOVER   ROUTED         from ROUTED
    SENT           ANSWER     ANSWERED       the worker's OK, passed back as it came
    any live       FAIL       FAILED         answered with an error status (the gateway's,
                                             or the worker's when it cannot fail over)
    any live       EXPIRE     EXPIRED        the deadline passed (answered DEADLINE_EXCEEDED,
                                             or the client's call withdrew it)
    any live       CANCEL     CANCELLED      the client went away (reset, lost connection):
                                             the worker's call is cancelled, nothing written

The live states are ``ARRIVED`` to ``SENT``; ``ARRIVED`` and ``ROUTED`` last only inside
one synchronous step (nobody outside sees them), the other four are where a call waits:
on a refresh task, in a worker's line, on a connection task, on its worker's stream. The
four terminal states are the router's outcomes (:data:`OUTCOME`): a call reaches exactly
one of them, and nothing leaves it (the worker's outcome of a stream cancelled with its
client is dropped by the I/O, which asks :func:`ended` first). Any other pair is a bug in
the I/O and raises :class:`~reactantserver.errors.LifecycleError` (:func:`advance`).

The I/O keeps one handle per waiting state -- the refresh or connection task, the
:class:`~..pool.SlotWait`, the worker stream's :class:`~..channel.Call` -- which is what
``CANCEL`` cancels. States and events are ``IntEnum`` members: a transition is one dict
lookup keyed by a pair of ints, and :func:`ended` one comparison (the call path is the
gateway's hot path).

Invariants (checked by ``tests/gateway/test_gateway_callstate.py``, the table and a property over
the real :class:`~..forward.Forward` in any order of events): the state moves only along
:data:`TRANSITIONS`; every call reaches exactly one terminal state; its stream slot is
returned exactly once, its ticket released exactly once, its client answered at most once
(exactly once unless it went away).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from reactantserver.errors import LifecycleError

from .routing import Outcome

__all__ = ["OUTCOME", "TRANSITIONS", "CallEvent", "CallState", "advance", "ended"]


class CallState(enum.IntEnum):
    """Where one forwarded call stands (the module docstring). Live states first."""

    ARRIVED = 0
    REFRESHING = 1
    ROUTED = 2
    WAITING_SLOT = 3
    CONNECTING = 4
    SENT = 5
    # terminal: one each of the router's outcomes
    ANSWERED = 6
    FAILED = 7
    EXPIRED = 8
    CANCELLED = 9


class CallEvent(enum.IntEnum):
    """What the call's I/O reports (the module docstring)."""

    ROUTE = 0
    LOOKUP = 1
    START = 2
    QUEUE = 3
    CONNECT = 4
    FAILOVER = 5
    ANSWER = 6
    FAIL = 7
    EXPIRE = 8
    CANCEL = 9


_S = CallState
_E = CallEvent

#: The states a call waits or is carried in; the others are terminal.
LIVE = (_S.ARRIVED, _S.REFRESHING, _S.ROUTED, _S.WAITING_SLOT, _S.CONNECTING, _S.SENT)

_NEXT: dict[tuple[CallState, CallEvent], CallState] = {
    (_S.ARRIVED, _E.ROUTE): _S.ROUTED,
    (_S.ARRIVED, _E.LOOKUP): _S.REFRESHING,
    (_S.REFRESHING, _E.ROUTE): _S.ROUTED,
    (_S.ROUTED, _E.START): _S.SENT,
    (_S.ROUTED, _E.QUEUE): _S.WAITING_SLOT,
    (_S.ROUTED, _E.CONNECT): _S.CONNECTING,
    (_S.WAITING_SLOT, _E.START): _S.SENT,
    (_S.WAITING_SLOT, _E.CONNECT): _S.CONNECTING,
    (_S.CONNECTING, _E.START): _S.SENT,
    (_S.ROUTED, _E.FAILOVER): _S.ROUTED,
    (_S.WAITING_SLOT, _E.FAILOVER): _S.ROUTED,
    (_S.CONNECTING, _E.FAILOVER): _S.ROUTED,
    (_S.SENT, _E.FAILOVER): _S.ROUTED,
    (_S.SENT, _E.ANSWER): _S.ANSWERED,
    # Every live state may end: an error, the deadline, the client gone.
    **{(state, _E.FAIL): _S.FAILED for state in LIVE},
    **{(state, _E.EXPIRE): _S.EXPIRED for state in LIVE},
    **{(state, _E.CANCEL): _S.CANCELLED for state in LIVE},
}

#: Every legal transition: ``(state, event) -> next state``. Nothing else is allowed.
TRANSITIONS: Mapping[tuple[CallState, CallEvent], CallState] = MappingProxyType(_NEXT)

#: A terminal state's outcome, in the router's words (:data:`.routing.Outcome`).
OUTCOME: Mapping[CallState, Outcome] = MappingProxyType(
    {
        _S.ANSWERED: "ok",
        _S.FAILED: "error",
        _S.EXPIRED: "deadline",
        _S.CANCELLED: "cancelled",
    }
)

_FIRST_ENDED = _S.ANSWERED


def ended(state: CallState) -> bool:
    """True in the terminal states (nothing moves there)."""
    return state >= _FIRST_ENDED


def advance(state: CallState, event: CallEvent) -> CallState:
    """The state after ``event`` in ``state``; ``LifecycleError`` if the pair is illegal."""
    after = _NEXT.get((state, event))
    if after is None:
        allowed = sorted(e.name for (s, e) in _NEXT if s is state)
        raise LifecycleError(
            f"forwarded call: event {event.name} is not allowed in state {state.name} "
            f"(allowed there: {', '.join(allowed) or 'none'})"
        )
    return after
