"""The planner's files (costs, traffic, device): read back what is written, and every
problem reported at once as ``FILE:LINE: key: ...``, like the configuration's."""

from __future__ import annotations

from pathlib import Path

import pytest

from reactantserver.errors import ConfigError
from reactantserver.fleet.host import HostCosts
from reactantserver.planning.costs import Costs, ModelCosts, read_costs, render_costs
from reactantserver.planning.device import read_device
from reactantserver.planning.metrics_input import costs_from_metrics
from reactantserver.planning.traffic import (
    ModelTraffic,
    Traffic,
    read_traffic,
    render_traffic,
    traffic_from_metrics,
)


def _problems(path: Path, reader: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        reader(path)  # type: ignore[operator]
    return list(info.value.problems)


def test_a_costs_file_reads_back_what_calibrate_writes(tmp_path: Path) -> None:
    costs = Costs(
        backend="cpu",
        source="calibrate repo",
        models={
            "a": ModelCosts(name="a", costs={1: 0.0011, 8: 0.0023}, weight_bytes=4_374_568),
            "b": ModelCosts(name="b", costs={1: 0.0005}, weight_bytes=0),
        },
        load_latency=0.0006,
        load_bandwidth=4.2e9,
        host=HostCosts(
            request_seconds=0.00031, execution_threads=1.4, load_threads=1.0, inline_seconds=1e-4
        ),
        cores=2,
        cores_busy=0.25,
        background_threads=0.5,
        network_seconds=0.0002,
        gateway_seconds=0.0004,
    )
    path = tmp_path / "costs.yaml"
    path.write_text(render_costs(costs, "a comment\nof two lines"))
    assert read_costs(path) == costs


def test_a_bad_costs_file_gets_every_problem_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "costs.yaml"
    path.write_text(
        "backend: gpu\n"
        "host:\n"
        "  request_second: 0.001\n"
        "  cores: -2\n"
        "models:\n"
        "  a:\n"
        "    costs: {1: 0.001, x: 0.002, 4: 0}\n"
        "  b:\n"
        "    weight_bytes: 1.5\n"
        "    costs: {}\n"
    )
    assert _problems(path, read_costs) == [
        f"{path}:1: backend: expected one of cpu, cuda, metrics; got 'gpu'; did you mean 'cpu'?",
        f"{path}:3: host.request_second: unknown key; expected one of cores, cores_busy, "
        "background_threads, request_seconds, batch_seconds, execution_threads, "
        "load_threads, inline_seconds, network_seconds, gateway_seconds, "
        "gateway_wake_seconds; did you mean 'request_seconds' or 'network_seconds'?",
        f"{path}:4: host.cores: expected a number >= 0; got -2",
        f"{path}:7: models.a.costs.x: expected a batch size (a whole number >= 1); got 'x'",
        f"{path}:7: models.a.costs.4: expected a number > 0; got 0",
        f"{path}:9: models.b.weight_bytes: expected a whole number; got 1.5",
        f"{path}:10: models.b.costs: expected seconds at one compiled batch size at least",
    ]


def test_a_traffic_file_open_and_closed(tmp_path: Path) -> None:
    open_loop = Traffic(
        models={
            "a": ModelTraffic(name="a", rate=120.0),
            "b": ModelTraffic(name="b", rate=30.0, rows=(1, 4), deadline=0.25),
        },
        generator_seconds=0.0002,
    )
    path = tmp_path / "traffic.yaml"
    path.write_text(render_traffic(open_loop))
    assert read_traffic(path) == attrs_evolve_source(open_loop, str(path))
    closed = Traffic(models={"a": ModelTraffic(name="a", rate=3.0)}, clients=16, think=0.002)
    path.write_text(render_traffic(closed))
    back = read_traffic(path)
    assert back.clients == 16 and back.think == pytest.approx(0.002)
    assert back.shares() == {"a": 1.0}


def attrs_evolve_source(traffic: Traffic, source: str) -> Traffic:
    import attrs

    return attrs.evolve(traffic, source=source)


def test_a_bad_traffic_file_says_what_to_fix(tmp_path: Path) -> None:
    path = tmp_path / "traffic.yaml"
    path.write_text(
        "clients: 0\n"
        "think_ms: 5\n"
        "models:\n"
        "  a: {rate: 10}\n"
        "  b: {share: -1, rows: [1, 0]}\n"
        "  c: {share: 1, deadline_ms: 0, color: red}\n"
    )
    assert _problems(path, read_traffic) == [
        f"{path}:1: clients: expected a whole number >= 1; got 0",
        f"{path}:4: models.a.rate: not used here: a closed loop (clients:) gives each model a share",
        f"{path}:5: models.b.share: expected a number >= 0; got -1",
        f"{path}:5: models.b.rows[1]: expected a whole number of rows >= 1; got 0",
        f"{path}:6: models.c.color: unknown key; expected one of rate, share, rows, deadline_ms",
        f"{path}:6: models.c.deadline_ms: expected a number > 0; got 0",
    ]


def test_a_device_file_and_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "device.yaml"
    path.write_text("name: h100\nweight_budget_bytes: 64000000000\nprice_per_hour: 2.5\n")
    device = read_device(path)
    assert device.name == "h100" and device.devices_per_host == 8 and device.gateway_on_host
    path.write_text("name: h100\nweight_budget_byte: 1\nwatts_busy: 300\nmax_devices: 0\n")
    assert _problems(path, read_device) == [
        f"{path}:1: weight_budget_bytes: missing; it is required",
        f"{path}:2: weight_budget_byte: unknown key; expected one of name, "
        "weight_budget_bytes, price_per_hour, watts_busy, watts_idle, devices_per_host, "
        "host_cores, host_background_threads, gateway_on_host, max_devices; did you mean "
        "'weight_budget_bytes'?",
        f"{path}:4: max_devices: expected a whole number >= 1; got 0",
    ]


EXPOSITION = """\
# TYPE worker_model_batch_fastest_seconds gauge
worker_model_batch_fastest_seconds{{batch_size="1",gpu="0",model="a",worker="w0"}} 0.002
worker_model_batch_fastest_seconds{{batch_size="8",gpu="0",model="a",worker="w0"}} 0.004
worker_model_batch_fastest_seconds{{batch_size="1",gpu="0",model="a",worker="w1"}} 0.003
# TYPE worker_model_weight_bytes gauge
worker_model_weight_bytes{{gpu="0",model="a",worker="w0"}} 1000000.0
# TYPE worker_requests_served_total counter
worker_requests_served_total{{gpu="0",model="a",worker="w0"}} {a_req}
worker_requests_served_total{{gpu="0",model="a",worker="w1"}} {a_req}
# TYPE worker_rows_served_total counter
worker_rows_served_total{{gpu="0",model="a",worker="w0"}} {a_rows}
worker_rows_served_total{{gpu="0",model="a",worker="w1"}} {a_rows}
# TYPE worker_weight_loads_total counter
worker_weight_loads_total{{gpu="0",worker="w0"}} 10.0
# TYPE worker_weight_load_seconds_total counter
worker_weight_load_seconds_total{{gpu="0",worker="w0"}} 0.01
"""


def test_costs_and_traffic_from_a_gateways_metrics() -> None:
    """Costs: each size's fastest execution averaged over the workers that report it;
    traffic: the requests and rows served between two expositions, summed over workers."""
    before = EXPOSITION.format(a_req=100.0, a_rows=100.0)
    after = EXPOSITION.format(a_req=600.0, a_rows=1600.0)
    costs = costs_from_metrics(after, source="gw")
    assert costs.models["a"].costs == {1: pytest.approx(0.0025), 8: pytest.approx(0.004)}
    assert costs.models["a"].weight_bytes == 1_000_000
    assert costs.load_bandwidth == pytest.approx(1e9)  # 1 MB per 1 ms load
    assert costs.host == HostCosts()  # /metrics has no host figures
    traffic = traffic_from_metrics(before, after, 10.0)
    assert traffic.models["a"].rate == pytest.approx(100.0)  # 2 x 500 requests in 10 s
    assert traffic.models["a"].rows == (3,)  # 1500 rows per 500 requests
    with pytest.raises(ValueError, match="no model answered"):
        traffic_from_metrics(after, after, 10.0)


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "planning"


def test_plan_exits_2_with_the_files_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from reactantserver.cli import main

    traffic = tmp_path / "traffic.yaml"
    traffic.write_text("models:\n  ft00: {rate: fast}\n")
    status = main(["plan", "--traffic", str(traffic), "--costs", str(EXAMPLE / "costs.yaml"),
                   "--device", str(EXAMPLE / "device.yaml"), "--p99-ms", "5"])  # fmt: skip
    assert status == 2
    assert (
        capsys.readouterr().err == f"{traffic}:2: models.ft00.rate: expected a number; got 'fast'\n"
    )
    status = main(["plan", "--traffic", str(EXAMPLE / "traffic.yaml"), "--costs",
                   str(EXAMPLE / "costs.yaml"), "--device", str(EXAMPLE / "device.yaml"),
                   "--p99-ms", "0"])  # fmt: skip
    assert status == 2 and "--p99-ms: expected milliseconds > 0" in capsys.readouterr().err


def test_plan_exits_1_when_no_fleet_meets_the_goal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A p99 below one execution: no fleet meets it; the plan says so with the largest
    fleet's reasons, and exits 1 for scripts."""
    from reactantserver.cli import main

    device = tmp_path / "device.yaml"
    device.write_text("name: gpu\nweight_budget_bytes: 5000000000\nmax_devices: 2\n")
    traffic = tmp_path / "traffic.yaml"
    traffic.write_text("models:\n  ft00: {rate: 100}\n")
    status = main(["plan", "--traffic", str(traffic), "--costs", str(EXAMPLE / "costs.yaml"),
                   "--device", str(device), "--p99-ms", "0.1", "--seconds", "1", "--warmup",
                   "0.5"])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 1
    assert "no fleet of up to 2 devices meets the goal; 2 fail: p99" in out
