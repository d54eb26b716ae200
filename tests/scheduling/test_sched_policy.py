"""The sans-IO scheduling core: worked examples and targeted rules, as plain tests.

Everything here drives ``SchedulingPolicy`` directly with explicit ``now`` values;
there is no Trio and no real time.
"""

from __future__ import annotations

import weakref
from collections import Counter

import pytest

from reactantserver.config import ModelSchedConfig, SchedulerConfig
from reactantserver.errors import (
    BatchTooLarge,
    ConfigError,
    DeadlineExceeded,
    InvalidArgument,
    LifecycleError,
    NotFound,
    QueueFull,
    Unavailable,
)
from reactantserver.scheduling import RequestState, SchedulingPolicy
from reactantserver.scheduling.simulate import drive_backlogged


def make(discipline: str = "fair", **kwargs: object) -> SchedulingPolicy:
    return SchedulingPolicy(SchedulerConfig(discipline=discipline, **kwargs))  # type: ignore[arg-type]


def gpu_shares(trace: list, skip: int = 0) -> dict[str, float]:  # type: ignore[type-arg]
    busy: Counter[str] = Counter()
    for rec in trace[skip:]:
        busy[rec.model] += rec.end - rec.start
    total = sum(busy.values())
    return {m: t / total for m, t in busy.items()}


# --- fair: the original's worked example --------------------------------------------


def steer_to_example() -> SchedulingPolicy:
    """Three equal-weight backlogged models whose normalised usages are .7/.2/.1.

    Costs are seeded to steer who runs (the cheapest model behind its share wins),
    then the example's costs are seeded: 10/30/100 times the original's
    ``1 - coalescing_discount`` = 0.9, which we fold into the costs because the
    discount scales every candidate alike.
    """
    p = make("fair")
    for name in "ABC":
        p.add_model(name, [1])
        p.submit(name, now=0.0)
        p.submit(name, now=0.0)
    for name, usage, cost in (("C", 1.0, (100, 100, 1)), ("B", 2.0, (100, 1, 100))):
        for m, c in zip("ABC", cost, strict=True):
            p.seed_cost(m, 1, c)
        batch = p.next_batch(0.0).batch
        assert batch is not None and batch.model == name
        p.complete(batch, usage, 0.0)
    batch = p.next_batch(0.0).batch  # A is the only one behind its share now
    assert batch is not None and batch.model == "A"
    p.complete(batch, 7.0, 0.0)
    for m, c in zip("ABC", (10, 30, 100), strict=True):
        p.seed_cost(m, 1, c * 0.9)
    return p


def test_fair_priorities_worked_example() -> None:
    p = steer_to_example()
    assert {m: p.usage(m, 0.0) for m in "ABC"} == {"A": 7.0, "B": 2.0, "C": 1.0}
    prio = p.priorities(0.0)
    # The original's table, to the digits it prints ...
    assert prio["A"] == pytest.approx(-0.0278, abs=5e-5)
    assert prio["B"] == pytest.approx(0.00493, abs=1e-5)
    assert prio["C"] == pytest.approx(0.00259, abs=1e-5)
    # ... and exactly.
    assert prio["B"] == pytest.approx((1 / 3 - 0.2) / 27)
    assert prio["C"] == pytest.approx((1 / 3 - 0.1) / 90)
    # A's raw gap 1/3 - .7 = -.367 is clamped to -recency_penalty_cap.
    assert prio["A"] * 9.0 == pytest.approx(-0.25)
    batch = p.next_batch(0.0).batch
    assert batch is not None and batch.model == "B"


def test_fair_clamp_is_symmetric() -> None:
    p = make("fair")
    for name in ("big", "small"):
        p.add_model(name, [1])
        p.submit(name, now=0.0)
        p.submit(name, now=0.0)
    batch = p.next_batch(0.0).batch
    assert batch is not None
    p.complete(batch, 1.0, 0.0)  # one model holds all the usage: gaps are -1/2, +1/2
    for name in ("big", "small"):
        p.seed_cost(name, 1, 1.0)
    assert sorted(p.priorities(0.0).values()) == [-0.25, 0.25]


def test_discount_is_rank_neutral() -> None:
    p = steer_to_example()
    before = p.priorities(0.0)
    for m, c in zip("ABC", (10, 30, 100), strict=True):
        p.seed_cost(m, 1, c)  # the same costs without the 0.9 discount
    after = p.priorities(0.0)
    assert sorted(before, key=before.__getitem__) == sorted(after, key=after.__getitem__)
    assert all(after[m] == pytest.approx(before[m] * 0.9) for m in "ABC")


