"""What a gRPC request must look like on the wire: its headers and its message framing.

Sans-IO and grpclib-free: the functions here are given header lists and DATA bytes and
return decisions; the HTTP/2 layer (:mod:`..h2guard`) applies them as events arrive, before
any handler runs or reads anything. Every client mistake becomes a :class:`Refusal`: the
precise gRPC status, a message that says what to fix, and the :class:`~.limits.Fault`
kind it is counted and logged under.

Headers (:func:`request_head`), following the gRPC HTTP/2 protocol spec
-------------------------------------------------------------------------
``:method`` must be POST (else HTTP 405), ``content-type`` ``application/grpc`` or
``application/grpc+proto`` (else 415), ``te: trailers`` (else 400) and ``:path`` present
(else 400), all with INVALID_ARGUMENT; ``grpc-encoding`` may be ``identity``, ``gzip``
or ``deflate`` (inflated within bounds by :mod:`.compression`), anything else is
UNIMPLEMENTED with ``grpc-accept-encoding`` saying what is accepted (the gRPC spec's rule);
``grpc-timeout`` must be 1 to 8 digits and a unit (``H M S m u n``: the one grammar,
:func:`reactantserver.grpcwire.parse_grpc_timeout`), else INVALID_ARGUMENT, and a timeout
of zero is DEADLINE_EXCEEDED at once.

Messages (:class:`MessageFramer`)
---------------------------------
Each message is a 5-byte prefix (flags byte, 4-byte big-endian length) and its body. The
framer follows one stream's bytes and judges each prefix *as soon as its 5 bytes are in*:
a declared length over the limit is RESOURCE_EXHAUSTED before a byte of the body is
accepted (for a compressed message: its compressed bytes; what it inflates to is held to
the same limit by :mod:`.compression`), the compressed flag on a call without
``grpc-encoding`` or any other flag is INVALID_ARGUMENT, and so is a second message on a
unary call.
At END_STREAM, a message cut short or a unary call without a message is
INVALID_ARGUMENT. The framer keeps no payload: at most 4 prefix bytes and two counters.

Invariants (``tests/transport/test_wire_framing.py``): the verdict does not depend on how the bytes
are split into DATA frames; a prefix over the limit is refused by the ``feed`` that
completes it; a well-formed stream is never refused.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Generic, TypeVar

import attrs

from reactantserver.grpcwire import StatusCode, parse_grpc_timeout

from .limits import Fault

#: The ``grpc-encoding`` values served, and how the server says so.
ENCODINGS = ("identity", "deflate", "gzip")
ACCEPT_ENCODING = ",".join(ENCODINGS)
#: The gRPC content type (``+proto`` is the only subtype served).
CONTENT_TYPE = "application/grpc"
_SUBTYPES = ("", "proto")
PREFIX_BYTES = 5


@attrs.frozen
class Refusal:
    """How a request is answered instead of being served."""

    code: StatusCode
    message: str
    fault: Fault
    #: The HTTP status of the (trailers-only) response; gRPC wants 200 for gRPC errors.
    http_status: int = 200
    #: Extra response headers (``grpc-accept-encoding`` for an unsupported encoding).
    headers: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class RequestHead:
    """The facts of an acceptable request's headers."""

    path: str
    #: Seconds from ``grpc-timeout``; ``None`` when the client set no deadline.
    timeout: float | None = None
    #: The ``grpc-timeout`` header as sent (for messages), empty when none.
    timeout_text: str = ""
    user_agent: str | None = None
    #: ``grpc-encoding``: ``identity``, or the algorithm compressed messages use.
    encoding: str = "identity"

    @property
    def compressed(self) -> bool:
        """The call's messages may come compressed (a ``grpc-encoding`` was named)."""
        return self.encoding != "identity"


#: The handler a served request goes to, and the clock its deadline is read on.
H = TypeVar("H")
D = TypeVar("D")


@attrs.frozen(eq=False)
class HeadersPassed(Generic[H, D]):
    """A request whose headers passed (a sink's ``admit`` returns one, or a
    :class:`Refusal`): the handler that serves it, what its headers said, by when it must
    end (``None``: the client set no deadline) and whose it is (:mod:`.auth`: whose
    shared-memory regions the call may use). Each kind of handler has its record below it,
    with ``unary_request``: whether the request carries exactly one message."""

    handler: H
    head: RequestHead
    deadline: D | None
    owner: str = ""


def _bad(message: str, http_status: int, fault: Fault = Fault.BAD_REQUEST) -> Refusal:
    return Refusal(StatusCode.INVALID_ARGUMENT, message, fault, http_status)


