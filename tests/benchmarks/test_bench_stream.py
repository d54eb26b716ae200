"""The streaming benchmark's load generator (``benchmarks/bench_stream.py``): both of its
modes against a real worker (``serve_grpc`` over ``tests/fake_host.py``), each closing its
loop with every answer checked and nothing left owed. No timing is asserted: the
benchmark itself (``nox -s bench -- stream``) is where numbers live."""

from __future__ import annotations

import pytest
import trio
from conftest import ROOT, load_file
from fake_host import FakeHost

from reactantserver.config.schema import EndpointsConfig
from reactantserver.service import Service
from reactantserver.worker.grpc import serve_grpc

bst = load_file("reactantserver_bench_stream", ROOT / "benchmarks" / "bench_stream.py")

pytestmark = pytest.mark.guest


@pytest.mark.parametrize(("mode", "inflight"), [("unary", 1), ("unary", 8), ("stream", 8)])
async def test_the_load_generator_closes_its_loop(
    nursery: trio.Nursery, mode: str, inflight: int
) -> None:
    host = FakeHost()
    await nursery.start(host.run)
    service = Service(host)
    port = await nursery.start(serve_grpc, service, EndpointsConfig(host="127.0.0.1", port=0))

    def run() -> int:
        client = bst.Client(f"127.0.0.1:{port}")
        try:
            getattr(client, mode)(inflight, lambda: client.answered >= 200)
        finally:
            client.close()
        return client.answered

    answered = await trio.to_thread.run_sync(run)
    # Each answer past the 200th was already in flight when the loop stopped.
    assert 200 <= answered < 200 + inflight
    assert host.models["double"].rows == answered
    rpc = "ModelInfer" if mode == "unary" else "ModelStreamInfer"
    assert service.statistics().rpcs[(rpc, "OK")] == answered
