"""The lpt_packing controller: estimates, cadence, packer and fill router tied together.

Theory of operation
-------------------
:class:`LptController` is the sans-IO core of ``scheduling.mode: lpt_packing``. The gateway's
I/O (and the fleet simulator) drive it with events and carry out what it returns::

    controller.check_fleet(table)                  # startup preconditions (raises)
    controller.update(table)                       # every probe round
    trigger = controller.due()                     # startup | compute | operator | fleet
                                                   # | None
    outcome = controller.repack(now, arrivals, trigger)
        -> RepackOutcome: the new placement, the oversubscription warnings (log each once),
           CompactMemory calls and SetModelResidency calls to send
    controller.set_policy(values)                  # SetSchedulingPolicy (all or nothing)
    controller.set_model_placement(...)            # SetModelPlacement, repacks at once
    controller.status()                            # GetSchedulingStatus

It owns the :class:`~reactantserver.gateway.core.routing.FillRouter`: a repack swaps the router's
placement, a policy change its knobs, so routing follows within the call that changed them.

**What a repack sends.** Workers in explicit mode (``residency_mode`` externally managed)
are *reconciled* with SetModelResidency against the pins each one reports: ``system`` for
the models pinned there and not placed (first, so that the new pins fit), ``device`` for
the models placed there and not pinned -- so a restarted gateway also takes back the pins
of its predecessor. Self-managed workers keep deciding residency themselves
(placement changes routing only); they get CompactMemory on the first placement-changing
repack at or after ``compaction_interval`` repacks since the last compaction, if their model
set changed and ``compaction_mode`` is not ``off`` (``eager``: reload nothing, the weights
stream back on demand; ``scheduled``: reload the models newly placed there).

**Operator state is not persisted**: SetSchedulingPolicy and SetModelPlacement change this
process only; a restarted gateway starts again from gateway.yml.

``generation`` counts changes of the routing state (repacks, policy and placement calls);
GetSchedulingStatus reports it so an operator can see that a call took effect.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

import attrs

from reactantserver.config.convert import INFLIGHT_REMOVED
from reactantserver.config.schema import (
    LPT_DISCIPLINES,
    GatewayModelConfig,
    GatewaySchedulingConfig,
)
from reactantserver.errors import FailedPrecondition, InvalidArgument, NotFound
from reactantserver.names import did_you_mean

from .estimates import LoadEstimator, RepackCadence, Trigger
from .packing import ModelDemand, PackPolicy, PackResult, Placement, WorkerCapacity, pack
from .policy import policy_value
from .routing import FillRouter
from .table import RouteTable


@attrs.frozen(kw_only=True)
class Compaction:
    """CompactMemory to send to one worker."""

    worker: str
    reload: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class ResidencyChange:
    """SetModelResidency to send to one explicit-mode worker."""

    worker: str
    model: str
    target: Literal["device", "system"]


@attrs.frozen(kw_only=True)
class RepackOutcome:
    trigger: Trigger
    generation: int
    result: PackResult
    #: Worker -> (models added, models removed) where its set changed.
    changes: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]
    compactions: tuple[Compaction, ...]
    residency: tuple[ResidencyChange, ...]

    @property
    def placement(self) -> Placement:
        return self.result.placement

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.result.warnings


@attrs.frozen(kw_only=True)
class ModelStatus:
    name: str
    rate: float
    cost: float
    load: float
    weight_nbytes: int
    replicas: tuple[str, ...]
    fill_quantum: Mapping[str, int]


@attrs.frozen(kw_only=True)
class WorkerStatus:
    address: str
    name: str
    ready: bool
    weight_budget: int
    assigned_bytes: int
    compute_load: float
    oversubscribed: bool
    models: tuple[str, ...]


@attrs.frozen(kw_only=True)
class SchedulingStatus:
    """GetSchedulingStatus, as records."""

    policy: GatewaySchedulingConfig
    generation: int
    fleet_compute_seconds: float
    next_repack_at: float | None
    repacks: Mapping[str, int]
    models: tuple[ModelStatus, ...]
    workers: tuple[WorkerStatus, ...]
    warnings: tuple[str, ...]


class LptController:
    """See the module docstring."""

    def __init__(self, config: GatewaySchedulingConfig, table: RouteTable | None = None) -> None:
        if config.mode != "lpt_packing":
            raise ValueError(f"LptController needs mode lpt_packing; got {config.mode}")
        self._base = config
        self._overrides: dict[str, GatewayModelConfig] = {}
        self.config = config
        self.table = table if table is not None else RouteTable()
        self.router = FillRouter(self.table, config)
        self.estimator = LoadEstimator(self._halflife(config))
        self.cadence = RepackCadence(
            config.rebalance_compute_seconds, config.first_rebalance_compute_seconds
        )
        self.generation = 0
        self.placement = Placement()
        self.last: PackResult | None = None
        self._since_compaction = 0
        #: Ready workers and the models they have loaded, at the last repack (None before
        #: the first).
        self._fleet: tuple[frozenset[str], frozenset[str]] | None = None

    # ------------------------------------------------------------------ events

    def check_fleet(self, table: RouteTable) -> None:
        """Startup preconditions: every worker ready, fifo/edf, the same model set."""
        workers = list(table.workers.values())
        if not workers:
            raise FailedPrecondition("lpt_packing: no worker answered")
        for w in workers:
            if not w.ready:
                raise FailedPrecondition(f"lpt_packing: worker {w.name} ({w.address}) is not ready")
            if w.discipline not in LPT_DISCIPLINES:
                raise FailedPrecondition(
                    f"lpt_packing: worker {w.name} ({w.address}) runs the {w.discipline or '?'} "
                    "discipline; workers behind lpt_packing must run fifo or edf "
                    "(scheduler.discipline), so that placement stays the gateway's"
                )
        first = workers[0]
        for w in workers[1:]:
            if w.models != first.models:
                only = sorted(set(w.models) ^ set(first.models))
                raise FailedPrecondition(
                    f"lpt_packing: worker {w.name} ({w.address}) serves a different model set "
                    f"from {first.name} ({first.address}); they differ in {only}. Every worker "
                    "behind lpt_packing must serve the same models"
                )

    def update(self, table: RouteTable) -> None:
        """A new route table (every probe round)."""
        self.table = table
        self.router.update(table)

    def due(self) -> Trigger | None:
        """The repack due now: the cadence's, else ``fleet`` when ready workers came or went
        or the set of loaded models changed (a model finished loading, or was unloaded)."""
        trigger = self.cadence.due(self.table.fleet_compute_seconds)
        moved = self._fleet is not None and self._fleet_now() != self._fleet
        return "fleet" if trigger is None and moved else trigger

    def _fleet_now(self) -> tuple[frozenset[str], frozenset[str]]:
        return frozenset(self.table.ready_workers), frozenset(self.table.catalog())

    def request_repack(self) -> None:
        """The operator's Repack RPC: the next :meth:`due` says ``operator``."""
        self.cadence.request()

    def repack(self, now: float, arrivals: Mapping[str, int], trigger: Trigger) -> RepackOutcome:
        """Estimate, pack and swap the placement in. ``arrivals``: cumulative per model."""
        table = self.table
        catalog = table.catalog()
        estimates = self.estimator.update(
            now, catalog, arrivals, table.totals, table.fleet_compute_seconds
        )
        workers = [
            WorkerCapacity(address=w.address, budget=w.weight_cache_max_bytes)
            for w in table.workers.values()
            if w.ready
        ]
        demands = [
            ModelDemand(name=name, rate=estimates[name].rate, cost=estimates[name].cost, nbytes=b)
            for name, b in catalog.items()
        ]
        result = pack(demands, workers, self.placement, self._pack_policy())
        before = self.placement
        changes: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        for w in workers:
            old = set(before.models_on(w.address))
            new = set(result.placement.models_on(w.address))
            if old != new:
                changes[w.address] = (tuple(sorted(new - old)), tuple(sorted(old - new)))
        self._since_compaction += 1
        compactions, residency = self._actions(changes, result.placement)
        self.placement = result.placement
        self.last = result
        self.router.set_placement(result.placement.models)
        self.cadence.done(trigger, table.fleet_compute_seconds)
        self._fleet = self._fleet_now()
        self.generation += 1
        return RepackOutcome(
            trigger=trigger,
            generation=self.generation,
            result=result,
            changes=MappingProxyType(changes),
            compactions=compactions,
            residency=residency,
        )

    # ------------------------------------------------------------- control RPCs

    def set_policy(self, values: Mapping[str, Any]) -> GatewaySchedulingConfig:
        """SetSchedulingPolicy: validate every value first, then apply all of them."""
        changes: dict[str, Any] = {}
        problems: list[str] = []
        for name, value in values.items():
            try:
                changes[name] = policy_value(name, value)
            except InvalidArgument as exc:
                problems.append(str(exc))
        if problems:
            raise InvalidArgument("; ".join(problems) + " (nothing was changed)")
        self._base = attrs.evolve(self._base, **changes)
        self._apply()
        return self.config

    def set_model_placement(
        self,
        name: str,
        *,
        replicas: int = 0,
        fill_mode: str = "",
        fill_factor: float = -1.0,
        allow_unknown_model: bool = False,
        now: float,
        arrivals: Mapping[str, int],
    ) -> RepackOutcome:
        """SetModelPlacement: replicas > 0 sets, -1 = all, 0 clears the override; fill_mode
        "" keeps, "inherit" clears; fill_factor < 0 keeps, 0 clears. Repacks at once."""
        if not name:
            raise InvalidArgument("name: expected a model name; got ''")
        if not allow_unknown_model and name not in self.table.catalog():
            hint = did_you_mean(name, self.table.known)  # every model a worker listed
            raise NotFound(
                f"model {name!r} is not served by any ready worker "
                f"(set allow_unknown_model to place it ahead of its loading){hint}"
            )
        entry = self._overrides.get(name, GatewayModelConfig())
        if replicas < -1:
            raise InvalidArgument(f"replicas: expected > 0, -1 (all) or 0 (clear); got {replicas}")
        if fill_mode not in ("", "inherit", "run", "spread"):
            reason = INFLIGHT_REMOVED if fill_mode == "inflight" else "expected run or spread"
            raise InvalidArgument(
                f"fill_mode: {reason} ('' keeps, inherit clears); got {fill_mode!r}"
            )
        if not math.isfinite(fill_factor):
            raise InvalidArgument(f"fill_factor: expected a finite number; got {fill_factor}")
        replicas_value = entry.replicas
        if replicas > 0:
            replicas_value = replicas
        elif replicas == -1:
            replicas_value = "all"
        elif replicas == 0:
            replicas_value = None
        mode_value: Any = entry.fill_mode
        if fill_mode == "inherit":
            mode_value = None
        elif fill_mode:
            mode_value = fill_mode
        factor_value = entry.fill_factor
        if fill_factor == 0:
            factor_value = None
        elif fill_factor > 0:
            factor_value = fill_factor
        self._overrides[name] = GatewayModelConfig(
            replicas=replicas_value, fill_mode=mode_value, fill_factor=factor_value
        )
        self._apply()
        return self.repack(now, arrivals, "operator")

    def status(self) -> SchedulingStatus:
        estimates = self.estimator.estimates
        plans = self.last.workers if self.last is not None else {}
        catalog = self.table.catalog()
        models = []
        for name in sorted(set(catalog) | set(self.placement.models)):
            e = estimates.get(name)
            replicas = self.table.replicas(name)
            stats_q = {
                r.worker: self.router.quantum_of(name, r.worker)
                for r in replicas
                if r.worker in self.placement.workers_of(name)
            }
            models.append(
                ModelStatus(
                    name=name,
                    rate=e.rate if e else 0.0,
                    cost=e.cost if e else 0.0,
                    load=e.load if e else 0.0,
                    weight_nbytes=catalog.get(name, 0),
                    replicas=self.placement.workers_of(name),
                    fill_quantum=MappingProxyType(stats_q),
                )
            )
        workers = []
        for w in self.table.workers.values():
            plan = plans.get(w.address)
            workers.append(
                WorkerStatus(
                    address=w.address,
                    name=w.name,
                    ready=w.ready,
                    weight_budget=w.weight_cache_max_bytes,
                    assigned_bytes=plan.assigned_bytes if plan else 0,
                    compute_load=plan.compute if plan else 0.0,
                    oversubscribed=plan.oversubscribed if plan else False,
                    models=self.placement.models_on(w.address),
                )
            )
        cadence = self.cadence.statistics()
        return SchedulingStatus(
            policy=self.config,
            generation=self.generation,
            fleet_compute_seconds=self.table.fleet_compute_seconds,
            next_repack_at=cadence.next_due,
            repacks=cadence.repacks,
            models=tuple(models),
            workers=tuple(workers),
            warnings=self.last.warnings if self.last is not None else (),
        )

    # ----------------------------------------------------------------- private

    @staticmethod
    def _halflife(config: GatewaySchedulingConfig) -> float:
        return config.ema_halflife_compute_seconds or config.rebalance_compute_seconds

    def _apply(self) -> None:
        """Recompute the effective config (gateway.yml + operator) and push it down."""
        models = dict(self._base.models)
        for name, entry in self._overrides.items():
            base = models.get(name, GatewayModelConfig())
            models[name] = GatewayModelConfig(
                replicas=entry.replicas if entry.replicas is not None else base.replicas,
                fill_mode=entry.fill_mode if entry.fill_mode is not None else base.fill_mode,
                fill_factor=entry.fill_factor
                if entry.fill_factor is not None
                else base.fill_factor,
            )
        self.config = attrs.evolve(self._base, models=MappingProxyType(models))
        self.router.configure(self.config)
        self.estimator.halflife = self._halflife(self.config)
        self.cadence.configure(
            self.config.rebalance_compute_seconds, self.config.first_rebalance_compute_seconds
        )
        self.generation += 1

    def _pack_policy(self) -> PackPolicy:
        config = self.config
        return PackPolicy(
            default_replicas=config.default_replicas,
            replicas={n: m.replicas for n, m in config.models.items() if m.replicas is not None},
            hysteresis=config.hysteresis,
            forbid_memory_oversubscription=config.forbid_memory_oversubscription,
        )

    def _actions(
        self,
        changes: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]],
        placement: Placement,
    ) -> tuple[tuple[Compaction, ...], tuple[ResidencyChange, ...]]:
        """What to send. Explicit-mode workers are *reconciled*: the models placed there and
        not pinned on their device are pinned (``device``), the ones pinned there and not
        placed are unpinned (``system``) first, so that the pins fit -- compared with what
        each worker reports, not with the previous placement, so a restarted gateway also
        takes back the pins of its predecessor. Self-managed workers whose set changed are
        compacted per ``compaction_mode`` / ``compaction_interval``."""
        config = self.config
        residency: list[ResidencyChange] = []
        compactions: list[Compaction] = []
        compact = (
            bool(changes)
            and config.compaction_mode != "off"
            and self._since_compaction >= config.compaction_interval
        )
        for address, info in sorted(self.table.workers.items()):
            if not info.ready or info.residency_mode != "externally_managed":
                continue
            placed = set(placement.models_on(address)) & set(info.loaded)
            pinned = set(info.pinned)
            residency.extend(
                ResidencyChange(worker=address, model=m, target="system")
                for m in sorted(pinned - placed)
            )
            residency.extend(
                ResidencyChange(worker=address, model=m, target="device")
                for m in sorted(placed - pinned)
            )
        for address, (added, _) in sorted(changes.items()):
            info = self.table.workers[address]
            if info.residency_mode == "externally_managed":
                continue
            if compact:
                reload = added if config.compaction_mode == "scheduled" else ()
                compactions.append(Compaction(worker=address, reload=reload))
        if compactions:
            self._since_compaction = 0
        return tuple(compactions), tuple(residency)