def request_head(headers: Sequence[tuple[str, str]]) -> RequestHead | Refusal:
    """Check a request's headers (see the module docstring); no I/O, no state."""
    method = path = content_type = te = encoding = user_agent = None
    timeouts: list[str] = []
    for name, value in headers:
        if name == ":method":
            method = value
        elif name == ":path":
            path = value
        elif name == "content-type":
            content_type = value
        elif name == "te":
            te = value
        elif name == "grpc-timeout":
            timeouts.append(value)
        elif name == "grpc-encoding":
            encoding = value
        elif name == "user-agent":
            user_agent = value
    if method != "POST":
        return _bad(f"gRPC calls are HTTP POST requests; got :method {method!r}", 405)
    base, _, subtype = (content_type or "").partition("+")
    if base != CONTENT_TYPE or subtype not in _SUBTYPES:
        return _bad(
            f"content-type must be {CONTENT_TYPE} or {CONTENT_TYPE}+proto; got {content_type!r}",
            415,
        )
    if te != "trailers":
        return _bad(f"gRPC requests carry 'te: trailers'; got te {te!r}", 400)
    if not path:
        return _bad("the request has no :path (the gRPC method)", 400)
    if encoding is not None and encoding not in ENCODINGS:
        shown = encoding if len(encoding) <= 64 else encoding[:64] + "..."
        return Refusal(
            StatusCode.UNIMPLEMENTED,
            f"grpc-encoding {shown!r} is not supported; send messages as identity, deflate "
            f"or gzip (grpc-accept-encoding: {ACCEPT_ENCODING})",
            Fault.UNSUPPORTED_ENCODING,
            headers=(("grpc-accept-encoding", ACCEPT_ENCODING),),
        )
    timeout = None
    for text in timeouts:
        try:
            seconds = parse_grpc_timeout(text)
        except ValueError:
            return _bad(
                f"malformed grpc-timeout {text!r}: expected 1 to 8 digits and a unit "
                "(H, M, S, m, u or n), e.g. 500m",
                200,
                Fault.BAD_TIMEOUT,
            )
        timeout = seconds if timeout is None else min(timeout, seconds)
    if timeout is not None and timeout <= 0:
        return Refusal(
            StatusCode.DEADLINE_EXCEEDED,
            f"deadline exceeded before the call started (grpc-timeout {timeouts[0]!r})",
            Fault.EXPIRED_ON_ARRIVAL,
        )
    return RequestHead(path, timeout, ", ".join(timeouts), user_agent, encoding or "identity")


class MessageFramer:
    """Follows one request stream's gRPC messages as DATA arrives; see the module docstring."""

    __slots__ = ("_compressed", "_count", "_declared", "_head", "_left", "_limit", "_setting",
                 "_unary")  # fmt: skip

    def __init__(
        self,
        limit: int,
        *,
        unary: bool,
        setting: str = "endpoints.max_message_bytes",
        compressed: bool = False,
    ) -> None:
        self._limit = limit
        #: The call named a ``grpc-encoding``: its messages may carry the compressed flag.
        self._compressed = compressed
        #: The key that sets ``limit`` in this process's configuration, for the refusal.
        self._setting = setting
        self._unary = unary
        #: Prefix bytes of the next message received so far (never 5: judged at once).
        self._head = b""
        #: Body bytes still to come of the current message, and what its prefix declared.
        self._left = 0
        self._declared = 0
        #: Messages whose prefix was read.
        self._count = 0

    def feed(self, data: bytes | memoryview) -> Refusal | None:
        """The next DATA payload of the stream; a refusal ends the stream."""
        size = len(data)
        pos = 0
        while pos < size:
            if self._left:
                step = min(self._left, size - pos)
                self._left -= step
                pos += step
                continue
            if not self._head and size - pos >= PREFIX_BYTES:
                # The usual case: a whole prefix in this payload, judged where it lies.
                refusal = self._start(data[pos], int.from_bytes(data[pos + 1 : pos + 5], "big"))
                if refusal is not None:
                    return refusal
                pos += PREFIX_BYTES
                continue
            take = data[pos : pos + PREFIX_BYTES - len(self._head)]
            pos += len(take)
            self._head += take
            if len(self._head) < PREFIX_BYTES:
                break
            head, self._head = self._head, b""
            refusal = self._start(head[0], int.from_bytes(head[1:PREFIX_BYTES], "big"))
            if refusal is not None:
                return refusal
        return None

    def _start(self, flags: int, length: int) -> Refusal | None:
        """Judge a message's prefix: its ``flags`` byte and declared ``length``."""
        self._count += 1
        if self._unary and self._count > 1:
            return self._malformed(
                "a unary call carries one request message, and a second one arrived"
            )
        if flags == 1 and not self._compressed:
            return self._malformed(
                "the message has the compressed flag set but the request has no "
                "grpc-encoding header; send it uncompressed"
            )
        if flags > 1:
            return self._malformed(
                f"the message's flags byte is 0x{flags:02x}; gRPC defines only 0 (plain) "
                "and 1 (compressed)"
            )
        if length > self._limit:
            return Refusal(
                StatusCode.RESOURCE_EXHAUSTED,
                f"request message of {length} bytes exceeds the limit of {self._limit} bytes "
                f"({self._setting}); use shared memory for inputs this large",
                Fault.MESSAGE_TOO_LARGE,
            )
        self._left = self._declared = length
        return None

    def end(self) -> Refusal | None:
        """The stream ended (END_STREAM): refuse a message cut short, or a missing one."""
        if self._head:
            return self._malformed(
                f"the request stream ended inside a message's 5-byte prefix "
                f"({len(self._head)} of 5 bytes)"
            )
        if self._left:
            got = self._declared - self._left
            return self._malformed(
                f"the request stream ended after {got} of the {self._declared} message "
                "bytes its prefix declared"
            )
        if self._unary and self._count == 0:
            return self._malformed("the request stream ended without a request message")
        return None

    @staticmethod
    def _malformed(message: str) -> Refusal:
        return Refusal(StatusCode.INVALID_ARGUMENT, message, Fault.MALFORMED_MESSAGE)


def take_bytes(chunks: deque[bytes | memoryview] | deque[memoryview], n: int) -> bytes:
    """The next ``n`` bytes of a stream received as ``chunks`` (oldest first), joined
    into one copy and taken off the front: whole chunks popped, the last one cut."""
    parts = []
    while n:
        chunk = chunks[0]
        if len(chunk) <= n:
            parts.append(chunks.popleft())
            n -= len(chunk)
        else:
            parts.append(memoryview(chunk)[:n])
            chunks[0] = memoryview(chunk)[n:]
            n = 0
    return b"".join(parts)
