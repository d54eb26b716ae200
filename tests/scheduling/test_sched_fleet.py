"""The fleet simulator: real router, packer and worker policies, discrete virtual time."""

from __future__ import annotations

import itertools
import math

import pytest

from reactantserver.config import GatewaySchedulingConfig
from reactantserver.fleet import (
    ClosedLoop,
    FleetModel,
    FleetWorker,
    simulate_fleet,
    zipf_fleet_catalog,
)


def _catalog() -> tuple[list[FleetModel], list[FleetWorker]]:
    """12 models whose weights are 3x one worker's budget, on 4 workers (so one copy of the
    catalog fits the fleet, but not one worker)."""
    models = zipf_fleet_catalog(12, total_rate=1.0, seed=2)
    budget = sum(m.nbytes for m in models) // 3
    workers = [FleetWorker(name=f"w{i}", budget=budget, bandwidth=12e9) for i in range(4)]
    return models, workers


def _run(mode: str, **kw: object):  # type: ignore[no-untyped-def]
    models, workers = _catalog()
    gateway = GatewaySchedulingConfig(
        mode=mode,  # type: ignore[arg-type]
        rebalance_compute_seconds=5.0,
        first_rebalance_compute_seconds=1.0,
        hysteresis=0.2,
    )
    options = {"duration": 12.0, "warmup": 3.0, "seed": 3, "closed_loop": ClosedLoop(clients=16)}
    options.update(kw)
    return simulate_fleet(models, workers, gateway, **options)  # type: ignore[arg-type]


def test_fleet_simulation_is_deterministic() -> None:
    assert _run("lpt_packing") == _run("lpt_packing")
    assert _run("round_robin") == _run("round_robin")


def test_lpt_packing_loads_fewer_weights_than_round_robin_when_memory_binds() -> None:
    """The catalog does not fit on one worker: round robin sends every model everywhere and
    thrashes the weight caches; lpt_packing places each model once and stops loading."""
    rr = _run("round_robin")
    lo = _run("least_outstanding")
    lpt = _run("lpt_packing")
    assert rr.weight_loads > 100
    assert lpt.weight_loads * 20 < rr.weight_loads
    assert lpt.weight_loads * 20 < lo.weight_loads
    assert lpt.throughput > 1.5 * rr.throughput
    assert lpt.warnings == ()
    assert lpt.repacks["startup"] == 1 and lpt.repacks["compute"] >= 1
    # Each model is placed on exactly one worker (replicas 1; a repack may have moved it
    # during the window, so it may have been served by two).
    placed = [m for w in lpt.workers for m in w.models]
    assert sorted(placed) == [m.name for m in lpt.models]
    assert all(1 <= len(m.workers) <= 2 for m in lpt.models)
    # Round robin spreads every model over every worker.
    assert all(len(model.workers) == 4 for model in rr.models)
    for report in (rr, lo, lpt):
        assert report.completed > 0 and report.rejected == 0
        for w in report.workers:
            assert 0.0 <= w.idle <= 1.0
            assert w.compute + w.loading <= 1.0 + 1e-9


def test_open_loop_and_unlimited_memory() -> None:
    """With the cache off (budget 0) nothing is ever loaded; open-loop Poisson arrivals are
    all answered below saturation, with latency at least one batch cost."""
    models = [
        FleetModel(name="a", costs={1: 0.002, 4: 0.004}, nbytes=10, rate=100.0),
        FleetModel(name="b", costs={1: 0.004}, nbytes=10, rate=50.0),
    ]
    workers = [FleetWorker(name="w0"), FleetWorker(name="w1")]
    report = simulate_fleet(
        models,
        workers,
        GatewaySchedulingConfig(mode="least_outstanding"),
        duration=10.0,
        warmup=2.0,
    )
    assert report.weight_loads == 0
    assert report.throughput == pytest.approx(150.0, rel=0.15)
    by_name = {m.name: m for m in report.models}
    assert by_name["a"].p50 >= 0.002 - 1e-9 and by_name["b"].p50 >= 0.004 - 1e-9
    assert not math.isnan(report.p99)
    assert "mode=least_outstanding" in report.format()


def test_one_unbatched_worker_is_an_md1_queue() -> None:
    """The event engine against queueing theory: one worker, one model that never coalesces
    (compiled size 1 only), Poisson arrivals at rate l, constant service c: an M/D/1 queue,
    whose mean sojourn time is c + rho c / (2 (1 - rho)) with rho = l c."""
    c, rate = 0.01, 60.0
    rho = rate * c
    model = FleetModel(name="a", costs={1: c}, rate=rate)
    report = simulate_fleet(
        [model], [FleetWorker(name="w0")], GatewaySchedulingConfig(), duration=400.0, warmup=20.0
    )
    (m,) = report.models
    expected = c + rho * c / (2 * (1 - rho))
    assert m.mean == pytest.approx(expected, rel=0.08)
    assert report.workers[0].compute == pytest.approx(rho, rel=0.05)
    assert report.workers[0].idle == pytest.approx(1 - rho, rel=0.08)


