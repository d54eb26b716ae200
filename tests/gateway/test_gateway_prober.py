"""The prober's time rules, in virtual time: wedge exit counted in seconds, start-up lines.

The prober is given a fake round (``gather``: what every worker answered) through its
constructor, and runs on plain Trio with the ``autojump_clock``; a "traffic" task asks for
rounds the way the request path does (:class:`~reactantserver.gateway.prober.Refresher`
lets through one a second). ``WedgeWatch`` itself is checked on plain numbers. Last, the replay of shared-memory
registrations to a worker against a client's unregister, on asyncio with a fake worker.
"""

from __future__ import annotations

import asyncio
import logging
import types

import pytest
import trio
import trio.testing
from clocks import VirtualClockLoop
from hypothesis import given
from hypothesis import strategies as st

from reactantserver.errors import NotFound
from reactantserver.gateway.calls import CallInfo
from reactantserver.gateway.channel import Reply
from reactantserver.gateway.core.routing import RoundRobinRouter
from reactantserver.gateway.core.table import ModelSnapshot, WorkerSnapshot
from reactantserver.gateway.fanout import FanOut
from reactantserver.gateway.pool import WorkerClient
from reactantserver.gateway.prober import (
    STARTUP_GRACE_SECONDS,
    GatewayWedged,
    LoopLag,
    Prober,
    Registrations,
    WedgeWatch,
    WorkerProbe,
    _replay,
)
from reactantserver.protocol import inference as pb

ADDRESSES = ("127.0.0.1:9001", "127.0.0.1:9002")


class FakeFleet:
    """Two workers that answer ready until ``dies_at`` and not at all after, nor before
    ``starts_at`` (virtual seconds since the fleet was made)."""

    def __init__(self, *, dies_at: float = float("inf"), starts_at: float = 0.0) -> None:
        self.dies_at = dies_at
        self.starts_at = starts_at
        self.t0 = trio.current_time()
        self.rounds: list[float] = []

    async def gather(self) -> list[tuple[WorkerSnapshot, WorkerProbe]]:
        now = trio.current_time() - self.t0
        self.rounds.append(now)
        await trio.sleep(0.01)  # virtual-clock: a round takes a little (autojump) time
        up = self.starts_at <= now < self.dies_at
        out = []
        for i, address in enumerate(ADDRESSES):
            name = f"worker{i}"
            if up:
                snap = WorkerSnapshot(
                    address=address, name=name, models=(ModelSnapshot(name="double"),)
                )
                probe = WorkerProbe(
                    address=address, name=name, answered=True, ready=True, problem=""
                )
            else:
                snap = WorkerSnapshot(address=address, name=name, ready=False)
                probe = WorkerProbe(address=address, name=name, problem="Connect call failed")
            out.append((snap, probe))
        return out


def prober(fleet: FakeFleet, *, interval: float = 10.0, rounds: int = 3) -> Prober:
    clients = [WorkerClient(a, f"worker{i}") for i, a in enumerate(ADDRESSES)]
    return Prober(
        clients,
        RoundRobinRouter(),
        interval=interval,
        wedge_exit_rounds=rounds,
        gather=fleet.gather,
    )


async def traffic(p: Prober, every: float = 1.0) -> None:
    """The request path under load: a round asked for every ``every`` seconds."""
    while True:
        await trio.sleep(every)  # virtual-clock: wedge_time's tests run on autojump
        await p.probe_round()


async def wedge_time(fleet: FakeFleet, *, with_traffic: bool) -> tuple[float, float]:
    """Run a prober over ``fleet`` until it gives up: when it did, and when a worker last
    answered, in seconds since the fleet was made."""
    p = prober(fleet)
    caught: list[GatewayWedged] = []
    try:
        async with trio.open_nursery() as nursery:
            if with_traffic:
                nursery.start_soon(traffic, p)
            await p.run()
    except* GatewayWedged as group:
        caught.extend(e for e in group.exceptions if isinstance(e, GatewayWedged))
    assert len(caught) == 1
    assert "(wedge_exit_rounds 3 x health_interval_seconds 10)" in str(caught[0])
    assert p.wedge.last_answer is not None
    return trio.current_time() - fleet.t0, p.wedge.last_answer - fleet.t0


