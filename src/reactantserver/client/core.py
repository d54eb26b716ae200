"""The client engine: one HTTP/2 connection and every RPC over it, on asyncio.

Theory of operation
-------------------
:class:`Core` owns one :class:`~.channel.Channel` (unary gRPC calls over the transport's
sans-IO client role, :mod:`reactantserver.h2.client`) -- one connection, opened
on the first call and reopened after the server goes away -- with flow-control windows
well above HTTP/2's 64 KiB defaults so large tensors stream without waiting for window
updates. Messages are
encoded and decoded by grpclib's protobuf codec (betterproto's messages), ModelInfer's
by :mod:`.wire`. A request is sent as the pieces its encoder made: a ModelInfer
request's tensors go from the caller's arrays to the socket uncopied. Every RPC goes
through :meth:`Core.call`:

1. The budget: ``timeout`` seconds (the client's default when not given) fixes an
   absolute deadline on the loop's monotonic clock. Each attempt is sent with the time
   that remains as its gRPC deadline, so the server sees it too (EDF reads it), and no
   attempt starts after it.
2. An attempt's exception is translated once (:func:`.status.translate`) into a status
   code and an error of :mod:`reactantserver.errors`.
3. RESOURCE_EXHAUSTED and UNAVAILABLE are tried again after the pause the
   :class:`~.retry.RetryPolicy` draws, unless that pause would outlive the deadline;
   every other failure -- NOT_FOUND, INVALID_ARGUMENT, DEADLINE_EXCEEDED, ... -- is raised
   at once, carrying the server's message.

``infer`` with a shared-memory region reads the model's ``ModelConfig`` once (cached per
model, dropped after any failure of that model's call, and on load/unload) to size the
output windows: a batched model's outputs have the request's batch extent; an output
with an extent that cannot be known in advance (a variable axis, BYTES) comes back
inline. When the server answers FAILED_PRECONDITION about the region -- it forgot it
(restarted) or it maps an older object -- and this client registered that region, the
region is registered again and the call is made once more (once per call).

``infer`` with inputs that are not numpy arrays (lists, tuples, scalars) reads the
model's ``ModelMetadata`` once (cached per model, dropped like the output layout) and
converts them to the declared datatypes, refusing any conversion that would lose a
value (:mod:`.coerce`). When a call with converted inputs is refused with
INVALID_ARGUMENT and the datatypes came from the cache, the metadata is read again and,
if the model now declares other datatypes, the inputs are converted again and the call
made once more.

Everything here runs on one asyncio loop: the caller's own (``AsyncClient`` under
asyncio) or a private loop thread (``Client``, and ``AsyncClient`` under Trio). The
statistics counters are plain integers touched only on that loop.
"""

from __future__ import annotations

import asyncio
import math
import random
import ssl
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import attrs
import numpy as np
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError

from reactantserver.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RequestError,
    Unavailable,
)
from reactantserver.protocol import inference as pb
from reactantserver.protocol import reactant_control as cpb
from reactantserver.transport.tls import ClientTls

from .channel import Channel
from .codec import decode_outputs, encode_request, output_nbytes, wire_array
from .coerce import to_declared
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
from .status import RETRYABLE, translate
from .wire import InferRequestWire, InferResponseWire

_Reply = TypeVar("_Reply")

INFERENCE = "/inference.GRPCInferenceService/"
CONTROL = "/reactant_control.ControlService/"

#: Inbound HTTP/2 windows, as on the server.
CONNECTION_WINDOW = 64 * 1024 * 1024
STREAM_WINDOW = 16 * 1024 * 1024

#: Residency names of the configuration <-> the control protocol's enum.
RESIDENCIES: dict[str, cpb.Residency] = {
    "unpinned": cpb.Residency.from_string("UNPINNED"),
    "system": cpb.Residency.from_string("PINNED_SYSTEM"),
    "device": cpb.Residency.from_string("PINNED_DEVICE"),
}


#: What a client's ``tls`` may be: a :class:`~reactantserver.transport.tls.ClientTls`
#: (CA, client certificate and key, server name; reloaded when the files change), an
#: ``ssl.SSLContext`` of the caller's, ``True`` (the system's CAs) or None (cleartext).
TlsArg = ClientTls | ssl.SSLContext | bool | None