# --- fair: shares ---------------------------------------------------------------------


def test_fair_shares_follow_weights_whatever_the_costs() -> None:
    p = make("fair", ema_halflife_seconds=5.0)
    p.add_model("cheap", [1], weight=3.0)
    p.add_model("dear", [1], weight=1.0)
    costs = {"cheap": 0.002, "dear": 0.2}
    trace = drive_backlogged(p, lambda m, b: costs[m], dispatches=6000)
    shares = gpu_shares(trace, skip=1000)
    assert shares["cheap"] == pytest.approx(0.75, abs=0.02)
    assert shares["dear"] == pytest.approx(0.25, abs=0.02)


def test_idle_models_do_not_dilute_busy_shares() -> None:
    """Σw over every loaded model (the original) would give 'cheap' about 1 %."""
    p = make("fair", ema_halflife_seconds=5.0)
    for i in range(100):
        p.add_model(f"idle{i}", [1])
    p.add_model("cheap", [1])
    p.add_model("dear", [1])
    costs = {"cheap": 0.001, "dear": 0.1}
    trace = drive_backlogged(p, lambda m, b: costs[m], dispatches=8000, models=["cheap", "dear"])
    shares = gpu_shares(trace, skip=1000)
    assert shares["cheap"] == pytest.approx(0.5, abs=0.03)


def test_set_weight_moves_the_shares() -> None:
    p = make("fair", ema_halflife_seconds=2.0)
    p.add_model("a", [1])
    p.add_model("b", [1])
    cost = {"a": 0.01, "b": 0.01}
    trace = drive_backlogged(p, lambda m, b: cost[m], dispatches=2000)
    assert gpu_shares(trace, 500)["a"] == pytest.approx(0.5, abs=0.02)
    p.set_weight("a", 4.0)
    trace = drive_backlogged(p, lambda m, b: cost[m], dispatches=4000, now=trace[-1].end)
    assert gpu_shares(trace, 2000)["a"] == pytest.approx(0.8, abs=0.02)


def test_newcomer_joins_at_the_service_level() -> None:
    """A model arriving after another ran alone neither starves it nor is starved."""
    p = make("fair")
    p.add_model("old", [1])
    p.add_model("new", [1])
    trace = drive_backlogged(p, lambda m, b: 0.1, dispatches=300, models=["old"])
    assert {r.model for r in trace} == {"old"}
    trace = drive_backlogged(p, lambda m, b: 0.1, dispatches=20, now=trace[-1].end)
    counts = Counter(r.model for r in trace)
    # Without the lift, "new" (usage 0) would run ~all 20 while "old" waited ~20 s.
    assert abs(counts["old"] - counts["new"]) <= 2


def test_running_alone_is_not_penalised_later() -> None:
    p = make("fair")
    p.add_model("a", [1])
    p.add_model("b", [1])
    trace = drive_backlogged(p, lambda m, b: 0.1, dispatches=200, models=["a"])
    trace = drive_backlogged(p, lambda m, b: 0.1, dispatches=50, models=["b"], now=trace[-1].end)
    # "a" returns with a large decayed usage; "b" has been running since.
    trace = drive_backlogged(p, lambda m, b: 0.1, dispatches=20, now=trace[-1].end)
    counts = Counter(r.model for r in trace)
    assert counts["a"] >= 8, counts


# --- fifo / edf ---------------------------------------------------------------------


def test_fifo_runs_the_oldest_head_and_still_coalesces() -> None:
    p = make("fifo")
    p.add_model("a", [1, 2, 4])
    p.add_model("b", [1, 2, 4])
    first = p.submit("b", now=0.0)
    p.submit("a", now=1.0)
    second = p.submit("b", now=2.0)
    batch = p.next_batch(3.0).batch
    assert batch is not None
    assert batch.model == "b" and batch.requests == (first, second) and batch.size == 2
    p.complete(batch, 0.1, 3.1)
    batch = p.next_batch(3.1).batch
    assert batch is not None and batch.model == "a"


def test_edf_runs_the_soonest_deadline_ties_fifo_none_last() -> None:
    p = make("edf")
    for name in ("late", "soon", "none", "tie"):
        p.add_model(name, [1])
    p.submit("none", now=0.0)
    p.submit("late", now=0.0, deadline=50.0)
    p.submit("tie", now=1.0, deadline=20.0)
    p.submit("soon", now=2.0, deadline=20.0)
    order = []
    now = 3.0
    while (batch := p.next_batch(now).batch) is not None:
        order.append(batch.model)
        now += 0.001
        p.complete(batch, 0.001, now)
    assert order == ["tie", "soon", "late", "none"]


