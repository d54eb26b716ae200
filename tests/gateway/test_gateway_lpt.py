"""lpt_packing in the gateway process, against fake workers (real gRPC, no JAX).

The driver (``gateway/lpt.py``): startup refuses a fleet it cannot place on (a worker not
ready within ``startup_wait_seconds``, a ``fair`` worker, a different model set) with one
line naming the worker; the startup repack places every model on ``default_replicas``
workers and routing follows the placement; the four GatewayControlService RPCs (status,
all-or-nothing policy, placement that changes routing within the call, Repack); explicit-
mode workers are pinned with SetModelResidency and self-managed ones compacted when their
set changes; the placement metrics. The real-worker version is
``tests/gateway/test_gateway_lpt_e2e.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpclib
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from fake_host import NAP_SECONDS, FakeHost
from gateway_harness import (
    FakeWorker,
    fake_workers,
    http_get,
    running_gateway,
    start_cli,
    wait_until,
)
from grpclib.client import Channel
from test_gateway_proxy import X, _documented_gateway_series, _grpclib, config, x_input
from worker_harness import free_port

from reactantserver.config.schema import GatewaySchedulingConfig
from reactantserver.gateway.lpt import LptRefused
from reactantserver.protocol import reactant_control as cpb
from reactantserver.service import Service

LPT = GatewaySchedulingConfig(mode="lpt_packing", default_replicas=1)


def fifo(host: FakeHost) -> Service:
    host.discipline = "fifo"
    return Service(host)


def explicit(host: FakeHost) -> Service:
    host.discipline = "edf"
    host.externally_managed = True
    return Service(host)


@pytest.fixture
def three() -> Iterator[list[FakeWorker]]:
    with fake_workers(3, fifo) as workers:
        yield workers


def refusal(cfg: Any) -> str:
    """The one line a gateway that refuses to start gives."""
    with pytest.raises(BaseException) as caught, running_gateway(cfg):
        pass
    exc: BaseException = caught.value
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, LptRefused), repr(exc)
    assert "\n" not in str(exc)
    return str(exc)


def test_startup_refuses_a_fair_worker_naming_it() -> None:
    with fake_workers(2) as workers:
        line = refusal(config(workers, scheduling=LPT))
    # Both run fair: the line names the first it checks (by address), with its address.
    named = [
        f"worker w{i} ({w.address}) runs the fair discipline" in line for i, w in enumerate(workers)
    ]
    assert named.count(True) == 1, line


def test_startup_refuses_a_worker_that_does_not_answer() -> None:
    with fake_workers(1, fifo) as workers:
        gone = f"127.0.0.1:{free_port()}"
        cfg = config(workers, scheduling=LPT)
        cfg = config(
            workers,
            scheduling=LPT,
            endpoints=(*cfg.endpoints, gone),
            worker_names=("w0", "w1"),
            startup_wait_seconds=0.0,
        )
        line = refusal(cfg)
    assert f"w1 ({gone}) was not ready at once (startup_wait_seconds: 0)" in line


def test_startup_refuses_a_different_model_set() -> None:
    def missing_nap(host: FakeHost) -> Service:
        del host.models["nap"]
        return fifo(host)

    with fake_workers(1, fifo) as one, fake_workers(1, missing_nap) as other:
        line = refusal(config([*one, *other], scheduling=LPT))
    # Two workers: which one "differs" is a matter of order; both are named.
    assert "serves a different model set" in line and "'nap'" in line
    assert one[0].address in line and other[0].address in line


def served_by(workers: list[FakeWorker], model: str = "double") -> dict[int, int]:
    return {i: w.host.models[model].rows for i, w in enumerate(workers)}


def control(gw: Any, call: Callable[[cpb.GatewayControlServiceStub], Any]) -> Any:
    """One GatewayControlService call; the answer, or the GRPCError."""

    async def calls(channel: Channel) -> Any:
        try:
            return await call(cpb.GatewayControlServiceStub(channel))
        except grpclib.GRPCError as exc:
            return exc

    return _grpclib(gw, calls)


def status(gw: Any) -> cpb.GetSchedulingStatusResponse:
    return control(gw, lambda s: s.get_scheduling_status(cpb.GetSchedulingStatusRequest()))


def test_placement_routing_and_the_control_rpcs(three: list[FakeWorker]) -> None:
    address = {w.address: i for i, w in enumerate(three)}
    with running_gateway(config(three, scheduling=LPT)) as gw:
        first = status(gw)
        assert first.repacks["startup"] == 1
        placed = {m.name: m.workers for m in first.models}
        # Every loaded model is placed, ready or not ("cold" is still compiling).
        assert set(placed) == {"broken", "busy", "cold", "double", "echo", "nap", "slow"}
        assert all(len(ws) == 1 for ws in placed.values())  # default_replicas: 1
        # No load measured yet: placed by memory, 7 models of 1 KiB over 3 workers.
        assert sorted(len(w.models) for w in first.workers) == [2, 2, 3]
        (home,) = placed["double"]

        client = grpcclient.InferenceServerClient(gw.grpc)
        before = served_by(three)
        for _ in range(9):
            np.testing.assert_array_equal(client.infer("double", x_input()).as_numpy("y"), 2 * X)
        after = served_by(three)
        assert {i: after[i] - before[i] for i in after} == {
            i: 9 if i == address[home] else 0 for i in after
        }

        # SetModelPlacement: all three, routing follows within the call.
        answer = control(
            gw,
            lambda s: s.set_model_placement(
                cpb.SetModelPlacementRequest(name="double", replicas=-1)
            ),
        )
        assert sorted(answer.model.workers) == sorted(address)
        assert answer.generation > first.policy.generation
        before = served_by(three)
        x8 = np.zeros((8, 16), np.float32)
        for _ in range(6):  # Q = 8 rows: each request is one full quantum
            client.infer("double", x_input(x8))
        after = served_by(three)
        assert all(after[i] - before[i] == 16 for i in after), (before, after)
        client.close()

        # Unknown model and bad values.
        missing = control(
            gw, lambda s: s.set_model_placement(cpb.SetModelPlacementRequest(name="absent"))
        )
        assert missing.status.name == "NOT_FOUND"
        bad = control(
            gw,
            lambda s: s.set_model_placement(
                cpb.SetModelPlacementRequest(name="double", replicas=-2)
            ),
        )
        assert bad.status.name == "INVALID_ARGUMENT" and "replicas" in bad.message

        # SetSchedulingPolicy: all or nothing.
        generation = status(gw).policy.generation
        refused = control(
            gw,
            lambda s: s.set_scheduling_policy(
                cpb.SetSchedulingPolicyRequest(
                    update_mask=_mask("hysteresis", "routing_fill_mode"),
                    policy=cpb.SchedulingPolicy(hysteresis=0.2, routing_fill_mode="inflight"),
                )
            ),
        )
        assert refused.status.name == "INVALID_ARGUMENT"
        assert "routing_fill_mode" in refused.message and "nothing was changed" in refused.message
        unchanged = status(gw).policy
        assert (unchanged.hysteresis, unchanged.generation) == (0.0, generation)
        accepted = control(
            gw,
            lambda s: s.set_scheduling_policy(
                cpb.SetSchedulingPolicyRequest(
                    update_mask=_mask("hysteresis", "default_replicas"),
                    policy=cpb.SchedulingPolicy(hysteresis=0.2, default_replicas=-1),
                )
            ),
        )
        assert (accepted.policy.hysteresis, accepted.policy.default_replicas) == (0.2, -1)
        assert accepted.policy.generation > generation

        # Repack: default_replicas is now all, so every model moves onto every worker.
        compactions = [len(w.host.compactions) for w in three]
        done = control(gw, lambda s: s.repack(cpb.RepackRequest(wait_seconds=30)))
        assert done.completed
        assert set(done.moved_models) == {"broken", "busy", "cold", "echo", "nap", "slow"}
        final = status(gw)
        assert final.repacks["operator"] == 2  # SetModelPlacement, then Repack
        assert all(len(m.workers) == 3 for m in final.models)
        assert "double" not in done.moved_models
        wait = control(gw, lambda s: s.repack(cpb.RepackRequest(wait_seconds=500)))
        assert wait.status.name == "INVALID_ARGUMENT" and "wait_seconds" in wait.message

        # Self-managed workers whose set changed were compacted (compaction_mode eager:
        # nothing reloaded).
        assert [len(w.host.compactions) for w in three] == [n + 1 for n in compactions]
        assert all(c == () for w in three for c in w.host.compactions)

        _, text = http_get(gw.metrics_url + "/metrics")
        assert 'gateway_repacks_total{trigger="operator"} 2.0' in text
        assert 'gateway_model_replicas{model="double"} 3.0' in text
        assert 'gateway_placement_weight{model="double",worker="w0"} 0.333' in text
        assert 'gateway_model_fill_quantum{model="double",worker="w1"} 8.0' in text
        assert "gateway_workers_oversubscribed 0.0" in text


def _mask(*paths: str) -> Any:
    import betterproto.lib.google.protobuf as wkt

    return wkt.FieldMask(paths=list(paths))


def test_explicit_mode_workers_are_pinned_to_the_placement() -> None:
    with (
        fake_workers(3, explicit) as workers,
        running_gateway(config(workers, scheduling=LPT)) as gw,
    ):
        placed = {m.name: m.workers for m in status(gw).models}
        for w in workers:
            mine = {m for m, ws in placed.items() if w.address in ws}
            pinned = {m for m, r in w.host.residency.items() if r == "device"}
            assert pinned == mine
        control(
            gw,
            lambda s: s.set_model_placement(
                cpb.SetModelPlacementRequest(name="double", replicas=2)
            ),
        )
        holders = {w.address for w in workers if w.host.residency.get("double") == "device"}
        placed = {m.name: m.workers for m in status(gw).models}
        assert holders == set(placed["double"]) and len(holders) == 2
        for w in workers:  # and the rest reconciled: pinned exactly where placed
            mine = {m for m, ws in placed.items() if w.address in ws}
            assert {m for m, r in w.host.residency.items() if r == "device"} == mine


def test_an_oversubscribed_worker_is_warned_about_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def tiny(host: FakeHost) -> Service:
        host.weight_cache_max_bytes = 1500  # one 1 KiB model fits, two do not
        return fifo(host)

    with fake_workers(2, tiny) as workers, running_gateway(config(workers, scheduling=LPT)) as gw:
        report = status(gw)
        assert all(w.oversubscribed for w in report.workers)
        assert len(report.warnings) == 2
        _, text = http_get(gw.metrics_url + "/metrics")
        assert "gateway_workers_oversubscribed 2.0" in text
    warned = [r for r in caplog.records if "exceed its weight budget" in r.getMessage()]
    assert len(warned) == 2  # once per worker per repack


def test_every_lpt_series_is_documented_and_exported(three: list[FakeWorker]) -> None:
    """docs/monitoring.md lists exactly the families a gateway in lpt_packing exports."""
    with running_gateway(config(three, scheduling=LPT)) as gw:
        _, text = http_get(gw.metrics_url + "/metrics")
    exported = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE gateway_")}
    assert exported == _documented_gateway_series(lpt=True)


def test_fleet_compute_drives_repacks(caplog: pytest.LogCaptureFixture) -> None:
    """A ``compute`` repack follows once the workers report enough compute seconds (the
    probe rounds feed the controller), and its estimates come from the router's arrivals
    and the workers' counters."""

    def measured(host: FakeHost) -> Service:
        host.report_compute = True
        return fifo(host)

    caplog.set_level(logging.INFO, logger="reactantserver.gateway.lpt")
    scheduling = GatewaySchedulingConfig(
        mode="lpt_packing", rebalance_compute_seconds=0.3, first_rebalance_compute_seconds=0.3
    )
    with (
        fake_workers(2, measured) as workers,
        running_gateway(config(workers, scheduling=scheduling, health_interval_seconds=0.1)) as gw,
    ):
        assert status(gw).repacks.get("compute", 0) == 0
        client = grpcclient.InferenceServerClient(gw.grpc)
        # Each is counted 0.2 s of device time (NAP_SECONDS, whatever the wall time): the
        # first alone is under the 0.3 s budget, the two make 0.4 s of fleet compute.
        for _ in range(2):
            client.infer("nap", x_input())
        client.close()
        wait_until(lambda: status(gw).repacks.get("compute", 0) >= 1, what="a compute repack")
        report = status(gw)
        assert report.fleet_compute_seconds == pytest.approx(2 * NAP_SECONDS)
        (nap,) = [m for m in report.models if m.name == "nap"]
        assert nap.rate > 0 and nap.cost_seconds == pytest.approx(NAP_SECONDS)
    assert any("repack (compute)" in r.getMessage() for r in caplog.records)


def test_the_gateway_command_exits_1_with_one_line(tmp_path: Any) -> None:
    """``reactantserver gateway`` in lpt_packing with a worker that never answers: one
    error line naming it, exit status 1, no traceback."""
    port = free_port()
    gw = start_cli(
        ["gateway"],
        tmp_path / "gateway.log",
        REACTANT_GATEWAY_WORKERS=f"127.0.0.1:{port}",
        REACTANT_GATEWAY_WORKER_NAMES="w0",
        REACTANT_GATEWAY_SCHEDULING_MODE="lpt_packing",
        REACTANT_GATEWAY_STARTUP_WAIT_SECONDS="1",
        REACTANT_GATEWAY_HEALTH_INTERVAL_SECONDS="0.2",
        REACTANT_GATEWAY_LISTEN_GRPC=f"127.0.0.1:{free_port()}",
        REACTANT_GATEWAY_LISTEN_METRICS="127.0.0.1:0",
    )
    assert gw.proc.wait(60) == 1
    text = gw.text()
    assert f"lpt_packing needs every worker: w0 (127.0.0.1:{port}) was not ready within 1 s" in text
    assert "Traceback" not in text
