"""gRPC outcomes -> the error tree: the client's one mapping point.

Theory of operation
-------------------
The server maps its domain errors to gRPC status codes in exactly one place
(:mod:`reactantserver.status`). This module is the inverse, and the only place
in the client that looks at a status code or a transport exception: :func:`translate`
turns whatever a call raised into ``(StatusCode, RequestError)``, and the caller raises
the error. Everything else in the client speaks in the error tree of
:mod:`reactantserver.errors`, so ``except NotFound`` works the same against a local
``Service`` and a remote server.

Invariants
----------
* A status the server sends on purpose maps back onto the category it came from (the
  table is the server's, :data:`reactantserver.status.CATEGORY_CODES`, read backwards),
  and the error's message is the server's message, unchanged: ``str(exc)`` is what the operator
  would read in the server's log. ``reactantserver.status.code_of(error_for(code, m))`` is
  ``code`` for every such status (a test checks the round trip).
* Codes the server never sends on purpose (CANCELLED, ALREADY_EXISTS, ...; a proxy or
  another KServe server may) map onto the nearest category, and the message then starts
  with the code's name so nothing is lost.
* Transport failures -- connection refused or reset, a stream cut off, HTTP/2 protocol
  trouble (grpclib's or :mod:`reactantserver.h2.events`'s ``ProtocolError``) --
  are UNAVAILABLE: the server could not be asked, and asking again may work.
* The call's own deadline passing on the client side (grpclib raises
  ``asyncio.TimeoutError``, which is the builtin ``TimeoutError``) is DEADLINE_EXCEEDED,
  like the server's own verdict.
* Only RESOURCE_EXHAUSTED and UNAVAILABLE are :data:`RETRYABLE`: both say "not now", and
  neither means the request itself is wrong.
* Cancellation and other ``BaseException`` control flow are never translated.
"""

from __future__ import annotations

from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from reactantserver.errors import (
    DeadlineExceeded,
    ExecutionFailed,
    InvalidArgument,
    RequestError,
    Unavailable,
)
from reactantserver.grpcwire import StatusCode
from reactantserver.status import CATEGORY_CODES, code_of

from ..h2.events import ProtocolError as WireProtocolError
from ..transport.grpcerror import error_code

#: Status codes worth asking again after a pause.
RETRYABLE: frozenset[StatusCode] = frozenset(
    {StatusCode.RESOURCE_EXHAUSTED, StatusCode.UNAVAILABLE}
)

#: What the server sends on purpose, back onto the category it was raised as: the
#: server's own table (:data:`reactantserver.status.CATEGORY_CODES`) read backwards, so
#: a category added there maps back here too. Its rows that are not a ``RequestError``
#: (``BundleError``: a bundle problem on the server's disk) are the server's business;
#: their code comes back as the ``RequestError`` category that shares it.
CATEGORIES: dict[StatusCode, type[RequestError]] = {
    code: category for category, code in CATEGORY_CODES if issubclass(category, RequestError)
}

#: Codes reactantserver never sends on purpose, onto the nearest category.
NEAREST: dict[StatusCode, type[RequestError]] = {
    StatusCode.CANCELLED: Unavailable,
    StatusCode.UNKNOWN: ExecutionFailed,
    StatusCode.ALREADY_EXISTS: InvalidArgument,
    StatusCode.ABORTED: Unavailable,
    StatusCode.OUT_OF_RANGE: InvalidArgument,
    StatusCode.DATA_LOSS: ExecutionFailed,
}


def error_for(code: StatusCode, message: str | None) -> RequestError:
    """The error a call that ended with ``code`` and ``message`` raises."""
    text = message or code.name
    category = CATEGORIES.get(code)
    if category is not None:
        return category(text)
    nearest = NEAREST.get(code, ExecutionFailed)
    return nearest(f"{code.name}: {text}")


def translate(
    exc: BaseException, *, rpc: str, target: str
) -> tuple[StatusCode, RequestError] | None:
    """``(code, error)`` for an exception a gRPC call raised.

    ``rpc`` and ``target`` (``host:port``) name the call in messages the client writes
    itself. ``None`` for anything that is not a call outcome (a bug, or control flow such
    as cancellation): the caller lets those propagate untouched.
    """
    if isinstance(exc, RequestError):
        # Raised by the client itself (a local check); keep it as it is.
        return code_of(exc), exc
    if isinstance(exc, GRPCError):
        code = error_code(exc)
        return code, error_for(code, exc.message)
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError since 3.11; before OSError
        return StatusCode.DEADLINE_EXCEEDED, DeadlineExceeded(
            f"{rpc}: no answer from {target} before the call's deadline"
        )
    if isinstance(
        exc,
        StreamTerminatedError
        | ProtocolError
        | WireProtocolError
        | ConnectionResetError
        | BrokenPipeError,
    ):
        return StatusCode.UNAVAILABLE, Unavailable(f"{rpc}: connection to {target} lost: {exc}")
    if isinstance(exc, OSError):
        # Refused, unreachable, no such host: the server could not be asked.
        return StatusCode.UNAVAILABLE, Unavailable(f"{rpc}: cannot reach {target}: {exc}")
    return None
