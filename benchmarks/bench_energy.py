"""What measuring energy per model costs (issue 36), on the CPU with a fake power counter.

Two tables:

* **The dispatch loop per batch.** A real ``Scheduler`` on Trio's real clock drives a
  no-op blocking executor inline on the loop (the CPU worker's path for a tiny program),
  one request per batch, ``BATCHES`` batches a run: once without ``on_batch`` and once
  with ``EnergyMeter.on_batch`` sampling at its real rate (``SAMPLE_INTERVAL``, 1 s), the
  two alternating for ``ROUNDS`` rounds; microseconds per batch, the median run of each,
  and the median of the rounds' differences. Then ``on_batch`` alone, called in a tight loop on the real clock
  (what it costs per batch with no loop around it), and one counter read (a scrape's
  ``sample_at_scrape``) through the fake reader -- a Python call returning a reading; NVML's call or RAPL's two
  file reads cost more, once a second.
* **The ledger per sample.** ``EnergyLedger.sample`` closing an interval in which M
  models ran (M = 1 ... 10,000): microseconds per sample, median of ``SAMPLES``.

No device and no counter: the reader is a fake whose joules grow with each read. No
timing is asserted anywhere (``tests/benchmarks/test_bench_energy.py`` checks that the runs book
what they should); the numbers are in docs/benchmarks.md and docs/monitoring.md.

    python benchmarks/bench_energy.py      (or: nox -s bench -- energy)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import trio

from reactantserver.config import SchedulerConfig
from reactantserver.energy import SAMPLE_INTERVAL, EnergyLedger, EnergyMeter, EnergyReading
from reactantserver.scheduling import Batch, Scheduler

BATCHES = 30_000
ROUNDS = 5
CALLS = 200_000
MODEL_COUNTS = (1, 10, 100, 1_000, 10_000)
SAMPLES = 200


class FakeReader:
    """A power counter that draws 100 W on ``time.monotonic``: one Python call per read."""

    source = "nvml"
    description = "fake counter"

    def __init__(self) -> None:
        self.reads = 0

    def read(self) -> EnergyReading:
        self.reads += 1
        return EnergyReading(joules=100.0 * time.monotonic(), watts=100.0)


class NoopExecutor:
    """Answers every request with its payload, blocking and at once (inline on the loop)."""

    async def prepare(self, batch: Batch) -> None:
        pass

    def run(self, batch: Batch) -> Sequence[Any]:
        return [r.payload for r in batch.requests]

    def ran(self, batch: Batch) -> None:
        pass


async def loop_run(meter: EnergyMeter | None, batches: int) -> float:
    """Seconds for ``batches`` one-request batches through the dispatch loop."""
    scheduler = Scheduler(
        SchedulerConfig(discipline="fifo"),
        NoopExecutor(),
        inline_max_seconds=float("inf"),
        on_batch=meter.on_batch if meter is not None else None,
    )
    scheduler.add_model("m", [1])
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        for i in range(200):  # warm up: the loop learns the batch's cost
            await scheduler.submit("m", i)
        start = time.perf_counter()
        for i in range(batches):
            await scheduler.submit("m", i)
        elapsed = time.perf_counter() - start
        await scheduler.aclose()
    return elapsed


async def loop_rounds(rounds: int, batches: int) -> tuple[list[float], list[float], int]:
    """Microseconds per batch without and with the meter, alternating; the meter's reads."""
    without: list[float] = []
    with_meter: list[float] = []
    reads = 0
    for _ in range(rounds):
        without.append(await loop_run(None, batches) / batches * 1e6)
        reader = FakeReader()
        meter = EnergyMeter(reader, trio.current_time)
        with_meter.append(await loop_run(meter, batches) / batches * 1e6)
        reads += reader.reads
    return without, with_meter, reads


async def hook_alone(calls: int) -> tuple[float, float]:
    """Microseconds per ``on_batch`` call (the worker's clock, the real interval) and per
    counter read."""
    meter = EnergyMeter(FakeReader(), trio.current_time)
    batch = Batch(seq=0, model="m", size=1, requests=(), rows=1, group=None, started=0.0)
    on_batch = meter.on_batch
    start = time.perf_counter()
    for _ in range(calls):
        on_batch(batch, 1e-5)
    per_call = (time.perf_counter() - start) / calls * 1e6
    start = time.perf_counter()
    for _ in range(calls // 10):
        meter.sample_at_scrape(executing=False)
    per_read = (time.perf_counter() - start) / (calls // 10) * 1e6
    return per_call, per_read


def ledger_sample(models: int, samples: int) -> float:
    """Median microseconds of ``EnergyLedger.sample`` closing an interval of ``models``."""
    ledger = EnergyLedger("nvml", min_interval=SAMPLE_INTERVAL)
    names = [f"model{i:05d}" for i in range(models)]
    ledger.sample(0.0, EnergyReading(0.0))
    times: list[float] = []
    for k in range(1, samples + 1):
        for name in names:
            ledger.ran(name, 0.5 / models)
        reading = EnergyReading(100.0 * k, watts=100.0)
        start = time.perf_counter()
        ledger.sample(float(k), reading)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    without, with_meter, reads = trio.run(loop_rounds, ROUNDS, BATCHES)
    base, metered = statistics.median(without), statistics.median(with_meter)
    paired = statistics.median(b - a for a, b in zip(without, with_meter, strict=True))
    print(
        f"the dispatch loop per batch: {BATCHES:,} one-request batches a run, {ROUNDS} "
        f"rounds alternating, median run; sampling every {SAMPLE_INTERVAL:g} s "
        f"({reads} counter reads in all)"
    )
    print()
    print(f"{'':>24} {'us/batch':>9}")
    print(f"{'without the meter':>24} {base:>9.2f}")
    print(f"{'with on_batch':>24} {metered:>9.2f}")
    print(
        f"{'difference':>24} {paired:>+9.2f}  ({paired / base:+.1%}; median of the rounds' pairs)"
    )
    per_call, per_read = trio.run(hook_alone, CALLS)
    print()
    print(
        f"on_batch alone: {per_call:.3f} us per call ({CALLS:,} calls, Trio's clock, sampling "
        f"every {SAMPLE_INTERVAL:g} s); one counter read through the fake reader and the "
        f"ledger: {per_read:.2f} us"
    )
    print()
    print(f"the ledger per sample: EnergyLedger.sample, median of {SAMPLES}")
    print()
    header = f"{'models in the interval':>22} {'us/sample':>10} {'ns/model':>9}"
    print(header)
    print("-" * len(header))
    for models in MODEL_COUNTS:
        us = ledger_sample(models, SAMPLES)
        print(f"{models:>22,} {us:>10.2f} {us * 1e3 / models:>9.1f}")


if __name__ == "__main__":
    main()
