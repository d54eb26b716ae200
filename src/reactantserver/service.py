"""The RPCs, Trio-native: every KServe V2 and control call, over a ``ModelHost``.

Theory of operation
-------------------
:class:`Service` implements each RPC of ``inference.GRPCInferenceService`` and
``reactant_control.ControlService`` as an ``async`` method taking the request message
and a :class:`CallContext` (deadline, peer) and returning the response message. It
knows no transport: :mod:`reactantserver.transport.grpc` hops each call into Trio and
back, and errors raised here are the category classes of :mod:`reactantserver.errors`,
mapped to gRPC status codes in exactly one place (``transport.status``). Tests call
these methods directly, or through a real server.

Behind the service sits a :class:`ModelHost`, the seam the worker implements (runtime,
weight cache, scheduler, lifecycle). The host speaks in plain records defined here
(:class:`IndexEntry`, :class:`ExecutionStatistics`, :class:`ControlStatus`...), never in
protocol messages; this module does the translation both ways.

What the service owns itself:

* the :class:`~reactantserver.shm.SharedMemoryRegistry` (SystemSharedMemory* RPCs, and
  the regions ModelInfer reads inputs from and writes outputs to);
* the in-flight cap of ModelInfer, ``endpoints.max_concurrent_requests``: past it a call
  fails at once with ``TooManyRequests`` (RESOURCE_EXHAUSTED) and counts as shed;
* request-side statistics: per model, successes and failures with their end-to-end
  time, a latency histogram and the time of the last success (the host adds the
  device-side numbers); per RPC, calls by final status (fed by the transport through
  :meth:`Service.record_rpc`). Failures count only for a model that exists; a call for
  an unknown model shows up in the per-RPC counts as NOT_FOUND.

ModelInfer, step by step: cap check; model lookup (``NotFound``); model readiness
(``Unavailable``); :func:`~reactantserver.inferio.decode_request` validates everything
and computes the deadline; ``host.infer`` under a cancel scope at that deadline
(``DeadlineExceeded`` when it passes); :func:`~reactantserver.inferio.encode_response`.
Cancellation (client gone, server stopping) propagates untouched. ModelInfer takes and
returns the lean records of :mod:`reactantserver.transport.codec` (the transport
decodes and encodes them without betterproto); a betterproto request is accepted too.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NoReturn, Protocol

import attrs
import numpy as np
import trio

import reactantserver
from reactantserver.bundle.manifest import TensorSpec
from reactantserver.config.schema import Residency
from reactantserver.errors import (
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    TooManyRequests,
    Unavailable,
    Unimplemented,
)
from reactantserver.histogram import LATENCY_BUCKETS, Histogram, HistogramSnapshot
from reactantserver.inferio import decode_request, encode_response
from reactantserver.protocol import inference as pb
from reactantserver.protocol import reactant_control as cpb
from reactantserver.shm import SharedMemoryRegistry, object_exists
from reactantserver.transport.codec import InferRequest, InferResponse
from reactantserver.transport.status import StatusCode, code_of

SERVER_NAME = "reactantserver"
#: Triton's names for the protocol extensions this server implements.
EXTENSIONS: tuple[str, ...] = (
    "model_configuration",
    "model_repository",
    "statistics",
    "system_shared_memory",
)

# ------------------------------------------------------------------------------ records


@attrs.frozen
class CallContext:
    """What the transport knows about one call beyond its request message."""

    #: Absolute ``trio.current_time()`` of the gRPC deadline; ``inf`` when none was sent.
    deadline: float = math.inf
    #: The client's address, e.g. ``127.0.0.1:50312`` (for logs).
    peer: str = ""


@attrs.frozen
class Duration:
    """A count of events and their accumulated duration, nanoseconds."""

    count: int = 0
    ns: int = 0

    def plus(self, seconds: float) -> Duration:
        return Duration(self.count + 1, self.ns + max(0, round(seconds * 1e9)))

    def to_proto(self) -> pb.StatisticDuration:
        return pb.StatisticDuration(count=self.count, ns=self.ns)


@attrs.frozen
class BatchStatistics:
    """Executions at one batch size."""

    batch_size: int
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()


@attrs.frozen
class ExecutionStatistics:
    """The device side of one model's statistics, as the host counts it."""

    queue: Duration = Duration()
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()
    #: Batch rows inferred (a request of 8 rows counts 8).
    inference_count: int = 0
    #: Device executions (a coalesced batch counts 1).
    execution_count: int = 0
    batches: tuple[BatchStatistics, ...] = ()


