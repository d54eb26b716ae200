"""The gRPC surface's own cost: round trips through grpclib, the Trio bridge and inferio.

A real server (``serve_grpc`` over ``Service``) runs in this process on 127.0.0.1, over a
host whose model returns its input unchanged, so what is measured is the transport:
HTTP/2 framing, protobuf, the asyncio -> Trio hop, validation, encoding. The client is
``tritonclient.grpc`` (blocking) in a separate process, as a real client would be (in a
thread of the server's own process it would fight the server for the GIL and add
milliseconds to every call). Each call's latency includes the client's own work. The
``Service.model_infer`` row calls the service directly, without any transport; the
``baseline`` rows are grpclib alone on plain asyncio (no Trio hop, no validation, the
raw input echoed), i.e. what the pure-Python HTTP/2 stack costs by itself.

    python benchmarks/bench_grpc.py
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import grpclib.server
import numpy as np
import trio
import tritonclient.grpc as tc
import tritonclient.utils.shared_memory as tshm

from reactantserver.bundle.manifest import TensorSpec
from reactantserver.config.schema import EndpointsConfig
from reactantserver.errors import NotFound
from reactantserver.protocol import inference as pb
from reactantserver.records import Answer, CallContext, ExecutionStatistics, IndexEntry
from reactantserver.service import Service
from reactantserver.transport import guest
from reactantserver.worker.grpc import listen_tcp, serve_grpc

COLS = 16


@attrs.define
class _Identity:
    name: str = "identity"
    version: str = ""
    platform: str = "bench"
    inputs: tuple[TensorSpec, ...] = (TensorSpec("x", "FP32", (-1, COLS)),)
    outputs: tuple[TensorSpec, ...] = (TensorSpec("y", "FP32", (-1, COLS)),)
    max_batch_size: int = 0
    compiled_batch_sizes: tuple[int, ...] = ()
    max_queue_depth: int = 0
    parameters: Mapping[str, str] = attrs.field(factory=dict)

    def ready(self) -> tuple[bool, str]:
        return True, ""

    def statistics(self) -> ExecutionStatistics:
        return ExecutionStatistics()


class _Host:
    backend = "cpu"
    device_ordinal = 0
    model = _Identity()

    def readiness(self) -> tuple[bool, str]:
        return True, ""

    def get(self, name: str) -> _Identity:
        if name != self.model.name:
            raise NotFound(name)
        return self.model

    def index(self) -> Sequence[IndexEntry]:
        return [IndexEntry(self.model.name)]

    def begin(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        deadline: float,
        answer: Answer,
    ) -> None:
        answer.resolve({"y": inputs["x"]})  # answered at once: the transport's cost alone

    def withdraw(self, handle: object) -> None:
        pass


class _BareServicer(pb.GrpcInferenceServiceBase):
    """The baseline: grpclib on plain asyncio, no Trio, no validation (echoes raw input)."""

    async def server_live(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def model_infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        tensor = request.inputs[0]
        return pb.ModelInferResponse(
            model_name=request.model_name,
            outputs=[
                pb.ModelInferResponseInferOutputTensor(
                    name="y", datatype=tensor.datatype, shape=tensor.shape
                )
            ],
            raw_output_contents=list(request.raw_input_contents),
        )


def _bare_server(ready: queue.Queue[int], stop: threading.Event) -> None:
    """Run the baseline server in this thread's own asyncio loop until ``stop``."""

    async def serve() -> None:
        server = grpclib.server.Server([_BareServicer()])
        sock = listen_tcp("127.0.0.1", 0)
        await server.start(sock=sock)
        ready.put(sock.getsockname()[1])
        while not stop.is_set():
            await asyncio.sleep(0.05)
        server.close()
        await server.wait_closed()

    asyncio.run(serve())


def _time(fn: Callable[[], Any], budget: float = 1.5, max_n: int = 2000) -> list[float]:
    fn()  # warm up: channel, code paths
    samples: list[float] = []
    end = time.perf_counter() + budget
    while time.perf_counter() < end and len(samples) < max_n:
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return samples


def _row(name: str, nbytes: int, samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=100) if len(samples) >= 2 else samples * 99
    p50, p99 = statistics.median(samples), q[98]
    rate = nbytes / p50 / 1e6 if nbytes else 0.0
    mbps = f"{rate:9.0f}" if nbytes else f"{'-':>9}"
    return f"{name:<34} {nbytes:>10} {p50 * 1e3:9.3f} {p99 * 1e3:9.3f} {1 / p50:9.0f} {mbps}"


