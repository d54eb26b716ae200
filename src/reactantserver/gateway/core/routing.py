"""The Router seam: which worker a request goes to, and what is in flight where.

Theory of operation
-------------------
A router is a sans-IO object the gateway's I/O calls three ways for every ModelInfer::

    ticket = router.choose(model, items, now)   # ordered replicas; accounted on the first
    worker = ticket.worker                      # send there
    worker = router.failover(ticket)            # only on NOT_FOUND / UNAVAILABLE / no
                                                # connection: accounting moves to the next
                                                # replica, or None when none is left
    router.release(ticket, outcome)             # exactly once, on every path: success,
                                                # error, cancel, deadline

``choose`` reads the current :class:`~reactantserver.gateway.core.table.RouteTable` (swapped in
with :meth:`Router.update`) and the router's own in-flight accounting, never the clock:
``now`` is stamped on the ticket for the caller's latency bookkeeping. It raises
``NotFound`` when no ready worker serves the model (the I/O then refreshes the table once
and retries). Its cost is proportional to the model's replica count, never to the
number of models.

In-flight work is counted three ways at once, per (model, worker) and per worker:
requests, items (the batch extent of the batch input), and *work* in the configured
``work_basis``: ``requests`` (1 per request), ``items``, or ``compute`` = items x the
learned cost per item of that model on that worker (the table's EWMA; fleet mean, then 1.0,
before any sample). A ticket remembers the work it added so that release subtracts exactly
that; when a worker's in-flight request count returns to 0 its float sums are reset to 0,
so rounding can never leave a residue. A worker's sums are its
:class:`~reactantserver.gateway.core.inflight.WorkerInflight`'s ``load``, in the registry
(``router.inflight``) that the gateway's pool shares: the one count of what is in flight
on each worker, beside its connection's stream slots.

Policies (one class each):

``round_robin``
    Rotate over the replicas that serve the model (per-model cursor over the sorted
    addresses). The failover order is the rest of the rotation.
``least_outstanding``
    The replica whose *worker* has the least in-flight work (all models count: a worker
    busy with a slow model is busy); ties go to fewer requests in flight (work measured as
    zero -- a model whose learned cost is 0, such as a meta model whose glue only waits --
    still makes its worker busy), then by a per-model rotation, so equal workers share
    evenly and the choice is deterministic. Failover order: by the same key.
``lpt_packing`` (fill routing, :class:`FillRouter`)
    Only the model's *placed* replicas (from the packer) are candidates. A replica's
    quantum is ``Q = max(1, round(fill_factor x its max batch size))`` items. ``run``: keep
    sending to the replica whose run is open until Q items went to it in this run, or it
    drained (nothing of the model in flight there), or it fell a full quantum behind
    (``out // Q > min over replicas of out // Q``); then open the next run on the replica
    with the least ``out // Q``, then (``fill_least``) the least in-flight work on its
    worker, then rotation (``fill_rr`` skips the load). ``spread``: every request to the
    replica with the fewest in-flight items, then load, then rotation. Failover: the chosen
    replica, the other placed ones by (``out // Q``, out, address), then replicas that serve
    the model without being placed. A model with no placement yet is routed round robin.

    The original's ``inflight`` fill mode (argmin of ``(-out)`` within a quantum) is not
    here: it keeps choosing the replica with the *most* items in flight, which parks a
    model on one GPU; the configuration refuses it.

**When nothing serves a model.** :func:`refusal` is the one rule for what a call for a
model with no ready replica is told, after one refresh of the table (pure, given the
table). Clients retry UNAVAILABLE and give up on NOT_FOUND, so NOT_FOUND is kept for
names that are really not here:

* some worker lists the model (loading, failed, not placed): UNAVAILABLE, naming them;
* the model is *known* (a worker listed it since the gateway started, or it is one of
  ``expected_models``: what a node file assigns) and some worker is not ready -- down,
  restarting, not started yet: UNAVAILABLE, "no worker serving it is ready (k of n
  workers ready)". A restart of every worker is a pause for its clients, not an error;
* known, but every worker is ready and none lists it: it was unloaded or removed,
  NOT_FOUND ("no longer served");
* never seen nor expected, and no worker ready at all: UNAVAILABLE. With nobody to ask,
  nobody can say the name is absent (every worker down before the gateway started, or all
  of them restarting): the closest known names are a hint, not a verdict;
* never seen nor expected, with a worker ready to say so: NOT_FOUND, with the closest
  known names (``did you mean``).

Invariants (``tests/gateway/test_gateway_routing.py``): each ticket is released exactly once (a
second release is a ``LifecycleError``); in-flight counts never go negative and return to
0 when every ticket is released; a ticket's replica order never repeats a worker; round
robin's per-replica counts differ by at most one over any full rotation; least_outstanding
picks a least-loaded replica; fill routing opens every placed replica within one rotation of
runs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

import attrs

from reactantserver.config.schema import GatewaySchedulingConfig, WorkBasis
from reactantserver.errors import LifecycleError, NotFound, Unavailable, quoted
from reactantserver.names import did_you_mean

from .inflight import Inflight, Load
from .table import Replica, RouteTable

Outcome = Literal["ok", "error", "cancelled", "deadline"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "error", "cancelled", "deadline")
FillMode = Literal["run", "spread"]


@attrs.define(eq=False)
class Ticket:
    """One request's route: the replicas to try in order, and where it is accounted now."""

    seq: int
    model: str
    items: int
    #: Worker addresses in the order to try (first choice first); never repeats.
    replicas: tuple[str, ...]
    started: float
    #: The worker to send to now: ``replicas[position]`` (None after failover ran out).
    worker: str | None
    #: Index into ``replicas`` of the worker holding the request; ``len(replicas)`` once
    #: failover ran out.
    position: int = 0
    #: Work accounted on the current worker (what release subtracts).
    work: float = 0.0
    #: The accounts the work is in (the router's, for the current worker).
    accounts: _PairAccounts | None = None
    released: bool = False

    def advance(self) -> str | None:
        """Move to the next replica; the new :attr:`worker`."""
        self.position += 1
        position = self.position
        self.worker = self.replicas[position] if position < len(self.replicas) else None
        return self.worker


