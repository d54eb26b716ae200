"""The gateway over fake workers: every RPC, statuses, failover, rollback, caps, drain.

The workers here are real gRPC servers (``serve_grpc``) over ``tests/fake_host.FakeHost``
-- no JAX, so a fleet starts in milliseconds -- and the gateway is ``serve_gateway`` on its
own thread, driven by ``tritonclient`` as any client would. ``test_gateway_e2e.py`` repeats
the essentials with real workers and a real ``reactantserver gateway`` process.

Invariants checked: each RPC answers as one server would (merged or forwarded as its kind
says); worker statuses pass through with their messages; failover happens on NOT_FOUND and
UNAVAILABLE only; a registration refused anywhere is undone everywhere; the admission cap
sheds with RESOURCE_EXHAUSTED; an unknown model costs one refresh however many ask; a
draining gateway refuses new calls but answers the ones in flight.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
from gateway_harness import (
    PAIRED,
    FakeWorker,
    GatewayRun,
    fake_workers,
    free_port,
    http_get,
    metric,
    running_gateway,
    start_cli,
    wait_until,
)
from grpclib.client import Channel
from tritonclient.utils import InferenceServerException

from reactantserver.config.schema import (
    GatewayConfig,
    GatewayGrpcConfig,
    ListenConfig,
)
from reactantserver.errors import ResourceExhausted
from reactantserver.load_config import Override
from reactantserver.protocol import inference as pb
from reactantserver.protocol import reactant_control as cpb
from reactantserver.protocol.grpc.health import v1 as health
from reactantserver.service import Service

X = np.arange(16, dtype=np.float32).reshape(1, 16)


def config(workers: list[FakeWorker], **overrides: Any) -> GatewayConfig:
    values: dict[str, Any] = {
        "listen": ListenConfig(grpc="127.0.0.1:0", metrics=f"127.0.0.1:{free_port()}"),
        "endpoints": tuple(w.address for w in workers),
        "worker_names": tuple(f"w{i}" for i in range(len(workers))),
        "health_interval_seconds": 60.0,  # the table changes only when a test says so
        "logging": {"format": "text"},
        "worker_client": PAIRED,  # paired with the fake workers by a key
    }
    values.update(overrides)
    if isinstance(values["logging"], dict):
        from reactantserver.config.schema import LoggingConfig

        values["logging"] = LoggingConfig(**values["logging"])
    return GatewayConfig(**values)


def x_input(x: np.ndarray = X) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return [inp]


@pytest.fixture
def two() -> Iterator[list[FakeWorker]]:
    with fake_workers(2) as workers:
        yield workers


@pytest.fixture
def gateway(two: list[FakeWorker]) -> Iterator[GatewayRun]:
    with running_gateway(config(two)) as run:
        yield run


@pytest.fixture
def client(gateway: GatewayRun) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(gateway.grpc)
    yield c
    c.close()


def code(exc: InferenceServerException) -> str:
    return str(exc.status()).removeprefix("StatusCode.")


def fails(fn: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        fn(*args, **kwargs)
    return caught.value


def rows(worker: FakeWorker, model: str = "double") -> int:
    return worker.host.models[model].rows if model in worker.host.models else 0


# ------------------------------------------------------------------------------ the surface


def test_health_metadata_and_forwarded_model_rpcs(
    client: grpcclient.InferenceServerClient,
) -> None:
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta.name == "reactantserver-gateway"
    assert "system_shared_memory" in meta.extensions
    assert client.is_model_ready("double")
    assert not client.is_model_ready("cold")  # listed everywhere, ready nowhere
    assert not client.is_model_ready("no-such-model")
    model = client.get_model_metadata("double")
    assert [(t.name, list(t.shape)) for t in model.outputs] == [("y", [-1, 16]), ("z", [-1, 16])]
    assert client.get_model_config("double").config.max_batch_size == 8
    assert code(fails(client.get_model_metadata, "no-such-model")) == "NOT_FOUND"


def test_infer_round_trip_and_statistics_summed(
    two: list[FakeWorker], client: grpcclient.InferenceServerClient
) -> None:
    for i in range(4):
        result = client.infer("double", x_input(), request_id=f"r{i}")
        np.testing.assert_array_equal(result.as_numpy("y"), 2 * X)
        assert result.get_response().id == f"r{i}"
    assert [rows(w) for w in two] == [2, 2]  # round robin
    (stats,) = client.get_inference_statistics("double").model_stats
    assert stats.inference_count == 4 and stats.execution_count == 4
    assert stats.inference_stats.success.count == 4
    assert sum(b.compute_infer.count for b in stats.batch_stats) == 4
    everything = client.get_inference_statistics("").model_stats
    assert [s.name for s in everything] == sorted(s.name for s in everything)
    assert code(fails(client.get_inference_statistics, "no-such-model")) == "NOT_FOUND"


def test_repository_index_is_the_union_with_readiness(
    gateway: GatewayRun, client: grpcclient.InferenceServerClient
) -> None:
    index = {m.name: (m.state, m.reason) for m in client.get_model_repository_index().models}
    assert index["double"] == ("READY", "")
    assert index["cold"] == ("UNAVAILABLE", "w0: still compiling; w1: still compiling")
    assert index["spare"] == ("UNAVAILABLE", "w0: unloaded; w1: unloaded")

    async def ready_only(channel: Channel) -> set[str]:
        stub = pb.GrpcInferenceServiceStub(channel)
        answer = await stub.repository_index(pb.RepositoryIndexRequest(ready=True))
        return {m.name for m in answer.models}

    ready = _grpclib(gateway, ready_only)
    assert "cold" not in ready and "double" in ready


def test_model_control_goes_to_the_workers_it_concerns(
    two: list[FakeWorker], client: grpcclient.InferenceServerClient
) -> None:
    """A load goes to every worker whose repository lists the model, its config with it;
    an unload to every worker that has it loaded; a name no worker lists is NOT_FOUND,
    in the words Triton's clients look for."""
    client.load_model("spare", config='{"max_batch_size": 4}')
    assert [w.host.overrides["spare"] for w in two] == [Override("spare", max_batch_size=4)] * 2
    assert all("spare" in w.host.models for w in two)
    client.unload_model("double")
    assert not any("double" in w.host.models for w in two)
    exc = fails(client.load_model, "absent")
    assert code(exc) == "NOT_FOUND"
    assert exc.message() == (
        "failed to load 'absent': no worker behind this gateway lists it in its repository "
        "(2 workers)"
    )


