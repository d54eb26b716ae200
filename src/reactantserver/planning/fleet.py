"""One candidate fleet, simulated: N devices for the traffic, and what they would do.

:func:`evaluate` turns the planner's inputs into one run of the fleet simulator
(:class:`~reactantserver.fleet.simulator.FleetSimulation`) and reads the run back as a
:class:`FleetOutcome` -- the figures a plan prints, per fleet and per model -- with the
verdict against the goal and, when it fails, why.

What is simulated (nothing is a formula):

* ``n`` workers, each with the device file's weight budget, the costs file's execution
  costs and load time, ``fifo`` (as lpt_packing requires);
* hosts of ``devices_per_host`` devices each (``host_cores`` cores, the background threads
  calibrate saw unless the device file says otherwise): each worker's event loop, device
  thread and copy engine, the gateway (on the first host when ``gateway_on_host``) and a
  load generator that shares the machine (``generator_seconds``) share those cores
  (:mod:`reactantserver.fleet.host`) -- the model of what costs more under load;
* the placement lpt_packing's packer (:func:`reactantserver.gateway.core.packing.pack`, the
  gateway's own) makes on the traffic's rates and the calibrated costs, held for the run
  (``plan`` answers for the steady state the gateway converges to, not for its first
  minutes of learning); a closed loop's rates are its shares x the throughput of a first
  run, packed by memory and shares (two runs);
* the traffic: Poisson arrivals at each model's rate, or the closed loop's clients.

From the run: p50 / p99 over the window; errors -- requests refused (a queue full) and
requests answered after their model's deadline; whether an open loop keeps up (requests
left in the queues at the end); weight loads per second; each device's busy share; and,
through :func:`reactantserver.energy.report.build` (``reactantserver report``'s own cost
model, fed the simulated counters), joules and cost per million requests per model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ..config import GatewaySchedulingConfig
from ..energy.report import Scrape, WorkerScrape, build
from ..fleet.host import Hosts
from ..fleet.simulator import ClosedLoop, FleetModel, FleetSimulation, FleetWorker
from ..gateway.core.packing import ModelDemand, PackPolicy, WorkerCapacity, pack
from .costs import Costs
from .device import Device
from .traffic import Traffic

__all__ = ["FleetOutcome", "Goal", "ModelOutcome", "Run", "WorkerOutcome", "evaluate"]


@attrs.frozen(kw_only=True)
class Goal:
    """What the fleet must do: p99 (seconds) over every request of the window, and at most
    ``error_budget`` of the requests refused or answered after their deadline."""

    p99: float
    error_budget: float = 0.0


@attrs.frozen(kw_only=True)
class Run:
    """How long to simulate each candidate, and with which seed."""

    warmup: float = 5.0
    seconds: float = 20.0
    seed: int = 0
    mode: str = "lpt_packing"


@attrs.frozen(kw_only=True)
class ModelOutcome:
    name: str
    requests_per_second: float
    p50: float
    p99: float
    rows_per_execution: float
    errors: int
    device_seconds_per_request: float | None
    joules_per_request: float | None
    cost_per_million: float | None
    workers: tuple[str, ...]


@attrs.frozen(kw_only=True)
class WorkerOutcome:
    name: str
    host: str
    #: Share of the window its device spent executing, and waiting for a batch's weights.
    busy: float
    waiting_on_loads: float
    weight_loads: int
    assigned_bytes: int
    models: tuple[str, ...]


@attrs.frozen(kw_only=True)
class FleetOutcome:
    """One fleet size, simulated, against the goal."""

    workers: int
    hosts: int
    meets: bool
    #: Why it fails (empty when it meets), most telling first.
    reasons: tuple[str, ...]
    p50: float
    p99: float
    throughput: float
    #: Requests per second offered (open loop; None for a closed loop).
    offered: float | None
    completed: int
    rejected: int
    late: int
    #: Requests still waiting at the end of the window (an open loop falling behind).
    backlog: int
    loads_per_second: float
    #: Mean device busy share, and each host's core share used.
    busy: float
    host_busy: Mapping[str, float]
    price_per_hour: float | None
    models: tuple[ModelOutcome, ...]
    fleet: tuple[WorkerOutcome, ...]
    #: Wall seconds the simulation took.
    simulated_in: float = 0.0
    #: Virtual time the run was stopped at, falling hopelessly behind (None: ran to the
    #: end).
    stopped_at: float | None = None

    @property
    def error_share(self) -> float:
        total = self.completed + self.rejected
        return (self.rejected + self.late) / total if total else 0.0


def _host_of(i: int, device: Device) -> str:
    per = device.devices_per_host
    return "h0" if per <= 0 else f"h{i // per}"


def _hosts(n: int, traffic: Traffic, costs: Costs, device: Device) -> Hosts:
    names = sorted({_host_of(i, device) for i in range(n)}, key=lambda h: int(h[1:]))
    cores = device.host_cores or costs.cores or 1.0
    background = (
        device.host_background_threads
        if device.host_background_threads is not None
        else costs.background_threads
    )
    return Hosts(
        cores=dict.fromkeys(names, cores),
        background=dict.fromkeys(names, background),
        gateway="h0" if device.gateway_on_host else None,
        gateway_seconds=costs.gateway_seconds or 0.0,
        gateway_wake_seconds=costs.gateway_wake_seconds,
        clients="h0" if traffic.generator_seconds > 0 else None,
        client_seconds=traffic.generator_seconds,
        client_wake_seconds=traffic.generator_wake_seconds,
    )


def placement_for(
    n: int, rates: Mapping[str, float], traffic: Traffic, costs: Costs, device: Device
) -> dict[str, tuple[str, ...]]:
    """lpt_packing's placement of the catalog on ``n`` workers for these rates."""
    demands = [
        ModelDemand(
            name=name,
            rate=rates.get(name, 0.0),
            cost=costs.models[name].cost_per_request(traffic.models[name].mean_rows),
            nbytes=costs.models[name].weight_bytes,
        )
        for name in sorted(traffic.models)
    ]
    workers = [WorkerCapacity(address=f"w{i}", budget=device.weight_budget_bytes) for i in range(n)]
    # The gateway's default policy repairs memory oversubscription by moves and swaps; when
    # the catalog is larger than the fleet's whole budget nothing can fit, and the repair's
    # search (quadratic in the models) only shuffles the excess: the greedy pass alone then.
    catalog = sum(d.nbytes for d in demands)
    fits = device.weight_budget_bytes <= 0 or catalog <= n * device.weight_budget_bytes
    result = pack(demands, workers, None, PackPolicy(forbid_memory_oversubscription=fits))
    return dict(result.placement.models)


