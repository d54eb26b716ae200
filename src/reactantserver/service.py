"""The RPCs: every KServe V2 and control call, over a ``ModelHost``.

Theory of operation
-------------------
:class:`Service` implements each RPC of ``inference.GRPCInferenceService`` and
``reactant_control.ControlService`` as an ``async`` method taking the request message
and a :class:`~reactantserver.records.CallContext` (deadline, peer) and returning the
response message -- ModelInfer also as three steps the transport calls itself (below).
It knows no transport: :mod:`reactantserver.worker.grpc` runs each other call as a
Trio task and ModelInfer's steps on the asyncio side, and errors raised here are the category classes of
:mod:`reactantserver.errors`, mapped to gRPC status codes in exactly one place
(:mod:`reactantserver.status`). Tests call these methods directly, or through a real
server.

Behind the service sits a :class:`~reactantserver.host.ModelHost`, the seam the worker
implements (runtime, weight cache, scheduler, lifecycle). The host speaks in the plain
records of :mod:`reactantserver.records`, never in protocol messages; the translations
both ways are in :mod:`reactantserver.messages`.

What the service owns itself:

* the :class:`~reactantserver.shm.SharedMemoryRegistry` (SystemSharedMemory* RPCs, and
  the regions ModelInfer reads inputs from and writes outputs to);
* the cap on ModelInfer calls in flight, ``endpoints.max_concurrent_requests`` (each
  request of a ModelStreamInfer stream counts as one; the other RPCs are not counted): past it a call fails at once with ``TooManyRequests``
  (RESOURCE_EXHAUSTED) and counts as shed;
* request-side statistics: per model, successes and failures with their end-to-end
  time, a latency histogram and the time of the last success (the host adds the
  device-side numbers); per RPC, calls by final status (fed by the transport through
  :meth:`Service.record_rpc`). Failures count only for a model that exists; a call for
  an unknown model shows up in the per-RPC counts as NOT_FOUND.

ModelInfer is *begin -> wait -> finish*, with no task of its own: :meth:`Service.begin_infer`
(synchronous: cap check; model lookup, ``NotFound``; the version asked for
(:mod:`~reactantserver.model_version`); readiness, ``Unavailable``;
:func:`~reactantserver.inferio.decode_request` validates everything and computes the
deadline; ``host.begin`` admits and queues it, handing over an
:class:`~reactantserver.records.Answer`), then the caller waits until the host settles
the answer (the transport: an asyncio future, resolved by the dispatch loop, which also
enforces the deadline), then :meth:`Service.finish_infer` (synchronous:
:func:`~reactantserver.inferio.encode_response` and the statistics). A caller that gives
up calls :meth:`Service.abandon_infer`, which withdraws the request from the host.
:meth:`Service.model_infer` is the three steps for a Trio caller. ModelInfer takes and
returns the lean records (the transport decodes and encodes them without betterproto);
a betterproto request is accepted too.

Why one module of this size: one short method per RPC of two services (26 RPCs), all
over the one host seam; the translations to messages are already in ``messages.py``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import NoReturn

import betterproto
import trio

import reactantserver
from reactantserver.cuda_shm import cuda_register, cuda_status, cuda_unregister
from reactantserver.errors import (
    BundleError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RequestError,
    TooManyRequests,
    Unavailable,
    Unimplemented,
    quoted,
)
from reactantserver.grpcwire import StatusCode
from reactantserver.histogram import LATENCY_BUCKETS, Histogram
from reactantserver.host import HostedModel, ModelHost
from reactantserver.inferio import InferCall, decode_request, encode_response
from reactantserver.load_config import Override
from reactantserver.load_config import parse as parse_load_config
from reactantserver.messages import (
    RESIDENCY_FROM_PROTO,
    RESIDENCY_TO_PROTO,
    enum_name,
    model_config,
    model_statistics,
    model_status,
    tensor_metadata,
)
from reactantserver.model_version import check_version, parse_version, serves_version
from reactantserver.protocol import inference as pb
from reactantserver.protocol import reactant_control as cpb
from reactantserver.records import (
    Answer,
    CallContext,
    Duration,
    InferRequest,
    InferResponse,
    RequestStatistics,
    ServiceStatistics,
)
from reactantserver.scheduling import check_weight
from reactantserver.shm import SharedMemoryRegistry, object_exists
from reactantserver.status import CATEGORY_CODES, code_of

SERVER_NAME = "reactantserver"
#: Triton's names for the protocol extensions this server implements.
EXTENSIONS: tuple[str, ...] = (
    "model_configuration",
    "model_repository",
    "statistics",
    "system_shared_memory",
)


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


class PendingInfer:
    """One begun ModelInfer call: what *finish* needs once its answer is settled."""

    __slots__ = ("answer", "call", "handle", "model", "started")

    def __init__(
        self, model: HostedModel, call: InferCall, answer: Answer, handle: object, started: float
    ) -> None:
        self.model = model
        self.call = call
        self.answer = answer
        self.handle = handle
        self.started = started


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
        #: Where the admin HTTP listener is bound, ``(host, port)``, once it listens
        #: (the worker sets it); None: no admin listener. AdminEndpoint answers it.
        self.admin: tuple[str, int] | None = None

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

    def _get(self, name: str, version: str) -> HostedModel:
        """The model serving as ``name``, if it serves ``version`` (model_version.py)."""
        parse_version(version)  # a malformed version is refused before the lookup
        model = self._host.get(name)
        check_version(model.name, model.version, version)
        return model

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
        # "Is it ready?" about an unknown model or version, or one still loading or
        # draining, is answered "no" (as Triton does), not with an error; a version that
        # is not a version at all is refused.
        parse_version(request.version)
        try:
            model = self._host.get(request.name)
        except (NotFound, Unavailable):
            return pb.ModelReadyResponse(ready=False)
        if not serves_version(model.version, request.version):
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
        model = self._get(request.name, request.version)
        return pb.ModelMetadataResponse(
            name=model.name,
            versions=[model.version] if model.version else [],
            platform=model.platform,
            inputs=[tensor_metadata(t) for t in model.inputs],
            outputs=[tensor_metadata(t) for t in model.outputs],
        )

    async def model_config(
        self, request: pb.ModelConfigRequest, ctx: CallContext
    ) -> pb.ModelConfigResponse:
        model = self._get(request.name, request.version)
        config = model_config(
            model, backend=self._host.backend, device_ordinal=self._host.device_ordinal
        )
        return pb.ModelConfigResponse(config=config)

    async def model_statistics(
        self, request: pb.ModelStatisticsRequest, ctx: CallContext
    ) -> pb.ModelStatisticsResponse:
        if request.name:
            models = [self._get(request.name, request.version)]
        elif request.version:
            parse_version(request.version)
            raise InvalidArgument(
                "ModelStatistics: a version was given without a model name; name the model, "
                "or send neither for every model"
            )
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

    def begin_infer(
        self,
        request: InferRequest | pb.ModelInferRequest,
        ctx: CallContext,
        wake: Callable[[], object],
    ) -> PendingInfer:
        """ModelInfer's *begin*, synchronous: the cap, the lookup, readiness, validation,
        and the host's admission. Raises the refusal; otherwise the host settles the
        call's answer later and calls ``wake()`` then (the transport's future). Follow
        with :meth:`finish_infer` once woken, or :meth:`abandon_infer` to give up."""
        if self._cap and self._in_flight >= self._cap:
            self._shed += 1
            raise TooManyRequests(
                f"{self._in_flight} requests are in flight, the limit "
                f"(endpoints.max_concurrent_requests) is {self._cap}; retry later"
            )
        if not request.model_name:
            raise InvalidArgument("ModelInfer: model_name is empty")
        if request.model_version:  # malformed: refused before the lookup, as Triton does
            parse_version(request.model_version)
        model = self._host.get(request.model_name)
        started = trio.current_time()
        try:
            if request.model_version:
                check_version(model.name, model.version, request.model_version)
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
                owner=ctx.owner,
                batch_sizes=model.compiled_batch_sizes if model.max_batch_size else (),
            )
            answer = Answer(wake)
            handle = self._host.begin(
                call.model, call.inputs, call.output_names, call.deadline, answer
            )
        except BaseException as exc:
            self._record_request(model.name, trio.current_time() - started, code_of(exc))
            raise
        self._in_flight += 1
        return PendingInfer(model, call, answer, handle, started)

    def finish_infer(self, pending: PendingInfer) -> InferResponse:
        """ModelInfer's *finish*, synchronous, once the answer is settled: the response
        (or raise the request's error)."""
        self._in_flight -= 1
        code = StatusCode.OK
        model = pending.model
        try:
            results = pending.answer.result()
            return encode_response(
                pending.call, results, model_version=model.version, registry=self.registry
            )
        except BaseException as exc:
            code = code_of(exc)
            raise
        finally:
            self._record_request(model.name, trio.current_time() - pending.started, code)

    def abandon_infer(self, pending: PendingInfer, code: StatusCode = StatusCode.CANCELLED) -> None:
        """The caller gave up (client gone, server closing, its deadline timer fired):
        withdraw the request; ``code`` is what the call ended with, for the statistics."""
        self._in_flight -= 1
        if not pending.answer.settled:
            self._host.withdraw(pending.handle)
        self._record_request(pending.model.name, trio.current_time() - pending.started, code)

    async def model_infer(
        self, request: InferRequest | pb.ModelInferRequest, ctx: CallContext
    ) -> InferResponse:
        """begin -> wait -> finish for a Trio caller (tests; the transport calls the
        three steps itself on the asyncio side)."""
        done = trio.Event()
        pending = self.begin_infer(request, ctx, done.set)
        try:
            await done.wait()
        except BaseException:
            self.abandon_infer(pending)
            raise
        return self.finish_infer(pending)

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
        name = request.model_name
        if not name:
            raise InvalidArgument("RepositoryModelLoad: model_name is empty")
        # Triton's clients look for "failed to load" in a refusal: every one says so.
        try:
            override = _load_override(name, request.parameters)
            await self._host.load(name, override)
        except RequestError as exc:
            raise _failed_to_load(name, exc) from None
        except BundleError as exc:  # its public reason: no file's contents (errors.py)
            raise FailedPrecondition(
                f"failed to load {quoted(name)}: bundle {quoted(exc.bundle)}: {exc.public}"
            ) from None
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
                for r in self.registry.status(request.name, ctx.owner)
            }
        )

    async def system_shared_memory_register(
        self, request: pb.SystemSharedMemoryRegisterRequest, ctx: CallContext
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self.registry.register(
            request.name, request.key, request.offset, request.byte_size, ctx.owner
        )
        return pb.SystemSharedMemoryRegisterResponse()

    async def system_shared_memory_unregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, ctx: CallContext
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.registry.unregister(request.name, ctx.owner)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def is_same_ipc_namespace(
        self, request: pb.IsSameIpcNamespaceRequest, ctx: CallContext
    ) -> pb.IsSameIpcNamespaceResponse:
        return pb.IsSameIpcNamespaceResponse(
            same=object_exists(request.name, prefix=self.registry.prefix)
        )

    # -------------------------------------------------------------- CUDA shared memory
    # As Triton built without GPUs answers (reactantserver.cuda_shm): a client's reset works.

    async def cuda_shared_memory_status(
        self, request: pb.CudaSharedMemoryStatusRequest, ctx: CallContext
    ) -> pb.CudaSharedMemoryStatusResponse:
        return cuda_status(request.name)

    async def cuda_shared_memory_register(
        self, request: pb.CudaSharedMemoryRegisterRequest, ctx: CallContext
    ) -> NoReturn:
        cuda_register(request.name)

    async def cuda_shared_memory_unregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, ctx: CallContext
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        return cuda_unregister(request.name)

    # -------------------------------------------------------------- not served

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
            models=[model_status(m) for m in sorted(status.models, key=lambda m: m.name)],
            weight_cache_max_bytes=status.weight_cache_max_bytes,
        )

    async def set_model_residency(
        self, request: cpb.SetModelResidencyRequest, ctx: CallContext
    ) -> cpb.SetModelResidencyResponse:
        target = RESIDENCY_FROM_PROTO.get(int(request.target))
        if target is None:
            raise InvalidArgument(
                f"model {quoted(request.name)}: target must be UNPINNED, PINNED_SYSTEM or "
                f"PINNED_DEVICE, got {enum_name(cpb.Residency, request.target)}"
            )
        after = await self._host.set_residency(request.name, target)
        return cpb.SetModelResidencyResponse(residency=RESIDENCY_TO_PROTO[after])

    async def set_model_policy(
        self, request: cpb.SetModelPolicyRequest, ctx: CallContext
    ) -> cpb.SetModelPolicyResponse:
        # Validate the name even when nothing changes, so a typo is reported.
        self._host.get(request.name)
        if request.has_weight:
            weight = check_weight(request.name, request.weight)
            await self._host.set_policy(request.name, weight)
        return cpb.SetModelPolicyResponse()

    async def admin_endpoint(
        self, request: cpb.AdminEndpointRequest, ctx: CallContext
    ) -> cpb.AdminEndpointResponse:
        if self.admin is None:
            return cpb.AdminEndpointResponse()
        host, port = self.admin
        return cpb.AdminEndpointResponse(host=host, port=port)

    async def compact_memory(
        self, request: cpb.CompactMemoryRequest, ctx: CallContext
    ) -> cpb.CompactMemoryResponse:
        result = await self._host.compact(list(request.reload_models))
        return cpb.CompactMemoryResponse(
            reloaded_models=result.reloaded_models,
            resident_bytes_after=result.resident_bytes_after,
        )


