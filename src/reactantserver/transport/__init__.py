"""The gRPC surface: the wire, the server, the worker's listener.

What the transport reads and writes is defined below it, so that nothing under the
service depends on the transport: the ModelInfer wire codec is
:mod:`reactantserver.protocol.codec`, its records :mod:`reactantserver.records`, and the
one mapping from error categories to gRPC status codes :mod:`reactantserver.status`.

Sans-IO (no grpclib, h2 or asyncio; importable anywhere):

``transport.limits``
    ``WireLimits`` (what a peer may do), ``Fault`` (kinds of client mistakes),
    ``WireCounters`` / ``WireStatistics`` (what the wire counted, for /metrics).
``transport.framing``
    The rules of a gRPC request's headers and message framing, as pure functions.
``transport.faultlog``
    Rate-limited logging of client mistakes.
``transport.reclaim``
    When to give memory back after a hostile burst.

On asyncio and grpclib's public records (import them explicitly, so that importing this
package stays free of them):

``transport.guest``
    Trio as the guest of a standard asyncio loop: where the two event loops meet.
``transport.h2conn``
    The server connection with every limit in its first SETTINGS; corked writes.
``transport.h2guard``
    Guarded HTTP/2 connections (the asyncio protocol around the sans-IO connection):
    every per-peer limit and check, below any handler.
``transport.server``
    ``GuardedServer``: a hardened gRPC server from a handler table and ``WireLimits``
    (no ``Service``: a gateway builds its own from it), and ``ServerStream``, what a
    handler of the task path reads and writes.
``transport.grpc``
    :func:`~reactantserver.transport.grpc.serve_grpc`: the worker's listener, a
    ``GuardedServer`` on the asyncio loop that hosts Trio as its guest, serving
    :class:`reactantserver.service.Service` plus server reflection; ModelInfer is
    queued and answered without a Trio task per call (one crossing per batch).
"""