def test_cuda_shared_memory_is_answered_as_a_worker_answers_it(
    client: grpcclient.InferenceServerClient,
) -> None:
    """No regions, unregistering is OK (the reset Triton's examples begin with),
    registering is refused."""
    assert client.get_cuda_shared_memory_status(as_json=True) == {}
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("any")
    exc = fails(client.register_cuda_shared_memory, "r", b"aGFuZGxl", 0, 64)
    assert code(exc) == "INVALID_ARGUMENT" and "GPUs not supported" in exc.message()
    assert code(fails(client.get_cuda_shared_memory_status, "r")) == "NOT_FOUND"


def _grpclib(gateway: GatewayRun, calls: Any) -> Any:
    async def main() -> Any:
        host, port = gateway.grpc.split(":")
        channel = Channel(host, int(port))
        try:
            return await calls(channel)
        finally:
            channel.close()

    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        return runner.run(main())


def test_control_rpcs_fan_out_or_refuse(gateway: GatewayRun) -> None:
    async def calls(channel: Channel) -> list[Any]:
        control = cpb.ControlServiceStub(channel)
        out: list[Any] = [await control.compact_memory(cpb.CompactMemoryRequest())]
        for call in (
            control.model_control_status(cpb.ModelControlStatusRequest()),
            cpb.GatewayControlServiceStub(channel).get_scheduling_status(
                cpb.GetSchedulingStatusRequest()
            ),
        ):
            try:
                await call
            except Exception as exc:
                out.append(exc)
        return out

    compacted, status, scheduling = _grpclib(gateway, calls)
    assert (compacted.reloaded_models, compacted.resident_bytes_after) == (0, 4096)
    assert status.status.name == "FAILED_PRECONDITION" and "acts on one worker" in status.message
    assert scheduling.status.name == "FAILED_PRECONDITION"
    assert "scheduling.mode round_robin" in scheduling.message


def test_health_check_and_watch(gateway: GatewayRun) -> None:
    async def calls(channel: Channel) -> list[Any]:
        stub = health.HealthStub(channel)
        out: list[Any] = [
            (await stub.check(health.HealthCheckRequest(service=s))).status
            for s in ("", "double", "cold")
        ]
        try:
            await stub.check(health.HealthCheckRequest(service="nope"))
        except Exception as exc:
            out.append(exc.status.name)  # type: ignore[attr-defined]
        async for answer in stub.watch(health.HealthCheckRequest(service="nope")):
            out.append(answer.status)
            break
        return out

    S = health.HealthCheckResponseServingStatus
    assert _grpclib(gateway, calls) == [
        S.SERVING, S.SERVING, S.NOT_SERVING, "NOT_FOUND", S.SERVICE_UNKNOWN,
    ]  # fmt: skip


