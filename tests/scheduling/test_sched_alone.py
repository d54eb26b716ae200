"""The lone lane of the scheduling core (``SchedulingPolicy.admit_alone``,
``dispatch_alone``, ``enqueue_held``): the executable spec.

Two policies with the same models and configuration live through the same history. The
reference takes every request through ``submit`` and ``next_batch``; the other takes each
request that finds nothing queued and nothing running through the lane -- the way the
driver does (``dispatch.Scheduler``) -- either dispatched alone, or held and then queued
(a second request arrived before the pass), or held, queued and cancelled. Between the
lone requests come bursts that queue several requests on several models and drain them,
so that usages, costs, the service level and the counters are anything a worker sees.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reactantserver.config import SchedulerConfig
from reactantserver.errors import LifecycleError
from reactantserver.scheduling import Decision, Request, SchedulingPolicy

#: name -> (compiled sizes, coalescable, weight)
MODELS = {"a": ((1, 2, 4, 8), True, 1.0), "b": ((1, 4), True, 3.0), "c": ((2, 4), False, 0.5)}


def _policies(discipline: str) -> tuple[SchedulingPolicy, SchedulingPolicy]:
    config = SchedulerConfig(discipline=discipline, ema_halflife_seconds=0.5)
    pair = (SchedulingPolicy(config), SchedulingPolicy(config))
    for policy in pair:
        for name, (sizes, coalescable, weight) in MODELS.items():
            policy.add_model(name, sizes, coalescable=coalescable, weight=weight)
    return pair


def _batch_view(decision: Decision) -> Any:
    """A decision as plain values (requests by their numbers)."""
    batch = decision.batch
    shed = tuple(r.seq for r in decision.shed)
    if batch is None:
        return None, shed
    seqs = tuple(r.seq for r in batch.requests)
    view = (batch.seq, batch.model, batch.size, batch.rows, batch.started, batch.cost, seqs)
    return view, shed


def _same(a: SchedulingPolicy, b: SchedulingPolicy, now: float) -> None:
    """Every counter, usage, cost and priority of the two policies is the same float."""
    assert a.statistics(now) == b.statistics(now)
    assert a.priorities(now) == b.priorities(now)
    for name in MODELS:
        assert a.usage(name, now) == b.usage(name, now)


def _outcome(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``'s value, or its error's type and words."""
    try:
        return call(*args, **kwargs), None
    except Exception as exc:
        return None, (type(exc), str(exc))


request_args = st.tuples(
    st.sampled_from(sorted(MODELS)),
    st.integers(min_value=1, max_value=9),  # rows (9: too many for every model)
    st.one_of(st.none(), st.floats(min_value=0.0, max_value=0.02)),  # deadline after arrival
    st.floats(min_value=0.0, max_value=0.01),  # gap before the decision
    st.floats(min_value=1e-6, max_value=0.05),  # device seconds
)
steps = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["alone", "held", "cancelled"]), request_args),
        st.tuples(st.just("burst"), st.lists(request_args, min_size=1, max_size=6)),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["fair", "edf", "fifo"]), steps, st.floats(min_value=0.001, max_value=2.0))
def test_the_lone_lane_leaves_the_policy_as_submit_and_next_batch_do(
    discipline: str, history: list[Any], gap: float
) -> None:
    """For any history: a request that finds nothing queued and nothing running, taken
    through the lane, gets the same admission error or the same request number, the same
    decision (batch, size, rows, start, learned cost, or the same shedding) and leaves the
    same state -- every counter, usage, cost and fair priority equal to the float -- as
    ``submit`` then ``next_batch``; held and then queued (or then cancelled), it is what
    ``submit`` made it at its arrival. Bursts in between make the state anything."""
    ref, lane = _policies(discipline)
    now = 0.0
    for kind, args in history:
        now += gap
        if kind == "burst":
            for model, rows, deadline, _, _ in args:
                due = None if deadline is None else now + deadline
                for policy in (ref, lane):
                    _outcome(policy.submit, model, now=now, rows=rows, deadline=due)
                now += 1e-4
            while ref.queued:
                now += 1e-4
                views = []
                for policy in (ref, lane):
                    decision = policy.next_batch(now)
                    views.append(_batch_view(decision))
                    if decision.batch is not None:
                        policy.complete(decision.batch, 0.003, now + 0.003)
                assert views[0] == views[1]
                now += 0.003
            assert not lane.queued
            _same(ref, lane, now)
            continue
        model, rows, deadline, wait, seconds = args
        due = None if deadline is None else now + deadline
        submitted = _outcome(ref.submit, model, now=now, rows=rows, deadline=due)
        held = _outcome(lane.admit_alone, model, now=now, rows=rows, deadline=due)
        assert held[1] == submitted[1]  # the same refusal, or none
        if submitted[1] is not None:
            _same(ref, lane, now)
            continue
        ours: Request = held[0]
        assert ours is not None and ours.seq == submitted[0].seq
        decided_at = now + wait
        if kind == "alone":
            want = ref.next_batch(decided_at)
            got = lane.dispatch_alone(ours, decided_at)
            assert _batch_view(got) == _batch_view(want)
            assert ours.state is submitted[0].state
            if want.batch is not None:
                ref.complete(want.batch, seconds, decided_at + seconds)
                lane.complete(got.batch, seconds, decided_at + seconds)
            now = decided_at + seconds
        else:
            lane.enqueue_held(ours)
            _same(ref, lane, now)
            if kind == "cancelled":
                assert ref.cancel(submitted[0]) and lane.cancel(ours)
            else:
                want, got = ref.next_batch(decided_at), lane.next_batch(decided_at)
                assert _batch_view(got) == _batch_view(want)
                if want.batch is not None:
                    ref.complete(want.batch, seconds, decided_at + seconds)
                    lane.complete(got.batch, seconds, decided_at + seconds)
            now = decided_at + seconds
        _same(ref, lane, now)


def test_the_lane_is_refused_while_anything_is_queued_or_running() -> None:
    """``admit_alone`` admits nothing (None) while a request is queued or a batch runs,
    and ``dispatch_alone`` refuses to run then: the lane is only for a request alone."""
    policy, _ = _policies("fair")
    queued = policy.submit("a", now=0.0)
    assert policy.admit_alone("b", now=0.0) is None
    batch = policy.next_batch(0.1).batch
    assert batch is not None and batch.requests == (queued,)
    assert policy.admit_alone("b", now=0.1) is None
    policy.complete(batch, 0.01, 0.11)
    held = policy.admit_alone("b", now=0.2)
    assert held is not None
    policy.submit("a", now=0.2)  # what the driver never does: it queues the held one first
    with pytest.raises(LifecycleError, match="nothing queued"):
        policy.dispatch_alone(held, 0.3)
