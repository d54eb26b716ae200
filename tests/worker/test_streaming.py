"""ModelStreamInfer end to end: tritonclient's stream API against a worker and a gateway.

The worker is ``serve_grpc`` over ``Service`` and ``tests/fake_host.py``'s ``FakeHost``
(``double``: y = 2x, z = x + 1; ``slow``: held until the test releases it), in this
process with Trio as asyncio's guest, as the worker runs. The gateway runs in front of
two such workers (``tests/gateway_harness.py``). The client is ``tritonclient.grpc``'s
``start_stream`` / ``async_stream_infer`` / ``stop_stream`` in a worker thread, as a
user's program would call it; hostile clients are the hand-written HTTP/2 clients of
``tests/h2_client.py`` on real sockets.

What is shown (issue 43, "Must show", streaming):

* 1,000 requests on one stream, each answered once with its id and its own result, in
  the order they were sent; one in the middle that asks for sequence batching answered
  in the stream with the refusal unary ModelInfer gives, the rest fine; the statistics
  count them as unary requests are counted -- against the worker and through the gateway
  (where a worker that lost the model makes its requests fail over, each on its own);
* the stream's deadline (``stream_timeout``) ends the call DEADLINE_EXCEEDED and withdraws
  what is in flight; a request's own ``timeout`` fails that request only;
* a client that cancels its stream has every request in flight withdrawn, on the worker
  and through the gateway;
* a client that sends without reading is paused at ``stream_requests`` requests (32):
  no more begin (the worker) or are forwarded (the gateway), until it reads; a stream
  reset with requests in flight withdraws them all; an oversized message ends the call
  RESOURCE_EXHAUSTED after the answers before it;
* a worker that stops ends its open streams UNAVAILABLE once their answers are written;
* a stream tritonclient compresses (gzip, deflate) is inflated request by request, a bomb
  among them refused in the stream, on the worker and through the gateway.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import attrs
import h2.settings
import numpy as np
import pytest
import trio
import tritonclient.grpc as tc
from clocks import trio_wait_until
from fake_host import FakeHost
from gateway_harness import FakeWorker, fake_workers, running_gateway
from h2_client import H2Client, grpc_message
from test_gateway_proxy import config as gateway_config
from tritonclient.utils import InferenceServerException

from reactantserver.config.schema import EndpointsConfig, GatewayGrpcConfig
from reactantserver.protocol import inference as pb
from reactantserver.service import Service
from reactantserver.status import StatusCode
from reactantserver.worker.grpc import serve_grpc

T = TypeVar("T")
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
SEQUENCE_REFUSAL = "model 'double': parameter 'sequence_id': sequence batching is not supported"
#: The fixture's endpoints.max_message_bytes.
LIMIT = 1 << 20

pytestmark = pytest.mark.guest


@attrs.frozen
class Running:
    host: FakeHost
    service: Service
    port: int

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
async def worker(nursery: trio.Nursery) -> Running:
    host = FakeHost()
    await nursery.start(host.run)
    service = Service(host, max_concurrent_requests=64)
    endpoints = EndpointsConfig(host="127.0.0.1", port=0, max_message_bytes=LIMIT)
    port = await nursery.start(serve_grpc, service, endpoints)
    return Running(host, service, port)


async def off_loop(fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(fn)


def x_input(value: float, rows: int = 1) -> list[tc.InferInput]:
    inp = tc.InferInput("x", [rows, 16], "FP32")
    inp.set_data_from_numpy(np.full((rows, 16), value, dtype=np.float32))
    return [inp]


class Collector:
    """tritonclient's stream callback: what arrived, in order, and an event at ``want``."""

    def __init__(self, want: int) -> None:
        self.want = want
        self.got: list[tuple[Any, InferenceServerException | None]] = []
        self.enough = threading.Event()

    def __call__(self, result: Any, error: InferenceServerException | None) -> None:
        self.got.append((result, error))
        if len(self.got) >= self.want:
            self.enough.set()


def a_thousand_requests(url: str) -> list[tuple[Any, InferenceServerException | None]]:
    """1,000 requests on one stream, ``r500`` asking for sequence batching."""
    client = tc.InferenceServerClient(url)
    got = Collector(1000)
    client.start_stream(got)
    for i in range(1000):
        extra = {"sequence_id": 7} if i == 500 else {}
        client.async_stream_infer("double", x_input(i), request_id=f"r{i}", **extra)
    assert got.enough.wait(60), f"{len(got.got)} of 1000 answers arrived"
    client.stop_stream()
    client.close()
    return got.got


