"""The fleet benchmark's pure parts (``benchmarks/fleet_live.py``): workload draws, the
counter deltas that make a measured window, the load-time fit and the tables. No timing is
asserted: the benchmark itself (``nox -s bench -- fleet``) is where numbers live."""

from __future__ import annotations

import math
import sys
from collections import Counter

import attrs
import pytest
from conftest import ROOT, load_file
from hypothesis import given
from hypothesis import strategies as st

fl = load_file("reactantserver_bench_fleet_live", ROOT / "benchmarks" / "fleet_live.py")


def test_zipf_popularity_is_normalised_ranked_and_seeded() -> None:
    weights = fl.zipf_weights(4, 1.0)
    assert math.isclose(sum(weights), 1.0)
    assert weights == sorted(weights, reverse=True)
    assert math.isclose(weights[0] / weights[1], 2.0)  # rank 1 twice as popular as rank 2
    names = [f"m{i}" for i in range(6)]
    shares = fl.popularity(names, 1.0, seed=3)
    assert shares == fl.popularity(names, 1.0, seed=3)
    assert sorted(shares.values()) == sorted(fl.zipf_weights(6, 1.0))


def test_draws_follow_the_shares() -> None:
    shares = {"a": 0.5, "b": 0.3, "c": 0.2}
    draw = fl.ModelDraw(shares, seed=7)
    counts = Counter(draw() for _ in range(20_000))
    for name, share in shares.items():
        assert abs(counts[name] / 20_000 - share) < 0.02
    one, two = fl.ModelDraw(shares, seed=9), fl.ModelDraw(shares, seed=9)  # same seed, same draws
    assert [one() for _ in range(100)] == [two() for _ in range(100)]


def _counters(loads: float, load_s: float, **models: tuple[float, int, int, int]) -> object:
    return fl.WorkerCounters(
        loads=loads,
        load_seconds=load_s,
        models={n: fl.ModelCounters(*values) for n, values in models.items()},
    )


def test_a_window_is_the_delta_of_two_snapshots() -> None:
    before = {
        "w0": _counters(10, 1.0, a=(1.0, 5, 4, 5), b=(0.0, 0, 0, 0)),
        "w1": _counters(3, 0.5, a=(0.5, 2, 2, 2), b=(2.0, 9, 9, 9)),
    }
    after = {
        "w0": _counters(14, 1.4, a=(1.6, 15, 8, 15), b=(0.0, 0, 0, 0)),
        "w1": _counters(4, 0.6, a=(0.5, 2, 2, 2), b=(2.4, 19, 10, 19)),
    }
    latencies = [0.004, 0.001, 0.003, 0.002]
    w = fl.window("round_robin", 2.0, latencies, before, after)
    assert w.latencies == (0.001, 0.002, 0.003, 0.004)
    assert w.requests == 4 and w.rps == 2.0
    assert w.loads == 5 and math.isclose(w.load_seconds, 0.5)
    assert w.loads_per_1000 == 1250.0 and w.loads_per_second == 2.5
    assert w.dispatches == 5 and w.rows == 20 and w.mean_batch_rows == 4.0
    assert w.per_model["a"] == pytest.approx((0.6, 4, 10))
    assert w.per_model["b"] == pytest.approx((0.4, 1, 10))
    assert w.model_workers == {"a": ("w0",), "b": ("w1",)}
    assert w.p50 == 0.002 and w.p99 == 0.004


def test_the_goals_compare_the_two_modes() -> None:
    def win(mode: str, n: int, loads: float) -> object:
        return fl.Window(mode, 1.0, tuple([0.01] * n), loads, 0.0, 1, 1, {})

    goals = fl.Goals.of(win("round_robin", 100, 60), win("lpt_packing", 150, 10))
    assert goals.fewer_loads == pytest.approx(600 / (1000 * 10 / 150))
    assert goals.throughput == pytest.approx(1.5)
    assert all(" met" in line for line in goals.lines())
    none = fl.Goals.of(win("round_robin", 100, 60), win("lpt_packing", 110, 0))
    assert math.isinf(none.fewer_loads)
    assert "NOT met" in none.lines()[1]  # 1.1x the throughput


@given(
    intercept=st.floats(0, 1, allow_nan=False),
    slope=st.floats(0, 1, allow_nan=False),
    xs=st.lists(st.integers(1, 10**8), min_size=2, max_size=20, unique=True),
)
def test_fit_line_recovers_an_exact_line(intercept: float, slope: float, xs: list[int]) -> None:
    """Points on ``y = a + b x`` (at least two distinct x) fit back to ``a`` and ``b``: the
    load-time fit (seconds against bytes) is plain least squares."""
    a, b = fl.fit_line(xs, [intercept + slope * x for x in xs])
    assert a == pytest.approx(intercept, abs=1e-6 + 1e-6 * slope * max(xs))
    assert b == pytest.approx(slope, abs=1e-9, rel=1e-6)


def test_costs_fill_unmeasured_sizes_from_the_line() -> None:
    costs = fl.affine_costs({1: 0.001, 8: 0.008}, (1, 2, 4, 8))
    assert costs == pytest.approx({1: 0.001, 2: 0.002, 4: 0.004, 8: 0.008})
    # A line that dips below the cheapest measurement is clamped to it.
    assert fl.affine_costs({4: 0.004, 8: 0.010}, (1, 4))[1] == 0.004


