"""The abuse budget (:mod:`reactantserver.h2.abuse`), sans-IO: counts and times in,
verdicts out. The wire-level behaviour it gives the worker and the gateway is in
``tests/h2/test_h2_abuse.py``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reactantserver.h2.abuse import (
    FLOOD_BURST,
    FLOOD_PER_CALL,
    FLOOD_RATE,
    PREMATURE_RESET_SECONDS,
    RESET_MIN_STREAMS,
    AbuseBudget,
)


def test_provoked_resets_count_as_the_peer_s_own() -> None:
    """200 calls, 101 of them ended early: the 101st ending is the verdict, whether the
    peer reset them or made the server reset them, in any mix."""
    for provoked in (0, 50, 101):
        budget = AbuseBudget(0.0)
        budget.streams = RESET_MIN_STREAMS
        verdicts = [budget.provoked_resets(1) for _ in range(provoked)]
        verdicts += [budget.peer_reset(0.0, 0.5) for _ in range(101 - provoked)]
        assert all(v is None for v in verdicts[:-1])
        assert verdicts[-1] is not None
        assert f"{budget.provoked} reset by the server" in verdicts[-1]


def test_late_peer_resets_are_cancellations_not_abuse() -> None:
    budget = AbuseBudget(0.0)
    budget.streams = RESET_MIN_STREAMS
    for _ in range(RESET_MIN_STREAMS):
        assert budget.peer_reset(0.0, PREMATURE_RESET_SECONDS) is None
    assert budget.peer_resets == 0


def test_nothing_is_judged_before_the_minimum_of_calls() -> None:
    budget = AbuseBudget(0.0)
    budget.streams = RESET_MIN_STREAMS - 1
    assert all(budget.provoked_resets(1) is None for _ in range(1000))
    budget.streams += 1
    assert budget.provoked_resets(1) is not None


def test_the_bucket_refills_with_time_and_with_calls() -> None:
    budget = AbuseBudget(10.0)
    assert budget.wasted_frames(FLOOD_BURST, 10.0) is None
    assert budget.wasted_frames(1, 10.0) is not None  # empty, at once
    budget = AbuseBudget(10.0)
    assert budget.wasted_frames(FLOOD_BURST, 10.0) is None
    assert budget.wasted_frames(int(FLOOD_RATE), 11.0) is None  # a second's refill
    budget.streams += 10
    assert budget.wasted_frames(10 * FLOOD_PER_CALL, 11.0) is None  # ten calls' worth
    assert budget.wasted_frames(1, 11.0) is not None


@given(
    steps=st.lists(
        st.tuples(st.floats(0, 5, allow_nan=False), st.integers(0, 50), st.integers(0, 40)),
        max_size=60,
    )
)
def test_a_peer_within_the_rates_is_never_judged(steps: list[tuple[float, int, int]]) -> None:
    """Invariant: a peer that, between any two moments, sends no more frames for nothing
    than the time between them and the calls it started in between allow (its rate of
    PINGs, SETTINGS or empty DATA within FLOOD_RATE per second plus FLOOD_PER_CALL per
    call) is never given a verdict, however long it goes on."""
    budget = AbuseBudget(0.0)
    now = 0.0
    for gap, calls, frames in steps:
        now += gap
        budget.streams += calls
        allowed = int(gap * FLOOD_RATE) + calls * FLOOD_PER_CALL
        assert budget.wasted_frames(min(frames, allowed), now) is None


@given(
    calls=st.integers(RESET_MIN_STREAMS, 5000),
    provoked_share=st.floats(0.0, 1.0),
)
def test_the_verdict_comes_exactly_past_half(calls: int, provoked_share: float) -> None:
    """Invariant: with ``calls`` calls started, early endings -- peer resets and provoked
    resets together, in any mix -- are judged abuse exactly when they exceed half the
    calls, and on the ending that crosses that line."""
    budget = AbuseBudget(0.0)
    budget.streams = calls
    first = None
    for n in range(1, calls // 2 + 2):
        if n <= provoked_share * (calls // 2 + 1):
            verdict = budget.provoked_resets(1)
        else:
            verdict = budget.peer_reset(0.0, 0.0)
        if verdict is not None and first is None:
            first = n
    assert first == calls // 2 + 1
