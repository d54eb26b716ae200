"""``reactantserver calibrate`` and ``plan`` against live processes: a worker process the
command starts itself, and a worker's own /metrics as the costs and the traffic."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from gateway_harness import http_get
from worker_harness import running_worker, worker_config

from reactantserver.cli import main as cli_main
from reactantserver.planning.costs import read_costs
from reactantserver.planning.metrics_input import costs_from_metrics
from reactantserver.planning.traffic import traffic_from_metrics

pytestmark = pytest.mark.slow

DEVICE = (
    "name: cpu\nweight_budget_bytes: 0\nprice_per_hour: 0.5\nmax_devices: 4\n"
    # A host of its own: what this shared machine had running meanwhile is not the
    # question here.
    "host_background_threads: 0\n"
)


def _infer(port: int, n: int, rows: int = 2) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    x = grpcclient.InferInput("x", [rows, 16], "FP32")
    x.set_data_from_numpy(np.ones((rows, 16), dtype=np.float32))
    try:
        for _ in range(n):
            client.infer("double", [x])
    finally:
        client.close()


def test_calibrate_measures_a_bundle_and_plan_reads_what_it_wrote(
    zoo_repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command starts its own worker process on one bundle, measures it at every
    compiled size, its cold loads (the cache emptied before each) and the worker's host
    CPU, and writes a costs file that ``plan`` accepts."""
    out = tmp_path / "costs.yaml"
    status = cli_main(
        ["calibrate", str(zoo_repo / "double"), "--out", str(out), "--requests", "100",
         "--through-gateway"]
    )  # fmt: skip
    assert status == 0, capsys.readouterr().err
    costs = read_costs(out)
    model = costs.models["double"]
    manifest = (zoo_repo / "double" / "manifest.yaml").read_text()
    assert all(str(size) in manifest for size in model.costs)
    assert all(seconds > 0 for seconds in model.costs.values())
    assert costs.host.request_seconds > 0  # the worker's event loop works per request
    assert costs.gateway_seconds is not None and costs.gateway_seconds > 0
    assert costs.cores >= 1 and costs.backend == "cpu"
    assert costs.host.inline_seconds == pytest.approx(1e-4)
    traffic = tmp_path / "traffic.yaml"
    traffic.write_text("models:\n  double: {rate: 200, rows: 2}\n")
    device = tmp_path / "device.yaml"
    device.write_text(DEVICE)
    status = cli_main(
        ["plan", "--traffic", str(traffic), "--costs", str(out), "--device", str(device),
         "--p99-ms", "1000", "--seconds", "2", "--warmup", "0.5", "--json"]
    )  # fmt: skip
    plan = json.loads(capsys.readouterr().out)
    assert status == 0 and plan["answer"] == 1


def test_costs_and_traffic_from_a_live_workers_metrics(zoo_repo: Path) -> None:
    """What a running worker exports is enough to plan from: every compiled size it has run
    with its fastest execution, its weight bytes; and two scrapes give the traffic."""
    config = worker_config(zoo_repo, include=("double",))
    with running_worker(config) as address:
        url = f"http://127.0.0.1:{address.metrics_port}/metrics"
        before = http_get(url)[1]
        _infer(address.grpc_port, 30)
        after = http_get(url)[1]
    costs = costs_from_metrics(after)
    assert set(costs.models) == {"double"}
    assert costs.models["double"].costs and all(
        c > 0 for c in costs.models["double"].costs.values()
    )
    traffic = traffic_from_metrics(before, after, 3.0)
    assert traffic.models["double"].rate == pytest.approx(10.0)  # 30 requests in "3 s"
    assert traffic.models["double"].rows == (2,)
