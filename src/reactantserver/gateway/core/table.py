"""The route table: which ready worker serves which model, and what an item costs there.

Theory of operation
-------------------
The prober (the gateway's I/O) asks every worker, every ``health_interval_seconds``,
whether it is ready, which models it serves ready, and for its ``ModelControlStatus``. It
converts each answer into a :class:`WorkerSnapshot` (records of our own, so this module
stays free of protobuf) and calls :func:`build_table` with the previous table. The result
is a new immutable :class:`RouteTable` that the I/O swaps in atomically; routers and the
lpt_packing controller only ever read a table.

What a table holds:

* per worker (its id is its endpoint address): name, ready, discipline, residency mode,
  ``weight_cache_max_bytes`` (0 = unlimited) and the models it has loaded with their weight
  bytes, ready or not (:meth:`RouteTable.catalog`: what lpt_packing places -- an
  explicit-mode worker's model is ready only once placed there);
* per model, the replicas that serve it now (ready workers that report it ready), sorted by
  address, each with the max batch size, batch input name and 1-based wire batch axis that
  worker reports (0 = no batch axis: a request counts as one item);
* per (model, worker), the learned **cost per item**: an EWMA of
  Δ``total_compute_seconds`` / Δ``rows_served`` between successive snapshots. Where a pair
  has no sample yet, :meth:`RouteTable.cost_per_item` falls back to the fleet mean of the
  learned costs, then to 1.0 (REFERENCE section 7, "work_basis");
* monotone fleet totals: per model compute seconds, requests and rows, and fleet compute
  seconds, accumulated from the positive deltas of every worker's counters. A worker that
  restarts reports smaller counters; that is taken as a reset (no sample, new baseline), so
  the totals never go backwards. The lpt_packing estimator and repack cadence read them;
* the **known** models: every model some worker has listed (ready or not) since the gateway
  started, and the ones it was told to expect (``expected_models``: a node's gateway gets
  the models its node file assigns to its workers). A table only ever adds to them. They
  decide what a call for a model no ready worker serves is told
  (:func:`~.routing.refusal`): a known model is retryable while its workers are away, a
  name never seen is NOT_FOUND.

Invariants: a model's replica tuple holds only ready workers and no duplicates; a table is
never mutated after construction; ``build_table`` is a pure function of its arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

import attrs

#: Smoothing of the per-(model, worker) cost-per-item EWMA, per snapshot that carries new
#: rows. The first sample seeds it. Costs per item move with batch fill, which moves with
#: load, so the average must follow within a few probe rounds.
COST_ALPHA = 0.3


@attrs.frozen(kw_only=True)
class ModelSnapshot:
    """One model as one worker reported it (a ``ModelStatus`` plus readiness)."""

    name: str
    #: The worker answers ModelReady true for it (it is in RepositoryIndex(ready)).
    ready: bool = True
    #: ModelControlStatus lists it: the model is loaded there, ready or not (an explicit-mode
    #: worker's model whose weights are not on the device is loaded and not ready). False
    #: for a model RepositoryIndex lists but the worker has not loaded (compiling, failed,
    #: unloaded): it has no weight bytes to place.
    loaded: bool = True
    #: Its residency floor there is ``device`` (ModelControlStatus ``PINNED_DEVICE``).
    pinned: bool = False
    weight_nbytes: int = 0
    max_batch_size: int = 0
    batch_input_name: str = ""
    #: 1-based position of the batch axis in the wire (row-major) shape; 0 = none.
    batch_axis: int = 0
    queue_depth: int = 0
    #: Cumulative counters since the model was loaded on that worker.
    total_compute_seconds: float = 0.0
    requests_served: int = 0
    rows_served: int = 0
    dispatch_count: int = 0


@attrs.frozen(kw_only=True)
class WorkerSnapshot:
    """What one probe round learned about one worker. ``ready=False`` (probe failed or
    ServerReady false) takes the worker out of routing; its models are then ignored."""

    address: str
    name: str = ""
    ready: bool = True
    discipline: str = ""
    residency_mode: str = "self_managed"
    #: The on-demand weight budget; 0 = cache off, memory is no constraint.
    weight_cache_max_bytes: int = 0
    models: tuple[ModelSnapshot, ...] = ()


@attrs.frozen(kw_only=True)
class WorkerInfo:
    """A worker as the table knows it."""

    address: str
    name: str
    ready: bool
    discipline: str
    residency_mode: str
    weight_cache_max_bytes: int
    #: Every model the worker reported (ready or not), sorted.
    models: tuple[str, ...] = ()
    #: The models it has loaded (ready or not), with their weight bytes: what lpt_packing
    #: may place there.
    loaded: Mapping[str, int] = attrs.field(factory=lambda: MappingProxyType({}))
    #: The models pinned on its device (floor ``device``), sorted: what an explicit-mode
    #: worker holds, for lpt_packing to reconcile with the placement.
    pinned: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class Replica:
    """One worker serving one model, with what a router needs to count items."""

    worker: str
    max_batch_size: int
    batch_input_name: str
    batch_axis: int
    weight_nbytes: int


@attrs.frozen(kw_only=True)
class ModelTotals:
    """Monotone fleet-wide totals of one model (sums of positive counter deltas)."""

    compute_seconds: float = 0.0
    requests: int = 0
    rows: int = 0


@attrs.frozen(kw_only=True)
class _Counters:
    compute: float
    requests: int
    rows: int


@attrs.frozen(kw_only=True)
class RouteTable:
    """An immutable routing snapshot (see the module docstring)."""

    generation: int = 0
    workers: Mapping[str, WorkerInfo] = attrs.field(factory=lambda: MappingProxyType({}))
    #: model -> its ready replicas, sorted by worker address.
    models: Mapping[str, tuple[Replica, ...]] = attrs.field(factory=lambda: MappingProxyType({}))
    #: (model, worker) -> learned seconds of compute per item.
    costs: Mapping[tuple[str, str], float] = attrs.field(factory=lambda: MappingProxyType({}))
    totals: Mapping[str, ModelTotals] = attrs.field(factory=lambda: MappingProxyType({}))
    fleet_compute_seconds: float = 0.0
    #: Per (model, worker): the last counters seen (the baseline of the next delta).
    baselines: Mapping[tuple[str, str], _Counters] = attrs.field(
        factory=lambda: MappingProxyType({}), repr=False
    )
    #: The mean of ``costs`` (the fallback for pairs with no sample), or None.
    mean_cost: float | None = None
    #: Every model a worker has listed since the gateway started, and the expected ones
    #: (see the module docstring); never shrinks from one table to the next.
    known: frozenset[str] = frozenset()

    def replicas(self, model: str) -> tuple[Replica, ...]:
        """The ready replicas of ``model`` (empty when none serves it)."""
        return self.models.get(model, ())

    def serves(self, model: str) -> bool:
        return bool(self.models.get(model))

    @property
    def ready_workers(self) -> tuple[str, ...]:
        """Addresses of the ready workers, sorted."""
        return tuple(sorted(a for a, w in self.workers.items() if w.ready))

    def cost_per_item(self, model: str, worker: str) -> float:
        """Learned compute seconds per item; else the fleet mean; else 1.0."""
        cost = self.costs.get((model, worker))
        if cost is not None:
            return cost
        return self.mean_cost if self.mean_cost is not None else 1.0

    def catalog(self) -> dict[str, int]:
        """Every model a ready worker has loaded, ready or not, with its weight bytes (the
        largest any worker reports): what lpt_packing places. O(workers x models): read per
        repack, never per request."""
        sizes: dict[str, int] = {}
        for w in self.workers.values():
            if w.ready:
                for name, nbytes in w.loaded.items():
                    sizes[name] = max(sizes.get(name, 0), nbytes)
        for name, replicas in self.models.items():
            sizes.setdefault(name, max((r.weight_nbytes for r in replicas), default=0))
        return dict(sorted(sizes.items()))

    def replica(self, model: str, worker: str) -> Replica | None:
        for r in self.models.get(model, ()):
            if r.worker == worker:
                return r
        return None


def build_table(
    previous: RouteTable | None,
    snapshots: Iterable[WorkerSnapshot],
    *,
    alpha: float = COST_ALPHA,
) -> RouteTable:
    """The next table from the previous one and this round's snapshots (pure).

    Workers absent from ``snapshots`` are dropped; a worker reported not ready stays in
    ``workers`` (so metrics can show it) but serves nothing. Learned costs and counter
    baselines of pairs not seen this round are kept, so a worker that comes back resumes
    with what was learned about it, and so are the known models.
    """
    prev = previous if previous is not None else RouteTable()
    workers: dict[str, WorkerInfo] = {}
    models: dict[str, list[Replica]] = {}
    costs = dict(prev.costs)
    baselines = dict(prev.baselines)
    totals = dict(prev.totals)
    fleet = prev.fleet_compute_seconds
    known = set(prev.known)
    for snap in snapshots:
        if snap.address in workers:
            raise ValueError(f"two snapshots for worker {snap.address!r} in one round")
        workers[snap.address] = WorkerInfo(
            address=snap.address,
            name=snap.name or snap.address,
            ready=snap.ready,
            discipline=snap.discipline,
            residency_mode=snap.residency_mode,
            weight_cache_max_bytes=max(0, snap.weight_cache_max_bytes),
            models=tuple(sorted(m.name for m in snap.models)),
            loaded=MappingProxyType(
                {
                    m.name: m.weight_nbytes
                    for m in sorted(snap.models, key=lambda m: m.name)
                    if m.loaded
                }
            ),
            pinned=tuple(sorted(m.name for m in snap.models if m.pinned)),
        )
        known.update(m.name for m in snap.models)
        if not snap.ready:
            continue
        for m in snap.models:
            key = (m.name, snap.address)
            now = _Counters(
                compute=m.total_compute_seconds, requests=m.requests_served, rows=m.rows_served
            )
            base = baselines.get(key)
            baselines[key] = now
            if base is not None and _advanced(base, now):
                d_compute = now.compute - base.compute
                d_rows = now.rows - base.rows
                total = totals.get(m.name, ModelTotals())
                totals[m.name] = ModelTotals(
                    compute_seconds=total.compute_seconds + d_compute,
                    requests=total.requests + now.requests - base.requests,
                    rows=total.rows + d_rows,
                )
                fleet += d_compute
                if d_rows > 0:
                    sample = d_compute / d_rows
                    old = costs.get(key)
                    costs[key] = sample if old is None else (1 - alpha) * old + alpha * sample
            if m.ready:
                models.setdefault(m.name, []).append(
                    Replica(
                        worker=snap.address,
                        max_batch_size=m.max_batch_size,
                        batch_input_name=m.batch_input_name,
                        batch_axis=m.batch_axis,
                        weight_nbytes=m.weight_nbytes,
                    )
                )
    mean = sum(costs.values()) / len(costs) if costs else None
    return RouteTable(
        generation=prev.generation + 1,
        workers=MappingProxyType(dict(sorted(workers.items()))),
        models=MappingProxyType(
            {name: tuple(sorted(rs, key=lambda r: r.worker)) for name, rs in sorted(models.items())}
        ),
        costs=MappingProxyType(costs),
        totals=MappingProxyType(totals),
        fleet_compute_seconds=fleet,
        baselines=MappingProxyType(baselines),
        mean_cost=mean,
        known=prev.known if len(known) == len(prev.known) else frozenset(known),
    )


def _advanced(base: _Counters, now: _Counters) -> bool:
    """Whether ``now`` continues ``base`` (no counter went backwards: no restart)."""
    return now.compute >= base.compute and now.requests >= base.requests and now.rows >= base.rows


def items_of(replica: Replica | None, shape: tuple[int, ...] | None) -> int:
    """A request's item count: the extent of the batch axis of the batch input.

    ``shape`` is that input's wire shape (None when the request lacks the input). A model
    with no batch axis, an unknown replica or a malformed shape counts as one item.
    """
    if replica is None or replica.batch_axis <= 0 or shape is None:
        return 1
    axis = replica.batch_axis - 1
    if axis >= len(shape) or shape[axis] < 1:
        return 1
    return int(shape[axis])
