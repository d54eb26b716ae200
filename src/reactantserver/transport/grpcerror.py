"""grpclib's status enum, made at the one edge where a ``GRPCError`` is raised or read.

Everything in reactantserver speaks :class:`reactantserver.grpcwire.StatusCode`. grpclib's
``GRPCError`` wants its own ``grpclib.const.Status`` member (an ``Enum``, not an
``IntEnum``): :func:`grpc_error` makes the exception from a code, and :func:`error_code`
reads one back, so no other module imports grpclib's enum (``tests/transport/test_grpcwire.py``).
"""

from __future__ import annotations

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from reactantserver.grpcwire import StatusCode

#: grpclib's member for each code, by number.
_GRPCLIB = tuple(Status(int(code)) for code in StatusCode)


def grpc_error(code: int, message: str | None = None) -> GRPCError:
    """grpclib's exception for ``code`` (a :class:`StatusCode`, or a number off the wire:
    UNKNOWN for one gRPC does not define) and ``message``."""
    status = _GRPCLIB[code] if 0 <= code < len(_GRPCLIB) else Status.UNKNOWN
    return GRPCError(status, message)


def error_code(exc: GRPCError) -> StatusCode:
    """The code of a grpclib ``GRPCError``."""
    return StatusCode(exc.status.value)
