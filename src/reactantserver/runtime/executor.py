"""The scheduler's executor for a real device: weights, batch assembly, execution.

The dispatch loop (``reactantserver.scheduling.Scheduler``) decides *what* runs; this
module runs it. For each batch:

1. ``prepare`` asks the weight provider for the version's device weights. That may
   load them on demand (and evict others); it is not counted as compute time.
   ``prepare_now`` is the same as a plain call where the weights are at hand (the
   scheduler's pass of the host loop runs a tiny batch without waking its loop).
2. ``run`` is one blocking function: gather the requests' inputs into one buffer
   padded to the batch size (the only copy of request data), run the compiled
   program, and cut the outputs back into per-request views. The dispatch loop runs
   it on its long-lived device thread (the event loop keeps serving meanwhile; the
   thread is never abandoned, so when it returns the device really is idle), or
   inline when the batch is learned to be tiny.
3. ``ran``, back on the loop: the weights are released and the timings of the three
   steps go to the model's ModelStatistics counters.

With ``scheduler.pipeline_depth`` > 1, step 2 is split in two blocking halves that the
dispatch loop runs on two threads (``threads.DevicePipeline``): ``launch`` gathers and
launches the program (``LoadedModel.launch``: the program queued asynchronously on the
numpy inputs, which its call moves to the device), ``collect`` waits for the outputs
(``LoadedModel.fetch``) and scatters them. ``ran`` still comes only when the batch has
landed, so the weights stay acquired for as long as the device may read them.

The batch's scheduler ``group`` is the ``ServedModel`` that admitted its requests
(``Batch[ServedModel]``: a typed field), so a batch always runs on the version its
requests were validated against, even while a newer version is being swapped in.

Weights come from a :class:`~reactantserver.runtime.weight_provider.WeightProvider`
(the on-demand cache, or every model resident with the cache off); batch data is
assembled by ``assemble.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..models import ServedModel
from ..scheduling import Batch
from .assemble import gather, scatter
from .model import Launched
from .weight_provider import WeightProvider

Outputs = dict[str, np.ndarray]


def _batch_inputs(
    model: ServedModel,
    payloads: Sequence[Mapping[str, np.ndarray]],
    rows: Sequence[int],
    size: int,
) -> list[np.ndarray]:
    """The program's inputs, in argument order: the requests gathered into one padded
    batch (``gather`` passes a request that fills it by itself through), with the rows
    counted at admission."""
    inputs = gather(payloads, size, rows) if model.batched else payloads[0]
    return [inputs[name] for name in model.input_names]


def _run_batch(
    model: ServedModel,
    payloads: Sequence[Mapping[str, np.ndarray]],
    rows: Sequence[int],
    size: int,
    weights: Sequence[Any],
) -> tuple[list[Outputs], tuple[float, float, float]]:
    """Worker-thread body: gather, execute, scatter; returns results and step timings."""
    t0 = time.perf_counter()
    args = _batch_inputs(model, payloads, rows, size)
    t1 = time.perf_counter()
    results = model.loaded.execute(args, weights)
    t2 = time.perf_counter()
    named = dict(zip(model.output_names, results, strict=True))
    per_request = scatter(named, rows) if model.batched else [named]
    t3 = time.perf_counter()
    return per_request, (t1 - t0, t2 - t1, t3 - t2)


class DeviceExecutor:
    """Implements the scheduler's ``BlockingExecutor`` and ``PipelinedExecutor`` (and
    ``Prefetcher``, ``PreparesNow``) protocols over ``Batch[ServedModel]``.

    ``run`` is the blocking part: the dispatch loop calls it on its device thread, or
    inline for a batch learned to be tiny (``scheduler.inline_max_seconds``, CPU only).
    ``ran`` comes back on the loop whatever happened: it releases the weights and
    records the timings, so that no statistics counter is written from two threads.
    """

    def __init__(
        self,
        weights: WeightProvider,
        lookup: Callable[[str], ServedModel | None],
    ) -> None:
        self._weights = weights
        self._lookup = lookup
        self._acquired: dict[int, Sequence[Any]] = {}
        self._timings: dict[int, tuple[float, float, float]] = {}

    async def prepare(self, batch: Batch[ServedModel]) -> None:
        model = batch.group
        self._acquired[batch.seq] = await self._weights.acquire(model)

    def prepare_now(self, batch: Batch[ServedModel]) -> bool:
        """``prepare`` without a wait, where the weights are at hand (the scheduler's
        pass of the host loop); False, with nothing acquired, otherwise."""
        model = batch.group
        weights = self._weights.acquire_now(model)
        if weights is None:
            return False
        self._acquired[batch.seq] = weights
        return True

    def run(self, batch: Batch[ServedModel]) -> Sequence[Outputs]:
        model = batch.group
        payloads = [r.payload for r in batch.requests]
        rows = [r.rows for r in batch.requests]
        per_request, timings = _run_batch(
            model, payloads, rows, batch.size, self._acquired[batch.seq]
        )
        self._timings[batch.seq] = timings
        return per_request

    def ran(self, batch: Batch[ServedModel]) -> None:
        model = batch.group
        self._acquired.pop(batch.seq, None)
        self._weights.release(model)
        timings = self._timings.pop(batch.seq, None)
        if timings is not None:
            t_in, t_infer, t_out = timings
            queued = [batch.started - r.arrival for r in batch.requests]
            model.record_batch(batch.size, queued, batch.rows, t_in, t_infer, t_out)

    def launch(self, batch: Batch[ServedModel]) -> tuple[Launched, float, float]:
        """Gather and launch (the pipeline's launch thread): the launched execution, the
        gather's seconds and when the launch began (``time.perf_counter``)."""
        model = batch.group
        t0 = time.perf_counter()
        payloads = [r.payload for r in batch.requests]
        args = _batch_inputs(model, payloads, [r.rows for r in batch.requests], batch.size)
        t1 = time.perf_counter()
        return model.loaded.launch(args, self._acquired[batch.seq]), t1 - t0, t1

    def collect(
        self, batch: Batch[ServedModel], handle: tuple[Launched, float, float]
    ) -> Sequence[Outputs]:
        """Fetch and scatter (the pipeline's collect thread), in launch order."""
        model = batch.group
        launched, t_in, t1 = handle
        results = model.loaded.fetch(launched)
        t2 = time.perf_counter()
        named = dict(zip(model.output_names, results, strict=True))
        per_request = scatter(named, [r.rows for r in batch.requests]) if model.batched else [named]
        self._timings[batch.seq] = (t_in, t2 - t1, time.perf_counter() - t2)
        return per_request

    async def prefetch(self, model: str) -> None:
        served = self._lookup(model)
        if served is not None:
            await self._weights.prefetch(served)
