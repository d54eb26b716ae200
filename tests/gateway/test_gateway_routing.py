"""The Router seam: accounting, round robin, least outstanding and lpt_packing fill routing.

Everything here is sans-IO: routers are driven directly with tables, tickets and releases.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)
from strategies import gateway_tables

from reactantserver.config import GatewaySchedulingConfig
from reactantserver.errors import LifecycleError, NotFound, Unavailable
from reactantserver.gateway.core.routing import (
    FillRouter,
    LeastOutstandingRouter,
    RoundRobinRouter,
    Router,
    Ticket,
    fill_policy,
    make_router,
    quantum,
    refusal,
)
from reactantserver.gateway.core.table import ModelSnapshot, RouteTable, WorkerSnapshot, build_table

MODES = ("round_robin", "least_outstanding", "lpt_packing")


def _table(
    serving: dict[str, dict[str, int]], costs: dict[tuple[str, str], float] | None = None
) -> RouteTable:
    """worker -> {model: max_batch}; optional learned costs per (model, worker)."""
    snaps = [
        WorkerSnapshot(
            address=w,
            discipline="fifo",
            models=tuple(
                ModelSnapshot(name=m, max_batch_size=b, batch_input_name="x", batch_axis=1)
                for m, b in models.items()
            ),
        )
        for w, models in serving.items()
    ]
    table = build_table(None, snaps)
    if costs:
        # Two snapshots with counters teach the table a cost per item for each pair.
        snaps2 = [
            WorkerSnapshot(
                address=s.address,
                discipline="fifo",
                models=tuple(
                    ModelSnapshot(
                        name=m.name,
                        max_batch_size=m.max_batch_size,
                        batch_input_name="x",
                        batch_axis=1,
                        total_compute_seconds=costs.get((m.name, s.address), 0.0) * 100,
                        requests_served=100,
                        rows_served=100,
                    )
                    for m in s.models
                ),
            )
            for s in snaps
        ]
        table = build_table(table, snaps2)
    return table


def _lpt(**kw: object) -> GatewaySchedulingConfig:
    return GatewaySchedulingConfig(mode="lpt_packing", **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the state machine


class RouterMachine(RuleBasedStateMachine):
    """Any interleaving of choose, failover, release and table swaps, on every router.

    Invariants: a ticket's replica order never repeats a worker and lists exactly the
    replicas that served the model when it was chosen; every in-flight count (requests,
    items, work; per pair and per worker) is never negative and equals what the live
    tickets account; releasing a ticket twice is refused; when every ticket is released,
    every count is back to 0 (teardown).
    """

    tickets = Bundle("tickets")

    @initialize(
        table=gateway_tables(),
        mode=st.sampled_from(MODES),
        basis=st.sampled_from(("compute", "items", "requests")),
        fill_mode=st.sampled_from(("run", "spread")),
        policy=st.sampled_from(("fill_rr", "fill_least")),
        factor=st.sampled_from((0.5, 1.0, 2.0)),
        data=st.data(),
    )
    def setup(
        self,
        table: RouteTable,
        mode: str,
        basis: str,
        fill_mode: str,
        policy: str,
        factor: float,
        data: st.DataObject,
    ) -> None:
        config = GatewaySchedulingConfig(
            mode=mode,  # type: ignore[arg-type]
            work_basis=basis,  # type: ignore[arg-type]
            routing_fill_mode=fill_mode,  # type: ignore[arg-type]
            routing_policy=policy,  # type: ignore[arg-type]
            routing_fill_factor=factor,
        )
        self.table = table
        self.router: Router = make_router(config, table)
        if isinstance(self.router, FillRouter):
            placement = {
                m: tuple(
                    data.draw(
                        st.lists(
                            st.sampled_from([r.worker for r in rs]), unique=True, max_size=len(rs)
                        )
                    )
                )
                for m, rs in table.models.items()
            }
            self.router.set_placement(placement)
        self.live: list[Ticket] = []
        self.done: list[Ticket] = []

    @rule(target=tickets, data=st.data(), items=st.integers(1, 9))
    def choose(self, data: st.DataObject, items: int) -> Ticket:
        model = data.draw(st.sampled_from(sorted(self.table.models)))
        ticket = self.router.choose(model, items, now=0.0)
        assert len(set(ticket.replicas)) == len(ticket.replicas)
        assert set(ticket.replicas) == {r.worker for r in self.table.replicas(model)}
        assert ticket.worker == ticket.replicas[0]
        self.live.append(ticket)
        return ticket

    @rule(ticket=tickets)
    def failover(self, ticket: Ticket) -> None:
        if ticket.released:
            with pytest.raises(LifecycleError):
                self.router.failover(ticket)
            return
        before = ticket.position
        worker = self.router.failover(ticket)
        if before >= len(ticket.replicas):
            assert worker is None
        else:
            assert ticket.position == before + 1
            assert worker == ticket.worker

    @rule(
        ticket=consumes(tickets), outcome=st.sampled_from(("ok", "error", "cancelled", "deadline"))
    )
    def release(self, ticket: Ticket, outcome: str) -> None:
        self.router.release(ticket, outcome)  # type: ignore[arg-type]
        self.live.remove(ticket)
        self.done.append(ticket)
        with pytest.raises(LifecycleError):
            self.router.release(ticket)

    @rule()
    def swap_table(self) -> None:
        """A probe round with the same answers: tickets in flight keep their accounting."""
        self.table = build_table(self.table, _same(self.table))
        self.router.update(self.table)

    @invariant()
    def accounting_matches_live_tickets(self) -> None:
        stats = self.router.statistics()
        expected_requests: Counter[str] = Counter()
        expected_items: Counter[str] = Counter()
        for t in self.live:
            if t.worker is not None:
                expected_requests[t.worker] += 1
                expected_items[t.worker] += t.items
        for load in stats.workers.values():
            assert load.requests >= 0 and load.items >= 0 and load.work >= -1e-9
            assert load.requests == expected_requests[load.worker]
            assert load.items == expected_items[load.worker]
        for pair in stats.replicas:
            assert pair.outstanding_requests >= 0 and pair.outstanding_items >= 0
        assert stats.outstanding == sum(expected_requests.values())
        assert sum(stats.released.values()) == len(self.done)

    def teardown(self) -> None:
        if not hasattr(self, "router"):
            return
        for ticket in list(self.live):
            self.router.release(ticket, "cancelled")
        stats = self.router.statistics()
        assert stats.outstanding == 0
        for load in stats.workers.values():
            assert (load.requests, load.items, load.work) == (0, 0, 0.0)
        for pair in stats.replicas:
            assert (pair.outstanding_requests, pair.outstanding_items) == (0, 0)
            assert pair.outstanding_work == 0.0


def _same(table: RouteTable) -> list[WorkerSnapshot]:
    snaps = []
    for w in table.workers.values():
        models = []
        for name, replicas in table.models.items():
            for r in replicas:
                if r.worker == w.address:
                    models.append(
                        ModelSnapshot(
                            name=name,
                            max_batch_size=r.max_batch_size,
                            batch_input_name=r.batch_input_name,
                            batch_axis=r.batch_axis,
                        )
                    )
        snaps.append(
            WorkerSnapshot(address=w.address, discipline=w.discipline, models=tuple(models))
        )
    return snaps


TestRouterMachine = RouterMachine.TestCase
TestRouterMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


# ---------------------------------------------------------------- round robin


@settings(max_examples=80, deadline=None)
@given(table=gateway_tables(), data=st.data())
def test_round_robin_counts_differ_by_at_most_one(table: RouteTable, data: st.DataObject) -> None:
    """Over any prefix of a model's requests (released or not, in any order), round robin's
    per-replica counts differ by at most one, and each full rotation gives every replica
    exactly one request."""
    router = RoundRobinRouter(table)
    model = data.draw(st.sampled_from(sorted(table.models)))
    workers = [r.worker for r in table.replicas(model)]
    n = len(workers)
    counts: Counter[str] = Counter()
    live: list[Ticket] = []
    for step in range(data.draw(st.integers(1, 5 * n))):
        ticket = router.choose(model, data.draw(st.integers(1, 4)), now=float(step))
        counts[ticket.worker] += 1  # type: ignore[index]
        live.append(ticket)
        if live and data.draw(st.booleans()):
            router.release(live.pop(data.draw(st.integers(0, len(live) - 1))))
        values = [counts[w] for w in workers]
        assert max(values) - min(values) <= 1
        if (step + 1) % n == 0:
            assert len(set(values)) == 1


def test_round_robin_rotates_and_fails_over_in_rotation() -> None:
    table = _table({"a:1": {"m": 4}, "b:1": {"m": 4}, "c:1": {"m": 4}})
    router = RoundRobinRouter(table)
    orders = [router.choose("m", 1, now=0).replicas for _ in range(4)]
    assert orders == [
        ("a:1", "b:1", "c:1"),
        ("b:1", "c:1", "a:1"),
        ("c:1", "a:1", "b:1"),
        ("a:1", "b:1", "c:1"),
    ]


def test_round_robin_follows_a_new_table_at_once() -> None:
    """The rotations are remembered per table: a worker that joins or leaves is in (or
    out of) the very next order, and the rotation goes on from where it was."""
    router = RoundRobinRouter(_table({"a:1": {"m": 4}, "b:1": {"m": 4}}))
    assert router.choose("m", 1, now=0).replicas == ("a:1", "b:1")
    router.update(_table({"a:1": {"m": 4}, "b:1": {"m": 4}, "c:1": {"m": 4}}))
    assert router.choose("m", 1, now=0).replicas == ("b:1", "c:1", "a:1")
    router.update(_table({"c:1": {"m": 4}, "a:1": {"m": 4}}))
    assert router.choose("m", 1, now=0).replicas == ("a:1", "c:1")
    # A table swapped in without update() (its replicas are other tuples) is followed too.
    router.table = _table({"b:1": {"m": 4}})
    assert router.choose("m", 1, now=0).replicas == ("b:1",)


def test_unknown_model_is_not_found() -> None:
    router = RoundRobinRouter(_table({"a:1": {"m": 4}}))
    with pytest.raises(NotFound, match="'nope' is not served by any ready worker"):
        router.choose("nope", 1, now=0)


# ---------------------------------------------------------------- least outstanding


@settings(max_examples=80, deadline=None)
@given(
    table=gateway_tables(), basis=st.sampled_from(("compute", "items", "requests")), data=st.data()
)
def test_least_outstanding_picks_a_least_loaded_replica(
    table: RouteTable, basis: str, data: st.DataObject
) -> None:
    """Whatever is in flight (any models, any releases), least_outstanding's first choice is
    a replica whose worker carries the least in-flight work among the model's replicas, and
    its failover order is sorted by that work."""
    router = LeastOutstandingRouter(table, work_basis=basis)  # type: ignore[arg-type]
    live: list[Ticket] = []
    for step in range(data.draw(st.integers(1, 30))):
        model = data.draw(st.sampled_from(sorted(table.models)))
        loads = {r.worker: router.load(r.worker) for r in table.replicas(model)}
        ticket = router.choose(model, data.draw(st.integers(1, 8)), now=float(step))
        assert loads[ticket.replicas[0]] == min(loads.values())
        assert [loads[w] for w in ticket.replicas] == sorted(loads.values())
        live.append(ticket)
        if live and data.draw(st.booleans()):
            router.release(live.pop(data.draw(st.integers(0, len(live) - 1))))


def test_least_outstanding_avoids_the_worker_busy_with_a_slow_model() -> None:
    """The issue's scenario: a worker busy with a slow model gets no new work while the
    other is idle (compute basis: items x learned cost per item)."""
    table = _table(
        {"a:1": {"slow": 1, "fast": 8}, "b:1": {"slow": 1, "fast": 8}},
        costs={
            ("slow", "a:1"): 0.5,
            ("slow", "b:1"): 0.5,
            ("fast", "a:1"): 0.001,
            ("fast", "b:1"): 0.001,
        },
    )
    router = LeastOutstandingRouter(table)
    slow = router.choose("slow", 1, now=0)
    busy = slow.worker
    for _ in range(20):
        ticket = router.choose("fast", 1, now=0)
        assert ticket.worker != busy
        router.release(ticket)
    router.release(slow)
    # Idle again: ties rotate, so both workers share.
    firsts = {router.choose("fast", 1, now=0).worker for _ in range(2)}
    assert firsts == {"a:1", "b:1"}


def test_least_outstanding_counts_requests_when_work_is_measured_as_zero() -> None:
    """A model whose learned cost is 0 (a meta model whose glue only waits) still makes its
    worker busy: equal work goes to the worker with fewer requests in flight."""
    table = _table(
        {"a:1": {"wait": 1, "fast": 8}, "b:1": {"wait": 1, "fast": 8}},
        costs={("wait", "a:1"): 0.0, ("wait", "b:1"): 0.0},
    )
    router = LeastOutstandingRouter(table)
    held = router.choose("wait", 1, now=0)
    assert router.load(held.worker) == 0.0  # type: ignore[arg-type]
    for _ in range(10):
        ticket = router.choose("fast", 1, now=0)
        assert ticket.worker != held.worker
        router.release(ticket)
    router.release(held)


# ---------------------------------------------------------------- fill routing


def test_quantum_rounds_half_up_and_never_below_one() -> None:
    assert quantum(1.0, 8) == 8
    assert quantum(0.5, 5) == 3  # 2.5 rounds up
    assert quantum(0.1, 4) == 1
    assert quantum(2.0, 0) == 1  # unknown max batch


def test_fill_rr_run_fills_one_quantum_then_rotates() -> None:
    table = _table({"a:1": {"m": 4}, "b:1": {"m": 4}})
    router = FillRouter(table, _lpt(routing_policy="fill_rr"), {"m": ("a:1", "b:1")})
    firsts = [router.choose("m", 1, now=0).worker for _ in range(12)]
    assert firsts == ["a:1"] * 4 + ["b:1"] * 4 + ["a:1"] * 4
    stats = {(r.model, r.worker): r for r in router.statistics().replicas}
    assert stats[("m", "a:1")].fill_quantum == 4
    assert stats[("m", "a:1")].outstanding_items == 8


def test_fill_factor_scales_the_quantum() -> None:
    table = _table({"a:1": {"m": 4}, "b:1": {"m": 4}})
    router = FillRouter(
        table, _lpt(routing_policy="fill_rr", routing_fill_factor=2.0), {"m": ("a:1", "b:1")}
    )
    firsts = [router.choose("m", 2, now=0).worker for _ in range(8)]
    assert firsts == ["a:1"] * 4 + ["b:1"] * 4


def test_run_reopens_when_the_replica_drained() -> None:
    table = _table({"a:1": {"m": 8}, "b:1": {"m": 8}})
    router = FillRouter(table, _lpt(routing_policy="fill_rr"), {"m": ("a:1", "b:1")})
    first = router.choose("m", 1, now=0)
    router.release(first)  # a:1 drained before the next request
    assert router.choose("m", 1, now=1).worker == "b:1"


def test_fill_least_opens_on_the_least_loaded_worker() -> None:
    table = _table({"a:1": {"m": 2, "other": 1}, "b:1": {"m": 2, "other": 1}})
    config = _lpt(routing_policy="fill_least", work_basis="items")
    router = FillRouter(table, config, {"m": ("a:1", "b:1"), "other": ("a:1",)})
    for _ in range(3):
        router.choose("other", 4, now=0)  # a:1 is loaded by another model
    assert [router.choose("m", 1, now=0).worker for _ in range(2)] == ["b:1", "b:1"]


def test_spread_balances_in_flight_items() -> None:
    table = _table({"a:1": {"m": 8}, "b:1": {"m": 8}})
    router = FillRouter(
        table, _lpt(routing_fill_mode="spread", routing_policy="fill_rr"), {"m": ("a:1", "b:1")}
    )
    tickets = [router.choose("m", 1, now=0) for _ in range(6)]
    assert Counter(t.worker for t in tickets) == {"a:1": 3, "b:1": 3}


def test_fill_routes_placed_first_then_unplaced_and_falls_back_to_round_robin() -> None:
    table = _table({"a:1": {"m": 4, "n": 4}, "b:1": {"m": 4, "n": 4}, "c:1": {"m": 4, "n": 4}})
    router = FillRouter(table, _lpt(), {"m": ("b:1",)})
    ticket = router.choose("m", 1, now=0)
    assert ticket.replicas == ("b:1", "a:1", "c:1")
    # "n" has no placement yet: round robin over the replicas that serve it.
    assert [router.choose("n", 1, now=0).worker for _ in range(3)] == ["a:1", "b:1", "c:1"]


def test_fill_policy_resolves_model_overrides() -> None:
    from reactantserver.config.schema import GatewayModelConfig

    config = _lpt(
        routing_fill_factor=1.5,
        models={"m": GatewayModelConfig(fill_mode="spread", fill_factor=0.5)},
    )
    assert fill_policy(config, "m").mode == "spread"
    assert fill_policy(config, "m").factor == 0.5
    assert fill_policy(config, "other").factor == 1.5


@settings(max_examples=120, deadline=None)
@given(
    n=st.integers(1, 4),
    batches=st.lists(st.sampled_from((1, 2, 4, 8)), min_size=4, max_size=4),
    fill_mode=st.sampled_from(("run", "spread")),
    policy=st.sampled_from(("fill_rr", "fill_least")),
    factor=st.sampled_from((0.5, 1.0, 2.0)),
    data=st.data(),
)
def test_fill_routing_never_starves_a_replica(
    n: int, batches: list[int], fill_mode: str, policy: str, factor: float, data: st.DataObject
) -> None:
    """Fill routing never starves a replica: whatever completes when, a placed replica with
    nothing in flight (so with room for a whole quantum) is never passed over for (n + 1) x Q
    consecutive single-item requests of its model (n placed replicas, Q the largest
    quantum). Why: a run lasts at most Q items, and every run is opened by a key on which an
    idle replica is minimal (least quanta behind, least load) with ties broken by a rotation
    that reaches it within n openings.

    Without releases (nothing completes) and with equal quanta, every replica is first choice
    at least once in every such window."""
    workers = [f"w{i}:1" for i in range(n)]
    table = _table({w: {"m": batches[i]} for i, w in enumerate(workers)})
    config = _lpt(routing_fill_mode=fill_mode, routing_policy=policy, routing_fill_factor=factor)
    router = FillRouter(table, config, {"m": tuple(workers)})
    q_max = max(quantum(factor, b) for b in batches[:n])
    window = (n + 1) * q_max
    releases = data.draw(st.booleans())
    idle_and_passed: Counter[str] = Counter()
    firsts: list[str] = []
    live: list[Ticket] = []
    for step in range(3 * window):
        idle = {w for w in workers if router.outstanding_items("m", w) == 0}
        ticket = router.choose("m", 1, now=float(step))
        firsts.append(ticket.worker)  # type: ignore[arg-type]
        for w in workers:
            passed = w in idle and w != ticket.worker
            idle_and_passed[w] = idle_and_passed[w] + 1 if passed else 0
            assert idle_and_passed[w] < window, f"{w} idle and passed over {window} times"
        live.append(ticket)
        for _ in range(data.draw(st.integers(0, 2)) if releases else 0):
            if live:
                router.release(live.pop(data.draw(st.integers(0, len(live) - 1))))
    if not releases and len(set(batches[:n])) == 1:
        for start in range(len(firsts) - window + 1):
            assert set(firsts[start : start + window]) == set(workers)


# --------------------------------------------------------------- when nothing serves a model


def _down(*addresses: str) -> list[WorkerSnapshot]:
    """A round in which none of ``addresses`` answered."""
    return [WorkerSnapshot(address=a, ready=False) for a in addresses]


def _serving(models: dict[str, tuple[str, ...]], ready: bool = True) -> list[WorkerSnapshot]:
    """worker -> the models it lists (all ready when ``ready``)."""
    return [
        WorkerSnapshot(
            address=w, ready=ready, models=tuple(ModelSnapshot(name=m, ready=ready) for m in ms)
        )
        for w, ms in models.items()
    ]


def test_a_model_seen_before_every_worker_went_down_is_unavailable() -> None:
    """The issue's case: both workers killed after they served ``double``."""
    up = build_table(None, _serving({"w0": ("double",), "w1": ("double",)}))
    down = build_table(up, _down("w0", "w1"))
    assert down.replicas("double") == () and "double" in down.known
    refused = refusal(down, "double", 2)
    assert isinstance(refused, Unavailable)
    assert str(refused) == (
        "model 'double': no worker serving it is ready (0 of 2 workers ready); retry when "
        "one is back"
    )
    # A name never seen is UNAVAILABLE too: with no worker ready nobody can say it is
    # absent (issue 42); the closest known name is a hint.
    unknown = refusal(down, "doubel", 2)
    assert isinstance(unknown, Unavailable)
    assert str(unknown) == (
        "model 'doubel': no worker behind this gateway is ready (0 of 2) to say whether it "
        "serves it; retry when one is back; did you mean 'double'?"
    )
    # One worker back, and ready to say so: NOT_FOUND.
    one_up = build_table(down, _serving({"w0": ("double",)}) + _down("w1"))
    assert isinstance(refusal(one_up, "doubel", 2), NotFound)


