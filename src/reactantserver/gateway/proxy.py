"""The gateway's RPCs: ModelInfer forwarded as raw bytes, and the rest of the Triton surface.

Theory of operation
-------------------
Every handler runs on the asyncio loop, in the grpclib server's call task, and never
crosses into Trio on a request's way (the one exception: a route-table refresh, at most
one a second). Every message arrives and leaves as bytes (:class:`RawCodec`); a handler
reads what it needs and forwards the bytes it received.

**ModelInfer** (:meth:`Proxy.model_infer`): admission cap; :func:`~.wire.peek_infer`
(model name, id, input shapes); the route table's replicas of the model (none: one
single-flight refresh, then NOT_FOUND); the batch extent of the batch input gives the item
count; ``router.choose`` gives a ticket; the bytes go to the ticket's worker with the
remaining deadline. The worker's answer is passed back as received -- OK with the response
bytes untouched, any other status with its message. Failover to the ticket's next replica
happens only when the worker cannot have executed the request: it answered NOT_FOUND (it
does not serve the model; the table is refreshed too) or UNAVAILABLE (draining, model not
ready), or the call failed before it was completely sent (no connection, refused stream,
GOAWAY). A connection lost after the request was sent answers UNAVAILABLE and is not
retried. ``router.release`` runs exactly once per ticket, in a ``finally``.

**Per-model RPCs** (ModelReady, ModelMetadata, ModelConfig) go to a replica of the model,
rotating, and fail over on the same conditions (they are reads: nothing to protect).
ModelReady is true when a replica says so; a model no worker serves is "not ready", as
Triton answers.

**Fanned-out RPCs** go to every worker that answered the last probe round:
ModelStatistics (summed), RepositoryIndex (the union, with readiness), the
SystemSharedMemory calls (registration all or nothing: refused anywhere, it is rolled back
where it succeeded and the refusal is answered), IsSameIPCNamespace (true only if true
everywhere), CompactMemory. See :mod:`.merge`.

**Refused**: RepositoryModelLoad/Unload and the worker control RPCs act on one worker, so
the gateway answers FAILED_PRECONDITION naming the workers' addresses; CUDA shared memory,
tracing, log settings and streaming inference are UNIMPLEMENTED, as on a worker.

Statuses: a worker's status is passed through with its message (RESOURCE_EXHAUSTED stays
RESOURCE_EXHAUSTED, INTERNAL stays INTERNAL); the gateway's own outcomes are errors of
:mod:`reactantserver.errors`, mapped by ``reactantserver.status``; anything unexpected is
INTERNAL with the fixed message and a traceback in the log.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Protocol

import grpclib.server
from grpclib import GRPCError
from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.base import CodecBase

import reactantserver

from ..config.schema import GatewayConfig
from ..errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RequestError,
    ResourceExhausted,
    Unavailable,
    Unimplemented,
)
from ..protocol import inference as pb
from ..protocol import reactant_control as cpb
from ..status import to_status
from . import merge
from .channel import ChannelError, Reply
from .policy import not_lpt
from .pool import WorkerClient
from .prober import Registrations
from .routing import Outcome, Router
from .stats import GatewayStats
from .table import items_of
from .wire import peek_infer, peek_name

log = logging.getLogger(__name__)

OK, CANCELLED, DEADLINE_EXCEEDED, NOT_FOUND, UNAVAILABLE = 0, 1, 4, 5, 14
_INTERNAL = 13
#: Worker statuses after which the request cannot have run: fail over.
FAILOVER_STATUSES = frozenset({NOT_FOUND, UNAVAILABLE})
INFER_PATH = b"/inference.GRPCInferenceService/ModelInfer"
#: Fanned-out rollbacks get at least this long, even when the client's deadline is spent.
ROLLBACK_SECONDS = 5.0

GATEWAY_CONTROL_RPCS = ("GetSchedulingStatus", "SetSchedulingPolicy", "SetModelPlacement", "Repack")

SERVER_NAME = "reactantserver-gateway"
#: Triton extensions the gateway implements (as a worker does).
EXTENSIONS = ("model_configuration", "model_repository", "statistics", "system_shared_memory")


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
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"response message of {len(data)} bytes exceeds the gateway's limit of "
                f"{self._max_send} bytes (grpc.max_send_msg_bytes)",
            )
        return data  # type: ignore[return-value]  # grpclib only concatenates it

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self._max_recv:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"request message of {len(data)} bytes exceeds the gateway's limit of "
                f"{self._max_recv} bytes (grpc.max_recv_msg_bytes); use shared memory for "
                "tensors this large",
            )
        if message_type is Raw or message_type is None:
            return data
        return message_type().parse(data)


class Passthrough(Exception):
    """A worker's status, answered to the client as the worker sent it."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ControlPlane(Protocol):
    """The seam for ``reactant_control.GatewayControlService`` under lpt_packing."""

    async def call(self, rpc: str, request: bytes, deadline: float) -> bytes: ...


