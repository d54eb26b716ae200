"""The gRPC surface end to end: a real server on 127.0.0.1, real Triton clients.

Each test starts ``serve_grpc`` on port 0 inside its own Trio run -- Trio as the guest
of an asyncio loop, as in the worker (cheap: one socket) -- over ``Service`` and the fake host of ``tests/fake_host.py``, and
drives it with ``tritonclient.grpc`` (blocking, so it runs in a worker thread while the
event loop keeps serving) or ``tritonclient.grpc.aio`` (its own asyncio loop in a worker
thread). The control service is called with plain grpcio. Every status the surface
produces is checked with its exact message.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import attrs
import grpc
import numpy as np
import pytest
import trio
import trio.testing
import tritonclient.grpc as tc
import tritonclient.grpc.aio as tca
import tritonclient.utils.shared_memory as tshm
from clocks import trio_wait_until
from fake_host import FakeHost
from tritonclient.utils import InferenceServerException

from reactantserver import __version__
from reactantserver.config.schema import EndpointsConfig
from reactantserver.errors import DeadlineExceeded
from reactantserver.load_config import Override
from reactantserver.protocol import inference as pb
from reactantserver.protocol import reactant_control as cpb
from reactantserver.protocol.grpc.reflection import v1, v1alpha
from reactantserver.records import CallContext
from reactantserver.service import Service
from reactantserver.worker.grpc import listen_tcp, serve_grpc

T = TypeVar("T")

#: The fixture's endpoints.max_message_bytes: small enough to test both directions.
LIMIT = 1 << 20
#: The fixture's endpoints.max_concurrent_requests.
CAP = 2

# Servers started in this process run as the worker does: Trio is asyncio's guest.
pytestmark = pytest.mark.guest


@attrs.frozen
class Running:
    host: FakeHost
    service: Service
    port: int

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self) -> tc.InferenceServerClient:
        return tc.InferenceServerClient(self.url)


@pytest.fixture
async def server(nursery: trio.Nursery) -> Running:
    host = FakeHost()
    await nursery.start(host.run)
    service = Service(host, max_concurrent_requests=CAP)
    endpoints = EndpointsConfig(host="127.0.0.1", port=0, max_message_bytes=LIMIT)
    port = await nursery.start(serve_grpc, service, endpoints)
    return Running(host, service, port)


async def off_loop(fn: Callable[[], T]) -> T:
    """Run a blocking client call in a worker thread; the event loop keeps serving."""
    return await trio.to_thread.run_sync(fn)


def error_of(fn: Callable[[], Any]) -> tuple[str, str]:
    """(status, message) of the InferenceServerException ``fn`` raises."""
    try:
        fn()
    except InferenceServerException as exc:
        return str(exc.status()), str(exc.message())
    raise AssertionError("the call succeeded, an error was expected")


def x_input(rows: int = 2, datatype: str = "FP32", cols: int = 16) -> tc.InferInput:
    inp = tc.InferInput("x", [rows, cols], datatype)
    dtype = np.float32 if datatype == "FP32" else np.int32
    inp.set_data_from_numpy(np.arange(rows * cols, dtype=dtype).reshape(rows, cols))
    return inp


# ------------------------------------------------------------------------ health, metadata


async def test_health_and_metadata(server: Running) -> None:
    def calls() -> None:
        c = server.client()
        assert c.is_server_live()
        assert c.is_server_ready()
        assert c.is_model_ready("double")
        assert not c.is_model_ready("cold")
        assert not c.is_model_ready("no-such-model")
        meta = c.get_server_metadata(as_json=True)
        assert meta == {
            "name": "reactantserver",
            "version": __version__,
            "extensions": [
                "model_configuration",
                "model_repository",
                "statistics",
                "system_shared_memory",
            ],
        }
        model = c.get_model_metadata("double", as_json=True)
        assert model == {
            "name": "double",
            "platform": "jax_cpu",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": ["-1", "16"]}],
            "outputs": [
                {"name": "y", "datatype": "FP32", "shape": ["-1", "16"]},
                {"name": "z", "datatype": "FP32", "shape": ["-1", "16"]},
            ],
        }

    await off_loop(calls)


async def test_model_config_is_what_triton_clients_read(server: Running) -> None:
    config = await off_loop(lambda: server.client().get_model_config("double", as_json=True))
    assert config["config"] == {
        "name": "double",
        "platform": "jax_cpu",
        "backend": "jax_cpu",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": 8,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["16"]}],
        "output": [
            {"name": "y", "data_type": "TYPE_FP32", "dims": ["16"]},
            {"name": "z", "data_type": "TYPE_FP32", "dims": ["16"]},
        ],
        "instance_group": [{"name": "double", "count": 1, "kind": "KIND_CPU"}],
        "dynamic_batching": {
            "preferred_batch_size": [1, 4, 8],
            "default_queue_policy": {"max_queue_size": 16},
        },
        "parameters": {"weight": {"string_value": "1.0"}},
        "model_transaction_policy": {},
    }


# ------------------------------------------------------------------------------- inference


async def test_infer_inline_outputs_in_requested_order(server: Running) -> None:
    def calls() -> None:
        c = server.client()
        x = np.arange(32, dtype=np.float32).reshape(2, 16)
        result = c.infer(
            "double",
            [x_input()],
            outputs=[tc.InferRequestedOutput("z"), tc.InferRequestedOutput("y")],
            request_id="req-7",
        )
        response = result.get_response()
        assert [o.name for o in response.outputs] == ["z", "y"]
        assert response.id == "req-7"
        assert response.model_name == "double"
        np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
        np.testing.assert_array_equal(result.as_numpy("z"), x + 1)
        # None requested: every output, in declaration order.
        everything = c.infer("double", [x_input()]).get_response()
        assert [o.name for o in everything.outputs] == ["y", "z"]

    await off_loop(calls)


async def test_infer_bytes_tensors(server: Running) -> None:
    def call() -> np.ndarray:
        inp = tc.InferInput("s", [3], "BYTES")
        inp.set_data_from_numpy(np.array([b"a", b"", b"xyz"], dtype=object))
        return server.client().infer("echo", [inp]).as_numpy("t")

    assert list(await off_loop(call)) == [b"a!", b"!", b"xyz!"]


async def test_statistics_count_requests_and_executions(server: Running) -> None:
    def calls() -> dict[str, Any]:
        c = server.client()
        c.infer("double", [x_input(2)])
        c.infer("double", [x_input(3)])
        error_of(lambda: c.infer("double", [x_input(2, cols=15)]))
        return c.get_inference_statistics("double", as_json=True)

    stats = (await off_loop(calls))["model_stats"]
    assert len(stats) == 1
    s = stats[0]
    assert s["name"] == "double"
    assert s["inference_count"] == "5" and s["execution_count"] == "2"
    assert s["inference_stats"]["success"]["count"] == "2"
    assert s["inference_stats"]["fail"]["count"] == "1"
    assert int(s["inference_stats"]["success"]["ns"]) > 0
    assert s["inference_stats"]["compute_infer"]["count"] == "2"
    assert int(s["last_inference"]) > 0
    assert [b["batch_size"] for b in s["batch_stats"]] == ["4"]
    assert s["batch_stats"][0]["compute_infer"]["count"] == "2"
    # The service's own counters, which the metrics collector reads.
    latency = server.service.request_statistics("double").latency
    assert latency is not None and latency.count == 3 and latency.buckets[-1][0] == "+Inf"
    assert server.service.request_statistics("echo").latency is None
    rpcs = server.service.statistics().rpcs
    assert rpcs[("ModelInfer", "OK")] == 2
    assert rpcs[("ModelInfer", "INVALID_ARGUMENT")] == 1
    assert rpcs[("ModelStatistics", "OK")] == 1
    # Every loaded model when no name is given.
    everything = await off_loop(lambda: server.client().get_inference_statistics(as_json=True))
    assert sorted(m["name"] for m in everything["model_stats"]) == sorted(server.host.models)


# ------------------------------------------------------------------------- shared memory


async def test_system_shared_memory_inputs_and_outputs(server: Running) -> None:
    key_in = f"/reactantserver-grpc_in_{uuid.uuid4().hex[:8]}"
    key_out = f"/reactantserver-grpc_out_{uuid.uuid4().hex[:8]}"
    h_in = tshm.create_shared_memory_region("in", key_in, 128)
    h_out = tshm.create_shared_memory_region("out", key_out, 256)
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    try:
        tshm.set_shared_memory_region(h_in, [x])

        def calls() -> None:
            c = server.client()
            c.register_system_shared_memory("in", key_in, 128)
            c.register_system_shared_memory("out", key_out, 256)
            status = c.get_system_shared_memory_status(as_json=True)["regions"]
            assert status["in"] == {"name": "in", "key": key_in, "byte_size": "128"}
            assert status["out"]["byte_size"] == "256"

            inp = tc.InferInput("x", [2, 16], "FP32")
            inp.set_shared_memory("in", 128)
            y = tc.InferRequestedOutput("y")
            y.set_shared_memory("out", 128)
            z = tc.InferRequestedOutput("z")
            z.set_shared_memory("out", 128, offset=128)
            result = c.infer("double", [inp], outputs=[y, z])
            np.testing.assert_array_equal(
                tshm.get_contents_as_numpy(h_out, np.float32, [2, 16]), x * 2
            )
            np.testing.assert_array_equal(
                tshm.get_contents_as_numpy(h_out, np.float32, [2, 16], offset=128), x + 1
            )
            echoed = result.get_output("z").parameters
            assert echoed["shared_memory_region"].string_param == "out"
            assert echoed["shared_memory_offset"].int64_param == 128
            assert echoed["shared_memory_byte_size"].int64_param == 128
            # Mixed: y inline after z in shared memory. Raw entries stay aligned with
            # outputs (an empty one for z), which is how tritonclient indexes them.
            z = tc.InferRequestedOutput("z")
            z.set_shared_memory("out", 128, offset=128)
            mixed = c.infer("double", [inp], outputs=[z, tc.InferRequestedOutput("y")])
            np.testing.assert_array_equal(mixed.as_numpy("y"), x * 2)
            assert mixed.get_response().raw_output_contents[0] == b""

            # An output window too small for the result.
            small = tc.InferRequestedOutput("y")
            small.set_shared_memory("out", 64)
            assert error_of(lambda: c.infer("double", [inp], outputs=[small])) == (
                "StatusCode.INVALID_ARGUMENT",
                "model 'double': output 'y': 128 bytes do not fit in "
                "shared_memory_byte_size=64 of shared memory region 'out'",
            )
            # An input window that disagrees with the shape.
            short = tc.InferInput("x", [2, 16], "FP32")
            short.set_shared_memory("in", 120)
            assert error_of(lambda: c.infer("double", [short])) == (
                "StatusCode.INVALID_ARGUMENT",
                "model 'double': input 'x': shared_memory_byte_size is 120, "
                "shape [2, 16] of FP32 needs 128",
            )

            c.unregister_system_shared_memory("in")
            assert list(c.get_system_shared_memory_status(as_json=True)["regions"]) == ["out"]
            assert error_of(lambda: c.infer("double", [inp])) == (
                "StatusCode.FAILED_PRECONDITION",
                "shared memory region 'in' is not registered; "
                "call SystemSharedMemoryRegister first",
            )
            assert error_of(lambda: c.get_system_shared_memory_status("in")) == (
                "StatusCode.NOT_FOUND",
                "shared memory region 'in' is not registered",
            )
            c.unregister_system_shared_memory()
            assert c.get_system_shared_memory_status(as_json=True) == {}

        await off_loop(calls)
    finally:
        tshm.destroy_shared_memory_region(h_in)
        tshm.destroy_shared_memory_region(h_out)


# ---------------------------------------------------------------------------- repository


async def test_repository_index_load_unload(server: Running) -> None:
    def calls() -> None:
        c = server.client()
        index = c.get_model_repository_index(as_json=True)["models"]
        states = {m["name"]: m.get("state") for m in index}
        assert states["double"] == "READY" and states["spare"] == "UNAVAILABLE"
        assert states["cold"] == "UNAVAILABLE"
        assert {m["name"]: m.get("reason") for m in index}["cold"] == "still compiling"

        c.load_model("spare")
        assert c.is_model_ready("spare")
        c.unload_model("double")
        assert error_of(lambda: c.infer("double", [x_input()])) == (
            "StatusCode.NOT_FOUND",
            "model 'double' is not loaded on this worker",
        )
        # Every refused load says "failed to load" (what Triton's clients look for).
        assert error_of(lambda: c.load_model("nothing")) == (
            "StatusCode.NOT_FOUND",
            "failed to load 'nothing': model 'nothing' is not in the repository",
        )
        assert error_of(lambda: c.load_model("badbundle")) == (
            "StatusCode.FAILED_PRECONDITION",
            "failed to load 'badbundle': bundle 'badbundle': manifest.yaml: format_version: "
            "required key is missing",
        )
        # A config reaches the host parsed (load_config); a file: upload never does.
        c.load_model("spare", config='{"max_batch_size": "2"}')
        assert server.host.overrides["spare"] == Override("spare", max_batch_size=2)
        assert error_of(lambda: c.load_model("spare", config='{"max_batch_size": 2')) == (
            "StatusCode.INVALID_ARGUMENT",
            "failed to load 'spare': config: not valid JSON (Expecting ',' delimiter: "
            "line 1 column 21 (char 20))",
        )
        code, text = error_of(lambda: c.load_model("spare", config="{}", files={"file:1/m": b"x"}))
        assert code == "StatusCode.INVALID_ARGUMENT"
        assert text.startswith("failed to load 'spare': load parameter 'file:1/m': model files")

    await off_loop(calls)
    ready = await off_loop(
        lambda: server.client().get_model_repository_index(as_json=True)["models"]
    )
    assert "double" not in {m["name"] for m in ready if m.get("state") == "READY"}


# --------------------------------------------------------------------------- error statuses


async def test_every_error_status_with_its_message(
    server: Running, caplog: pytest.LogCaptureFixture
) -> None:
    def calls() -> list[tuple[str, str]]:
        c = server.client()
        return [
            error_of(lambda: c.infer("double", [x_input(datatype="INT32")])),
            error_of(lambda: c.infer("double", [x_input(cols=15)])),
            error_of(
                lambda: c.infer("double", [x_input()], outputs=[tc.InferRequestedOutput("q")])
            ),
            error_of(lambda: c.infer("nope", [x_input()])),
            error_of(lambda: c.get_model_metadata("nope")),
            error_of(lambda: c.infer("cold", [x_input()])),
            error_of(lambda: c.infer("busy", [x_input()])),
            error_of(lambda: c.infer("broken", [x_input()])),
            error_of(lambda: c.register_cuda_shared_memory("g", b"aGFuZGxl", 0, 64)),
            error_of(lambda: c.get_cuda_shared_memory_status("g")),
            error_of(lambda: c.get_trace_settings()),
            error_of(lambda: c.get_log_settings()),
            error_of(
                lambda: c.register_system_shared_memory("r", "/reactantserver-missing_key_0", 64)
            ),
        ]

    with caplog.at_level(logging.ERROR, logger="reactantserver.status"):
        errors = await off_loop(calls)
    assert errors == [
        (
            "StatusCode.INVALID_ARGUMENT",
            "model 'double': input 'x': expected datatype FP32, got INT32",
        ),
        (
            "StatusCode.INVALID_ARGUMENT",
            "model 'double': input 'x': expected shape [-1, 16], got [2, 15]",
        ),
        (
            "StatusCode.INVALID_ARGUMENT",
            "model 'double': output 'q': unknown output; the model's outputs are y, z",
        ),
        ("StatusCode.NOT_FOUND", "model 'nope' is not loaded on this worker"),
        ("StatusCode.NOT_FOUND", "model 'nope' is not loaded on this worker"),
        ("StatusCode.UNAVAILABLE", "model 'cold' is not ready: still compiling"),
        (
            "StatusCode.RESOURCE_EXHAUSTED",
            "model 'busy': queue is full (16 requests waiting, scheduler.max_queue_depth=16); "
            "retry later",
        ),
        ("StatusCode.INTERNAL", "internal error"),
        (
            "StatusCode.INVALID_ARGUMENT",
            "failed to register CUDA shared memory region 'g', GPUs not supported: "
            "reactantserver does not serve CUDA shared memory; register system shared memory "
            "(SystemSharedMemoryRegister) or send tensors inline",
        ),
        (
            "StatusCode.NOT_FOUND",
            "CUDA shared memory region 'g' is not registered: this server registers no CUDA "
            "shared memory (SystemSharedMemoryStatus lists the system regions)",
        ),
        (
            "StatusCode.UNIMPLEMENTED",
            "TraceSetting is not supported; per-model timings are in ModelStatistics and on "
            "the admin port's /metrics",
        ),
        (
            "StatusCode.UNIMPLEMENTED",
            "LogSettings is not supported; set the log level in the server's configuration",
        ),
        (
            "StatusCode.INVALID_ARGUMENT",
            "shared memory region 'r': key '/reactantserver-missing_key_0' does not exist "
            "(create it with shm_open before registering)",
        ),
    ]
    # The bug's details stay in the log, with the traceback.
    (record,) = [r for r in caplog.records if r.exc_info]
    assert "ModelInfer" in record.getMessage()
    assert record.exc_info is not None and "secret internal detail" in str(record.exc_info[1])


async def test_message_size_limit_both_ways(server: Running) -> None:
    def calls() -> list[tuple[str, str]]:
        c = server.client()
        return [
            # 20000 x 16 FP32 = 1.28 MB in: refused before decoding.
            error_of(lambda: c.infer("double", [x_input(20000)])),
            # 10000 rows: 640 kB in, two outputs = 1.28 MB out.
            error_of(lambda: c.infer("double", [x_input(10000)])),
        ]

    (inbound, outbound) = await off_loop(calls)
    assert inbound[0] == outbound[0] == "StatusCode.RESOURCE_EXHAUSTED"
    assert re.fullmatch(
        r"request message of \d+ bytes exceeds the limit of 1048576 bytes "
        r"\(endpoints.max_message_bytes\); use shared memory for inputs this large",
        inbound[1],
    )
    assert re.fullmatch(
        r"response message of \d+ bytes exceeds the limit of 1048576 bytes "
        r"\(endpoints.max_message_bytes\); use shared memory for outputs this large",
        outbound[1],
    )


# ------------------------------------------------------------------ deadlines and the cap


async def test_timeout_parameter_becomes_the_deadline(server: Running) -> None:
    t0 = trio.current_time()
    status, message = await off_loop(
        lambda: error_of(lambda: server.client().infer("slow", [x_input()], timeout=150_000))
    )
    assert status == "StatusCode.DEADLINE_EXCEEDED"
    assert re.fullmatch(r"model 'slow': deadline passed after \d+\.\d{3} s", message)
    ((model, deadline),) = server.host.calls
    assert model == "slow"
    # The host (the scheduler's EDF) was given the deadline: arrival + 150 ms. (The exact
    # arithmetic is checked in virtual time below; a loaded machine only delays arrival.)
    assert t0 + 0.15 < deadline <= trio.current_time()
    assert deadline - t0 < 0.15 + 1.0
    assert server.host.cancelled == ["slow"]


async def test_grpc_deadline_becomes_the_deadline(server: Running) -> None:
    t0 = trio.current_time()
    status, _ = await off_loop(
        lambda: error_of(lambda: server.client().infer("slow", [x_input()], client_timeout=0.15))
    )
    assert status == "StatusCode.DEADLINE_EXCEEDED"
    await trio_wait_until(lambda: server.host.cancelled == ["slow"])
    ((_, deadline),) = server.host.calls
    assert t0 < deadline < t0 + 0.15 + 1.0


async def test_the_server_answers_a_deadline_itself_while_the_request_runs(
    server: Running,
) -> None:
    """grpc-timeout 150m on a request the host runs on past its deadline (as a batch
    already executing does), from a client that would wait 10 s: the server answers
    DEADLINE_EXCEEDED itself at the deadline (its one timer per call) and withdraws the
    request from the host; the client's stream is not reset."""
    import time

    server.host.honour_deadlines = False

    from h2_client import H2Client

    request = pb.ModelInferRequest(
        model_name="slow",
        inputs=[pb.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=[1, 16])],
        raw_input_contents=[bytes(64)],
    )

    def call() -> tuple[Any, float]:
        with H2Client(server.port) as h2:
            started = time.monotonic()
            result = h2.call(
                "/inference.GRPCInferenceService/ModelInfer",
                bytes(request),
                timeout="150m",
                wait=10.0,
            )
            return result, time.monotonic() - started

    result, took = await off_loop(call)
    assert result.grpc_status == 4, result.grpc_message  # DEADLINE_EXCEEDED
    assert result.reset is None
    assert took < 5.0  # at the deadline, not at the client's 10 s
    await trio_wait_until(lambda: server.host.cancelled == ["slow"])
    rpcs = server.service.statistics().rpcs
    assert rpcs[("ModelInfer", "DEADLINE_EXCEEDED")] == 1


