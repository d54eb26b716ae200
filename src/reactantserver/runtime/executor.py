"""The scheduler's executor for a real device: weights, batch assembly, execution.

The dispatch loop (``reactantserver.scheduling.Scheduler``) decides *what* runs; this
module runs it. For each batch:

1. ``prepare`` asks the weight provider for the version's device weights. That may
   load them on demand (and evict others); it is not counted as compute time.
2. ``execute`` hands one function to a worker thread: gather the requests' inputs
   into one buffer padded to the batch size (the only copy of request data), run
   the compiled program, and cut the outputs back into per-request views. The
   event loop keeps serving meanwhile. The thread is never abandoned, so when
   ``execute`` returns the device really is idle.
3. The timings of the three steps go to the model's ModelStatistics counters.

The batch's scheduler ``group`` is the ``ServedModel`` that admitted its requests,
so a batch always runs on the version its requests were validated against, even
while a newer version is being swapped in.

``WeightProvider`` is the seam to the weight cache: ``ResidentWeights`` keeps every
model on the device for its lifetime (the cache turned off); the on-demand cache
implements the same five methods.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import trio

from ..config.schema import Residency
from ..errors import FailedPrecondition
from ..models import ServedModel
from ..scheduling.assemble import gather, scatter
from ..scheduling.records import Batch

log = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]


class WeightProvider(Protocol):
    """Device weights per model version, keyed by the ``ServedModel`` object."""

    async def add(self, model: ServedModel) -> None:
        """Start tracking a version (load it now if its residency says so)."""

    async def remove(self, model: ServedModel) -> None:
        """Stop tracking a version; its device memory is freed once no batch uses it."""

    async def acquire(self, model: ServedModel) -> Sequence[Any]:
        """The version's device weights, resident and protected until ``release``."""
        ...

    def release(self, model: ServedModel) -> None:
        """The batch that acquired ``model`` is done with its weights."""

    async def prefetch(self, model: ServedModel) -> None:
        """Best effort: make ``model`` resident ahead of time if that evicts nothing in use."""


def _run_batch(
    model: ServedModel,
    payloads: Sequence[Mapping[str, np.ndarray]],
    rows: Sequence[int],
    size: int,
    weights: Sequence[Any],
) -> tuple[list[Outputs], tuple[float, float, float]]:
    """Worker-thread body: gather, execute, scatter; returns results and step timings."""
    t0 = time.perf_counter()
    inputs = gather(payloads, size) if model.batched else payloads[0]
    args = [inputs[name] for name in model.input_names]
    t1 = time.perf_counter()
    results = model.loaded.execute(args, weights)
    t2 = time.perf_counter()
    named = dict(zip(model.output_names, results, strict=True))
    per_request = scatter(named, rows) if model.batched else [named]
    t3 = time.perf_counter()
    return per_request, (t1 - t0, t2 - t1, t3 - t2)


class DeviceExecutor:
    """Implements the scheduler's ``Executor`` (and ``Prefetcher``) protocols."""

    def __init__(
        self, weights: WeightProvider, lookup: Callable[[str], ServedModel | None]
    ) -> None:
        self._weights = weights
        self._lookup = lookup
        # One device, one execution at a time: the scheduler already guarantees it;
        # the limiter keeps the thread pool from ever running two device calls.
        self._device = trio.CapacityLimiter(1)
        self._acquired: dict[int, Sequence[Any]] = {}

    async def prepare(self, batch: Batch) -> None:
        model: ServedModel = batch.group  # type: ignore[assignment]
        self._acquired[batch.seq] = await self._weights.acquire(model)

    async def execute(self, batch: Batch) -> Sequence[Outputs]:
        model: ServedModel = batch.group  # type: ignore[assignment]
        weights = self._acquired.pop(batch.seq)
        payloads = [r.payload for r in batch.requests]
        rows = [r.rows for r in batch.requests]
        try:
            per_request, (t_in, t_infer, t_out) = await trio.to_thread.run_sync(
                _run_batch, model, payloads, rows, batch.size, weights, limiter=self._device
            )
        finally:
            self._weights.release(model)
        queued = [batch.started - r.arrival for r in batch.requests]
        model.record_batch(batch.size, queued, sum(rows), t_in, t_infer, t_out)
        return per_request

    async def prefetch(self, model: str) -> None:
        served = self._lookup(model)
        if served is not None:
            await self._weights.prefetch(served)


