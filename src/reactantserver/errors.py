"""The one error tree of reactantserver.

Domain code raises these; it knows nothing of gRPC. Exactly one place
(``reactantserver.transport``) maps the *category* classes below to gRPC status
codes, and anything that is not a ``ReactantError`` becomes INTERNAL with a fixed
message on the wire and the traceback in the log.

    ReactantError
    ├── ConfigError                  a node.yaml / gateway.yml / env override is wrong
    ├── BundleError                  a model bundle on disk is wrong (refused at load)
    ├── LifecycleError               an illegal model state transition (a bug, not a user error)
    └── RequestError                 something a single request ran into; has a wire status
        ├── InvalidArgument          -> INVALID_ARGUMENT   the request itself is wrong
        │   └── BatchTooLarge        a request with more rows than any compiled batch size
        ├── NotFound                 -> NOT_FOUND          unknown or unloaded model
        ├── Unavailable              -> UNAVAILABLE        not ready, shutting down, draining
        ├── ResourceExhausted        -> RESOURCE_EXHAUSTED queue full, too many in flight
        │   ├── QueueFull
        │   └── TooManyRequests
        ├── DeadlineExceeded         -> DEADLINE_EXCEEDED  the request's deadline passed
        ├── FailedPrecondition       -> FAILED_PRECONDITION wrong mode, unknown shm region
        │   └── NotResident          explicit mode: weights not on the device
        ├── Unimplemented            -> UNIMPLEMENTED      an RPC we do not serve
        ├── PermissionDenied         -> PERMISSION_DENIED  a restricted group, a wrong key
        ├── Unauthenticated          -> UNAUTHENTICATED    a restricted group, no key sent
        └── ExecutionFailed          -> INTERNAL           the device execution failed / timed out

Every message is written for the person who has to fix the problem: it names the
model, the input, the key or the value, and says what was expected. A value that came
from a client is quoted with :func:`quoted`, which bounds it: a message echoing a 1 MiB
model name overflowed the client's metadata limit (issue 41), so the client saw a
transport error instead of the reason. :func:`bounded` is the last bound, on the whole
message, where the transport writes ``grpc-message``.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Characters of one client-given value a message quotes at most.
QUOTE_LIMIT = 120
#: Characters of a whole status message sent to a client at most.
MESSAGE_LIMIT = 1024


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr`` of a client-given value for a message, cut to ``limit`` characters (with
    how long it was): ``'mlp'``, or ``'aaaa...'... (1048576 characters)``."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def bounded(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """``message`` cut to ``limit`` characters, saying how much was cut."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}... ({len(message) - limit} more characters)"


class ReactantError(Exception):
    """Base of every error reactantserver raises on purpose."""


class ConfigError(ReactantError):
    """A configuration file or environment override is invalid.

    Each problem is one line of the form ``FILE:LINE: key.path: what was expected; got
    VALUE`` (or names the environment variable instead of the file), so an operator can
    go straight to the offending line. A load reports every problem it finds at once:
    ``problems`` holds the lines, and the message is those lines joined by newlines.
    """

    def __init__(self, problem: str, *more: str) -> None:
        super().__init__("\n".join((problem, *more)))
        self.problems: tuple[str, ...] = (problem, *more)


class BundleError(ReactantError):
    """A model bundle on disk is malformed or does not match its manifest.

    Like ``ConfigError``, one error can carry every problem a check found at once (a
    manifest with an unknown key and two bad datatypes is one load, not three): the
    message is one ``bundle 'name': problem`` line per problem; ``problems`` holds the
    problems, ``detail`` them joined with ``; `` (the log's one line).

    ``public`` is the reason clients read (RepositoryIndex, a refused load): ``detail``,
    unless the problems quote what a file holds -- a manifest's values and keys, its
    YAML -- when the parser gives a reason that names only the file and its lines and
    leaves the rest to the log (issue 41: a manifest linked to ``/etc/passwd`` showed its
    first line to any client).
    """

    def __init__(self, bundle: str, message: str, *more: str, public: str | None = None) -> None:
        self.problems: tuple[str, ...] = (message, *more)
        super().__init__("\n".join(f"bundle {bundle!r}: {p}" for p in self.problems))
        self.bundle = bundle
        self.detail = "; ".join(self.problems)
        self.public = self.detail if public is None else public


class LifecycleError(ReactantError):
    """An illegal model lifecycle transition was attempted."""


class RequestError(ReactantError):
    """An error that ends one request and carries a wire status category."""


class InvalidArgument(RequestError):
    """The request is malformed: wrong dtype, shape, unknown input, bad parameter."""


class BatchTooLarge(InvalidArgument):
    """A request has more rows than the largest compiled batch size of its model."""

    def __init__(self, model: str, rows: int, sizes: Sequence[int]) -> None:
        listed = ", ".join(str(s) for s in sizes)
        super().__init__(
            f"model {model!r}: request has {rows} rows but the largest compiled batch size is "
            f"{max(sizes)} (compiled sizes: {listed}); split the request"
        )
        self.model = model
        self.rows = rows
        self.sizes = tuple(sizes)


class NotFound(RequestError):
    """The named model (or other named thing) does not exist or is not loaded."""


class Unavailable(RequestError):
    """The server or model exists but cannot take the request right now."""


class ResourceExhausted(RequestError):
    """A configured bound was reached; retrying later may succeed."""


class QueueFull(ResourceExhausted):
    """A model's queue is at ``max_queue_depth``."""

    def __init__(self, model: str, depth: int) -> None:
        super().__init__(
            f"model {model!r}: queue is full ({depth} requests waiting, "
            f"scheduler.max_queue_depth={depth}); retry later"
        )
        self.model = model
        self.depth = depth


class TooManyRequests(ResourceExhausted):
    """``endpoints.max_concurrent_requests`` ModelInfer calls are already in flight."""


class DeadlineExceeded(RequestError):
    """The request's deadline passed before it could be answered."""


class FailedPrecondition(RequestError):
    """The request is well formed but the server is not in a state to honour it."""


class NotResident(FailedPrecondition):
    """Explicit residency mode: the model's weights are not on the device."""


class Unimplemented(RequestError):
    """The RPC or feature is deliberately not served."""


class PermissionDenied(RequestError):
    """The caller may not make this call: a restricted API group whose key it sent wrong,
    or whose certificate is not allowed (docs/security.md)."""


class Unauthenticated(RequestError):
    """A restricted API group's call that carried no key at all."""


class ExecutionFailed(RequestError):
    """The device execution failed or overran ``dispatch_timeout_seconds``.

    This maps to INTERNAL, but unlike an unexpected exception its message is ours
    and safe to send on the wire.
    """
