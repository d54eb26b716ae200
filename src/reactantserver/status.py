"""The one mapping from reactantserver's error tree to gRPC status codes.

Theory of operation
-------------------
Domain code raises the category classes of :mod:`reactantserver.errors` and knows
nothing of gRPC. :func:`to_status` is the only place that turns an exception into what
goes on the wire: a status code and a message. It is a pure function over the class
hierarchy -- no grpclib, no asyncio -- so it is tested alone, and the transport turns
its answer into ``grpclib.GRPCError`` in one line
(:func:`reactantserver.transport.grpcerror.grpc_error`). The codes are
:class:`reactantserver.grpcwire.StatusCode` (the wire's vocabulary), exported here too.

Invariants
----------
* A ``RequestError`` category maps to exactly one code (the table below, matched by
  ``isinstance`` so subclasses such as ``QueueFull`` inherit their category's code), and
  its message is sent as written: those messages are composed for the client.
* ``BundleError`` (a load or reload met a malformed bundle) is FAILED_PRECONDITION with
  its message: the operator has to fix the bundle on disk, and the message says where.
* Anything else -- a bug, a ``LifecycleError``, a third-party exception -- becomes
  INTERNAL with the fixed message :data:`INTERNAL_MESSAGE`, and the traceback goes to the
  log, never onto the wire.
* An exception group holding exactly one exception (what a Trio nursery inside the host
  raises when one child fails) is mapped as that exception; a group of several is
  INTERNAL.
* ``BaseException``\\ s that are not ``Exception`` (cancellation, ``KeyboardInterrupt``)
  are never passed here: they are control flow, not request outcomes.
"""

from __future__ import annotations

import logging

import attrs

from reactantserver.errors import (
    BundleError,
    DeadlineExceeded,
    ExecutionFailed,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from reactantserver.grpcwire import StatusCode

__all__ = ["CATEGORY_CODES", "INTERNAL_MESSAGE", "StatusCode", "WireStatus", "code_of", "to_status"]

log = logging.getLogger(__name__)

#: What the wire says for an exception we did not raise on purpose.
INTERNAL_MESSAGE = "internal error"


#: Category -> code. Order matters only between a class and its subclasses, and no
#: category here subclasses another, so every exception matches at most one row.
CATEGORY_CODES: tuple[tuple[type[Exception], StatusCode], ...] = (
    (InvalidArgument, StatusCode.INVALID_ARGUMENT),
    (NotFound, StatusCode.NOT_FOUND),
    (Unavailable, StatusCode.UNAVAILABLE),
    (ResourceExhausted, StatusCode.RESOURCE_EXHAUSTED),
    (DeadlineExceeded, StatusCode.DEADLINE_EXCEEDED),
    (FailedPrecondition, StatusCode.FAILED_PRECONDITION),
    (Unimplemented, StatusCode.UNIMPLEMENTED),
    (PermissionDenied, StatusCode.PERMISSION_DENIED),
    (Unauthenticated, StatusCode.UNAUTHENTICATED),
    (ExecutionFailed, StatusCode.INTERNAL),
    (BundleError, StatusCode.FAILED_PRECONDITION),
)


@attrs.frozen
class WireStatus:
    """A status code and the message sent with it."""

    code: StatusCode
    message: str


def code_of(exc: BaseException) -> StatusCode:
    """The status code ``exc`` ends a call with (for counting; no logging, no message).

    Cancellation and other non-``Exception`` control flow count as CANCELLED.
    """
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if not isinstance(exc, Exception):
        return StatusCode.CANCELLED
    for category, code in CATEGORY_CODES:
        if isinstance(exc, category):
            return code
    return StatusCode.INTERNAL


def to_status(exc: Exception, *, rpc: str = "") -> WireStatus:
    """The wire status for ``exc``; logs the traceback of anything unexpected.

    ``rpc`` names the call in the log line (e.g. ``ModelInfer``).
    """
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    for category, code in CATEGORY_CODES:
        if isinstance(exc, category):
            # An empty message would leave the client with a bare code; name the class.
            return WireStatus(code, str(exc) or type(exc).__name__)
    log.error("%s failed with an unexpected error", rpc or "RPC", exc_info=exc)
    return WireStatus(StatusCode.INTERNAL, INTERNAL_MESSAGE)
