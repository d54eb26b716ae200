"""End to end: the real worker (JAX compile, scheduler, gRPC on loopback) and real clients.

One worker serving the zoo runs for the whole module (``served``); tests that change
the model set start their own. Every answer is compared with what the runtime itself
computes for the same input: the same compiled program at the same padded batch size,
with the bundle's hooks applied, so the comparison is exact.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.utils.shared_memory as shm
from conftest import ZOO_NAMES
from tritonclient.utils import InferenceServerException
from worker_harness import running_worker, worker_config

from reactantserver import hooks as hooks_mod
from reactantserver.bundle import load_bundle
from reactantserver.config import SchedulerConfig
from reactantserver.worker import WorkerAddress
from reactantserver.worker.core import gpu_label

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One persistent compilation cache for the module: later workers start from hits."""
    return tmp_path_factory.mktemp("jaxcache")


@pytest.fixture(scope="module")
def served(zoo_repo: Path, compile_cache: Path) -> Iterator[WorkerAddress]:
    config = worker_config(zoo_repo, include=ZOO_NAMES, cache_dir=compile_cache)
    with running_worker(config) as address:
        yield address


@pytest.fixture
def client(served: WorkerAddress) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
    yield c
    c.close()


def _client_input(spec: Any, rows: int, rng: np.random.Generator) -> np.ndarray:
    shape = [rows if d == -1 else d for d in spec.shape]
    if spec.datatype == "UINT8":
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    return rng.standard_normal(shape).astype(spec.numpy_dtype)