def test_an_expected_model_is_unavailable_before_any_worker_answered() -> None:
    """Workers down before the gateway started: what the node file assigns is known."""
    first = RouteTable(known=frozenset({"double", "iris"}))
    assert isinstance(refusal(first, "double", 2), Unavailable)  # before the first round
    table = build_table(first, _down("w0", "w1"))
    assert isinstance(refusal(table, "iris", 2), Unavailable)
    assert "(0 of 2 workers ready)" in str(refusal(table, "iris", 2))
    # Not even a name never seen is NOT_FOUND before a worker answered (issue 42: it was).
    unknown = refusal(table, "irsi", 2)
    assert isinstance(unknown, Unavailable) and str(unknown).endswith("did you mean 'iris'?")
    assert isinstance(refusal(RouteTable(), "anything", 2), Unavailable)


def test_a_model_listed_but_ready_nowhere_is_unavailable_naming_the_workers() -> None:
    table = build_table(None, _serving({"w0": ("double",)}, ready=False) + _down("w1"))
    refused = refusal(table, "double", 2)
    assert isinstance(refused, Unavailable)
    assert "listed by w0" in str(refused)


def test_a_known_model_no_ready_worker_lists_any_more_is_not_found() -> None:
    """Every worker answers ready and none lists it: it was unloaded, not delayed."""
    before = build_table(None, _serving({"w0": ("double", "iris"), "w1": ("iris",)}))
    after = build_table(before, _serving({"w0": ("iris",), "w1": ("iris",)}))
    refused = refusal(after, "double", 2)
    assert isinstance(refused, NotFound)
    assert "no longer served" in str(refused)
    # One worker away again: it may come back with the model, so retryable.
    partial = build_table(after, _serving({"w0": ("iris",)}) + _down("w1"))
    assert isinstance(refusal(partial, "double", 2), Unavailable)