class ResidentWeights:
    """The weight cache turned off: every version stays on the device while it is served.

    ``remove`` defers freeing until the last batch using the version has released it,
    so unloading or replacing a model never pulls weights from under a running batch.
    """

    def __init__(
        self,
        to_device: Callable[[list[np.ndarray]], list[Any]],
        free: Callable[[Sequence[Any]], None],
    ) -> None:
        self._to_device = to_device
        self._free = free
        self._arrays: dict[ServedModel, Sequence[Any]] = {}
        self._in_use: dict[ServedModel, int] = {}
        self._retired: set[ServedModel] = set()

    @property
    def resident_bytes(self) -> int:
        return sum(m.bundle.weights_nbytes for m in self._arrays)

    def is_resident(self, model: ServedModel) -> bool:
        return model in self._arrays

    async def add(self, model: ServedModel) -> None:
        host = await trio.to_thread.run_sync(model.bundle.read_weights)
        self._arrays[model] = await trio.to_thread.run_sync(self._to_device, host)

    async def remove(self, model: ServedModel) -> None:
        if self._in_use.get(model):
            self._retired.add(model)
        else:
            self._drop(model)

    async def acquire(self, model: ServedModel) -> Sequence[Any]:
        arrays = self._arrays.get(model)
        if arrays is None:
            raise RuntimeError(f"{model!r} has no device weights (it was removed)")
        self._in_use[model] = self._in_use.get(model, 0) + 1
        return arrays

    def release(self, model: ServedModel) -> None:
        left = self._in_use.get(model, 0) - 1
        if left > 0:
            self._in_use[model] = left
            return
        self._in_use.pop(model, None)
        if model in self._retired:
            self._retired.discard(model)
            self._drop(model)

    async def prefetch(self, model: ServedModel) -> None:
        return None

    # The residency surface the control RPCs and metrics read. With the cache off the
    # answers are constant: every model is on the device, nothing has a host copy, there
    # is no on-demand budget, and nothing can be moved or compacted.

    @property
    def on_demand_budget(self) -> int:
        return 0

    def floor(self, model: ServedModel) -> Residency:
        return "device"

    def host_resident(self, model: ServedModel) -> bool:
        return False

    def statistics(self) -> None:
        return None

    async def warm_up(self, model: ServedModel) -> dict[int, float]:
        """Run every compiled size on zeros: seconds per size, to seed the cost estimates."""
        weights = await self.acquire(model)
        try:
            return await trio.to_thread.run_sync(model.loaded.warmup, weights)
        finally:
            self.release(model)

    async def finish_probe(self) -> None:
        return None  # no budget to size

    async def set_floor(self, model: ServedModel, floor: Residency) -> Residency:
        # Asking for what is already true is a no-op success (a control plane can assert
        # it); anything else cannot be done without the cache.
        if floor == "device":
            return "device"
        raise FailedPrecondition(
            f"model {model.name!r}: cannot make it {floor!r}: the on-demand weight cache is "
            "off on this worker (runtime.weight_cache_fraction is 0 or the device reports no "
            "arena; set runtime.arena_bytes on CPU), so every model stays device resident"
        )

    async def compact(self, reload: Sequence[ServedModel] = ()) -> tuple[int, int]:
        """Nothing is evictable and everything is resident: frees and reloads nothing."""
        return 0, self.resident_bytes

    def _drop(self, model: ServedModel) -> None:
        arrays = self._arrays.pop(model, None)
        if arrays is not None:
            self._free(arrays)
            log.debug("freed the device weights of %r", model)
