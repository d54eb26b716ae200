"""The on-demand weight cache on a device: the driver that carries out the policy's plans.

``WeightCachePolicy`` (``reactantserver.weights``) decides which model versions' weights
are on the device; :class:`CachedWeights` does the I/O it asks for and implements the
executor's ``WeightProvider`` seam (add / remove / acquire / release / prefetch). It is
the whole runtime side of docs/on_demand_weights.md.

Theory of operation
-------------------
Keys. The policy is keyed by a *version*, ``f"{name}#{generation}"``: during a hot swap
two versions of one model coexist, each with its own weights, and the one a batch was
admitted with is the one it runs on.

Plans. Every decision comes back as a :class:`~reactantserver.weights.Plan`, carried out
in field order by :meth:`CachedWeights._run`: device copies of the victims are taken out
of the table at once (no later step can hand them to a batch) and freed in a worker
thread *before* any transfer starts, so the device never holds more than the budget;
host copies are dropped or made (``system``: the file read into RAM, or staged in the
device's pinned host memory; others: a transient read-only map); then each transfer
runs in a worker thread and is reported back with ``loaded`` / ``load_failed``. A plan
is carried out under a shielded cancel scope: a cancelled caller never leaves the
policy believing a load is in flight forever.

Acquire. ``acquire`` asks the policy: a :class:`Hit` pins the version in use and returns
its device arrays; a load plan is carried out and the version is pinned in the same
synchronous step as ``loaded`` (no checkpoint in between, so nothing can evict it first);
a :class:`Wait` parks on a change notification (any release, finished load, removal or
control command) and asks again. A version pinned in use is never evicted, so the arrays
an execution was handed stay on the device until its ``release``: no model is ever
missing weights at execution.

Exclusive commands. Compaction, residency changes, re-sizing the budget and the startup
probe must run between batches. :meth:`CachedWeights._exclusive` closes a gate that
new acquires and prefetches wait at, then waits until nothing is pinned and no plan is
being carried out; the one execution on the device finishes first, and the command
runs alone. Automatic compaction (``scheduler.compaction_interval``) runs this way at
the start of the acquire that follows the N-th load, and reloads the model that acquire
is for.

Prefetch. ``prefetch`` (the dispatch loop calls it with the model it expects next while
a batch executes) asks ``prefetch_plan`` and carries the plan out; the transfer overlaps
the execution. The policy's rules make a wrong guess cost at most what the demand load
would have; ``runtime.weight_prefetch: false`` turns it off.

Budget and probe. The arena is the allocator's ``bytes_limit`` where the backend reports
one (GPU), else ``runtime.arena_bytes``; the budget is re-solved (``weight_budget``) when
the pinned set changes and when the probe ends. The startup probe is the startup
warm-up: where the backend reports allocator statistics, the worker loads its startup
set in ``probe_order`` (pinned first, then ascending weight size, :func:`startup_order`)
and each warm-up frees every idle on-demand copy first, runs the version alone and
records ``peak - in_use_before``. The peak cannot be reset through JAX, so that
difference bounds the run's transient memory from above whatever ran before; because
the runs go in ascending weight size, an earlier run's peak exceeds a later baseline by
no more than the earlier run's own scratch, so the largest difference is exactly the
worst run's scratch (compile-time allocations such as autotuning can only inflate it).
:meth:`finish_probe` then sizes the budget. The CPU reports no statistics: no probe,
scratch 0. A model loaded later raises the estimate only if its warm-up raised the peak.

Host memory. Where the backend offers a ``pinned_host`` memory space (CUDA), ``system``
host copies are staged there, so a load is one DMA; on the CPU, host copies come from
``copying_allocate`` so that a device copy is a real copy (``host_memory.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

from ..bundle import Bundle
from ..config.schema import Residency, RuntimeConfig, ServerConfig
from ..errors import BundleError, ExecutionFailed, LifecycleError
from ..weights import (
    WEIGHTS_FILE,
    CacheStatistics,
    Hit,
    HostStore,
    HostStoreStatistics,
    MappedWeights,
    ModelResidency,
    Plan,
    ProbeMeasurement,
    Wait,
    WeightBudget,
    WeightCachePolicy,
    WeightsLayout,
    cache_enabled,
    max_scratch,
    probe_order,
    read_layout,
    resolve_arena,
    weight_budget,
)
from .executor import ResidentWeights
from .host_memory import PinnedHostStaging, copying_allocate
from .runtime import MemoryStats

if TYPE_CHECKING:
    from ..models import ServedModel
    from .runtime import Runtime

__all__ = [
    "CachedWeights",
    "DeviceRuntime",
    "WeightCacheStatistics",
    "make_weight_provider",
    "startup_order",
]

log = logging.getLogger(__name__)


class DeviceRuntime(Protocol):
    """What the cache needs of ``Runtime`` (tests pass a fake with the same methods)."""

    def to_device(self, host_arrays: Sequence[Any]) -> list[Any]: ...

    def free(self, device_arrays: Sequence[Any]) -> None: ...

    def memory_stats(self) -> MemoryStats | None: ...


@attrs.frozen(kw_only=True)
class WeightCacheStatistics:
    """A snapshot of the cache for metrics and ModelControlStatus (byte counts in bytes)."""

    #: The policy's counters and residency (keys are versions: ``name#generation``).
    policy: CacheStatistics
    #: The current split of the arena.
    budget: WeightBudget
    host: HostStoreStatistics
    #: Every weight on the device now: device-floor plus on-demand resident copies.
    device_bytes: int
    #: ``system`` copies staged in pinned host memory.
    staged_bytes: int
    pinned_host: bool
    prefetch: bool
    #: Whether the startup probe measured the scratch (``budget.max_scratch``).
    probed: bool


@attrs.frozen
class _Outcome:
    """What carrying out one plan did."""

    loaded: tuple[str, ...]
    failures: MappingProxyType[str, BaseException]


_Source = Callable[[], list[Any]]


class CachedWeights:
    """``WeightProvider`` over ``WeightCachePolicy`` and ``HostStore`` (module docstring)."""

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
    ) -> None:
        self._runtime = runtime
        self._config = config
        self._arena = arena
        self._max_scratch = 0
        self._probed = False
        self._measurements: list[ProbeMeasurement] = []
        self._budget = self._solve(pinned_bytes=0)
        self._policy = WeightCachePolicy(
            self._budget.on_demand, explicit=explicit, compaction_interval=compaction_interval
        )
        self._staging = staging
        self._memory = memory if memory is not None else runtime.memory_stats
        self._store = host if host is not None else HostStore()
        self._prefetch = config.weight_prefetch
        # Per version key: its model, the header of its weights file, its copies.
        self._keys: dict[ServedModel, str] = {}
        self._models: dict[str, ServedModel] = {}
        self._layouts: dict[str, WeightsLayout] = {}
        self._device: dict[str, list[Any]] = {}
        self._staged: dict[str, list[Any]] = {}
        self._maps: dict[str, MappedWeights] = {}
        self._removing: set[str] = set()
        # Exclusive commands, the gate they close, and what they wait to reach zero.
        self._control = trio.Lock()
        self._gated = 0
        self._pins = 0
        self._inflight = 0
        self._changed = trio.Event()
        # Cache I/O gets its own threads: never queued behind the device execution.
        self._threads = trio.CapacityLimiter(2)
        for warning in self._budget.warnings:
            log.warning("%s", warning)

    # ------------------------------------------------------------------ queries

    @property
    def policy(self) -> WeightCachePolicy:
        """The policy (read it; only this driver may change it)."""
        return self._policy

    @property
    def budget(self) -> WeightBudget:
        return self._budget

    @property
    def resident_bytes(self) -> int:
        """Bytes of every weight on the device now (pinned and on demand)."""
        return sum(self._layouts[k].nbytes for k in self._device)

    @property
    def probe_available(self) -> bool:
        """Whether the backend reports allocator statistics (the startup probe can run)."""
        return self._memory() is not None

    def key(self, model: ServedModel) -> str:
        key = self._keys.get(model)
        if key is None:
            raise LifecycleError(f"weight cache: {model!r} was never added (or was removed)")
        return key

    def is_resident(self, model: ServedModel) -> bool:
        key = self._keys.get(model)
        return key is not None and key in self._device

    @property
    def on_demand_budget(self) -> int:
        """The LRU's cap (``weight_cache_max_bytes``)."""
        return self._budget.on_demand

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
            budget=self._budget,
            host=self._store.statistics(),
            device_bytes=self.resident_bytes,
            staged_bytes=sum(self._layouts[k].nbytes for k in self._staged),
            pinned_host=self._staging is not None,
            prefetch=self._prefetch,
            probed=self._probed,
        )

    # -------------------------------------------------------- WeightProvider

    async def add(self, model: ServedModel) -> None:
        """Register a version: read its header, then its host copy or device load."""
        if model in self._keys:
            raise LifecycleError(f"weight cache: {model!r} was added twice")
        key = f"{model.name}#{model.generation}"
        layout = await self._thread(_read_checked_layout, model.bundle)
        self._keys[model] = key
        self._models[key] = model
        self._layouts[key] = layout
        outcome = await self._run(self._policy.register(key, layout.nbytes, model.sched.residency))
        if outcome.failures:
            error = next(iter(outcome.failures.values()))
            await self._forget(key)
            raise BundleError(
                model.name, f"{WEIGHTS_FILE}: could not place the weights: {_describe(error)}"
            ) from error
        if self._policy.floor(key) == "device":
            async with self._exclusive():
                await self._resize()

    async def remove(self, model: ServedModel) -> None:
        """Forget a version once no batch uses it and no load of it is in flight."""
        key = self._keys.get(model)
        if key is None:
            return
        self._removing.add(key)
        await self._until(lambda: self._idle(key))
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
        return await self._acquire(key, gated=True)

    def release(self, model: ServedModel) -> None:
        key = self.key(model)
        self._policy.unpin_in_use(key)
        self._pins -= 1
        self._notify()

    async def prefetch(self, model: ServedModel) -> None:
        """Start loading ``model`` if the policy finds it free of risk (module docstring)."""
        key = self._keys.get(model)
        if not self._prefetch or self._gated or key is None or key in self._removing:
            return
        plan = self._policy.prefetch_plan(key)
        if plan is None:
            return
        log.debug("prefetching %s (evicting %s)", key, list(plan.evict))
        outcome = await self._run(plan)
        for k, exc in outcome.failures.items():
            log.warning("weight cache: prefetch of %s failed: %s", k, _describe(exc))

    # ------------------------------------------------------------ commands

    async def warm_up(self, model: ServedModel) -> dict[int, float]:
        """Run every compiled size on zeros; seconds per size (seeds the scheduler's costs).

        Until :meth:`finish_probe`, where the backend reports allocator statistics, each
        warm-up is a probe run: every idle on-demand copy is freed first, the version
        runs alone, and ``peak - in_use_before`` is recorded (the worker warms the
        startup set up in ``probe_order``). Later, a warm-up that raises the allocator's
        peak raises the scratch estimate, and so shrinks the budget. In explicit mode an
        absent version is warmed up on a transient device copy, freed right after: the
        worker never keeps weights the control plane did not ask for.
        """
        key = self.key(model)
        if self._policy.explicit and not self._policy.is_resident(key):
            arrays = await self._thread(self._source(key))
            try:
                return await self._thread(model.loaded.warmup, arrays)
            finally:
                await self._thread(self._runtime.free, arrays)
        if not self._probed and self.probe_available:
            return await self._probe_run(key, model)
        weights = await self._acquire(key, gated=True)
        try:
            before = self._memory()
            costs: dict[int, float] = await self._thread(model.loaded.warmup, weights)
            after = self._memory()
        finally:
            self.release(model)
        if self._probed and before is not None and after is not None and after.peak > before.peak:
            scratch = after.peak - before.in_use
            if scratch > self._max_scratch:
                log.info(
                    "weight cache: %s raised the allocator peak; scratch estimate %d -> %d bytes",
                    key,
                    self._max_scratch,
                    scratch,
                )
                self._max_scratch = scratch
                async with self._exclusive():
                    await self._resize()
        return costs

    async def _probe_run(self, key: str, model: ServedModel) -> dict[int, float]:
        async with self._exclusive():
            await self._evict_all()
            weights = await self._acquire(key, gated=False)
            try:
                before = self._memory()
                costs: dict[int, float] = await self._thread(model.loaded.warmup, weights)
                after = self._memory()
            finally:
                self.release(model)
        if before is not None and after is not None:
            r = self._policy.residency(key)
            self._measurements.append(
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
            live = {k for k in self._models}
            runs = [m for m in self._measurements if m.model in live]
            self._max_scratch = max_scratch(runs, self._policy.statistics().pinned_bytes)
            self._probed = True
            self._measurements.clear()
            await self._resize()
        b = self._budget
        log.info(
            "weight cache sized: %d probe run(s), max scratch %d bytes; arena %d, pool %d, "
            "pinned %d, on-demand budget %d bytes",
            len(runs),
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
                f"{_describe(outcome.failures[key])}"
            ) from outcome.failures[key]
        return self._policy.floor(key)

    # ----------------------------------------------------------- internals

    async def _acquire(self, key: str, *, gated: bool) -> list[Any]:
        while True:
            if gated and self._gated:
                await self._until(lambda: not self._gated)
            if key in self._removing:
                raise LifecycleError(f"weight cache: {key} is being removed")
            decision = self._policy.acquire(key)  # NotResident in explicit mode
            if isinstance(decision, Hit):
                return self._pin(key)
            if isinstance(decision, Wait):
                changed = self._changed  # taken before any checkpoint: no lost wake-up
                log.debug(
                    "weight cache: %s waits for %s (%s)", key, decision.blockers, decision.reason
                )
                await changed.wait()
                continue
            outcome = await self._run(decision, pin=key)
            if key in outcome.loaded:
                return self._device[key]
            error = outcome.failures[key]
            name = self._models[key].name
            raise ExecutionFailed(
                f"model {name!r}: loading its weights onto the device failed: {_describe(error)}"
            ) from error

    def _pin(self, key: str) -> list[Any]:
        arrays = self._device.get(key)
        if arrays is None:  # the policy and the table disagree: a bug, never run without
            raise LifecycleError(f"weight cache: {key} is resident but has no device arrays")
        self._policy.pin_in_use(key)
        self._pins += 1
        return arrays

    async def _run(self, plan: Plan, *, pin: str | None = None) -> _Outcome:
        """Carry out ``plan`` in field order; report each load to the policy."""
        for warning in plan.warnings:
            log.warning("%s", warning)
        loaded: list[str] = []
        failures: dict[str, BaseException] = {}
        self._inflight += 1
        try:
            with trio.CancelScope(shield=True):
                victims = [self._device.pop(k) for k in plan.evict if k in self._device]
                if victims and (plan.host_drop or plan.host_load or not plan.load):
                    await self._thread(_free_all, self._runtime, victims)
                    victims = []
                # else the victims are freed by the first transfer's thread, right before
                # it starts: one thread hop per cold load instead of two.
                await self._drop_hosts(plan.host_drop)
                host_seconds: dict[str, float] = {}
                for key in plan.host_load:
                    start = time.perf_counter()
                    try:
                        await self._host_load(key)
                    except Exception as exc:
                        failures[key] = exc
                    host_seconds[key] = time.perf_counter() - start
                for key in plan.load:
                    arrays: list[Any] | None = None
                    start = time.perf_counter()
                    if key not in failures:
                        try:
                            arrays = await self._thread(
                                _free_then, self._runtime, victims, self._source(key)
                            )
                        except Exception as exc:
                            failures[key] = exc
                        victims = []
                    if arrays is None:
                        log.warning(
                            "weight cache: loading %s failed: %s", key, _describe(failures[key])
                        )
                        follow = self._policy.load_failed(key)
                    else:
                        self._device[key] = arrays
                        seconds = time.perf_counter() - start + host_seconds.get(key, 0.0)
                        follow = self._policy.loaded(key, seconds)
                        if key == pin:
                            self._pin(key)  # same step as loaded(): nothing evicts it first
                        loaded.append(key)
                    await self._drop_hosts(follow.host_drop)
        finally:
            self._inflight -= 1
            self._notify()
        return _Outcome(tuple(loaded), MappingProxyType(failures))

    async def _host_load(self, key: str) -> None:
        layout = self._layouts[key]
        if self._policy.floor(key) == "system":
            copy = await self._thread(self._store.materialize, key, layout)
            if self._staging is not None:
                staged = await self._thread(self._staging.stage, copy.arrays)
                self._staged[key] = staged
                self._store.drop(key)  # the pinned copy replaces the pageable one
        elif layout.tensors:
            self._maps[key] = await self._thread(self._store.map, key, layout)

    async def _drop_hosts(self, keys: Iterable[str]) -> None:
        for key in keys:
            mapped = self._maps.pop(key, None)
            if mapped is not None:
                mapped.close()
            staged = self._staged.pop(key, None)
            if staged is not None:
                await self._thread(_free_all, self._runtime, [staged])
            self._store.drop(key)

    def _source(self, key: str) -> _Source:
        """A thread-side function that transfers ``key``'s weights and returns them."""
        layout = self._layouts[key]
        if not layout.tensors:
            return list
        staged = self._staged.get(key)
        if staged is not None and self._staging is not None:
            return partial(self._staging.to_device, staged)
        copy = self._store.get(key)
        if copy is not None:
            return partial(self._runtime.to_device, copy.arrays)
        mapped = self._maps.get(key)
        if mapped is not None and not mapped.closed:
            return partial(self._runtime.to_device, mapped.weights.arrays)
        # No host copy (a transient warm-up, or a system copy that failed to be made):
        # map the file for this one transfer.
        return partial(_transfer_mapped, self._runtime, self._store, key, layout)

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

    async def _evict_all(self) -> None:
        """Free every idle on-demand copy (exclusive held): the probe runs models alone."""
        budget = self._policy.budget
        assert budget is not None
        plan = self._policy.set_budget(0)
        self._policy.set_budget(budget)  # grows back: evicts nothing
        await self._run(plan)

    def _solve(self, *, pinned_bytes: int) -> WeightBudget:
        return weight_budget(
            arena=self._arena,
            fraction=self._config.weight_cache_fraction,
            wiggle=self._config.weight_cache_wiggle_fraction,
            max_scratch=self._max_scratch,
            pinned_bytes=pinned_bytes,
        )

    async def _resize(self) -> None:
        """Re-solve the budget for the current pinned set and scratch (exclusive held)."""
        budget = self._solve(pinned_bytes=self._policy.statistics().pinned_bytes)
        if budget == self._budget:
            return
        self._budget = budget
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
        model = self._models.pop(key)
        del self._keys[model]
        del self._layouts[key]
        self._removing.discard(key)

    def _idle(self, key: str) -> bool:
        r = self._policy.residency(key)
        return r.in_use == 0 and r.device != "loading"

    @asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[None]:
        """Run a command alone: new acquires wait, in-flight batches and loads finish."""
        async with self._control:
            self._gated += 1
            try:
                await self._until(lambda: self._pins == 0 and self._inflight == 0)
                yield
            finally:
                self._gated -= 1
                self._notify()

    async def _until(self, ready: Callable[[], bool]) -> None:
        while True:
            changed = self._changed
            if ready():
                return
            await changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._threads)