# ------------------------------------------------------------------------------ statuses


def test_worker_statuses_pass_through_with_their_messages(
    client: grpcclient.InferenceServerClient,
) -> None:
    exc = fails(client.infer, "broken", x_input())
    assert (code(exc), exc.message()) == ("INTERNAL", "internal error")
    exc = fails(client.infer, "busy", x_input())
    assert code(exc) == "RESOURCE_EXHAUSTED" and "queue is full" in exc.message()
    wrong = grpcclient.InferInput("x", [1, 16], "INT32")
    wrong.set_data_from_numpy(X.astype(np.int32))
    assert code(fails(client.infer, "double", [wrong])) == "INVALID_ARGUMENT"
    exc = fails(client.infer, "cold", x_input())  # listed everywhere, ready nowhere
    assert (
        code(exc) == "UNAVAILABLE" and "not ready on any worker (listed by w0, w1)" in exc.message()
    )
    exc = fails(client.infer, "no-such-model", x_input())
    assert code(exc) == "NOT_FOUND" and "not served by any worker" in exc.message()


def test_not_found_fails_over_and_refreshes(two: list[FakeWorker]) -> None:
    """A worker unloads a model while the table still lists it: its NOT_FOUND moves the
    request to the other replica, and the refresh takes the worker off the model's list."""
    with running_gateway(config(two)) as gw:
        client = grpcclient.InferenceServerClient(gw.grpc)
        client.infer("double", x_input())
        # The worker that did not answer the first call unloads the model.
        gone, stays = (two[1], two[0]) if rows(two[1]) == 0 else (two[0], two[1])
        gone.run_sync(gone.host.models.pop, "double")
        for _ in range(4):  # whichever the rotation picks, every call is answered
            client.infer("double", x_input())
        wait_until(
            lambda: (
                metric(http_get(gw.metrics_url + "/metrics")[1], "gateway_refreshes_total") == 1
            ),
            what="the refresh",
        )
        # The counter counts a round when it starts; the table changes when it ends.
        wait_until(
            lambda: len(gw.gateway.router.table.replicas("double")) == 1,
            what="the refreshed table",
        )
        _, text = http_get(gw.metrics_url + "/metrics")
        failovers = metric(text, "gateway_failovers_total")
        assert failovers >= 1
        for _ in range(10):
            client.infer("double", x_input())
        _, text = http_get(gw.metrics_url + "/metrics")
        assert metric(text, "gateway_failovers_total") == failovers  # the table knows now
        assert rows(stays) == 15
        client.close()


def test_an_unknown_model_costs_one_refresh(gateway: GatewayRun) -> None:
    client = grpcclient.InferenceServerClient(gateway.grpc)

    def ask(_: int) -> str:
        try:
            client.infer("nobody-serves-this", x_input())
        except InferenceServerException as exc:
            return code(exc)
        return "OK"

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(ask, range(16))) == {"NOT_FOUND"}
    _, text = http_get(gateway.metrics_url + "/metrics")
    assert metric(text, "gateway_refreshes_total") == 1
    assert metric(text, "gateway_refreshes_requested_total") >= 1
    assert (
        metric(text, "gateway_requests_total", rpc="ModelInfer", model="", status="NOT_FOUND") == 16
    )
    client.close()


def test_parameters_pass_through_untouched(
    two: list[FakeWorker], client: grpcclient.InferenceServerClient
) -> None:
    """reactant_timeout_ns travels in the forwarded bytes: the worker (not the gateway)
    turns it into the request's deadline."""
    started = time.monotonic()
    exc = fails(client.infer, "slow", x_input(), parameters={"reactant_timeout_ns": 50_000_000})
    assert code(exc) == "DEADLINE_EXCEEDED"
    assert time.monotonic() - started < 1.0


def test_a_grpc_deadline_is_forwarded(client: grpcclient.InferenceServerClient) -> None:
    started = time.monotonic()
    exc = fails(client.infer, "slow", x_input(), client_timeout=0.05)
    assert code(exc) == "DEADLINE_EXCEEDED"
    assert time.monotonic() - started < 1.0