async def test_traffic_does_not_make_the_gateway_give_up_sooner(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The issue's case: the workers die at 20.5 s; the gateway exits 30 s (3 rounds x
    10 s) after the last answer, with the request path asking for a round every second
    or without it -- one last round at the limit, so a round (0.01 s here) later."""
    quiet = FakeFleet(dies_at=20.5)
    exited, last = await wedge_time(quiet, with_traffic=False)
    assert 20.0 <= last < 20.5  # the periodic round at 20 s
    assert last + 30.0 <= exited <= last + 30.02
    busy = FakeFleet(dies_at=20.5)
    exited_busy, last_busy = await wedge_time(busy, with_traffic=True)
    assert 19.5 <= last_busy < 20.5  # a round the request path asked for, near 20 s
    assert last_busy + 30.0 <= exited_busy <= last_busy + 30.02
    assert len(busy.rounds) > 3 * len(quiet.rounds)  # traffic did ask for many rounds


async def test_no_wedge_before_any_worker_answered_nor_with_the_limit_off(
    autojump_clock: trio.testing.MockClock,
) -> None:
    never = FakeFleet(starts_at=float("inf"))
    with trio.move_on_after(600):
        await prober(never).run()  # workers still starting: waits, never exits
    off = FakeFleet(dies_at=5.0)
    with trio.move_on_after(600):
        await prober(off, rounds=0).run()
    assert trio.current_time() >= 1200


@given(
    limit=st.floats(min_value=0.5, max_value=100.0),
    rounds=st.lists(
        st.tuples(st.floats(min_value=0.0, max_value=50.0), st.booleans()), max_size=30
    ),
)
def test_wedge_watch_counts_seconds_since_the_last_answer(
    limit: float, rounds: list[tuple[float, bool]]
) -> None:
    """After any sequence of rounds (time advancing by the given gaps, each answered or
    not), the watch is wedged exactly when some round was answered and at least ``limit``
    seconds passed since the last answered one -- however many rounds ran meanwhile."""
    watch = WedgeWatch(limit)
    now = 0.0
    last: float | None = None
    for gap, answered in rounds:
        now += gap
        watch.observe(now, answered)
        if answered:
            last = now
        # (``last + limit``, the deadline the prober sleeps until: the same rounding.)
        assert watch.wedged(now) == (last is not None and now >= last + limit)
        if last is not None:
            assert watch.wedged(last + limit) and not watch.wedged(last + limit * 0.99)


@given(
    limit=st.floats(min_value=0.5, max_value=100.0),
    rounds=st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=50.0),
            st.floats(min_value=0.0, max_value=1.0),
            st.booleans(),
        ),
        max_size=30,
    ),
)
def test_wedge_watch_does_not_count_time_the_loop_was_held_up(
    limit: float, rounds: list[tuple[float, float, bool]]
) -> None:
    """After any rounds (time advancing by a gap, of which a fraction the loop was held
    up), the watch is wedged exactly when some round was answered and the time since the
    last answer, less the time held up since, is at least ``limit``."""
    watch = WedgeWatch(limit)
    now = held = 0.0
    last: tuple[float, float] | None = None
    for gap, fraction, answered in rounds:
        now += gap
        held += gap * fraction
        watch.observe(now, answered, held)
        if answered:
            last = (now, held)
        # (had = now - last[0] - (held - last[1]) >= limit, in the deadline's rounding)
        assert watch.wedged(now, held) == (
            last is not None and now >= last[0] + limit + (held - last[1])
        )


class StallingFleet(FakeFleet):
    """Workers that always answer, on a gateway whose own loop is held up for ``stall``
    seconds during every round between ``from_`` and ``until`` (the clock jumps while no
    task runs, as a blocked loop is to them): those rounds time out, answered by no one."""

    def __init__(self, clock: trio.testing.MockClock, stall: float, from_: float, until: float):
        super().__init__()
        self.clock = clock
        self.stall = stall
        self.window = (from_, until)

    async def gather(self) -> list[tuple[WorkerSnapshot, WorkerProbe]]:
        now = trio.current_time() - self.t0
        if not self.window[0] <= now < self.window[1]:
            return await super().gather()
        self.rounds.append(now)
        self.clock.jump(self.stall)  # the loop is held up: nothing runs meanwhile
        return [
            (
                WorkerSnapshot(address=a, name=f"worker{i}", ready=False),
                WorkerProbe(address=a, name=f"worker{i}", problem="deadline exceeded"),
            )
            for i, a in enumerate(ADDRESSES)
        ]


async def test_the_gateways_own_stalls_are_not_the_workers_silence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The issue's case: a request held the gateway's loop 2.5 s, every probe of the round
    missed its deadline, and the gateway exited ("no worker answered for 6.0 s"). Here the
    loop is held up 2.5 s in every round for a minute, against a wedge limit of 3 s: the
    gateway does not exit, and no round takes a worker out of the route table."""
    fleet = StallingFleet(autojump_clock, stall=2.5, from_=10.0, until=70.0)
    p = prober(fleet, interval=1.0, rounds=3)
    served: list[bool] = []
    p._on_table = lambda table: served.append(len(table.replicas("double")) == 2)
    with trio.move_on_after(100):
        await p.run()  # GatewayWedged would fail the test
    assert trio.current_time() - fleet.t0 >= 100
    assert len([r for r in fleet.rounds if 10 <= r < 70]) >= 10
    assert served and all(served)
    assert p.lag is None  # the meter stops with the prober


