"""The on-demand weight cache on a device: a thin driver over the policy.

``WeightCachePolicy`` (``reactantserver.weights``) decides which model versions' weights
are on the device, and is the only place that knows what is resident, loading, pinned in
use or being removed. :class:`CachedWeights` implements the worker's
:class:`~reactantserver.runtime.weight_provider.WeightProvider` by asking it, carrying out
the plans it returns with the handles of ``weight_io.py``, and reporting completions. It
is the whole runtime side of docs/on_demand_weights.md.

Theory of operation
-------------------
Keys. The policy is keyed by a *version*, ``f"{name}#{generation}"``: during a hot swap
two versions of one model coexist, each with its own weights, and the one a batch was
admitted with is the one it runs on.

Plans. A :class:`~reactantserver.weights.CachePlan` is carried out in field order by
:meth:`CachedWeights._run`: device copies of the victims are taken out of the handles and
freed at once, *before* any transfer starts, so the device never holds more than the
budget (a free never waits: the runtime releases a buffer after the work already queued
on it); host copies are dropped or made (file reads in a worker thread); then each load
is carried out and reported back with ``loaded`` / ``load_failed``; finally the plan is
reported ``done``. A plan is carried out under a shielded cancel scope: a cancelled
caller never leaves the policy believing a load is in flight forever.

Loads (issue 40). A ``system`` version's host copy is one packed buffer, staged in
pinned host memory on CUDA (``weight_io.py``). A version of at most
``PACKED_LOAD_MAX_BYTES`` (4 MiB) loads with one transfer of that buffer and the unpack
program of its layout (``unpack.py``), both queued on the device and not waited for: the
device's stream runs the batch's program after them, so the load runs on the event loop
itself, in the same step as ``loaded`` -- no thread hop, no ``block_until_ready``. Larger
versions, whose copy dwarfs any per-tensor cost, and versions without a RAM copy
(``unpinned``, ``device`` floors) load in a worker thread, one put of the tensors, waited
for there. Loads queued on the device count against the budget like resident weights
(the policy marks them resident at once): several can be in flight on the device
without ever exceeding it. An error the device reports only later surfaces in the
execution that reads the weights.

Where a load's time went before (profiled on the CPU backend, 2026-12-01, this 2-core
machine at a load average of 8-9, the 51 KB catalog models of ``bench_gpu_catalog.py``):
``jax.device_put`` of the tensor list cost 192 us for a 6-tensor MLP and 419 us for a
14-tensor ResNet -- about 30 us per tensor in JAX's Python dispatch (``shard_args``,
``_shard_np_array``: 7.8 % of a served worker's samples under py-spy), before a byte
moved -- then ``block_until_ready``, then the worker thread's round trip (81 us for a
no-op alone, far more while the device thread and the loop compete for the cores). The
cache timed 1.1-4.3 ms per load in a served worker (``bench_gpu_catalog --backend cpu``,
300 and 1,000 models at 400 and 1,000 requests/s) and 1.0-3.7 ms in a closed loop of
acquires (``benchmarks/bench_catalog.py``); the copy itself, 51 KB, is microseconds.
The same load now: one transfer and the unpack program, 18 us (MLP) and 32 us (ResNet)
in isolation; 92 us at the median of cold acquires in the closed loop (240 us on average,
against 3,674 for the baseline in the same run: 10.9x the loads per second), 0.46-1.09
ms per load in the served worker, where the loop shares two cores with the executions.
Since the unpack program cuts in the tensors' own words, at most 8 a program on the CPU
(``unpack.py``; 2026-12-02, quiet): 60-73 us per load on average and 100-117 us at the
median cold acquire, 6.5x the loads per second of the put of the list.
Alternatives measured side by side (``unpack.py``'s header): a put of the list without
the block (no better than 10 %: the cost is the per-tensor dispatch), one packed argument
of the model's own program (slices inside it: 5x slower executions on the CPU), and the
packed load in a worker thread instead of on the loop (in-process serving, 40 models:
309-426 against 505-512 requests/s): the packed load on the loop wins.

Waiting. Whenever the policy says "not now" (an acquire's :class:`~reactantserver.weights.Wait`,
a command that cannot start yet, a removal of a version still in use) the caller waits
on :class:`~reactantserver.changes.Changes` and asks again; every release, finished plan
and finished command notifies.

Acquire. A :class:`~reactantserver.weights.Hit` pins the version in use and returns its
device arrays; a load plan is carried out and the version is pinned in the same
synchronous step as ``loaded`` (no checkpoint in between, so nothing can evict it first).
A version pinned in use is never evicted, so the arrays an execution was handed stay on
the device until its ``release``.

Out of device memory. A load the allocator refuses although the budget says it fits
(the free memory is fragmented, or held by something the budget does not know of) is
retried once after a compaction has freed every idle on-demand copy; if it fails again
the batch gets ``ResourceExhausted`` saying what to change (``device_errors.py``), the
version stays absent with its budget released, and the worker serves on. Any other load
failure is ``ExecutionFailed``; the next acquire tries again either way.

Control commands. Compaction, residency changes, re-sizing the budget and the startup
probe run between batches (:meth:`CachedWeights._exclusive`): the policy's command gate
makes new acquires and prefetches wait, and the command starts once nothing is pinned and
no plan is being carried out. Automatic compaction (``scheduler.compaction_interval``)
runs this way at the start of the acquire that follows the N-th load, and reloads the
model that acquire is for.

Prefetch. ``prefetch`` (the dispatch loop calls it with the model it expects next while
a batch executes) carries out ``prefetch_plan``; the transfer overlaps the execution.
``runtime.weight_prefetch: false`` turns it off.

Budget and probe. :class:`~reactantserver.weights.BudgetSizer` keeps the budget: it is
re-solved when the pinned set changes and when the probe ends, and applied with
``set_budget``. The startup probe is the startup warm-up: where the backend reports
allocator statistics, the worker loads its startup set in ``probe_order`` (pinned first,
then ascending weight size, ``weight_provider.startup_order``) and each warm-up frees every
idle on-demand copy first (``evict_idle``), runs the version alone and records ``peak -
in_use_before``. The peak cannot be reset through JAX, so that difference bounds the
run's transient memory from above whatever ran before; because the runs go in ascending
weight size, an earlier run's peak exceeds a later baseline by no more than the earlier
run's own scratch, so the largest difference is exactly the worst run's scratch
(compile-time allocations such as autotuning can only inflate it). :meth:`finish_probe`
then sizes the budget. The CPU reports no statistics: no probe, scratch 0. A model
loaded later raises the estimate only if its warm-up raised the peak (the sizer's rule).

Why one module of this size: it is the one driver of a policy with a dozen commands,
each method a few lines of asking and carrying out; the I/O handles are in
``weight_io.py`` and the rules in ``weights/policy.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..changes import Changes
from ..config.schema import Residency, RuntimeConfig
from ..errors import BundleError, ExecutionFailed, LifecycleError
from ..threads import ThreadRunner, in_threads
from ..weights import (
    WEIGHTS_FILE,
    BudgetSizer,
    CachePlan,
    Hit,
    HostStore,
    MemoryStats,
    ModelResidency,
    ProbeMeasurement,
    Wait,
    WeightBudget,
    WeightCachePolicy,
    WeightCacheStatistics,
)
from .device_errors import first_line, is_out_of_memory, load_out_of_memory
from .host_memory import PinnedHostStaging
from .weight_io import (
    DeviceRuntime,
    WeightHandles,
    describe,
    free_all,
    read_checked_layout,
)

if TYPE_CHECKING:
    from ..models import ServedModel

__all__ = ["CachedWeights"]

log = logging.getLogger(__name__)


@attrs.frozen
class _Outcome:
    """What carrying out one plan did."""

    loaded: tuple[str, ...]
    failures: dict[str, BaseException]


class CachedWeights:
    """``WeightProvider`` over ``WeightCachePolicy`` (see the module docstring)."""

    def __init__(
        self,
        runtime: DeviceRuntime,
        config: RuntimeConfig,
        *,
        arena: int,
        explicit: bool = False,
        compaction_interval: int = 0,
        staging: PinnedHostStaging | None = None,
        memory: Callable[[], MemoryStats | None] | None = None,
        host: HostStore | None = None,
        thread: ThreadRunner | None = None,
    ) -> None:
        """``thread`` runs the blocking steps (file reads, transfers, frees, warm-ups); by
        default a worker thread of the cache's own limiter. Tests pass a runner that calls
        inline, so that virtual time cannot pass while I/O is "in flight"."""
        self._runtime = runtime
        self._sizer = BudgetSizer(
            arena=arena,
            fraction=config.weight_cache_fraction,
            wiggle=config.weight_cache_wiggle_fraction,
        )
        self._policy = WeightCachePolicy(
            self._sizer.budget.on_demand,
            explicit=explicit,
            compaction_interval=compaction_interval,
        )
        self._memory = memory if memory is not None else runtime.memory_stats
        self._prefetch = config.weight_prefetch
        self._changes = Changes()
        # Cache I/O gets its own threads: never queued behind the device execution.
        self._thread = thread if thread is not None else in_threads(trio.CapacityLimiter(2))
        store = host if host is not None else HostStore()
        self._io = WeightHandles(runtime, store, staging, self._thread)
        for warning in self._sizer.budget.warnings:
            log.warning("%s", warning)

    # ------------------------------------------------------------------ queries

    @property
    def policy(self) -> WeightCachePolicy:
        """The policy (read it; only this driver may change it)."""
        return self._policy

    @property
    def budget(self) -> WeightBudget:
        return self._sizer.budget

    @property
    def resident_bytes(self) -> int:
        """Bytes of every weight on the device now (pinned and on demand)."""
        return self._policy.device_bytes

    @property
    def on_demand_budget(self) -> int:
        """The LRU's cap (``weight_cache_max_bytes``)."""
        return self._policy.budget

    @property
    def probe_available(self) -> bool:
        """Whether the backend reports allocator statistics (the startup probe can run)."""
        return self._memory() is not None

    def key(self, model: ServedModel) -> str:
        key = f"{model.name}#{model.generation}"
        if key not in self._policy:
            raise LifecycleError(f"weight cache: {model!r} was never added (or was removed)")
        return key

    def is_resident(self, model: ServedModel) -> bool:
        key = f"{model.name}#{model.generation}"
        return key in self._policy and self._policy.is_resident(key)

    def floor(self, model: ServedModel) -> Residency:
        return self.residency(model).floor

    def host_resident(self, model: ServedModel) -> bool:
        return self.residency(model).host

    def residency(self, model: ServedModel) -> ModelResidency:
        """Floor, device state, host copy and pins of one version."""
        return self._policy.residency(self.key(model))

    def statistics(self) -> WeightCacheStatistics:
        return WeightCacheStatistics(
            policy=self._policy.statistics(),
            budget=self._sizer.budget,
            host=self._io.store.statistics(),
            device_bytes=self.resident_bytes,
            staged_bytes=self._io.staged_bytes,
            pinned_host=self._io.staging is not None,
            prefetch=self._prefetch,
            probed=self._sizer.probed,
        )

    # -------------------------------------------------------- WeightProvider

    async def add(self, model: ServedModel) -> None:
        """Register a version: read its header, then its host copy or device load."""
        key = f"{model.name}#{model.generation}"
        if key in self._policy:
            raise LifecycleError(f"weight cache: {model!r} was added twice")
        layout = await self._thread(read_checked_layout, model.bundle)
        if self._io.packed(layout):
            # Compiled once per layout, here in a thread, so that a load never compiles.
            loader = await self._thread(self._runtime.packed_loader, layout.tensors)
            self._io.loaders[key] = loader
        self._io.layouts[key] = layout
        outcome = await self._run(self._policy.register(key, layout.nbytes, model.sched.residency))
        if outcome.failures:
            error = next(iter(outcome.failures.values()))
            await self._forget(key)
            raise BundleError(
                model.name, f"{WEIGHTS_FILE}: could not place the weights: {describe(error)}"
            ) from error
        if self._policy.floor(key) == "device":
            async with self._exclusive():
                await self._resize()

    async def remove(self, model: ServedModel) -> None:
        """Forget a version once no batch uses it and no load of it is in flight."""
        key = f"{model.name}#{model.generation}"
        if key not in self._policy:
            return
        self._policy.begin_remove(key)
        await self._changes.until(lambda: self._policy.removable(key))
        pinned = self._policy.floor(key) == "device"
        await self._forget(key)
        if pinned:
            async with self._exclusive():
                await self._resize()  # the pinned bytes went down: the budget grows

    async def acquire(self, model: ServedModel) -> Sequence[Any]:
        """The version's device arrays, pinned until :meth:`release` (loads on a miss)."""
        key = self.key(model)
        if self._policy.should_compact():
            await self._compact((key,), reason="compaction_interval")
        return await self._acquire(key)

    def acquire_now(self, model: ServedModel) -> Sequence[Any] | None:
        """:meth:`acquire` where it needs no wait (a hit, no compaction due): the device
        arrays, pinned until :meth:`release`; None, with nothing changed, otherwise."""
        key = f"{model.name}#{model.generation}"
        policy = self._policy
        if key not in policy or policy.should_compact() or not policy.hits_now(key):
            return None
        policy.acquire(key)  # a hit: counted, and the LRU touched, as any other
        policy.pin_in_use(key)
        return self._io.device[key]

    def release(self, model: ServedModel) -> None:
        self._policy.unpin_in_use(self.key(model))
        self._changes.notify()

    async def prefetch(self, model: ServedModel) -> None:
        """Start loading ``model`` if the policy finds it free of risk (module docstring)."""
        key = f"{model.name}#{model.generation}"
        if not self._prefetch or key not in self._policy:
            return
        plan = self._policy.prefetch_plan(key)
        if plan is None:
            return
        log.debug("prefetching %s (evicting %s)", key, list(plan.evict))
        outcome = await self._run(plan)
        for k, exc in outcome.failures.items():
            log.warning("weight cache: prefetch of %s failed: %s", k, describe(exc))

    # ------------------------------------------------------------ commands

    async def warm_up(self, model: ServedModel) -> dict[int, float]:
        """Run every compiled size on zeros; seconds per size (seeds the scheduler's costs).

        Until :meth:`finish_probe`, where the backend reports allocator statistics, each
        warm-up is a probe run (module docstring). In explicit mode an absent version is
        warmed up on a transient device copy, freed right after: the worker never keeps
        weights the control plane did not ask for.
        """
        key = self.key(model)
        if self._policy.explicit and not self._policy.is_resident(key):
            try:
                arrays = await self._thread(self._io.source(key))
            except RuntimeError as exc:
                if is_out_of_memory(exc):
                    raise load_out_of_memory(model.name, self._io.nbytes(key), exc) from exc
                raise
            try:
                return await self._thread(model.loaded.warmup, arrays)
            finally:
                await self._thread(self._runtime.free, arrays)
        if self._sizer.probing(self.probe_available):
            return await self._probe_run(key, model)
        weights = await self._acquire(key)
        costs, before, after = await self._measured_warmup(model, weights)
        if (
            before is not None
            and after is not None
            and self._sizer.observe_warm_up(
                peak_before=before.peak, peak_after=after.peak, in_use_before=before.in_use
            )
        ):
            log.info(
                "weight cache: %s raised the allocator peak; scratch estimate now %d bytes",
                key,
                after.peak - before.in_use,
            )
            async with self._exclusive():
                await self._resize()
        return costs

    async def _measured_warmup(
        self, model: ServedModel, weights: list[Any]
    ) -> tuple[dict[int, float], MemoryStats | None, MemoryStats | None]:
        """Warm ``model`` up on its acquired ``weights``, then release it: its costs, and
        the allocator's statistics just before and just after (None: not available)."""
        try:
            before = self._memory()
            costs: dict[int, float] = await self._thread(model.loaded.warmup, weights)
            after = self._memory()
        finally:
            self.release(model)
        return costs, before, after

    async def _probe_run(self, key: str, model: ServedModel) -> dict[int, float]:
        async with self._exclusive():
            await self._run(self._policy.evict_idle())  # the version runs alone
            weights = await self._acquire(key, command=True)
            costs, before, after = await self._measured_warmup(model, weights)
        if before is not None and after is not None:
            r = self._policy.residency(key)
            self._sizer.record_probe(
                ProbeMeasurement(
                    model=key,
                    weight_nbytes=r.nbytes,
                    peak_bytes=after.peak,
                    baseline_bytes=before.in_use,
                    pinned=r.floor == "device",
                )
            )
        return costs

    async def finish_probe(self) -> WeightBudget:
        """End the startup probe: size the budget with the measured scratch (0 where the
        backend reports no allocator statistics, e.g. the CPU)."""
        async with self._exclusive():
            live = self._policy.statistics().models.keys()
            runs = self._sizer.finish_probe(live, self._policy.pinned_bytes)
            await self._resize()
        b = self._sizer.budget
        log.info(
            "weight cache sized: %d probe run(s), max scratch %d bytes; arena %d, pool %d, "
            "pinned %d, on-demand budget %d bytes",
            runs,
            b.max_scratch,
            b.arena,
            b.weight_pool,
            b.pinned_bytes,
            b.on_demand,
        )
        return b

    async def compact(self, reload: Sequence[ServedModel] = ()) -> tuple[int, int]:
        """Free every on-demand device copy, then reload (CompactMemory).

        Returns (models reloaded, bytes of weights on the device afterwards).
        """
        keys = tuple(self.key(m) for m in reload)
        loaded = await self._compact(keys, reason="requested")
        return len(loaded), self.resident_bytes

    async def set_floor(self, model: ServedModel, floor: Residency) -> Residency:
        """Move a version to another residency floor (SetModelResidency)."""
        key = self.key(model)
        async with self._exclusive():
            outcome = await self._run(self._policy.set_floor(key, floor))
            await self._resize()
        if key in outcome.failures:
            raise ExecutionFailed(
                f"model {model.name!r}: moving its weights to {floor!r} failed: "
                f"{describe(outcome.failures[key])}"
            ) from outcome.failures[key]
        return self._policy.floor(key)

    # ----------------------------------------------------------- internals

    async def _acquire(self, key: str, *, command: bool = False) -> list[Any]:
        compacted = False
        while True:
            changed = self._changes.event  # taken before asking: no lost wake-up
            decision = self._policy.acquire(key, command=command)
            if isinstance(decision, Hit):
                arrays = self._io.device[key]
                self._policy.pin_in_use(key)
                return arrays
            if isinstance(decision, Wait):
                log.debug(
                    "weight cache: %s waits for %s (%s)", key, decision.blockers, decision.reason
                )
                await changed.wait()
                continue
            outcome = await self._run(decision, pin=key)
            if key in outcome.loaded:
                return self._io.device[key]
            error = outcome.failures[key]
            name = key.rpartition("#")[0]
            if not is_out_of_memory(error):
                raise ExecutionFailed(
                    f"model {name!r}: loading its weights onto the device failed: {describe(error)}"
                ) from error
            if compacted or command:
                # Already retried on a compacted arena, or inside a command (the probe),
                # which runs the version alone: there is nothing more to free.
                raise load_out_of_memory(name, self._io.nbytes(key), error) from error
            # The budget said it fits, the allocator disagrees: the free memory is in
            # pieces (fragmentation), or something outside the budget holds it. Free
            # every idle on-demand copy so the allocator can coalesce, and try once more.
            log.warning(
                "weight cache: the device is out of memory loading %s (%s); freeing every "
                "idle on-demand copy and trying once more",
                key,
                first_line(error),
            )
            await self._compact((), reason="out of memory")
            compacted = True

    async def _run(self, plan: CachePlan, *, pin: str | None = None) -> _Outcome:
        """Carry out ``plan`` in field order; report each load, then the plan, to the policy."""
        for warning in plan.warnings:
            log.warning("%s", warning)
        io = self._io
        loaded: list[str] = []
        failures: dict[str, BaseException] = {}
        try:
            with trio.CancelScope(shield=True):
                # Frees never wait (the runtime frees a buffer after the work queued on
                # it), so they run here, before any transfer starts.
                free_all(self._runtime, [io.device.pop(k) for k in plan.evict])
                await io.drop_host_copies(plan.host_drop)
                host_seconds: dict[str, float] = {}
                for key in plan.host_load:
                    start = time.perf_counter()
                    try:
                        await io.make_host_copy(key, system=self._policy.floor(key) == "system")
                    except Exception as exc:
                        failures[key] = exc
                    host_seconds[key] = time.perf_counter() - start
                for key in plan.load:
                    arrays: list[Any] | None = None
                    start = time.perf_counter()
                    if key not in failures:
                        inline = io.inline_source(key)
                        try:
                            # From a packed host copy the load is queued on the device and
                            # not waited for: on the loop, no thread hop (module docstring).
                            if inline is not None:
                                arrays = inline()
                            else:
                                arrays = await self._thread(io.source(key))
                        except Exception as exc:
                            failures[key] = exc
                    if arrays is None:
                        log.warning(
                            "weight cache: loading %s failed: %s", key, describe(failures[key])
                        )
                        follow = self._policy.load_failed(key)
                    else:
                        io.device[key] = arrays
                        seconds = time.perf_counter() - start + host_seconds.get(key, 0.0)
                        follow = self._policy.loaded(key, seconds)
                        if key == pin:
                            self._policy.pin_in_use(key)  # same step as loaded(): no eviction
                        loaded.append(key)
                    await io.drop_host_copies(follow.host_drop)
        finally:
            self._policy.done(plan)
            self._changes.notify()
        return _Outcome(tuple(loaded), failures)

    async def _compact(self, reload: Sequence[str], *, reason: str) -> tuple[str, ...]:
        async with self._exclusive():
            before = self.resident_bytes
            plan = self._policy.compact(reload)
            outcome = await self._run(plan)
        log.info(
            "weight cache compaction (%s): freed %d on-demand copies (%d bytes on the device "
            "before, %d after), reloaded %s",
            reason,
            len(plan.evict),
            before,
            self.resident_bytes,
            list(outcome.loaded) or "nothing",
        )
        return outcome.loaded

    async def _resize(self) -> None:
        """Re-solve the budget for the current pinned set and scratch (exclusive held)."""
        budget = self._sizer.resize(self._policy.pinned_bytes)
        if budget is None:
            return
        for warning in budget.warnings:
            log.warning("%s", warning)
        if budget.on_demand != self._policy.budget:
            log.info(
                "weight cache budget: %d bytes on demand (pool %d, pinned %d, scratch %d)",
                budget.on_demand,
                budget.weight_pool,
                budget.pinned_bytes,
                budget.max_scratch,
            )
            await self._run(self._policy.set_budget(budget.on_demand))

    async def _forget(self, key: str) -> None:
        await self._run(self._policy.unregister(key))
        del self._io.layouts[key]
        self._io.loaders.pop(key, None)

    @asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[None]:
        """Run a command alone: new acquires wait, in-flight batches and loads finish."""
        self._policy.want_command()
        started = False
        try:
            await self._changes.until(self._policy.try_start_command)
            started = True
            yield
        finally:
            self._policy.end_command(started=started)
            self._changes.notify()
