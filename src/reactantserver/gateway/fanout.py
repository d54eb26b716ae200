"""The RPCs the gateway answers by asking every worker: fanned out, then merged.

Each request goes at once to every worker that answered the last probe round (one that does
not answer is left out; a shared-memory region registered meanwhile reaches it when it comes
back, see :class:`~.prober.Registrations`), and the answers are combined by :mod:`.core.merge`:

``ModelStatistics``             summed per model and version; NOT_FOUND and UNAVAILABLE from
                                some workers are ignored (others have the model)
``RepositoryIndex``             the union, with each model's readiness
``SystemSharedMemoryRegister``  all or nothing: refused anywhere, it is unregistered where it
                                succeeded, and the refusal is answered naming the worker
``SystemSharedMemoryUnregister``, ``SystemSharedMemoryStatus``  everywhere; the union
``IsSameIPCNamespace``          true only if every worker answers true
``CompactMemory``               everywhere; the counts summed
``RepositoryModelLoad/Unload``  on the workers the proxy names (:meth:`FanOut.model_control`):
                                every one must succeed, nothing is undone elsewhere

A worker's refusal is passed through with its status, its message prefixed with the
worker's name; a worker that cannot be reached makes a read RPC answer from the others, and
a write RPC (registration, compaction) fail with UNAVAILABLE naming it.

Shared memory is the client's (:mod:`reactantserver.transport.core.auth`, rule 4): each call
names the client it is made for to the workers (``reactant-owner``, honoured only with
the gateway's key, ``worker_client.key_*``), so a worker keeps one client's regions from
every other's -- in a status, in a ModelInfer, in an unregister. Without that key the
workers could not tell the gateway's clients apart, so registration through the gateway
is refused (FAILED_PRECONDITION, saying what to configure).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Sequence

from ..errors import DeadlineExceeded, FailedPrecondition, NotFound, Unavailable, quoted
from ..model_version import check_version, parse_version
from ..protocol import inference as pb
from ..protocol import reactant_control as cpb
from ..protocol.screen import decode_message
from ..records import REPORTED_VERSION
from .calls import NOT_FOUND, OK, UNAVAILABLE, CallInfo, FleetView, Passthrough
from .channel import ChannelError, Reply
from .core import merge
from .core.stats import GatewayStats
from .core.wire import peek_name
from .pool import WorkerClient
from .prober import Registrations

log = logging.getLogger(__name__)

#: A rollback gets at least this long, even when the client's deadline is spent.
ROLLBACK_SECONDS = 5.0


class FanOut:
    """The fanned-out RPCs (see the module docstring)."""

    def __init__(
        self,
        fleet: FleetView,
        stats: GatewayStats,
        registrations: Registrations,
        *,
        not_served: Callable[[str], NotFound | Unavailable],
        serves: Callable[[str], bool],
    ) -> None:
        self.fleet = fleet
        self.stats = stats
        self.registrations = registrations
        self._not_served = not_served
        self._serves = serves

    async def _fan_out(
        self,
        path: bytes,
        data: bytes,
        call: CallInfo,
        only: Callable[[WorkerClient], bool] | None = None,
        *,
        owner: bool = False,
    ) -> list[tuple[WorkerClient, Reply | Exception]]:
        """``data`` to every worker that answered the last probe round (those ``only``
        accepts), at once."""
        clients = self.fleet.answering()
        if only is not None:
            clients = tuple(c for c in clients if only(c))
        if not clients:
            _, reason = self.fleet.ready()
            raise Unavailable(f"{call.rpc}: no worker answers the gateway ({reason})")
        loop = asyncio.get_running_loop()

        async def one(client: WorkerClient) -> tuple[WorkerClient, Reply | Exception]:
            started = loop.time()
            try:
                reply = await client.call(
                    path, data, call.deadline, tell=call.tell, owner=call.owner if owner else ""
                )
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

    async def model_statistics(self, data: bytes, call: CallInfo) -> bytes:
        model = peek_name(data, what="ModelStatisticsRequest")
        version = peek_name(data, 2, "ModelStatisticsRequest")
        if model and version:
            parse_version(version)
            if self._serves(model):  # (the workers' NOT_FOUND would be taken for "not here")
                check_version(model, REPORTED_VERSION, version)
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
        if model and self._serves(model):
            call.model = model
        return bytes(merge.merge_statistics(answers))

    async def repository_index(self, data: bytes, call: CallInfo) -> bytes:
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

    async def shm_status(self, data: bytes, call: CallInfo) -> bytes:
        results = await self._fan_out(
            b"/inference.GRPCInferenceService/SystemSharedMemoryStatus", data, call, owner=True
        )
        answers = self._answers(results)
        if not answers:
            failure = self._first_failure(results)
            raise failure or Unavailable("SystemSharedMemoryStatus: no worker answered")
        parsed = [pb.SystemSharedMemoryStatusResponse().parse(bytes(r.payload)) for _, r in answers]
        return bytes(merge.merge_shm_status(parsed))

    async def shm_register(self, data: bytes, call: CallInfo) -> bytes:
        async with self.registrations.lock:  # after any replay in flight (see Registrations)
            return await self._shm_register(data, call)

    def vouches(self) -> bool:
        """Whether the workers can tell this gateway's clients apart (see the module doc)."""
        clients = self.fleet.answering()
        return bool(clients) and all(c.credentials.vouch for c in clients)

    async def _shm_register(self, data: bytes, call: CallInfo) -> bytes:
        request = decode_message(data, pb.SystemSharedMemoryRegisterRequest)
        if not self.vouches():
            raise FailedPrecondition(
                "SystemSharedMemoryRegister: this gateway cannot keep its clients' shared "
                "memory apart on the workers: give it a key (worker_client.key_file or "
                "key_env) and the workers the same key (endpoints.gateway); a node's own "
                "gateway has one"
            )
        results = await self._fan_out(
            b"/inference.GRPCInferenceService/SystemSharedMemoryRegister", data, call, owner=True
        )
        done = [c for c, r in results if isinstance(r, Reply) and r.status == OK]
        failed = [(c, r) for c, r in results if not (isinstance(r, Reply) and r.status == OK)]
        if not failed:
            self.registrations.registered(call.owner, request.name, data)
            return b""
        if done:
            await self._rollback(request.name, done, call)
        client, result = failed[0]
        undone = f"; rolled back on {', '.join(c.label for c in done)}" if done else ""
        if isinstance(result, Reply):
            raise Passthrough(
                result.status,
                f"worker {client.label} refused region {quoted(request.name)}: {result.message}{undone}",
            )
        raise Unavailable(
            f"region {quoted(request.name)} could not be registered on worker {client.label} "
            f"({result}){undone}"
        )

    async def _rollback(self, name: str, clients: Sequence[WorkerClient], call: CallInfo) -> None:
        loop = asyncio.get_running_loop()
        request = bytes(pb.SystemSharedMemoryUnregisterRequest(name=name))
        deadline = max(call.deadline, loop.time() + ROLLBACK_SECONDS)
        path = b"/inference.GRPCInferenceService/SystemSharedMemoryUnregister"
        for client, result in await asyncio.gather(
            *(self._quiet_call(c, path, request, deadline, call.owner) for c in clients)
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
        client: WorkerClient, path: bytes, data: bytes, deadline: float, owner: str = ""
    ) -> tuple[WorkerClient, Reply | Exception]:
        try:
            return client, await client.call(path, data, deadline, owner=owner)
        except (ChannelError, DeadlineExceeded) as exc:
            return client, exc

    async def shm_unregister(self, data: bytes, call: CallInfo) -> bytes:
        request = decode_message(data, pb.SystemSharedMemoryUnregisterRequest)
        async with self.registrations.lock:  # after any replay in flight (see Registrations)
            self.registrations.unregistered(call.owner, request.name)
            results = await self._fan_out(
                b"/inference.GRPCInferenceService/SystemSharedMemoryUnregister",
                data,
                call,
                owner=True,
            )
        failure = self._first_failure(results)
        if failure is not None:
            raise failure
        return b""

    async def forget(self, owner: str) -> None:
        """A client's connection closed and its regions were the connection's: remove them
        on every worker (best effort: a worker that does not answer forgets them when the
        gateway reconnects to it, as the replay registers only what is left)."""
        async with self.registrations.lock:
            if not self.registrations.owns(owner):
                return
            self.registrations.unregistered(owner, "")
            request = bytes(pb.SystemSharedMemoryUnregisterRequest(name=""))
            deadline = asyncio.get_running_loop().time() + ROLLBACK_SECONDS
            path = b"/inference.GRPCInferenceService/SystemSharedMemoryUnregister"
            await asyncio.gather(
                *(
                    self._quiet_call(c, path, request, deadline, owner)
                    for c in self.fleet.answering()
                )
            )

    async def is_same_ipc_namespace(self, data: bytes, call: CallInfo) -> bytes:
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

    async def model_control(
        self, rpc: str, name: str, data: bytes, call: CallInfo, targets: Collection[str]
    ) -> bytes:
        """RepositoryModelLoad / Unload on the workers ``targets`` (addresses): each one
        must succeed. A refusal is passed through naming the worker (and where it was
        done already: a load is not undone elsewhere); a worker not reached is
        UNAVAILABLE."""
        path = f"/inference.GRPCInferenceService/{rpc}".encode()
        results = await self._fan_out(path, data, call, lambda c: c.address in targets)
        done = [c.label for c, r in results if isinstance(r, Reply) and r.status == OK]
        also = f" (done on {', '.join(done)})" if done else ""
        for client, result in results:
            if isinstance(result, Reply) and result.status != OK:
                raise Passthrough(result.status, f"worker {client.label}: {result.message}{also}")
        unreached = [c.label for c, r in results if not isinstance(r, Reply)]
        if unreached or len(results) < len(targets):
            missing = ", ".join(unreached) or "a worker that did not answer the last probe"
            raise Unavailable(
                f"failed to {rpc[15:].lower()} {name!r}: {missing} was not reached{also}"
            )
        return b""

    async def compact_memory(self, data: bytes, call: CallInfo) -> bytes:
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
