"""An honest asynchronous fake GPU on Trio's clock, and the prefetch-overlap simulation.

:class:`FakeGpu` is what the dispatch loop drives in ``tests/scheduling/test_sched_pipeline.py``
and in :func:`simulate_catalog` (``bench_gpu_prefetch.py --simulate``): the
:class:`~reactantserver.scheduling.dispatch.AsyncPipelinedExecutor` protocol (``prepare``,
``launch``, ``collect``, ``ran``) plus ``execute`` for depth 1 and ``prefetch``. It has
time of its own for everything a real device spends time on, and nothing happens faster
because someone awaits it:

* **weights** -- at most ``capacity`` models resident (LRU); a missing model is loaded
  over one copy engine (``t_load`` each, one load at a time); ``prepare`` pins the
  batch's model until ``ran``; a pinned model is never evicted; ``prefetch`` loads only
  when that evicts nothing pinned.
* **launch** -- the host's launch work and the inputs' transfer (``t_in``; the launching
  thread is busy for it), then the program is queued on the one **stream**: it starts
  when its inputs are there and the previous program (with its output copy) is done,
  runs ``cost(batch)``, and its outputs are copied back as part of it (``t_out``: the
  program's outputs in pinned host memory). ``launch`` returns as soon as it is queued.
* **collect** -- waits until the outputs are on the host, then ``t_host`` of host work
  (scatter) before the answers exist.

The fake keeps books the tests read (every program's interval, launches, landings,
loads) and records every broken rule in ``violations`` instead of raising into the loop:
two launches at once, a launch of a batch whose weights are not pinned, a model evicted
or released while a launched batch uses it, a release before the outputs were back.

No JAX, no threads: everything is on Trio's clock, so under ``trio.testing.MockClock``
a simulation of minutes takes milliseconds and is exact.

Calibration (issue 40). :func:`simulate_catalog` times an execution as a measured
fraction of a cold load, :data:`EXEC_LOAD_RATIO`, not as equal to it: the NVIDIA H200
run of 2026-11-27 (commit a02cdcc, ``../shared/measurements/gpu-h200-2026-11-27/
bench_gpu_prefetch.txt``) charged its devices 1.54 ms per dispatch with prefetch off
(idle 0.734 at 226.6 requests/s over 304 dispatches: 0.266 x 400 / 226.6 s / 304) against
a mean cold load of 3.53 ms: 0.44. (The benchmark's own calibration, ``repeats = load /
one``, assumed 1.0: ``one`` includes the dispatch and the input transfer, so the program
run ``repeats`` times costs far less than a load on the device.) At that ratio the fake
device reproduces the GPU's figures -- prefetch off, depth 1: idle 0.716 and 240.5
requests/s against the H200's 0.734 and 226.6 and the H100's 0.765 and 241.1 -- where the
old calibration predicted 0.53.

The bound a copy engine sets. Loads run one at a time on one copy engine, so the wall
time is at least the loads' total, and the device idles at least ``1 - execution
seconds / max(execution seconds, load seconds)`` of it: ``bound`` in the results. What
the dispatch loop controls is how close it gets there -- whether the copy engine is kept
busy while batches execute: :data:`PREFETCH_GOAL` is the gap allowed.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from reactantserver.config import SchedulerConfig
from reactantserver.scheduling import Batch, Scheduler

#: A batch-1 execution's device time / a cold load's, as the H200 measured them (module
#: docstring); ``bench_gpu_prefetch.py`` prints the ratio of the device it runs on.
EXEC_LOAD_RATIO = 0.44
#: The H200's mean cold load of a 128 MiB model from pinned host memory, seconds.
LOAD_SECONDS = 3.53e-3
#: With prefetch and the pipeline, the device idles at most this much more than the
#: bound its copy engine sets (module docstring).
PREFETCH_GOAL = 0.05


@attrs.define
class Program:
    """One launched batch as the fake device saw it (Trio times)."""

    seq: int
    model: str
    #: The launch began (the host starts the input transfer).
    began: float
    #: The program started and ended on the stream; its outputs were back on the host.
    start: float
    end: float
    back: float
    #: ``collect`` returned (host work done), or ``nan`` until then.
    collected: float = float("nan")


class FakeGpu:
    """An asynchronous fake device with a weight cache (see the module docstring)."""

    def __init__(
        self,
        cost: Callable[[Batch], float],
        *,
        t_in: float = 0.0,
        t_out: float = 0.0,
        t_host: float = 0.0,
        t_load: float = 0.0,
        capacity: int | None = None,
        fail: Callable[[Batch], Exception | None] = lambda batch: None,
        on_launch: Callable[[Batch], None] | None = None,
    ) -> None:
        self.cost = cost
        self.t_in, self.t_out, self.t_host, self.t_load = t_in, t_out, t_host, t_load
        self.capacity = capacity
        self.fail = fail
        self.on_launch = on_launch
        self.violations: list[str] = []
        self.programs: list[Program] = []
        self.by_seq: dict[int, Program] = {}
        self.released: list[int] = []
        #: batch seq -> model, from prepare to ran (the pins).
        self.held: dict[int, str] = {}
        self.pins: collections.Counter[str] = collections.Counter()
        self.resident: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.loads = self.misses = self.prefetches = self.evictions = 0
        self.in_flight = self.max_in_flight = 0
        self._loading: dict[str, trio.Event] = {}
        self._engine = trio.Lock()
        self._unpinned = trio.Event()
        self._stream_free = -float("inf")
        self._launching = False

    # ------------------------------------------------------------------ weights

    async def prepare(self, batch: Batch) -> None:
        if batch.model not in self.resident:
            self.misses += 1
        await self._resident(batch.model, prefetch=False)
        self.held[batch.seq] = batch.model
        self.pins[batch.model] += 1

    async def prefetch(self, model: str) -> None:
        if model not in self.resident and model not in self._loading:
            self.prefetches += 1
            await self._resident(model, prefetch=True)

    async def _resident(self, model: str, *, prefetch: bool) -> None:
        """Make ``model`` resident (a prefetch gives up rather than wait for room)."""
        while model not in self.resident:
            loading = self._loading.get(model)
            if loading is not None:
                await loading.wait()
                continue
            if (
                self.capacity is not None
                and len(self.resident) + len(self._loading) >= self.capacity
            ):
                victim = next((m for m in self.resident if not self.pins[m]), None)
                if victim is None:
                    if prefetch:
                        return
                    self._unpinned = unpinned = trio.Event()
                    await unpinned.wait()
                    continue
                del self.resident[victim]
                self.evictions += 1
            done = self._loading[model] = trio.Event()
            try:
                async with self._engine:
                    await trio.sleep(self.t_load)
            finally:
                del self._loading[model]
                done.set()
            self.resident[model] = None
            self.loads += 1
        self.resident.move_to_end(model)

    def ran(self, batch: Batch) -> None:
        model = self.held.pop(batch.seq, None)
        if model is None:
            self.violations.append(f"batch {batch.seq}: released without being prepared")
            return
        program = self.by_seq.get(batch.seq)
        now = trio.current_time()
        if program is not None:
            self.in_flight -= 1
            if now < program.back:
                self.violations.append(f"batch {batch.seq}: released before its outputs were back")
        self.released.append(batch.seq)
        self.pins[model] -= 1
        if not self.pins[model]:
            self._unpinned.set()

    # ---------------------------------------------------------------- the device

    async def launch(self, batch: Batch) -> Program:
        if self._launching:
            self.violations.append(f"batch {batch.seq}: launched while another launch ran")
        if self.held.get(batch.seq) != batch.model or batch.model not in self.resident:
            self.violations.append(f"batch {batch.seq}: launched without its weights pinned")
        if self.on_launch is not None:
            self.on_launch(batch)
        self._launching = True
        began = trio.current_time()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await trio.sleep(self.t_in)
        finally:
            self._launching = False
        start = max(trio.current_time(), self._stream_free)
        end = start + self.cost(batch)
        back = end + self.t_out
        self._stream_free = back
        program = Program(batch.seq, batch.model, began, start, end, back)
        self.programs.append(program)
        self.by_seq[batch.seq] = program
        return program

    async def collect(self, batch: Batch, program: Program) -> Sequence[Any]:
        await trio.sleep_until(program.back)
        if self.held.get(batch.seq) != batch.model or batch.model not in self.resident:
            self.violations.append(f"batch {batch.seq}: weights gone before its outputs were back")
        await trio.sleep(self.t_host)
        program.collected = trio.current_time()
        error = self.fail(batch)
        if error is not None:
            raise error
        return [("out", r.payload) for r in batch.requests]

    async def execute(self, batch: Batch) -> Sequence[Any]:
        """Depth 1: launch, collect, release (the depth-1 loop calls no ``ran`` for an
        async executor)."""
        try:
            return await self.collect(batch, await self.launch(batch))
        finally:
            self.ran(batch)

    # --------------------------------------------------------------------- books

    def busy_seconds(self) -> float:
        """Seconds the stream ran programs (not counting output copies)."""
        return sum(p.end - p.start for p in self.programs)


async def simulate_catalog(
    *,
    depth: int,
    prefetch: bool,
    models: int = 20,
    capacity: int = 2,
    requests: int = 400,
    clients: int = 8,
    zipf: float = 1.1,
    t_exec: float = EXEC_LOAD_RATIO * LOAD_SECONDS,
    t_load: float = LOAD_SECONDS,
    t_in: float = 0.1e-3,
    t_out: float = 0.1e-3,
    t_host: float = 0.2e-3,
    seed: int = 0,
) -> dict[str, float]:
    """Benchmark (b) on the fake device: Zipf catalog ``models / capacity`` times the
    weight budget, ``clients`` closed-loop clients of single-row requests through the
    real Scheduler. Run under ``trio.testing.MockClock`` (see ``run_simulation``)."""
    gpu = FakeGpu(
        lambda batch: t_exec,
        t_in=t_in,
        t_out=t_out,
        t_host=t_host,
        t_load=t_load,
        capacity=capacity,
    )
    executor: Any = gpu if prefetch else _NoPrefetch(gpu)
    scheduler = Scheduler(SchedulerConfig(), executor, pipeline_depth=depth)
    names = [f"m{i:02d}" for i in range(models)]
    for name in names:
        scheduler.add_model(name, [1, 4, 8])
        scheduler.seed_cost(name, 1, t_exec)
    weights = [1 / (k + 1) ** zipf for k in range(models)]
    plan = iter(random.Random(seed).choices(names, weights, k=requests))
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)

        async def client() -> None:
            for name in plan:
                await scheduler.submit(name, name)

        start = trio.current_time()
        async with trio.open_nursery() as clients_nursery:
            for _ in range(clients):
                clients_nursery.start_soon(client)
        wall = trio.current_time() - start
        await scheduler.aclose()
    assert not gpu.violations, gpu.violations
    busy = gpu.busy_seconds()
    return {
        "throughput": requests / wall,
        "idle": 1.0 - busy / wall,
        "bound": 1.0 - busy / max(busy, gpu.loads * t_load),
        "dispatches": len(gpu.programs),
        "loads": gpu.loads,
        "misses": gpu.misses,
        "prefetches": gpu.prefetches,
    }


class _NoPrefetch:
    """``gpu`` without its ``prefetch`` (``runtime.weight_prefetch: false``)."""

    def __init__(self, gpu: FakeGpu) -> None:
        self.prepare = gpu.prepare
        self.launch = gpu.launch
        self.collect = gpu.collect
        self.execute = gpu.execute
        self.ran = gpu.ran


def run_simulation(**kwargs: Any) -> dict[str, float]:
    """:func:`simulate_catalog` on a virtual clock (instant and exact)."""
    from trio.testing import MockClock

    result: dict[str, float] = trio.run(
        lambda: simulate_catalog(**kwargs), clock=MockClock(autojump_threshold=0)
    )
    return result
