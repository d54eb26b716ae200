"""The gateway's RPCs: ModelInfer forwarded as raw bytes, and the rest of the Triton surface.

Theory of operation
-------------------
Every handler runs on the asyncio loop, in the server's call task, and never
crosses into Trio on a request's way (the one exception: a route-table refresh, at most
one a second). Every message arrives and leaves as bytes (:class:`~.calls.RawCodec`); a
handler reads what it needs and forwards the bytes it received.

**ModelInfer** is served without a task (:mod:`reactantserver.transport.unary`): the
connection hands the whole request to :meth:`Proxy.infer`, and :class:`~.forward.Forward`
routes it, sends it to a worker and answers from the worker connection's event handling
(admission cap, peek, routing, failover and deadlines: :mod:`.forward`).

**ModelStreamInfer** is served without a task too (:mod:`reactantserver.transport.streaming`):
the gateway ends the client's stream itself and forwards each of its requests as a unary
ModelInfer of its own (:class:`~.forward.StreamForward`): routed by the router, failed over
and deadlined exactly as a ModelInfer is, answered in the client's stream in request
order. The gateway opens no streams to workers: a worker connection's stream slots, the
router's per-replica counts and the failover rule all keep working per request, and a
stream's requests spread over the model's replicas as separate calls would.

**Per-model RPCs** (ModelReady, ModelMetadata, ModelConfig) go to a replica of the model,
rotating, and fail over on the same conditions (they are reads: nothing to protect).
ModelReady is true when a replica says so; a model no worker serves is "not ready", as
Triton answers.

**Fanned-out RPCs** (:mod:`.fanout`) go to every worker that answered the last probe
round: ModelStatistics (summed), RepositoryIndex (the union, with readiness), the
SystemSharedMemory calls (registration all or nothing: refused anywhere, it is rolled back
where it succeeded and the refusal is answered), IsSameIPCNamespace (true only if true
everywhere), CompactMemory.

**Model control** (RepositoryModelLoad / Unload) goes to the workers it concerns: a load,
its ``config`` too, to every worker whose repository lists the model, an unload to every
worker that has it loaded (:meth:`Proxy.model_control`; refused under lpt_packing, whose
placement is the gateway's).

**Refused**: the worker control RPCs act on one worker, so the gateway answers
FAILED_PRECONDITION naming the workers' addresses; tracing and log settings are
UNIMPLEMENTED, as on a worker. CUDA shared memory is answered by the gateway itself as a
worker answers it (:mod:`reactantserver.cuda_shm`: no regions, unregistering is OK,
registering INVALID_ARGUMENT).

Statuses: a worker's status is passed through with its message (RESOURCE_EXHAUSTED stays
RESOURCE_EXHAUSTED, INTERNAL stays INTERNAL); the gateway's own outcomes are errors of
:mod:`reactantserver.errors`, mapped by ``reactantserver.status``; anything unexpected is
INTERNAL with the fixed message and a traceback in the log. All three happen in one place
per path -- the handler wrapper :meth:`Proxy._serve` for the task path,
:class:`~.forward.Forward` for ModelInfer -- which also counts every call.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial

from grpclib import GRPCError
from grpclib.const import Cardinality, Handler

import reactantserver

from ..config.schema import GatewayConfig
from ..cuda_shm import cuda_register, cuda_status, cuda_unregister
from ..errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
    Unimplemented,
    quoted,
)
from ..grpcwire import StatusCode
from ..model_version import check_version, parse_version, serves_version
from ..protocol import inference as pb
from ..protocol import reactant_control as cpb
from ..protocol.codec import encode_stream_error, stream_response_head
from ..protocol.screen import decode_message
from ..records import REPORTED_VERSION
from ..status import to_status
from ..transport.grpcerror import error_code, grpc_error
from ..transport.server import ServerStream
from ..transport.streaming import StreamCall, StreamedRequest, StreamHandler
from ..transport.unary import DirectHandler, UnaryCall
from .calls import (
    CANCELLED,
    DEADLINE_EXCEEDED,
    OK,
    CallInfo,
    ControlPlane,
    FleetView,
    Method,
    Passthrough,
    Raw,
)
from .channel import ChannelError, Reply
from .core.inflight import fails_over
from .core.policy import not_lpt
from .core.routing import Router, refusal
from .core.stats import GatewayStats
from .core.wire import peek_name
from .fanout import FanOut
from .forward import Forward, StreamForward
from .pool import WorkerClient
from .prober import Registrations

log = logging.getLogger(__name__)

#: Why calls are refused while the gateway drains.
DRAINING = "the gateway is shutting down; retry (another gateway, or later)"

GATEWAY_CONTROL_RPCS = ("GetSchedulingStatus", "SetSchedulingPolicy", "SetModelPlacement", "Repack")

SERVER_NAME = "reactantserver-gateway"
#: Triton extensions the gateway implements (as a worker does).
EXTENSIONS = ("model_configuration", "model_repository", "statistics", "system_shared_memory")


class Proxy:
    """Every RPC of the gateway (see the module docstring)."""

    def __init__(
        self,
        config: GatewayConfig,
        clients: Sequence[WorkerClient],
        router: Router,
        fleet: FleetView,
        *,
        refresh: Callable[[float], Awaitable[None]],
        refresh_soon: Callable[[], None],
        stats: GatewayStats,
        registrations: Registrations,
        control: ControlPlane | None = None,
    ) -> None:
        self.config = config
        self.clients: Mapping[str, WorkerClient] = {c.address: c for c in clients}
        self.router = router
        self.fleet = fleet
        self.stats = stats
        self.registrations = registrations
        self.control = control
        #: Refresh the route table now (single-flight) / soon (from a callback).
        self.refresh = refresh
        self.refresh_soon = refresh_soon
        #: The gateway's calls in flight and the ModelInfer cap (:mod:`.core.inflight`).
        self.admission = stats.admission
        per_worker = config.grpc.max_concurrent_requests_per_worker
        self.admission.cap = per_worker * len(config.endpoints)
        #: A call's deadline when its client set none.
        self.timeout = config.worker_client.request_timeout_seconds
        self.loop = asyncio.get_running_loop()
        #: ModelInfer calls waiting in a task (a refresh, a stream slot, a connection).
        self.tasks: set[asyncio.Task[None]] = set()
        self._rotation = itertools.count()
        self.fanout = FanOut(
            fleet, stats, registrations, not_served=self.not_served, serves=self._serves
        )
        #: Refusing new calls (:meth:`drain`): read per call, so a plain attribute.
        self.draining = False
        self._idle = asyncio.Event()
        #: The clients' open ModelStreamInfer calls (to drain them).
        self.streams: set[StreamCall] = set()
        #: Where the gateway's admin HTTP listener is bound, ``(host, port)``, once it
        #: listens (``serve_gateway`` sets it); None: none. AdminEndpoint answers it.
        self.admin: tuple[str, int] | None = None

    # ------------------------------------------------------------------ the table

    def mapping(self) -> dict[str, Handler | DirectHandler | StreamHandler]:
        """Handlers for the three services the proxy serves (ModelInfer's is direct)."""
        rpcs: dict[str, dict[str, Method | None]] = {
            "inference.GRPCInferenceService": {
                "ServerLive": self.server_live,
                "ServerReady": self.server_ready,
                "ModelReady": self.model_ready,
                "ServerMetadata": self.server_metadata,
                "ModelMetadata": partial(self.per_model, "ModelMetadata"),
                "ModelInfer": None,  # direct: below
                "ModelStreamInfer": None,  # direct: a stream of ModelInfers, below
                "ModelConfig": partial(self.per_model, "ModelConfig"),
                "ModelStatistics": self.fanout.model_statistics,
                "RepositoryIndex": self.fanout.repository_index,
                "RepositoryModelLoad": partial(self.model_control, "RepositoryModelLoad"),
                "RepositoryModelUnload": partial(self.model_control, "RepositoryModelUnload"),
                "SystemSharedMemoryStatus": self.fanout.shm_status,
                "SystemSharedMemoryRegister": self.fanout.shm_register,
                "SystemSharedMemoryUnregister": self.fanout.shm_unregister,
                "CudaSharedMemoryStatus": self.cuda_shm_status,
                "CudaSharedMemoryRegister": self.cuda_shm_register,
                "CudaSharedMemoryUnregister": self.cuda_shm_unregister,
                "TraceSetting": partial(self.unimplemented, "TraceSetting"),
                "LogSettings": partial(self.unimplemented, "LogSettings"),
                "IsSameIPCNamespace": self.fanout.is_same_ipc_namespace,
            },
            "reactant_control.ControlService": {
                "ModelControlStatus": partial(self.per_worker, "ModelControlStatus"),
                "SetModelResidency": partial(self.per_worker, "SetModelResidency"),
                "SetModelPolicy": partial(self.per_worker, "SetModelPolicy"),
                "CompactMemory": self.fanout.compact_memory,
                "AdminEndpoint": self.admin_endpoint,
            },
            "reactant_control.GatewayControlService": {
                name: partial(self.gateway_control, name) for name in GATEWAY_CONTROL_RPCS
            },
        }
        table: dict[str, Handler | DirectHandler | StreamHandler] = {}
        for base in (
            pb.GrpcInferenceServiceBase(),
            cpb.ControlServiceBase(),
            cpb.GatewayControlServiceBase(),
        ):
            for path, generated in base.__mapping__().items():
                service, rpc = path.strip("/").split("/")
                method = rpcs[service][rpc]  # a generated RPC without a handler: KeyError now
                if method is None:
                    continue  # served without a task: below
                assert generated.cardinality is Cardinality.UNARY_UNARY, path
                table[path] = Handler(
                    partial(self._serve, rpc, method), generated.cardinality, Raw, Raw
                )
        table["/inference.GRPCInferenceService/ModelInfer"] = DirectHandler(self.infer)
        table["/inference.GRPCInferenceService/ModelStreamInfer"] = StreamHandler(
            self.stream_infer,
            stream_response_head,
            _stream_error,
            opened=self._stream_opened,
        )
        return table

    # ------------------------------------------------------------------ drain

    def drain(self) -> None:
        """Refuse new calls from now on (UNAVAILABLE); calls in flight continue."""
        self.draining = True
        for stream in list(self.streams):
            stream.drain(StatusCode.UNAVAILABLE, DRAINING)
        self.call_ended()

    def call_ended(self) -> None:
        """A call was answered: the last one of a drain sets the gateway idle."""
        if self.draining and self.admission.calls == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def region_owner(self, owner: str) -> str:
        """Who a forwarded ModelInfer is made for, as the worker is told: its client, when
        that client has regions registered through the gateway; else nobody ("": the
        gateway's own namespace, which holds no region), so that the header block of a
        call that cannot name a region stays the same for every client (the worker's
        decoder and its admission then recognise it, not judge it again per call)."""
        return owner if self.registrations.owns(owner) else ""

    def connection_closed(self, owner: str) -> None:
        """A client connection closed (:class:`~reactantserver.transport.server.GuardedServer`
        ``on_closed``): the shared-memory regions that were that connection's go from the
        workers too (:meth:`.fanout.FanOut.forget`), in a task the proxy keeps."""
        if not self.registrations.owns(owner):
            return
        task = self.loop.create_task(self.fanout.forget(owner))
        self.tasks.add(task)
        task.add_done_callback(self._forgotten)

    def _forgotten(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("removing a closed connection's shared memory failed: %s", task.exception())

    # ------------------------------------------------------------------ one call

    async def _serve(self, rpc: str, method: Method, stream: ServerStream) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        remaining = stream.deadline.time_remaining() if stream.deadline is not None else None
        call = CallInfo(
            rpc,
            started + (remaining if remaining is not None else self.timeout),
            tell=remaining is not None,
            owner=stream.owner,
        )
        code = OK
        stats = self.stats
        self.admission.enter()
        try:
            if self.draining:
                raise Unavailable("the gateway is shutting down; retry (another gateway, or later)")
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded(f"{rpc}: the deadline had passed when the call arrived")
            data = await stream.recv_message()
            assert data is not None  # a unary request always carries its message
            await stream.send_message(await method(data, call))
        except Passthrough as exc:
            code = exc.code
            raise grpc_error(exc.code, exc.message) from None
        except GRPCError as exc:
            code = error_code(exc)
            raise
        except asyncio.CancelledError:
            # The server cancels a call whose deadline passed (and answers it
            # DEADLINE_EXCEEDED itself), or whose client went away.
            code = DEADLINE_EXCEEDED if loop.time() >= call.deadline else CANCELLED
            raise
        except Exception as exc:
            # The gateway's own outcomes (the error tree) as their status and message;
            # anything else INTERNAL, its traceback logged: our bug.
            status = to_status(exc, rpc=rpc)
            code = status.code
            raise grpc_error(status.code, status.message) from None
        finally:
            self.admission.leave(False)
            stats.finish(rpc, call.model, code, loop.time() - started)
            self.call_ended()

    # ------------------------------------------------------------------ ModelInfer

    def infer(self, call: UnaryCall, data: bytes | memoryview) -> None:
        """ModelInfer, served without a task (see :mod:`.forward`)."""
        Forward(self, call, data, call.received_at).begin()

    def stream_infer(self, request: StreamedRequest, data: bytes | memoryview) -> None:
        """One request of a client's ModelStreamInfer: forwarded as a ModelInfer of its
        own, answered in the stream (:class:`~.forward.StreamForward`)."""
        StreamForward(self, request, data, request.received_at).begin()

    def _stream_opened(self, stream: StreamCall) -> None:
        self.streams.add(stream)
        stream.on_close = partial(self.streams.discard, stream)
        if self.draining:
            stream.drain(StatusCode.UNAVAILABLE, DRAINING)

    def lost_message(self, client: WorkerClient, exc: ChannelError, request_id: str) -> str:
        what = f"request {quoted(request_id)}" if request_id else "the request"
        if exc.unprocessed:
            return f"no worker could take {what}; the last, {client.label}, failed: {exc}"
        return (
            f"worker {client.label} failed while {what} was in flight ({exc}); it may have "
            "run, so the gateway did not retry it elsewhere"
        )

    def _serves(self, model: str) -> bool:
        return self.router.table.serves(model)

    def not_served(self, model: str) -> NotFound | Unavailable:
        """Why no ready worker serves ``model``: UNAVAILABLE for a model a worker lists or
        the gateway knows while its workers are away, NOT_FOUND for a name never seen
        (the rule: :func:`.core.routing.refusal`)."""
        return refusal(self.router.table, model, len(self.clients))

    # ------------------------------------------------------------------ gateway-local

    async def server_live(self, data: bytes, call: CallInfo) -> bytes:
        return bytes(pb.ServerLiveResponse(live=True))

    async def server_ready(self, data: bytes, call: CallInfo) -> bytes:
        ready, _ = self.fleet.ready()
        return bytes(pb.ServerReadyResponse(ready=ready and not self.draining))

    async def server_metadata(self, data: bytes, call: CallInfo) -> bytes:
        return bytes(
            pb.ServerMetadataResponse(
                name=SERVER_NAME, version=reactantserver.__version__, extensions=list(EXTENSIONS)
            )
        )

    async def admin_endpoint(self, data: bytes, call: CallInfo) -> bytes:
        host, port = self.admin if self.admin is not None else ("", 0)
        return bytes(cpb.AdminEndpointResponse(host=host, port=port))

    # ------------------------------------------------------------------ per model

    def _candidates(self, model: str) -> list[WorkerClient]:
        """Ready replicas of ``model`` in rotation, then workers listing it but not ready."""
        table = self.router.table
        ready = [self.clients[r.worker] for r in table.replicas(model)]
        if ready:
            start = next(self._rotation) % len(ready)
            return ready[start:] + ready[:start]
        return [
            self.clients[w.address]
            for w in table.workers.values()
            if model in w.models and w.address in self.clients
        ]

    async def _to_replicas(
        self, path: bytes, data: bytes, call: CallInfo, model: str
    ) -> tuple[Reply | None, list[WorkerClient]]:
        """Ask the model's replicas in turn; the first answer that is not a failover, or the
        last failover answer (None if no replica answered), and who was asked."""
        candidates = self._candidates(model)
        if not candidates:
            await self.refresh(call.deadline)
            candidates = self._candidates(model)
        last: Reply | None = None
        loop = asyncio.get_running_loop()
        for client in candidates:
            started = loop.time()
            try:
                reply = await client.call(path, data, call.deadline, tell=call.tell)
            except ChannelError:
                self.refresh_soon()
                continue
            self.stats.worker_call(call.rpc, client.name, loop.time() - started)
            if not fails_over(reply.status):
                return reply, candidates
            last = reply
        return last, candidates

    async def model_ready(self, data: bytes, call: CallInfo) -> bytes:
        model = peek_name(data, what="ModelReadyRequest")
        # Every worker serves REPORTED_VERSION: another version is not ready anywhere.
        if not serves_version(REPORTED_VERSION, peek_name(data, 2, "ModelReadyRequest")):
            return bytes(pb.ModelReadyResponse(ready=False))
        candidates = self._candidates(model)
        if not candidates:
            await self.refresh(call.deadline)
            candidates = self._candidates(model)
        if candidates and self.router.table.serves(model):
            call.model = model
        path = b"/inference.GRPCInferenceService/ModelReady"
        for client in candidates:
            try:
                reply = await client.call(path, data, call.deadline, tell=call.tell)
            except ChannelError:
                continue
            if reply.status == OK and pb.ModelReadyResponse().parse(bytes(reply.payload)).ready:
                return bytes(reply.payload)
        return bytes(pb.ModelReadyResponse(ready=False))

    async def per_model(self, rpc: str, data: bytes, call: CallInfo) -> bytes | memoryview:
        """ModelMetadata and ModelConfig: the answer of one replica."""
        model = peek_name(data, what=f"{rpc}Request")
        if not model:
            raise InvalidArgument(f"{rpc}: name is empty")
        version = peek_name(data, 2, f"{rpc}Request")
        if version:
            parse_version(version)  # malformed: refused before the lookup
            if self.router.table.serves(model):
                # Every worker serves REPORTED_VERSION, and a worker's NOT_FOUND for another
                # would read as "not served here" and fail over to every replica in turn.
                check_version(model, REPORTED_VERSION, version)
        path = f"/inference.GRPCInferenceService/{rpc}".encode()
        reply, candidates = await self._to_replicas(path, data, call, model)
        if candidates and self.router.table.serves(model):
            call.model = model
        if reply is None:
            if not candidates:
                raise self.not_served(model)
            raise Unavailable(f"{rpc}: no worker serving {quoted(model)} answered")
        if reply.status != OK:
            raise Passthrough(reply.status, reply.message)
        return reply.payload

    # ------------------------------------------------------------------ model control

    async def model_control(self, rpc: str, data: bytes, call: CallInfo) -> bytes:
        """RepositoryModelLoad / Unload, on the workers it concerns: a load (its
        ``config`` too) on every worker whose repository lists the model, an unload on
        every worker that has it loaded. Under lpt_packing placement is the gateway's
        own (SetModelPlacement), so both are refused there."""
        name = peek_name(data, 2, f"{rpc}Request")  # (1 is repository_name)
        verb = "load" if rpc == "RepositoryModelLoad" else "unload"
        if not name:
            raise InvalidArgument(f"{rpc}: model_name is empty")
        mode = self.config.scheduling.mode
        if mode == "lpt_packing":
            raise FailedPrecondition(
                f"failed to {verb} {name!r}: under scheduling.mode lpt_packing the gateway "
                "places models itself; use GatewayControlService.SetModelPlacement"
            )
        targets = self._holders(name, loaded=verb == "unload")
        if not targets:
            await self.refresh(call.deadline)
            targets = self._holders(name, loaded=verb == "unload")
        if not targets:
            where = "has it loaded" if verb == "unload" else "lists it in its repository"
            raise NotFound(
                f"failed to {verb} {name!r}: no worker behind this gateway {where} "
                f"({len(self.clients)} workers)"
            )
        try:
            return await self.fanout.model_control(rpc, name, data, call, targets)
        finally:
            self.refresh_soon()  # the route table learns what changed

    def _holders(self, name: str, *, loaded: bool) -> set[str]:
        workers = self.router.table.workers.values()
        return {w.address for w in workers if name in (w.loaded if loaded else w.models)}

    # ------------------------------------------------------------------ refused

    async def per_worker(self, rpc: str, data: bytes, call: CallInfo) -> bytes:
        workers = ", ".join(c.label for c in self.clients.values())
        raise FailedPrecondition(
            f"{rpc} acts on one worker and the gateway fronts {len(self.clients)}: call it on "
            f"the worker itself ({workers})"
        )

    # CUDA shared memory: answered here as every worker would (reactantserver.cuda_shm).

    async def cuda_shm_status(self, data: bytes, call: CallInfo) -> bytes:
        request = decode_message(data, pb.CudaSharedMemoryStatusRequest)
        return bytes(cuda_status(request.name))

    async def cuda_shm_register(self, data: bytes, call: CallInfo) -> bytes:
        cuda_register(decode_message(data, pb.CudaSharedMemoryRegisterRequest).name)

    async def cuda_shm_unregister(self, data: bytes, call: CallInfo) -> bytes:
        name = decode_message(data, pb.CudaSharedMemoryUnregisterRequest).name
        return bytes(cuda_unregister(name))

    async def unimplemented(self, rpc: str, data: bytes, call: CallInfo) -> bytes:
        raise Unimplemented(f"{rpc} is not supported by the gateway")

    async def gateway_control(self, rpc: str, data: bytes, call: CallInfo) -> bytes:
        mode = self.config.scheduling.mode
        if mode != "lpt_packing":
            raise not_lpt(mode)
        if self.control is None:
            raise Unimplemented(f"{rpc}: this proxy was built without lpt_packing's control plane")
        return await self.control.call(rpc, data, call.deadline)


def _stream_error(request: bytes | memoryview, code: int, message: str) -> list[bytes | memoryview]:
    return encode_stream_error(request, message)