def _bare_rows(url: str) -> list[str]:
    client = tc.InferenceServerClient(url)
    rows = [_row("baseline: ServerLive", 0, _time(client.is_server_live))]
    for label, n_rows in (("small", 1), ("1 MiB", 16384)):
        x = np.ones((n_rows, COLS), np.float32)
        inp = tc.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        samples = _time(lambda inp=inp: client.infer("identity", [inp]))
        rows.append(_row(f"baseline: ModelInfer, {label}", x.nbytes, samples))
    client.close()
    return rows


def _shm_row(client: tc.InferenceServerClient, label: str, x: np.ndarray) -> str:
    key_in, key_out = (f"/reactantserver-bench_{k}_{uuid.uuid4().hex[:6]}" for k in ("in", "out"))
    h_in = tshm.create_shared_memory_region("in", key_in, x.nbytes)
    h_out = tshm.create_shared_memory_region("out", key_out, x.nbytes)
    try:
        tshm.set_shared_memory_region(h_in, [x])
        client.register_system_shared_memory("in", key_in, x.nbytes)
        client.register_system_shared_memory("out", key_out, x.nbytes)
        inp = tc.InferInput("x", list(x.shape), "FP32")
        inp.set_shared_memory("in", x.nbytes)
        out = tc.InferRequestedOutput("y")
        out.set_shared_memory("out", x.nbytes)
        samples = _time(lambda: client.infer("identity", [inp], outputs=[out]))
        client.unregister_system_shared_memory()
    finally:
        tshm.destroy_shared_memory_region(h_in)
        tshm.destroy_shared_memory_region(h_out)
    return _row(f"ModelInfer shm in+out, {label}", x.nbytes, samples)


def _client_rows(url: str) -> list[str]:
    client = tc.InferenceServerClient(url)
    rows = [_row("ServerLive", 0, _time(client.is_server_live))]
    for label, n_rows in (("small", 1), ("1 MiB", 16384), ("16 MiB", 262144)):
        x = np.ones((n_rows, COLS), np.float32)
        inp = tc.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        budget = 3.0 if n_rows > 100000 else 1.5
        samples = _time(lambda inp=inp: client.infer("identity", [inp]), budget=budget)
        rows.append(_row(f"ModelInfer inline, {label}", x.nbytes, samples))

    for label, n_rows in (("1 MiB", 16384), ("16 MiB", 262144)):
        rows.append(_shm_row(client, label, np.ones((n_rows, COLS), np.float32)))
    client.close()
    return rows


async def _direct_row(service: Service) -> str:
    x = np.ones((1, COLS), np.float32)
    request = pb.ModelInferRequest(
        model_name="identity",
        inputs=[pb.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=[1, COLS])],
        raw_input_contents=[x.tobytes()],
    )
    ctx = CallContext()
    await service.model_infer(request, ctx)
    samples = []
    end = time.perf_counter() + 1.0
    while time.perf_counter() < end and len(samples) < 20000:
        t = time.perf_counter()
        await service.model_infer(request, ctx)
        samples.append(time.perf_counter() - t)
    return _row("Service.model_infer, small (no I/O)", x.nbytes, samples)


async def _main() -> list[str]:
    service = Service(_Host(), max_concurrent_requests=0)
    endpoints = EndpointsConfig(port=0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_grpc, service, endpoints)
        url = f"127.0.0.1:{port}"
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            rows = await trio.to_thread.run_sync(pool.apply, _client_rows, (url,))
        rows.append(await _direct_row(service))
        nursery.cancel_scope.cancel()
    return rows


def _baseline() -> list[str]:
    ready: queue.Queue[int] = queue.Queue()
    stop = threading.Event()
    thread = threading.Thread(target=_bare_server, args=(ready, stop))
    thread.start()
    try:
        port = ready.get(timeout=10)
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            return pool.apply(_bare_rows, (f"127.0.0.1:{port}",))
    finally:
        stop.set()
        thread.join()


def main() -> None:
    rows = guest.run(_main) + _baseline()  # Trio as asyncio's guest, as the worker runs
    print(f"{'call':<34} {'bytes':>10} {'p50 ms':>9} {'p99 ms':>9} {'calls/s':>9} {'MB/s':>9}")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