def test_edf_looks_at_the_whole_queue_but_never_reorders_it() -> None:
    p = make("edf")
    p.add_model("a", [1])
    p.add_model("b", [1])
    p.submit("b", now=0.0, deadline=30.0)
    head = p.submit("a", now=0.0)  # no deadline, but ...
    p.submit("a", now=0.0, deadline=10.0)  # ... the soonest deadline waits behind it
    batch = p.next_batch(1.0).batch
    assert batch is not None and batch.model == "a" and batch.requests == (head,)


def test_a_lone_candidate_is_judged_on_its_current_queue_once_a_rival_joins() -> None:
    """A model alone is chosen without the candidates' table (nothing to compare); when a
    rival joins, the choice must see what the lone model's queue holds now, not what it
    held when it was last compared: here its soonest deadline left while it ran alone."""
    p = make("edf")
    for name in "abc":
        p.add_model(name, [1])
    p.submit("a", now=0.0, deadline=5.0)
    p.submit("a", now=0.0, deadline=100.0)
    p.submit("c", now=0.0, deadline=3.0)
    now = 1.0
    for expected in ("c", "a"):  # compared with c (a's soonest: 5), then alone
        batch = p.next_batch(now).batch
        assert batch is not None and batch.model == expected
        now += 0.1
        p.complete(batch, 0.1, now)
    p.submit("b", now=now, deadline=50.0)
    batch = p.next_batch(now).batch
    assert batch is not None and batch.model == "b"  # 50 is sooner than a's 100 now


def test_edf_sheds_by_laxity_but_never_committed_work() -> None:
    p = make("edf")
    p.add_model("m", [1, 2])
    p.seed_cost("m", 2, 0.5)
    p.seed_cost("m", 1, 0.5)
    doomed = p.submit("m", now=0.0, deadline=10.3)
    sub = p.submit("m", now=0.0, deadline=10.3, committed=True)
    decision = p.next_batch(10.0)  # 10.0 + 0.5 >= 10.3
    assert decision.shed == (doomed,)
    assert doomed.state is RequestState.SHED
    assert decision.batch is not None and decision.batch.requests == (sub,)
    assert decision.batch.size == 1  # the survivor runs at the size that holds it


def test_fair_and_fifo_shed_only_what_is_already_late() -> None:
    for discipline in ("fair", "fifo"):
        p = make(discipline)
        p.add_model("m", [1])
        p.seed_cost("m", 1, 5.0)
        ok = p.submit("m", now=0.0, deadline=10.3)
        late = p.submit("m", now=0.0, deadline=10.0)
        decision = p.next_batch(10.0)
        assert decision.batch is not None and decision.batch.requests == (ok,)
        p.complete(decision.batch, 1.0, 11.0)
        decision = p.next_batch(11.0)
        assert decision.batch is None and decision.shed == (late,)


def test_committed_calls_jump_the_queue_in_arrival_order() -> None:
    p = make("fifo")
    p.add_model("a", [1])
    p.add_model("b", [1])
    p.submit("a", now=0.0)
    p.submit("b", now=0.0)
    c1 = p.submit("b", now=1.0, committed=True)
    c2 = p.submit("a", now=2.0, committed=True)
    c3 = p.submit("b", now=3.0, committed=True)
    got = []
    for _ in range(3):
        batch = p.next_batch(4.0).batch
        assert batch is not None
        got.extend(batch.requests)
        p.complete(batch, 0.0, 4.0)
    assert got == [c1, c2, c3]


# --- batching through the core --------------------------------------------------------


def test_coalescing_stops_at_the_group_boundary() -> None:
    p = make("fifo")
    p.add_model("m", [1, 2, 4, 8])
    a1 = p.submit("m", now=0.0, group="v0")
    a2 = p.submit("m", now=0.0, group="v0")
    p.submit("m", now=0.0, group="v1")
    p.submit("m", now=0.0, group="v0")
    batch = p.next_batch(0.0).batch
    assert batch is not None and batch.requests == (a1, a2) and batch.group == "v0"


def test_non_coalescable_runs_one_request_at_its_own_size() -> None:
    p = make("fifo")
    p.add_model("m", [2, 4], coalescable=False)
    first = p.submit("m", now=0.0, rows=4)
    p.submit("m", now=0.0, rows=2)
    batch = p.next_batch(0.0).batch
    assert batch is not None and batch.requests == (first,) and batch.size == 4
    with pytest.raises(InvalidArgument, match="one of the compiled sizes"):
        p.submit("m", now=0.0, rows=3)


