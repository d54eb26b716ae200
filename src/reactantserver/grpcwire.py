"""The gRPC wire's vocabulary, in one pure module: status codes, ``grpc-timeout``, HTTP statuses.

Everything in reactantserver that reads or writes these words of the gRPC-over-HTTP/2
protocol (the worker's server, the gateway, the Python client) takes them from here, so
each has one spelling, one grammar and one rounding rule. Pure: no asyncio, trio, socket
or grpclib (grpclib's own ``Status`` enum is made only where a ``GRPCError`` is raised,
by :func:`reactantserver.transport.grpcerror.grpc_error`).

Status codes (:class:`StatusCode`)
----------------------------------
The seventeen codes of ``grpc/status.proto`` (``doc/statuscodes.md``), numbered as on the
wire. An ``IntEnum``: a member is the number it stands for, so ``str(int(code))`` is the
``grpc-status`` value. :func:`parse_grpc_status` reads a ``grpc-status`` header value
back, and :func:`status_name` names a number (for counters and logs); anything that is
not one of the seventeen numbers reads as UNKNOWN.

``grpc-timeout`` (:func:`encode_grpc_timeout`, :func:`parse_grpc_timeout`)
-----------------------------------------------------------------------
The grammar (the gRPC HTTP/2 protocol spec's ``Timeout``): 1 to 8 ASCII digits, then one
unit: ``H`` (hours), ``M`` (minutes), ``S`` (seconds), ``m`` (milliseconds), ``u``
(microseconds) or ``n`` (nanoseconds). :func:`parse_grpc_timeout` accepts exactly that
and raises ``ValueError`` for anything else (signs, spaces, ``_``, non-ASCII digits, a
ninth digit, no unit); zero is well formed (the server then answers DEADLINE_EXCEEDED).

The rounding rule, the one every sender uses: :func:`encode_grpc_timeout` writes the
seconds left in the finest unit whose value fits the eight digits (nanoseconds below
0.1 s, microseconds below 100 s, milliseconds below about 27.7 hours, then seconds,
minutes, hours), **rounded down**, so that what :func:`parse_grpc_timeout` reads back is
never longer than the seconds given and at most one unit shorter. Why down: a deadline
is a promise about when the caller stops waiting. A peer told a deadline later than the
caller's own keeps working (and holding a batch slot, a device turn) for an answer nobody
will read; the gateway, which forwards the time left at each hop, would lengthen a
client's deadline by up to a unit per hop; and a client that tells the server a little
less than it waits itself gets the server's own DEADLINE_EXCEEDED, with its message,
instead of cutting the call off blind. One unit of the finest unit that fits is at most
1 ppm of the time left (a nanosecond below 0.1 s, a microsecond below 100 s): rounding
down costs nothing measurable. (grpclib writes whole seconds above 10 s; the original
gateway rounded up to whole seconds; our Python client once rounded up to milliseconds.)

HTTP statuses (:data:`HTTP_TO_GRPC`, :func:`status_for_http`)
-------------------------------------------------------------
A response without ``grpc-status`` that is not HTTP 200 (a proxy, a load balancer, a
server that does not speak gRPC) is read with gRPC's own table
(``doc/http-grpc-status-mapping.md``): 400 INTERNAL, 401 UNAUTHENTICATED, 403
PERMISSION_DENIED, 404 UNIMPLEMENTED, 429 / 502 / 503 / 504 UNAVAILABLE, any other
UNKNOWN. The table is for clients only: a server never picks its HTTP status from it.

Invariants (``tests/transport/test_grpcwire.py``, Hypothesis): for every ``s`` from 0 to the
longest the header can say (99,999,999 hours; longer is written as that),
``parse_grpc_timeout(encode_grpc_timeout(s)) <= s`` and ``s`` minus it is below one unit
of the unit written, and the text matches the grammar; ``parse_grpc_timeout`` accepts a
string exactly when it matches ``[0-9]{1,8}[HMSmun]``, and then returns digits x unit.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class StatusCode(enum.IntEnum):
    """gRPC status codes, numbered as in ``grpc/status.proto`` (and grpclib's ``Status``)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


#: Each code's name, by number.
_NAMES = tuple(code.name for code in StatusCode)


def status_name(code: int) -> str:
    """The name of a code number (``UNKNOWN`` for a number gRPC does not define)."""
    return _NAMES[code] if 0 <= code < len(_NAMES) else "UNKNOWN"


#: A ``grpc-status`` value as it comes on the wire -> its code.
_WIRE_STATUS: dict[bytes | str, StatusCode] = {
    **{str(int(code)).encode(): code for code in StatusCode},
    **{str(int(code)): code for code in StatusCode},
}


def parse_grpc_status(value: bytes | str) -> StatusCode:
    """The code a ``grpc-status`` header value says; UNKNOWN for anything but ``0``-``16``."""
    return _WIRE_STATUS.get(value, StatusCode.UNKNOWN)


#: HTTP status -> what it means to a gRPC client when the answer has no ``grpc-status``
#: (gRPC's doc/http-grpc-status-mapping.md); any status not here is UNKNOWN.
HTTP_TO_GRPC: Mapping[int, StatusCode] = {
    400: StatusCode.INTERNAL,
    401: StatusCode.UNAUTHENTICATED,
    403: StatusCode.PERMISSION_DENIED,
    404: StatusCode.UNIMPLEMENTED,
    429: StatusCode.UNAVAILABLE,
    502: StatusCode.UNAVAILABLE,
    503: StatusCode.UNAVAILABLE,
    504: StatusCode.UNAVAILABLE,
}


def status_for_http(http_status: int) -> StatusCode:
    """The gRPC code of an answer that ended with ``http_status`` and no ``grpc-status``."""
    return HTTP_TO_GRPC.get(http_status, StatusCode.UNKNOWN)


#: Values a ``grpc-timeout`` may hold: 1 to 8 digits.
TIMEOUT_LIMIT = 10**8
#: Units per second of the units finer than a minute: their values are read back by
#: dividing by that (exact) number, so the read-back is the correctly rounded quotient.
_DIVISORS = {"n": 1e9, "u": 1e6, "m": 1e3, "S": 1.0}
#: Seconds per unit of the coarser units (read back by multiplying: exact).
_SECONDS = {"M": 60.0, "H": 3600.0}
#: What :func:`encode_grpc_timeout` writes for "as good as none" (over 11,000 years).
LONGEST_TIMEOUT = f"{TIMEOUT_LIMIT - 1}H"


def encode_grpc_timeout(seconds: float) -> str:
    """``grpc-timeout`` for ``seconds`` left: the finest unit that fits, rounded down (the
    module docstring says why); ``0n`` when no time is left, :data:`LONGEST_TIMEOUT` for
    more than the header can say (infinity included)."""
    if not seconds > 0:  # zero, negative, NaN
        return "0n"
    # A product is rounded to a float: it may reach the next whole unit when ``seconds``
    # lies a hair below it, so each value is read back as the parser reads it and taken
    # one down if that is longer (a value that reaches 10**8 falls to the coarser unit).
    # Written out, not looped: the gateway writes one per forwarded call.
    if seconds < 0.1:
        value = int(seconds * 1e9)
        if value < 100_000_000:
            if value / 1e9 > seconds:
                value -= 1
            return f"{value}n"
    if seconds < 100.0:
        value = int(seconds * 1e6)
        if value < 100_000_000:
            if value / 1e6 > seconds:
                value -= 1
            return f"{value}u"
    if seconds < 100_000.0:
        value = int(seconds * 1e3)
        if value < 100_000_000:
            if value / 1e3 > seconds:
                value -= 1
            return f"{value}m"
    if seconds < 1e8:
        return f"{int(seconds)}S"
    for unit, per_unit in _SECONDS.items():
        if seconds < TIMEOUT_LIMIT * per_unit:
            value = int(seconds / per_unit)
            if value * per_unit > seconds:
                value -= 1
            return f"{value}{unit}"
    return LONGEST_TIMEOUT


def parse_grpc_timeout(text: str) -> float:
    """Seconds of a ``grpc-timeout`` value; ``ValueError`` unless it is 1 to 8 ASCII digits
    and one of ``H M S m u n``."""
    digits = text[:-1]
    if 0 < len(digits) <= 8 and digits.isascii() and digits.isdigit():
        unit = text[-1]
        divisor = _DIVISORS.get(unit)
        if divisor is not None:
            return int(digits) / divisor
        per_unit = _SECONDS.get(unit)
        if per_unit is not None:
            return int(digits) * per_unit
    raise ValueError(f"malformed grpc-timeout {text[:64]!r}")