@attrs.frozen
class RequestStatistics:
    """The request side of one model's statistics, as the service counts it."""

    success: Duration = Duration()
    fail: Duration = Duration()
    #: Wall-clock time of the last success, ms since the Unix epoch; 0 = never.
    last_inference_ms: int = 0
    #: ModelInfer latency from receipt to answer (every outcome), seconds, in
    #: ``histogram.LATENCY_BUCKETS``; ``None`` before the model's first request.
    latency: HistogramSnapshot | None = None
    #: Finished ModelInfer calls by status code name (``OK``, ``INVALID_ARGUMENT``, ...).
    by_status: Mapping[str, int] = attrs.field(factory=dict)


class _ModelCounters:
    """The mutable counters behind one model's ``RequestStatistics``.

    Plain integers on the request path (one call per answered request); the frozen
    records are built only when statistics are read.
    """

    __slots__ = ("by_code", "fail", "last_inference_ms", "latency", "success")

    def __init__(self) -> None:
        #: [count, nanoseconds] of successes and of failures.
        self.success = [0, 0]
        self.fail = [0, 0]
        self.last_inference_ms = 0
        self.latency = Histogram(LATENCY_BUCKETS)
        self.by_code: Counter[StatusCode] = Counter()

    def record(self, seconds: float, code: StatusCode) -> None:
        self.latency.observe(seconds)
        self.by_code[code] += 1
        if code is StatusCode.OK:
            counter = self.success
            self.last_inference_ms = int(time.time() * 1e3)
        else:
            counter = self.fail
        counter[0] += 1
        counter[1] += max(0, round(seconds * 1e9))

    def snapshot(self) -> RequestStatistics:
        return RequestStatistics(
            Duration(*self.success),
            Duration(*self.fail),
            self.last_inference_ms,
            self.latency.snapshot(),
            {code.name: n for code, n in self.by_code.items()},
        )


@attrs.frozen
class IndexEntry:
    """One model of the repository, for RepositoryIndex."""

    name: str
    version: str = ""
    #: ``READY``, ``UNAVAILABLE``, ``LOADING`` or ``UNLOADING`` (Triton's states).
    state: str = "READY"
    reason: str = ""


@attrs.frozen
class ModelControlInfo:
    """One model as the control plane sees it (``reactant_control.ModelStatus``)."""

    name: str
    residency: Residency
    device_resident: bool = False
    host_resident: bool = False
    weight_nbytes: int = 0
    weight: float = 1.0
    queue_depth: int = 0
    total_compute_seconds: float = 0.0
    requests_served: int = 0
    dispatch_count: int = 0
    max_batch_size: int = 0
    batch_input_name: str = ""
    #: 1-based position of the batch axis in the wire shape; 0 = none.
    batch_axis: int = 0
    rows_served: int = 0


@attrs.frozen
class ControlStatus:
    """The worker as the control plane sees it (``ModelControlStatusResponse``)."""

    residency_mode: Literal["self_managed", "externally_managed"]
    discipline: str
    models: tuple[ModelControlInfo, ...] = ()
    weight_cache_max_bytes: int = 0


@attrs.frozen
class CompactResult:
    reloaded_models: int = 0
    resident_bytes_after: int = 0


