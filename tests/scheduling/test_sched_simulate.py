"""Whole-workload simulation through the real ``Scheduler`` under ``MockClock``."""

from __future__ import annotations

import pytest

from reactantserver.config import SchedulerConfig
from reactantserver.scheduling.simulate import (
    poisson_arrivals,
    saturating_rate,
    simulate,
    with_total_rate,
    zipf_models,
)


@pytest.fixture(scope="module")
def saturated() -> list:  # type: ignore[type-arg]
    """8 models, costs spread 100x, every model's demand 1.3x its weighted share."""
    specs = zipf_models(8, cost_range=(0.001, 0.1), rows=(1, 2, 4, 8), seed=3)
    return with_total_rate(specs, saturating_rate(specs, 1.3))


def test_fair_gives_every_saturated_model_its_weight(saturated: list) -> None:  # type: ignore[type-arg]
    report = simulate(
        SchedulerConfig(discipline="fair", max_queue_depth=16), saturated, duration=40, warmup=10
    )
    assert report.max_concurrent == 1
    assert report.utilization == pytest.approx(1.0, abs=1e-6)
    assert all(m.backlogged == 1.0 for m in report.models)
    assert report.worst_share_error() < 0.05
    assert "gpu.share / weight.share" in report.format()


def test_fifo_shares_follow_cost_not_weight(saturated: list) -> None:  # type: ignore[type-arg]
    report = simulate(
        SchedulerConfig(discipline="fifo", max_queue_depth=16), saturated, duration=40, warmup=10
    )
    by_name = {m.name: m for m in report.models}
    # The cheapest, most popular model gets a small fraction of its weighted share.
    assert by_name["m00"].share_ratio < 0.2
    assert report.worst_share_error() > 1.0


def test_edf_meets_or_sheds_deadlines() -> None:
    specs = zipf_models(5, cost_range=(0.002, 0.02), timeout=0.25, seed=1)
    specs = with_total_rate(specs, 2 * saturating_rate(specs, 1.0))  # overloaded
    report = simulate(SchedulerConfig(discipline="edf"), specs, duration=6, warmup=2)
    for model in report.models:
        assert model.completed > 0
        assert model.p99 <= 0.25  # answered in time, or shed / timed out
    assert sum(m.late for m in report.models) > 0


def test_simulations_are_reproducible() -> None:
    specs = zipf_models(4, total_rate=50.0, seed=7)
    assert poisson_arrivals(specs, 5.0, seed=1) == poisson_arrivals(specs, 5.0, seed=1)
    one = simulate(SchedulerConfig(), specs, duration=5.0, seed=2)
    two = simulate(SchedulerConfig(), specs, duration=5.0, seed=2)
    assert one == two