def test_unbatched_program_takes_any_extent_alone() -> None:
    p = make("fifo")
    p.add_model("m", [])
    req = p.submit("m", now=0.0, rows=37)
    p.submit("m", now=0.0, rows=1)
    batch = p.next_batch(0.0).batch
    assert batch is not None and batch.requests == (req,) and batch.size == 37


def test_max_batch_size_from_config_caps_rows() -> None:
    p = make("fifo", models={"m": ModelSchedConfig(max_batch_size=4)})
    p.add_model("m", [1, 4, 8])
    for _ in range(6):
        p.submit("m", now=0.0, rows=2)
    batch = p.next_batch(0.0).batch
    assert batch is not None and batch.size == 4 and batch.rows == 4
    assert p.statistics(0.0).models["m"].max_batch_size == 4


# --- admission ------------------------------------------------------------------------


def test_queue_cap_is_per_model_and_committed_bypasses_it() -> None:
    p = make("fifo", max_queue_depth=2)
    p.add_model("a", [1])
    p.add_model("b", [1])
    p.submit("a", now=0.0)
    p.submit("a", now=0.0)
    with pytest.raises(QueueFull, match=r"'a'.*max_queue_depth=2"):
        p.submit("a", now=0.0)
    p.submit("b", now=0.0)  # another model's queue is separate
    p.submit("a", now=0.0, committed=True)
    stats = p.statistics(0.0)
    assert stats.models["a"].rejected == 1 and stats.models["a"].queue_depth == 3


def test_admission_errors() -> None:
    p = make("fair")
    p.add_model("m", [1, 4, 8])
    with pytest.raises(NotFound, match="'nope'"):
        p.submit("nope", now=0.0)
    with pytest.raises(BatchTooLarge, match=r"9 rows.*compiled sizes: 1, 4, 8"):
        p.submit("m", now=0.0, rows=9)
    with pytest.raises(InvalidArgument, match="at least 1 row"):
        p.submit("m", now=0.0, rows=0)
    with pytest.raises(DeadlineExceeded, match="already passed"):
        p.submit("m", now=5.0, deadline=5.0)
    assert p.queued == 0


def test_model_registry_errors() -> None:
    p = make("fair")
    p.add_model("m", [1])
    with pytest.raises(LifecycleError, match="already registered"):
        p.add_model("m", [1])
    with pytest.raises(InvalidArgument, match="weight"):
        p.set_weight("m", 0.0)
    with pytest.raises(InvalidArgument, match="positive integers"):
        p.add_model("z", [0, 2])
    with pytest.raises(NotFound):
        p.set_weight("absent", 1.0)
    with pytest.raises(ConfigError, match="ema_halflife_seconds"):
        make("fair", ema_halflife_seconds=0.0)


# --- lifecycle of requests ------------------------------------------------------------


def test_cancel_removes_queued_work_only() -> None:
    p = make("fifo")
    p.add_model("m", [1])
    a = p.submit("m", now=0.0)
    b = p.submit("m", now=0.0)
    assert p.cancel(b) is True and b.state is RequestState.CANCELLED
    assert p.cancel(b) is False
    batch = p.next_batch(0.0).batch
    assert batch is not None and batch.requests == (a,)
    assert p.cancel(a) is False  # already dispatched
    p.complete(batch, 0.1, 0.1)
    assert p.next_batch(0.1).batch is None


class _Payload:
    """A request's payload whose lifetime a test can watch (weak references)."""


@pytest.mark.parametrize("discipline", ["fair", "fifo", "edf"])
def test_served_requests_with_deadlines_are_not_kept(discipline: str) -> None:
    """Memory stays bounded by what is queued, whatever was served: a request that had a
    deadline is let go once served, like one without. Before: under fair and fifo every
    such request stayed in its queue's deadline heap (cleaned only where EDF reads it)
    with its payload, for the life of the model."""
    p = make(discipline)
    p.add_model("m", [1, 2, 4, 8])
    alive: list[weakref.ref[_Payload]] = []
    now = 0.0
    for _ in range(500):
        for _ in range(6):
            payload = _Payload()
            alive.append(weakref.ref(payload))
            p.submit("m", payload, now=now, deadline=now + 30.0)
        while (batch := p.next_batch(now).batch) is not None:
            now += 0.001
            p.complete(batch, 0.001, now)
    held = sum(ref() is not None for ref in alive)
    assert held <= 100, f"{held} of {len(alive)} served requests are still referenced"


