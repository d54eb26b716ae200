"""The Trio dispatch loop, under virtual time (pytest-trio's ``autojump_clock``).

A fake executor sleeps for a scripted cost, so every timing below is exact.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import trio
import trio.testing

import reactantserver
from reactantserver.config import SchedulerConfig
from reactantserver.errors import (
    BatchTooLarge,
    DeadlineExceeded,
    ExecutionFailed,
    NotFound,
    NotResident,
    QueueFull,
    Unavailable,
)
from reactantserver.scheduling import Batch, Health, Scheduler


class FakeExecutor:
    """Sleeps ``cost(batch)`` seconds per execution and echoes each payload."""

    def __init__(self, cost: Callable[[Batch], float] = lambda b: 1.0) -> None:
        self.cost = cost
        self.running = 0
        self.max_running = 0
        self.executed: list[tuple[float, Batch]] = []
        self.prepared: list[str] = []
        self.fail: dict[str, Exception] = {}
        self.prepare_fail: dict[str, Exception] = {}
        self.short: set[str] = set()

    async def prepare(self, batch: Batch) -> None:
        self.prepared.append(batch.model)
        if batch.model in self.prepare_fail:
            raise self.prepare_fail[batch.model]

    async def execute(self, batch: Batch) -> Sequence[Any]:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        start = trio.current_time()
        try:
            await trio.sleep(self.cost(batch))  # virtual-clock: its tests run on autojump
        finally:
            self.running -= 1
        self.executed.append((start, batch))
        if batch.model in self.fail:
            raise self.fail[batch.model]
        answers = [("out", r.payload) for r in batch.requests]
        return answers[:-1] if batch.model in self.short else answers


class PrefetchingExecutor(FakeExecutor):
    def __init__(self) -> None:
        super().__init__()
        self.prefetched: list[tuple[float, str]] = []

    async def prefetch(self, model: str) -> None:
        self.prefetched.append((trio.current_time(), model))


def make(executor: FakeExecutor, **config: Any) -> Scheduler:
    scheduler = Scheduler(SchedulerConfig(**config), executor)
    for name in ("a", "b", "c"):
        scheduler.add_model(name, [1, 2, 4])
    return scheduler


def executed_payloads(executor: FakeExecutor) -> list[Any]:
    return [r.payload for _, b in executor.executed for r in b.requests]


def test_public_name() -> None:
    assert reactantserver.Scheduler is Scheduler


async def test_results_route_back_and_one_execution_at_a_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    executor = FakeExecutor()
    scheduler = make(executor, discipline="fifo")
    results: dict[int, Any] = {}

    async def call(i: int) -> None:
        results[i] = await scheduler.submit("abc"[i % 3], i)

    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        assert scheduler.ready and scheduler.health is Health.READY
        async with trio.open_nursery() as clients:
            for i in range(30):
                clients.start_soon(call, i)
        await scheduler.aclose()
    assert results == {i: ("out", i) for i in range(30)}
    assert executor.max_running == 1
    # 30 requests over 3 models coalesce into batches of up to 4.
    assert len(executor.executed) < 30
    starts = [t for t, _ in executor.executed]
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(starts))


async def test_admission_errors_are_raised_at_once(autojump_clock: trio.testing.MockClock) -> None:
    executor = FakeExecutor()
    scheduler = make(executor, max_queue_depth=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        with pytest.raises(NotFound):
            await scheduler.submit("zzz", 0)
        with pytest.raises(BatchTooLarge):
            await scheduler.submit("a", 0, rows=5)
        nursery.start_soon(scheduler.submit, "a", 1)  # runs at once
        await trio.sleep(0.1)
        nursery.start_soon(scheduler.submit, "a", 2)  # queued behind it
        await trio.sleep(0.1)
        with pytest.raises(QueueFull):
            await scheduler.submit("a", 3)
        await trio.sleep(3.0)
        await scheduler.aclose()


async def test_dispatch_timeout_fails_the_batch_and_holds_the_device(
    autojump_clock: trio.testing.MockClock,
) -> None:
    executor = FakeExecutor(cost=lambda b: 5.0 if b.model == "a" else 0.5)
    scheduler = make(executor, dispatch_timeout_seconds=1.0)
    outcome: dict[str, Any] = {}

    async def queued_b() -> None:
        outcome["b"] = await scheduler.submit("b", "b-payload")
        outcome["b_at"] = trio.current_time()

    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        start = trio.current_time()
        nursery.start_soon(queued_b)  # admitted before the overrun
        with pytest.raises(ExecutionFailed, match=r"dispatch_timeout_seconds=1\.0"):
            await scheduler.submit("a", "slow")
        assert trio.current_time() - start == pytest.approx(1.0)
        assert scheduler.health is Health.OVERRUN and not scheduler.ready
        assert scheduler.statistics().executing == "a"
        with pytest.raises(Unavailable, match="not ready"):
            await scheduler.submit("c", "refused")
        await trio.sleep_until(start + 5.0 + 1e-6)
        assert scheduler.ready
        await trio.sleep(1.0)
        await scheduler.aclose()
    # The queued request ran only after the device returned, never alongside.
    assert outcome["b"] == ("out", "b-payload")
    assert outcome["b_at"] - start == pytest.approx(5.5)
    assert executor.max_running == 1
    stats = scheduler.statistics()
    assert stats.overruns == 1 and stats.failed_dispatches == 1
    assert stats.policy.models["a"].failures == 1
    assert stats.policy.models["a"].costs == ()  # a timed-out run is no cost sample


async def test_cancel_while_queued_never_executes(autojump_clock: trio.testing.MockClock) -> None:
    executor = FakeExecutor()
    scheduler = make(executor)
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        nursery.start_soon(scheduler.submit, "a", "busy")
        await trio.sleep(0.1)
        with trio.move_on_after(0.5) as scope:
            await scheduler.submit("b", "cancelled")
        assert scope.cancelled_caught
        await trio.sleep(2.0)
        await scheduler.aclose()
    assert executed_payloads(executor) == ["busy"]
    assert scheduler.statistics().policy.models["b"].cancelled == 1


async def test_deadline_while_queued_raises_and_never_executes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    executor = FakeExecutor()
    scheduler = make(executor)
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        nursery.start_soon(scheduler.submit, "a", "busy")
        await trio.sleep(0.1)
        deadline = trio.current_time() + 0.5
        with pytest.raises(DeadlineExceeded, match="deadline passed"):
            await scheduler.submit("b", "late", deadline=deadline)
        assert trio.current_time() == pytest.approx(deadline)
        await scheduler.aclose()
    assert executed_payloads(executor) == ["busy"]


async def test_cancel_while_running_drops_only_that_result(
    autojump_clock: trio.testing.MockClock,
) -> None:
    executor = FakeExecutor()
    scheduler = make(executor)
    kept: list[Any] = []

    async def patient() -> None:
        kept.append(await scheduler.submit("a", "kept"))

    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        nursery.start_soon(scheduler.submit, "c", "first")  # occupies the device
        await trio.sleep(0.1)
        nursery.start_soon(patient)
        await trio.sleep(0.1)
        with trio.move_on_after(1.0) as scope:  # a's batch starts at 1.0, ends at 2.0
            await scheduler.submit("a", "dropped")
        assert scope.cancelled_caught
        await scheduler.aclose()
    batch = executor.executed[1][1]
    assert [r.payload for r in batch.requests] == ["kept", "dropped"]  # it did execute
    assert kept == [("out", "kept")]


async def test_edf_sheds_what_cannot_finish(autojump_clock: trio.testing.MockClock) -> None:
    executor = FakeExecutor()
    scheduler = make(executor, discipline="edf")
    scheduler.seed_cost("a", 1, 1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        with pytest.raises(DeadlineExceeded, match="shed at dispatch"):
            await scheduler.submit("a", "x", deadline=trio.current_time() + 0.5)
        assert await scheduler.submit("a", "y", deadline=trio.current_time() + 1.5) == (
            "out",
            "y",
        )
        await scheduler.aclose()
    assert scheduler.statistics().policy.shed == 1


async def test_executor_failures_become_request_errors(
    autojump_clock: trio.testing.MockClock,
) -> None:
    executor = FakeExecutor()
    executor.fail["a"] = RuntimeError("device on fire")
    executor.short.add("b")
    executor.prepare_fail["c"] = NotResident("model 'c': weights are not on the device")
    scheduler = make(executor)
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        with pytest.raises(
            ExecutionFailed, match=r"'a': executing the batch failed \(RuntimeError\)"
        ):
            await scheduler.submit("a", 1)
        with pytest.raises(ExecutionFailed, match="returned 0 results for 1 requests"):
            await scheduler.submit("b", 1)
        with pytest.raises(NotResident, match="not on the device"):
            await scheduler.submit("c", 1)
        executor.fail.clear()
        assert await scheduler.submit("a", 2) == ("out", 2)  # the loop carries on
        await scheduler.aclose()
    assert scheduler.statistics().failed_dispatches == 3


async def test_shutdown(autojump_clock: trio.testing.MockClock) -> None:
    executor = FakeExecutor()
    scheduler = make(executor)
    got: dict[str, Any] = {}

    async def call(name: str) -> None:
        try:
            got[name] = await scheduler.submit(name, name)
        except Unavailable as exc:
            got[name] = exc

    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        nursery.start_soon(call, "a")  # running when we close
        await trio.sleep(0.1)
        nursery.start_soon(call, "b")  # queued when we close
        await trio.sleep(0.1)
        closed_at = trio.current_time()
        await scheduler.aclose()  # waits for the running execution
        assert trio.current_time() == pytest.approx(1.0)
        assert closed_at < 1.0
        with pytest.raises(Unavailable, match="shutting down"):
            await scheduler.submit("c", "late")
    assert got["a"] == ("out", "a")
    assert isinstance(got["b"], Unavailable) and "shutting down" in str(got["b"])
    assert scheduler.health is Health.CLOSED and not scheduler.ready
    assert executed_payloads(executor) == ["a"]


async def test_leaving_the_nursery_fails_everything_waiting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    executor = FakeExecutor()
    scheduler = make(executor)
    errors: list[BaseException] = []

    async def call(name: str) -> None:
        try:
            await scheduler.submit(name, name)
        except Unavailable as exc:
            errors.append(exc)

    async with trio.open_nursery() as outer:
        outer.start_soon(call, "a")
        outer.start_soon(call, "b")
        with trio.move_on_after(0.5):
            async with trio.open_nursery() as nursery:
                await nursery.start(scheduler.run)
                await trio.sleep_forever()
    assert len(errors) == 2  # the running one (cut short) and the queued one
    assert scheduler.health is Health.CLOSED


async def test_remove_model_fails_its_queue(autojump_clock: trio.testing.MockClock) -> None:
    executor = FakeExecutor()
    scheduler = make(executor)
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        nursery.start_soon(scheduler.submit, "a", "busy")
        await trio.sleep(0.1)

        async def unload_soon() -> None:
            await trio.sleep(0.1)
            scheduler.remove_model("b")

        nursery.start_soon(unload_soon)
        with pytest.raises(NotFound, match="'b' was unloaded"):
            await scheduler.submit("b", "queued")
        await scheduler.aclose()


async def test_update_model_refuses_what_no_longer_fits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    executor = FakeExecutor()
    scheduler = make(executor)
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        nursery.start_soon(scheduler.submit, "a", "busy")
        await trio.sleep(0.1)

        async def shrink_soon() -> None:
            await trio.sleep(0.1)
            scheduler.update_model("b", compiled_batch_sizes=[1, 2])

        nursery.start_soon(shrink_soon)
        with pytest.raises(reactantserver.errors.InvalidArgument, match="extent of 4"):
            await scheduler.submit("b", "big", rows=4)
        await scheduler.aclose()


async def test_prefetch_starts_while_a_batch_executes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    executor = PrefetchingExecutor()
    scheduler = make(executor, discipline="fifo")
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        nursery.start_soon(scheduler.submit, "a", 1)
        await trio.sleep(0.1)
        nursery.start_soon(scheduler.submit, "b", 2)  # queued while "a" runs
        await trio.sleep(0.1)
        nursery.start_soon(scheduler.submit, "c", 3)
        await trio.sleep(3.0)
        await scheduler.aclose()
    # During a's run nothing else was queued yet; b's run prefetches c.
    assert [m for _, m in executor.prefetched] == ["c"]
    assert executor.prefetched[0][0] == pytest.approx(1.0)
    assert scheduler.peek_next() is None


# ------------------------------------------------- the table: withdraw and deadlines (issue 16)


def answers_into(got: dict[str, Any], name: str) -> Callable[[Any, BaseException | None], None]:
    """An ``answer`` callback recording what the dispatch loop answered for ``name``."""

    def answer(value: Any, error: BaseException | None) -> None:
        assert name not in got, f"{name} was answered twice"
        got[name] = error if error is not None else value

    return answer


async def test_a_request_withdrawn_while_queued_never_executes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    executor = FakeExecutor()
    scheduler = make(executor)
    got: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        scheduler.enqueue("a", "running", answer=answers_into(got, "running"))
        await trio.sleep(0.1)  # "running" is on the device until t=1
        queued = scheduler.enqueue("a", "queued", answer=answers_into(got, "queued"))
        assert scheduler.admitted == 2
        scheduler.withdraw(queued)  # synchronous: it leaves the table at once
        assert scheduler.admitted == 1
        await trio.sleep(5)
        scheduler.close()
    assert got == {"running": ("out", "running")}
    assert executed_payloads(executor) == ["running"]
    assert scheduler.statistics().policy.models["a"].cancelled == 1


async def test_a_request_withdrawn_while_executing_has_its_result_dropped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    executor = FakeExecutor()
    scheduler = make(executor)
    got: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        left = scheduler.enqueue("a", "left", answer=answers_into(got, "left"))
        scheduler.enqueue("a", "stayed", answer=answers_into(got, "stayed"))
        await trio.sleep(0.1)
        assert scheduler.statistics().executing == "a"  # both in one batch on the device
        scheduler.withdraw(left)
        assert scheduler.admitted == 1  # its slot is free at once
        await trio.sleep(5)
        scheduler.close()
    assert got == {"stayed": ("out", "stayed")}  # never answered: dropped, not delivered
    assert executed_payloads(executor) == ["left", "stayed"]


async def test_a_deadline_passing_while_queued_is_answered_by_the_loop_at_that_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The loop sleeps until the soonest queued deadline even while the device is busy:
    the late request is answered DEADLINE_EXCEEDED at its deadline, not when the batch
    ahead of it returns, and it never executes."""
    executor = FakeExecutor(cost=lambda b: 10.0)
    scheduler = make(executor)
    got: dict[str, Any] = {}
    answered_at: dict[str, float] = {}

    def timed(name: str) -> Callable[[Any, BaseException | None], None]:
        record = answers_into(got, name)

        def answer(value: Any, error: BaseException | None) -> None:
            answered_at[name] = trio.current_time()
            record(value, error)

        return answer

    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        t0 = trio.current_time()
        scheduler.enqueue("a", "long", answer=timed("long"))
        await trio.sleep(0)
        scheduler.enqueue("b", "late", answer=timed("late"), deadline=t0 + 2.5)
        scheduler.enqueue("b", "patient", answer=timed("patient"), deadline=t0 + 60)
        await trio.sleep(30)
        scheduler.close()
    assert isinstance(got["late"], DeadlineExceeded)
    assert str(got["late"]) == "model 'b': deadline passed after 2.500 s waiting for the device"
    assert answered_at["late"] == pytest.approx(t0 + 2.5)
    assert got["patient"] == ("out", "patient")
    assert executed_payloads(executor) == ["long", "patient"]
    assert scheduler.statistics().policy.models["b"].shed == 1


