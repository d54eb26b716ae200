"""reactantserver.client against the real gRPC surface over the fake host (no JAX).

The server is the real ``Service`` and ``serve_grpc`` over ``tests/fake_host.py`` (tiny
models, scripted failures), so every status comes from the same code a worker runs, in
milliseconds. Blocking and asyncio clients talk to a server running in its own thread;
Trio tests start the server in their own nursery. Retries are counted with the client's
statistics and, on the server side, with the host's record of infer calls.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import attrs
import numpy as np
import pytest
import trio
from clocks import trio_wait_until, wait_until
from fake_host import FakeHost
from worker_harness import free_port

from reactantserver.bundle.manifest import TensorSpec
from reactantserver.client import AsyncClient, Client, RetryPolicy
from reactantserver.config.schema import EndpointsConfig
from reactantserver.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    QueueFull,
    ResourceExhausted,
    Unavailable,
)
from reactantserver.records import Answer
from reactantserver.service import Service
from reactantserver.transport import guest
from reactantserver.worker.grpc import serve_grpc

# The Trio tests here serve in this process: as the worker does, Trio is asyncio's guest.
pytestmark = pytest.mark.guest

#: Fast retries for tests: the policy's logic, not its default pace, is under test.
QUICK = RetryPolicy(max_retries=3, base_delay=0.01, max_delay=0.05)
X = np.arange(32, dtype=np.float32).reshape(2, 16)


@attrs.define
class FlakyHost(FakeHost):
    """The fake host, whose ``double`` refuses its next ``refuse`` requests (queue full)."""

    refuse: int = 0

    def begin(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        deadline: float,
        answer: Answer,
    ) -> object:
        if model == "double" and self.refuse > 0:
            self.refuse -= 1
            self.calls.append((model, deadline))
            raise QueueFull(model, 1)
        return super().begin(model, inputs, outputs, deadline, answer)


@attrs.frozen
class Served:
    host: FlakyHost
    port: int
    service: Service
    token: trio.lowlevel.TrioToken

    def forget_regions(self) -> None:
        """The server forgets every region of every client, as a restarted one has."""
        trio.from_thread.run_sync(self.service.registry.close, trio_token=self.token)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextmanager
def serving(port: int = 0, *, started: threading.Event | None = None) -> Iterator[Served]:
    """The fake server on a thread of its own, until the block exits."""
    host = FlakyHost()
    box: dict[str, Any] = {}
    ready = threading.Event()

    async def main() -> None:
        box["token"] = trio.lowlevel.current_trio_token()
        box["stop"] = stop = trio.Event()
        endpoints = EndpointsConfig(host="127.0.0.1", port=port)
        async with trio.open_nursery() as nursery:
            await nursery.start(host.run)

            box["service"] = service = Service(host)

            async def serve(task_status: trio.TaskStatus[int]) -> None:
                await serve_grpc(
                    service, endpoints, stop=stop, grace_seconds=1, task_status=task_status
                )
                nursery.cancel_scope.cancel()  # the host's task with it

            box["port"] = await nursery.start(serve)
            ready.set()

    thread = threading.Thread(target=guest.run, args=(main,), daemon=True)
    thread.start()
    assert ready.wait(10), "the fake server did not start"
    try:
        yield Served(host, box["port"], box["service"], box["token"])
    finally:
        trio.from_thread.run_sync(box["stop"].set, trio_token=box["token"])
        thread.join(10)


@pytest.fixture
def served() -> Iterator[Served]:
    with serving() as s:
        yield s


def infer_calls(host: FakeHost, model: str = "double") -> int:
    return sum(1 for name, _ in host.calls if name == model)


# ------------------------------------------------------------------------ blocking client


def test_every_rpc_of_the_blocking_client(served: Served) -> None:
    with Client(served.url, timeout=10) as client:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("double") and not client.is_model_ready("cold")
        assert not client.is_model_ready("nope")
        meta = client.server_metadata()
        assert meta.name == "reactantserver" and "system_shared_memory" in meta.extensions
        model = client.model_metadata("double")
        assert [(t.name, t.datatype, t.shape) for t in model.outputs] == [
            ("y", "FP32", (-1, 16)),
            ("z", "FP32", (-1, 16)),
        ]
        assert client.model_config("double").max_batch_size == 8

        out = client.infer("double", {"x": X})
        assert list(out) == ["y", "z"]
        np.testing.assert_array_equal(out["y"], 2 * X)
        out = client.infer("double", {"x": X}, ["z"], request_id="q7")
        assert list(out) == ["z"]
        text = np.array([b"a", b"bc"], dtype=object)
        assert list(client.infer("echo", {"s": text})["t"]) == [b"a!", b"bc!"]

        (stats,) = client.model_statistics("double")
        assert stats.inference_count == 4 and stats.execution_count == 2

        index = {m.name: m.state for m in client.repository_index()}
        assert index["spare"] == "UNAVAILABLE" and index["double"] == "READY"
        assert "cold" not in {m.name for m in client.repository_index(ready=True)}
        client.load_model("spare")
        assert client.is_model_ready("spare")
        client.unload_model("spare")
        assert not client.is_model_ready("spare")

        status = client.control_status()
        assert status.residency_mode == "self_managed"
        assert {m.name for m in status.models} >= {"double", "echo"}
        client.set_model_policy("double", weight=3.0)
        assert served.host.weights["double"] == 3.0
        assert client.compact_memory(["double"]).reloaded_models == 1
        with pytest.raises(FailedPrecondition) as info:
            client.set_model_residency("double", "device")
        assert str(info.value) == (
            "residency is self-managed (model_control_mode is dynamic); "
            "SetModelResidency needs model_control_mode: explicit"
        )
        with pytest.raises(ValueError, match="residency must be one of"):
            client.set_model_residency("double", "gpu")
        assert client.same_ipc_namespace()
        stats_after = client.statistics()
        assert stats_after.retries == 0 and stats_after.failures == {"FAILED_PRECONDITION": 1}
        assert stats_after.calls == stats_after.attempts


def test_errors_carry_the_servers_message_and_fail_at_once(served: Served) -> None:
    with Client(served.url, retry=QUICK) as client:
        cases = [
            (lambda: client.infer("nope", {"x": X}), NotFound, "model 'nope' is not loaded"),
            (
                lambda: client.infer("double", {"x": X.astype(np.int32)}),
                InvalidArgument,
                "model 'double': input 'x': expected datatype FP32, got INT32",
            ),
            (
                lambda: client.infer("slow", {"x": X}, timeout=0.2),
                DeadlineExceeded,
                "",
            ),
            (lambda: client.infer("cold", {"x": X}), Unavailable, "not ready: still compiling"),
        ]
        for call, category, message in cases:
            before = client.statistics()
            with pytest.raises(category) as info:
                call()
            assert message in str(info.value)
            after = client.statistics()
            if category is not Unavailable:
                # NOT_FOUND, INVALID_ARGUMENT, DEADLINE_EXCEEDED: one attempt, no pause.
                assert after.attempts - before.attempts == 1
                assert after.retries == before.retries
                assert after.backoff_seconds == before.backoff_seconds
            else:
                assert after.retries - before.retries == QUICK.max_retries
        assert str(info.value) == "model 'cold' is not ready: still compiling"


def test_resource_exhausted_is_retried_until_it_succeeds(served: Served) -> None:
    served.host.refuse = 2
    with Client(served.url, retry=QUICK) as client:
        np.testing.assert_array_equal(client.infer("double", {"x": X})["y"], 2 * X)
        stats = client.statistics()
    assert (stats.calls, stats.attempts, stats.retries) == (1, 3, 2)
    assert infer_calls(served.host) == 3
    assert 0 <= stats.backoff_seconds <= QUICK.bound(0) + QUICK.bound(1)


def test_retries_are_bounded_and_end_with_the_servers_answer(served: Served) -> None:
    with Client(served.url, retry=QUICK) as client:
        with pytest.raises(ResourceExhausted) as info:
            client.infer("busy", {"x": X})
        assert str(info.value) == (
            "model 'busy': queue is full (16 requests waiting, "
            "scheduler.max_queue_depth=16); retry later"
        )
        stats = client.statistics()
    assert (stats.attempts, stats.retries) == (1 + QUICK.max_retries, QUICK.max_retries)
    assert stats.failures == {"RESOURCE_EXHAUSTED": 1}


def test_backoff_never_sleeps_past_the_deadline(served: Served) -> None:
    """With pauses drawn from [0, 5 s] and 0.3 s to spend, the client gives up as soon as
    a drawn pause would end after the deadline, with the server's own answer."""
    slow_policy = RetryPolicy(max_retries=10, base_delay=5.0, max_delay=5.0)
    for seed in range(5):
        with Client(served.url, retry=slow_policy, seed=seed) as client:
            with pytest.raises(ResourceExhausted, match="queue is full"):
                client.infer("busy", {"x": X}, timeout=0.3)
            # Every pause the client slept, summed, ended before the deadline.
            assert client.statistics().backoff_seconds < 0.3