async def test_in_flight_cap_sheds_with_resource_exhausted(server: Running) -> None:
    async def occupy() -> None:
        await off_loop(lambda: server.client().infer("slow", [x_input()]))

    async with trio.open_nursery() as nursery:
        for _ in range(CAP):
            nursery.start_soon(occupy)
        await trio_wait_until(lambda: server.service.statistics().in_flight == CAP)
        status = await off_loop(
            lambda: error_of(lambda: server.client().infer("double", [x_input()]))
        )
        assert status == (
            "StatusCode.RESOURCE_EXHAUSTED",
            "2 requests are in flight, the limit (endpoints.max_concurrent_requests) is 2; "
            "retry later",
        )
        # Cheap RPCs are not capped.
        assert await off_loop(lambda: server.client().is_server_live())
        server.host.release.set()
    stats = server.service.statistics()
    assert (stats.in_flight, stats.shed_total, stats.max_concurrent_requests) == (0, 1, 2)
    assert stats.rpcs[("ModelInfer", "OK")] == 2
    assert stats.rpcs[("ModelInfer", "RESOURCE_EXHAUSTED")] == 1


# ------------------------------------------------------------------------- grpc.aio client


def _run_aio(url: str) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        async with tca.InferenceServerClient(url) as c:
            out: dict[str, Any] = {"live": await c.is_server_live()}
            result = await c.infer("double", [x_input()])
            out["y"] = result.as_numpy("y")
            out["config"] = await c.get_model_config("double", as_json=True)
            try:
                await c.get_model_metadata("nope")
            except InferenceServerException as exc:
                out["error"] = (str(exc.status()), str(exc.message()))
            # A client that gives up cancels the call; the server cancels the request.
            try:
                await asyncio.wait_for(c.infer("slow", [x_input()]), 0.2)
            except TimeoutError:
                out["gave_up"] = True
            return out

    return asyncio.run(main())


