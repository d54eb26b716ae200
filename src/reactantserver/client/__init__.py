"""``reactantserver.client``: a light, JAX-free client for the KServe V2 gRPC protocol.

    from reactantserver.client import Client

    with Client("localhost:8080", timeout=10) as client:
        outputs = client.infer("mlp", {"features": x})      # {name: numpy array}

* :class:`Client` blocks; :class:`AsyncClient` is the same API as coroutines, under
  asyncio or Trio. Each keeps one HTTP/2 connection.
* Errors are those of :mod:`reactantserver.errors` (``NotFound``, ``InvalidArgument``,
  ``ResourceExhausted``, ``Unavailable``, ``DeadlineExceeded``, ``FailedPrecondition``,
  ...), carrying the server's message; ``reactantserver.status.code_of(exc)``
  gives the gRPC status code back.
* RESOURCE_EXHAUSTED and UNAVAILABLE are retried with jittered exponential backoff
  (:class:`RetryPolicy`), never past the call's deadline.
* ``Client(url, tls=ClientTls(ca_file=...), metadata={"admin-key": key})`` speaks TLS
  (mutual TLS with ``cert_file``/``key_file``) and sends a restricted group's key.
* ``client.shared_memory(nbytes)`` registers a :class:`SharedMemoryRegion` for a ``with``
  block; tensors then move through it instead of the socket.

Layout: ``core`` (the engine: RPCs, retries), ``channel`` (its connection: unary gRPC
calls over the transport's sans-IO client role, ``reactantserver.h2.client``),
``codec`` (ModelInfer tensors <-> numpy), ``coerce`` (lists and scalars to the datatype a
model declares, never losing a value), ``wire`` (ModelInfer's two messages in protobuf, by hand), ``shm`` (the
region), ``retry`` (the backoff policy), ``status`` (status codes -> errors, the one
mapping point), ``records`` (what the RPCs return), ``sync`` / ``aio`` (the two front
ends), ``_loop`` (the private loop thread). Importing this package imports numpy, grpclib and betterproto, never JAX,
and Trio only when an ``AsyncClient`` is first used under Trio. See ``docs/client.md``.
"""

from __future__ import annotations

from reactantserver.transport.tls import ClientTls

from .aio import AsyncClient
from .records import (
    ClientStatistics,
    ModelMetadata,
    RegionStatus,
    RepositoryModel,
    ServerMetadata,
    TensorMetadata,
)
from .retry import RetryPolicy
from .shm import SharedMemoryRegion
from .sync import Client

__all__ = [
    "AsyncClient",
    "Client",
    "ClientStatistics",
    "ClientTls",
    "ModelMetadata",
    "RegionStatus",
    "RepositoryModel",
    "RetryPolicy",
    "ServerMetadata",
    "SharedMemoryRegion",
    "TensorMetadata",
]