def test_unreachable_server_is_unavailable_after_the_retries() -> None:
    port = free_port()  # nothing listens here
    with Client(f"127.0.0.1:{port}", retry=QUICK) as client:
        with pytest.raises(Unavailable, match=f"cannot reach 127.0.0.1:{port}"):
            client.is_server_live()
        stats = client.statistics()
    assert (stats.attempts, stats.retries) == (4, 3)


def test_a_server_that_comes_up_late_is_reached_by_retrying() -> None:
    port = free_port()
    patient = RetryPolicy(max_retries=50, base_delay=0.05, max_delay=0.1)
    with Client(f"127.0.0.1:{port}", retry=patient, timeout=30) as client:
        answer: list[bool] = []
        caller = threading.Thread(target=lambda: answer.append(client.is_server_live()))
        caller.start()
        # The client is refused and retries before the server comes up.
        wait_until(lambda: client.statistics().retries > 0, what="a retry")
        with serving(port):
            caller.join(20)
        assert answer == [True]
        assert client.statistics().retries > 0


def test_shared_memory_round_trip_and_cleanup(served: Served) -> None:
    with Client(served.url) as client:
        with client.shared_memory(4096) as region:
            assert [r.name for r in client.shared_memory_status()] == [region.name]
            x = region.empty((2, 16), np.float32)
            x[...] = X
            out = client.infer("double", {"x": x}, shm=region)
            np.testing.assert_array_equal(out["y"], 2 * X)
            np.testing.assert_array_equal(out["z"], X + 1)
            assert region.offset_of(out["y"]) is not None  # a view of the region
            # Eight rows in, sixteen out: only references cross the socket.
            x8 = region.write_inputs({"x": np.ones((8, 16), np.float32)})["x"]
            before = client.statistics()
            out = client.infer("double", {"x": x8}, shm=region)
            after = client.statistics()
            np.testing.assert_array_equal(out["z"], 2 * x8)
            assert after.bytes_sent - before.bytes_sent < x8.nbytes
            assert after.bytes_received - before.bytes_received < x8.nbytes
            # An input outside the region is copied in; BYTES stay inline.
            out = client.infer("double", {"x": X + 1}, ["y"], shm=region)
            np.testing.assert_array_equal(out["y"], 2 * (X + 1))
            text = np.array([b"q"], dtype=object)
            assert list(client.infer("echo", {"s": text}, shm=region)["t"]) == [b"q!"]
        assert client.shared_memory_status() == []