def check_thousand(got: list[tuple[Any, InferenceServerException | None]]) -> None:
    """Each answered once, in order, with its id and its own result; r500's error."""
    assert len(got) == 1000
    for i, (result, error) in enumerate(got):
        if i == 500:
            assert result is None and error is not None
            assert error.message() == SEQUENCE_REFUSAL
            continue
        assert error is None, (i, error)
        assert result.get_response().id == f"r{i}"
        np.testing.assert_array_equal(result.as_numpy("y"), np.full((1, 16), 2.0 * i))
        np.testing.assert_array_equal(result.as_numpy("z"), np.full((1, 16), i + 1.0))


async def test_a_thousand_requests_on_one_stream(worker: Running) -> None:
    got = await off_loop(lambda: a_thousand_requests(worker.url))
    check_thousand(got)
    # Counted as unary requests are: per model, and per RPC with their status.
    stats = worker.service.request_statistics("double")
    assert (stats.success.count, stats.fail.count) == (999, 1)
    rpcs = worker.service.statistics().rpcs
    assert rpcs[("ModelStreamInfer", "OK")] == 999
    assert rpcs[("ModelStreamInfer", "INVALID_ARGUMENT")] == 1
    assert worker.host.models["double"].rows == 999
    assert worker.service.statistics().in_flight == 0


async def test_an_error_names_its_request_id_in_the_stream(worker: Running) -> None:
    """As Triton does, an error answer carries the failed request's id in its
    ``infer_response`` (tritonclient shows only the message; a raw client sees both)."""

    def call() -> pb.ModelStreamInferResponse:
        with H2Client(worker.port) as client:
            sid = client.start(STREAM)
            request = pb.ModelInferRequest(model_name="nope", id="find-me")
            client.send(sid, grpc_message(bytes(request)), end_stream=True)
            result = client.wait(sid)
        assert result.grpc_status == 0, result.grpc_message
        return pb.ModelStreamInferResponse().parse(result.data[5:])

    answer = await off_loop(call)
    assert answer.error_message == "model 'nope' is not loaded on this worker"
    assert answer.infer_response.id == "find-me"


async def test_the_streams_deadline_ends_it_and_withdraws_what_is_in_flight(
    worker: Running,
) -> None:
    worker.host.honour_deadlines = False  # it runs on, as a batch on the device would

    def call() -> InferenceServerException | None:
        client = tc.InferenceServerClient(worker.url)
        got = Collector(2)
        client.start_stream(got, stream_timeout=0.5)
        client.async_stream_infer("double", x_input(1), request_id="fast")
        client.async_stream_infer("slow", x_input(1), request_id="held")
        assert got.enough.wait(30)
        client.stop_stream()
        (result, _), (_, error) = got.got
        assert result.get_response().id == "fast"
        return error

    error = await off_loop(call)
    assert error is not None and str(error.status()) == "StatusCode.DEADLINE_EXCEEDED"
    await trio_wait_until(lambda: worker.host.cancelled == ["slow"])
    # The client's own 0.5 s timer and the worker's (started when the stream's headers
    # arrived, a little later) race: the worker withdraws the request at its deadline, or
    # at the client's reset that comes just before it (CANCELLED: the worker could not
    # know). Either way it is withdrawn once and nothing stays in flight; the worker's
    # own deadline alone is tests/transport/test_wire_streaming.py's.
    assert worker.service.request_statistics("slow").by_status in (
        {"DEADLINE_EXCEEDED": 1},
        {"CANCELLED": 1},
    )
    assert worker.service.statistics().in_flight == 0


async def test_a_requests_own_timeout_fails_only_that_request(worker: Running) -> None:
    def call() -> list[tuple[Any, InferenceServerException | None]]:
        client = tc.InferenceServerClient(worker.url)
        got = Collector(2)
        client.start_stream(got)
        client.async_stream_infer("slow", x_input(1), request_id="held", timeout=50_000)
        client.async_stream_infer("double", x_input(1), request_id="after")
        assert got.enough.wait(30)
        client.stop_stream()
        return got.got

    (first, error), (after, late) = await off_loop(call)
    assert first is None and error is not None
    assert error.message().startswith("model 'slow': deadline passed after")
    assert late is None and after.get_response().id == "after"