@attrs.frozen(kw_only=True)
class ReplicaStatistics:
    """In-flight and routed counts of one (model, worker) pair."""

    model: str
    worker: str
    outstanding_requests: int
    outstanding_items: int
    outstanding_work: float
    routed_requests: int
    routed_items: int
    #: The fill quantum Q in items (lpt_packing; 0 for the other modes).
    fill_quantum: int = 0


@attrs.frozen(kw_only=True)
class WorkerLoad:
    """In-flight work on one worker, all models together."""

    worker: str
    requests: int
    items: int
    work: float


@attrs.frozen(kw_only=True)
class RouterStatistics:
    """A frozen snapshot for metrics (``gateway_replica_*``, ``gateway_worker_inflight_work``)."""

    mode: str
    work_basis: str
    replicas: tuple[ReplicaStatistics, ...]
    workers: Mapping[str, WorkerLoad]
    outstanding: int
    chosen: int
    failovers: int
    #: Tickets whose failover found no replica left.
    exhausted: int
    released: Mapping[str, int]


class _PairAccounts:
    """One (model, worker) pair's in-flight sums and routed counts, with its worker's
    in-flight sums: everything a request there adds to (found once per ticket)."""

    __slots__ = ("cost", "pair", "routed_items", "routed_requests", "table", "worker")

    def __init__(self, worker: Load) -> None:
        self.pair = Load()
        self.worker = worker
        self.routed_requests = 0
        self.routed_items = 0
        #: The pair's compute seconds per item in ``table`` (read once per route table).
        self.table: RouteTable | None = None
        self.cost = 1.0