def test_a_forgotten_region_is_registered_again_once(served: Served) -> None:
    """The server forgetting every region (as after a restart) costs one re-registration."""
    with Client(served.url) as client, Client(served.url) as other:
        with client.shared_memory(4096) as region:
            served.forget_regions()  # every region, as a restarted server
            out = client.infer("double", {"x": X}, ["y"], shm=region)
            np.testing.assert_array_equal(out["y"], 2 * X)
            assert client.statistics().reregistrations == 1
            assert [r.name for r in client.shared_memory_status()] == [region.name]
            assert other.shared_memory_status() == []  # the client's own, not other's
        # A region some other client registered is not this client's to use (the server
        # says it is not registered, for this client) nor to re-register.
        with (
            other.shared_memory(4096) as foreign,
            pytest.raises(FailedPrecondition, match="is not registered"),
        ):
            client.infer("double", {"x": X}, ["y"], shm=foreign)
    assert client.statistics().reregistrations == 1


def test_a_restarted_server_is_reconnected_and_the_region_registered_again() -> None:
    """Stop the server and start a new one on the same port: the next call reconnects
    (retrying UNAVAILABLE while nobody listens) and registers the region once more."""
    port = free_port()
    patient = RetryPolicy(max_retries=20, base_delay=0.05, max_delay=0.1)
    with Client(f"127.0.0.1:{port}", retry=patient, timeout=30) as client, ExitStack() as stack:
        with serving(port):
            region = stack.enter_context(client.shared_memory(4096))
            np.testing.assert_array_equal(
                client.infer("double", {"x": X}, ["y"], shm=region)["y"], 2 * X
            )
        with serving(port) as second:
            out = client.infer("double", {"x": X + 1}, ["y"], shm=region)
            np.testing.assert_array_equal(out["y"], 2 * (X + 1))
            assert client.statistics().reregistrations == 1
            assert infer_calls(second.host) == 1
            stack.close()  # the region's block ends: unregistered and unlinked
            assert client.shared_memory_status() == []
    assert region.closed


