"""The gRPC listener: grpclib hosted inside the worker's Trio run.

``transport.grpc``
    :func:`~reactantserver.transport.grpc.serve_grpc`: grpclib hosted inside the current
    Trio run through trio-asyncio, serving :class:`reactantserver.service.Service` plus
    server reflection. The only server module that imports asyncio, grpclib or
    trio-asyncio (the client, ``reactantserver.client``, runs its own asyncio loop);
    import it explicitly (``from reactantserver.transport.grpc import serve_grpc``).

What the transport reads and writes is defined below it, so that nothing under the
service depends on the transport: the ModelInfer wire codec is
:mod:`reactantserver.protocol.codec`, its records :mod:`reactantserver.records`, and the
one mapping from error categories to gRPC status codes :mod:`reactantserver.status`.
"""
