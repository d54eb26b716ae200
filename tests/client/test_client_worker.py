"""reactantserver.client against a real worker: the zoo compiled by JAX on the CPU.

* The client and ``tritonclient`` get identical answers -- outputs bit for bit, metadata,
  error statuses and messages -- for every zoo model.
* A 38 MB tensor goes to the worker and back through shared memory, not the socket, and
  nothing is left in ``/dev/shm`` afterwards.
* Against a worker whose queue holds one request, concurrent calls are refused with
  RESOURCE_EXHAUSTED and succeed on retry; a non-retryable status fails at once.
* Trio and asyncio callers.

One worker serves the zoo plus ``big_double`` (``y = 2x`` on a [2, 4750, 1000] FP32
tensor, exported here) for the module; the queue test starts a second one from the same
persistent compilation cache.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
from conftest import ZOO_NAMES
from tritonclient.utils import InferenceServerException, np_to_triton_dtype
from worker_harness import running_worker, worker_config

from reactantserver.client import AsyncClient, Client, RetryPolicy
from reactantserver.client.shm import NAME_PREFIX
from reactantserver.config import SchedulerConfig
from reactantserver.errors import DeadlineExceeded, NotFound, RequestError, ResourceExhausted
from reactantserver.shm import SHM_ROOT
from reactantserver.status import code_of
from reactantserver.worker import WorkerAddress

pytestmark = pytest.mark.slow

#: big_double's input: 2 x 4750 x 1000 float32 = 38,000,000 bytes.
BIG_SHAPE = (2, 4750, 1000)


def _scale(params: dict[str, Any], x: Any) -> Any:
    return params["scale"] * x


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("client_jaxcache")


@pytest.fixture(scope="module")
def big_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import jax.numpy as jnp

    from reactantserver.export import export_bundle

    repo = tmp_path_factory.mktemp("client_big")
    export_bundle(
        _scale,
        {"scale": jnp.float32(2.0)},
        inputs=[("x", "FP32", [-1, *BIG_SHAPE[1:]])],
        outputs=["y"],
        batch_sizes=(BIG_SHAPE[0],),
        out_dir=repo / "big_double",
        platforms=("cpu",),
        rtol=0.0,
        atol=0.0,
    )
    return repo


@pytest.fixture(scope="module")
def served(zoo_repo: Path, big_repo: Path, compile_cache: Path) -> Iterator[WorkerAddress]:
    config = worker_config(
        zoo_repo, include=(*ZOO_NAMES, "big_double"), cache_dir=compile_cache, metrics=False
    )
    config = attrs.evolve(config, model_dirs=(str(zoo_repo), str(big_repo)))
    with running_worker(config) as address:
        yield address


@pytest.fixture
def url(served: WorkerAddress) -> str:
    return f"127.0.0.1:{served.grpc_port}"


@pytest.fixture
def client(url: str) -> Iterator[Client]:
    with Client(url, timeout=60) as c:
        yield c


@pytest.fixture
def triton(url: str) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(url)
    yield c
    c.close()


def _inputs(client: Client, model: str, rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for spec in client.model_metadata(model).inputs:
        shape = [rows if d == -1 else d for d in spec.shape]
        if spec.datatype == "UINT8":
            out[spec.name] = rng.integers(0, 256, size=shape, dtype=np.uint8)
        else:
            out[spec.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def _triton_infer(
    triton: grpcclient.InferenceServerClient, model: str, inputs: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    wire = []
    for name, arr in inputs.items():
        tensor = grpcclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        tensor.set_data_from_numpy(arr)
        wire.append(tensor)
    result = triton.infer(model, wire)
    return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}


# --------------------------------------------------------------------- parity with Triton


@pytest.mark.parametrize("model", ZOO_NAMES)
def test_identical_answers_to_tritonclient(
    model: str, client: Client, triton: grpcclient.InferenceServerClient
) -> None:
    theirs_meta = triton.get_model_metadata(model)
    ours_meta = client.model_metadata(model)
    assert ours_meta.name == theirs_meta.name and ours_meta.platform == theirs_meta.platform
    for ours, theirs in (
        (ours_meta.inputs, theirs_meta.inputs),
        (ours_meta.outputs, theirs_meta.outputs),
    ):
        assert [(t.name, t.datatype, list(t.shape)) for t in ours] == [
            (t.name, t.datatype, list(t.shape)) for t in theirs
        ]
    assert (
        client.model_config(model).max_batch_size
        == triton.get_model_config(model).config.max_batch_size
    )

    for rows, seed in ((1, 0), (3, 1)):
        inputs = _inputs(client, model, rows, seed)
        ours = client.infer(model, inputs)
        theirs = _triton_infer(triton, model, inputs)
        assert list(ours) == list(theirs) == [o.name for o in ours_meta.outputs]
        for name, want in theirs.items():
            assert ours[name].dtype == want.dtype and ours[name].shape == want.shape
            # Same program, same padded batch size, one request at a time: bit-identical.
            np.testing.assert_array_equal(ours[name], want)


def test_errors_are_the_statuses_and_messages_tritonclient_sees(
    client: Client, triton: grpcclient.InferenceServerClient
) -> None:
    x = np.ones((2, 32), np.float32)
    cases = [
        ("nope", {"features": x}),  # unknown model
        ("mlp", {"features": x.astype(np.int32)}),  # wrong datatype
        ("mlp", {"features": np.ones((40, 32), np.float32)}),  # more rows than compiled
        ("mlp", {"wrong": x}),  # unknown input
    ]
    for model, inputs in cases:
        before = client.statistics()
        with pytest.raises(RequestError) as ours:
            client.infer(model, inputs)
        with pytest.raises(InferenceServerException) as theirs:
            _triton_infer(triton, model, inputs)
        assert f"StatusCode.{code_of(ours.value).name}" == str(theirs.value.status())
        assert str(ours.value) == theirs.value.message()
        # None of these is retried.
        assert client.statistics().attempts - before.attempts == 1
    with pytest.raises(NotFound, match=r"^model 'nope' is not loaded"):
        client.model_metadata("nope")


def test_statistics_repository_and_control_rpcs(
    client: Client, triton: grpcclient.InferenceServerClient
) -> None:
    (ours,) = client.model_statistics("double")
    theirs = triton.get_inference_statistics("double").model_stats[0]
    assert ours.inference_count == theirs.inference_count
    assert ours.inference_stats.success.count == theirs.inference_stats.success.count
    assert {m.name: m.state for m in client.repository_index()} == {
        m.name: m.state for m in triton.get_model_repository_index().models
    }
    status = client.control_status()
    assert {m.name for m in status.models} == {*ZOO_NAMES, "big_double"}
    mlp = next(m for m in status.models if m.name == "mlp")
    assert (mlp.max_batch_size, mlp.batch_input_name, mlp.batch_axis) == (32, "features", 1)
    client.set_model_policy("mlp", weight=2.0)
    assert next(m for m in client.control_status().models if m.name == "mlp").weight == 2.0
    client.set_model_policy("mlp", weight=1.0)
    assert client.compact_memory().reloaded_models == 0
    # This worker runs in static mode: lifecycle and residency RPCs are refused, with the
    # message tritonclient shows too.
    with pytest.raises(RequestError) as ours_error:
        client.load_model("double")
    with pytest.raises(InferenceServerException) as theirs_error:
        triton.load_model("double")
    assert str(ours_error.value) == theirs_error.value.message()
    assert code_of(ours_error.value).name == "FAILED_PRECONDITION"
    with pytest.raises(RequestError, match="explicit") as residency_error:
        client.set_model_residency("mlp", "device")
    assert code_of(residency_error.value).name == "FAILED_PRECONDITION"


def test_deadline_fails_at_once_and_a_generous_one_succeeds(client: Client) -> None:
    x = np.ones((8, 32, 32, 3), np.float32)
    before = client.statistics()
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        client.infer("resnet", {"images": x}, timeout=1e-4)
    assert time.monotonic() - started < 1.0
    assert client.statistics().attempts - before.attempts <= 1
    assert client.infer("resnet", {"images": x}, timeout=30)["logits"].shape == (8, 10)


# --------------------------------------------------------------------- shared memory


def _my_shm() -> list[str]:
    mine = f"{NAME_PREFIX}{os.getpid()}_"
    return sorted(n for n in os.listdir(SHM_ROOT) if n.startswith(mine))


def test_38_megabytes_round_trip_through_shared_memory(client: Client) -> None:
    nbytes = int(np.prod(BIG_SHAPE)) * 4
    assert nbytes == 38_000_000
    with client.shared_memory(2 * nbytes + 4096) as region:
        assert _my_shm() == [region.key[1:]]
        x = region.empty(BIG_SHAPE, np.float32)
        x[...] = np.random.default_rng(3).standard_normal(BIG_SHAPE, dtype=np.float32)
        before = client.statistics()
        y = client.infer("big_double", {"x": x}, shm=region)["y"]
        after = client.statistics()
        assert y.shape == BIG_SHAPE and region.offset_of(y) is not None
        np.testing.assert_array_equal(y, 2 * x)
        # 76 MB moved; a few hundred bytes of references crossed the socket.
        assert after.bytes_sent - before.bytes_sent < 4096
        assert after.bytes_received - before.bytes_received < 4096
        assert [r.name for r in client.shared_memory_status()] == [region.name]
    assert _my_shm() == []
    assert client.shared_memory_status() == []


def test_the_same_tensor_inline_for_comparison(client: Client) -> None:
    x = np.full(BIG_SHAPE, 1.5, np.float32)
    before = client.statistics()
    y = client.infer("big_double", {"x": x})["y"]
    after = client.statistics()
    assert float(y[1, 4749, 999]) == 3.0
    assert after.bytes_sent - before.bytes_sent > x.nbytes
    assert after.bytes_received - before.bytes_received > x.nbytes


def test_failure_inside_the_block_still_cleans_up(client: Client) -> None:
    with pytest.raises(ZeroDivisionError), client.shared_memory(1 << 20) as region:
        client.infer("double", {"x": np.ones((4, 16), np.float32)}, shm=region)
        _ = 1 / 0
    assert _my_shm() == []
    assert client.shared_memory_status() == []


# --------------------------------------------------------------------- async callers


def test_asyncio_caller(url: str, client: Client) -> None:
    x = np.random.default_rng(5).standard_normal((5, 32)).astype(np.float32)
    want = client.infer("mlp", {"features": x})["probabilities"]

    async def main() -> list[dict[str, np.ndarray]]:
        async with AsyncClient(url, timeout=60) as aio:
            assert await aio.is_model_ready("mlp")
            return await asyncio.gather(*(aio.infer("mlp", {"features": x}) for _ in range(8)))

    for out in asyncio.run(main()):
        # Concurrent requests may be coalesced into a larger compiled size: tolerance.
        np.testing.assert_allclose(out["probabilities"], want, rtol=1e-5, atol=1e-6)


async def test_trio_caller(url: str) -> None:
    x = np.arange(4 * 16, dtype=np.float32).reshape(4, 16)
    got: list[np.ndarray] = []
    async with AsyncClient(url, timeout=60) as aio:

        async def one(k: int) -> None:
            got.append((await aio.infer("double", {"x": x + k}))["y"] - 2 * k)

        async with trio.open_nursery() as nursery:
            for k in range(6):
                nursery.start_soon(one, k)
        async with aio.shared_memory(1 << 16) as region:
            out = await aio.infer("double", {"x": x}, shm=region)
            np.testing.assert_array_equal(out["y"], 2 * x)
    assert len(got) == 6
    for y in got:
        np.testing.assert_array_equal(y, 2 * x)


# --------------------------------------------------------------------- a full queue


def test_full_queue_is_retried_and_non_retryable_fails_at_once(
    zoo_repo: Path, compile_cache: Path
) -> None:
    config = worker_config(
        zoo_repo,
        include=("resnet",),
        cache_dir=compile_cache,
        metrics=False,
        scheduler=SchedulerConfig(max_queue_depth=1),
    )
    x = np.zeros((8, 32, 32, 3), np.float32)
    with running_worker(config) as address:
        url = f"127.0.0.1:{address.grpc_port}"

        async def burst(retry: RetryPolicy) -> tuple[list[Any], AsyncClient]:
            client = AsyncClient(url, retry=retry, timeout=60, seed=7)
            async with client:
                results = await asyncio.gather(
                    *(client.infer("resnet", {"images": x}) for _ in range(24)),
                    return_exceptions=True,
                )
            return results, client

        # Without retries, a queue of one under 24 concurrent requests refuses some.
        results, client = asyncio.run(burst(RetryPolicy.never()))
        refused = [r for r in results if isinstance(r, BaseException)]
        assert refused, "a queue of depth 1 under 24 concurrent requests must refuse some"
        for r in refused:
            assert isinstance(r, ResourceExhausted) and "queue is full" in str(r)

        # With retries, every one of them gets through.
        patient = RetryPolicy(max_retries=60, base_delay=0.02, max_delay=0.5)
        results, client = asyncio.run(burst(patient))
        assert all(isinstance(r, dict) and r["logits"].shape == (8, 10) for r in results)
        stats = client.statistics()
        assert stats.retries > 0, "some calls must have needed a retry"
        assert stats.failures == {}
        assert stats.attempts == stats.calls + stats.retries

        # A status that is not worth retrying fails on the first attempt.
        with Client(url, retry=patient) as blocking:
            with pytest.raises(NotFound):
                blocking.infer("mlp", {"features": np.ones((1, 32), np.float32)})
            assert blocking.statistics().attempts == 1