def resolve_tls(url: str, tls: TlsArg) -> ClientTls | ssl.SSLContext | None:
    """The TLS a client uses: ``tls``, or the system's CAs for a ``grpcs://`` URL."""
    if tls is None:
        tls = url.startswith(("grpcs://", "https://"))
    if tls is True:
        return ClientTls("")
    if tls is False:
        return None
    return tls


def parse_url(url: str) -> tuple[str, int]:
    """``host:port``, ``grpc://host:port`` or ``http://host:port`` (``[v6]:port`` too;
    ``grpcs://`` and ``https://`` turn on TLS)."""
    rest = url.split("://", 1)[1] if "://" in url else url
    rest = rest.rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"invalid server address {url!r}; expected host:port")
    return host.strip("[]"), int(port)


class _CountingCodec(ProtoCodec):
    """grpclib's protobuf codec, counting payload bytes each way."""

    def __init__(self) -> None:
        self.sent = 0
        self.received = 0

    def encode(self, message: Any, message_type: Any) -> bytes:
        data = super().encode(message, message_type)
        self.sent += len(data)
        return data

    def encode_parts(self, message: Any) -> list[bytes | memoryview]:
        """``message`` as pieces to send unjoined (:meth:`.channel.Channel.unary`): a
        ModelInfer request's own pieces (its tensors not copied), else its encoding."""
        if not isinstance(message, InferRequestWire):
            return [self.encode(message, type(message))]
        parts = message.parts()
        self.sent += sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
        return parts

    def decode(self, data: bytes | memoryview, message_type: Any) -> Any:
        """A ModelInfer answer is read in place (its outputs view ``data``); every other
        message is parsed by betterproto from ``bytes``."""
        self.received += len(data)
        if message_type is InferResponseWire:
            return InferResponseWire.FromString(data)
        return super().decode(bytes(data), message_type)


@attrs.frozen
class _OutputLayout:
    """What ``infer`` with shared memory needs to size output windows, per model."""

    #: Every output has a leading batch axis, and it is left out of ``outputs``' dims.
    batched: bool
    #: The input whose first extent is the request's batch size.
    batch_input: str
    #: Output name -> (datatype, dims), in the model's order.
    outputs: Mapping[str, tuple[str, tuple[int, ...]]]

    @classmethod
    def from_config(cls, config: pb.ModelConfig) -> _OutputLayout:
        def datatype(tensor: pb.ModelInput | pb.ModelOutput) -> str:
            name = pb.DataType(tensor.data_type).name or ""
            name = name.removeprefix("TYPE_")
            return "BYTES" if name == "STRING" else name

        return cls(
            batched=config.max_batch_size > 0,
            batch_input=config.input[0].name if config.input else "",
            outputs={o.name: (datatype(o), tuple(o.dims)) for o in config.output},
        )

    def sizes(
        self, wanted: Sequence[str], inputs: Mapping[str, tuple[str, np.ndarray]]
    ) -> dict[str, int]:
        """Bytes of each wanted output whose size is known before the call."""
        batch: int | None = None
        if self.batched:
            arr = inputs.get(self.batch_input, (None, None))[1]
            if arr is None or arr.ndim == 0:
                return {}
            batch = int(arr.shape[0])
        sizes: dict[str, int] = {}
        for name in wanted:
            spec = self.outputs.get(name)
            if spec is None:
                continue  # the server will name the unknown output
            datatype, dims = spec
            shape = (batch, *dims) if batch is not None else dims
            nbytes = output_nbytes(datatype, shape)
            if nbytes is not None:
                sizes[name] = nbytes
        return sizes


