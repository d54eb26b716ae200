"""The host loop's pass (``scheduling/dispatch.py``, "A lone request needs none of the
loop's machinery"): tiny batches run without waking the dispatch loop.

The host loop is a fake the test drives: ``soon`` queues the pass, and the test runs
what is queued when it says the host loop takes its next pass. Whether the dispatch loop
was woken is read with a Trio instrument (the steps its task takes), so nothing private
is looked at.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from reactantserver.config import SchedulerConfig
from reactantserver.errors import DeadlineExceeded, InvalidArgument, NotFound, Unavailable
from reactantserver.scheduling import Batch, Scheduler


class HostLoop:
    """The fake host loop: ``soon`` queues, :meth:`next_pass` runs what was queued."""

    def __init__(self) -> None:
        self.ready: list[Callable[[], object]] = []

    def soon(self, fn: Callable[[], object]) -> bool:
        self.ready.append(fn)
        return True

    def next_pass(self) -> int:
        """Run the callbacks queued before this pass (those they queue wait for the
        next one, as asyncio's do); how many ran."""
        ready, self.ready = self.ready, []
        for fn in ready:
            fn()
        return len(ready)


class Steps(trio.abc.Instrument):
    """Counts the steps of the dispatch loop's task (the task running ``Scheduler.run``)."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("Scheduler.run"):
            self.steps += 1


class Device:
    """A blocking executor: ``run`` answers ``("out", payload)``; counts executions and
    checks that two never overlap; ``at_hand`` says which models' weights
    ``prepare_now`` finds (the others need the awaited ``prepare``)."""

    def __init__(self, at_hand: Sequence[str] = ("tiny",)) -> None:
        self.at_hand = set(at_hand)
        self.batches: list[tuple[str, list[Any], str]] = []
        self.running = 0
        self.prepared_now: list[int] = []
        self.prepared: list[int] = []
        self.released: list[int] = []
        self.main = threading.current_thread().name

    async def prepare(self, batch: Batch) -> None:
        self.prepared.append(batch.seq)

    def prepare_now(self, batch: Batch) -> bool:
        if batch.model not in self.at_hand:
            return False
        self.prepared_now.append(batch.seq)
        return True

    def run(self, batch: Batch) -> Sequence[Any]:
        self.running += 1
        assert self.running == 1, "two executions at once"
        try:
            payloads = [r.payload for r in batch.requests]
            self.batches.append((batch.model, payloads, threading.current_thread().name))
            return [("out", p) for p in payloads]
        finally:
            self.running -= 1

    def ran(self, batch: Batch) -> None:
        self.released.append(batch.seq)


def scheduler_for(
    device: Device,
    host: HostLoop | None,
    send: Callable[[], object] | None = None,
    **config: Any,
) -> Scheduler:
    config.setdefault("inline_max_seconds", 0.001)
    scheduler = Scheduler(
        SchedulerConfig(**config), device, soon=host.soon if host is not None else None, send=send
    )
    for name, cost in (("tiny", 1e-5), ("slow", 1.0), ("cold", 1e-5)):
        scheduler.add_model(name, [1, 2, 4])
        for size in (1, 2, 4):
            scheduler.seed_cost(name, size, cost)
    return scheduler


def answers_into(
    got: dict[Any, Any], key: Any, event: trio.Event | None = None
) -> Callable[[Any, BaseException | None], None]:
    def answer(value: Any, error: BaseException | None) -> None:
        assert key not in got, f"{key!r} answered twice"
        got[key] = error if error is not None else value
        if event is not None:
            event.set()

    return answer


@pytest.fixture
def steps() -> Steps:
    return Steps()


async def asleep(steps: Steps) -> int:
    """Let the dispatch loop reach its sleep; the steps it took so far."""
    await trio.testing.wait_all_tasks_blocked()
    return steps.steps


async def test_a_lone_tiny_request_is_answered_by_one_pass_without_waking_the_loop(
    autojump_clock: trio.testing.MockClock, steps: Steps
) -> None:
    trio.lowlevel.add_instrument(steps)
    host, device = HostLoop(), Device()
    scheduler = scheduler_for(device, host)
    got: dict[Any, Any] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        before = await asleep(steps)
        scheduler.enqueue("tiny", "x", answer=answers_into(got, "x"))
        assert got == {} and len(host.ready) == 1  # one pass armed, nothing run yet
        assert host.next_pass() == 1
        assert got == {"x": ("out", "x")}  # answered inside the pass
        assert await asleep(steps) == before  # the dispatch loop never woke
        scheduler.close()
    assert device.batches == [("tiny", ["x"], device.main)]
    assert device.prepared_now == device.released and device.prepared == []
    stats = scheduler.statistics()
    assert (stats.passed_dispatches, stats.inline_dispatches, stats.threaded_dispatches) == (
        1,
        1,
        0,
    )
    assert stats.lone_dispatches == 1  # it came alone: it never entered the queue
    assert stats.policy.models["tiny"].dispatches == 1  # the policy learned as ever


async def test_with_send_a_lone_answer_is_sent_before_its_batch_is_released(
    autojump_clock: trio.testing.MockClock, steps: Steps
) -> None:
    """With ``send`` given, the lone lane answers its request, sends, and only then
    accounts the batch: the policy's ``complete``, then the executor's ``ran`` (weights
    released, the batch's statistics). Requests that coalesce are the pass's ordinary
    batch: accounted and released before they are answered, and sent as the pass returns
    (``send`` is not called)."""
    host, device = HostLoop(), Device()
    events: list[str] = []
    released = device.ran

    def learned() -> int:
        return policy.statistics(0.0).models["tiny"].dispatches  # the core itself: no settling

    def ran(batch: Batch) -> None:
        events.append(f"ran {batch.seq} after {learned()} dispatches")
        released(batch)

    device.ran = ran  # type: ignore[method-assign]
    scheduler = scheduler_for(device, host, send=lambda: events.append("send"))
    policy = scheduler.policy

    def answer(key: str) -> Callable[[Any, BaseException | None], None]:
        def answered(value: Any, error: BaseException | None) -> None:
            events.append(f"answer {key} after {learned()} dispatches")

        return answered

    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        await asleep(steps)
        scheduler.enqueue("tiny", "x", answer=answer("x"))
        host.next_pass()
        assert events == ["answer x after 0 dispatches", "send", "ran 0 after 1 dispatches"]
        events.clear()
        scheduler.enqueue("tiny", "y", answer=answer("y"))
        scheduler.enqueue("tiny", "z", answer=answer("z"))
        host.next_pass()
        assert events == [
            "ran 1 after 1 dispatches",
            "answer y after 2 dispatches",
            "answer z after 2 dispatches",
        ]
        scheduler.close()
    stats = scheduler.statistics()
    assert stats.lone_dispatches == 1 and stats.passed_dispatches == 2
    assert device.prepared_now == device.released == [0, 1]


@pytest.mark.parametrize("reach", ["update_model", "statistics", "enqueue"])
async def test_what_a_lone_answer_sets_off_finds_its_batch_accounted(
    autojump_clock: trio.testing.MockClock, steps: Steps, reach: str
) -> None:
    """The lone lane accounts its batch after the answer's send, yet whatever the answer's
    callback asks of the scheduler finds it accounted, as for any other batch: a version
    swap's ``update_model`` (new sizes forget the learned costs) comes after the batch's
    cost sample, so the new sizes never learn the old program's cost; a read sees it
    completed; a new request is admitted behind it, alone, for the next pass."""
    host, device = HostLoop(), Device()
    sent: list[str] = []
    scheduler = scheduler_for(device, host, send=lambda: sent.append("send"))
    got: dict[Any, Any] = {}
    seen: list[Any] = []

    def answered(value: Any, error: BaseException | None) -> None:
        got["x"] = value
        if reach == "update_model":
            scheduler.update_model("tiny", compiled_batch_sizes=[1, 2, 4, 8])
        elif reach == "statistics":
            stats = scheduler.statistics().policy
            seen.append((stats.running, stats.models["tiny"].dispatches))
        else:
            scheduler.enqueue("tiny", "y", answer=answers_into(got, "y"))
        seen.append(list(device.released))

    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        await asleep(steps)
        scheduler.enqueue("tiny", "x", answer=answered)
        host.next_pass()
        if reach == "enqueue":
            assert "y" not in got and host.next_pass() == 1
        scheduler.close()
    model = scheduler.statistics().policy.models["tiny"]
    if reach == "update_model":
        assert model.costs == () and model.dispatches == 1  # sampled, then forgotten
    elif reach == "statistics":
        assert seen[0] == (None, 1)  # completed, nothing running
    else:
        assert got["y"] == ("out", "y") and model.dispatches == 2
        assert scheduler.statistics().lone_dispatches == 2
    assert seen[-1] == [0]  # released before the callback went on
    assert got["x"] == ("out", "x") and sent[0] == "send"


async def test_a_burst_in_one_callback_is_one_batch(
    autojump_clock: trio.testing.MockClock, steps: Steps
) -> None:
    """Requests queued by the same callback (one read of a connection) coalesce: the pass
    runs after that callback, so it finds them all."""
    host, device = HostLoop(), Device()
    scheduler = scheduler_for(device, host)
    got: dict[Any, Any] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        await asleep(steps)
        for i in range(4):
            scheduler.enqueue("tiny", i, answer=answers_into(got, i))
        assert len(host.ready) == 1  # armed once
        host.next_pass()
        assert got == {i: ("out", i) for i in range(4)}
        scheduler.close()
    assert device.batches == [("tiny", [0, 1, 2, 3], device.main)]
    # The first was held alone until the second came; then both were the queue's.
    assert scheduler.statistics().lone_dispatches == 0


@pytest.mark.parametrize("reader", ["statistics", "withdraw", "remove_model", "update_model"])
async def test_a_request_held_alone_is_queued_before_anything_else_touches_the_policy(
    autojump_clock: trio.testing.MockClock, steps: Steps, reader: str
) -> None:
    """A request that came alone is held for the pass, out of the queue; whatever reads or
    changes the scheduler's policy before that pass first queues it, as ``submit`` would
    have: a reader sees it queued, a withdrawal cancels it, a model's removal or update
    refuses it as it refuses queued requests. The pass then finds the queue."""
    host, device = HostLoop(), Device()
    scheduler = scheduler_for(device, host)
    got: dict[Any, Any] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        await asleep(steps)
        request = scheduler.enqueue("tiny", "x", answer=answers_into(got, "x"))
        if reader == "statistics":
            assert scheduler.statistics().policy.models["tiny"].queue_depth == 1
        elif reader == "withdraw":
            scheduler.withdraw(request)
        elif reader == "remove_model":
            scheduler.remove_model("tiny")
        else:
            scheduler.update_model("tiny", compiled_batch_sizes=[2, 4], coalescable=False)
        host.next_pass()
        scheduler.close()
    stats = scheduler.statistics()
    assert stats.lone_dispatches == 0
    if reader == "statistics":
        assert got == {"x": ("out", "x")} and stats.passed_dispatches == 1
    elif reader == "withdraw":
        assert got == {} and stats.policy.models["tiny"].cancelled == 1
    elif reader == "remove_model":
        assert isinstance(got["x"], NotFound) and "tiny" not in stats.policy.models
    else:
        assert isinstance(got["x"], InvalidArgument)
    assert device.prepared_now == device.released


async def test_a_pass_is_not_put_off_while_requests_keep_arriving(
    autojump_clock: trio.testing.MockClock, steps: Steps
) -> None:
    """A pass runs what is queued when it runs, however many requests arrive between
    passes: a burst that trickles in over several reads is answered as it comes, each
    pass's batch what came before it. (A pass that waited while requests kept arriving
    convoyed a closed loop's clients: the dispatch module's docstring.)"""
    host, device = HostLoop(), Device()
    scheduler = scheduler_for(device, host, max_queue_depth=1000)
    scheduler.add_model("wide", [64])
    scheduler.seed_cost("wide", 64, 1e-5)
    device.at_hand.add("wide")
    got: dict[Any, Any] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        await asleep(steps)
        scheduler.enqueue("wide", 0, answer=answers_into(got, 0))
        for i in range(1, 5):  # one more request before every pass of the host loop
            scheduler.enqueue("wide", i, answer=answers_into(got, i))
            host.next_pass()
            assert sorted(got) == list(range(i + 1))  # everything queued before the pass
        scheduler.close()
    assert [b[1] for b in device.batches] == [[0, 1], [2], [3], [4]]


async def test_what_is_not_tiny_or_not_at_hand_is_handed_to_the_loop(steps: Steps) -> None:
    """A batch learned slow goes to the device thread, one whose weights are not at hand
    to the loop's awaited ``prepare``: the pass hands each to the loop (one wake-up) and
    the loop runs it as its next batch."""
    host, device = HostLoop(), Device()
    scheduler = scheduler_for(device, host)
    got: dict[Any, Any] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        for model in ("slow", "cold"):
            before = await asleep(steps)
            answered = trio.Event()
            scheduler.enqueue(model, model, answer=answers_into(got, model, answered))
            host.next_pass()
            assert model not in got  # handed over, not run by the pass
            with trio.fail_after(30):
                await answered.wait()
            assert steps.steps > before  # the loop woke for it
        scheduler.close()
    where = {model: thread for model, _, thread in device.batches}
    assert where == {"slow": "reactantserver-device", "cold": device.main}
    assert device.prepared_now == [] and len(device.prepared) == 2
    assert scheduler.statistics().passed_dispatches == 0


async def test_while_the_loop_is_busy_no_pass_is_armed(steps: Steps) -> None:
    """A request that comes while a batch runs on the device thread waits for the loop,
    which takes it next: one execution at a time."""
    host, device = HostLoop(), Device()
    gate = threading.Event()
    run = device.run

    def held(batch: Batch) -> Sequence[Any]:
        if batch.model == "slow":
            assert gate.wait(60)
        return run(batch)

    device.run = held  # type: ignore[method-assign]
    scheduler = scheduler_for(device, host)
    got: dict[Any, Any] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        await asleep(steps)
        scheduler.enqueue("slow", "s", answer=answers_into(got, "s"))
        host.next_pass()  # handed to the loop: on the device thread now
        await trio.testing.wait_all_tasks_blocked()
        answered = trio.Event()
        scheduler.enqueue("tiny", "t", answer=answers_into(got, "t", answered))
        assert host.ready == []  # the loop is not asleep: no pass
        gate.set()
        with trio.fail_after(30):
            await answered.wait()
        scheduler.close()
    assert [m for m, _, _ in device.batches] == ["slow", "tiny"]


async def test_without_a_host_loop_the_loop_is_woken_as_before(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``soon`` says there is no host loop (plain Trio): every request is the loop's."""
    device = Device()
    scheduler = Scheduler(SchedulerConfig(inline_max_seconds=0.001), device, soon=lambda fn: False)
    scheduler.add_model("tiny", [1])
    scheduler.seed_cost("tiny", 1, 1e-5)
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        for i in range(3):
            assert await scheduler.submit("tiny", i) == ("out", i)
        scheduler.close()
    stats = scheduler.statistics()
    assert (stats.passed_dispatches, stats.inline_dispatches) == (0, 3)
    assert device.prepared == device.released  # the loop's awaited prepare


async def test_a_pass_fails_what_expired_and_does_nothing_after_close(
    autojump_clock: trio.testing.MockClock, steps: Steps
) -> None:
    host, device = HostLoop(), Device()
    scheduler = scheduler_for(device, host)
    got: dict[Any, Any] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        await asleep(steps)
        now = trio.current_time()
        scheduler.enqueue("tiny", "late", answer=answers_into(got, "late"), deadline=now + 1)
        autojump_clock.jump(2)  # the host loop was slow to come round
        host.next_pass()
        assert isinstance(got["late"], DeadlineExceeded)
        scheduler.enqueue("tiny", "shut", answer=answers_into(got, "shut"))
        scheduler.close()
        host.next_pass()
    assert isinstance(got["shut"], Unavailable)
    assert device.batches == []


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("enqueue"), st.sampled_from(["tiny", "cold", "slow"])),
            st.just(("pass",)),
            st.just(("loop",)),
            st.tuples(st.just("withdraw"), st.integers(0, 40)),
            st.tuples(st.just("chain"), st.sampled_from(["tiny", "cold", "slow"])),
        ),
        max_size=40,
    ),
    st.booleans(),
)
def test_any_interleaving_answers_each_request_once_in_order_one_execution_at_a_time(
    ops: list[tuple[Any, ...]], sends: bool
) -> None:
    """Whatever the interleaving of requests, host-loop passes, dispatch-loop turns and
    withdrawals, with or without ``send`` (the lone lane then answers before it
    accounts), and with answers that queue a request of their own from inside their
    callback: every request not withdrawn is answered exactly once, with its own result;
    each model's requests execute in the order they were queued; no two executions
    overlap (``Device.run`` asserts it); and every batch a pass or the loop ran had its
    weights released (``ran``) as often as acquired."""

    async def main() -> None:
        host, device = HostLoop(), Device()
        scheduler = scheduler_for(
            device, host, send=(lambda: None) if sends else None, inline_max_seconds=math.inf
        )
        got: dict[Any, Any] = {}
        requests: list[tuple[str, Any]] = []
        withdrawn = set()

        def enqueue(model: str, chained: bool) -> None:
            key = len(requests)
            answer = answers_into(got, key)
            if chained:  # its answer queues the next request, from inside the callback

                def answer(value: Any, error: BaseException | None, plain: Any = answer) -> None:
                    plain(value, error)
                    enqueue(model, False)

            requests.append((model, None))
            requests[key] = (model, scheduler.enqueue(model, key, answer=answer))

        async with trio.open_nursery() as nursery:
            await nursery.start(scheduler.run)
            for op in ops:
                if op[0] in ("enqueue", "chain"):
                    enqueue(op[1], op[0] == "chain")
                elif op[0] == "pass":
                    host.next_pass()
                elif op[0] == "loop":
                    await trio.testing.wait_all_tasks_blocked()
                elif requests:
                    key = op[1] % len(requests)
                    if key not in got:
                        scheduler.withdraw(requests[key][1])
                        withdrawn.add(key)
            while len(got) + len(withdrawn - set(got)) < len(requests):
                host.next_pass()
                await trio.testing.wait_all_tasks_blocked()
            scheduler.close()
        for key in range(len(requests)):
            if key not in withdrawn:
                assert got[key] == ("out", key)
        for model in ("tiny", "cold", "slow"):
            ran = [p for m, payloads, _ in device.batches if m == model for p in payloads]
            assert ran == sorted(ran)
        assert sorted(device.released) == sorted(device.prepared + device.prepared_now)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_in_a_guest_run_the_host_loop_runs_the_pass_and_the_loop_sleeps_on() -> None:
    """The real host loop (``transport.guest``): ``call_soon`` is True inside a guest run
    and the pass answers a lone tiny request while the dispatch loop's task takes no
    step; outside a guest run ``call_soon`` says False and schedules nothing."""
    from reactantserver.transport import guest

    assert guest.call_soon(lambda: None) is False
    steps = Steps()

    async def main() -> tuple[int, int, Any]:
        device = Device()
        scheduler = Scheduler(
            SchedulerConfig(inline_max_seconds=0.001), device, soon=guest.call_soon
        )
        scheduler.add_model("tiny", [1])
        scheduler.seed_cost("tiny", 1, 1e-5)
        async with trio.open_nursery() as nursery:
            await nursery.start(scheduler.run)
            before = await asleep(steps)
            answered = trio.Event()
            got: dict[Any, Any] = {}
            scheduler.enqueue("tiny", "x", answer=answers_into(got, "x", answered))
            await answered.wait()
            after = steps.steps
            scheduler.close()
        return before, after, got["x"]

    before, after, value = guest.run(main, instruments=[steps])
    assert value == ("out", "x") and after == before
