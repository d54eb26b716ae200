"""The planner's search and its verdicts (reactantserver.planning.plan and .fleet)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import plan_verdicts

from reactantserver.fleet.host import HostCosts
from reactantserver.planning.costs import Costs, ModelCosts
from reactantserver.planning.device import Device
from reactantserver.planning.fleet import Goal, Run, evaluate
from reactantserver.planning.plan import lower_bound, make_plan, plan_json, render_plan, search
from reactantserver.planning.traffic import ModelTraffic, Traffic


@given(plan_verdicts())
def test_the_search_never_reports_a_larger_fleet_failing_where_a_smaller_met(
    case: tuple[list[bool], int],
) -> None:
    """For any verdicts of fleets 1..n -- monotone or not, from any start -- every fleet
    the search evaluated below its answer fails and every one at or above it meets the
    goal; the answer meets it and the fleet one smaller was evaluated and fails (unless the
    answer is 1); no answer means every fleet evaluated failed, the largest included."""
    verdicts, start = case
    top = len(verdicts)
    answer, seen = search(lambda n: verdicts[n - 1], start, top)
    assert all(seen[n] == verdicts[n - 1] for n in seen)
    if answer is None:
        assert not any(seen.values()) and top in seen
        return
    assert seen[answer]
    assert all(not ok for n, ok in seen.items() if n < answer)
    assert all(ok for n, ok in seen.items() if n >= answer)
    if answer > 1:
        assert seen[answer - 1] is False


@given(st.integers(min_value=1, max_value=64), st.integers(min_value=1, max_value=64),
       st.integers(min_value=1, max_value=64))  # fmt: skip
def test_with_monotone_verdicts_the_answer_is_the_smallest_that_meets(
    threshold: int, start: int, top: int
) -> None:
    """When more devices never hurt (fleet n meets iff n >= threshold), the answer is the
    threshold whatever the start, found in a number of evaluations logarithmic in the
    distance from the start."""
    calls: list[int] = []

    def meets(n: int) -> bool:
        calls.append(n)
        return n >= threshold

    answer, _ = search(meets, start, top)
    assert answer == (max(1, threshold) if threshold <= top else None)
    assert len(calls) == len(set(calls))  # never asked twice
    assert len(calls) <= 4 * math.log2(max(top, 2)) + 4


# ------------------------------------------------------------------------------ plans


def _inputs(rate: float = 600.0) -> tuple[Traffic, Costs, Device]:
    models = {
        f"m{i}": ModelCosts(name=f"m{i}", costs={1: 0.002, 4: 0.003, 8: 0.004},
                            weight_bytes=100_000_000)
        for i in range(6)
    }  # fmt: skip
    shares = [0.4, 0.2, 0.15, 0.1, 0.1, 0.05]
    traffic = Traffic(
        models={f"m{i}": ModelTraffic(name=f"m{i}", rate=rate * s) for i, s in enumerate(shares)}
    )
    costs = Costs(
        backend="cuda", models=models, load_latency=0.001, load_bandwidth=10e9,
        host=HostCosts(request_seconds=0.0002), cores=16, network_seconds=0.0002,
        gateway_seconds=0.0001,
    )  # fmt: skip
    device = Device(name="gpu", weight_budget_bytes=250_000_000, price_per_hour=2.0,
                    watts_busy=300.0, watts_idle=50.0, max_devices=8)  # fmt: skip
    return traffic, costs, device


RUN = Run(warmup=0.5, seconds=2.5, seed=3)


def test_the_lower_bound_is_the_device_time_at_full_batches() -> None:
    traffic, costs, _ = _inputs(rate=6000.0)
    # 6000 req/s x 4 ms / 8 rows = 3 device-seconds per second.
    assert lower_bound(traffic, costs) == 3
    closed = Traffic(models=traffic.models, clients=8)
    assert lower_bound(closed, costs) == 1


def test_a_plan_names_the_smallest_fleet_and_says_why_the_next_smaller_fails() -> None:
    traffic, costs, device = _inputs()
    plan = make_plan(traffic, costs, device, Goal(p99=0.030, error_budget=0.001), RUN)
    assert plan.answer is not None and plan.answer.meets
    assert plan.answer.p99 <= 0.030 and plan.answer.error_share <= 0.001
    below = plan.next_smaller
    assert below is not None and below.workers == plan.answer.workers - 1
    assert not below.meets and below.reasons
    # Each model is placed once, and the placement fits the budgets.
    placed = [m for w in plan.answer.fleet for m in w.models]
    assert sorted(placed) == sorted(traffic.models)
    assert all(w.assigned_bytes <= device.weight_budget_bytes for w in plan.answer.fleet)
    # The cost model of reactantserver report: the fleet's hourly price over its requests
    # (counted at dispatch there, at the answer here: the requests in flight at the edges
    # of the window differ).
    served = sum(m.requests_per_second for m in plan.answer.models)
    per_million = plan.answer.price_per_hour / 3600 / served * 1e6  # type: ignore[operator]
    mean = sum(m.cost_per_million * m.requests_per_second for m in plan.answer.models) / served  # type: ignore[operator]
    assert mean == pytest.approx(per_million, rel=0.01)
    assert all(m.joules_per_request and m.joules_per_request > 0 for m in plan.answer.models)


def test_a_plan_is_deterministic_and_its_json_holds_every_figure() -> None:
    traffic, costs, device = _inputs()
    goal = Goal(p99=0.030)
    one = make_plan(traffic, costs, device, goal, RUN)
    two = make_plan(traffic, costs, device, goal, RUN)
    assert render_plan(one) == render_plan(two)
    data = json.loads(plan_json(one))
    assert data["answer"] == one.answer.workers  # type: ignore[union-attr]
    sizes = [o["workers"] for o in data["evaluated"]]
    assert sizes == sorted(sizes)
    assert {m["name"] for m in data["evaluated"][0]["models"]} == set(traffic.models)


def test_an_open_loop_that_cannot_keep_up_fails_for_falling_behind() -> None:
    traffic, costs, device = _inputs(rate=3000.0)
    outcome = evaluate(1, traffic, costs, device, Goal(p99=0.1), RUN)
    assert not outcome.meets
    assert outcome.reasons[0].startswith("falls behind")
    assert outcome.stopped_at is not None and outcome.stopped_at < RUN.warmup + RUN.seconds


def test_requests_past_their_deadline_count_against_the_error_budget() -> None:
    traffic, costs, device = _inputs()
    tight = Traffic(
        models={
            n: ModelTraffic(name=n, rate=t.rate, deadline=0.001) for n, t in traffic.models.items()
        }
    )
    outcome = evaluate(4, tight, costs, device, Goal(p99=1.0, error_budget=0.01), RUN)
    assert outcome.late > 0 and not outcome.meets
    assert any("after their deadline" in r for r in outcome.reasons)


@settings(max_examples=3, deadline=None)
@given(st.integers(min_value=0, max_value=1000))
def test_a_closed_loop_plan_is_monotone_in_its_table(seed: int) -> None:
    """With the simulator's seed fixed, whatever it is, the plan's table never shows a
    larger fleet failing where a smaller one met the goal (the search's invariant, on the
    real simulator)."""
    traffic, costs, device = _inputs()
    closed = Traffic(models=traffic.models, clients=12)
    device = Device(name="gpu", weight_budget_bytes=device.weight_budget_bytes, max_devices=4)
    plan = make_plan(closed, costs, device, Goal(p99=0.012),
                     Run(warmup=0.5, seconds=1.5, seed=seed))  # fmt: skip
    verdicts = [o.meets for o in plan.evaluated]
    assert verdicts == sorted(verdicts)


def test_traffic_for_models_the_costs_lack_is_refused() -> None:
    traffic, costs, device = _inputs()
    extra = Traffic(models={**traffic.models, "ghost": ModelTraffic(name="ghost", rate=1.0)})
    with pytest.raises(ValueError, match="ghost"):
        make_plan(extra, costs, device, Goal(p99=0.03), RUN)
