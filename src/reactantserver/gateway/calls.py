"""What the gateway's RPC handlers share: the raw codec, the call record, passed-through
statuses, and the two seams the proxy is given (the fleet, the lpt_packing control plane).

Every message enters and leaves the gateway as bytes (:class:`RawCodec`): a handler reads
what it needs from them itself (the ModelInfer peek, a small request's name) and forwards
them as received. A worker's answer that is not OK reaches the client as the worker sent it
(:class:`Passthrough`, turned into the gRPC status by the proxy's one handler wrapper);
the gateway's own outcomes are the errors of :mod:`reactantserver.errors`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from grpclib.encoding.base import CodecBase

from ..errors import InvalidArgument
from ..grpcwire import StatusCode
from ..protocol.screen import decode_message
from ..transport.grpcerror import grpc_error
from .pool import WorkerClient

#: The codes the gateway's handlers compare against, as module names (a forwarded call
#: compares its answer's status once: no attribute lookup): grpcwire's members.
OK, CANCELLED, DEADLINE_EXCEEDED = StatusCode.OK, StatusCode.CANCELLED, StatusCode.DEADLINE_EXCEEDED
NOT_FOUND, UNAVAILABLE = StatusCode.NOT_FOUND, StatusCode.UNAVAILABLE


class Raw:
    """Marks a handler's message types as raw bytes (see :class:`RawCodec`)."""


class RawCodec(CodecBase):
    """Messages as bytes both ways: the proxy decodes only what it needs, itself.

    ``max_recv`` / ``max_send`` are ``grpc.max_recv_msg_bytes`` / ``max_send_msg_bytes``;
    past them a message is refused with RESOURCE_EXHAUSTED. Messages of other types (the
    Health service's) are betterproto messages.
    """

    __content_subtype__ = "proto"

    def __init__(self, max_recv: int, max_send: int) -> None:
        self._max_recv = max_recv
        self._max_send = max_send

    def encode(self, message: Any, message_type: Any) -> bytes:
        data = message if isinstance(message, bytes | memoryview) else bytes(message)
        if len(data) > self._max_send:
            raise grpc_error(
                StatusCode.RESOURCE_EXHAUSTED,
                f"response message of {len(data)} bytes exceeds the gateway's limit of "
                f"{self._max_send} bytes (grpc.max_send_msg_bytes)",
            )
        return data  # type: ignore[return-value]  # grpclib only concatenates it

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self._max_recv:
            raise grpc_error(
                StatusCode.RESOURCE_EXHAUSTED,
                f"request message of {len(data)} bytes exceeds the gateway's limit of "
                f"{self._max_recv} bytes (grpc.max_recv_msg_bytes); use shared memory for "
                "tensors this large",
            )
        if message_type is Raw or message_type is None:
            return data
        try:
            return decode_message(data, message_type)  # bounded work (protocol/screen.py)
        except InvalidArgument as exc:
            raise grpc_error(StatusCode.INVALID_ARGUMENT, str(exc)) from None


class Passthrough(Exception):
    """A worker's status, answered to the client as the worker sent it."""

    def __init__(self, code: StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class CallInfo:
    """What a handler knows about the call it serves."""

    __slots__ = ("deadline", "model", "owner", "rpc", "tell")

    def __init__(self, rpc: str, deadline: float, *, tell: bool = True, owner: str = "") -> None:
        self.rpc = rpc
        #: Whose shared-memory regions the call may see and use (its client:
        #: :mod:`reactantserver.transport.core.auth`, rule 4).
        self.owner = owner
        #: ``loop.time()`` by which the call must be answered.
        self.deadline = deadline
        #: ``deadline`` is the client's, and a forwarded call tells the worker; False when
        #: the client set none and ``deadline`` is the gateway's request timeout.
        self.tell = tell
        #: The model label of the call's statistics ("" = none or unknown).
        self.model = ""


#: One RPC's implementation: the request's bytes in, the response's bytes out.
Method = Callable[[bytes, CallInfo], Awaitable[bytes | memoryview]]


class FleetView(Protocol):
    """What the handlers ask the prober: who answers, who is ready."""

    def answering(self) -> tuple[WorkerClient, ...]: ...

    def ready(self) -> tuple[bool, str]: ...


class ControlPlane(Protocol):
    """The seam for ``reactant_control.GatewayControlService`` under lpt_packing: the
    serialized request in, the serialized response out (errors of ``reactantserver.errors``)."""

    async def call(self, rpc: str, request: bytes, deadline: float) -> bytes: ...