def test_shared_memory_is_cleaned_up_when_the_block_fails(served: Served) -> None:
    with Client(served.url) as client:
        with pytest.raises(RuntimeError, match="inside"), client.shared_memory(1024) as region:
            raise RuntimeError("inside")
        assert region.closed
        assert client.shared_memory_status() == []


# ------------------------------------------------------------------------ asyncio


def test_async_client_under_asyncio(served: Served) -> None:
    served.host.refuse = 3

    async def main() -> tuple[list[dict[str, np.ndarray]], int]:
        async with AsyncClient(served.url, retry=QUICK) as client:
            assert await client.is_server_ready()
            results = await asyncio.gather(
                *(client.infer("double", {"x": X + i}) for i in range(8))
            )
            async with client.shared_memory(4096) as region:
                shm_out = await client.infer("double", {"x": X}, ["y"], shm=region)
                np.testing.assert_array_equal(shm_out["y"], 2 * X)
            with pytest.raises(NotFound):
                await client.model_metadata("nope")
            return results, client.statistics().retries

    results, retries = asyncio.run(main())
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out["y"], 2 * (X + i))
    assert retries == 3


def test_an_async_client_belongs_to_one_loop(served: Served) -> None:
    client = AsyncClient(served.url)
    assert asyncio.run(client.is_server_live())
    with pytest.raises(RuntimeError, match="another asyncio loop"):
        asyncio.run(client.is_server_live())
    with pytest.raises(RuntimeError, match="first used under asyncio"):
        trio.run(client.is_server_live)


# ------------------------------------------------------------------------ Trio


async def test_async_client_under_trio(nursery: trio.Nursery) -> None:
    host = FlakyHost(refuse=2)
    await nursery.start(host.run)
    port = await nursery.start(serve_grpc, Service(host), EndpointsConfig(host="127.0.0.1", port=0))
    results: dict[int, np.ndarray] = {}
    async with AsyncClient(f"127.0.0.1:{port}", retry=QUICK) as client:

        async def one(i: int) -> None:
            results[i] = (await client.infer("double", {"x": X + i}))["y"]

        async with trio.open_nursery() as inner:
            for i in range(6):
                inner.start_soon(one, i)
        async with client.shared_memory(4096) as region:
            out = await client.infer("double", {"x": X}, ["z"], shm=region)
            np.testing.assert_array_equal(out["z"], X + 1)
        assert client.statistics().retries == 2

        # Cancelling the Trio task cancels the call, and the server sees it.
        with trio.move_on_after(0.3) as scope:
            await client.infer("slow", {"x": X})
        assert scope.cancelled_caught
        await trio_wait_until(lambda: "slow" in host.cancelled)
        with pytest.raises(NotFound, match="model 'nope' is not loaded"):
            await client.infer("nope", {"x": X})
    for i in range(6):
        np.testing.assert_array_equal(results[i], 2 * (X + i))
    with pytest.raises(RuntimeError, match="closed"):
        await client.is_server_live()


