"""Fleet mode of the workload simulator: N workers behind the gateway, in virtual time.

It drives the worker's scheduling and weight-cache policies *and* the gateway's router
and controller, so it sits above both packages (``reactantserver.fleet``): the worker's
``scheduling`` package never imports the gateway (tests/project/test_layers.py checks it).

Theory of operation
-------------------
A discrete-event simulation with no event loop library: a heap of timed events, processed
in time order (ties by insertion), so the same input and seed give the same numbers. Only
the device and the network are modelled; every decision is made by the real sans-IO code:

* each simulated worker runs a real :class:`~reactantserver.scheduling.policy.SchedulingPolicy`
  (its ``discipline``, coalescing at the compiled sizes) and a real
  :class:`~reactantserver.weights.policy.WeightCachePolicy` under the worker's byte budget;
  a batch costs ``costs[size]`` device seconds, then ``request_seconds`` per request of
  worker CPU (decoding the requests, encoding the answers) in series with it, during which
  the worker starts no other batch; the policy and the compute counters see only the device
  seconds, as a live worker reports only those. A weight load ``bytes / bandwidth + load_latency``
  seconds on the worker's one copy engine (loads queue behind each other and overlap
  execution, like prefetch on a GPU); the worker prefetches the next model's weights while
  a batch runs, as the real one does (``prefetch``);
* the gateway is the real router for ``gateway.mode`` (``round_robin``,
  ``least_outstanding``, or ``lpt_packing``'s fill router driven by the real
  :class:`~reactantserver.gateway.core.control.LptController`: LPT packer, fleet-compute EWMAs,
  repack cadence). Every ``health_interval`` seconds the simulator builds the same
  ``WorkerSnapshot`` records the prober builds from ``ModelControlStatus`` (cumulative
  compute, requests, rows per model; the weight budget), so costs per item, fleet compute
  and repacks come from the same code path as in production. ``operator_repacks`` are the
  virtual times of the operator's Repack RPC: the controller repacks at once on the last
  probe round's table, with trigger ``operator``, as the live gateway's driver does.

Traffic is open loop (each model a Poisson process at its ``rate``) or closed loop
(``ClosedLoop``: a fixed number of clients, each sending its next request when the last is
answered, the model drawn by ``rate`` as a popularity weight), which is how most load
generators drive a live server.

Input is what a live harness can measure on real workers -- per model the cost of each
compiled batch size and the weight bytes; per worker the weight budget and the host->device
bandwidth -- so it can predict a live run (p50 per model, weight loads per second) and be
compared with it. Output: :class:`~reactantserver.fleet.report.FleetReport`.

Not modelled: network and gateway CPU time (``network_delay`` adds a fixed one-way delay
beside the workers; the workers' own per-request CPU is ``FleetWorker.request_seconds``),
failures and failover, deadlines, compaction, and weight loads that evict a model in use.
"""

from __future__ import annotations

import inspect
import itertools
import math
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from heapq import heappop as _pop
from heapq import heappush as _push
from typing import Any, ParamSpec, cast

import attrs

from reactantserver.config import GatewaySchedulingConfig, SchedulerConfig
from reactantserver.config.schema import Discipline
from reactantserver.errors import ResourceExhausted
from reactantserver.floatmath import exp, expovariate, log
from reactantserver.floatmath import pow as fpow
from reactantserver.gateway.core.control import LptController
from reactantserver.gateway.core.estimates import Trigger
from reactantserver.gateway.core.packing import Placement
from reactantserver.gateway.core.routing import Router, Ticket, make_router
from reactantserver.gateway.core.table import ModelSnapshot, RouteTable, WorkerSnapshot, build_table
from reactantserver.scheduling.policy import SchedulingPolicy
from reactantserver.scheduling.records import Batch
from reactantserver.scheduling.simulate import ModelSpec
from reactantserver.weights.policy import CachePlan, Hit, WeightCachePolicy

from .host import HostCosts, HostModel, Hosts
from .report import (
    FleetModelReport,
    FleetReport,
    FleetWorkerReport,
    LoadEvent,
    RepackEvent,
    moved_models,
    percentile,
)