def _load_override(
    name: str, parameters: Mapping[str, pb.ModelRepositoryParameter]
) -> Override | None:
    """RepositoryModelLoad's parameters: ``config`` (a JSON ModelConfig, the part a bundle
    can honour: ``reactantserver.load_config``); ``file:`` ones (Triton's model upload)
    and any other are refused, naming them."""
    uploads = sorted(k for k in parameters if k.startswith("file:"))
    if uploads:
        shown = uploads[0] if len(uploads[0]) <= 64 else uploads[0][:64] + "..."
        raise InvalidArgument(
            f"load parameter {shown!r}: model files cannot be uploaded (Triton's file: "
            "parameters, the path of CVE-2023-31036); put the bundle in the model "
            "repository and load it by name"
        )
    others = sorted(k for k in parameters if k != "config")
    if others:
        raise InvalidArgument(
            f"load parameters {', '.join(repr(k[:64]) for k in others[:8])} are not "
            "supported; the one load parameter served is config (a JSON ModelConfig)"
        )
    if "config" not in parameters:
        return None
    param = parameters["config"]
    if betterproto.which_one_of(param, "parameter_choice")[0] != "string_param":
        raise InvalidArgument("load parameter 'config': a string (JSON) is expected")
    return parse_load_config(name, param.string_param)


def _failed_to_load(name: str, exc: RequestError) -> RequestError:
    """``exc`` in its own category, its message saying which load failed."""
    message = f"failed to load {quoted(name)}: {exc}"
    for category, _ in CATEGORY_CODES:
        if isinstance(exc, category) and issubclass(category, RequestError):
            return category(message)
    return InvalidArgument(message)