class Recording(Service):
    """A worker that keeps each ModelInfer's time left (``inf``: no deadline)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.time_left: list[float] = []

    def begin_infer(self, request: Any, ctx: Any, wake: Any) -> Any:
        self.time_left.append(ctx.deadline - trio.current_time())
        return super().begin_infer(request, ctx, wake)


def test_the_worker_is_told_the_clients_deadline_and_only_the_clients() -> None:
    """A call the client gave no deadline reaches the worker with none, as it would
    directly (``request_timeout_seconds`` bounds the gateway's wait, not the worker's
    scheduling); a client's deadline reaches it as the time left."""
    with (
        fake_workers(1, Recording) as (worker,),
        running_gateway(config([worker])) as gw,
    ):
        client = grpcclient.InferenceServerClient(gw.grpc)
        client.infer("double", x_input())
        client.infer("double", x_input(), client_timeout=5.0)
        client.close()
        assert isinstance(worker.service, Recording)
        none, five = worker.service.time_left
        assert none == math.inf
        assert 3.0 < five <= 5.1  # (grpcio rounds the timeout it sends up a little)


def test_the_gateways_own_timeout_answers_and_then_cancels_the_workers_call() -> None:
    """No client deadline: at ``worker_client.request_timeout_seconds`` the gateway
    answers DEADLINE_EXCEEDED, and its reset (after the grace) cancels the call on the
    worker, which was never told a deadline."""
    with (
        fake_workers(1) as (worker,),
        running_gateway(
            config(
                [worker],
                worker_client=attrs.evolve(PAIRED, request_timeout_seconds=0.3),
            )
        ) as gw,
    ):
        client = grpcclient.InferenceServerClient(gw.grpc)
        started = time.monotonic()
        exc = fails(client.infer, "slow", x_input())
        assert code(exc) == "DEADLINE_EXCEEDED"
        assert 0.25 < time.monotonic() - started < 1.0
        wait_until(
            lambda: worker.run_sync(worker.service.statistics).in_flight == 0,
            what="the worker's call cancelled by the gateway's reset",
        )
        client.close()


# ------------------------------------------------------------------------------ shared memory


