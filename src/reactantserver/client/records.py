"""The plain records the client returns (frozen attrs; no protocol messages).

RPCs whose answers are small and read every day -- server and model metadata, the
repository index, shared-memory status, the client's own statistics -- come back as these
records. The large Triton structures (``ModelConfig``, ``ModelStatistics``) and the control
service's answers are returned as the generated messages of
:mod:`reactantserver.protocol.inference` / :mod:`reactantserver.protocol.reactant_control`,
documented field by field in ``docs/protocol.md``.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs


@attrs.frozen
class TensorMetadata:
    """One input or output as the server describes it; ``-1`` marks a variable extent."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@attrs.frozen
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


@attrs.frozen
class ServerMetadata:
    name: str
    version: str
    extensions: tuple[str, ...]


@attrs.frozen
class RepositoryModel:
    """One entry of the repository index."""

    name: str
    version: str
    #: ``READY``, ``UNAVAILABLE``, ``LOADING`` or ``UNLOADING``.
    state: str
    reason: str


@attrs.frozen
class RegionStatus:
    """A system shared-memory region registered with the server."""

    name: str
    key: str
    offset: int
    byte_size: int


@attrs.frozen
class ClientStatistics:
    """What one client has done so far (cumulative since it was created).

    Every RPC counts once in ``calls`` however often it was attempted; internal RPCs
    (the ModelConfig an ``infer`` with shared memory reads once per model, a
    re-registration) count too.
    """

    #: RPCs made.
    calls: int = 0
    #: Requests actually sent (``calls`` plus retries, less calls that never got out).
    attempts: int = 0
    #: Retries after RESOURCE_EXHAUSTED or UNAVAILABLE.
    retries: int = 0
    #: Time spent pausing between attempts, seconds.
    backoff_seconds: float = 0.0
    #: Shared-memory regions registered again after the server forgot them.
    reregistrations: int = 0
    #: Calls that failed, by final status name (``NOT_FOUND``, ...).
    failures: Mapping[str, int] = attrs.field(factory=dict)
    #: Serialized message bytes sent and received (gRPC payloads, without framing).
    bytes_sent: int = 0
    bytes_received: int = 0