class Router:
    """The seam (see the module docstring); subclasses supply :meth:`_order`."""

    mode = "router"

    def __init__(
        self,
        table: RouteTable | None = None,
        *,
        work_basis: WorkBasis = "compute",
        inflight: Inflight | None = None,
    ) -> None:
        self.table = table if table is not None else RouteTable()
        self.work_basis: WorkBasis = work_basis
        #: Each worker's in-flight counts (:mod:`.inflight`), shared with the pool: the
        #: router accounts its load there.
        self.inflight = inflight if inflight is not None else Inflight()
        #: (model, worker) -> its accounts (made on first use, read with .get() where
        #: absence means "none"), and the workers routed to so far.
        self._accounts: dict[tuple[str, str], _PairAccounts] = {}
        self._workers: dict[str, Load] = {}
        self._seq = itertools.count()
        self._chosen = 0
        self._failovers = 0
        self._exhausted = 0
        self._released: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        #: Requests routed per model (one per ``choose``): lpt_packing's arrival counts.
        self._arrivals: dict[str, int] = {}
        #: model -> (its replicas in the current table, their rotations): built once per
        #: table, not per request.
        self._rotations: dict[str, tuple[tuple[Replica, ...], tuple[tuple[str, ...], ...]]] = {}
        #: model -> the rotation the next request of it begins with.
        self._cursor: dict[str, int] = {}

    # ------------------------------------------------------------------ the seam

    def update(self, table: RouteTable) -> None:
        """Swap in a new route table (tickets in flight keep their accounting)."""
        self.table = table
        self._rotations.clear()

    def choose(
        self, model: str, items: int, now: float, replicas: tuple[Replica, ...] | None = None
    ) -> Ticket:
        """Route one request of ``items`` items; raises ``NotFound`` if nothing serves it.
        ``replicas``: the table's replicas of ``model``, when the caller has read them."""
        if replicas is None:
            replicas = self.table.replicas(model)
        if not replicas:
            raise NotFound(f"model {quoted(model)} is not served by any ready worker")
        items = max(1, items)
        order = self._order(model, replicas, items)
        ticket = Ticket(next(self._seq), model, items, order, now, order[0])
        self._account(ticket)
        self._chosen += 1
        self._arrivals[model] = self._arrivals.get(model, 0) + 1
        return ticket

    def failover(self, ticket: Ticket) -> str | None:
        """Move ``ticket`` to its next replica; None (and nothing accounted) if none is left."""
        if ticket.released:
            raise LifecycleError(f"gateway router: failover of released ticket {ticket.seq}")
        if ticket.worker is None:
            return None
        self._unaccount(ticket)
        self._failovers += 1
        worker = ticket.advance()
        if worker is None:
            self._exhausted += 1
            return None
        self._account(ticket)
        return worker

    def release(self, ticket: Ticket, outcome: Outcome = "ok") -> None:
        """The request is over (answered, failed, cancelled or expired). Exactly once."""
        if ticket.released:
            raise LifecycleError(f"gateway router: ticket {ticket.seq} released twice")
        ticket.released = True
        if ticket.worker is not None:
            self._unaccount(ticket)
        self._released[outcome] += 1

    def statistics(self) -> RouterStatistics:
        replicas = []
        for (model, worker), accounts in sorted(self._accounts.items()):
            pair = accounts.pair
            replicas.append(
                ReplicaStatistics(
                    model=model,
                    worker=worker,
                    outstanding_requests=pair.requests,
                    outstanding_items=pair.items,
                    outstanding_work=pair.work,
                    routed_requests=accounts.routed_requests,
                    routed_items=accounts.routed_items,
                    fill_quantum=self.quantum_of(model, worker),
                )
            )
        workers = {
            w: WorkerLoad(worker=w, requests=a.requests, items=a.items, work=a.work)
            for w, a in sorted(self._workers.items())
        }
        return RouterStatistics(
            mode=self.mode,
            work_basis=self.work_basis,
            replicas=tuple(replicas),
            workers=MappingProxyType(workers),
            outstanding=sum(a.requests for a in self._workers.values()),
            chosen=self._chosen,
            failovers=self._failovers,
            exhausted=self._exhausted,
            released=MappingProxyType(dict(self._released)),
        )

    def arrivals(self) -> dict[str, int]:
        """Cumulative requests routed per model (a copy): what lpt_packing's rate EWMA
        reads at each repack. Failovers do not count again."""
        return dict(self._arrivals)

    # ------------------------------------------------------------ for policies

    def load(self, worker: str) -> float:
        """In-flight work on ``worker`` in the configured basis (all models)."""
        load = self._workers.get(worker)
        return 0.0 if load is None else load.work

    def requests(self, worker: str) -> int:
        """Requests in flight on ``worker`` (all models)."""
        load = self._workers.get(worker)
        return 0 if load is None else load.requests

    def outstanding_items(self, model: str, worker: str) -> int:
        accounts = self._accounts.get((model, worker))
        return 0 if accounts is None else accounts.pair.items

    def _order(self, model: str, replicas: tuple[Replica, ...], items: int) -> tuple[str, ...]:
        raise NotImplementedError

    def _next_rotation(self, model: str, replicas: tuple[Replica, ...]) -> tuple[str, ...]:
        """``replicas``' workers beginning one further along than the last request of
        ``model`` began (round robin)."""
        cursor = self._cursor.get(model, 0)
        self._cursor[model] = cursor + 1
        memo = self._rotations.get(model)
        if memo is None or memo[0] is not replicas:
            memo = self._rotations[model] = (replicas, _rotations(replicas))
        rotations = memo[1]
        return rotations[cursor % len(rotations)]

    def quantum_of(self, model: str, worker: str) -> int:
        return 0

    # ----------------------------------------------------------------- private

    def _account(self, ticket: Ticket) -> None:
        worker = ticket.worker
        assert worker is not None
        model, items = ticket.model, ticket.items
        key = (model, worker)
        accounts = self._accounts.get(key)
        if accounts is None:
            load = self._workers.get(worker)
            if load is None:
                load = self._workers[worker] = self.inflight.worker(worker).load
            accounts = self._accounts[key] = _PairAccounts(load)
        basis = self.work_basis
        if basis == "requests":
            work = 1.0
        elif basis == "items":
            work = float(items)
        else:
            table = self.table
            if accounts.table is not table:
                accounts.table, accounts.cost = table, table.cost_per_item(model, worker)
            work = items * accounts.cost
        ticket.work = work
        ticket.accounts = accounts
        accounts.pair.add(items, work)
        accounts.worker.add(items, work)
        accounts.routed_requests += 1
        accounts.routed_items += items

    def _unaccount(self, ticket: Ticket) -> None:
        accounts = ticket.accounts
        assert accounts is not None and ticket.worker is not None
        ticket.accounts = None
        accounts.pair.remove(ticket.items, ticket.work)
        accounts.worker.remove(ticket.items, ticket.work)


