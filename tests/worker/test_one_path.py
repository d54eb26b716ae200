"""ModelInfer's one path end to end: begin on the asyncio side, answered by the dispatch loop.

A real gRPC server (``serve_grpc``, Trio as asyncio's guest, as in the worker) over the
real ``Service`` and a host whose models are queued in a real ``Scheduler`` -- its table
of admitted requests and its dispatch loop -- with an executor whose executions wait
until the test releases them. Clients are ``tritonclient`` in worker threads. What is
checked is what issue 16 asks of the path: a client cancel while queued (never
executed) and while executing (result dropped, slot freed at once), and a deadline
passing while queued (DEADLINE_EXCEEDED from the dispatch loop, never executed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest
import trio
import tritonclient.grpc as tc
import tritonclient.grpc.aio as tca
from clocks import trio_wait_until
from fake_host import FakeModel
from tritonclient.utils import InferenceServerException

from reactantserver.config import SchedulerConfig
from reactantserver.config.schema import EndpointsConfig
from reactantserver.errors import NotFound
from reactantserver.records import Answer
from reactantserver.scheduling import Batch, Request, Scheduler
from reactantserver.service import Service
from reactantserver.worker.grpc import serve_grpc

pytestmark = pytest.mark.guest


class GatedExecutor:
    """Executes ``y = 2x`` once the test sets ``release``; notes what it ran."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.executing = trio.Event()
        self.executed: list[float] = []  # the first element of each request's x

    async def prepare(self, batch: Batch) -> None:
        pass

    async def execute(self, batch: Batch) -> Sequence[Any]:
        self.executing.set()
        await self.release.wait()
        self.executed.extend(float(r.payload["x"].flat[0]) for r in batch.requests)
        return [{"y": 2 * r.payload["x"], "z": r.payload["x"] + 1} for r in batch.requests]


class SchedulerHost:
    """The ``ModelHost`` seam over a real ``Scheduler`` (only ``double``)."""

    backend = "cpu"
    device_ordinal = 0

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.model = FakeModel("double")

    def readiness(self) -> tuple[bool, str]:
        return True, ""

    def get(self, name: str) -> FakeModel:
        if name != "double":
            raise NotFound(f"model {name!r} is not loaded")
        return self.model

    def begin(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        deadline: float,
        answer: Answer,
    ) -> Request:
        def answered(value: Any, error: BaseException | None) -> None:
            if error is not None:
                answer.fail(error)
            else:
                answer.resolve(value)

        return self.scheduler.enqueue(
            model,
            inputs,
            answer=answered,
            rows=inputs["x"].shape[0],
            deadline=None if deadline == float("inf") else deadline,
        )

    def withdraw(self, handle: object) -> None:
        assert isinstance(handle, Request)
        self.scheduler.withdraw(handle)


async def serve(nursery: trio.Nursery) -> tuple[str, Service, Scheduler, GatedExecutor]:
    executor = GatedExecutor()
    # max_batch_size 1: every request is a batch of its own, so "queued" is unambiguous.
    scheduler = Scheduler(SchedulerConfig(), executor)
    scheduler.add_model("double", [1], max_batch_size=1)
    await nursery.start(scheduler.run)
    service = Service(SchedulerHost(scheduler))
    port = await nursery.start(serve_grpc, service, EndpointsConfig(host="127.0.0.1", port=0))
    return f"127.0.0.1:{port}", service, scheduler, executor


def x_input(value: float) -> tc.InferInput:
    inp = tc.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(np.full((1, 16), value, np.float32))
    return inp


def call(url: str, value: float, **kwargs: Any) -> tuple[str, Any]:
    """One blocking ModelInfer: ("OK", y) or (status, message)."""
    client = tc.InferenceServerClient(url)
    try:
        result = client.infer("double", [x_input(value)], **kwargs)
        return "OK", result.as_numpy("y")
    except InferenceServerException as exc:
        return str(exc.status()), str(exc.message())
    finally:
        client.close()


def call_then_give_up(url: str, value: float, gave_up: Callable[[], None]) -> str:
    """One ModelInfer that the client cancels (RST_STREAM) once ``gave_up`` is asked to."""

    async def main() -> str:
        async with tca.InferenceServerClient(url) as client:
            task = asyncio.ensure_future(client.infer("double", [x_input(value)]))
            while not task.done() and not gave_up():
                await asyncio.sleep(0.01)  # real-clock: the poll of a condition another thread sets
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                return "cancelled"
            return "answered"

    return asyncio.run(main())


