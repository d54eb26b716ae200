"""lpt_packing in the gateway process: the repack driver and the control plane.

Theory of operation
-------------------
:class:`LptDriver` is the thin Trio driver over the sans-IO
:class:`~.core.control.LptController` (which owns the estimates, the cadence, the packer and the
fill router). It does three things, all on Trio's side of the gateway:

**Startup** (:meth:`LptDriver.startup`, before the gateway listens). Probe rounds, one every
``health_interval_seconds``, until every configured worker answers ready, for at most
``startup_wait_seconds`` (0 = the first round decides, ``.inf`` = wait for ever); then the
controller's checks (``fifo`` / ``edf`` discipline, the same model set). Either failure is
:class:`LptRefused`, one line naming the offending worker; ``reactantserver gateway`` logs it
and exits 1. Then the ``startup`` repack: no measurements yet, so placement is by memory.

**Repacks** (:meth:`LptDriver.run`). Every probe round hands the controller the new route
table (the prober's ``on_table`` hook calls :meth:`LptDriver.on_table`) and wakes the task,
which asks ``controller.due()``: ``compute`` once enough fleet GPU-seconds accumulated,
``fleet`` when the ready workers or the loaded models changed. Arrivals are the router's
cumulative per-model counts (:meth:`~.core.routing.Router.arrivals`), read at the repack.

**Control RPCs** (:meth:`LptDriver.call`, the proxy's
:class:`~.calls.ControlPlane`): decoded on the asyncio side, carried out in a Trio task
through the proxy's :class:`~reactantserver.transport.guest.TrioPortal`. SetModelPlacement
repacks and sends before it answers, so routing has changed when the call returns; Repack
answers after the repack or after ``wait_seconds``, whichever is first (the repack still
finishes).

Every repack -- whatever its trigger -- runs under one lock: estimate, pack and swap the
placement into the router (pure and immediate), log each oversubscription warning once,
then send what the outcome says through the worker connections the gateway already has:
SetModelResidency to explicit-mode workers (``system`` first, so that the new pins fit),
then one probe round so that the models pinned just now are routed to; CompactMemory to
the self-managed workers whose model set changed (``compaction_mode`` /
``compaction_interval``). A worker that refuses or cannot be reached is logged; the next
repack reconciles explicit-mode workers again against the pins they report.

Nothing here imports JAX (tests/project/test_no_jax.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

import attrs
import trio

from ..config.schema import GatewaySchedulingConfig
from ..errors import FailedPrecondition, InvalidArgument
from ..grpcwire import StatusCode
from ..protocol import reactant_control as cpb
from ..protocol.screen import decode_message
from ..transport import guest
from .core.control import Compaction, LptController, ModelStatus, RepackOutcome, ResidencyChange
from .core.estimates import Trigger
from .core.policy import POLICY_FIELDS, check_repack_wait
from .core.table import RouteTable
from .pool import WorkerClient
from .prober import Prober

log = logging.getLogger(__name__)

SET_MODEL_RESIDENCY = b"/reactant_control.ControlService/SetModelResidency"
COMPACT_MEMORY = b"/reactant_control.ControlService/CompactMemory"
#: How long one SetModelResidency / CompactMemory call may take (a load of big weights).
ACTION_TIMEOUT = 60.0
_TARGETS: Mapping[str, cpb.Residency] = {
    "device": cpb.Residency.from_string("PINNED_DEVICE"),
    "system": cpb.Residency.from_string("PINNED_SYSTEM"),
}


class LptRefused(Exception):
    """lpt_packing cannot start on this fleet (one line, naming the worker)."""


@attrs.frozen(kw_only=True)
class RepackDone:
    """One repack as the driver carried it out."""

    outcome: RepackOutcome
    #: Models whose worker set changed.
    moved: tuple[str, ...]
    #: Actions a worker refused or did not answer (one line each).
    failures: tuple[str, ...] = ()


class LptDriver:
    """See the module docstring."""

    def __init__(
        self,
        controller: LptController,
        prober: Prober,
        clients: Sequence[WorkerClient],
        *,
        startup_wait_seconds: float,
    ) -> None:
        self.controller = controller
        self.prober = prober
        self.clients: Mapping[str, WorkerClient] = {c.address: c for c in clients}
        self.startup_wait_seconds = startup_wait_seconds
        self.portal: guest.TrioPortal | None = None
        self._lock = trio.Lock()
        self._wake = trio.Event()
        self.last: RepackDone | None = None

    # ------------------------------------------------------------------ startup

    def on_table(self, table: RouteTable) -> None:
        """The prober's hook: every round's table goes to the controller."""
        self.controller.update(table)
        self._wake.set()

    async def startup(self) -> RepackDone:
        """Wait for every worker, check the fleet, place (see the module docstring)."""
        wait = self.startup_wait_seconds
        deadline = trio.current_time() + wait
        table = self.prober.table
        while True:
            missing = [p for p in self.prober.probes.values() if not p.ready]
            if not missing:
                break
            if trio.current_time() >= deadline:
                p = missing[0]
                waited = "at once (startup_wait_seconds: 0)" if wait == 0 else f"within {wait:g} s"
                raise LptRefused(
                    f"lpt_packing needs every worker: {p.name} ({p.address}) was not ready "
                    f"{waited}: {p.problem}; start it, or raise startup_wait_seconds"
                )
            await trio.sleep(min(self.prober.interval, max(0.0, deadline - trio.current_time())))
            table = await self.prober.probe_round()
        try:
            self.controller.check_fleet(table)
        except FailedPrecondition as exc:
            raise LptRefused(str(exc)) from None
        return await self.repack("startup")

    # ------------------------------------------------------------------ repacks

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Repack whenever one is due, until cancelled (after :meth:`startup`)."""
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            if self.controller.due() is not None:
                async with self._lock:
                    trigger = self.controller.due()  # the lock may have waited on a repack
                    if trigger is not None:
                        try:
                            await self._repack_locked(trigger)
                        except Exception:  # our bug: keep serving on the last placement
                            log.exception("lpt_packing: a %s repack failed", trigger)

    async def repack(self, trigger: Trigger) -> RepackDone:
        """One repack now, carried out (waits for a repack already running)."""
        async with self._lock:
            return await self._repack_locked(trigger)

    async def _repack_locked(self, trigger: Trigger) -> RepackDone:
        before = self.controller.placement
        outcome = self.controller.repack(trio.current_time(), self._arrivals(), trigger)
        return await self._carry_out(outcome, before.models)

    def _arrivals(self) -> dict[str, int]:
        return self.controller.router.arrivals()

    async def _carry_out(
        self, outcome: RepackOutcome, before: Mapping[str, tuple[str, ...]]
    ) -> RepackDone:
        after = outcome.placement.models
        moved = tuple(m for m in sorted(set(before) | set(after)) if before.get(m) != after.get(m))
        log.info(
            "repack (%s), generation %d: %d models placed on %d workers; moved: %s",
            outcome.trigger,
            outcome.generation,
            len(after),
            len({w for ws in after.values() for w in ws}),
            ", ".join(moved) or "none",
        )
        for warning in outcome.warnings:
            log.warning("lpt_packing: %s", warning)
        failures = [await self._send_residency(r) for r in outcome.residency]
        if outcome.residency:
            await self.prober.probe_round()  # the models pinned just now are routed to
        failures += [await self._send_compaction(c) for c in outcome.compactions]
        done = RepackDone(outcome=outcome, moved=moved, failures=tuple(f for f in failures if f))
        self.last = done
        return done

    async def _send_residency(self, change: ResidencyChange) -> str:
        request = cpb.SetModelResidencyRequest(name=change.model, target=_TARGETS[change.target])
        what = f"SetModelResidency({change.model}, {change.target})"
        return await self._send(change.worker, SET_MODEL_RESIDENCY, bytes(request), what)

    async def _send_compaction(self, compaction: Compaction) -> str:
        request = cpb.CompactMemoryRequest(reload_models=list(compaction.reload))
        what = f"CompactMemory(reload {list(compaction.reload)})"
        return await self._send(compaction.worker, COMPACT_MEMORY, bytes(request), what)

    async def _send(self, address: str, path: bytes, payload: bytes, what: str) -> str:
        """One call to a worker; "" when it succeeded, else the line that was logged."""
        client = self.clients[address]

        async def call() -> tuple[int, str]:
            deadline = asyncio.get_running_loop().time() + ACTION_TIMEOUT
            reply = await client.call(path, payload, deadline)
            return reply.status, reply.message

        try:
            status, message = await guest.aio(call())
        except Exception as exc:  # unreachable: the next repack tries again
            status, message = -1, str(exc) or type(exc).__name__
        if status == StatusCode.OK:
            return ""
        line = f"lpt_packing: {what} on worker {client.label} failed: {message} (status {status})"
        log.warning("%s", line)
        return line

    # ------------------------------------------------------------- control plane

    async def call(self, rpc: str, request: bytes, deadline: float) -> bytes:
        """The proxy's ControlPlane: one GatewayControlService call (asyncio side)."""
        portal = self.portal
        assert portal is not None, "the gateway sets the portal before it serves"
        if rpc == "GetSchedulingStatus":
            return bytes(self.status_message())
        if rpc == "SetSchedulingPolicy":
            message = decode_message(request, cpb.SetSchedulingPolicyRequest)
            return bytes(await portal.run(self._set_policy, message))
        if rpc == "SetModelPlacement":
            placement = decode_message(request, cpb.SetModelPlacementRequest)
            return bytes(await portal.run(self._set_model_placement, placement))
        if rpc == "Repack":
            wait = check_repack_wait(decode_message(request, cpb.RepackRequest).wait_seconds)
            loop = asyncio.get_running_loop()
            wait = max(0.0, min(wait, deadline - loop.time()))
            task = asyncio.ensure_future(portal.run(self.repack, "operator"))
            task.add_done_callback(_retrieve)
            try:
                done = await asyncio.wait_for(asyncio.shield(task), wait)
            except TimeoutError:
                return bytes(cpb.RepackResponse(completed=False, generation=self.generation))
            return bytes(
                cpb.RepackResponse(
                    completed=True,
                    generation=done.outcome.generation,
                    moved_models=list(done.moved),
                    warnings=list(done.outcome.warnings),
                )
            )
        raise InvalidArgument(f"{rpc}: not a GatewayControlService method")

    @property
    def generation(self) -> int:
        return self.controller.generation

    async def _set_policy(
        self, message: cpb.SetSchedulingPolicyRequest
    ) -> cpb.SetSchedulingPolicyResponse:
        values = {path: getattr(message.policy, path, None) for path in message.update_mask.paths}
        self.controller.set_policy(values)
        return cpb.SetSchedulingPolicyResponse(policy=self.policy_message())

    async def _set_model_placement(
        self, message: cpb.SetModelPlacementRequest
    ) -> cpb.SetModelPlacementResponse:
        async with self._lock:
            before = self.controller.placement.models
            outcome = self.controller.set_model_placement(
                message.name,
                replicas=message.replicas,
                fill_mode=message.fill_mode,
                fill_factor=message.fill_factor,
                allow_unknown_model=message.allow_unknown_model,
                now=trio.current_time(),
                arrivals=self._arrivals(),
            )
            await self._carry_out(outcome, before)
        status = self.controller.status()
        model = next((m for m in status.models if m.name == message.name), None)
        return cpb.SetModelPlacementResponse(
            model=_model_message(model)
            if model is not None
            else cpb.ModelPlacement(name=message.name),
            generation=self.controller.generation,
        )

    # ------------------------------------------------------------------ status

    def policy_message(self) -> cpb.SchedulingPolicy:
        c: GatewaySchedulingConfig = self.controller.config
        values = {name: getattr(c, name) for name in POLICY_FIELDS}
        values["default_replicas"] = -1 if c.default_replicas == "all" else c.default_replicas
        return cpb.SchedulingPolicy(**values, generation=self.controller.generation)

    def status_message(self) -> cpb.GetSchedulingStatusResponse:
        status = self.controller.status()
        return cpb.GetSchedulingStatusResponse(
            policy=self.policy_message(),
            models=[_model_message(m) for m in status.models],
            workers=[
                cpb.WorkerPlacement(
                    address=w.address,
                    name=w.name,
                    ready=w.ready,
                    weight_budget_bytes=w.weight_budget,
                    assigned_weight_bytes=w.assigned_bytes,
                    compute_load=w.compute_load,
                    oversubscribed=w.oversubscribed,
                    models=list(w.models),
                )
                for w in status.workers
            ],
            fleet_compute_seconds=status.fleet_compute_seconds,
            next_repack_compute_seconds=status.next_repack_at or 0.0,
            repacks=dict(status.repacks),
            warnings=list(status.warnings),
        )


def _model_message(m: ModelStatus) -> cpb.ModelPlacement:
    return cpb.ModelPlacement(
        name=m.name,
        workers=list(m.replicas),
        rate=m.rate,
        cost_seconds=m.cost,
        utilization=m.load,
        weight_nbytes=m.weight_nbytes,
        fill_quantum=dict(m.fill_quantum),
    )


def _retrieve(task: asyncio.Future[RepackDone]) -> None:
    """A Repack that outlived its caller's wait: its failure is logged, not lost."""
    if not task.cancelled() and task.exception() is not None:
        log.error("lpt_packing: a repack failed: %s", task.exception())


__all__ = ["LptDriver", "LptRefused", "RepackDone"]
