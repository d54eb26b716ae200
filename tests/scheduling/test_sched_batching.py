"""Row planning and learned costs: the original's worked examples, ported as plain tests."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reactantserver.runtime.assemble import gather, request_rows, scatter
from reactantserver.scheduling.batching import Plan, plan_batch, shrink_size
from reactantserver.scheduling.cost import DEFAULT_COST, CostTable, decayed

# --- plan_batch: every row of the original's table ------------------------------------


@pytest.mark.parametrize(
    ("sizes", "rows", "cap", "expected"),
    [
        # [1,4,8], rows 2,2,2 -> B4, take 2 (prefer a size the queue fills)
        ((1, 4, 8), (2, 2, 2), 0, Plan(size=4, count=2, rows=4)),
        # [1,4,8], rows 6,1 -> B8, both (B grows to hold the head)
        ((1, 4, 8), (6, 1), 0, Plan(size=8, count=2, rows=7)),
        # [4,8], one row -> padded to 4
        ((4, 8), (1,), 0, Plan(size=4, count=1, rows=1)),
        # cap 4 on [1,4,8], rows 2,2,2 -> B4, take 2
        ((1, 4, 8), (2, 2, 2), 4, Plan(size=4, count=2, rows=4)),
        # cap 2 on [4,8], rows 1,1,1 -> B4 (partial fill pads), take 2
        ((4, 8), (1, 1, 1), 2, Plan(size=4, count=2, rows=2)),
        # cap 4, head of 6 rows -> alone at B8 (never split)
        ((4, 8), (6, 1), 4, Plan(size=8, count=1, rows=6)),
    ],
)
def test_plan_batch_table(
    sizes: tuple[int, ...], rows: tuple[int, ...], cap: int, expected: Plan
) -> None:
    assert plan_batch(sizes, rows, cap) == expected


def test_plan_batch_takes_exact_fill_and_stops() -> None:
    assert plan_batch((1, 2, 4, 8), [1] * 20, 0) == Plan(size=8, count=8, rows=8)
    assert plan_batch((1, 2, 4, 8), [3, 3, 3], 0) == Plan(size=8, count=2, rows=6)


def test_plan_batch_reads_only_what_it_needs() -> None:
    consumed: list[int] = []

    def window() -> Iterator[int]:
        for i in range(1_000_000):
            consumed.append(i)
            yield 1

    plan = plan_batch((1, 8), window(), 0)
    assert plan == Plan(size=8, count=8, rows=8)
    assert len(consumed) == 8


def test_plan_batch_rejects_empty_window() -> None:
    with pytest.raises(ValueError, match="at least one request"):
        plan_batch((1, 2), [], 0)


def test_shrink_size_after_shedding() -> None:
    assert shrink_size((1, 4, 8), 8, 3) == 4
    assert shrink_size((1, 4, 8), 8, 8) == 8
    assert shrink_size((4, 8), 4, 1) == 4
    assert shrink_size((), 5, 5) == 5


# --- cost EMA --------------------------------------------------------------------------


def test_cost_first_sample_seeds_then_converges() -> None:
    table = CostTable(alpha=0.2)
    assert table.estimate(4) == DEFAULT_COST
    table.observe(4, 1.0)
    assert table.measured(4) == 1.0  # the first sample seeds
    table.observe(4, 2.0)
    assert table.measured(4) == pytest.approx(1.2)  # 1 + 0.2 * (2 - 1)
    for _ in range(60):
        table.observe(4, 2.0)
    assert table.measured(4) == pytest.approx(2.0, abs=1e-5)


def test_cost_seed_overwrites() -> None:
    table = CostTable(alpha=0.2)
    table.observe(8, 5.0)
    table.seed(8, 1.0)
    assert table.measured(8) == 1.0


def test_cost_estimate_from_neighbours() -> None:
    table = CostTable(alpha=0.2)
    table.seed(4, 0.4)
    table.seed(16, 1.0)
    assert table.estimate(1) == 0.4  # the next measured size up bounds it
    assert table.estimate(8) == 1.0
    assert table.estimate(32) == pytest.approx(2.0)  # largest measured, scaled by rows
    table.clear()
    assert table.estimate(4) == DEFAULT_COST


def test_cost_alpha_is_validated() -> None:
    with pytest.raises(ValueError, match="cost_ema_alpha"):
        CostTable(alpha=0.0)


def test_usage_ema_halves_per_halflife() -> None:
    assert decayed(8.0, 10.0, 10.0, 30.0) == 8.0
    assert decayed(8.0, 10.0, 40.0, 30.0) == pytest.approx(4.0)
    assert decayed(8.0, 10.0, 70.0, 30.0) == pytest.approx(2.0)
    assert decayed(8.0, 10.0, 10.0 + 300.0, 30.0) == pytest.approx(8.0 / 1024)
    # A clock that steps backwards never inflates the value.
    assert decayed(8.0, 10.0, 5.0, 30.0) == 8.0


# --- assembly --------------------------------------------------------------------------


def test_gather_concatenates_and_zero_pads() -> None:
    a = {"x": np.array([[1.0, 2.0]], dtype=np.float32), "k": np.array([7], dtype=np.int64)}
    b = {
        "x": np.array([[3.0, 4.0], [5.0, 6.0]], dtype=np.float32),
        "k": np.array([8, 9], dtype=np.int64),
    }
    batch = gather([a, b], 4)
    np.testing.assert_array_equal(batch["x"], [[1, 2], [3, 4], [5, 6], [0, 0]])
    np.testing.assert_array_equal(batch["k"], [7, 8, 9, 0])
    assert batch["x"].dtype == np.float32


def test_gather_passes_a_full_single_request_through() -> None:
    x = np.ones((4, 3))
    assert gather([{"x": x}], 4)["x"] is x


def test_gather_refuses_mismatches() -> None:
    with pytest.raises(ValueError, match="cannot share a batch"):
        gather([{"x": np.ones((1, 2))}, {"x": np.ones((1, 3))}], 2)
    with pytest.raises(ValueError, match="do not fit"):
        gather([{"x": np.ones((3, 2))}], 2)
    with pytest.raises(ValueError, match="no input 'x'"):
        gather([{"x": np.ones((1, 2))}, {"y": np.ones((1, 2))}], 2)
    with pytest.raises(ValueError, match="same leading"):
        request_rows({"x": np.ones((1, 2)), "y": np.ones((2, 2))})


def test_scatter_returns_views_per_request() -> None:
    out = np.arange(8).reshape(4, 2)
    parts = scatter({"y": out}, [1, 2])
    np.testing.assert_array_equal(parts[0]["y"], [[0, 1]])
    np.testing.assert_array_equal(parts[1]["y"], [[2, 3], [4, 5]])
    assert all(np.shares_memory(p["y"], out) for p in parts)
    with pytest.raises(ValueError, match="at least 5 rows"):
        scatter({"y": out}, [4, 1])


def test_round_trip_through_a_doubling_model() -> None:
    requests = [{"x": np.full((n, 2), float(n))} for n in (1, 3, 2)]
    batch = gather(requests, 8)
    outputs = {"y": batch["x"] * 2}
    for req, part in zip(requests, scatter(outputs, [1, 3, 2]), strict=True):
        np.testing.assert_array_equal(part["y"], req["x"] * 2)
    assert math.isclose(float(outputs["y"][6:].sum()), 0.0)


@settings(max_examples=200, deadline=None)
@given(
    seed=st.floats(1e-6, 1.0),
    runs=st.lists(st.tuples(st.sampled_from([1, 4]), st.floats(1e-6, 1.0)), max_size=30),
)
def test_fastest_is_the_quickest_run_since_the_seed(
    seed: float, runs: list[tuple[int, float]]
) -> None:
    """The inline decision reads ``fastest``: for every size it is exactly the minimum of
    its seed and every later run at that size (never moved by slow runs, never by runs
    at another size), ``None`` for a size never seen, and a new seed starts it over."""
    table = CostTable(alpha=0.2)
    table.seed(1, seed)
    seen: dict[int, list[float]] = {1: [seed]}
    for size, seconds in runs:
        table.observe(size, seconds)
        seen.setdefault(size, []).append(seconds)
    for size in (1, 4, 8):
        assert table.fastest(size) == (min(seen[size]) if size in seen else None)
    table.seed(1, 0.5)
    assert table.fastest(1) == 0.5
