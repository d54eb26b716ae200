"""Cost of one scheduling decision as the number of loaded models grows.

A decision is ``SchedulingPolicy.next_batch(now)``: choose the model, plan and take
its batch. The core keeps the models *with queued work* in a dense table, so the
number of models merely loaded must not matter. Rows:

* 10 models loaded, all 10 with queued work
* 1,000 loaded, 100 with queued work
* 10,000 loaded, 100 with queued work

Each run keeps the same models backlogged (every batch taken is resubmitted) so
the candidate count stays fixed, and times ``next_batch`` alone with
``perf_counter_ns``. Target: the 10,000-model row within 2x of the 10-model row.

Then the driver's cost per request (``Scheduler.enqueue`` and the host loop's pass that
runs it, over an executor that answers at once): a request alone -- the lone lane,
which never queues it (docs/scheduling.md) -- and requests two to a callback, which
queue and coalesce. Hot, in a loop: in the server the same code costs three to four times
as much (docs/benchmarks.md, "Where a request's CPU goes at one in flight").

    python benchmarks/bench_scheduler.py      (or: nox -s bench -- scheduler)
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import trio
import trio.testing

from reactantserver.config import SchedulerConfig
from reactantserver.scheduling import Scheduler, SchedulingPolicy

SIZES = (1, 2, 4, 8)
DECISIONS = 20_000
WARMUP = 2_000
ROWS = ((10, 10), (1_000, 100), (10_000, 100))


def measure(discipline: str, loaded: int, busy: int, seed: int = 0) -> list[float]:
    """Nanoseconds per ``next_batch`` over ``DECISIONS`` decisions."""
    rng = random.Random(seed)
    policy = SchedulingPolicy(SchedulerConfig(discipline=discipline))  # type: ignore[arg-type]
    names = [f"model{i:05d}" for i in range(loaded)]
    for name in names:
        policy.add_model(name, SIZES, weight=rng.choice((1.0, 2.0, 4.0)))
        for size in SIZES:
            policy.seed_cost(name, size, 0.001 * size * rng.uniform(0.5, 50.0))
    active = rng.sample(names, busy)
    now = 0.0

    def submit(name: str) -> None:
        deadline = now + rng.uniform(1.0, 100.0) if discipline == "edf" else None
        policy.submit(name, now=now, rows=rng.choice((1, 1, 2, 3)), deadline=deadline)

    for name in active:
        for _ in range(6):
            submit(name)
    samples: list[float] = []
    clock = time.perf_counter_ns
    for i in range(WARMUP + DECISIONS):
        start = clock()
        batch = policy.next_batch(now).batch
        elapsed = clock() - start
        assert batch is not None
        if i >= WARMUP:
            samples.append(elapsed)
        now += 0.001
        policy.complete(batch, 0.001, now)
        for _ in batch.requests:
            submit(batch.model)
    return samples


class _Instant:
    """A blocking executor whose batches take no time (the driver's cost alone)."""

    async def prepare(self, batch: Any) -> None:
        pass

    def prepare_now(self, batch: Any) -> bool:
        return True

    def run(self, batch: Any) -> list[Any]:
        return [r.payload for r in batch.requests]

    def ran(self, batch: Any) -> None:
        pass


def driver_costs(discipline: str, per_callback: int, requests: int = DECISIONS) -> float:
    """Microseconds of ``enqueue`` and the pass per request, ``per_callback`` requests
    queued by each callback (one read of a connection) before its pass."""
    ready: list[Callable[[], object]] = []

    def soon(fn: Callable[[], object]) -> bool:
        ready.append(fn)
        return True

    async def main() -> float:
        config = SchedulerConfig(discipline=discipline, inline_max_seconds=0.001)  # type: ignore[arg-type]
        scheduler = Scheduler(config, _Instant(), soon=soon)
        scheduler.add_model("tiny", SIZES)
        for size in SIZES:
            scheduler.seed_cost("tiny", size, 1e-5)
        answered: list[Any] = []

        def answer(value: Any, error: BaseException | None) -> None:
            answered.append(value)

        def callback() -> None:
            for _ in range(per_callback):
                scheduler.enqueue("tiny", 1, answer=answer)
            passes = ready[:]
            ready.clear()
            for fn in passes:
                fn()

        async with trio.open_nursery() as nursery:
            await nursery.start(scheduler.run)
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(WARMUP):
                callback()
            start = time.perf_counter()
            for _ in range(requests // per_callback):
                callback()
            elapsed = time.perf_counter() - start
            scheduler.close()
        assert len(answered) == (WARMUP + requests // per_callback) * per_callback
        return elapsed / (requests // per_callback * per_callback) * 1e6

    result: float = trio.run(main)
    return result


def main() -> None:
    print(f"one scheduling decision (next_batch), {DECISIONS} decisions per row, median of each")
    print()
    header = (
        f"{'discipline':>10} {'loaded':>8} {'with work':>9} {'median us':>10} "
        f"{'p90 us':>8} {'mean us':>8} {'vs 10-model row':>16}"
    )
    print(header)
    print("-" * len(header))
    verdicts = []
    for discipline in ("fair", "fifo", "edf"):
        base = None
        for loaded, busy in ROWS:
            samples = measure(discipline, loaded, busy)
            median = statistics.median(samples) / 1e3
            p90 = statistics.quantiles(samples, n=10)[-1] / 1e3
            mean = statistics.fmean(samples) / 1e3
            base = base or median
            print(
                f"{discipline:>10} {loaded:>8,} {busy:>9} {median:>10.1f} {p90:>8.1f} "
                f"{mean:>8.1f} {median / base:>15.2f}x"
            )
            if loaded == ROWS[-1][0]:
                verdicts.append((discipline, median / base))
    print()
    for discipline, ratio in verdicts:
        state = "met" if ratio <= 2.0 else "NOT met"
        print(
            f"{discipline}: 10,000-model row is {ratio:.2f}x the 10-model row (target <= 2x: {state})"
        )
    print()
    print("the driver per request: enqueue and the host loop's pass, an instant executor (us)")
    print(f"{'discipline':>10} {'alone (lone lane)':>18} {'two per callback':>17}")
    for discipline in ("fair", "fifo", "edf"):
        alone, pairs = driver_costs(discipline, 1), driver_costs(discipline, 2)
        print(f"{discipline:>10} {alone:>18.1f} {pairs:>17.1f}")


if __name__ == "__main__":
    main()