_P = ParamSpec("_P")

__all__ = [
    "ClosedLoop",
    "FleetModel",
    "FleetSimulation",
    "FleetWorker",
    "offered_fleet_load",
    "simulate_fleet",
    "zipf_fleet_catalog",
]


@attrs.frozen(kw_only=True)
class FleetModel:
    """One model of the catalog, as measured on a worker."""

    name: str
    #: Device seconds of one dispatch at each compiled batch size.
    costs: Mapping[int, float]
    #: Weight bytes.
    nbytes: int = 0
    #: Requests per second (open loop), or relative popularity (closed loop).
    rate: float = 0.0
    #: Each request's rows are drawn uniformly from these.
    rows: tuple[int, ...] = (1,)

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.costs))

    @classmethod
    def from_spec(cls, spec: ModelSpec, nbytes: int = 0) -> FleetModel:
        """A single-worker simulator model (``simulate.ModelSpec``) for the fleet."""
        return cls(
            name=spec.name,
            costs={size: spec.cost(size) for size in spec.batch_sizes},
            nbytes=nbytes,
            rate=spec.rate,
            rows=spec.rows,
        )


@attrs.frozen(kw_only=True)
class FleetWorker:
    """One simulated worker (one GPU)."""

    name: str
    #: On-demand weight budget in bytes (``weight_cache_max_bytes``); 0 = cache off, every
    #: model resident.
    budget: int = 0
    #: Host-to-device transfer bandwidth, bytes per second.
    bandwidth: float = 10e9
    #: Fixed cost of each weight load, seconds (allocation, launch).
    load_latency: float = 0.0
    discipline: Discipline = "fifo"
    max_queue_depth: int = 1024
    prefetch: bool = True
    #: Worker CPU seconds per request, serial with execution: the RPC path's decoding and
    #: encoding on the worker (its event loop shares the GIL and the cores with the device
    #: thread on a CPU worker). A batch holds the worker for ``costs[size] + request_seconds
    #: x len(batch.requests)``; 0 = the worker's RPC path is free (a GPU worker, roughly).
    #: Not used with ``host`` (``host_costs`` says the same, on the host's cores).
    request_seconds: float = 0.0
    #: The machine it runs on (a name of ``simulate_fleet(hosts=...)``): its event loop,
    #: device thread and copy engine then share that host's cores with everything else on
    #: it (:mod:`.host`), spending ``host_costs``. None: a machine whose cores never slow it.
    host: str | None = None
    host_costs: HostCosts = attrs.field(factory=HostCosts)
    #: Measured / expected time of loads and of executions (calibrate's samples): each
    #: load's and each execution's time is its expected one times a draw from these
    #: (empty: exactly the expected time).
    load_spread: tuple[float, ...] = ()
    cost_spread: tuple[float, ...] = ()


@attrs.frozen(kw_only=True)
class ClosedLoop:
    """``clients`` concurrent clients, each waiting ``think`` seconds between requests."""

    clients: int
    think: float = 0.0


