"""The host's cores in the fleet simulator (reactantserver.fleet.host): the sans-IO
processor-sharing model, and what it does to a simulated fleet."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import host_jobs

from reactantserver.config import GatewaySchedulingConfig
from reactantserver.fleet import ClosedLoop, FleetModel, FleetWorker, simulate_fleet
from reactantserver.fleet.host import HostCosts, HostModel, Hosts, share_rates

widths = st.lists(st.floats(min_value=0.05, max_value=4.0), min_size=1, max_size=8)


@given(widths, st.floats(min_value=0.5, max_value=16.0), st.floats(min_value=0.0, max_value=8.0))
def test_share_rates_give_out_the_cores_and_no_more(
    ws: list[float], capacity: float, background: float
) -> None:
    """No job gets more than its width; the jobs and the background together never get
    more than the cores; when everything does not fit, the cores are all given out and every
    job wider than the share gets the same share (water filling)."""
    rates = share_rates(ws, capacity, background)
    assert all(0 < r <= w + 1e-12 for r, w in zip(rates, ws, strict=True))
    total = sum(ws) + background
    if total <= capacity:
        assert rates == ws
        return
    capped = [r for r, w in zip(rates, ws, strict=True) if r < w - 1e-9]
    if capped:
        # The water level is the capped jobs' common rate; every other job is below it.
        level = capped[0]
        assert all(abs(r - level) < 1e-9 for r in capped)
        assert all(r <= level + 1e-9 for r in rates)
        assert sum(rates) + background * min(1.0, level) == pytest.approx(capacity, rel=1e-9)
    else:
        # Every job at its width: the background takes the rest, each of its threads at
        # least as much as the widest job and less than a core.
        rest = capacity - sum(rates)
        assert background > 0 and 0 <= rest <= background + 1e-9
        assert max(ws) <= rest / background + 1e-9


@settings(max_examples=60, deadline=None)
@given(
    host_jobs(), st.floats(min_value=0.5, max_value=4.0), st.floats(min_value=0.0, max_value=3.0)
)
def test_a_host_conserves_work_and_runs_each_thread_in_order(
    jobs: list[tuple[float, str, float, float]], cores: float, background: float
) -> None:
    """Driven event by event (as the simulator drives it): every job finishes, each
    thread's jobs in submission order and one at a time; a job finishes no sooner than its
    work at its full width allows; the cores given out never exceed the host's; and the
    core-seconds done equal the work submitted."""
    host = HostModel("h", cores, background)
    pending = sorted(jobs)
    finished: dict[str, list[int]] = {}
    submitted_at: dict[int, tuple[float, float, float]] = {}
    now = 0.0
    i = 0
    while i < len(pending) or host.next_completion() < math.inf:
        nxt = pending[i][0] if i < len(pending) else math.inf
        done_at = host.next_completion()
        if nxt <= done_at:
            now = nxt
            at, thread, work, width = pending[i]
            host.submit(now, thread, work, width, (thread, i))
            submitted_at[i] = (at, work, width)
            i += 1
        else:
            now = done_at
            for thread, index in host.advance(now):  # type: ignore[misc]
                at, work, width = submitted_at[index]
                assert now >= at + work / width - 1.01e-9  # advance()'s nanosecond
                finished.setdefault(thread, []).append(index)
        assert sum(host.running().values()) <= cores + 1e-9
        assert all(host.queued(t) >= 1 for t in host.running())
    assert sorted(x for v in finished.values() for x in v) == list(range(len(pending)))
    for order in finished.values():
        assert order == sorted(order)
    assert sum(host.busy.values()) == pytest.approx(sum(w for _, _, w, _ in pending), abs=1e-9)


def test_uncontended_jobs_run_as_at_idle() -> None:
    """With room for every job, each takes work / width: a host that is never full changes
    no timing."""
    host = HostModel("h", 4.0)
    host.submit(0.0, "a", 0.002, 1.0, "a1")
    host.submit(0.0, "b", 0.003, 2.0, "b1")
    assert host.next_completion() == pytest.approx(0.0015)
    assert host.advance(0.0015) == ["b1"]
    assert host.next_completion() == pytest.approx(0.002)
    assert host.advance(0.002) == ["a1"]


def test_two_threads_on_one_core_take_twice_as_long() -> None:
    host = HostModel("h", 1.0)
    host.submit(0.0, "a", 1.0, 1.0, "a")
    host.submit(0.0, "b", 1.0, 1.0, "b")
    assert host.next_completion() == pytest.approx(2.0)
    assert sorted(host.advance(2.0)) == ["a", "b"]  # type: ignore[type-var]


def test_background_threads_take_their_share() -> None:
    """One job against one always-runnable thread of another process on one core: half."""
    host = HostModel("h", 1.0, background=1.0)
    host.submit(0.0, "a", 1.0, 1.0, "a")
    assert host.next_completion() == pytest.approx(2.0)


# ------------------------------------------------------------------------------ the fleet


def _models(sizes: tuple[int, ...] = (1, 2, 4)) -> list[FleetModel]:
    return [
        FleetModel(name=f"m{i}", costs={s: 0.001 + 0.001 * s for s in sizes}, nbytes=1000,
                   rate=1.0)
        for i in range(3)
    ]  # fmt: skip


def _fleet(n: int, host: str | None, costs: HostCosts) -> list[FleetWorker]:
    return [FleetWorker(name=f"w{i}", host=host, host_costs=costs) for i in range(n)]


def test_a_host_with_cores_to_spare_changes_nothing() -> None:
    """Workers whose executions take no host cores (a GPU) on a host with many cores: the
    simulation with the host model gives the same requests/s as without it, within the
    host's per-request CPU."""
    gw = GatewaySchedulingConfig(mode="round_robin")
    loop = ClosedLoop(clients=4)
    plain = simulate_fleet(_models(), _fleet(2, None, HostCosts()), gw, duration=6, warmup=1,
                           closed_loop=loop)  # fmt: skip
    hosted = simulate_fleet(
        _models(), _fleet(2, "h", HostCosts()), gw, duration=6, warmup=1, closed_loop=loop,
        hosts=Hosts(cores={"h": 64.0}),
    )  # fmt: skip
    assert hosted.throughput == pytest.approx(plain.throughput, rel=1e-9)
    assert hosted.host_busy == {"h": 0.0}