async def test_aio_client(server: Running) -> None:
    out = await off_loop(partial(_run_aio, server.url))
    assert out["live"] is True
    np.testing.assert_array_equal(out["y"], np.arange(32, dtype=np.float32).reshape(2, 16) * 2)
    assert out["config"]["config"]["max_batch_size"] == 8
    assert out["error"] == ("StatusCode.NOT_FOUND", "model 'nope' is not loaded on this worker")
    assert out["gave_up"]
    await trio_wait_until(lambda: server.host.cancelled == ["slow"])
    await trio_wait_until(lambda: server.service.statistics().in_flight == 0)


# --------------------------------------------------------------------------- control service


def _control(url: str, method: str, request: Any, reply: type[Any]) -> tuple[Any, Any]:
    """(reply, None) or (None, (code name, details)) of one ControlService call."""
    return _control_like(url, f"/reactant_control.ControlService/{method}", request, reply)


def _control_like(url: str, path: str, request: Any, reply: type[Any]) -> tuple[Any, Any]:
    """(reply, None) or (None, (code name, details)) of one unary call by path."""
    with grpc.insecure_channel(url) as channel:
        call = channel.unary_unary(
            path,
            request_serializer=bytes,
            response_deserializer=lambda data: reply().parse(data),
        )
        try:
            return call(request, timeout=5), None
        except grpc.RpcError as exc:
            return None, (exc.code().name, exc.details())