def _expected(
    zoo_repo: Path, zoo_models: dict[str, Any], name: str, inputs: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """What the runtime computes for ``inputs``: hooks, padding to the compiled size, execute."""
    bundle = load_bundle(zoo_repo / name)
    model, weights = zoo_models[name]
    rows = next(iter(inputs.values())).shape[0]
    exe = hooks_mod.run_preprocess(name, bundle.hooks, inputs, bundle.inputs, rows)
    size = min(s for s in bundle.compiled_batch_sizes if s >= rows)
    padded = []
    for spec in bundle.inputs:
        arr = exe[spec.name]
        pad = np.zeros((size - rows, *arr.shape[1:]), dtype=arr.dtype)
        padded.append(np.concatenate([arr, pad]))
    outs = model.execute(padded, weights)
    named = {spec.name: out[:rows] for spec, out in zip(bundle.outputs, outs, strict=True)}
    return hooks_mod.run_postprocess(name, bundle.hooks, named, bundle.client_outputs, rows)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_every_zoo_model_answers_what_the_runtime_computes(
    name: str,
    client: grpcclient.InferenceServerClient,
    zoo_repo: Path,
    zoo_models: dict[str, Any],
) -> None:
    meta = client.get_model_metadata(name)
    rng = np.random.default_rng(7)
    inputs = {}
    infer_inputs = []
    for spec in load_bundle(zoo_repo / name).client_inputs:
        arr = _client_input(spec, 3, rng)
        inputs[spec.name] = arr
        ii = grpcclient.InferInput(spec.name, list(arr.shape), spec.datatype)
        ii.set_data_from_numpy(arr)
        infer_inputs.append(ii)
    result = client.infer(name, infer_inputs)
    want = _expected(zoo_repo, zoo_models, name, inputs)
    assert [o.name for o in meta.outputs] == list(want)
    for out_name, expected in want.items():
        got = result.as_numpy(out_name)
        assert got.shape == expected.shape
        # Same program, same padded size, same device: bit-identical.
        np.testing.assert_array_equal(got, expected)


def test_health_metadata_config_statistics(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp")
    meta = client.get_server_metadata()
    assert meta.name == "reactantserver"
    assert "system_shared_memory" in meta.extensions
    config = client.get_model_config("mlp").config
    assert config.max_batch_size == 32
    assert [i.name for i in config.input] == ["features"]
    assert list(config.dynamic_batching.preferred_batch_size) == [1, 8, 32]

    x = np.ones((2, 16), dtype=np.float32)
    ii = grpcclient.InferInput("x", [2, 16], "FP32")
    ii.set_data_from_numpy(x)
    before = client.get_inference_statistics("double").model_stats[0]
    for _ in range(3):
        client.infer("double", [ii])
    after = client.get_inference_statistics("double").model_stats[0]
    assert after.inference_stats.success.count - before.inference_stats.success.count == 3
    assert after.inference_count - before.inference_count == 6  # rows
    assert after.execution_count - before.execution_count == 3
    assert after.inference_stats.compute_infer.ns > before.inference_stats.compute_infer.ns
    sizes = {b.batch_size for b in after.batch_stats}
    assert 4 in sizes  # 2 rows padded to the compiled size 4

    index = {m.name: m.state for m in client.get_model_repository_index().models}
    assert index == {n: "READY" for n in ZOO_NAMES}


def test_aio_client(served: WorkerAddress, zoo_repo: Path, zoo_models: dict[str, Any]) -> None:
    x = np.random.default_rng(1).standard_normal((5, 32)).astype(np.float32)

    async def main() -> list[np.ndarray]:
        c = aioclient.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
        try:
            assert await c.is_server_ready()
            ii = aioclient.InferInput("features", [5, 32], "FP32")
            ii.set_data_from_numpy(x)
            results = await asyncio.gather(*(c.infer("mlp", [ii]) for _ in range(8)))
            return [r.as_numpy("probabilities") for r in results]
        finally:
            await c.close()

    answers = asyncio.run(main())
    want = _expected(zoo_repo, zoo_models, "mlp", {"features": x})["probabilities"]
    for got in answers:
        # Concurrent requests may be coalesced into a larger compiled size: tolerance.
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_shared_memory_inputs_and_outputs(
    client: grpcclient.InferenceServerClient, zoo_repo: Path, zoo_models: dict[str, Any]
) -> None:
    x = np.random.default_rng(2).standard_normal((4, 32)).astype(np.float32)
    key_in, key_out = (
        f"/reactantserver-in_{uuid.uuid4().hex[:8]}",
        f"/reactantserver-out_{uuid.uuid4().hex[:8]}",
    )
    h_in = shm.create_shared_memory_region("in", key_in, x.nbytes)
    h_out = shm.create_shared_memory_region("out", key_out, 4 * 10 * 4)
    try:
        shm.set_shared_memory_region(h_in, [x])
        client.register_system_shared_memory("in", key_in, x.nbytes)
        client.register_system_shared_memory("out", key_out, 4 * 10 * 4)
        status = client.get_system_shared_memory_status()
        assert {r.name for r in status.regions.values()} == {"in", "out"}
        ii = grpcclient.InferInput("features", [4, 32], "FP32")
        ii.set_shared_memory("in", x.nbytes)
        out = grpcclient.InferRequestedOutput("logits")
        out.set_shared_memory("out", 4 * 10 * 4)
        result = client.infer("mlp", [ii], outputs=[out])
        meta = result.get_output("logits")
        got = shm.get_contents_as_numpy(h_out, np.float32, list(meta.shape))
        want = _expected(zoo_repo, zoo_models, "mlp", {"features": x})["logits"]
        np.testing.assert_array_equal(got, want)
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)
    assert client.get_system_shared_memory_status().regions == {}


def _status(exc: InferenceServerException) -> str:
    return str(exc.status())


def test_error_statuses(client: grpcclient.InferenceServerClient) -> None:
    x = np.ones((2, 32), dtype=np.float32)
    ii = grpcclient.InferInput("features", [2, 32], "FP32")
    ii.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as info:
        client.infer("nope", [ii])
    assert _status(info.value) == "StatusCode.NOT_FOUND"
    assert "model 'nope' is not loaded" in info.value.message()

    bad = grpcclient.InferInput("features", [2, 32], "INT32")
    bad.set_data_from_numpy(x.astype(np.int32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [bad])
    assert _status(info.value) == "StatusCode.INVALID_ARGUMENT"
    assert "expected datatype FP32, got INT32" in info.value.message()

    big = np.ones((40, 32), dtype=np.float32)
    too_many = grpcclient.InferInput("features", [40, 32], "FP32")
    too_many.set_data_from_numpy(big)
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [too_many])
    assert _status(info.value) == "StatusCode.INVALID_ARGUMENT"
    assert "compiled sizes: 1, 8, 32" in info.value.message()

    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [ii], timeout=1)  # 1 microsecond: expired before it can run
    assert _status(info.value) == "StatusCode.DEADLINE_EXCEEDED"

    ii.set_shared_memory("unregistered", 256)
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [ii])
    assert _status(info.value) == "StatusCode.FAILED_PRECONDITION"