async def test_submit_raises_deadline_exceeded_at_its_deadline_without_a_timer_of_its_own(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``submit`` opens no cancel scope: the loop's answer is what ends the wait."""
    executor = FakeExecutor(cost=lambda b: 20.0)
    scheduler = make(executor)
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        nursery.start_soon(scheduler.submit, "a", "blocker")
        await trio.sleep(0.1)
        t0 = trio.current_time()
        with pytest.raises(DeadlineExceeded, match="waiting for the device"):
            await scheduler.submit("b", "x", deadline=t0 + 1.0)
        assert trio.current_time() == pytest.approx(t0 + 1.0)
        scheduler.close()


# ------------------------------------------------------------ inline or the device thread


class BlockingFake:
    """A ``BlockingExecutor``: ``run`` blocks (on ``gate`` when set) and notes its thread."""

    def __init__(self) -> None:
        import threading

        self.threads: list[tuple[str, str]] = []
        self.gate: Any = None
        self.ran_batches: list[int] = []
        self._main = threading.main_thread().name
        self._threading = threading

    async def prepare(self, batch: Batch) -> None:
        pass

    def run(self, batch: Batch) -> Sequence[Any]:
        where = self._threading.current_thread().name
        self.threads.append((batch.model, where))
        if self.gate is not None and batch.model == "slow":
            assert self.gate.wait(60), "the test never opened the gate"
        return [("out", r.payload) for r in batch.requests]

    def ran(self, batch: Batch) -> None:
        self.ran_batches.append(batch.seq)


async def test_tiny_programs_run_inline_and_slow_or_unmeasured_ones_on_the_device_thread() -> None:
    executor = BlockingFake()
    scheduler = Scheduler(
        SchedulerConfig(inline_max_seconds=0.001), executor, inline_max_seconds=None
    )
    scheduler.add_model("tiny", [1])
    scheduler.add_model("slow", [1])
    scheduler.add_model("unmeasured", [1])
    scheduler.seed_cost("tiny", 1, 0.0002)
    scheduler.seed_cost("slow", 1, 0.5)  # learned slow: never inline
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        for name in ("tiny", "slow", "unmeasured"):
            assert await scheduler.submit(name, name) == ("out", name)
        scheduler.close()
    where = dict(executor.threads)
    assert where["tiny"] == executor._main  # on the dispatch loop's own thread
    assert where["slow"] == "reactantserver-device"
    assert where["unmeasured"] == "reactantserver-device"
    stats = scheduler.statistics()
    assert (stats.inline_dispatches, stats.threaded_dispatches) == (1, 2)
    assert len(executor.ran_batches) == 3  # ``ran`` back on the loop after every run


async def test_a_program_whose_cost_grows_past_the_threshold_leaves_the_loop() -> None:
    """The threshold reads the learned cost: one slow run moves the EMA past it, and the
    next batch goes to the device thread."""
    executor = BlockingFake()
    config = SchedulerConfig(inline_max_seconds=0.001, cost_ema_alpha=1.0)
    scheduler = Scheduler(config, executor)
    scheduler.add_model("m", [1])
    scheduler.seed_cost("m", 1, 0.0001)
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        await scheduler.submit("m", 1)
        scheduler.policy.seed_cost("m", 1, 0.01)  # as if the last run had taken 10 ms
        await scheduler.submit("m", 2)
        scheduler.close()
    assert [where for _, where in executor.threads] == [
        executor._main,
        "reactantserver-device",
    ]


async def test_the_dispatch_timeout_fires_for_a_threaded_execution(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The device thread blocks past ``dispatch_timeout_seconds``: the batch's caller gets
    ExecutionFailed at the timeout, the loop is OVERRUN (new work refused) until the
    thread returns, and only then does the next batch run."""
    import threading

    executor = BlockingFake()
    executor.gate = threading.Event()
    scheduler = Scheduler(SchedulerConfig(dispatch_timeout_seconds=5.0), executor)
    scheduler.add_model("slow", [1])
    scheduler.add_model("tiny", [1])
    scheduler.seed_cost("slow", 1, 1.0)
    # Inline: on virtual time a real thread's run may look like any length of time.
    scheduler.seed_cost("tiny", 1, 1e-6)
    got: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        t0 = trio.current_time()
        scheduler.enqueue("slow", "stuck", answer=answers_into(got, "stuck"))
        while "stuck" not in got:
            await trio.sleep(0.5)
        assert trio.current_time() - t0 == pytest.approx(5.0, abs=0.5)
        assert isinstance(got["stuck"], ExecutionFailed)
        assert "dispatch_timeout_seconds=5.0" in str(got["stuck"])
        assert scheduler.health is Health.OVERRUN and not scheduler.ready
        with pytest.raises(Unavailable, match="still busy"):
            scheduler.enqueue("tiny", "refused", answer=answers_into(got, "refused"))
        executor.gate.set()  # the device returns
        while scheduler.health is not Health.READY:
            await trio.sleep(0.5)
        assert await scheduler.submit("tiny", "after") == ("out", "after")
        scheduler.close()
    assert [m for m, _ in executor.threads] == ["slow", "tiny"]
    assert scheduler.statistics().overruns == 1


async def test_on_batch_is_called_once_per_batch_that_reached_the_device(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``on_batch(batch, seconds)`` runs on the loop right after ``policy.complete``,
    once per batch that reached the device -- ok, failed, short, overrun -- with the
    seconds the batch is charged; a batch whose prepare failed never reached it."""
    executor = FakeExecutor(cost=lambda b: {"a": 1.0, "b": 0.5, "c": 9.0}[b.model])
    scheduler_box: list[Scheduler] = []
    seen: list[tuple[str, int, float, int]] = []

    def on_batch(batch: Batch, seconds: float) -> None:
        # Right after complete: the policy has already counted this batch.
        stats = scheduler_box[0].policy.statistics(trio.current_time()).models[batch.model]
        seen.append((batch.model, batch.size, seconds, stats.dispatches + stats.failures))
        raise RuntimeError("a broken hook does not disturb the loop")

    scheduler = Scheduler(
        SchedulerConfig(dispatch_timeout_seconds=5.0), executor, on_batch=on_batch
    )
    scheduler_box.append(scheduler)
    for name in ("a", "b", "c", "d"):
        scheduler.add_model(name, [1, 2, 4])
    executor.short.add("b")
    executor.prepare_fail["d"] = RuntimeError("no weights")
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        assert await scheduler.submit("a", 1) == ("out", 1)
        with pytest.raises(ExecutionFailed):
            await scheduler.submit("b", 1)
        with pytest.raises(ExecutionFailed):
            await scheduler.submit("c", 1)  # overruns at 5 s, returns at 9 s
        await trio.sleep(5.0)
        assert scheduler.ready
        with pytest.raises(ExecutionFailed):
            await scheduler.submit("d", 1)  # prepare failed: never on the device
        await scheduler.aclose()
    assert [(m, n) for m, n, _, _ in seen] == [("a", 1), ("b", 1), ("c", 1)]
    assert [s for _, _, s, _ in seen] == pytest.approx([1.0, 0.5, 9.0])
    assert all(counted >= 1 for *_, counted in seen)