async def test_a_cancelled_stream_withdraws_every_request_in_flight(worker: Running) -> None:
    def call() -> None:
        client = tc.InferenceServerClient(worker.url)
        client.start_stream(Collector(1))
        for i in range(5):
            client.async_stream_infer("slow", x_input(i), request_id=f"s{i}")
        wait = threading.Event()
        for _ in range(1000):
            if len(worker.host.calls) == 5:
                break
            wait.wait(0.01)
        client.stop_stream(cancel_requests=True)
        client.close()

    await off_loop(call)
    await trio_wait_until(lambda: worker.host.cancelled == ["slow"] * 5)
    await trio_wait_until(lambda: worker.service.statistics().in_flight == 0)
    assert worker.service.request_statistics("slow").by_status == {"CANCELLED": 5}
    assert worker.service.statistics().rpcs[("ModelStreamInfer", "CANCELLED")] == 5


async def test_the_model_config_does_not_claim_decoupled(worker: Running) -> None:
    def call() -> Any:
        return tc.InferenceServerClient(worker.url).get_model_config("double", as_json=True)

    config = await off_loop(call)
    assert config["config"]["model_transaction_policy"] == {}  # decoupled: false (the default)


# ------------------------------------------------------------------------------ hostile


def infer_bytes(i: int, model: str = "double") -> bytes:
    request = pb.ModelInferRequest(
        model_name=model,
        id=f"h{i}",
        inputs=[pb.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=[1, 16])],
        raw_input_contents=[np.full((1, 16), i, dtype=np.float32).tobytes()],
    )
    return grpc_message(bytes(request))


def stream_answers(data: bytes) -> list[pb.ModelStreamInferResponse]:
    out = []
    while data:
        size = int.from_bytes(data[1:5], "big")
        out.append(pb.ModelStreamInferResponse().parse(data[5 : 5 + size]))
        data = data[5 + size :]
    return out


async def test_a_client_that_sends_without_reading_is_paused(worker: Running) -> None:
    """1,000 requests from a client whose window for our answers is shut: 32 begin (the
    per-stream bound) and no more, whatever the client sends; when it reads, all 1,000
    are answered, in order."""
    codes = h2.settings.SettingCodes
    client = H2Client(worker.port)
    try:

        def send() -> None:
            client.conn.update_settings({codes.INITIAL_WINDOW_SIZE: 0})
            client.flush()
            assert client.round_trip()
            sid = client.start(STREAM)
            assert client.send(sid, b"".join(infer_bytes(i) for i in range(1000)))
            assert client.round_trip()  # the server has read all of it

        await off_loop(send)
        assert len(worker.host.calls) == 32  # answered by the host, waiting for the client
        assert worker.service.statistics().in_flight == 0

        def read() -> list[pb.ModelStreamInferResponse]:
            client.conn.update_settings({codes.INITIAL_WINDOW_SIZE: 1 << 20})
            client.end(1)
            result = client.wait(1, timeout=60)
            assert result.grpc_status == 0, result.grpc_message
            return stream_answers(result.data)

        answers = await off_loop(read)
    finally:
        client.close()
    assert [a.infer_response.id for a in answers] == [f"h{i}" for i in range(1000)]
    assert len(worker.host.calls) == 1000


async def test_a_stream_reset_with_requests_in_flight_withdraws_them_all(
    worker: Running,
) -> None:
    """100 requests for ``slow`` (they wait), then RST_STREAM: the 32 that began are all
    withdrawn, none runs on; the connection goes on serving."""

    def call() -> tuple[int | None, str]:
        with H2Client(worker.port) as client:
            sid = client.start(STREAM)
            client.send(sid, b"".join(infer_bytes(i, "slow") for i in range(100)))
            assert client.round_trip()
            client.conn.reset_stream(sid)
            client.flush()
            live = client.call(
                "/inference.GRPCInferenceService/ServerLive", bytes(pb.ServerLiveRequest())
            )
            return live.grpc_status, live.data.hex()

    status, _ = await off_loop(call)
    assert status == 0
    await trio_wait_until(lambda: len(worker.host.cancelled) == 32)
    assert len(worker.host.calls) == 32
    await trio_wait_until(lambda: worker.service.statistics().in_flight == 0)
    assert worker.service.request_statistics("slow").by_status == {"CANCELLED": 32}


