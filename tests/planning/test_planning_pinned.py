"""The planner's answers pinned: the same inputs and seed give the same fleet and the same
simulated figures, to the last bit, whatever is done to make the simulator cheaper.

The digests were taken on the simulator before its CPU was cut (issue 45's "a plan for
1,000 models and 8 GPUs in under a minute"): a change that makes any figure differ -- one
event processed in another order, one float summed in another order -- fails here. A
change that is meant to change what the simulator answers must say so and re-pin them.
Each case covers one path of the host model: a GPU fleet whose host has cores to spare
(the plan), and CPU workers contending for two cores beside background threads, whose
executions, copies and RPC CPU are water-filled (the simulator alone).
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import attrs

from reactantserver.config import GatewaySchedulingConfig
from reactantserver.fleet import ClosedLoop, FleetModel, FleetWorker, simulate_fleet
from reactantserver.fleet.host import HostCosts, Hosts
from reactantserver.planning.costs import Costs, ModelCosts
from reactantserver.planning.device import Device
from reactantserver.planning.fleet import Goal, Run
from reactantserver.planning.plan import make_plan, plan_json
from reactantserver.planning.traffic import ModelTraffic, Traffic

#: The small plan's JSON digest. Python 3.12 made ``sum()`` of floats compensated (exact
#: to the last bit), so the plan's totals -- prices, shares -- round differently from 3.11's
#: left-to-right sum; the figures asserted one by one are the same on both.
SMALL_PLAN = "9bb901dd21f3d1aa" if sys.version_info < (3, 12) else "6365ae3697309ff7"


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _plan_inputs() -> tuple[Traffic, Costs, Device]:
    # 12 models of 60-160 MB on 250 MB budgets: loads, evictions and a repair in the packer.
    models = {
        f"m{i:02d}": ModelCosts(
            name=f"m{i:02d}", costs={1: 0.001 + 0.0002 * i, 4: 0.002 + 0.0003 * i,
                                     8: 0.003 + 0.0004 * i},
            weight_bytes=60_000_000 + 9_000_000 * i,
        )
        for i in range(12)
    }  # fmt: skip
    shares = [1.0 / (r + 1) for r in range(12)]
    total = sum(shares)
    traffic = Traffic(
        models={
            f"m{i:02d}": ModelTraffic(name=f"m{i:02d}", rate=900.0 * s / total, rows=(1, 2))
            for i, s in enumerate(shares)
        }
    )
    costs = Costs(
        backend="cuda", models=models, load_latency=0.001, load_bandwidth=10e9,
        host=HostCosts(request_seconds=0.0002, batch_seconds=0.0001), cores=8,
        network_seconds=0.0002, gateway_seconds=0.0001,
    )  # fmt: skip
    device = Device(name="gpu", weight_budget_bytes=250_000_000, price_per_hour=2.0,
                    watts_busy=300.0, watts_idle=50.0, devices_per_host=2, host_cores=8,
                    max_devices=8)  # fmt: skip
    return traffic, costs, device


def test_a_small_plan_answers_what_it_answered() -> None:
    traffic, costs, device = _plan_inputs()
    plan = make_plan(traffic, costs, device, Goal(p99=0.02, error_budget=0.001),
                     Run(warmup=0.5, seconds=2.0, seed=7))  # fmt: skip
    data = json.loads(plan_json(plan))
    for outcome in data["evaluated"]:
        del outcome["simulated_in"]  # wall seconds
    assert (data["answer"], data["next_smaller"]) == (6, 5)
    figures = [
        (o["workers"], o["meets"], o["completed"], o["p50"], o["p99"], o["loads_per_second"])
        for o in data["evaluated"]
    ]
    assert figures == [
        (1, False, 31, 0.45927697915806054, 0.4860559990504385, 86.0),
        (2, False, 1731, 0.09612427047383465, 0.14520370639322833, 157.5),
        (3, False, 1755, 0.041956981124441795, 0.09578056584585892, 210.5),
        (5, False, 1784, 0.005396234640370423, 0.050894969482073504, 73.5),
        (6, True, 1804, 0.0034000000000005137, 0.009469524868816359, 0.0),
        (8, True, 1803, 0.0033999999999999586, 0.008444691692300221, 0.0),
    ]
    # Every other figure of the JSON (per model, per worker, the reasons, the prices).
    assert _digest(data) == SMALL_PLAN


def test_a_contended_cpu_fleet_simulates_what_it_simulated() -> None:
    models = [
        FleetModel(name=f"m{i}", costs={1: 0.0006 + 0.0003 * i, 2: 0.0009 + 0.0004 * i},
                   nbytes=1_000_000 * (i + 1), rate=1.0 + i, rows=(1, 2))
        for i in range(5)
    ]  # fmt: skip
    host = HostCosts(request_seconds=0.0003, batch_seconds=0.0001, execution_threads=1.5,
                     load_threads=1.0, inline_seconds=0.0008)  # fmt: skip
    workers = [
        FleetWorker(name=f"w{i}", budget=6_000_000, bandwidth=2e9, load_latency=0.0005,
                    host="h", host_costs=host)
        for i in range(3)
    ]  # fmt: skip
    report = simulate_fleet(
        models, workers, GatewaySchedulingConfig(mode="least_outstanding"), duration=3.0,
        warmup=0.5, seed=11, closed_loop=ClosedLoop(clients=12),
        hosts=Hosts(cores={"h": 2.0}, background={"h": 0.7}, gateway="h",
                    gateway_seconds=0.0002, clients="h", client_seconds=0.0001),
    )  # fmt: skip
    assert (report.completed, report.weight_loads) == (877, 601)
    assert (report.p50, report.p99) == (0.03353749999999822, 0.058304999999999385)
    assert report.host_busy == {"h": 0.839291351351368}
    # Every other figure: per model, per worker, the load log.
    assert _digest(attrs.asdict(report)) == "7280561de271c79d"