def _simulation(
    n: int,
    traffic: Traffic,
    costs: Costs,
    device: Device,
    run: Run,
    placement: Mapping[str, tuple[str, ...]] | None,
) -> FleetSimulation:
    models = [
        FleetModel(
            name=name,
            costs=costs.models[name].costs,
            nbytes=costs.models[name].weight_bytes,
            rate=t.rate,
            rows=t.rows,
        )
        for name, t in sorted(traffic.models.items())
    ]
    workers = [
        FleetWorker(
            name=f"w{i}",
            budget=device.weight_budget_bytes,
            bandwidth=costs.load_bandwidth,
            load_latency=costs.load_latency,
            discipline="fifo",
            host=_host_of(i, device),
            host_costs=costs.host,
            load_spread=costs.load_spread,
            cost_spread=costs.execution_spread,
        )
        for i in range(n)
    ]
    fixed = placement if run.mode == "lpt_packing" else None
    return FleetSimulation(
        models,
        workers,
        GatewaySchedulingConfig(mode=run.mode),  # type: ignore[arg-type]
        duration=run.warmup + run.seconds,
        warmup=run.warmup,
        seed=run.seed,
        # A fixed placement needs the route table once (every worker serves every model
        # and nothing repacks); the other modes' routers read it every probe round.
        health_interval=run.warmup + run.seconds + 1.0 if fixed is not None else 1.0,
        closed_loop=(
            ClosedLoop(clients=traffic.clients, think=traffic.think)
            if traffic.clients is not None
            else None
        ),
        network_delay=costs.network_seconds,
        hosts=_hosts(n, traffic, costs, device),
        placement=fixed,
    )


def _counters(sim: FleetSimulation) -> dict[tuple[str, str], dict[str, float]]:
    out = {}
    for name, w in sim.workers.items():
        for model, s in w.policy.statistics(sim.now).models.items():
            out[name, model] = {
                "requests": float(s.requests),
                "rows": float(s.rows),
                "dispatches": float(s.dispatches),
                "compute": s.compute_seconds,
            }
    return out