def test_example_script_prints_the_comparison(tmp_path: object) -> None:
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "simulate_fleet.py"
    out = subprocess.run(
        [
            sys.executable,
            str(script),
            *("--models", "6", "--workers", "3", "--clients", "8"),
            *("--duration", "6", "--warmup", "2", "--top", "2"),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    for mode in ("round_robin", "least_outstanding", "lpt_packing"):
        assert f"| {mode}" in out
    assert "loads/1k req" in out and "| m00 |" in out


def test_mean_load_seconds_is_the_modelled_transfer_time() -> None:
    """Every load of a model of ``b`` bytes takes ``b / bandwidth + load_latency``: with one
    model size, the report's mean load time is exactly that (what a live worker's
    ``worker_weight_load_seconds_total`` per load is compared with)."""
    models = [
        FleetModel(name=f"m{i}", costs={1: 0.001}, nbytes=1_000_000, rate=1.0) for i in range(4)
    ]
    workers = [FleetWorker(name="w0", budget=2_000_000, bandwidth=1e9, load_latency=0.0005)]
    report = simulate_fleet(
        models, workers, GatewaySchedulingConfig(), duration=2.0, warmup=0.5,
        closed_loop=ClosedLoop(clients=4),
    )  # fmt: skip
    assert report.weight_loads > 0
    assert report.mean_load_seconds == pytest.approx(0.0015)
    assert report.workers[0].load_seconds == pytest.approx(0.0015 * report.weight_loads)


def test_request_seconds_are_worker_cpu_in_series_with_the_device() -> None:
    """A saturated worker (closed loop, more clients than it can serve, one compiled size so
    nothing coalesces) serves one request per ``cost + request_seconds``: its throughput falls
    from 1/c to 1/(c + r), the device is busy c/(c + r) of the time and the request CPU the
    rest, while the compute the policy records (what ModelControlStatus reports, what the
    gateway's packer reads) is still c per execution."""
    from reactantserver.fleet import FleetReport, FleetSimulation

    c, r = 0.004, 0.001
    model = FleetModel(name="a", costs={1: c}, rate=1.0)

    def run(request_seconds: float) -> tuple[FleetSimulation, FleetReport]:
        sim = FleetSimulation(
            [model],
            [FleetWorker(name="w0", request_seconds=request_seconds)],
            GatewaySchedulingConfig(),
            duration=20.0,
            warmup=2.0,
            closed_loop=ClosedLoop(clients=8),
        )
        return sim, sim.run()

    _, free = run(0.0)
    sim, charged = run(r)
    assert free.throughput == pytest.approx(1 / c, rel=0.01)
    assert charged.throughput == pytest.approx(1 / (c + r), rel=0.01)
    (w,) = charged.workers
    assert w.compute == pytest.approx(c / (c + r), rel=0.01)
    assert w.request_cpu == pytest.approx(r / (c + r), rel=0.01)
    assert w.idle == pytest.approx(0.0, abs=0.01)
    stats = sim.workers["w0"].policy.statistics(sim.now).models["a"]
    assert stats.compute_seconds == pytest.approx(c * stats.dispatches)
    # Latency: 8 clients queue behind each other, each request waits for the 7 ahead.
    assert charged.p50 == pytest.approx(8 * (c + r), rel=0.05)


def test_an_operator_repack_runs_at_its_virtual_time_and_is_logged() -> None:
    """``operator_repacks`` are Repack RPCs at virtual times: each runs once, at that time,
    with trigger ``operator``, beside the startup repack at 0 and the compute repacks of the
    cadence; the repack log holds every repack in time order, with the fleet compute it ran
    at (non-decreasing) and the placement after it, and the report's repack counts are the
    log's counts by trigger."""
    report = _run("lpt_packing", operator_repacks=(1.5, 7.25))
    log = report.repack_log
    names = sorted(m.name for m in report.models)
    # Startup places every model (from nothing): all of them "moved".
    assert log[0].trigger == "startup" and log[0].at == 0.0 and list(log[0].moved) == names
    operator = [e for e in log if e.trigger == "operator"]
    assert [e.at for e in operator] == [1.5, 7.25]
    assert [e.at for e in log] == sorted(e.at for e in log)
    assert all(a.fleet_compute <= b.fleet_compute for a, b in itertools.pairwise(log))
    counts = {t: sum(e.trigger == t for e in log) for t in ("startup", "compute", "operator")}
    assert {t: report.repacks[t] for t in counts} == counts
    # Each placement places every model once (replicas 1), and ``moved`` is the difference
    # from the placement before.
    for before, after in itertools.pairwise(log):
        assert sorted(after.placement) == names
        assert all(len(ws) == 1 for ws in after.placement.values())
        assert after.moved == tuple(
            sorted(n for n in names if before.placement.get(n) != after.placement[n])
        )
    # The placement at a time is the last repack's at or before it.
    assert report.placement_at(7.25) == operator[1].placement
    assert report.placement_at(-1.0) == {}
    assert report.moved_between(0.0, 0.0) == ()


def test_operator_repacks_need_lpt_packing() -> None:
    with pytest.raises(ValueError, match="lpt_packing"):
        _run("round_robin", operator_repacks=(1.0,))


def test_the_load_log_is_the_window_weight_loads() -> None:
    """Every weight load finished in the window is logged once (when, which worker, which
    model), and nothing before the warm-up ended: the log's length is ``weight_loads`` and
    its per-worker counts are the workers' ``weight_loads``."""
    report = _run("round_robin")
    assert len(report.load_log) == report.weight_loads > 0
    assert all(3.0 < e.at <= 12.0 for e in report.load_log)
    per_worker = {w.name: 0 for w in report.workers}
    for e in report.load_log:
        per_worker[e.worker] += 1
    assert per_worker == {w.name: w.weight_loads for w in report.workers}
    assert {e.model for e in report.load_log} <= {m.name for m in report.models}