class Core:
    """One connection to one server, and every RPC over it (runs on one asyncio loop).

    Only the two front ends build a core and call its ``infer``, always with every
    argument: their signatures are the client's public ones, defaults and all, so those
    of the core take no defaults of their own (a third copy that nothing would read).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float | None,
        retry: RetryPolicy | None,
        seed: int | None,
        tls: TlsArg,
        metadata: Mapping[str, str] | None,
    ) -> None:
        self.host, self.port = parse_url(url)
        self.tls = resolve_tls(url, tls)
        self.metadata = tuple((metadata or {}).items())
        self.target = f"{self.host}:{self.port}"
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds (or None), got {timeout!r}")
        self.timeout = timeout
        self.retry = retry if retry is not None else RetryPolicy()
        self._rng = random.Random(seed)
        self._codec = _CountingCodec()
        self._channel: Channel | None = None
        self._layouts: dict[str, _OutputLayout] = {}
        #: model -> input name -> declared datatype, for converting array-likes.
        self._datatypes: dict[str, dict[str, str]] = {}
        self._registered: dict[str, SharedMemoryRegion] = {}
        self._calls = 0
        self._attempts = 0
        self._retries = 0
        self._backoff = 0.0
        self._reregistrations = 0
        # Replaced, never mutated: another thread may read it for statistics().
        self._failures: Mapping[str, int] = {}

    # ------------------------------------------------------------------ plumbing

    def statistics(self) -> ClientStatistics:
        return ClientStatistics(
            calls=self._calls,
            attempts=self._attempts,
            retries=self._retries,
            backoff_seconds=self._backoff,
            reregistrations=self._reregistrations,
            failures=dict(self._failures),
            bytes_sent=self._codec.sent,
            bytes_received=self._codec.received,
        )

    def _connection(self) -> Channel:
        if self._channel is None:
            self._channel = Channel(
                self.host,
                self.port,
                stream_window=STREAM_WINDOW,
                connection_window=CONNECTION_WINDOW,
                tls=self.tls,
                metadata=self.metadata,
            )
        return self._channel

    def close(self) -> None:
        """Close the connection (call on the loop the core runs on)."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def deadline(self, timeout: float | None) -> float:
        """The absolute deadline (loop clock) for a call given ``timeout`` (or the default)."""
        budget = timeout if timeout is not None else self.timeout
        if budget is None:
            return math.inf
        if not budget > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {budget!r}")
        return asyncio.get_running_loop().time() + budget

    async def call(
        self,
        path: str,
        request: Any,
        reply_type: type[_Reply],
        *,
        deadline: float,
        retry: bool = True,
    ) -> _Reply:
        """Make one RPC: attempts, retries and error translation as the module says."""
        rpc = path.rsplit("/", 1)[1]
        loop = asyncio.get_running_loop()
        self._calls += 1
        retries = 0
        while True:
            try:
                return await self._attempt(path, rpc, request, reply_type, deadline)
            except Exception as exc:
                outcome = translate(exc, rpc=rpc, target=self.target)
                if outcome is None:
                    raise
                code, error = outcome
                delay = None
                if retry and code in RETRYABLE:
                    delay = self.retry.next_delay(
                        retries, now=loop.time(), deadline=deadline, rng=self._rng
                    )
                if delay is None:
                    self._failures = {
                        **self._failures,
                        code.name: self._failures.get(code.name, 0) + 1,
                    }
                    if error is exc:
                        raise
                    # The server's status already says everything; a transport failure
                    # keeps its cause for debugging.
                    cause = None if isinstance(exc, GRPCError) else exc
                    raise error from cause
            retries += 1
            self._retries += 1
            self._backoff += delay
            await asyncio.sleep(delay)

    async def _attempt(
        self, path: str, rpc: str, request: Any, reply_type: type[_Reply], deadline: float
    ) -> _Reply:
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise DeadlineExceeded(f"{rpc}: the call's deadline passed before it could be sent")
        self._attempts += 1
        message = await self._connection().unary(
            path,
            self._codec.encode_parts(request),
            timeout=None if math.isinf(remaining) else remaining,
        )
        if message is None:
            raise Unavailable(f"{rpc}: {self.target} closed the call without an answer")
        reply: _Reply = self._codec.decode(message, reply_type)
        return reply

    # ------------------------------------------------------------------ health, metadata

    async def server_live(self, timeout: float | None = None) -> bool:
        reply = await self.call(
            INFERENCE + "ServerLive",
            pb.ServerLiveRequest(),
            pb.ServerLiveResponse,
            deadline=self.deadline(timeout),
        )
        return reply.live

    async def server_ready(self, timeout: float | None = None) -> bool:
        reply = await self.call(
            INFERENCE + "ServerReady",
            pb.ServerReadyRequest(),
            pb.ServerReadyResponse,
            deadline=self.deadline(timeout),
        )
        return reply.ready

    async def model_ready(self, name: str, timeout: float | None = None) -> bool:
        reply = await self.call(
            INFERENCE + "ModelReady",
            pb.ModelReadyRequest(name=name),
            pb.ModelReadyResponse,
            deadline=self.deadline(timeout),
        )
        return reply.ready

    async def server_metadata(self, timeout: float | None = None) -> ServerMetadata:
        reply = await self.call(
            INFERENCE + "ServerMetadata",
            pb.ServerMetadataRequest(),
            pb.ServerMetadataResponse,
            deadline=self.deadline(timeout),
        )
        return ServerMetadata(reply.name, reply.version, tuple(reply.extensions))

    async def model_metadata(
        self, name: str, timeout: float | None = None, *, deadline: float | None = None
    ) -> ModelMetadata:
        reply = await self.call(
            INFERENCE + "ModelMetadata",
            pb.ModelMetadataRequest(name=name),
            pb.ModelMetadataResponse,
            deadline=deadline if deadline is not None else self.deadline(timeout),
        )

        def tensors(specs: Sequence[pb.ModelMetadataResponseTensorMetadata]) -> tuple[Any, ...]:
            return tuple(TensorMetadata(t.name, t.datatype, tuple(t.shape)) for t in specs)

        return ModelMetadata(
            reply.name,
            tuple(reply.versions),
            reply.platform,
            tensors(reply.inputs),
            tensors(reply.outputs),
        )

    async def model_config(
        self, name: str, timeout: float | None = None, *, deadline: float | None = None
    ) -> pb.ModelConfig:
        reply = await self.call(
            INFERENCE + "ModelConfig",
            pb.ModelConfigRequest(name=name),
            pb.ModelConfigResponse,
            deadline=deadline if deadline is not None else self.deadline(timeout),
        )
        return reply.config

    async def model_statistics(
        self, name: str = "", timeout: float | None = None
    ) -> list[pb.ModelStatistics]:
        reply = await self.call(
            INFERENCE + "ModelStatistics",
            pb.ModelStatisticsRequest(name=name),
            pb.ModelStatisticsResponse,
            deadline=self.deadline(timeout),
        )
        return list(reply.model_stats)

    # ------------------------------------------------------------------ repository

    async def repository_index(
        self, ready: bool = False, timeout: float | None = None
    ) -> list[RepositoryModel]:
        reply = await self.call(
            INFERENCE + "RepositoryIndex",
            pb.RepositoryIndexRequest(ready=ready),
            pb.RepositoryIndexResponse,
            deadline=self.deadline(timeout),
        )
        return [RepositoryModel(m.name, m.version, m.state, m.reason) for m in reply.models]

    async def load_model(self, name: str, timeout: float | None = None) -> None:
        self._forget(name)
        await self.call(
            INFERENCE + "RepositoryModelLoad",
            pb.RepositoryModelLoadRequest(model_name=name),
            pb.RepositoryModelLoadResponse,
            deadline=self.deadline(timeout),
        )

    async def unload_model(self, name: str, timeout: float | None = None) -> None:
        self._forget(name)
        await self.call(
            INFERENCE + "RepositoryModelUnload",
            pb.RepositoryModelUnloadRequest(model_name=name),
            pb.RepositoryModelUnloadResponse,
            deadline=self.deadline(timeout),
        )

    # ------------------------------------------------------------------ shared memory

    async def register(
        self,
        region: SharedMemoryRegion,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
    ) -> None:
        """Register ``region`` (the whole object) under ``region.name``."""
        await self.call(
            INFERENCE + "SystemSharedMemoryRegister",
            pb.SystemSharedMemoryRegisterRequest(
                name=region.name, key=region.key, offset=0, byte_size=region.nbytes
            ),
            pb.SystemSharedMemoryRegisterResponse,
            deadline=deadline if deadline is not None else self.deadline(timeout),
        )
        self._registered[region.name] = region

    async def unregister(
        self, name: str = "", timeout: float | None = None, *, retry: bool = True
    ) -> None:
        """Unregister region ``name`` (every region when empty); unknown names are fine."""
        await self.call(
            INFERENCE + "SystemSharedMemoryUnregister",
            pb.SystemSharedMemoryUnregisterRequest(name=name),
            pb.SystemSharedMemoryUnregisterResponse,
            deadline=self.deadline(timeout),
            retry=retry,
        )
        if name:
            self._registered.pop(name, None)
        else:
            self._registered.clear()

    async def shared_memory_status(
        self, name: str = "", timeout: float | None = None
    ) -> list[RegionStatus]:
        reply = await self.call(
            INFERENCE + "SystemSharedMemoryStatus",
            pb.SystemSharedMemoryStatusRequest(name=name),
            pb.SystemSharedMemoryStatusResponse,
            deadline=self.deadline(timeout),
        )
        return [
            RegionStatus(r.name, r.key, r.offset, r.byte_size)
            for r in sorted(reply.regions.values(), key=lambda r: r.name)
        ]

    async def same_ipc_namespace(self, timeout: float | None = None) -> bool:
        """Whether the server can open shared memory this process creates."""
        with SharedMemoryRegion(1) as probe:
            reply = await self.call(
                INFERENCE + "IsSameIPCNamespace",
                pb.IsSameIpcNamespaceRequest(name=probe.key),
                pb.IsSameIpcNamespaceResponse,
                deadline=self.deadline(timeout),
            )
        return reply.same

    # ------------------------------------------------------------------ control service

    async def control_status(self, timeout: float | None = None) -> cpb.ModelControlStatusResponse:
        return await self.call(
            CONTROL + "ModelControlStatus",
            cpb.ModelControlStatusRequest(),
            cpb.ModelControlStatusResponse,
            deadline=self.deadline(timeout),
        )

    async def set_model_residency(
        self, name: str, residency: str, timeout: float | None = None
    ) -> str:
        target = RESIDENCIES.get(residency)
        if target is None:
            raise ValueError(
                f"residency must be one of {', '.join(RESIDENCIES)}, got {residency!r}"
            )
        reply = await self.call(
            CONTROL + "SetModelResidency",
            cpb.SetModelResidencyRequest(name=name, target=target),
            cpb.SetModelResidencyResponse,
            deadline=self.deadline(timeout),
        )
        names = {int(v): k for k, v in RESIDENCIES.items()}
        return names.get(int(reply.residency), str(int(reply.residency)))

    async def set_model_policy(
        self, name: str, weight: float | None = None, timeout: float | None = None
    ) -> None:
        await self.call(
            CONTROL + "SetModelPolicy",
            cpb.SetModelPolicyRequest(
                name=name, has_weight=weight is not None, weight=weight or 0.0
            ),
            cpb.SetModelPolicyResponse,
            deadline=self.deadline(timeout),
        )

    async def compact_memory(
        self, reload_models: Sequence[str] = (), timeout: float | None = None
    ) -> cpb.CompactMemoryResponse:
        return await self.call(
            CONTROL + "CompactMemory",
            cpb.CompactMemoryRequest(reload_models=list(reload_models)),
            cpb.CompactMemoryResponse,
            deadline=self.deadline(timeout),
        )

    # ------------------------------------------------------------------ inference

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None,
        *,
        timeout: float | None,
        shm: SharedMemoryRegion | None,
        request_id: str,
    ) -> dict[str, np.ndarray]:
        deadline = self.deadline(timeout)
        # Array-likes take the model's declared datatypes (read once, then cached); numpy
        # arrays are sent as they are, and cost no lookup.
        loose = [name for name, value in inputs.items() if not isinstance(value, np.ndarray)]
        cached = model in self._datatypes
        declared = await self._declared(model, deadline) if loose else {}
        wired = self._wire(inputs, loose, declared)
        try:
            if shm is None:
                return await self._infer_inline(model, wired, outputs, request_id, deadline)
            with shm.claim():
                return await self._infer_shm(model, wired, outputs, shm, request_id, deadline)
        except RequestError as exc:
            # The model may have been reloaded with other shapes: read them afresh next
            # time; and its datatypes too when the server says the request or the model
            # name was wrong (not for a full queue or a deadline: nothing changed then).
            self._layouts.pop(model, None)
            if isinstance(exc, InvalidArgument | NotFound):
                self._datatypes.pop(model, None)
            if not (loose and cached and isinstance(exc, InvalidArgument)):
                raise
            # The datatypes converted to came from the cache: if the model changed them,
            # convert again and try once more (the refused call did not run).
            fresh = await self._declared(model, deadline)
            if all(fresh.get(name) == declared.get(name) for name in loose):
                raise
            wired = self._wire(inputs, loose, fresh)
            if shm is None:
                return await self._infer_inline(model, wired, outputs, request_id, deadline)
            with shm.claim():
                return await self._infer_shm(model, wired, outputs, shm, request_id, deadline)

    def _forget(self, model: str) -> None:
        """Drop what is cached about ``model`` (its output layout, its input datatypes)."""
        self._layouts.pop(model, None)
        self._datatypes.pop(model, None)

    async def _declared(self, model: str, deadline: float) -> Mapping[str, str]:
        """``model``'s input name -> declared datatype, from ModelMetadata (cached)."""
        found = self._datatypes.get(model)
        if found is None:
            meta = await self.model_metadata(model, deadline=deadline)
            found = self._datatypes[model] = {t.name: t.datatype for t in meta.inputs}
        return found

    @staticmethod
    def _wire(
        inputs: Mapping[str, Any], loose: Sequence[str], declared: Mapping[str, str]
    ) -> dict[str, tuple[str, np.ndarray]]:
        """``(datatype, array)`` per input: array-likes converted to what the model
        declares (an input it does not declare is left to the server to name)."""
        wired = {}
        for name, value in inputs.items():
            if name in loose and name in declared:
                value = to_declared(name, value, declared[name])
            wired[name] = wire_array(name, value)
        return wired

    async def _infer_inline(
        self,
        model: str,
        wired: Mapping[str, tuple[str, np.ndarray]],
        outputs: Sequence[str] | None,
        request_id: str,
        deadline: float,
    ) -> dict[str, np.ndarray]:
        request = encode_request(
            model,
            {name: arr for name, (_, arr) in wired.items()},
            outputs=outputs,
            request_id=request_id,
        )
        response = await self.call(
            INFERENCE + "ModelInfer", request, InferResponseWire, deadline=deadline
        )
        return decode_outputs(response)

    async def _infer_shm(
        self,
        model: str,
        wired: Mapping[str, tuple[str, np.ndarray]],
        outputs: Sequence[str] | None,
        shm: SharedMemoryRegion,
        request_id: str,
        deadline: float,
    ) -> dict[str, np.ndarray]:
        layout = self._layouts.get(model)
        if layout is None:
            config = await self.model_config(model, deadline=deadline)
            layout = self._layouts[model] = _OutputLayout.from_config(config)
        wanted = list(outputs) if outputs is not None else list(layout.outputs)
        input_placements = shm.place_inputs(wired)
        output_placements = shm.place_outputs(layout.sizes(wanted, wired))
        request = encode_request(
            model,
            {name: arr for name, (_, arr) in wired.items()},
            outputs=wanted,
            request_id=request_id,
            input_placements=input_placements,
            output_placements=output_placements,
        )
        path = INFERENCE + "ModelInfer"
        try:
            response = await self.call(path, request, InferResponseWire, deadline=deadline)
        except FailedPrecondition as exc:
            if self._registered.get(shm.name) is not shm or (
                f"shared memory region {shm.name!r}" not in str(exc)
            ):
                raise
            # The server forgot the region (it restarted) or maps an older object under
            # its name: register it again, and try once more.
            await self.register(shm, deadline=deadline)
            self._reregistrations += 1
            response = await self.call(path, request, InferResponseWire, deadline=deadline)
        return decode_outputs(response, read_shm=shm.read)
