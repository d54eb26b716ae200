"""The gRPC surface: the wire, the server, the worker's listener.

What the transport reads and writes is defined below it, so that nothing under the
service depends on the transport: the ModelInfer wire codec is
:mod:`reactantserver.protocol.codec`, its records :mod:`reactantserver.records`, and the
one mapping from error categories to gRPC status codes :mod:`reactantserver.status`.

Sans-IO (no grpclib, h2 or asyncio; importable anywhere):

``h2.core``
    One HTTP/2 connection for both roles: the stream table, the states as transition
    tables, flow control both ways, SETTINGS, one handler per frame type.
``h2.server`` / ``h2.client``
    Its server role (what a gRPC server sends) and its client role (unary gRPC calls:
    the gateway's worker connections and the Python client).
``h2.parse``
    The one frame reader, for either role: received frames read straight from their bytes.
``h2.events`` / ``h2.wire``
    Our HTTP/2 events, exceptions and codes; the wire numbers and frame headers.
``h2.hpack``
    HPACK as both roles use it (hpack's public decoder and our encoders).
``h2.abuse``
    One abuse budget per connection, given the time: what a peer may make us do for nothing.
``transport.core.auth``
    Who a call is, and whether it may do what it asks: restricted API groups.
``transport.core.compression``
    gzip / deflate request messages, inflated a step at a time within bounds.
``transport.core.limits``
    ``WireLimits`` (what a peer may do), ``Fault`` (kinds of client mistakes),
    ``WireCounters`` / ``WireStatistics`` (what the wire counted, for /metrics).
``transport.core.framing``
    The rules of a gRPC request's headers and message framing, as pure functions.
``transport.core.faultlog``
    Rate-limited logging of client mistakes.
``transport.core.reclaim``
    When to give memory back after a hostile burst.

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
``worker.grpc``
    :func:`~reactantserver.worker.grpc.serve_grpc`: the worker's listener, a
    ``GuardedServer`` on the asyncio loop that hosts Trio as its guest, serving
    :class:`reactantserver.service.Service` plus server reflection; ModelInfer is
    queued and answered without a Trio task per call (one crossing per batch).
"""