def test_cpu_executions_on_a_shared_host_stretch_as_workers_are_added() -> None:
    """Executions (one row each, 2 ms) that keep one core busy each: on a 2-core host, 2
    workers serve twice what 1 does, 4 workers no more than 2 -- their executions stretch
    instead -- and the workers' own compute counters (what the gateway's packer reads) see
    the stretched time: 4 workers report twice the device time per execution."""
    gw = GatewaySchedulingConfig(mode="round_robin")
    costs = HostCosts(execution_threads=1.0)

    def run(n: int) -> tuple[float, float]:
        report = simulate_fleet(
            _models((1,)), _fleet(n, "h", costs), gw, duration=8, warmup=2,
            closed_loop=ClosedLoop(clients=16), hosts=Hosts(cores={"h": 2.0}),
        )  # fmt: skip
        busy = sum(w.compute for w in report.workers) * report.window
        return report.throughput, busy / sum(w.dispatches for w in report.workers)

    (one, c1), (two, c2), (four, c4) = run(1), run(2), run(4)
    assert one == pytest.approx(500, rel=0.01) and c1 == pytest.approx(0.002, rel=0.01)
    assert two == pytest.approx(2 * one, rel=0.01) and c2 == pytest.approx(0.002, rel=0.01)
    assert four == pytest.approx(two, rel=0.01) and c4 == pytest.approx(0.004, rel=0.01)


def test_the_gateway_and_clients_on_the_host_cost_their_cpu() -> None:
    """A load generator and a gateway sharing a 1-core host with a worker whose RPC path is
    CPU: each request's latency includes their CPU, and the host is busier."""
    gw = GatewaySchedulingConfig(mode="round_robin")
    costs = HostCosts(request_seconds=0.001)
    base = simulate_fleet(
        _models(), _fleet(1, "h", costs), gw, duration=5, warmup=1,
        closed_loop=ClosedLoop(clients=1), hosts=Hosts(cores={"h": 1.0}),
    )  # fmt: skip
    shared = simulate_fleet(
        _models(), _fleet(1, "h", costs), gw, duration=5, warmup=1,
        closed_loop=ClosedLoop(clients=1),
        hosts=Hosts(cores={"h": 1.0}, gateway="h", gateway_seconds=0.001, clients="h",
                    client_seconds=0.002),
    )  # fmt: skip
    # One client: nothing overlaps, so latency grows by exactly the added CPU (3 ms).
    assert shared.p50 == pytest.approx(base.p50 + 0.003, abs=1e-9)
    assert shared.host_busy["h"] > base.host_busy["h"]