async def test_a_real_outage_still_ends_the_gateway(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With the meter running and the loop never held up, silence is counted as before:
    workers dead from 20 s, the gateway exits 3 s after the last answer."""
    fleet = FakeFleet(dies_at=20.0)
    p = prober(fleet, interval=1.0, rounds=3)
    with pytest.raises(GatewayWedged, match=r"no worker answered for 3\.0 s"):
        await p.run()
    assert p.wedge.last_answer is not None
    assert p.wedge.last_answer + 3.0 <= trio.current_time() <= p.wedge.last_answer + 3.02


def test_the_loop_lag_meter_counts_late_wake_ups_and_the_one_overdue() -> None:
    lag = LoopLag(0.0, period=0.1)
    lag.beat(0.1)
    lag.beat(0.2)
    assert lag.held(0.25) == 0.0
    lag.beat(2.8)  # woke 2.5 s late
    assert lag.held(2.85) == pytest.approx(2.5)
    assert lag.held(4.0) == pytest.approx(2.5 + 1.1)  # held up again, no beat yet


async def test_a_start_with_workers_still_compiling_reads_healthy(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Workers that answer only after 90 s: no warning, one "still waiting" info line each
    after the grace, then the workers' and the gateway's ready lines."""
    caplog.set_level(logging.INFO, logger="reactantserver.gateway.prober")
    fleet = FakeFleet(starts_at=90.0)
    p = prober(fleet)
    async with trio.open_nursery() as nursery:
        await nursery.start(p.run)
        assert not p.ready()[0]
        await trio.sleep(120)
        nursery.cancel_scope.cancel()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert all(level == "INFO" for level, _ in lines), lines
    waiting = [m for _, m in lines if m.startswith("still waiting")]
    assert waiting == [
        f"still waiting for worker worker{i}, {STARTUP_GRACE_SECONDS + 0.01:.0f} s after the gateway "
        "started: Connect call failed"
        for i in range(2)
    ]
    ready = [m for _, m in lines if "ready" in m and not m.startswith("still")]
    assert ready == [
        "worker worker0 is ready: routing to it",
        "worker worker1 is ready: routing to it",
        "gateway ready: 2 of 2 workers ready",
    ]


class _RegionWorker:
    """A worker's shared-memory table behind the calls the gateway makes; the prober's
    first replayed registration waits for ``release`` (a slow worker)."""

    def __init__(self) -> None:
        self.name = self.address = self.label = "127.0.0.1:9001"
        self.regions: set[str] = set()
        self.release = asyncio.Event()
        self.replay_started = asyncio.Event()

    def statistics(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(connects=1)

    async def call(self, path: bytes, data: bytes, deadline: float, **kw: object) -> Reply:
        if path.endswith(b"Register"):
            if kw.get("probe"):
                self.replay_started.set()
                await self.release.wait()
            self.regions.add(pb.SystemSharedMemoryRegisterRequest().parse(data).name)
        elif path.endswith(b"Unregister"):
            name = pb.SystemSharedMemoryUnregisterRequest().parse(data).name
            self.regions = {r for r in self.regions if name and r != name}
        return Reply(0)


def test_an_unregister_during_a_replay_leaves_no_region_behind() -> None:
    """A region unregistered through the gateway while a probe round is replaying the
    registrations to a worker is gone from that worker afterwards: the replay and the
    fanned-out unregister are ordered, never interleaved (CI once found 'out' left behind)."""

    async def main() -> set[str]:
        worker = _RegionWorker()
        registrations = Registrations()
        for name in ("in", "out"):
            registrations.registered(
                "",
                name,
                bytes(pb.SystemSharedMemoryRegisterRequest(name=name, key="/k", byte_size=4)),
            )
        fleet = types.SimpleNamespace(answering=lambda: (worker,), ready=lambda: (True, ""))
        fanout = FanOut(
            fleet,
            types.SimpleNamespace(worker_call=lambda *a: None),  # type: ignore[arg-type]
            registrations,
            not_served=lambda name: NotFound(name),
            serves=lambda name: True,
        )
        deadline = asyncio.get_running_loop().time() + 5
        replay = asyncio.create_task(_replay(worker, registrations, deadline))  # type: ignore[arg-type]
        await worker.replay_started.wait()
        unregister = asyncio.create_task(
            fanout.shm_unregister(
                bytes(pb.SystemSharedMemoryUnregisterRequest(name="")),
                CallInfo("SystemSharedMemoryUnregister", deadline),
            )
        )
        await asyncio.sleep(0.01)  # virtual-clock: the unregister runs until it waits
        worker.release.set()
        await asyncio.gather(replay, unregister)
        assert registrations.regions == {}
        return worker.regions

    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        assert runner.run(main()) == set()
