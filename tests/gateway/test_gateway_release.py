"""The router's accounting through the real proxy: every ticket released once, on every path.

``tests/gateway/test_gateway_routing.py`` checks the Router's invariants sans-IO. Here the same
invariants are checked where they can break -- in the proxy's handling of real calls over
real sockets: answered, refused by a worker, failed over, past their deadline, cancelled by
their client mid-flight -- both when a call goes straight to its worker and when it first
waits for one of the worker's stream slots (``worker_client.max_concurrent_streams: 1``,
where most calls of a burst wait). The workers are the fake-host gRPC servers of
``tests/gateway_harness.py``; the client is grpclib's generated stub, so a call can be
cancelled while it is in flight (the client resets its stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from clocks import wait_until
from gateway_harness import FakeWorker, GatewayRun, fake_workers, free_port, running_gateway
from grpclib.client import Channel
from hypothesis import given, settings
from hypothesis import strategies as st

from reactantserver.config.schema import (
    GatewayConfig,
    ListenConfig,
    LoggingConfig,
    WorkerClientConfig,
)
from reactantserver.protocol import inference as pb

OPS = ("ok", "internal", "exhausted", "invalid", "unknown", "deadline", "cancel", "gone")


@pytest.fixture(scope="module", params=[32, 1], ids=["streams-free", "one-stream-slot"])
def fleet(request: pytest.FixtureRequest) -> Iterator[tuple[list[FakeWorker], GatewayRun]]:
    with fake_workers(2) as workers:
        config = GatewayConfig(
            listen=ListenConfig(grpc="127.0.0.1:0", metrics=f"127.0.0.1:{free_port()}"),
            endpoints=tuple(w.address for w in workers),
            health_interval_seconds=60.0,
            worker_client=WorkerClientConfig(max_concurrent_streams=request.param),
            logging=LoggingConfig(format="text"),
        )
        with running_gateway(config) as gw:
            yield workers, gw


def _request(model: str, datatype: str = "FP32") -> pb.ModelInferRequest:
    x = pb.ModelInferRequestInferInputTensor(name="x", datatype=datatype, shape=[1, 16])
    return pb.ModelInferRequest(model_name=model, inputs=[x], raw_input_contents=[bytes(64)])


async def _one(stub: pb.GrpcInferenceServiceStub, op: str) -> str:
    model = {"ok": "double", "internal": "broken", "exhausted": "busy", "invalid": "double",
             "unknown": "nobody", "deadline": "slow", "cancel": "slow", "gone": "echo"}[op]  # fmt: skip
    request = _request(model, "INT32" if op == "invalid" else "FP32")
    if op == "gone":
        s = pb.ModelInferRequestInferInputTensor(name="s", datatype="BYTES", shape=[1])
        request = pb.ModelInferRequest(
            model_name="echo", inputs=[s], raw_input_contents=[b"\x03\x00\x00\x00abc"]
        )
    timeout = 0.05 if op == "deadline" else None
    call = asyncio.ensure_future(stub.model_infer(request, timeout=timeout))
    if op == "cancel":
        await asyncio.sleep(0.05)  # real-clock: the cancel lands at any point (all are fine)
        call.cancel()
    try:
        await call
    except asyncio.CancelledError:
        return "CANCELLED"
    except Exception as exc:
        return getattr(getattr(exc, "status", None), "name", type(exc).__name__)
    return "OK"


def _run(gateway: GatewayRun, ops: list[str]) -> list[str]:
    async def main() -> list[str]:
        host, port = gateway.grpc.split(":")
        channel = Channel(host, int(port))
        try:
            stub = pb.GrpcInferenceServiceStub(channel)
            return list(await asyncio.gather(*(_one(stub, op) for op in ops)))
        finally:
            channel.close()

    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        return runner.run(main())


def _settled(gateway: GatewayRun) -> Any:
    """The router's statistics once nothing is in flight."""
    router = gateway.gateway.router
    wait_until(lambda: router.statistics().outstanding == 0, what=router.statistics)
    return router.statistics()


@settings(max_examples=12, deadline=None)
@given(st.lists(st.sampled_from(OPS), min_size=1, max_size=10))
def test_every_ticket_is_released_exactly_once(
    fleet: tuple[list[FakeWorker], GatewayRun], ops: list[str]
) -> None:
    """Whatever mix of calls runs at once -- answered, refused by the worker, for a model no
    worker serves, failed over from a worker that no longer serves the model, past their
    deadline, cancelled by the client in flight -- every request the router routed is
    released exactly once: afterwards nothing is outstanding on any replica, the routed
    count grew by the released count, and each release is filed under the outcome the
    client saw."""
    workers, gateway = fleet
    router = gateway.gateway.router
    before = router.statistics()
    # "gone": one worker no longer serves echo; the table still lists it (probes every
    # 60 s), so a request routed there fails over (its NOT_FOUND refreshes the table,
    # after which the other worker alone is routed to -- either way it is answered).
    workers[0].run_sync(workers[0].host.models.pop, "echo", None)
    answers = _run(gateway, ops)
    after = _settled(gateway)
    assert after.outstanding == 0
    assert all(r.outstanding_requests == 0 and r.outstanding_items == 0 for r in after.replicas)
    released = {k: after.released[k] - before.released[k] for k in after.released}
    assert after.chosen - before.chosen == sum(released.values())
    assert released["ok"] == answers.count("OK")
    routed_errors = ("INTERNAL", "RESOURCE_EXHAUSTED", "INVALID_ARGUMENT")
    assert released["error"] == sum(answers.count(s) for s in routed_errors)
    # Past its deadline, the client and the gateway race to end the call: the gateway files
    # it under "deadline" or, when the client's reset arrives first, "cancelled".
    ended = ("DEADLINE_EXCEEDED", "TimeoutError", "CANCELLED")
    assert released["deadline"] + released["cancelled"] <= sum(answers.count(s) for s in ended)
    want = {"ok": {"OK"}, "internal": {"INTERNAL"}, "exhausted": {"RESOURCE_EXHAUSTED"},
            "invalid": {"INVALID_ARGUMENT"}, "unknown": {"NOT_FOUND"},
            "deadline": {"DEADLINE_EXCEEDED", "TimeoutError"}, "cancel": {"CANCELLED"},
            "gone": {"OK"}}  # fmt: skip
    for op, answer in zip(ops, answers, strict=True):
        assert answer in want[op], (op, answer)