@settings(max_examples=200, deadline=None)
@given(
    rounds=st.lists(
        st.dictionaries(
            st.sampled_from(["w0", "w1", "w2"]),
            st.one_of(st.none(), st.frozensets(st.sampled_from(["a", "b", "c"]))),
            min_size=3,
            max_size=3,
        ),
        min_size=1,
        max_size=6,
    ),
    expected=st.frozensets(st.sampled_from(["a", "b", "c", "d"])),
    model=st.sampled_from(["a", "b", "c", "d", "e"]),
)
def test_refusal_follows_the_rule(
    rounds: list[dict[str, frozenset[str] | None]], expected: frozenset[str], model: str
) -> None:
    """Over any sequence of probe rounds (a worker absent, or ready listing some models):
    the known models only grow and hold every model ever listed and every expected one; a
    model some worker lists, a known one while some worker is not ready, or any name while
    no worker is ready, is UNAVAILABLE; NOT_FOUND otherwise -- in particular for every
    name never listed nor expected while a worker is ready to say so."""
    table = RouteTable(known=expected)
    listed: set[str] = set()
    for round_ in rounds:
        before = table.known
        snaps = [
            WorkerSnapshot(address=w, ready=False)
            if ms is None
            else WorkerSnapshot(address=w, models=tuple(ModelSnapshot(name=m) for m in ms))
            for w, ms in sorted(round_.items())
        ]
        table = build_table(table, snaps)
        listed.update(m for ms in round_.values() if ms for m in ms)
        assert before <= table.known
    assert table.known == expected | listed
    if table.serves(model):
        return
    refused = refusal(table, model, 3)
    lists = any(model in w.models for w in table.workers.values())
    away = len(table.ready_workers) < 3
    retry = lists or (model in table.known and away) or not table.ready_workers
    assert isinstance(refused, Unavailable if retry else NotFound)
