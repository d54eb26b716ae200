"""The restart policy: backoff min(2^(n-1), 30) s, reset after 60 s up, restart budget.

Sans-IO: the policy is given times and returns decisions; no clock, no process.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import child_runs

from reactantserver.node.restart import GiveUp, Restart, RestartPolicy


def crash_after(policy: RestartPolicy, now: float, uptime: float) -> tuple[float, object]:
    """Start the child at ``now``, let it run ``uptime`` seconds and crash."""
    policy.started(now)
    return now + uptime, policy.exited(now + uptime)


def test_fast_crashes_back_off_1_2_4_8_16_30_30() -> None:
    policy = RestartPolicy()
    now, delays = 0.0, []
    for _ in range(8):
        now, decision = crash_after(policy, now, 0.5)
        assert isinstance(decision, Restart)
        delays.append(decision.delay)
        now += decision.delay
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]


def test_sixty_seconds_up_resets_the_backoff() -> None:
    policy = RestartPolicy()
    now, _ = crash_after(policy, 0.0, 1.0)
    now, _ = crash_after(policy, now + 1, 1.0)
    now, third = crash_after(policy, now + 2, 59.9)
    assert third == Restart(4.0, 3)
    now, after_stable = crash_after(policy, now + 4, 60.0)
    assert after_stable == Restart(1.0, 1)


def test_budget_allows_exactly_max_restarts_in_a_row() -> None:
    policy = RestartPolicy(max_restarts=2)
    now, first = crash_after(policy, 0.0, 0.1)
    now, second = crash_after(policy, now + 1, 0.1)
    now, third = crash_after(policy, now + 2, 0.1)
    assert (first, second, third) == (Restart(1.0, 1), Restart(2.0, 2), GiveUp(3, 2))


def test_a_stable_run_renews_the_budget() -> None:
    policy = RestartPolicy(max_restarts=1)
    now, first = crash_after(policy, 0.0, 0.1)
    now, second = crash_after(policy, now + 1, 120.0)
    now, third = crash_after(policy, now + 1, 0.1)
    assert (first, second, third) == (Restart(1.0, 1), Restart(1.0, 1), GiveUp(2, 1))


def test_a_child_that_never_started_counts_as_a_failure() -> None:
    policy = RestartPolicy(max_restarts=1)
    assert policy.exited(0.0) == Restart(1.0, 1)  # e.g. the executable could not be started
    assert policy.exited(1.0) == GiveUp(2, 1)


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="max_restarts must be >= 0"):
        RestartPolicy(max_restarts=-1)


@settings(max_examples=300, deadline=None)
@given(runs=child_runs(), budget=st.integers(min_value=0, max_value=6))
def test_backoff_follows_the_model_for_any_run_history(runs: list[float], budget: int) -> None:
    """For any sequence of run lengths: every delay is min(2^(n-1), 30) where n counts the
    crashes since the last run of at least 60 s (that run included); GiveUp comes exactly
    when n exceeds a non-zero budget, and never under budget 0 (restart forever)."""
    policy = RestartPolicy(max_restarts=budget)
    now, streak = 0.0, 0
    for uptime in runs:
        started = now
        now, decision = crash_after(policy, now, uptime)
        streak = 1 if now - started >= 60.0 else streak + 1  # the uptime as the clock saw it
        if budget and streak > budget:
            assert decision == GiveUp(streak, budget)
            return
        assert decision == Restart(min(2.0 ** (streak - 1), 30.0), streak)
        assert 1.0 <= decision.delay <= 30.0
        now += decision.delay