@attrs.frozen
class ServiceStatistics:
    """A snapshot of the service's own counters, for the metrics collector."""

    #: ModelInfer calls being served now.
    in_flight: int
    #: ``endpoints.max_concurrent_requests`` (0 = uncapped).
    max_concurrent_requests: int
    #: ModelInfer calls refused because the cap was reached.
    shed_total: int
    #: (RPC name, status name) -> calls that ended with that status, e.g.
    #: ``("ModelInfer", "OK")``.
    rpcs: Mapping[tuple[str, str], int]


# ------------------------------------------------------------------------------ the seam


class HostedModel(Protocol):
    """A loaded model, as the host presents it to clients."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str:
        """Version string; empty for an unversioned bundle."""
        ...

    @property
    def platform(self) -> str:
        """Backend identifier reported as ``platform``/``backend`` (e.g. ``jax_cpu``)."""
        ...

    @property
    def inputs(self) -> Sequence[TensorSpec]:
        """Client-facing inputs, wire order shapes, ``-1`` on batch/variable axes."""
        ...

    @property
    def outputs(self) -> Sequence[TensorSpec]: ...

    @property
    def max_batch_size(self) -> int:
        """Largest compiled batch size lowered by the per-model cap; 0 = unbatched."""
        ...

    @property
    def compiled_batch_sizes(self) -> Sequence[int]: ...

    @property
    def max_queue_depth(self) -> int: ...

    @property
    def parameters(self) -> Mapping[str, str]:
        """Free-form facts published in ModelConfig.parameters (weight, residency)."""
        ...

    def ready(self) -> tuple[bool, str]:
        """(ready, reason when not)."""
        ...

    def statistics(self) -> ExecutionStatistics: ...


class ModelHost(Protocol):
    """What the worker provides behind the RPCs. Errors are ``reactantserver.errors``."""

    @property
    def backend(self) -> str:
        """``cpu`` or ``cuda``."""
        ...

    @property
    def device_ordinal(self) -> int: ...

    def readiness(self) -> tuple[bool, str]:
        """(ready to take inference requests, reason when not)."""
        ...

    def get(self, name: str) -> HostedModel:
        """The loaded model ``name``; raises ``NotFound`` otherwise."""
        ...

    def index(self) -> Sequence[IndexEntry]: ...

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        deadline: float,
    ) -> Mapping[str, Any]:
        """Run one validated request; ``deadline`` is absolute ``trio.current_time()``.

        Returns at least the named outputs as numpy arrays (object arrays for BYTES).
        """
        ...

    async def load(self, name: str) -> None: ...

    async def unload(self, name: str) -> None: ...

    def control_status(self) -> ControlStatus: ...

    async def set_residency(self, name: str, target: Residency) -> Residency:
        """Apply a residency target; return the model's residency afterwards."""
        ...

    async def set_policy(self, name: str, weight: float) -> None: ...

    async def compact(self, reload: Sequence[str]) -> CompactResult: ...


# ------------------------------------------------------------------------------ conversions

_RESIDENCY_NAMES: dict[Residency, str] = {
    "unpinned": "UNPINNED",
    "system": "PINNED_SYSTEM",
    "device": "PINNED_DEVICE",
}
_RESIDENCY_TO_PROTO = {k: cpb.Residency.from_string(v) for k, v in _RESIDENCY_NAMES.items()}
_RESIDENCY_FROM_PROTO: dict[int, Residency] = {int(v): k for k, v in _RESIDENCY_TO_PROTO.items()}


def _data_type(datatype: str) -> pb.DataType:
    # Triton's config enum calls BYTES "TYPE_STRING"; every other name is TYPE_<datatype>.
    return pb.DataType.from_string("TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}")


def _tensor_metadata(spec: TensorSpec) -> pb.ModelMetadataResponseTensorMetadata:
    return pb.ModelMetadataResponseTensorMetadata(
        name=spec.name, datatype=spec.datatype, shape=list(spec.shape)
    )