class FleetView(Protocol):
    """What the proxy asks the prober: who answers, who is ready."""

    def answering(self) -> tuple[WorkerClient, ...]: ...

    def ready(self) -> tuple[bool, str]: ...


class _Call:
    """What a handler knows about the call it serves."""

    __slots__ = ("deadline", "model", "rpc")

    def __init__(self, rpc: str, deadline: float) -> None:
        self.rpc = rpc
        self.deadline = deadline
        #: The model label of the call's statistics ("" = none or unknown).
        self.model = ""


_Method = Callable[[bytes, _Call], Awaitable[bytes | memoryview]]


def _status(code: int) -> Status:
    try:
        return Status(code)
    except ValueError:
        return Status.UNKNOWN


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
        self._refresh = refresh
        self._refresh_soon = refresh_soon
        per_worker = config.grpc.max_concurrent_requests_per_worker
        self.cap = per_worker * len(config.endpoints)
        stats.max_concurrent = self.cap
        self._timeout = config.worker_client.request_timeout_seconds
        self._rotation = itertools.count()
        self._draining = False
        self._idle = asyncio.Event()

    # ------------------------------------------------------------------ the table

    def mapping(self) -> dict[str, Handler]:
        """grpclib handlers for the three services the proxy serves."""
        rpcs: dict[str, dict[str, _Method | None]] = {
            "inference.GRPCInferenceService": {
                "ServerLive": self.server_live,
                "ServerReady": self.server_ready,
                "ModelReady": self.model_ready,
                "ServerMetadata": self.server_metadata,
                "ModelMetadata": partial(self.per_model, "ModelMetadata"),
                "ModelInfer": self.model_infer,
                "ModelStreamInfer": None,
                "ModelConfig": partial(self.per_model, "ModelConfig"),
                "ModelStatistics": self.model_statistics,
                "RepositoryIndex": self.repository_index,
                "RepositoryModelLoad": partial(self.per_worker, "RepositoryModelLoad"),
                "RepositoryModelUnload": partial(self.per_worker, "RepositoryModelUnload"),
                "SystemSharedMemoryStatus": self.shm_status,
                "SystemSharedMemoryRegister": self.shm_register,
                "SystemSharedMemoryUnregister": self.shm_unregister,
                "CudaSharedMemoryStatus": self.no_cuda_shm,
                "CudaSharedMemoryRegister": self.no_cuda_shm,
                "CudaSharedMemoryUnregister": self.no_cuda_shm,
                "TraceSetting": partial(self.unimplemented, "TraceSetting"),
                "LogSettings": partial(self.unimplemented, "LogSettings"),
                "IsSameIPCNamespace": self.is_same_ipc_namespace,
            },
            "reactant_control.ControlService": {
                "ModelControlStatus": partial(self.per_worker, "ModelControlStatus"),
                "SetModelResidency": partial(self.per_worker, "SetModelResidency"),
                "SetModelPolicy": partial(self.per_worker, "SetModelPolicy"),
                "CompactMemory": self.compact_memory,
            },
            "reactant_control.GatewayControlService": {
                name: partial(self.gateway_control, name) for name in GATEWAY_CONTROL_RPCS
            },
        }
        table: dict[str, Handler] = {}
        for base in (
            pb.GrpcInferenceServiceBase(),
            cpb.ControlServiceBase(),
            cpb.GatewayControlServiceBase(),
        ):
            for path, generated in base.__mapping__().items():
                service, rpc = path.strip("/").split("/")
                method = rpcs[service][rpc]  # a generated RPC without a handler: KeyError now
                if method is None or generated.cardinality is not Cardinality.UNARY_UNARY:
                    handler = partial(self._refuse_stream, rpc)
                else:
                    handler = partial(self._serve, rpc, method)
                table[path] = Handler(handler, generated.cardinality, Raw, Raw)
        return table

    # ------------------------------------------------------------------ drain

    @property
    def draining(self) -> bool:
        return self._draining

    def drain(self) -> None:
        """Refuse new calls from now on (UNAVAILABLE); calls in flight continue."""
        self._draining = True
        if self.stats.in_flight == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    # ------------------------------------------------------------------ one call

    async def _serve(
        self, rpc: str, method: _Method, stream: grpclib.server.Stream[Any, Any]
    ) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        remaining = stream.deadline.time_remaining() if stream.deadline is not None else None
        call = _Call(rpc, started + (remaining if remaining is not None else self._timeout))
        code = OK
        stats = self.stats
        stats.in_flight += 1
        try:
            if self._draining:
                raise Unavailable("the gateway is shutting down; retry (another gateway, or later)")
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded(f"{rpc}: the deadline had passed when the call arrived")
            if rpc == "ModelInfer":
                await self._admit_infer(stream, call)
            else:
                data = await stream.recv_message()
                assert data is not None  # a unary request always carries its message
                await stream.send_message(await method(data, call))
        except Passthrough as exc:
            code = exc.code
            raise GRPCError(_status(exc.code), exc.message) from None
        except GRPCError as exc:
            code = exc.status.value
            raise
        except RequestError as exc:
            status = to_status(exc, rpc=rpc)
            code = status.code.value
            raise GRPCError(Status(status.code.value), status.message) from None
        except asyncio.CancelledError:
            # The server cancels a call whose deadline passed (and answers it
            # DEADLINE_EXCEEDED itself), or whose client went away.
            code = DEADLINE_EXCEEDED if loop.time() >= call.deadline else CANCELLED
            raise
        except Exception as exc:
            status = to_status(exc, rpc=rpc)  # logs the traceback: our bug
            code = status.code.value
            raise GRPCError(Status(status.code.value), status.message) from None
        finally:
            stats.in_flight -= 1
            stats.finish(rpc, call.model, code, loop.time() - started)
            if self._draining and stats.in_flight == 0:
                self._idle.set()

    async def _refuse_stream(self, rpc: str, stream: grpclib.server.Stream[Any, Any]) -> None:
        self.stats.finish(rpc, "", 12, 0.0)
        raise GRPCError(
            Status.UNIMPLEMENTED,
            f"{rpc} is not supported: reactantserver answers each request once; call "
            "ModelInfer per request",
        )

    # ------------------------------------------------------------------ ModelInfer

    async def _admit_infer(self, stream: grpclib.server.Stream[Any, Any], call: _Call) -> None:
        stats = self.stats
        if self.cap and stats.infer_in_flight >= self.cap:
            stats.shed += 1
            raise ResourceExhausted(
                f"{stats.infer_in_flight} ModelInfer calls are in flight at the gateway; the "
                f"limit is {self.cap} (grpc.max_concurrent_requests_per_worker x "
                f"{len(self.clients)} workers); retry later"
            )
        stats.infer_in_flight += 1
        try:
            data = await stream.recv_message()
            assert data is not None
            await stream.send_message(await self.model_infer(data, call))
        finally:
            stats.infer_in_flight -= 1

    async def model_infer(self, data: bytes, call: _Call) -> bytes | memoryview:
        """Forward one ModelInfer (see the module docstring)."""
        peek = peek_infer(data)
        model = peek.model
        if not model:
            raise InvalidArgument("ModelInfer: model_name is empty")
        router = self.router
        replicas = router.table.replicas(model)
        if not replicas:
            await self._refresh(call.deadline)
            replicas = router.table.replicas(model)
            if not replicas:
                raise self._not_served(model)
        call.model = model
        first = replicas[0]
        items = items_of(first, peek.shape_of(first.batch_input_name))
        loop = asyncio.get_running_loop()
        ticket = router.choose(model, items, loop.time())
        outcome: Outcome = "error"
        try:
            while True:
                worker = ticket.worker
                assert worker is not None
                client = self.clients[worker]
                sent_at = loop.time()
                try:
                    reply = await client.call(INFER_PATH, data, call.deadline)
                except ChannelError as exc:
                    self._refresh_soon()
                    if exc.unprocessed and router.failover(ticket) is not None:
                        continue
                    raise Unavailable(self._lost_message(client, exc, peek.id)) from None
                self.stats.worker_call("ModelInfer", client.name, loop.time() - sent_at)
                if reply.status == OK:
                    outcome = "ok"
                    return reply.payload
                if reply.status in FAILOVER_STATUSES:
                    if reply.status == NOT_FOUND:
                        self._refresh_soon()
                    if router.failover(ticket) is not None:
                        continue
                if reply.status == DEADLINE_EXCEEDED:
                    outcome = "deadline"
                raise Passthrough(reply.status, reply.message)
        except asyncio.CancelledError:
            outcome = "deadline" if loop.time() >= call.deadline else "cancelled"
            raise
        except DeadlineExceeded:
            outcome = "deadline"
            raise
        finally:
            router.release(ticket, outcome)

    def _lost_message(self, client: WorkerClient, exc: ChannelError, request_id: str) -> str:
        what = f"request {request_id!r}" if request_id else "the request"
        if exc.unprocessed:
            return f"no worker could take {what}; the last, {client.label}, failed: {exc}"
        return (
            f"worker {client.label} failed while {what} was in flight ({exc}); it may have "
            "run, so the gateway did not retry it elsewhere"
        )

    def _not_served(self, model: str) -> NotFound | Unavailable:
        """NOT_FOUND for a model no worker lists; UNAVAILABLE for one listed but not ready
        anywhere (what one worker answers for a model it is still loading)."""
        table = self.router.table
        listing = [
            c.name
            for c in self.clients.values()
            if c.address in table.workers and model in table.workers[c.address].models
        ]
        if listing:
            return Unavailable(
                f"model {model!r} is not ready on any worker (listed by {', '.join(listing)}); "
                "retry when it has loaded"
            )
        return NotFound(
            f"model {model!r} is not served by any ready worker behind this gateway "
            f"({len(table.ready_workers)} of {len(self.clients)} workers ready)"
        )

    # ------------------------------------------------------------------ gateway-local

    async def server_live(self, data: bytes, call: _Call) -> bytes:
        return bytes(pb.ServerLiveResponse(live=True))

    async def server_ready(self, data: bytes, call: _Call) -> bytes:
        ready, _ = self.fleet.ready()
        return bytes(pb.ServerReadyResponse(ready=ready and not self._draining))

    async def server_metadata(self, data: bytes, call: _Call) -> bytes:
        return bytes(
            pb.ServerMetadataResponse(
                name=SERVER_NAME, version=reactantserver.__version__, extensions=list(EXTENSIONS)
            )
        )

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
        self, path: bytes, data: bytes, call: _Call, model: str
    ) -> tuple[Reply | None, list[WorkerClient]]:
        """Ask the model's replicas in turn; the first answer that is not a failover, or the
        last failover answer (None if no replica answered), and who was asked."""
        candidates = self._candidates(model)
        if not candidates:
            await self._refresh(call.deadline)
            candidates = self._candidates(model)
        last: Reply | None = None
        loop = asyncio.get_running_loop()
        for client in candidates:
            started = loop.time()
            try:
                reply = await client.call(path, data, call.deadline)
            except ChannelError:
                self._refresh_soon()
                continue
            self.stats.worker_call(call.rpc, client.name, loop.time() - started)
            if reply.status not in FAILOVER_STATUSES:
                return reply, candidates
            last = reply
        return last, candidates

    async def model_ready(self, data: bytes, call: _Call) -> bytes:
        model = peek_name(data, what="ModelReadyRequest")
        candidates = self._candidates(model)
        if not candidates:
            await self._refresh(call.deadline)
            candidates = self._candidates(model)
        if candidates and self.router.table.serves(model):
            call.model = model
        path = b"/inference.GRPCInferenceService/ModelReady"
        for client in candidates:
            try:
                reply = await client.call(path, data, call.deadline)
            except ChannelError:
                continue
            if reply.status == OK and pb.ModelReadyResponse().parse(bytes(reply.payload)).ready:
                return bytes(reply.payload)
        return bytes(pb.ModelReadyResponse(ready=False))

    async def per_model(self, rpc: str, data: bytes, call: _Call) -> bytes | memoryview:
        """ModelMetadata and ModelConfig: the answer of one replica."""
        model = peek_name(data, what=f"{rpc}Request")
        if not model:
            raise InvalidArgument(f"{rpc}: name is empty")
        path = f"/inference.GRPCInferenceService/{rpc}".encode()
        reply, candidates = await self._to_replicas(path, data, call, model)
        if candidates and self.router.table.serves(model):
            call.model = model
        if reply is None:
            if not candidates:
                raise self._not_served(model)
            raise Unavailable(f"{rpc}: no worker serving {model!r} answered")
        if reply.status != OK:
            raise Passthrough(reply.status, reply.message)
        return reply.payload

    # ------------------------------------------------------------------ fanned out

    async def _fan_out(
        self, path: bytes, data: bytes, call: _Call, deadline: float | None = None
    ) -> list[tuple[WorkerClient, Reply | Exception]]:
        """``data`` to every worker that answered the last probe round, at once."""
        clients = self.fleet.answering()
        if not clients:
            _, reason = self.fleet.ready()
            raise Unavailable(f"{call.rpc}: no worker answers the gateway ({reason})")
        loop = asyncio.get_running_loop()
        until = call.deadline if deadline is None else deadline

        async def one(client: WorkerClient) -> tuple[WorkerClient, Reply | Exception]:
            started = loop.time()
            try:
                reply = await client.call(path, data, until)
            except (ChannelError, DeadlineExceeded) as exc:
                return client, exc
            self.stats.worker_call(call.rpc, client.name, loop.time() - started)
            return client, reply

        return list(await asyncio.gather(*(one(c) for c in clients)))

    @staticmethod
    def _first_failure(
        results: Sequence[tuple[WorkerClient, Reply | Exception]],
        *,
        ignore: frozenset[int] = frozenset(),
    ) -> Passthrough | None:
        for client, result in results:
            if isinstance(result, Reply) and result.status != OK and result.status not in ignore:
                return Passthrough(result.status, f"worker {client.label}: {result.message}")
        return None

    @staticmethod
    def _answers(
        results: Sequence[tuple[WorkerClient, Reply | Exception]],
    ) -> list[tuple[WorkerClient, Reply]]:
        return [(c, r) for c, r in results if isinstance(r, Reply) and r.status == OK]

    async def model_statistics(self, data: bytes, call: _Call) -> bytes:
        model = peek_name(data, what="ModelStatisticsRequest")
        results = await self._fan_out(
            b"/inference.GRPCInferenceService/ModelStatistics", data, call
        )
        failure = self._first_failure(results, ignore=frozenset({NOT_FOUND, UNAVAILABLE}))
        if failure is not None:
            raise failure
        answers = [
            pb.ModelStatisticsResponse().parse(bytes(r.payload)) for _, r in self._answers(results)
        ]
        if model and not answers:
            raise self._not_served(model)
        if model and self.router.table.serves(model):
            call.model = model
        return bytes(merge.merge_statistics(answers))

    async def repository_index(self, data: bytes, call: _Call) -> bytes:
        results = await self._fan_out(
            b"/inference.GRPCInferenceService/RepositoryIndex", data, call
        )
        answers = self._answers(results)
        if not answers:
            failure = self._first_failure(results)
            raise failure or Unavailable("RepositoryIndex: no worker answered")
        parsed = [
            (c.name, pb.RepositoryIndexResponse().parse(bytes(r.payload))) for c, r in answers
        ]
        return bytes(merge.merge_index(parsed))

    async def shm_status(self, data: bytes, call: _Call) -> bytes:
        results = await self._fan_out(
            b"/inference.GRPCInferenceService/SystemSharedMemoryStatus", data, call
        )
        answers = self._answers(results)
        if not answers:
            failure = self._first_failure(results)
            raise failure or Unavailable("SystemSharedMemoryStatus: no worker answered")
        parsed = [pb.SystemSharedMemoryStatusResponse().parse(bytes(r.payload)) for _, r in answers]
        return bytes(merge.merge_shm_status(parsed))

    async def shm_register(self, data: bytes, call: _Call) -> bytes:
        request = pb.SystemSharedMemoryRegisterRequest().parse(data)
        results = await self._fan_out(
            b"/inference.GRPCInferenceService/SystemSharedMemoryRegister", data, call
        )
        done = [c for c, r in results if isinstance(r, Reply) and r.status == OK]
        failed = [(c, r) for c, r in results if not (isinstance(r, Reply) and r.status == OK)]
        if not failed:
            self.registrations.registered(request.name, data)
            return b""
        if done:
            await self._rollback(request.name, done, call)
        client, result = failed[0]
        undone = f"; rolled back on {', '.join(c.label for c in done)}" if done else ""
        if isinstance(result, Reply):
            raise Passthrough(
                result.status,
                f"worker {client.label} refused region {request.name!r}: {result.message}{undone}",
            )
        raise Unavailable(
            f"region {request.name!r} could not be registered on worker {client.label} "
            f"({result}){undone}"
        )

    async def _rollback(self, name: str, clients: Sequence[WorkerClient], call: _Call) -> None:
        loop = asyncio.get_running_loop()
        request = bytes(pb.SystemSharedMemoryUnregisterRequest(name=name))
        deadline = max(call.deadline, loop.time() + ROLLBACK_SECONDS)
        path = b"/inference.GRPCInferenceService/SystemSharedMemoryUnregister"
        for client, result in await asyncio.gather(
            *(self._quiet_call(c, path, request, deadline) for c in clients)
        ):
            if not (isinstance(result, Reply) and result.status == OK):
                log.warning(
                    "rolling back shared-memory region %r on worker %s failed: %s",
                    name,
                    client.label,
                    result,
                )

    @staticmethod
    async def _quiet_call(
        client: WorkerClient, path: bytes, data: bytes, deadline: float
    ) -> tuple[WorkerClient, Reply | Exception]:
        try:
            return client, await client.call(path, data, deadline)
        except (ChannelError, DeadlineExceeded) as exc:
            return client, exc

    async def shm_unregister(self, data: bytes, call: _Call) -> bytes:
        request = pb.SystemSharedMemoryUnregisterRequest().parse(data)
        self.registrations.unregistered(request.name)
        results = await self._fan_out(
            b"/inference.GRPCInferenceService/SystemSharedMemoryUnregister", data, call
        )
        failure = self._first_failure(results)
        if failure is not None:
            raise failure
        return b""

    async def is_same_ipc_namespace(self, data: bytes, call: _Call) -> bytes:
        results = await self._fan_out(
            b"/inference.GRPCInferenceService/IsSameIPCNamespace", data, call
        )
        failure = self._first_failure(results)
        if failure is not None:
            raise failure
        answers = self._answers(results)
        same = bool(answers) and all(
            pb.IsSameIpcNamespaceResponse().parse(bytes(r.payload)).same for _, r in answers
        )
        # A worker that did not answer cannot be vouched for.
        same = same and len(answers) == len(results)
        return bytes(pb.IsSameIpcNamespaceResponse(same=same))

    async def compact_memory(self, data: bytes, call: _Call) -> bytes:
        results = await self._fan_out(b"/reactant_control.ControlService/CompactMemory", data, call)
        failure = self._first_failure(results)
        if failure is not None:
            raise failure
        unreached = [c.label for c, r in results if not isinstance(r, Reply)]
        if unreached:
            raise Unavailable(f"CompactMemory did not reach {', '.join(unreached)}")
        answers = [
            cpb.CompactMemoryResponse().parse(bytes(r.payload)) for _, r in self._answers(results)
        ]
        return bytes(merge.merge_compaction(answers))

    # ------------------------------------------------------------------ refused

    async def per_worker(self, rpc: str, data: bytes, call: _Call) -> bytes:
        workers = ", ".join(c.label for c in self.clients.values())
        raise FailedPrecondition(
            f"{rpc} acts on one worker and the gateway fronts {len(self.clients)}: call it on "
            f"the worker itself ({workers})"
        )

    async def no_cuda_shm(self, data: bytes, call: _Call) -> bytes:
        raise Unimplemented(
            "CUDA shared memory is not supported; register system shared memory "
            "(SystemSharedMemoryRegister) or send tensors inline"
        )

    async def unimplemented(self, rpc: str, data: bytes, call: _Call) -> bytes:
        raise Unimplemented(f"{rpc} is not supported by the gateway")

    async def gateway_control(self, rpc: str, data: bytes, call: _Call) -> bytes:
        mode = self.config.scheduling.mode
        if mode != "lpt_packing":
            raise not_lpt(mode)
        if self.control is None:
            raise Unimplemented(
                f"{rpc}: lpt_packing's control plane is not wired into this gateway yet; "
                "requests are routed round robin over the workers serving each model"
            )
        return await self.control.call(rpc, data, call.deadline)