async def test_an_oversized_message_ends_the_stream_resource_exhausted(worker: Running) -> None:
    def call() -> Any:
        with H2Client(worker.port) as client:
            sid = client.start(STREAM)
            client.send(sid, infer_bytes(0) + infer_bytes(1))
            client.send(sid, grpc_message(b"", length=LIMIT + 1))
            return client.wait(sid)

    result = await off_loop(call)
    assert result.grpc_status == StatusCode.RESOURCE_EXHAUSTED
    assert result.grpc_message == (
        f"request message of {LIMIT + 1} bytes exceeds the limit of {LIMIT} bytes "
        "(endpoints.max_message_bytes); use shared memory for inputs this large"
    )
    assert [a.infer_response.id for a in stream_answers(result.data)] == ["h0", "h1"]


async def test_a_stopping_worker_ends_open_streams_after_their_answers(
    nursery: trio.Nursery,
) -> None:
    """SIGTERM's drain with a stream open and a request in flight: the request is
    answered, then the stream ends UNAVAILABLE; a request sent meanwhile is refused in
    the stream."""
    host = FakeHost()
    await nursery.start(host.run)
    service = Service(host)
    stop = trio.Event()
    port = await nursery.start(
        lambda task_status: serve_grpc(
            service, EndpointsConfig(host="127.0.0.1", port=0), stop=stop,
            grace_seconds=30.0, task_status=task_status,
        )
    )  # fmt: skip
    client = tc.InferenceServerClient(f"127.0.0.1:{port}")
    got = Collector(3)
    await off_loop(lambda: client.start_stream(got))
    await off_loop(lambda: client.async_stream_infer("slow", x_input(1), request_id="held"))
    await trio_wait_until(lambda: len(host.calls) == 1)
    stop.set()

    def refused() -> bool:  # the drain has begun once a new call is refused
        try:
            client.is_server_live()
        except InferenceServerException as exc:
            return str(exc.status()) == "StatusCode.UNAVAILABLE"
        return False

    with trio.fail_after(60):
        while not await off_loop(refused):
            await trio.sleep(0.01)  # real-clock: the poll of a condition a client thread sees
    await off_loop(lambda: client.async_stream_infer("double", x_input(1), request_id="late"))
    await trio_wait_until(
        lambda: service.statistics().rpcs.get(("ModelStreamInfer", "UNAVAILABLE")) == 1
    )
    assert got.got == []  # the refusal waits behind the request before it
    host.release.set()
    assert await off_loop(lambda: got.enough.wait(30))
    (held, _), (late, refusal), (_, end) = got.got
    assert held.get_response().id == "held"
    assert late is None and refusal is not None
    assert refusal.message() == "server is shutting down"
    assert end is not None and str(end.status()) == "StatusCode.UNAVAILABLE"
    await off_loop(client.close)


# ------------------------------------------------------------------------------ gateway


@pytest.fixture
def fleet() -> Iterator[list[FakeWorker]]:
    with fake_workers(2) as workers:
        yield workers


def test_a_thousand_requests_on_one_stream_through_the_gateway(
    fleet: list[FakeWorker],
) -> None:
    """The gateway ends the client's stream and forwards each request as a ModelInfer
    of its own: every answer in order with its id; w0 lost ``double`` after the gateway
    last looked, so each request routed there fails over to w1 on its own."""
    w0, w1 = fleet
    with running_gateway(gateway_config(fleet)) as gw:
        w0.run_sync(w0.host.models.pop, "double")  # the gateway's table still lists it
        got = a_thousand_requests(gw.grpc)
        stats = gw.gateway.proxy.stats if gw.gateway.proxy is not None else None
        assert stats is not None
        answered = stats.statistics().requests
    check_thousand(got)
    assert w1.host.models["double"].rows == 999
    assert w0.service.statistics().rpcs.get(("ModelInfer", "NOT_FOUND"), 0) >= 1
    assert answered[("ModelStreamInfer", "double", "OK")] == 999
    assert answered[("ModelStreamInfer", "double", "INVALID_ARGUMENT")] == 1