def evaluate(
    n: int,
    traffic: Traffic,
    costs: Costs,
    device: Device,
    goal: Goal,
    run: Run = Run(),
) -> FleetOutcome:
    """Simulate ``n`` devices for ``traffic`` and judge the run against ``goal``."""
    import time

    t0 = time.monotonic()
    placement = None
    if run.mode == "lpt_packing":
        if traffic.closed:
            # First run: packed by memory and shares at the device-bound throughput, then
            # repacked with the throughput it reached, as the gateway repacks on what it
            # measured.
            shares = traffic.shares()
            guess = _device_bound(n, traffic, costs)
            first = _simulation(
                n, traffic, costs, device, run,
                placement_for(n, {m: s * guess for m, s in shares.items()}, traffic, costs, device),
            )  # fmt: skip
            first.run()
            reached = sum(len(v) for v in first.latencies.values()) / run.seconds
            rates = {m: s * reached for m, s in shares.items()}
        else:
            rates = {m: t.rate for m, t in traffic.models.items()}
        placement = placement_for(n, rates, traffic, costs, device)
    sim = _simulation(n, traffic, costs, device, run, placement)
    marks: dict[str, Any] = {}
    sim.at(run.warmup, lambda: marks.update(start=_counters(sim)))
    if not traffic.closed:
        # An open loop that piles up more than the goal lets wait (Little's law at the
        # p99) has its verdict: stop there rather than simulate the queues to the end.
        # A cold start (every placed model loading once) piles up for a moment too: stop
        # only a backlog that is past the bound and still growing half a second later.
        allowed = _allowed_backlog(traffic, goal)
        before = [0]

        def check() -> None:
            now = sim.outstanding
            if now > 4 * allowed and now > before[0] > 4 * allowed:
                marks["stopped"] = sim.now
                sim.stop()
                return
            before[0] = now
            sim.at(sim.now + 0.5, check)

        sim.at(0.5, check)
    report = sim.run()
    end = _counters(sim)
    outcome = _outcome(
        n, sim, report, marks.get("start", {}), end, traffic, device, goal, run,
        marks.get("stopped"),
    )  # fmt: skip
    return attrs.evolve(outcome, simulated_in=time.monotonic() - t0)


def _allowed_backlog(traffic: Traffic, goal: Goal) -> float:
    """Requests an open loop may have waiting and still meet the goal: what arrives in two
    p99s (at least 10)."""
    return max(10.0, 2 * traffic.rate * goal.p99)


def _device_bound(n: int, traffic: Traffic, costs: Costs) -> float:
    """Requests per second ``n`` devices serve at the traffic's mix, one request per
    execution: an upper bound to start a closed loop's packing from."""
    shares = traffic.shares()
    per_request = sum(
        s * costs.models[m].cost_per_request(traffic.models[m].mean_rows) for m, s in shares.items()
    )
    return n / per_request if per_request > 0 else 1.0


def _outcome(
    n: int,
    sim: FleetSimulation,
    report: Any,
    start: Mapping[tuple[str, str], Mapping[str, float]],
    end: Mapping[tuple[str, str], Mapping[str, float]],
    traffic: Traffic,
    device: Device,
    goal: Goal,
    run: Run,
    stopped: float | None,
) -> FleetOutcome:
    window = report.window
    # The energy report's own arithmetic on the simulated counters.
    measured = device.watts_busy is not None and device.watts_idle is not None
    compute_of: dict[str, float] = {}
    for (w, _), c in end.items():
        compute_of[w] = (
            compute_of.get(w, 0.0) + c["compute"] - start.get((w, _), {}).get("compute", 0.0)
        )

    def scrape(counters: Mapping[tuple[str, str], Mapping[str, float]], at_end: bool) -> Scrape:
        models = {}
        for key, c in counters.items():
            fields = dict(c)
            if measured:
                fields["joules"] = (device.watts_busy or 0.0) * c["compute"]
            models[key] = fields
        workers = {}
        for w in sim.workers:
            idle = max(0.0, window - compute_of.get(w, 0.0)) if at_end else 0.0
            workers[w] = WorkerScrape(
                energy_source="plan" if measured else None,
                idle_joules=(device.watts_idle or 0.0) * idle if measured else 0.0,
                watts=None,
                device_hour=device.price_per_hour,
            )
        return Scrape(models=models, workers=workers)

    zero = {key: dict.fromkeys(c, 0.0) for key, c in end.items()}
    base = {key: start.get(key, zero[key]) for key in end}
    money = build(scrape(base, False), scrape(end, True), window, "plan")
    by_model = {m.model: m for m in money.models}
    late = 0
    models = []
    for m in report.models:
        deadline = traffic.models[m.name].deadline
        values = sim.latencies[m.name]
        over = sum(1 for x in values if deadline is not None and x > deadline)
        late += over
        priced = by_model.get(m.name)
        models.append(
            ModelOutcome(
                name=m.name,
                requests_per_second=m.completed / window,
                p50=m.p50,
                p99=m.p99,
                rows_per_execution=m.mean_batch_rows,
                errors=m.rejected + over,
                device_seconds_per_request=priced.device_seconds_per_request if priced else None,
                joules_per_request=priced.joules_per_inference if priced else None,
                cost_per_million=priced.cost_per_million_requests if priced else None,
                workers=m.workers,
            )
        )
    backlog = sim.outstanding
    placed_bytes = {w: 0 for w in sim.workers}
    for wr in report.workers:
        placed_bytes[wr.name] = sum(sim.models[m].nbytes for m in wr.models)
    fleet = tuple(
        WorkerOutcome(
            name=w.name,
            host=sim.workers[w.name].spec.host or "",
            busy=w.compute,
            waiting_on_loads=w.loading,
            weight_loads=w.weight_loads,
            assigned_bytes=placed_bytes[w.name],
            models=w.models,
        )
        for w in report.workers
    )
    offered = None if traffic.closed else traffic.rate
    outcome = FleetOutcome(
        workers=n,
        hosts=len(sim.host_models),
        meets=False,
        reasons=(),
        p50=report.p50,
        p99=report.p99,
        throughput=report.throughput,
        offered=offered,
        completed=report.completed,
        rejected=report.rejected,
        late=late,
        backlog=backlog,
        loads_per_second=report.loads_per_second,
        busy=sum(w.busy for w in fleet) / len(fleet) if fleet else 0.0,
        host_busy=dict(report.host_busy),
        price_per_hour=device.price_per_hour * n if device.price_per_hour is not None else None,
        models=tuple(models),
        fleet=fleet,
        stopped_at=stopped,
    )
    reasons = judge(outcome, goal, traffic, sim)
    return attrs.evolve(outcome, meets=not reasons, reasons=reasons)