def test_one_batch_at_a_time() -> None:
    p = make("fifo")
    p.add_model("m", [1])
    p.submit("m", now=0.0)
    p.submit("m", now=0.0)
    batch = p.next_batch(0.0).batch
    assert batch is not None and p.running is batch
    with pytest.raises(LifecycleError, match="still running"):
        p.next_batch(0.0)
    p.complete(batch, 0.1, 0.1)
    with pytest.raises(LifecycleError, match="not the running one"):
        p.complete(batch, 0.1, 0.1)


def test_remove_update_and_close() -> None:
    p = make("fifo")
    p.add_model("a", [1, 4])
    p.add_model("b", [1])
    big = p.submit("a", now=0.0, rows=4)
    small = p.submit("a", now=0.0, rows=1)
    assert p.update_model("a", compiled_batch_sizes=[1, 2]) == (big,)
    assert big.state is RequestState.REMOVED
    assert p.remove_model("a") == (small,)
    assert not p.has_model("a")
    queued = p.submit("b", now=0.0)
    assert p.close() == (queued,) and queued.state is RequestState.REMOVED
    with pytest.raises(Unavailable, match="shutting down"):
        p.submit("b", now=0.0)


def test_completing_a_batch_of_a_removed_model() -> None:
    p = make("fair")
    p.add_model("m", [1])
    p.submit("m", now=0.0)
    batch = p.next_batch(0.0).batch
    assert batch is not None
    p.remove_model("m")
    p.complete(batch, 1.0, 1.0)
    assert p.statistics(1.0).dispatches == 1


def test_peek_next_skips_the_running_model() -> None:
    p = make("fifo")
    for name in "abc":
        p.add_model(name, [1])
    p.submit("a", now=0.0)
    p.submit("a", now=0.1)
    p.submit("b", now=0.2)
    assert p.peek_next(1.0) == "a"
    batch = p.next_batch(1.0).batch
    assert batch is not None and batch.model == "a"
    assert p.peek_next(1.0) == "b"  # "a" still has work but is running
    p.submit("c", now=1.0, committed=True)
    assert p.peek_next(1.0) == "c"
    p.complete(batch, 0.1, 1.1)


def test_a_replaced_model_is_a_new_model() -> None:
    """Remove + add while a batch runs: the old batch's accounting does not leak into
    the successor, and prefetch does not name it (the cache keys weights by name)."""
    p = make("fair")
    p.add_model("a", [1])
    p.add_model("b", [1])
    p.submit("a", now=0.0)
    batch = p.next_batch(0.0).batch
    assert batch is not None
    p.remove_model("a")
    p.add_model("a", [1])
    p.submit("a", now=0.0)
    p.submit("b", now=0.0)
    assert p.peek_next(0.0) == "b"
    p.complete(batch, 5.0, 5.0)
    stats = p.statistics(5.0).models["a"]
    assert (stats.dispatches, stats.usage, stats.costs) == (0, 0.0, ())


def test_statistics_account_every_request() -> None:
    p = make("edf")
    p.add_model("m", [1, 2])
    p.submit("m", now=0.0, rows=1)
    p.submit("m", now=0.0, rows=1)
    p.submit("m", now=0.0, rows=1, deadline=0.5)
    late = p.submit("m", now=0.0, rows=2)
    p.cancel(late)
    decision = p.next_batch(1.0)  # the deadline-0.5 request is not in this batch
    assert decision.batch is not None
    p.complete(decision.batch, 0.25, 1.25)
    decision = p.next_batch(1.25)
    assert decision.batch is None and len(decision.shed) == 1
    s = p.statistics(1.25)
    m = s.models["m"]
    assert (m.requests, m.rows, m.dispatches, m.shed, m.cancelled) == (2, 2, 1, 1, 1)
    assert m.compute_seconds == 0.25 and m.costs == ((2, 0.25),)
    assert m.queue_depth == 0 and s.queued == 0 and s.running is None
    assert (s.requests, s.rows, s.dispatches, s.shed) == (2, 2, 1, 1)


def test_a_cost_is_never_seeded_below_one_row() -> None:
    """Every dispatch carries a request, so size 0 is a caller's bug (it once made the
    cost estimate for size 1 divide by zero and stopped the dispatch loop)."""
    from reactantserver.scheduling.cost import CostTable

    with pytest.raises(ValueError, match="a batch size is at least 1; got 0"):
        CostTable(alpha=0.2).seed(0, 0.01)
