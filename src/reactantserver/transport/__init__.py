"""The gRPC surface: error-to-status mapping and the grpclib listener.

``transport.status``
    The one mapping from :mod:`reactantserver.errors` categories to gRPC status codes.
    Imports no grpclib, so it is usable (and tested) anywhere.
``transport.grpc``
    :func:`~reactantserver.transport.grpc.serve_grpc`: grpclib hosted inside the current
    Trio run through trio-asyncio, serving :class:`reactantserver.service.Service` plus
    server reflection. The only module of the project importing asyncio, grpclib or
    trio-asyncio; import it explicitly (``from reactantserver.transport.grpc import
    serve_grpc``) so that importing this package stays free of them.
"""

from __future__ import annotations

from .status import INTERNAL_MESSAGE, StatusCode, WireStatus, to_status

__all__ = ["INTERNAL_MESSAGE", "StatusCode", "WireStatus", "to_status"]