# ------------------------------------------------------------------ thread-side helpers


def _read_checked_layout(bundle: Bundle) -> WeightsLayout:
    """The weights header, checked against what the bundle was validated with."""
    path = bundle.weights_path
    if path is None:
        return WeightsLayout(path="", tensors=(), file_size=0, metadata=MappingProxyType({}))
    layout = read_layout(path)
    got = [(t.name, t.dtype, t.shape) for t in layout.tensors]
    want = [(w.name, w.dtype, tuple(w.shape)) for w in bundle.weight_specs]
    if got != want:
        raise BundleError(
            bundle.name,
            f"{path.name} changed on disk since the bundle was read (tensors now {got}, "
            f"loaded as {want}); the repository watcher will load the new version",
        )
    return layout


def _transfer_mapped(
    runtime: DeviceRuntime, store: HostStore, key: str, layout: WeightsLayout
) -> list[Any]:
    with store.map(key, layout) as mapped:
        return runtime.to_device(mapped.weights.arrays)


def _free_all(runtime: DeviceRuntime, groups: Sequence[Sequence[Any]]) -> None:
    for arrays in groups:
        runtime.free(arrays)


def _free_then(
    runtime: DeviceRuntime, victims: Sequence[Sequence[Any]], load: _Source
) -> list[Any]:
    """Free the victims, then transfer: the plan's order, in one thread hop."""
    _free_all(runtime, victims)
    return load()