class _Worker:
    """One simulated worker: the real policies plus a device and a copy engine."""

    def __init__(self, spec: FleetWorker, models: Sequence[FleetModel]) -> None:
        self.spec = spec
        self.policy = SchedulingPolicy(
            SchedulerConfig(discipline=spec.discipline, max_queue_depth=spec.max_queue_depth)
        )
        self.cache = WeightCachePolicy(spec.budget) if spec.budget > 0 else None
        self.costs = {m.name: m.costs for m in models}
        self.nbytes = {m.name: m.nbytes for m in models}
        for m in models:
            self.policy.add_model(m.name, m.batch_sizes)
            for size, seconds in m.costs.items():
                self.policy.seed_cost(m.name, size, seconds)
            if self.cache is not None:
                # A host copy is instantaneous here: the registration's plan is done at once.
                self.cache.done(self.cache.register(m.name, m.nbytes))
        self.batch: Batch | None = None
        self.executing = False
        #: Since when the taken batch waits for its weights (None: not waiting).
        self.waiting_since: float | None = None
        self.engine_free = 0.0
        self.loading: set[str] = set()
        #: Plans handed out by the cache, by id, with the loads each still waits for: a
        #: plan is reported ``done`` when its last load finished, as the real driver does.
        self.plans: dict[int, tuple[CachePlan, int]] = {}
        # Its threads on the host (host contention, :mod:`.host`), and what it spends
        # there, read once: the simulator asks for them several times per request.
        self.host = spec.host
        self.loop = f"{spec.name}.loop"
        self.device = f"{spec.name}.device"
        self.copy = f"{spec.name}.copy"
        hosted = spec.host is not None
        costs = spec.host_costs
        #: Loop CPU each way of a request (decoding it; encoding its answer).
        self.half_request = costs.request_seconds / 2 if hosted else 0.0
        self.batch_seconds = costs.batch_seconds
        self.execution_threads = costs.execution_threads
        self.inline_seconds = costs.inline_seconds
        self.load_threads = costs.load_threads if hosted else 0.0
        # Window accounting.
        self.compute = 0.0
        self.request_cpu = 0.0
        self.loading_only = 0.0
        self.loads = 0
        self.load_seconds = 0.0
        self.dispatches = 0
        self.rows = 0
        self.served: Counter[str] = Counter()


