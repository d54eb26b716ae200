"""A real ``reactantserver gateway`` process while its workers are away: what clients are
told, and what the log says.

The workers are ``tests/fake_host`` servers in this process (no JAX), started and stopped
around a gateway process driven by ``tritonclient``. Checked: a model the gateway has seen
(or was told to expect) is UNAVAILABLE -- which clients retry -- while no worker serving it
is ready, and a name never seen is NOT_FOUND with the closest known name; a start with the
workers not up yet reads healthy (no warning, no connection error), and the gateway says
when it is ready.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from gateway_harness import Process, fake_workers, free_port, start_cli, wait_until
from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from tritonclient.utils import InferenceServerException

from reactantserver.protocol.grpc.health import v1 as health

X = np.arange(16, dtype=np.float32).reshape(1, 16)


def x_input() -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("x", list(X.shape), "FP32")
    inp.set_data_from_numpy(X)
    return [inp]


def refused(address: str, model: str) -> tuple[str, str]:
    """The status and message ModelInfer of ``model`` is answered with."""
    client = grpcclient.InferenceServerClient(address)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.infer(model, x_input())
    finally:
        client.close()
    return str(caught.value.status()).removeprefix("StatusCode."), caught.value.message()


def answers(address: str, model: str) -> bool:
    client = grpcclient.InferenceServerClient(address)
    try:
        client.infer(model, x_input())
        return True
    except InferenceServerException:
        return False
    finally:
        client.close()


def health_of(address: str, service: str) -> object:
    """grpc.health.v1 Check of ``service``: its ServingStatus, or the gRPC status name."""

    async def check() -> object:
        host, port = address.rsplit(":", 1)
        channel = Channel(host, int(port))
        try:
            stub = health.HealthStub(channel)
            return (await stub.check(health.HealthCheckRequest(service=service))).status
        except GRPCError as exc:
            return exc.status.name
        finally:
            channel.close()

    return asyncio.run(check())


def gateway(log: Path, workers: list[str], **env: str) -> tuple[Process, str]:
    address = f"127.0.0.1:{free_port()}"
    process = start_cli(
        ["gateway", "--log-level", "info"],
        log,
        REACTANT_GATEWAY_WORKERS=",".join(workers),
        REACTANT_GATEWAY_WORKER_NAMES="worker0,worker1",
        REACTANT_GATEWAY_LISTEN_GRPC=address,
        REACTANT_GATEWAY_LISTEN_METRICS="127.0.0.1:0",
        REACTANT_GATEWAY_HEALTH_INTERVAL_SECONDS="0.2",
        REACTANT_GATEWAY_WEDGE_EXIT_ROUNDS="0",
        REACTANT_GATEWAY_LOGGING_FORMAT="text",
        **env,
    )
    wait_until(lambda: "gateway started:" in process.text(), what="the gateway's start")
    return process, address


def test_every_worker_killed_after_serving_is_unavailable_not_not_found(tmp_path: Path) -> None:
    """The issue's outage: both workers served ``double``, then both went away."""
    with fake_workers(2) as workers:
        gw, address = gateway(tmp_path / "gateway.log", [w.address for w in workers])
        try:
            wait_until(lambda: "gateway started: 2 of 2 workers ready" in gw.text(), what="ready")
            assert answers(address, "double")
            assert refused(address, "doubel") == (
                "NOT_FOUND",
                "model 'doubel' is not served by any worker behind this gateway (2 of 2 "
                "workers ready); did you mean 'double'?",
            )
        except BaseException:
            gw.kill()
            raise
    try:
        wait_until(lambda: gw.text().count("left the route table") == 2, what="workers gone")
        for _ in range(5):  # every call, not most of them
            assert refused(address, "double") == (
                "UNAVAILABLE",
                "model 'double': no worker serving it is ready (0 of 2 workers ready); retry "
                "when one is back",
            )
        # A name never seen, too: no worker is ready to say it is absent (issue 42).
        status, message = refused(address, "doubel")
        assert status == "UNAVAILABLE" and message.endswith("did you mean 'double'?")
    finally:
        assert gw.terminate() == 0


def test_workers_down_before_the_gateway_started(tmp_path: Path) -> None:
    """Expected models (what a node assigns) are UNAVAILABLE before any worker answered;
    the start reads healthy, and the gateway says when it becomes ready."""
    ports = [free_port(), free_port()]
    gw, address = gateway(
        tmp_path / "gateway.log",
        [f"127.0.0.1:{p}" for p in ports],
        REACTANT_GATEWAY_EXPECTED_MODELS="double,echo",
    )
    try:
        assert "gateway started: waiting for 2 workers; mode round_robin" in gw.text()
        status, message = refused(address, "double")
        assert status == "UNAVAILABLE" and "(0 of 2 workers ready)" in message
        # Every worker down before the gateway started: not even a name never seen is
        # NOT_FOUND (issue 43's "also found through the gateway"; issue 42 item 4).
        assert refused(address, "echos") == (
            "UNAVAILABLE",
            "model 'echos': no worker behind this gateway is ready (0 of 2) to say whether "
            "it serves it; retry when one is back; did you mean 'echo'?",
        )
        # Health agrees: an expected model is known but not serving (a probe waits), so is
        # a name nobody can judge yet, and the gateway itself is not ready yet.
        serving = health.HealthCheckResponseServingStatus
        assert health_of(address, "double") == serving.NOT_SERVING
        assert health_of(address, "echos") == serving.NOT_SERVING
        assert health_of(address, "") == serving.NOT_SERVING
        with fake_workers(2, ports=ports):
            wait_until(lambda: "gateway ready: " in gw.text(), what="the ready line")
            wait_until(lambda: answers(address, "double"), what="double served")
            assert health_of(address, "double") == serving.SERVING
            # Workers ready to say so: a name never seen is NOT_FOUND now.
            assert refused(address, "echos")[0] == "NOT_FOUND"
            assert health_of(address, "echos") == "NOT_FOUND"
        text = gw.text()
        start = text.split("gateway ready:")[0]
        assert " WARNING " not in start and " ERROR " not in start, start
        assert "Connect call failed" not in start and "not ready (" not in start
    finally:
        assert gw.terminate() == 0
