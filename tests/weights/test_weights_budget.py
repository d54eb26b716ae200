"""The budget formula, the arena it is taken from, the peak-probe arithmetic, and the
sizer that keeps the budget over a worker's life."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reactantserver.config.schema import RuntimeConfig
from reactantserver.errors import ConfigError
from reactantserver.weights import (
    BudgetSizer,
    ProbeMeasurement,
    arena_from_device,
    budget_from_config,
    cache_enabled,
    max_scratch,
    probe_order,
    resolve_arena,
    weight_budget,
)

# The original's table: (arena, fraction, wiggle, scratch, pinned) -> (on_demand, over-commit)
TABLE = [
    ((1000, 1.0, 0.1, 0, 0), (900, False)),
    ((1000, 1.0, 0.1, 300, 0), (600, False)),
    ((1000, 1.0, 0.1, 300, 200), (400, False)),
    ((1000, 1.0, 0.1, 300, 700), (0, True)),
]


@pytest.mark.parametrize(("args", "expected"), TABLE)
def test_budget_table(args: tuple[int, float, float, int, int], expected: tuple[int, bool]) -> None:
    arena, fraction, wiggle, scratch, pinned = args
    b = weight_budget(
        arena=arena, fraction=fraction, wiggle=wiggle, max_scratch=scratch, pinned_bytes=pinned
    )
    assert (b.on_demand, b.pinned_over_commit) == expected


def test_budget_parts_and_the_fraction_cap() -> None:
    b = weight_budget(arena=1000, fraction=0.5, wiggle=0.1, max_scratch=300, pinned_bytes=100)
    assert (b.scratch_ceiling, b.weight_pool, b.on_demand) == (900, 500, 400)
    assert b.warnings == ()


def test_over_commit_and_no_room_are_warned_about() -> None:
    b = weight_budget(arena=1000, fraction=1.0, wiggle=0.1, max_scratch=300, pinned_bytes=700)
    assert len(b.warnings) == 2
    assert "device-pinned weights (700 bytes) exceed the weight pool (600 bytes" in b.warnings[0]
    assert "budget 0 bytes" in b.warnings[1]
    # scratch beyond the ceiling leaves no pool at all, never a negative one
    b = weight_budget(arena=1000, fraction=1.0, wiggle=0.1, max_scratch=5000)
    assert (b.weight_pool, b.on_demand, b.pinned_over_commit) == (0, 0, False)


@pytest.mark.parametrize(
    ("fraction", "wiggle"), [(-0.1, 0.1), (1.5, 0.1), (math.nan, 0.1), (1.0, 1.0), (1.0, -0.5)]
)
def test_out_of_range_fractions_are_config_errors(fraction: float, wiggle: float) -> None:
    with pytest.raises(ConfigError, match=r"runtime\.weight_cache"):
        weight_budget(arena=1000, fraction=fraction, wiggle=wiggle)


@given(
    arena=st.integers(0, 2**40),
    fraction=st.floats(0.0, 1.0),
    wiggle=st.floats(0.0, 0.99),
    scratch=st.integers(0, 2**40),
    pinned=st.integers(0, 2**40),
)
def test_budget_never_promises_more_than_the_arena_holds(
    arena: int, fraction: float, wiggle: float, scratch: int, pinned: int
) -> None:
    """Whenever the pinned set fits, pinned + on-demand + scratch stays under the
    (1 - wiggle) ceiling and the weights stay under the fraction cap; the on-demand budget
    is never negative."""
    b = weight_budget(
        arena=arena, fraction=fraction, wiggle=wiggle, max_scratch=scratch, pinned_bytes=pinned
    )
    assert 0 <= b.on_demand <= b.weight_pool
    assert b.weight_pool <= fraction * arena
    if not b.pinned_over_commit and b.weight_pool > 0:
        assert b.on_demand + pinned + scratch <= b.scratch_ceiling
        assert b.on_demand + pinned == b.weight_pool


def test_the_arena_comes_from_the_backend_else_the_config() -> None:
    cpu = RuntimeConfig(arena_bytes=1000)
    assert resolve_arena(None, cpu) == 1000  # CPU: no arena reported, the setting stands in
    assert resolve_arena(64 * 2**30, cpu) == 64 * 2**30  # a reported arena wins
    assert resolve_arena(None, RuntimeConfig()) is None
    assert arena_from_device(80 * 10**9, 0.9) == 72 * 10**9
    with pytest.raises(ConfigError, match="mem_fraction"):
        arena_from_device(100, 0.0)


def test_the_cache_runs_only_with_a_fraction_and_an_arena() -> None:
    assert cache_enabled(RuntimeConfig(), 1000)
    assert not cache_enabled(RuntimeConfig(weight_cache_fraction=0.0), 1000)
    assert not cache_enabled(RuntimeConfig(), None)
    b = budget_from_config(RuntimeConfig(arena_bytes=1000), reported_arena=None, max_scratch=300)
    assert b is not None and b.on_demand == 600
    assert budget_from_config(RuntimeConfig(), reported_arena=None) is None
    off = RuntimeConfig(weight_cache_fraction=0.0, arena_bytes=1000)
    assert budget_from_config(off, reported_arena=None) is None


def test_probe_runs_pinned_first_then_ascending_size() -> None:
    sizes = {"big": 300, "p": 900, "small": 10, "mid": 100, "mid2": 100}
    assert probe_order(sizes, {"p"}) == ("p", "small", "mid", "mid2", "big")


def test_scratch_from_reset_peaks_is_exact_per_model() -> None:
    runs = [
        ProbeMeasurement(model="a", weight_nbytes=10, peak_bytes=150, baseline_bytes=110),
        ProbeMeasurement(model="b", weight_nbytes=50, peak_bytes=500, baseline_bytes=150),
        ProbeMeasurement(model="c", weight_nbytes=90, peak_bytes=100, baseline_bytes=190),
    ]
    assert max_scratch(runs, pinned_bytes=100) == 350  # b: 500 - 150; c's slack counts 0


def test_scratch_from_a_session_peak_uses_the_ordering_estimate() -> None:
    # pinned 100; models ascend 10, 50; the session peak only grows.
    runs = [
        ProbeMeasurement(model="p", weight_nbytes=100, peak_bytes=130, pinned=True),
        ProbeMeasurement(model="a", weight_nbytes=10, peak_bytes=160),
        ProbeMeasurement(model="b", weight_nbytes=50, peak_bytes=240),
    ]
    # p: 130-100-0 = 30; a: 160-100-10 = 50; b: 240-100-50 = 90
    assert max_scratch(runs, pinned_bytes=100) == 90
    assert max_scratch([], pinned_bytes=100) == 0


# ------------------------------------------------------------------------------ the sizer


def test_the_sizer_learns_the_scratch_from_the_probe_then_only_from_raised_peaks() -> None:
    sizer = BudgetSizer(arena=1000, fraction=1.0, wiggle=0.1)
    assert sizer.budget.on_demand == 900 and sizer.probing(True) and not sizer.probing(False)
    # Before the probe ends a warm-up never moves the estimate (it is a probe run).
    assert not sizer.observe_warm_up(peak_before=0, peak_after=500, in_use_before=0)
    sizer.record_probe(
        ProbeMeasurement(model="a", weight_nbytes=100, peak_bytes=400, baseline_bytes=100)
    )
    sizer.record_probe(
        ProbeMeasurement(model="gone", weight_nbytes=10, peak_bytes=900, baseline_bytes=0)
    )
    assert sizer.finish_probe({"a"}, pinned_bytes=0) == 1  # "gone" was unloaded meanwhile
    assert sizer.resize(0) is not None and sizer.budget.max_scratch == 300
    assert sizer.resize(0) is None  # nothing changed
    # A later warm-up that did not raise the peak says nothing about scratch.
    assert not sizer.observe_warm_up(peak_before=800, peak_after=800, in_use_before=0)
    assert sizer.observe_warm_up(peak_before=800, peak_after=900, in_use_before=200)
    assert sizer.resize(0) is not None and sizer.budget.max_scratch == 700


@given(
    events=st.lists(
        st.one_of(
            st.tuples(st.just("resize"), st.integers(0, 2000)),
            st.tuples(st.just("probe"), st.integers(0, 2000), st.integers(0, 2000)),
            st.tuples(st.just("finish"), st.integers(0, 2000)),
            st.tuples(
                st.just("warm"), st.integers(0, 2000), st.integers(0, 2000), st.integers(0, 2000)
            ),
        ),
        max_size=20,
    )
)
def test_the_sizers_scratch_estimate_never_shrinks(events: list[tuple[object, ...]]) -> None:
    """Whatever the order of probe runs, the end of the probe, warm-ups and re-solves, the
    scratch estimate only grows, ``resize`` answers a new split exactly when the split
    changed, and every split it answers is the budget formula's for its inputs."""
    sizer = BudgetSizer(arena=1000, fraction=0.9, wiggle=0.1)
    last_scratch, pinned = 0, 0
    for event in events:
        kind = event[0]
        if kind == "resize":
            pinned = int(event[1])  # type: ignore[call-overload]
            before = sizer.budget
            after = sizer.resize(pinned)
            assert (after is None) == (sizer.budget == before)
            assert sizer.budget == weight_budget(
                arena=1000, fraction=0.9, wiggle=0.1,
                max_scratch=sizer.budget.max_scratch, pinned_bytes=pinned,
            )  # fmt: skip
        elif kind == "probe":
            peak, baseline = int(event[1]), int(event[2])  # type: ignore[call-overload]
            sizer.record_probe(
                ProbeMeasurement(
                    model="m", weight_nbytes=1, peak_bytes=peak, baseline_bytes=baseline
                )
            )
        elif kind == "finish":
            sizer.finish_probe({"m"}, pinned_bytes=int(event[1]))  # type: ignore[call-overload]
        elif kind == "warm":
            before, after, in_use = (int(v) for v in event[1:])  # type: ignore[call-overload]
            sizer.observe_warm_up(peak_before=before, peak_after=after, in_use_before=in_use)
        sizer.resize(pinned)
        assert sizer.budget.max_scratch >= last_scratch
        last_scratch = sizer.budget.max_scratch