async def test_a_client_cancel_while_queued_withdraws_the_request_before_it_runs(
    nursery: trio.Nursery,
) -> None:
    url, service, scheduler, executor = await serve(nursery)
    first: list[tuple[str, Any]] = []

    async def run_first() -> None:
        first.append(await trio.to_thread.run_sync(call, url, 1.0))

    nursery.start_soon(run_first)
    await executor.executing.wait()  # request 1 is on the "device"
    stop = trio.Event()
    outcome: list[str] = []

    async def run_second() -> None:
        outcome.append(await trio.to_thread.run_sync(call_then_give_up, url, 2.0, stop.is_set))

    nursery.start_soon(run_second)
    await trio_wait_until(lambda: scheduler.admitted == 2)  # request 2 is queued
    stop.set()
    await trio_wait_until(lambda: outcome == ["cancelled"])
    # Withdrawn at once, synchronously, by the handler's cancellation: the table and
    # the in-flight count hold only request 1 now.
    await trio_wait_until(lambda: scheduler.admitted == 1 and service.statistics().in_flight == 1)
    assert scheduler.statistics().policy.models["double"].cancelled == 1
    executor.release.set()
    await trio_wait_until(lambda: len(first) == 1)
    assert first[0][0] == "OK"
    assert executor.executed == [1.0]  # request 2 never ran
    stats = service.statistics()
    assert stats.in_flight == 0
    assert stats.rpcs[("ModelInfer", "CANCELLED")] == 1
    assert service.request_statistics("double").by_status == {"OK": 1, "CANCELLED": 1}


async def test_a_client_cancel_while_executing_drops_the_result_and_frees_the_slot(
    nursery: trio.Nursery,
) -> None:
    url, service, scheduler, executor = await serve(nursery)
    stop = trio.Event()
    outcome: list[str] = []

    async def run() -> None:
        outcome.append(await trio.to_thread.run_sync(call_then_give_up, url, 1.0, stop.is_set))

    nursery.start_soon(run)
    await executor.executing.wait()
    stop.set()
    await trio_wait_until(lambda: outcome == ["cancelled"])
    # The batch still runs, but the request is out of the table and its slot is free.
    assert scheduler.statistics().executing == "double"
    await trio_wait_until(lambda: scheduler.admitted == 0 and service.statistics().in_flight == 0)
    executor.release.set()
    await trio_wait_until(lambda: scheduler.statistics().executing is None)
    assert executor.executed == [1.0]  # it ran; its result went nowhere
    # The server goes on serving.
    status, y = await trio.to_thread.run_sync(call, url, 3.0)
    assert status == "OK"
    np.testing.assert_array_equal(y, np.full((1, 16), 6.0, np.float32))


async def test_a_deadline_passing_while_queued_is_answered_by_the_dispatch_loop(
    nursery: trio.Nursery,
) -> None:
    """The ``timeout`` parameter (no grpc-timeout, so the wire layer has no timer of its
    own): the dispatch loop fails the queued request at its deadline while the device is
    still busy, and it never runs."""
    url, service, scheduler, executor = await serve(nursery)
    first: list[tuple[str, Any]] = []

    async def run_first() -> None:
        first.append(await trio.to_thread.run_sync(call, url, 1.0))

    nursery.start_soon(run_first)
    await executor.executing.wait()
    t0 = trio.current_time()
    status, message = await trio.to_thread.run_sync(
        lambda: call(url, 2.0, timeout=200_000)  # microseconds
    )
    assert status == "StatusCode.DEADLINE_EXCEEDED"
    assert message.startswith("model 'double': deadline passed after 0.")
    assert message.endswith(" s waiting for the device")
    assert trio.current_time() - t0 < 5  # answered at its deadline, not after the batch
    assert first == []  # the batch ahead of it is still running
    executor.release.set()
    await trio_wait_until(lambda: len(first) == 1)
    assert executor.executed == [1.0]
    assert scheduler.statistics().policy.models["double"].shed == 1
    assert service.request_statistics("double").by_status == {"DEADLINE_EXCEEDED": 1, "OK": 1}