async def test_control_service(server: Running) -> None:
    ask = partial(_control, server.url)
    status, _ = await off_loop(
        lambda: ask(
            "ModelControlStatus", cpb.ModelControlStatusRequest(), cpb.ModelControlStatusResponse
        )
    )
    assert status.residency_mode == "self_managed"
    assert status.discipline == "fair"
    assert [m.name for m in status.models] == sorted(server.host.models)
    double = next(m for m in status.models if m.name == "double")
    assert double.residency == cpb.Residency.PINNED_SYSTEM
    assert (double.max_batch_size, double.batch_input_name, double.batch_axis) == (8, "x", 1)
    assert status.weight_cache_max_bytes == 1 << 20

    def residency(target: cpb.Residency) -> tuple[Any, Any]:
        request = cpb.SetModelResidencyRequest(name="double", target=target)
        return ask("SetModelResidency", request, cpb.SetModelResidencyResponse)

    assert (await off_loop(lambda: residency(cpb.Residency.PINNED_DEVICE)))[1] == (
        "FAILED_PRECONDITION",
        "residency is self-managed (model_control_mode is dynamic); "
        "SetModelResidency needs model_control_mode: explicit",
    )
    server.host.externally_managed = True
    reply, _ = await off_loop(lambda: residency(cpb.Residency.PINNED_DEVICE))
    assert reply.residency == cpb.Residency.PINNED_DEVICE
    assert (await off_loop(lambda: residency(cpb.Residency.UNSPECIFIED)))[1] == (
        "INVALID_ARGUMENT",
        "model 'double': target must be UNPINNED, PINNED_SYSTEM or PINNED_DEVICE, got UNSPECIFIED",
    )

    def policy(name: str, weight: float) -> tuple[Any, Any]:
        request = cpb.SetModelPolicyRequest(name=name, has_weight=True, weight=weight)
        return ask("SetModelPolicy", request, cpb.SetModelPolicyResponse)

    assert (await off_loop(lambda: policy("double", 3.0)))[1] is None
    assert server.host.weights == {"double": 3.0}
    assert (await off_loop(lambda: policy("double", -1.0)))[1] == (
        "INVALID_ARGUMENT",
        "model 'double': weight must be finite and > 0, got -1.0",
    )
    assert (await off_loop(lambda: policy("ghost", 1.0)))[1] == (
        "NOT_FOUND",
        "model 'ghost' is not loaded on this worker",
    )
    compact, _ = await off_loop(
        lambda: ask(
            "CompactMemory",
            cpb.CompactMemoryRequest(reload_models=["double", "echo"]),
            cpb.CompactMemoryResponse,
        )
    )
    assert (compact.reloaded_models, compact.resident_bytes_after) == (2, 2048)