# ------------------------------------------------------------------------ array-likes


def test_a_plain_list_takes_the_models_datatype_after_one_metadata_read(served: Served) -> None:
    """The issue's example: ``[[1.0] * 16]`` is float64 to numpy, FP32 to the model."""
    with Client(served.url) as client:
        y = client.infer("double", {"x": [[1.0] * 16]})["y"]
        assert y.dtype == np.float32 and y.tolist() == [[2.0] * 16]
        assert client.statistics().calls == 2  # ModelMetadata, then ModelInfer
        client.infer("double", {"x": [[3.0] * 16, [4.0] * 16]})
        assert client.statistics().calls == 3  # the datatypes are cached


def test_numpy_arrays_are_sent_as_they_are_and_cost_no_metadata_read(served: Served) -> None:
    with Client(served.url) as client:
        np.testing.assert_array_equal(client.infer("double", {"x": X})["y"], 2 * X)
        with pytest.raises(InvalidArgument, match="expected datatype FP32, got FP64"):
            client.infer("double", {"x": X.astype(np.float64)})  # a dtype chosen on purpose
        assert client.statistics().calls == 2
    assert infer_calls(served.host) == 1  # the server refused the FP64 one before the model


def test_a_lossy_list_is_refused_before_anything_is_sent(served: Served) -> None:
    with Client(served.url) as client, pytest.raises(InvalidArgument) as err:
        client.infer("double", {"x": [[1e39] * 16]})
    assert str(err.value) == (
        "input 'x': cannot convert to FP32 without loss: 1e+39 is out of FP32's range; pass a "
        "numpy array to choose the dtype yourself"
    )
    assert infer_calls(served.host) == 0


def test_a_changed_datatype_is_read_again_and_the_call_made_once_more(served: Served) -> None:
    """The model is reloaded declaring FP64: the cached FP32 conversion is refused by the
    server, the client reads the metadata again, converts again and succeeds."""
    with Client(served.url) as client:
        client.infer("double", {"x": [[1.0] * 16]})
        fp64 = TensorSpec("x", "FP64", (-1, 16))
        served.host.models["double"].inputs = (fp64,)
        served.host.models["double"].outputs = (attrs.evolve(fp64, name="y"),)
        y = client.infer("double", {"x": [[1.0] * 16]})["y"]
        assert y.dtype == np.float64
        # metadata, infer; then the refused infer, metadata again, infer.
        assert client.statistics().calls == 5
        assert client.statistics().failures == {"INVALID_ARGUMENT": 1}  # the refused one
    assert infer_calls(served.host) == 2  # the refused call never reached the model


def test_a_refusal_that_is_not_about_the_datatype_is_not_retried(served: Served) -> None:
    with Client(served.url) as client:
        client.infer("double", {"x": [[1.0] * 16]})
        with pytest.raises(InvalidArgument, match="shape"):
            client.infer("double", {"x": [[1.0] * 15]})
        # infer refused; the metadata read again says FP32 still: no second attempt.
        assert client.statistics().calls == 4


def test_an_unknown_model_named_with_a_list_is_not_found(served: Served) -> None:
    with Client(served.url) as client, pytest.raises(NotFound, match="'nope'"):
        client.infer("nope", {"x": [1.0]})


def test_a_ragged_list_is_refused_by_the_client_and_never_sent(served: Served) -> None:
    """Issue 42: a ragged list raised numpy's ``inhomogeneous shape`` from the client."""
    with Client(served.url, timeout=10) as client:
        before = infer_calls(served.host)
        with pytest.raises(InvalidArgument) as info:
            client.infer("double", {"x": [[1.0] * 16, [1.0] * 15]})
        assert str(info.value) == (
            "input 'x': a ragged list is not a tensor: x[1] has 15 elements where x[0] has "
            "16 elements; give every row the same length (pad it, or send rows of other "
            "lengths as requests of their own)"
        )
        assert infer_calls(served.host) == before