def test_a_cancelled_stream_through_the_gateway_cancels_the_workers_calls(
    fleet: list[FakeWorker],
) -> None:
    with running_gateway(gateway_config(fleet)) as gw:
        client = tc.InferenceServerClient(gw.grpc)
        client.start_stream(Collector(1))
        for i in range(4):
            client.async_stream_infer("slow", x_input(i), request_id=f"s{i}")
        wait = threading.Event()
        for _ in range(1000):
            if sum(len(w.host.calls) for w in fleet) == 4:
                break
            wait.wait(0.01)
        client.stop_stream(cancel_requests=True)
        client.close()
        for _ in range(1000):
            if sum(len(w.host.cancelled) for w in fleet) == 4:
                break
            wait.wait(0.01)
    assert sum(len(w.host.cancelled) for w in fleet) == 4


def test_a_client_that_sends_without_reading_is_paused_at_the_gateway(
    fleet: list[FakeWorker],
) -> None:
    """The gateway holds a stream to the same bound: 32 of 200 requests forwarded, none
    more, until the client reads; then all 200 answered in order."""
    codes = h2.settings.SettingCodes
    with running_gateway(gateway_config(fleet)) as gw, H2Client(gw.address.grpc_port) as client:
        client.conn.update_settings({codes.INITIAL_WINDOW_SIZE: 0})
        client.flush()
        assert client.round_trip()
        sid = client.start(STREAM)
        assert client.send(sid, b"".join(infer_bytes(i) for i in range(200)))
        assert client.round_trip()  # the gateway has read every byte sent
        assert gw.gateway.proxy is not None
        (stream,) = gw.gateway.proxy.streams
        assert (stream.owed, stream.paused) == (32, True) and stream.kept > 0
        wait = threading.Event()
        for _ in range(1000):  # the forwarded calls reach the workers
            if sum(len(w.host.calls) for w in fleet) >= 32:
                break
            wait.wait(0.01)
        assert client.round_trip()
        assert sum(len(w.host.calls) for w in fleet) == 32
        client.conn.update_settings({codes.INITIAL_WINDOW_SIZE: 1 << 20})
        client.end(sid)
        result = client.wait(sid, timeout=60)
    assert result.grpc_status == 0, result.grpc_message
    assert [a.infer_response.id for a in stream_answers(result.data)] == [
        f"h{i}" for i in range(200)
    ]


# ------------------------------------------------------------------------------ compression


def compressed_stream(
    url: str, algorithm: str
) -> list[tuple[Any, InferenceServerException | None]]:
    """50 requests on a stream tritonclient compresses, the 25th a bomb: a message of a
    few kilobytes that inflates past the 1 MiB message limit."""
    client = tc.InferenceServerClient(url)
    got = Collector(50)
    client.start_stream(got, compression_algorithm=algorithm)
    for i in range(50):
        inp = x_input(i, rows=40_000) if i == 25 else x_input(i)  # 2.5 MB of one value
        client.async_stream_infer("double", inp, request_id=f"c{i}")
    assert got.enough.wait(60), f"{len(got.got)} of 50 answers arrived"
    client.stop_stream()
    client.close()
    return got.got


def check_compressed(got: list[tuple[Any, InferenceServerException | None]], limit: str) -> None:
    """Each answered in order; the bomb refused in the stream, the stream going on."""
    for i, (result, error) in enumerate(got):
        if i == 25:
            assert result is None and error is not None
            assert error.message() == (
                f"the request message inflates past the limit of {LIMIT} bytes "
                f"({limit}); send less, or send it uncompressed in shared memory"
            )
            continue
        assert error is None, (i, error)
        assert result.get_response().id == f"c{i}"
        np.testing.assert_array_equal(result.as_numpy("y"), np.full((1, 16), 2.0 * i))


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
async def test_a_compressed_stream_is_inflated_request_by_request(
    worker: Running, algorithm: str
) -> None:
    got = await off_loop(lambda: compressed_stream(worker.url, algorithm))
    check_compressed(got, "endpoints.max_message_bytes")
    assert worker.host.models["double"].rows == 49


def test_a_compressed_stream_through_the_gateway(fleet: list[FakeWorker]) -> None:
    with running_gateway(
        gateway_config(fleet, grpc=GatewayGrpcConfig(max_recv_msg_bytes=LIMIT))
    ) as gw:
        got = compressed_stream(gw.grpc, "gzip")
    check_compressed(got, "grpc.max_recv_msg_bytes")
    assert sum(w.host.models["double"].rows for w in fleet) == 49