class Refusing(Service):
    """A worker whose registry is full for regions named ``big-*``."""

    async def system_shared_memory_register(
        self, request: pb.SystemSharedMemoryRegisterRequest, ctx: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        if request.name.startswith("big-"):
            raise ResourceExhausted("256 regions are registered, the limit")
        return await super().system_shared_memory_register(request, ctx)


def _regions(worker: FakeWorker) -> set[str]:
    return {r.name for r in worker.service.registry}  # every owner's


@pytest.fixture
def shm_key() -> Iterator[str]:
    key = f"/reactantserver-gw-test-{os.getpid()}-{threading.get_ident()}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
    os.close(fd)
    yield key
    os.unlink(f"/dev/shm{key}")


def test_shm_registration_is_all_or_nothing(shm_key: str) -> None:
    services = iter([Service, Service, Refusing])
    with (
        fake_workers(3, lambda host: next(services)(host)) as workers,
        running_gateway(config(workers)) as gw,
    ):
        client = grpcclient.InferenceServerClient(gw.grpc)
        client.register_system_shared_memory("small", shm_key, 1024)
        assert [_regions(w) for w in workers] == [{"small"}] * 3
        status = client.get_system_shared_memory_status()
        assert [r.name for r in status.regions.values()] == ["small"]
        exc = fails(client.register_system_shared_memory, "big-1", shm_key, 2048)
        assert code(exc) == "RESOURCE_EXHAUSTED"
        assert f"worker w2 ({workers[2].address}) refused region 'big-1'" in exc.message()
        assert "rolled back on w0" in exc.message()
        assert [_regions(w) for w in workers] == [{"small"}] * 3
        client.unregister_system_shared_memory("small")
        assert [_regions(w) for w in workers] == [set()] * 3
        client.close()


def test_is_same_ipc_namespace_asks_every_worker(shm_key: str, gateway: GatewayRun) -> None:
    async def calls(channel: Channel) -> tuple[bool, bool]:
        stub = pb.GrpcInferenceServiceStub(channel)
        here = await stub.is_same_ipc_namespace(pb.IsSameIpcNamespaceRequest(name=shm_key))
        gone = await stub.is_same_ipc_namespace(
            pb.IsSameIpcNamespaceRequest(name="/reactantserver-gw-none")
        )
        return here.same, gone.same

    assert _grpclib(gateway, calls) == (True, False)


# ------------------------------------------------------------------------------ limits, drain


def test_the_admission_cap_sheds(two: list[FakeWorker]) -> None:
    cfg = config(two[:1], grpc=GatewayGrpcConfig(max_concurrent_requests_per_worker=2))
    with running_gateway(cfg) as gw, ThreadPoolExecutor(2) as pool:
        client = grpcclient.InferenceServerClient(gw.grpc)
        held = [pool.submit(client.infer, "slow", x_input()) for _ in range(2)]
        wait_until(lambda: len(two[0].host.calls) == 2, what="two slow calls at the worker")
        exc = fails(client.infer, "double", x_input())
        assert code(exc) == "RESOURCE_EXHAUSTED"
        assert "limit is 2 (grpc.max_concurrent_requests_per_worker x 1 workers)" in exc.message()
        two[0].release_slow()
        for future in held:
            future.result(30)
        _, text = http_get(gw.metrics_url + "/metrics")
        assert metric(text, "gateway_requests_shed_total") == 1
        assert metric(text, "gateway_max_concurrent_requests") == 2
        client.close()


def test_stopping_refuses_new_calls_and_answers_those_in_flight(two: list[FakeWorker]) -> None:
    with running_gateway(config(two)) as gw, ThreadPoolExecutor(1) as pool:
        client = grpcclient.InferenceServerClient(gw.grpc)
        held = pool.submit(client.infer, "slow", x_input())
        wait_until(lambda: any(w.host.calls for w in two), what="the slow call at a worker")
        gw.stop()
        wait_until(lambda: _refused(gw.grpc), what="new calls refused")
        code_, body = http_get(gw.metrics_url + "/readyz")
        assert code_ == 503 and "shutting down" in body
        for w in two:
            w.release_slow()
        np.testing.assert_array_equal(held.result(30).as_numpy("y"), X)
        client.close()


def _refused(address: str) -> bool:
    c = grpcclient.InferenceServerClient(address)
    try:
        c.infer("double", x_input())
    except InferenceServerException as exc:
        return code(exc) == "UNAVAILABLE" and "shutting down" in exc.message()
    finally:
        c.close()
    return False


def test_the_gateway_exits_1_when_no_worker_answers_for_wedge_exit_rounds(tmp_path: Any) -> None:
    """Configured from the environment alone; the worker answers once, then disappears."""
    with fake_workers(1) as workers:
        gw = start_cli(
            ["gateway", "--log-level", "info"],
            tmp_path / "gateway.log",
            REACTANT_GATEWAY_WORKERS=workers[0].address,
            REACTANT_GATEWAY_LISTEN_GRPC=f"127.0.0.1:{free_port()}",
            REACTANT_GATEWAY_LISTEN_METRICS="127.0.0.1:0",
            REACTANT_GATEWAY_HEALTH_INTERVAL_SECONDS="0.2",
            REACTANT_GATEWAY_WEDGE_EXIT_ROUNDS="3",
            REACTANT_GATEWAY_LOGGING_FORMAT="text",
        )
        wait_until(lambda: "is ready: routing to it" in gw.text(), what="the worker seen")
    assert gw.proc.wait(60) == 1
    assert "(wedge_exit_rounds 3 x health_interval_seconds 0.2)" in gw.text()


def _documented_gateway_series(lpt: bool = False) -> set[str]:
    """The names in the first column of docs/monitoring.md's gateway table: ``{a,b}`` is
    expanded, a ``{label}`` dropped; rows marked ``lpt_packing`` only when ``lpt``."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "monitoring.md").read_text()
    section = text.split("## The gateway", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for row in section.splitlines():
        if not row.startswith("| `gateway_"):
            continue
        if "`lpt_packing` only" in row and not lpt:
            continue
        for token in re.findall(r"`(gateway_[a-z_{},]+)", row.split("|")[1]):
            match = re.fullmatch(r"(.*)\{([a-z_,]+)\}(.*)", token)
            if match is None:
                names.add(token)
            elif "," in match.group(2):
                head, choices, tail = match.groups()
                names.update(head + choice + tail for choice in choices.split(","))
            else:
                names.add(match.group(1) + match.group(3))
    return names


def test_every_gateway_series_is_documented_and_exported(gateway: GatewayRun) -> None:
    """docs/monitoring.md lists exactly the families the gateway exports."""
    _, text = http_get(gateway.metrics_url + "/metrics")
    exported = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE gateway_")}
    assert exported == _documented_gateway_series()


def test_a_taken_port_is_one_line_and_exit_78(tmp_path: Any) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        gw = start_cli(
            ["gateway"],
            tmp_path / "gateway.log",
            REACTANT_GATEWAY_WORKERS="127.0.0.1:1",
            REACTANT_GATEWAY_LISTEN_GRPC=f"127.0.0.1:{port}",
            REACTANT_GATEWAY_LISTEN_METRICS="127.0.0.1:0",
        )
        assert gw.proc.wait(60) == 78  # EX_CONFIG: a restart would fail the same way
    assert (
        f"reactantserver gateway: cannot listen for gRPC on 127.0.0.1:{port}: address already "
        "in use (change listen.grpc)"
    ) in gw.text()
    assert "Traceback" not in gw.text()