def _rotations(replicas: tuple[Replica, ...]) -> tuple[tuple[str, ...], ...]:
    """Every rotation of the replicas' workers in table order: the k-th begins at the k-th."""
    workers = tuple(r.worker for r in replicas)
    return tuple(workers[k:] + workers[:k] for k in range(len(workers)))


class RoundRobinRouter(Router):
    """``round_robin``: rotate over the model's replicas."""

    mode = "round_robin"

    def _order(self, model: str, replicas: tuple[Replica, ...], items: int) -> tuple[str, ...]:
        return self._next_rotation(model, replicas)


class LeastOutstandingRouter(Router):
    """``least_outstanding``: the replica whose worker has the least in-flight work."""

    mode = "least_outstanding"

    def _order(self, model: str, replicas: tuple[Replica, ...], items: int) -> tuple[str, ...]:
        n = len(replicas)
        cursor = self._cursor.get(model, 0)
        self._cursor[model] = cursor + 1
        keyed = sorted(
            (self.load(r.worker), self.requests(r.worker), (i - cursor) % n, r.worker)
            for i, r in enumerate(replicas)
        )
        return tuple(key[-1] for key in keyed)


@attrs.frozen(kw_only=True)
class FillPolicy:
    """One model's fill routing parameters, resolved from the scheduling config."""

    mode: FillMode = "run"
    factor: float = 1.0
    policy: Literal["fill_rr", "fill_least"] = "fill_least"


def fill_policy(config: GatewaySchedulingConfig, model: str) -> FillPolicy:
    """``model``'s fill parameters: its ``scheduling.models`` entry over the defaults."""
    entry = config.models.get(model)
    mode = entry.fill_mode if entry is not None and entry.fill_mode is not None else None
    factor = entry.fill_factor if entry is not None and entry.fill_factor is not None else None
    chosen_mode = mode or config.routing_fill_mode
    if chosen_mode not in ("run", "spread"):
        raise ValueError(f"fill mode {chosen_mode!r} is not run or spread")
    return FillPolicy(
        mode=chosen_mode,
        factor=config.routing_fill_factor if factor is None else factor,
        policy=config.routing_policy,
    )


def quantum(factor: float, max_batch_size: int) -> int:
    """``Q = max(1, round(factor x max_batch_size))`` (half rounds up; unknown size -> 1)."""
    return max(1, math.floor(factor * max(0, max_batch_size) + 0.5))


class _Run:
    __slots__ = ("current", "sent", "turn")

    def __init__(self) -> None:
        self.current: str | None = None
        self.sent = 0
        self.turn = 0


