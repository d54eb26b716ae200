"""The gRPC surface: the wire, the server, the worker's listener.

What the transport reads and writes is defined below it, so that nothing under the
service depends on the transport: the ModelInfer wire codec is
:mod:`reactantserver.protocol.codec`, its records :mod:`reactantserver.records`, and the
one mapping from error categories to gRPC status codes :mod:`reactantserver.status`.

Below it, sans-IO: the HTTP/2 library (``reactantserver.h2``: both roles of one
connection) and the gRPC rules this folder's edges apply (``core``, the sub-package
``transport/core/``: auth, compression, limits, framing, faultlog, reclaim; listed in its
``__init__``). The worker's listener is :mod:`reactantserver.worker.grpc`, where its one
user is.

On ``ssl``, for both roles: ``transport.tls`` (TLS and mutual TLS for the listeners and
the connections to workers) and ``transport.security`` (a listener's security from its
configuration: TLS, the authorizer, the start-up warning).

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
``transport.grpcerror``
    grpclib's status enum, made at the one edge where a ``GRPCError`` is raised or read
    (everything else speaks ``reactantserver.grpcwire.StatusCode``).
``transport.unary`` / ``transport.streaming``
    Unary calls and ModelStreamInfer's streams served by the connection's event handling:
    no task, no stream object per call (``unary`` uses only grpclib's message encoding).
``transport.health``
    ``grpc.health.v1.Health``, the standard gRPC health check, on a worker and a gateway.
"""