def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# ------------------------------------------------------------------------- the factory


def startup_order(bundles: Mapping[str, Bundle], config: ServerConfig) -> list[str]:
    """The order to load the startup set in with the cache on: ``probe_order`` (pinned
    models first, then ascending weight size), which makes the probe exact; ``kind:
    meta`` bundles (no weights) last, by name, once the models they call are loaded."""
    sizes = {name: b.weights_nbytes for name, b in bundles.items() if not b.is_meta}
    pinned = {n for n in sizes if config.scheduler.for_model(n).residency == "device"}
    metas = sorted(n for n, b in bundles.items() if b.is_meta)
    return [*probe_order(sizes, pinned), *metas]


def make_weight_provider(config: ServerConfig, runtime: Runtime) -> CachedWeights | ResidentWeights:
    """The cache when it is on for this worker (``budget.cache_enabled``), else every
    model's weights device resident for its lifetime."""
    stats = runtime.memory_stats()
    arena = resolve_arena(stats.limit if stats is not None else None, config.runtime)
    if not cache_enabled(config.runtime, arena):
        log.info(
            "on-demand weight cache off (weight_cache_fraction %g, arena %s): every model's "
            "weights stay on the device",
            config.runtime.weight_cache_fraction,
            f"{arena} bytes" if arena else "none; set runtime.arena_bytes on the CPU backend",
        )
        return ResidentWeights(runtime.to_device, runtime.free)
    assert arena is not None
    cuda = runtime.backend == "cuda"
    staging = PinnedHostStaging.for_device(runtime.device) if cuda else None
    cache = CachedWeights(
        runtime,
        config.runtime,
        arena=arena,
        explicit=config.model_control_mode == "explicit",
        compaction_interval=config.scheduler.compaction_interval,
        staging=staging,
        host=HostStore() if cuda else HostStore(allocate=copying_allocate),
    )
    b = cache.budget
    log.info(
        "on-demand weight cache on: arena %d bytes (%s), on-demand budget %d bytes before the "
        "probe; host copies in %s memory; prefetch %s",
        arena,
        "reported by the device" if stats is not None and stats.limit else "runtime.arena_bytes",
        b.on_demand,
        "pinned host" if staging is not None else "pageable",
        "on" if config.runtime.weight_prefetch else "off",
    )
    return cache