def test_prediction_errors_and_table() -> None:
    assert fl.error(1.2, 1.0) == pytest.approx(0.2)
    assert fl.error(0.0, 0.0) == 0.0
    assert math.isinf(fl.error(1.0, 0.0))
    live = fl.Window("lpt_packing", 1.0, (0.010, 0.020), 2.0, 0.01, 2, 4, {})
    sim = fl.Prediction("lpt_packing", 2.0, 0.012, 0.03, 3.0, 1500.0, 2.0)
    table = fl.prediction_table([(live, sim)], 0.25)
    p50 = next(line for line in table.splitlines() if "p50 ms" in line)
    assert "+20%" in p50 and "yes" in p50
    loads = next(line for line in table.splitlines() if "loads/s" in line)
    # 3 predicted loads against 2: +50%, but within one event of the live count.
    assert "+50%" in loads and "2 / 3.0" in loads and "yes" in loads
    assert "lpt_packing" in fl.live_table([live])
    # Many events: the relative rule decides (40 against 20 over the window).
    busy = fl.Window("round_robin", 10.0, (0.010, 0.020), 20.0, 0.01, 2, 4, {})
    table = fl.prediction_table([(busy, fl.Prediction("round_robin", 2.0, 0.012, 0.03,
                                                      4.0, 1.0, 2.0))], 0.25)  # fmt: skip
    loads = next(line for line in table.splitlines() if "loads/s" in line)
    assert "+100%" in loads and "20 / 40.0" in loads and "NO" in loads


def test_a_count_is_within_by_the_tolerance_or_one_event() -> None:
    """The count rule: within when |predicted - live| <= max(tolerance x live, 1)."""
    assert fl.count_within(0, 0.0, 0.25) and fl.count_within(0, 1.0, 0.25)
    assert not fl.count_within(0, 1.5, 0.25)
    assert fl.count_within(3, 4.0, 0.25) and not fl.count_within(3, 4.5, 0.25)
    assert fl.count_within(100, 125.0, 0.25) and not fl.count_within(100, 126.0, 0.25)
    assert not fl.count_within(100, 74.0, 0.25)
    # A zero live window against a simulated 5 loads in the same window: NO, with the
    # counts printed (not "inf" alone).
    live = fl.Window("lpt_packing", 15.0, (0.010,), 0.0, 0.0, 1, 1, {})
    sim = fl.Prediction("lpt_packing", 2.0, 0.010, 0.03, 5 / 15, 1.0, 2.0)
    loads = next(line for line in fl.prediction_table([(live, sim)], 0.25).splitlines()
                 if "loads/s" in line)  # fmt: skip
    assert "inf" in loads and "0 / 5.0" in loads and "NO" in loads


@given(
    live=st.integers(0, 10_000),
    predicted=st.floats(0, 20_000, allow_nan=False),
    tolerance=st.floats(0, 1, allow_nan=False),
)
def test_the_count_rule_is_the_relative_rule_above_one_over_tolerance(
    live: int, predicted: float, tolerance: float
) -> None:
    """Whenever the tolerance band holds at least one event (live x tolerance >= 1), the
    count rule is exactly the relative-error rule; below it, it accepts exactly the
    predictions within one event. It never rejects what the relative rule accepts."""
    relative = live > 0 and abs(fl.error(predicted, live)) <= tolerance
    rule = fl.count_within(live, predicted, tolerance)
    if relative:
        assert rule
    if live * tolerance >= 1:
        assert rule == (abs(predicted - live) <= tolerance * live)
    else:
        assert rule == (abs(predicted - live) <= 1)


def test_the_controllers_are_described_side_by_side() -> None:
    control = fl.Control(
        repacks={"startup": 1, "compute": 1, "operator": 1, "fleet": 0},
        moved_by_operator=("a", "b"),
    )
    text = control.describe()
    assert "compute 1, operator 1, startup 1" in text and "fleet" not in text
    assert "moved by the operator Repack: a b" in text and "in the window: none" in text
    live = fl.Window("lpt_packing", 1.0, (0.01,), 0.0, 0.0, 1, 1, {}, control=control)
    sim = fl.Prediction("lpt_packing", 1.0, 0.01, 0.01, 0.0, 0.0, 1.0, control=control)
    rr = fl.Window("round_robin", 1.0, (0.01,), 0.0, 0.0, 1, 1, {})
    rr_sim = fl.Prediction("round_robin", 1.0, 0.01, 0.01, 0.0, 0.0, 1.0)
    lines = fl.control_lines([(live, sim), (rr, rr_sim)])
    assert [line.split(":")[0] for line in lines] == [
        "lpt_packing      live",
        "lpt_packing simulated",
    ]


def test_a_window_survives_json() -> None:
    import json

    w = fl.Window(
        "lpt_packing", 2.0, (0.01, 0.02), 3.0, 0.1, 4, 5, {"a": (0.5, 4, 5)},
        model_workers={"a": ("w0",)}, worker_compute={"w0": 0.5},
        control=fl.Control(repacks={"startup": 1}, moved_in_window=("a",)),
    )  # fmt: skip
    assert fl.window_from_json(json.loads(json.dumps(fl.window_to_json(w)))) == w
    plain = attrs.evolve(w, control=None)
    assert fl.window_from_json(json.loads(json.dumps(fl.window_to_json(plain)))) == plain


def test_bench_runner_passes_options_to_the_one_benchmark_picked() -> None:
    """``nox -s bench -- fleet --runs 3`` gives ``--runs 3`` to bench_fleet; options with
    several benchmarks picked are refused rather than dropped."""
    import subprocess

    run = [sys.executable, str(ROOT / "benchmarks" / "run.py")]
    helped = subprocess.run([*run, "fleet", "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0, helped.stderr
    assert "usage: bench_fleet.py" in helped.stdout and "--runs" in helped.stdout
    refused = subprocess.run([*run, "--runs", "2"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "options --runs 2 need exactly one benchmark" in refused.stderr