def judge(
    outcome: FleetOutcome, goal: Goal, traffic: Traffic, sim: FleetSimulation | None = None
) -> tuple[str, ...]:
    """Why ``outcome`` fails ``goal`` (empty: it meets it), most telling first."""
    reasons = []
    # An open loop keeps up when what is left queued at the end is no more than what the
    # goal's latency lets wait (Little's law at the p99).
    if outcome.offered is not None and outcome.backlog > _allowed_backlog(traffic, goal):
        when = (
            f"after {outcome.stopped_at:.1f} s (simulation stopped there)"
            if outcome.stopped_at is not None
            else "at the end of the window"
        )
        reasons.append(
            f"falls behind: {outcome.backlog} requests waiting {when}; served "
            f"{outcome.throughput:.1f} of {outcome.offered:.1f} req/s"
        )
    if outcome.completed == 0:
        return (*reasons, "answered no request in the window")
    if not outcome.p99 <= goal.p99:
        reasons.append(f"p99 {outcome.p99 * 1e3:.1f} ms > {goal.p99 * 1e3:g} ms")
    share = outcome.error_share
    if share > goal.error_budget:
        parts = []
        if outcome.rejected:
            parts.append(f"{outcome.rejected} refused (queues full)")
        if outcome.late:
            parts.append(f"{outcome.late} answered after their deadline")
        reasons.append(f"errors {share:.2%} > {goal.error_budget:.2%} budget ({', '.join(parts)})")
    if reasons and sim is not None:
        reasons.extend(_explain(outcome, sim))
    return tuple(reasons)


def _explain(outcome: FleetOutcome, sim: FleetSimulation) -> list[str]:
    """What the failing run was short of: device time, weight memory, the host's cores."""
    out = []
    if outcome.busy >= 0.9:
        out.append(f"devices {outcome.busy:.0%} busy")
    waiting = sum(w.waiting_on_loads for w in outcome.fleet) / max(1, len(outcome.fleet))
    if waiting >= 0.1:
        out.append(f"devices {waiting:.0%} of the time waiting for weights")
    budget = sum(w.spec.budget for w in sim.workers.values())
    catalog = sum(m.nbytes for m in sim.models.values())
    if outcome.loads_per_second > 0 and 0 < budget < catalog:
        out.append(
            f"{outcome.loads_per_second:.1f} weight loads/s: the catalog "
            f"({catalog / 1e6:,.1f} MB) is {catalog / budget:.2f}x the fleet's weight budget"
        )
    hot = [h for h, share in outcome.host_busy.items() if share >= 0.9]
    if hot:
        out.append(f"host cores {max(outcome.host_busy[h] for h in hot):.0%} busy")
    return out