class FleetSimulation:
    """One run (see the module docstring); :func:`simulate_fleet` is the usual entry, with
    the same arguments.

    ``hosts``: the machines the workers run on (``FleetWorker.host``), whose cores they
    share with the gateway and the load generator placed there (:mod:`.host`).
    ``placement`` (lpt_packing): model -> workers, fixed for the whole run (the fill router
    routes by it, the controller never repacks): a planner's placement on known traffic.
    """

    def __init__(
        self,
        models: Sequence[FleetModel],
        workers: Sequence[FleetWorker],
        gateway: GatewaySchedulingConfig,
        *,
        duration: float,
        warmup: float = 0.0,
        seed: int = 0,
        health_interval: float = 1.0,
        closed_loop: ClosedLoop | None = None,
        network_delay: float = 0.0,
        operator_repacks: Sequence[float] = (),
        hosts: Hosts | None = None,
        placement: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        if operator_repacks and gateway.mode != "lpt_packing":
            raise ValueError(f"operator repacks need mode lpt_packing; got {gateway.mode}")
        if placement is not None and gateway.mode != "lpt_packing":
            raise ValueError(f"a fixed placement needs mode lpt_packing; got {gateway.mode}")
        self.hosts = hosts
        self.host_models: dict[str, HostModel] = (
            {name: hosts.model(name) for name in hosts.cores} if hosts is not None else {}
        )
        #: Where the load generator and the gateway spend their CPU per request (half each
        #: way), and how much: no host (None) costs no time (:meth:`_cpu`).
        #: And what more each way costs that finds its loop idle (its wake-up).
        self._clients: tuple[str | None, float, float] = (
            (hosts.clients, hosts.client_seconds / 2, hosts.client_wake_seconds / 2)
            if hosts
            else (None, 0.0, 0.0)
        )
        self._gateway: tuple[str | None, float, float] = (
            (hosts.gateway, hosts.gateway_seconds / 2, hosts.gateway_wake_seconds / 2)
            if hosts
            else (None, 0.0, 0.0)
        )
        named = [w.host for w in workers]
        if hosts is not None:
            named += [hosts.gateway, hosts.clients]
        unknown = sorted({h for h in named if h is not None and h not in self.host_models})
        if unknown:
            raise ValueError(f"hosts {unknown} are not in hosts.cores")
        self.models = {m.name: m for m in models}
        self.workers = {w.name: _Worker(w, models) for w in workers}
        self.gateway = gateway
        self.duration = duration
        self.warmup = warmup
        self.health_interval = health_interval
        self.closed_loop = closed_loop
        self.delay = network_delay
        self.rng = random.Random(seed)
        #: The draws of loads' and executions' spreads, apart from the arrivals' draws (a
        #: fleet without spreads sees the same arrivals as before they existed).
        self._spread_rng = random.Random(f"{seed}:spread")
        self.table: RouteTable | None = None
        self.controller = LptController(gateway) if gateway.mode == "lpt_packing" else None
        self.router: Router = (
            self.controller.router if self.controller is not None else make_router(gateway)
        )
        #: A placement fixed for the whole run (the planner's: the packer on known traffic):
        #: the fill router routes by it and the controller never repacks.
        self.fixed = (
            Placement.of({m: tuple(ws) for m, ws in placement.items()})
            if placement is not None
            else None
        )
        if self.controller is not None and self.fixed is not None:
            self.controller.router.set_placement(self.fixed.models)
        #: The closed loop's draw: names and cumulative popularity, computed once.
        self._names = sorted(self.models)
        self._popularity = list(itertools.accumulate(self.models[n].rate for n in self._names))
        self._host_busy_at_warmup: dict[str, float] = {}
        #: Requests routed and not yet answered or refused (what a fleet falling behind
        #: piles up).
        self.outstanding = 0
        self.arrivals: Counter[str] = Counter()
        self.latencies: dict[str, list[float]] = {m: [] for m in self.models}
        self.rejected: Counter[str] = Counter()
        self.model_rows: Counter[str] = Counter()
        self.model_batches: Counter[str] = Counter()
        self.model_workers: dict[str, set[str]] = {m: set() for m in self.models}
        self.warnings: list[str] = []
        self.operator_repacks = tuple(sorted(operator_repacks))
        self.repack_log: list[RepackEvent] = []
        self.load_log: list[LoadEvent] = []
        self._events: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.now = 0.0

    # ------------------------------------------------------------------ events

    def at(self, t: float, action: Callable[..., None], *args: Any) -> None:
        _push(self._events, (t, next(self._seq), action, args))

    def stop(self) -> None:
        """End the run now (from an event scheduled with :meth:`at`): the report covers
        the window up to this moment."""
        self.duration = max(self.now, self.warmup + 1e-9)

    def run(self) -> FleetReport:
        self._probe()
        if self.host_models:
            self.at(self.warmup, self._mark_hosts)
        for t in self.operator_repacks:
            self.at(t, self._repack, "operator")
        if self.closed_loop is None:
            for name, model in sorted(self.models.items()):
                if model.rate > 0:
                    self.at(expovariate(self.rng.random(), model.rate), self._poisson, name)
        else:
            for client in range(self.closed_loop.clients):
                self.at(0.0, self._client, client)
        events = self._events
        while events:
            t, _, action, args = _pop(events)
            if t > self.duration:
                break
            self.now = t
            action(*args)
        return self._report()

    def _poisson(self, name: str) -> None:
        model = self.models[name]
        rng = self.rng
        self._send(name, rng.choice(model.rows), None)
        self.at(self.now + expovariate(rng.random(), model.rate), self._poisson, name)

    def _client(self, client: int) -> None:
        names = self._names
        name = self.rng.choices(names, cum_weights=self._popularity)[0]
        self._send(name, self.rng.choice(self.models[name].rows), client)

    def _send(self, name: str, rows: int, client: int | None) -> None:
        """A client sends a request (its own CPU first, on a host that has it)."""
        self._edge(self._clients, "clients", self._arrive, name, rows, client, self.now)

    def _arrive(self, name: str, rows: int, client: int | None, sent: float) -> None:
        """The gateway receives it (its CPU on the way in), then routes it."""
        self._edge(self._gateway, "gateway", self._route, name, rows, client, sent)

    def _route(self, name: str, rows: int, client: int | None, sent: float) -> None:
        self.arrivals[name] += 1
        self.outstanding += 1
        ticket = self.router.choose(name, rows, self.now)
        self.at(self.now + self.delay, self._receive, ticket, rows, client, sent)

    def _receive(self, ticket: Ticket, rows: int, client: int | None, sent: float) -> None:
        """The worker decodes it on its event loop, then queues it."""
        w = self.workers[ticket.worker]  # type: ignore[index]
        self._cpu(w.host, w.loop, w.half_request, self._submit, ticket, rows, client, sent)

    def _submit(self, ticket: Ticket, rows: int, client: int | None, sent: float) -> None:
        worker = self.workers[ticket.worker]  # type: ignore[index]
        try:
            worker.policy.submit(ticket.model, (ticket, client, sent), now=self.now, rows=rows)
        except ResourceExhausted:
            self.outstanding -= 1
            self.router.release(ticket, "error")
            if sent >= self.warmup:
                self.rejected[ticket.model] += 1
            self._next_client(client)
            return
        self._kick(worker)

    def _next_client(self, client: int | None) -> None:
        if client is not None and self.closed_loop is not None:
            self.at(self.now + self.closed_loop.think, self._client, client)

    # ------------------------------------------------------------------ devices

    def _kick(self, w: _Worker) -> None:
        """Start the next batch on an idle worker (or retry a blocked weight acquire)."""
        if w.executing:
            return
        if w.batch is None:
            decision = w.policy.next_batch(self.now)
            w.batch = decision.batch
            if w.batch is None:
                return
        batch = w.batch
        if w.cache is None:
            self._execute(w, batch)
            return
        weights = w.cache.acquire(batch.model)
        if isinstance(weights, Hit):
            self._execute(w, batch)
            return
        if w.waiting_since is None:
            w.waiting_since = self.now
        if isinstance(weights, CachePlan):
            self._transfer(w, weights)
        # Wait: a load that blocks it is in flight; its completion kicks again.

    def _transfer(self, w: _Worker, plan: CachePlan) -> None:
        assert w.cache is not None
        if not plan.load:  # evictions and host copies take no simulated time
            w.cache.done(plan)
            return
        w.plans[id(plan)] = (plan, len(plan.load))
        threads = w.load_threads
        for name in plan.load:
            expected = w.nbytes[name] / w.spec.bandwidth + w.spec.load_latency
            seconds = self._drawn(expected, w.spec.load_spread)
            if threads > 0:
                # A copy by the host's CPU: on the copy thread, at the share it gets.
                w.loading.add(name)
                self._cpu(w.host, w.copy, seconds * threads, self._copied, w, plan, name,
                          self.now, width=threads)  # fmt: skip
                continue
            start = max(self.now, w.engine_free)
            w.engine_free = start + seconds
            w.loading.add(name)
            self.at(w.engine_free, self._loaded, w, plan, name, seconds, start)

    def _copied(self, w: _Worker, plan: CachePlan, name: str, submitted: float) -> None:
        start = max(submitted, w.engine_free)
        w.engine_free = self.now
        self._loaded(w, plan, name, self.now - start, start)

    def _loaded(self, w: _Worker, plan: CachePlan, name: str, seconds: float, start: float) -> None:
        assert w.cache is not None
        w.cache.loaded(name, seconds)
        w.loading.discard(name)
        _, left = w.plans[id(plan)]
        if left == 1:
            del w.plans[id(plan)]
            w.cache.done(plan)
        else:
            w.plans[id(plan)] = (plan, left - 1)
        if self.now > self.warmup:
            w.loads += 1
            w.load_seconds += seconds
            self.load_log.append(LoadEvent(at=self.now, worker=w.spec.name, model=name))
        self._kick(w)

    def _execute(self, w: _Worker, batch: Batch) -> None:
        if w.waiting_since is not None:
            # The device sat waiting for this batch's weights.
            w.loading_only += self._clip(w.waiting_since, self.now)
            w.waiting_since = None
        if w.cache is not None:
            w.cache.pin_in_use(batch.model)
            if w.spec.prefetch:
                upcoming = w.policy.peek_next(self.now)
                plan = w.cache.prefetch_plan(upcoming) if upcoming is not None else None
                if plan is not None:
                    self._transfer(w, plan)
        w.executing = True
        if w.host is not None:
            # The loop's work for this batch (the decision, gathering, the hand-off), then
            # the execution on the device thread.
            self._cpu(w.host, w.loop, w.batch_seconds, self._run_batch, w, batch)
            return
        # The device runs first, then the worker's per-request CPU (answers encoded, the
        # next requests decoded) before it can start another batch.
        seconds = self._drawn(w.costs[batch.model][batch.size], w.spec.cost_spread)
        cpu = w.spec.request_seconds * len(batch.requests)
        self.at(self.now + seconds + cpu, self._finished, w, batch, seconds, cpu)

    def _run_batch(self, w: _Worker, batch: Batch) -> None:
        """A hosted worker's execution: device time, or CPU on the host's cores."""
        expected = w.costs[batch.model][batch.size]
        seconds = self._drawn(expected, w.spec.cost_spread)
        threads = w.execution_threads
        if expected < w.inline_seconds:  # the worker decides by its learned cost
            # A tiny program runs inline on the loop, as the live worker runs it.
            self._cpu(w.host, w.loop, seconds, self._ran, w, batch, self.now)
        elif threads > 0:
            self._cpu(w.host, w.device, seconds * threads, self._ran, w, batch, self.now,
                      width=threads)  # fmt: skip
        else:
            self.at(self.now + seconds, self._ran, w, batch, self.now)

    def _drawn(self, expected: float, spread: tuple[float, ...]) -> float:
        """``expected`` seconds times one of ``spread``'s measured ratios, each as likely
        (their empirical distribution); exactly ``expected`` with no spread, drawing
        nothing."""
        if not spread:
            return expected
        return expected * spread[int(self._spread_rng.random() * len(spread))]

    def _ran(self, w: _Worker, batch: Batch, started: float) -> None:
        # What the worker's clock measured, contention included: the policy learns it and
        # the compute counters (which the gateway's packer reads) count it, as live.
        self._finished(w, batch, self.now - started, 0.0)

    def _finished(self, w: _Worker, batch: Batch, seconds: float, cpu: float) -> None:
        start = self.now - cpu - seconds
        # The policy learns the device cost only: a live worker's counters exclude RPC CPU.
        w.policy.complete(batch, seconds, self.now)
        if w.cache is not None:
            w.cache.unpin_in_use(batch.model)
        w.executing = False
        w.batch = None
        w.compute += self._clip(start, start + seconds)
        w.request_cpu += self._clip(start + seconds, self.now)
        if start >= self.warmup:
            w.dispatches += 1
            w.rows += batch.rows
            self.model_rows[batch.model] += batch.rows
            self.model_batches[batch.model] += 1
            self.model_workers[batch.model].add(w.spec.name)
        if w.host is None:
            for request in batch.requests:
                ticket, client, sent = request.payload
                self.at(self.now + self.delay, self._back, ticket, client, sent)
            self._kick(w)
            return
        # A live loop takes the next batch and hands it over before the answers' handlers
        # run: the next dispatch is queued on the loop ahead of the encodes.
        self._kick(w)
        work = w.half_request
        for request in batch.requests:
            self._cpu(w.host, w.loop, work, self._reply, *request.payload)

    def _reply(self, ticket: Ticket, client: int | None, sent: float) -> None:
        self.at(self.now + self.delay, self._back, ticket, client, sent)

    def _back(self, ticket: Ticket, client: int | None, sent: float) -> None:
        """The gateway gets the answer (its CPU on the way out), the client reads it."""
        self.outstanding -= 1
        self.router.release(ticket, "ok")
        self._edge(self._gateway, "gateway", self._read, ticket, client, sent)

    def _read(self, ticket: Ticket, client: int | None, sent: float) -> None:
        self._edge(self._clients, "clients", self._answered, ticket, client, sent)

    def _answered(self, ticket: Ticket, client: int | None, sent: float) -> None:
        if sent >= self.warmup:
            self.latencies[ticket.model].append(self.now - sent)
        self._next_client(client)

    def _clip(self, start: float, end: float) -> float:
        return max(0.0, min(end, self.duration) - max(start, self.warmup))

    # ------------------------------------------------------------------ hosts

    def _edge(
        self,
        who: tuple[str | None, float, float],
        thread: str,
        then: Callable[..., None],
        *args: Any,
    ) -> None:
        """The load generator's or the gateway's loop, one way of a request: its CPU, and
        its wake-up's too when the loop has nothing else to do (``Hosts``)."""
        host, work, wake = who
        if wake and host is not None and not self.host_models[host].queued(thread):
            work += wake
        self._cpu(host, thread, work, then, *args)

    def _cpu(
        self,
        host: str | None,
        thread: str,
        work: float,
        then: Callable[..., None],
        *args: Any,
        width: float = 1.0,
    ) -> None:
        """``work`` core-seconds on ``thread`` of ``host`` (at most ``width`` cores), then
        ``then(*args)``; at once without a host or work."""
        if host is None or work <= 0:
            then(*args)
            return
        model = self.host_models[host]
        model.submit(self.now, thread, work, width, (then, args))
        self._schedule_host(model)

    def _schedule_host(self, model: HostModel) -> None:
        t = model.next_completion()
        if t < math.inf:
            now = self.now
            # max(t, now), pushed as at() pushes it: this runs after every job submitted.
            _push(self._events, (now if now > t else t, next(self._seq), self._host_event,
                                 (model, model.version)))  # fmt: skip

    def _host_event(self, model: HostModel, version: int) -> None:
        if version != model.version:
            return  # completion times changed since: a later event stands for this one
        done = cast("list[tuple[Callable[..., None], tuple[Any, ...]]]", model.advance(self.now))
        for then, args in done:
            then(*args)
        self._schedule_host(model)

    def _mark_hosts(self) -> None:
        for name, model in self.host_models.items():
            self._host_busy_at_warmup[name] = model.busy_seconds(self.now)

    # ------------------------------------------------------------------ gateway

    def _probe(self) -> None:
        """One probe round: snapshots -> route table -> router / controller; repack if due."""
        snapshots = []
        for name, w in self.workers.items():
            stats = w.policy.statistics(self.now)
            snapshots.append(
                WorkerSnapshot(
                    address=name,
                    name=name,
                    discipline=w.spec.discipline,
                    weight_cache_max_bytes=w.spec.budget,
                    models=tuple(
                        ModelSnapshot(
                            name=m,
                            weight_nbytes=w.nbytes[m],
                            max_batch_size=s.max_batch_size,
                            batch_input_name="x",
                            batch_axis=1,
                            queue_depth=s.queue_depth,
                            total_compute_seconds=s.compute_seconds,
                            requests_served=s.requests,
                            rows_served=s.rows,
                            dispatch_count=s.dispatches,
                        )
                        for m, s in stats.models.items()
                    ),
                )
            )
        self.table = build_table(self.table, snapshots)
        if self.controller is not None and self.fixed is None:
            self.controller.update(self.table)
            trigger = self.controller.due()
            if trigger is not None:
                self._repack(trigger)
        else:
            self.router.update(self.table)
        self.at(self.now + self.health_interval, self._probe)

    def _repack(self, trigger: Trigger) -> None:
        """One repack of the controller on its current table, logged."""
        assert self.controller is not None
        before = self.controller.placement.models
        outcome = self.controller.repack(self.now, self.arrivals, trigger)
        self.warnings.extend(outcome.warnings)
        after = dict(outcome.placement.models)
        self.repack_log.append(
            RepackEvent(
                at=self.now,
                trigger=trigger,
                fleet_compute=self.controller.table.fleet_compute_seconds,
                moved=moved_models(before, after),
                placement=after,
            )
        )

    # ------------------------------------------------------------------ report

    def _report(self) -> FleetReport:
        window = self.duration - self.warmup
        placement = self.fixed or (
            self.controller.placement if self.controller is not None else None
        )
        workers = []
        for name, w in self.workers.items():
            compute = w.compute / window
            request_cpu = w.request_cpu / window
            loading = w.loading_only / window
            workers.append(
                FleetWorkerReport(
                    name=name,
                    compute=compute,
                    loading=loading,
                    idle=max(0.0, 1.0 - compute - request_cpu - loading),
                    request_cpu=request_cpu,
                    weight_loads=w.loads,
                    load_seconds=w.load_seconds,
                    dispatches=w.dispatches,
                    mean_batch_rows=w.rows / w.dispatches if w.dispatches else 0.0,
                    models=(
                        placement.models_on(name)
                        if placement is not None
                        else tuple(sorted(m for m, ws in self.model_workers.items() if name in ws))
                    ),
                )
            )
        models = tuple(
            FleetModelReport(
                name=name,
                completed=len(self.latencies[name]),
                rejected=self.rejected[name],
                p50=percentile(self.latencies[name], 0.5),
                p99=percentile(self.latencies[name], 0.99),
                mean=(
                    math.fsum(self.latencies[name]) / len(self.latencies[name])
                    if self.latencies[name]
                    else math.nan
                ),
                mean_batch_rows=(
                    self.model_rows[name] / self.model_batches[name]
                    if self.model_batches[name]
                    else 0.0
                ),
                workers=tuple(sorted(self.model_workers[name])),
            )
            for name in sorted(self.models)
        )
        everything = [x for values in self.latencies.values() for x in values]
        repacks = (
            self.controller.cadence.statistics().repacks if self.controller is not None else {}
        )
        return FleetReport(
            mode=self.gateway.mode,
            workers=tuple(workers),
            models=models,
            window=window,
            completed=sum(m.completed for m in models),
            rejected=sum(self.rejected.values()),
            weight_loads=sum(w.loads for w in self.workers.values()),
            repacks=dict(repacks),
            warnings=tuple(dict.fromkeys(self.warnings)),
            p50=percentile(everything, 0.5),
            p99=percentile(everything, 0.99),
            repack_log=tuple(self.repack_log),
            load_log=tuple(self.load_log),
            host_busy={
                name: (model.busy_seconds(self.duration) - self._host_busy_at_warmup.get(name, 0.0))
                / (window * model.capacity)
                for name, model in self.host_models.items()
            },
        )


def _reported(build: Callable[_P, FleetSimulation]) -> Callable[_P, FleetReport]:
    """A function with ``build``'s own typed signature that runs what it builds and returns
    the report: one keyword list (the class's), not a second copy to keep in step."""

    def simulate_fleet(*args: _P.args, **kwargs: _P.kwargs) -> FleetReport:
        """Run one fleet simulation and return its report: the arguments are
        :class:`FleetSimulation`'s (see the module docstring)."""
        return build(*args, **kwargs).run()

    # help() and inspect.signature() show the class's parameters, returning the report.
    signature = inspect.signature(build).replace(return_annotation="FleetReport")
    simulate_fleet.__signature__ = signature  # type: ignore[attr-defined]
    return simulate_fleet


simulate_fleet = _reported(FleetSimulation)


def zipf_fleet_catalog(
    n: int,
    *,
    total_rate: float,
    zipf_s: float = 1.0,
    cost_range: tuple[float, float] = (0.002, 0.008),
    marginal: float = 0.25,
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8),
    bytes_range: tuple[int, int] = (100_000_000, 400_000_000),
    rows: tuple[int, ...] = (1,),
    seed: int = 0,
) -> list[FleetModel]:
    """``n`` models with Zipf popularity (rank r called ~ r^-s often), batch-1 costs and
    weight sizes drawn log-uniformly from the ranges, and per-size costs
    ``base x (1 + marginal x (size - 1))``."""
    rng = random.Random(seed)
    # floatmath, not math or **: the same catalog on every machine (floatmath's docstring).
    weights = [fpow(rank, -zipf_s) for rank in range(1, n + 1)]
    total = math.fsum(weights)
    out = []
    for i in range(n):
        base = exp(rng.uniform(log(cost_range[0]), log(cost_range[1])))
        nbytes = int(exp(rng.uniform(log(bytes_range[0]), log(bytes_range[1]))))
        out.append(
            FleetModel(
                name=f"m{i:02d}",
                costs={s: base * (1 + marginal * (s - 1)) for s in batch_sizes},
                nbytes=nbytes,
                rate=total_rate * weights[i] / total,
                rows=rows,
            )
        )
    return out


def offered_fleet_load(models: Sequence[FleetModel]) -> float:
    """GPU-seconds per second the arrivals ask for at full batches (open loop)."""
    total = 0.0
    for m in models:
        top = max(m.costs)
        total += m.rate * (sum(m.rows) / len(m.rows)) * m.costs[top] / top
    return total