# --------------------------------------------------------- reflection, IPC namespace probe


def test_listener_is_tcp_so_accepted_connections_get_nodelay() -> None:
    """grpclib sets TCP_NODELAY only on sockets whose proto is TCP, and accepted sockets
    inherit the listener's: with proto 0 every small call would wait for a delayed ACK."""
    listener = listen_tcp("127.0.0.1", 0)
    with listener, socket.create_connection(listener.getsockname()[:2]):
        accepted, _ = listener.accept()
        with accepted:
            assert listener.proto == accepted.proto == socket.IPPROTO_TCP


def _reflect(url: str, package: str, questions: list[bytes]) -> list[bytes]:
    with grpc.insecure_channel(url) as channel:
        call = channel.stream_stream(
            f"/grpc.reflection.{package}.ServerReflection/ServerReflectionInfo",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        return list(call(iter(questions), timeout=5))


@pytest.mark.parametrize("package", ["v1", "v1alpha"])
async def test_reflection_both_versions(server: Running, package: str) -> None:
    rpb = v1 if package == "v1" else v1alpha
    questions = [
        bytes(rpb.ServerReflectionRequest(list_services="")),
        bytes(rpb.ServerReflectionRequest(file_containing_symbol="inference.ModelInferRequest")),
        bytes(rpb.ServerReflectionRequest(file_containing_symbol="inference.NoSuchThing")),
    ]
    raw = await off_loop(lambda: _reflect(server.url, package, questions))
    listed, found, missing = (rpb.ServerReflectionResponse().parse(r) for r in raw)
    assert [s.name for s in listed.list_services_response.service] == [
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
        "inference.GRPCInferenceService",
        "reactant_control.ControlService",
    ]
    # The defining file first, then its imports.
    assert len(found.file_descriptor_response.file_descriptor_proto) == 2
    assert b"inference.proto" in found.file_descriptor_response.file_descriptor_proto[0]
    assert missing.error_response.error_code == 5  # NOT_FOUND, in the stream


async def test_is_same_ipc_namespace(server: Running) -> None:
    key = f"/reactantserver-probe_{uuid.uuid4().hex[:8]}"
    segment = tshm.create_shared_memory_region("probe", key, 8)

    def ask(name: str) -> tuple[Any, Any]:
        return _control_like(
            server.url,
            "/inference.GRPCInferenceService/IsSameIPCNamespace",
            pb.IsSameIpcNamespaceRequest(name=name),
            pb.IsSameIpcNamespaceResponse,
        )

    try:
        assert (await off_loop(lambda: ask(key)))[0].same is True
        assert (await off_loop(lambda: ask("/reactantserver-probe_does_not_exist")))[
            0
        ].same is False
        assert (await off_loop(lambda: ask("/a/b")))[1] == (
            "INVALID_ARGUMENT",
            "shared memory key '/a/b' is not a POSIX shared memory name (expected '/name' "
            "with letters, digits, '.', '_' or '-')",
        )
    finally:
        tshm.destroy_shared_memory_region(segment)


# ------------------------------------------------------------------------ graceful shutdown


async def test_stop_drains_in_flight_calls_and_refuses_new_ones() -> None:
    host = FakeHost()
    service = Service(host)
    stop = trio.Event()
    served = trio.Event()
    results: list[Any] = []

    async def run_server(task_status: trio.TaskStatus[int]) -> None:
        await serve_grpc(service, EndpointsConfig(port=0), stop=stop, task_status=task_status)
        served.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(host.run)
        port = await nursery.start(run_server)
        client = tc.InferenceServerClient(f"127.0.0.1:{port}")

        async def slow_call() -> None:
            result = await off_loop(lambda: client.infer("slow", [x_input()]))
            results.append(result.as_numpy("y"))

        nursery.start_soon(slow_call)
        await trio_wait_until(lambda: service.statistics().in_flight == 1)
        stop.set()
        # Every task has done what it can: the listener is draining, and still waits.
        await trio.testing.wait_all_tasks_blocked()
        assert not served.is_set()
        assert await off_loop(lambda: error_of(lambda: client.is_server_live())) == (
            "StatusCode.UNAVAILABLE",
            "server is shutting down",
        )
        host.release.set()
        with trio.fail_after(5):
            await served.wait()
        nursery.cancel_scope.cancel()
    np.testing.assert_array_equal(results[0], np.arange(32, dtype=np.float32).reshape(2, 16))
    client.close()


# -------------------------------------------------------------- the service alone, virtual time


def _slow_request(**params: int) -> pb.ModelInferRequest:
    x = np.zeros((1, 16), np.float32)
    return pb.ModelInferRequest(
        model_name="slow",
        inputs=[pb.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=[1, 16])],
        raw_input_contents=[x.tobytes()],
        parameters={k: pb.InferParameter(int64_param=v) for k, v in params.items()},
    )


async def test_service_deadline_is_exact_in_virtual_time(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    host = FakeHost()
    await nursery.start(host.run)
    service = Service(host)
    t0 = trio.current_time()
    with pytest.raises(DeadlineExceeded) as info:
        await service.model_infer(_slow_request(timeout=250_000), CallContext(deadline=t0 + 9))
    assert str(info.value) == "model 'slow': deadline passed after 0.250 s"
    assert host.calls == [("slow", t0 + 0.25)]
    assert host.cancelled == ["slow"]
    # A gRPC deadline earlier than the parameter wins.
    with pytest.raises(DeadlineExceeded):
        await service.model_infer(
            _slow_request(timeout=250_000), CallContext(deadline=trio.current_time() + 0.1)
        )
    assert host.calls[1][1] == pytest.approx(t0 + 0.25 + 0.1)
    failures = service.request_statistics("slow").fail
    assert (failures.count, failures.ns) == (2, 350_000_000)
    assert service.statistics().in_flight == 0