def model_config(model: HostedModel, *, backend: str, device_ordinal: int) -> pb.ModelConfig:
    """``ModelConfig`` for ``model`` as docs/protocol.md specifies."""
    tensors = (*model.inputs, *model.outputs)
    # Triton's convention drops the batch axis from dims when max_batch_size > 0, which is
    # only truthful when every tensor has one; otherwise report full shapes.
    batched = model.max_batch_size > 0 and all(t.shape and t.shape[0] == -1 for t in tensors)
    skip = 1 if batched else 0
    config = pb.ModelConfig(
        name=model.name,
        platform=model.platform,
        backend=model.platform,
        version_policy=pb.ModelVersionPolicy(latest=pb.ModelVersionPolicyLatest(num_versions=1)),
        max_batch_size=model.max_batch_size if batched else 0,
        input=[
            pb.ModelInput(name=t.name, data_type=_data_type(t.datatype), dims=list(t.shape[skip:]))
            for t in model.inputs
        ],
        output=[
            pb.ModelOutput(name=t.name, data_type=_data_type(t.datatype), dims=list(t.shape[skip:]))
            for t in model.outputs
        ],
        instance_group=[
            pb.ModelInstanceGroup(
                name=model.name,
                count=1,
                kind=pb.ModelInstanceGroupKind.from_string(
                    "KIND_GPU" if backend == "cuda" else "KIND_CPU"
                ),
                gpus=[device_ordinal] if backend == "cuda" else [],
            )
        ],
        parameters={k: pb.ModelParameter(string_value=v) for k, v in model.parameters.items()},
        model_transaction_policy=pb.ModelTransactionPolicy(decoupled=False),
    )
    if batched and model.compiled_batch_sizes:
        config.dynamic_batching = pb.ModelDynamicBatching(
            preferred_batch_size=list(model.compiled_batch_sizes),
            max_queue_delay_microseconds=0,
            default_queue_policy=pb.ModelQueuePolicy(max_queue_size=model.max_queue_depth),
        )
    return config


def model_statistics(model: HostedModel, requests: RequestStatistics) -> pb.ModelStatistics:
    """Triton's ``ModelStatistics``: the service's request side plus the host's device side."""
    device = model.statistics()
    return pb.ModelStatistics(
        name=model.name,
        version=model.version,
        last_inference=requests.last_inference_ms,
        inference_count=device.inference_count,
        execution_count=device.execution_count,
        inference_stats=pb.InferStatistics(
            success=requests.success.to_proto(),
            fail=requests.fail.to_proto(),
            queue=device.queue.to_proto(),
            compute_input=device.compute_input.to_proto(),
            compute_infer=device.compute_infer.to_proto(),
            compute_output=device.compute_output.to_proto(),
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=b.batch_size,
                compute_input=b.compute_input.to_proto(),
                compute_infer=b.compute_infer.to_proto(),
                compute_output=b.compute_output.to_proto(),
            )
            for b in device.batches
        ],
    )


def _model_status(info: ModelControlInfo) -> cpb.ModelStatus:
    return cpb.ModelStatus(
        name=info.name,
        residency=_RESIDENCY_TO_PROTO[info.residency],
        device_resident=info.device_resident,
        host_resident=info.host_resident,
        weight_nbytes=info.weight_nbytes,
        weight=info.weight,
        queue_depth=info.queue_depth,
        total_compute_seconds=info.total_compute_seconds,
        requests_served=info.requests_served,
        dispatch_count=info.dispatch_count,
        max_batch_size=info.max_batch_size,
        batch_input_name=info.batch_input_name,
        batch_axis=info.batch_axis,
        rows_served=info.rows_served,
    )


def _enum_name(enum_type: type[cpb.Residency], value: int) -> str:
    try:
        return enum_type(value).name or str(value)
    except ValueError:
        return str(int(value))


# ------------------------------------------------------------------------------ the service