class FillRouter(Router):
    """``lpt_packing``: fill one placed replica's batch before opening the next."""

    mode = "lpt_packing"

    def __init__(
        self,
        table: RouteTable | None = None,
        config: GatewaySchedulingConfig | None = None,
        placement: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        config = config if config is not None else GatewaySchedulingConfig(mode="lpt_packing")
        super().__init__(table, work_basis=config.work_basis)
        self.config = config
        self.placement: Mapping[str, tuple[str, ...]] = MappingProxyType(dict(placement or {}))
        self._runs: dict[str, _Run] = {}
        self._policies: dict[str, FillPolicy] = {}

    def configure(self, config: GatewaySchedulingConfig) -> None:
        """Apply new scheduling knobs (SetSchedulingPolicy / SetModelPlacement)."""
        self.config = config
        self.work_basis = config.work_basis
        self._policies.clear()

    def set_placement(self, placement: Mapping[str, tuple[str, ...]]) -> None:
        """Swap in a new placement (model -> placed worker addresses)."""
        self.placement = MappingProxyType(dict(placement))

    def policy_of(self, model: str) -> FillPolicy:
        policy = self._policies.get(model)
        if policy is None:
            policy = self._policies[model] = fill_policy(self.config, model)
        return policy

    def quantum_of(self, model: str, worker: str) -> int:
        replica = self.table.replica(model, worker)
        if replica is None:
            return 0
        return quantum(self.policy_of(model).factor, replica.max_batch_size)

    def _order(self, model: str, replicas: tuple[Replica, ...], items: int) -> tuple[str, ...]:
        placed = set(self.placement.get(model, ()))
        candidates = tuple(r for r in replicas if r.worker in placed)
        if not candidates:
            return self._next_rotation(model, replicas)
        policy = self.policy_of(model)
        n = len(candidates)
        out = [self.outstanding_items(model, r.worker) for r in candidates]
        quanta = [quantum(policy.factor, r.max_batch_size) for r in candidates]
        behind = [o // q for o, q in zip(out, quanta, strict=True)]
        least = policy.policy == "fill_least"
        run = self._runs.get(model)
        if run is None:
            run = self._runs[model] = _Run()
        index = {r.worker: i for i, r in enumerate(candidates)}

        def load(i: int) -> float:
            return self.load(candidates[i].worker) if least else 0.0

        if policy.mode == "spread":
            first = min(range(n), key=lambda i: (out[i], load(i), (i - run.turn) % n))
            run.turn += 1
        else:
            i = index.get(run.current) if run.current is not None else None
            keep = (
                i is not None and run.sent < quanta[i] and out[i] > 0 and behind[i] <= min(behind)
            )
            if keep:
                assert i is not None
                first = i
            else:
                first = min(range(n), key=lambda j: (behind[j], load(j), (j - run.turn) % n))
                run.turn += 1
                run.current = candidates[first].worker
                run.sent = 0
            run.sent += items
        rest = sorted(
            (j for j in range(n) if j != first),
            key=lambda j: (behind[j], out[j], candidates[j].worker),
        )
        unplaced = tuple(r.worker for r in replicas if r.worker not in placed)
        return (candidates[first].worker, *(candidates[j].worker for j in rest), *unplaced)


def refusal(table: RouteTable, model: str, workers: int) -> NotFound | Unavailable:
    """What a call for ``model`` is told when no ready worker serves it (the module
    docstring's rule). ``workers``: how many workers are behind the gateway (its
    endpoints; the table lacks those not probed yet)."""
    workers = max(workers, len(table.workers))
    ready = len(table.ready_workers)
    listing = sorted(w.name for w in table.workers.values() if model in w.models)
    if listing:
        return Unavailable(
            f"model {quoted(model)} is not ready on any worker (listed by {', '.join(listing)}); "
            "retry when it has loaded"
        )
    if model in table.known:
        if ready < workers:
            return Unavailable(
                f"model {quoted(model)}: no worker serving it is ready ({ready} of {workers} "
                "workers ready); retry when one is back"
            )
        return NotFound(
            f"model {quoted(model)} is no longer served behind this gateway (all {workers} workers "
            "are ready and none lists it: it was unloaded or removed)"
        )
    if ready == 0:
        return Unavailable(
            f"model {model!r}: no worker behind this gateway is ready (0 of {workers}) to say "
            f"whether it serves it; retry when one is back{did_you_mean(model, table.known)}"
        )
    return NotFound(
        f"model {quoted(model)} is not served by any worker behind this gateway ({ready} of "
        f"{workers} workers ready){did_you_mean(model, table.known)}"
    )


def make_router(config: GatewaySchedulingConfig, table: RouteTable | None = None) -> Router:
    """The router for ``scheduling.mode``."""
    if config.mode == "round_robin":
        return RoundRobinRouter(table, work_basis=config.work_basis)
    if config.mode == "least_outstanding":
        return LeastOutstandingRouter(table, work_basis=config.work_basis)
    return FillRouter(table, config)
