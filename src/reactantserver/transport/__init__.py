"""The gRPC surface: the wire, the server, the worker's listener and status mapping.

Sans-IO (no grpclib, h2 or asyncio; importable anywhere):

``transport.status``
    The one mapping from :mod:`reactantserver.errors` categories to gRPC status codes.
``transport.limits``
    ``WireLimits`` (what a peer may do), ``Fault`` (kinds of client mistakes),
    ``WireCounters`` / ``WireStatistics`` (what the wire counted, for /metrics).
``transport.framing``
    The rules of a gRPC request's headers and message framing, as pure functions.
``transport.faultlog``
    Rate-limited logging of client mistakes.
``transport.reclaim``
    When to give memory back after a hostile burst.

On asyncio, grpclib and h2 (import them explicitly, so that importing this package
stays free of them):

``transport.h2conn``
    The h2 connection with every limit in its first SETTINGS; corked writes.
``transport.h2guard``
    Guarded HTTP/2 connections: every per-peer limit and check, below any handler.
``transport.server``
    ``GuardedServer``: a hardened gRPC server from a handler table and ``WireLimits``
    (no ``Service``: a gateway builds its own from it).
``transport.grpc``
    :func:`~reactantserver.transport.grpc.serve_grpc`: the worker's listener, a
    ``GuardedServer`` hosted inside the current Trio run through trio-asyncio, serving
    :class:`reactantserver.service.Service` plus server reflection, with the one
    asyncio <-> Trio hop.
"""

from __future__ import annotations

from .status import INTERNAL_MESSAGE, StatusCode, WireStatus, to_status

__all__ = ["INTERNAL_MESSAGE", "StatusCode", "WireStatus", "to_status"]