def test_hosts_must_be_named() -> None:
    with pytest.raises(ValueError, match=r"not in hosts\.cores"):
        simulate_fleet(_models(), _fleet(1, "elsewhere", HostCosts()),
                       GatewaySchedulingConfig(mode="round_robin"), duration=1,
                       hosts=Hosts(cores={"h": 1.0}))  # fmt: skip


def test_a_fixed_placement_routes_by_it_and_never_repacks() -> None:
    gw = GatewaySchedulingConfig(mode="lpt_packing")
    placement = {"m0": ("w1",), "m1": ("w1",), "m2": ("w0",)}
    report = simulate_fleet(
        _models(), _fleet(2, None, HostCosts()), gw, duration=4, warmup=1,
        closed_loop=ClosedLoop(clients=4), placement=placement,
    )  # fmt: skip
    assert report.repacks.get("startup", 0) == 0 and report.repack_log == ()
    assert {m.name: m.workers for m in report.models} == placement


def _spread_run(
    spread: tuple[float, ...], loads: tuple[float, ...] = (), budget: int = 0
) -> object:
    gw = GatewaySchedulingConfig(mode="round_robin")
    workers = [
        FleetWorker(name="w0", host="h", host_costs=HostCosts(execution_threads=1.0),
                    cost_spread=spread, load_spread=loads, budget=budget, bandwidth=1e6,
                    load_latency=0.001)
    ]  # fmt: skip
    return simulate_fleet(
        _models((1,)), workers, gw, duration=8, warmup=1, closed_loop=ClosedLoop(clients=1),
        hosts=Hosts(cores={"h": 2.0}), seed=3,
    )  # fmt: skip


def test_a_spread_of_ones_changes_nothing() -> None:
    """Executions and loads drawn from a spread of ratios that are all 1 take exactly their
    expected time, and the spread's draws do not touch the arrivals' random stream: the
    run's every figure is the run without a spread."""
    plain, ones = _spread_run(()), _spread_run((1.0,) * 5, (1.0,) * 5)
    assert ones == plain
    cached, cached_ones = _spread_run((), (), 1500), _spread_run((1.0,), (1.0,), 1500)
    assert cached_ones == cached
    assert cached.loads_per_second > 0  # the budget holds one model of three: loads happen


def test_a_spread_with_a_tail_moves_the_p99_and_keeps_the_mean() -> None:
    """Nine executions in ten taking half their mean and one 5.5x (the mean kept): one
    client alone (every latency one execution) sees its median halve and its p99 become
    the slow draw's, 5.5x the plain run's -- and as many requests answered."""
    plain = _spread_run(())
    tail = (0.5,) * 9 + (5.5,)  # mean 1.0
    spread = _spread_run(tail)
    assert spread.p50 == pytest.approx(0.5 * plain.p50, rel=1e-6)
    assert spread.p99 == pytest.approx(5.5 * plain.p99, rel=1e-6)
    assert spread.throughput == pytest.approx(plain.throughput, rel=0.05)


def test_a_loop_pays_its_wake_up_only_when_idle() -> None:
    """A gateway whose CPU per request is 1 ms with many in flight and 1 ms more alone: one
    client at a time finds its loop idle both ways and pays the wake-up on each (the host
    busier by 1 ms a request); sixteen keep it busy, and pay it on fewer requests."""
    gw = GatewaySchedulingConfig(mode="round_robin")
    costs = HostCosts(request_seconds=0.0005)

    def run(clients: int, wake: float) -> object:
        return simulate_fleet(
            _models(), _fleet(1, "h", costs), gw, duration=5, warmup=1,
            closed_loop=ClosedLoop(clients=clients),
            hosts=Hosts(cores={"h": 1.0}, gateway="h", gateway_seconds=0.001,
                        gateway_wake_seconds=wake),
        )  # fmt: skip

    def busy_per_request(report: object) -> float:
        return report.host_busy["h"] / report.throughput  # type: ignore[attr-defined]

    one, one_woken = run(1, 0.0), run(1, 0.001)
    assert one_woken.p50 == pytest.approx(one.p50 + 0.001, abs=1e-9)  # type: ignore[attr-defined]
    assert busy_per_request(one_woken) - busy_per_request(one) == pytest.approx(0.001, rel=0.02)
    many, many_woken = run(16, 0.0), run(16, 0.001)
    assert busy_per_request(many_woken) - busy_per_request(many) < 0.5 * 0.001