def test_admin_http(served: WorkerAddress, client: grpcclient.InferenceServerClient) -> None:
    wrong = grpcclient.InferInput("features", [1, 32], "INT32")
    wrong.set_data_from_numpy(np.zeros((1, 32), dtype=np.int32))
    with pytest.raises(InferenceServerException):
        client.infer("mlp", [wrong])
    good = grpcclient.InferInput("x", [1, 16], "FP32")
    good.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    client.infer("double", [good])
    base = f"http://127.0.0.1:{served.metrics_port}"
    assert urllib.request.urlopen(base + "/healthz").read() == b"ok\n"
    assert urllib.request.urlopen(base + "/readyz").read() == b"ready\n"
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    for series in (
        'worker_info{backend="cpu"',
        "worker_inflight_requests{",
        'worker_queue_depth{gpu="0",model="mlp",worker="worker0"}',
        'worker_model_weight_bytes{gpu="0",model="resnet",worker="worker0"}',
        "worker_request_latency_seconds_bucket{",
        "worker_batch_rows_bucket{",
        'worker_requests_total{gpu="0",model="double",status="OK",worker="worker0"}',
        'worker_meta_running{gpu="0",worker="worker0"} 0.0',
        'worker_requests_total{gpu="0",model="mlp",status="INVALID_ARGUMENT",worker="worker0"}',
        'worker_grpc_calls_total{gpu="0",rpc="ModelInfer",status="OK",worker="worker0"}',
    ):
        assert series in text, series
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(base + "/nope")
    assert info.value.code == 404


def test_repository_load_and_unload(zoo_repo: Path, compile_cache: Path) -> None:
    config = worker_config(
        zoo_repo,
        include=("double", "mlp"),
        cache_dir=compile_cache,
        metrics=False,
        mode="explicit",  # RepositoryModelLoad/Unload are refused in the other modes
    )
    with running_worker(config) as address:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{address.grpc_port}")
        x = np.ones((1, 16), dtype=np.float32)
        ii = grpcclient.InferInput("x", [1, 16], "FP32")
        ii.set_data_from_numpy(x)
        c.unload_model("double")
        assert not c.is_model_ready("double")
        with pytest.raises(InferenceServerException) as info:
            c.infer("double", [ii])
        assert _status(info.value) == "StatusCode.NOT_FOUND"
        c.load_model("double")
        np.testing.assert_array_equal(c.infer("double", [ii]).as_numpy("y"), 2 * x)
        with pytest.raises(InferenceServerException) as info:
            c.load_model("no_such_model")
        assert _status(info.value) == "StatusCode.NOT_FOUND"
        c.close()


def test_queue_full_is_resource_exhausted(zoo_repo: Path, compile_cache: Path) -> None:
    config = worker_config(
        zoo_repo,
        include=("resnet",),
        cache_dir=compile_cache,
        metrics=False,
        scheduler=SchedulerConfig(max_queue_depth=1),
    )
    with running_worker(config) as address:
        x = np.zeros((8, 32, 32, 3), dtype=np.float32)

        async def main() -> list[BaseException | Any]:
            c = aioclient.InferenceServerClient(f"127.0.0.1:{address.grpc_port}")
            ii = aioclient.InferInput("images", list(x.shape), "FP32")
            ii.set_data_from_numpy(x)
            try:
                return await asyncio.gather(
                    *(c.infer("resnet", [ii]) for _ in range(24)), return_exceptions=True
                )
            finally:
                await c.close()

        results = asyncio.run(main())
        refused = [r for r in results if isinstance(r, InferenceServerException)]
        assert refused, "a queue of depth 1 under 24 concurrent requests must refuse some"
        for r in refused:
            assert _status(r) == "StatusCode.RESOURCE_EXHAUSTED"
            assert "queue is full" in r.message()
        assert any(not isinstance(r, BaseException) for r in results)


def test_gpu_label_names_the_device_the_process_was_given() -> None:
    """REFERENCE §10: the ``gpu`` label comes from ``CUDA_VISIBLE_DEVICES`` when it names one
    device (the node supervisor gives each worker exactly one, by index or UUID)."""
    uuid = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
    assert gpu_label(None, {"CUDA_VISIBLE_DEVICES": uuid}) == uuid
    assert gpu_label(0, {"CUDA_VISIBLE_DEVICES": "3"}) == "3"
    assert gpu_label(1, {"CUDA_VISIBLE_DEVICES": "2,3"}) == "1"  # several: the ordinal
    assert gpu_label(None, {"CUDA_VISIBLE_DEVICES": ""}) == "0"  # a CPU worker
    assert gpu_label(2, {}) == "2"


def test_metrics_carry_the_visible_device_as_gpu_label(
    served: WorkerAddress, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    text = urllib.request.urlopen(f"http://127.0.0.1:{served.metrics_port}/metrics").read()
    assert b'worker_model_weight_bytes{gpu="5",model="resnet",worker="worker0"}' in text