class Service:
    """Every RPC of both services, over ``host``; see the module docstring."""

    def __init__(
        self,
        host: ModelHost,
        *,
        max_concurrent_requests: int = 64,
        registry: SharedMemoryRegistry | None = None,
    ) -> None:
        if max_concurrent_requests < 0:
            raise ValueError("max_concurrent_requests must be >= 0 (0 = uncapped)")
        self._host = host
        self._cap = max_concurrent_requests
        self.registry = registry if registry is not None else SharedMemoryRegistry()
        self._in_flight = 0
        self._shed = 0
        self._rpcs: Counter[tuple[str, str]] = Counter()
        self._requests: dict[str, _ModelCounters] = {}

    # -------------------------------------------------------------- statistics

    def statistics(self) -> ServiceStatistics:
        return ServiceStatistics(
            in_flight=self._in_flight,
            max_concurrent_requests=self._cap,
            shed_total=self._shed,
            rpcs=dict(self._rpcs),
        )

    def request_statistics(self, model: str) -> RequestStatistics:
        counters = self._requests.get(model)
        return counters.snapshot() if counters is not None else RequestStatistics()

    def record_rpc(self, rpc: str, code: StatusCode) -> None:
        """Count one finished call of ``rpc`` (the transport calls this)."""
        self._rpcs[(rpc, code.name)] += 1

    def _record_request(self, model: str, seconds: float, code: StatusCode) -> None:
        counters = self._requests.get(model)
        if counters is None:
            counters = self._requests[model] = _ModelCounters()
        counters.record(seconds, code)

    # -------------------------------------------------------------- health and metadata

    async def server_live(
        self, request: pb.ServerLiveRequest, ctx: CallContext
    ) -> pb.ServerLiveResponse:
        # Answering at all is the proof of life: the event loop and the transport work.
        return pb.ServerLiveResponse(live=True)

    async def server_ready(
        self, request: pb.ServerReadyRequest, ctx: CallContext
    ) -> pb.ServerReadyResponse:
        ready, _ = self._host.readiness()
        return pb.ServerReadyResponse(ready=ready)

    async def model_ready(
        self, request: pb.ModelReadyRequest, ctx: CallContext
    ) -> pb.ModelReadyResponse:
        # "Is it ready?" about an unknown model, or one still loading or draining, is
        # answered "no" (as Triton does), not with an error.
        try:
            model = self._host.get(request.name)
        except (NotFound, Unavailable):
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=model.ready()[0])

    async def server_metadata(
        self, request: pb.ServerMetadataRequest, ctx: CallContext
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=reactantserver.__version__, extensions=list(EXTENSIONS)
        )

    def health(self, name: str) -> bool | None:
        """grpc.health.v1 (``transport.health``): whether the server (``name`` empty) or the
        model ``name`` serves; None for a model this worker does not know."""
        if not name:
            return self._host.readiness()[0]
        try:
            model = self._host.get(name)
        except NotFound:
            return None
        except Unavailable:  # known, but loading or draining
            return False
        return model.ready()[0]

    async def model_metadata(
        self, request: pb.ModelMetadataRequest, ctx: CallContext
    ) -> pb.ModelMetadataResponse:
        model = self._host.get(request.name)
        return pb.ModelMetadataResponse(
            name=model.name,
            versions=[model.version] if model.version else [],
            platform=model.platform,
            inputs=[_tensor_metadata(t) for t in model.inputs],
            outputs=[_tensor_metadata(t) for t in model.outputs],
        )

    async def model_config(
        self, request: pb.ModelConfigRequest, ctx: CallContext
    ) -> pb.ModelConfigResponse:
        model = self._host.get(request.name)
        config = model_config(
            model, backend=self._host.backend, device_ordinal=self._host.device_ordinal
        )
        return pb.ModelConfigResponse(config=config)

    async def model_statistics(
        self, request: pb.ModelStatisticsRequest, ctx: CallContext
    ) -> pb.ModelStatisticsResponse:
        if request.name:
            models = [self._host.get(request.name)]
        else:
            models = []
            for entry in self._host.index():
                try:
                    models.append(self._host.get(entry.name))
                except NotFound:
                    continue  # listed but not loaded: it has no statistics
        return pb.ModelStatisticsResponse(
            model_stats=[model_statistics(m, self.request_statistics(m.name)) for m in models]
        )

    # -------------------------------------------------------------- inference

    async def model_infer(
        self, request: InferRequest | pb.ModelInferRequest, ctx: CallContext
    ) -> InferResponse:
        if self._cap and self._in_flight >= self._cap:
            self._shed += 1
            raise TooManyRequests(
                f"{self._in_flight} requests are in flight, the limit "
                f"(endpoints.max_concurrent_requests) is {self._cap}; retry later"
            )
        self._in_flight += 1
        try:
            return await self._infer(request, ctx)
        finally:
            self._in_flight -= 1

    async def _infer(
        self, request: InferRequest | pb.ModelInferRequest, ctx: CallContext
    ) -> InferResponse:
        if not request.model_name:
            raise InvalidArgument("ModelInfer: model_name is empty")
        model = self._host.get(request.model_name)
        started = trio.current_time()
        code = StatusCode.OK
        try:
            ready, reason = model.ready()
            if not ready:
                raise Unavailable(f"model {model.name!r} is not ready: {reason}")
            call = decode_request(
                request,
                inputs=model.inputs,
                outputs=model.outputs,
                registry=self.registry,
                now=started,
                deadline=ctx.deadline,
            )
            if math.isinf(call.deadline):  # no deadline: spare the cancel scope
                results = await self._host.infer(
                    call.model, call.inputs, call.output_names, call.deadline
                )
            else:
                with trio.move_on_at(call.deadline) as scope:
                    results = await self._host.infer(
                        call.model, call.inputs, call.output_names, call.deadline
                    )
                if scope.cancelled_caught:
                    raise DeadlineExceeded(
                        f"model {model.name!r}: deadline passed after "
                        f"{trio.current_time() - started:.3f} s"
                    )
            response = encode_response(
                call, results, model_version=model.version, registry=self.registry
            )
            return response
        except BaseException as exc:
            # Failures include cancellation (client gone, deadline at the transport).
            code = code_of(exc)
            raise
        finally:
            self._record_request(model.name, trio.current_time() - started, code)

    async def model_stream_infer(self, request: None, ctx: CallContext) -> NoReturn:
        raise Unimplemented(
            "ModelStreamInfer is not supported: reactantserver answers each request once; "
            "call ModelInfer per request"
        )

    # -------------------------------------------------------------- repository

    async def repository_index(
        self, request: pb.RepositoryIndexRequest, ctx: CallContext
    ) -> pb.RepositoryIndexResponse:
        entries = [e for e in self._host.index() if not request.ready or e.state == "READY"]
        return pb.RepositoryIndexResponse(
            models=[
                pb.RepositoryIndexResponseModelIndex(
                    name=e.name, version=e.version, state=e.state, reason=e.reason
                )
                for e in entries
            ]
        )

    async def repository_model_load(
        self, request: pb.RepositoryModelLoadRequest, ctx: CallContext
    ) -> pb.RepositoryModelLoadResponse:
        if not request.model_name:
            raise InvalidArgument("RepositoryModelLoad: model_name is empty")
        if request.parameters:
            raise InvalidArgument(
                f"model {request.model_name!r}: load parameters "
                f"({', '.join(sorted(request.parameters))}) are not supported; models are "
                "loaded from their bundle directory as it is on disk"
            )
        await self._host.load(request.model_name)
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(
        self, request: pb.RepositoryModelUnloadRequest, ctx: CallContext
    ) -> pb.RepositoryModelUnloadResponse:
        if not request.model_name:
            raise InvalidArgument("RepositoryModelUnload: model_name is empty")
        # Parameters (Triton's unload_dependents) are ignored: models have no dependents
        # that a meta model does not already track itself.
        await self._host.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # -------------------------------------------------------------- system shared memory

    async def system_shared_memory_status(
        self, request: pb.SystemSharedMemoryStatusRequest, ctx: CallContext
    ) -> pb.SystemSharedMemoryStatusResponse:
        return pb.SystemSharedMemoryStatusResponse(
            regions={
                r.name: pb.SystemSharedMemoryStatusResponseRegionStatus(
                    name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size
                )
                for r in self.registry.status(request.name)
            }
        )

    async def system_shared_memory_register(
        self, request: pb.SystemSharedMemoryRegisterRequest, ctx: CallContext
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self.registry.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def system_shared_memory_unregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, ctx: CallContext
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.registry.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def is_same_ipc_namespace(
        self, request: pb.IsSameIpcNamespaceRequest, ctx: CallContext
    ) -> pb.IsSameIpcNamespaceResponse:
        return pb.IsSameIpcNamespaceResponse(same=object_exists(request.name))

    # -------------------------------------------------------------- not served

    async def cuda_shared_memory_status(
        self, request: pb.CudaSharedMemoryStatusRequest, ctx: CallContext
    ) -> NoReturn:
        _no_cuda_shm()

    async def cuda_shared_memory_register(
        self, request: pb.CudaSharedMemoryRegisterRequest, ctx: CallContext
    ) -> NoReturn:
        _no_cuda_shm()

    async def cuda_shared_memory_unregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, ctx: CallContext
    ) -> NoReturn:
        _no_cuda_shm()

    async def trace_setting(self, request: pb.TraceSettingRequest, ctx: CallContext) -> NoReturn:
        raise Unimplemented(
            "TraceSetting is not supported; per-model timings are in ModelStatistics and on "
            "the admin port's /metrics"
        )

    async def log_settings(self, request: pb.LogSettingsRequest, ctx: CallContext) -> NoReturn:
        raise Unimplemented(
            "LogSettings is not supported; set the log level in the server's configuration"
        )

    # -------------------------------------------------------------- control service

    async def model_control_status(
        self, request: cpb.ModelControlStatusRequest, ctx: CallContext
    ) -> cpb.ModelControlStatusResponse:
        status = self._host.control_status()
        return cpb.ModelControlStatusResponse(
            residency_mode=status.residency_mode,
            discipline=status.discipline,
            models=[_model_status(m) for m in sorted(status.models, key=lambda m: m.name)],
            weight_cache_max_bytes=status.weight_cache_max_bytes,
        )

    async def set_model_residency(
        self, request: cpb.SetModelResidencyRequest, ctx: CallContext
    ) -> cpb.SetModelResidencyResponse:
        target = _RESIDENCY_FROM_PROTO.get(int(request.target))
        if target is None:
            raise InvalidArgument(
                f"model {request.name!r}: target must be UNPINNED, PINNED_SYSTEM or "
                f"PINNED_DEVICE, got {_enum_name(cpb.Residency, request.target)}"
            )
        after = await self._host.set_residency(request.name, target)
        return cpb.SetModelResidencyResponse(residency=_RESIDENCY_TO_PROTO[after])

    async def set_model_policy(
        self, request: cpb.SetModelPolicyRequest, ctx: CallContext
    ) -> cpb.SetModelPolicyResponse:
        # Validate the name even when nothing changes, so a typo is reported.
        self._host.get(request.name)
        if request.has_weight:
            if not (math.isfinite(request.weight) and request.weight > 0):
                raise InvalidArgument(
                    f"model {request.name!r}: weight must be finite and > 0, got {request.weight!r}"
                )
            await self._host.set_policy(request.name, request.weight)
        return cpb.SetModelPolicyResponse()

    async def compact_memory(
        self, request: cpb.CompactMemoryRequest, ctx: CallContext
    ) -> cpb.CompactMemoryResponse:
        result = await self._host.compact(list(request.reload_models))
        return cpb.CompactMemoryResponse(
            reloaded_models=result.reloaded_models,
            resident_bytes_after=result.resident_bytes_after,
        )


def _no_cuda_shm() -> NoReturn:
    raise Unimplemented(
        "CUDA shared memory is not supported; register system shared memory "
        "(SystemSharedMemoryRegister) or send tensors inline"
    )
