"""Device weights per model version: the one interface the worker uses, and the cache off.

:class:`WeightProvider` is every call the worker and the executor make about weights:
the lifecycle (``add``, ``warm_up``, ``finish_probe``, ``remove``), the batch
(``acquire``, ``release``, ``prefetch``), the control RPCs (``set_floor``, ``compact``)
and what ModelControlStatus and the metrics read. Two classes implement it, and
:func:`make_weight_provider` picks one per worker from its configuration -- the only
place that decides whether the on-demand cache runs:

* :class:`~reactantserver.runtime.weight_cache.CachedWeights`, the on-demand cache
  (``runtime.weight_cache_fraction > 0`` and an arena: the device's, or
  ``runtime.arena_bytes`` on the CPU);
* :class:`ResidentWeights`, the cache off: every version's weights are on the device
  from ``add`` to ``remove``. Its one rule: ``remove`` defers freeing until the last
  batch using the version has released it, so unloading or replacing a model never
  pulls weights from under a running batch.

Versions are keyed by the ``ServedModel`` object (two versions of one name coexist
during a swap, each with its own weights).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..bundle import Bundle
from ..config.schema import Residency, ServerConfig
from ..errors import FailedPrecondition
from ..threads import ThreadRunner, in_threads
from ..weights import (
    HostStore,
    WeightBudget,
    WeightCacheStatistics,
    cache_enabled,
    probe_order,
    resolve_arena,
)
from .host_memory import PinnedHostStaging, copying_allocate
from .weight_cache import CachedWeights

if TYPE_CHECKING:
    from ..models import ServedModel
    from .runtime import Runtime

__all__ = ["ResidentWeights", "WeightProvider", "make_weight_provider", "startup_order"]

log = logging.getLogger(__name__)


class WeightProvider(Protocol):
    """Device weights per model version (see the module docstring)."""

    # ---------------------------------------------------------------- lifecycle

    async def add(self, model: ServedModel) -> None:
        """Start tracking a version (load it now if its residency says so)."""

    async def warm_up(self, model: ServedModel) -> dict[int, float]:
        """Run every compiled size on zeros: seconds per size, to seed the cost estimates."""
        ...

    async def finish_probe(self) -> WeightBudget | None:
        """The startup set is warmed up: size the on-demand budget (``None``: no cache)."""
        ...

    async def remove(self, model: ServedModel) -> None:
        """Stop tracking a version; its device memory is freed once no batch uses it."""

    # ---------------------------------------------------------------- batches

    async def acquire(self, model: ServedModel) -> Sequence[Any]:
        """The version's device weights, resident and protected until ``release``."""
        ...

    def acquire_now(self, model: ServedModel) -> Sequence[Any] | None:
        """``acquire`` where it needs no wait (resident, nothing in the way), as a plain
        call: the weights, protected until ``release``; None, with nothing changed, where
        ``acquire`` would wait, load or fail (the dispatch loop's pass of the host loop)."""
        ...

    def release(self, model: ServedModel) -> None:
        """The batch that acquired ``model`` is done with its weights."""

    async def prefetch(self, model: ServedModel) -> None:
        """Best effort: make ``model`` resident ahead of time if that evicts nothing in use."""

    # ---------------------------------------------------------------- control

    async def set_floor(self, model: ServedModel, floor: Residency) -> Residency:
        """SetModelResidency: move the version to ``floor``; the floor afterwards."""
        ...

    async def compact(self, reload: Sequence[ServedModel] = ()) -> tuple[int, int]:
        """CompactMemory: (models reloaded, bytes of weights on the device afterwards)."""
        ...

    # ---------------------------------------------------------------- reads

    @property
    def resident_bytes(self) -> int:
        """Bytes of every weight on the device now."""
        ...

    @property
    def on_demand_budget(self) -> int:
        """The on-demand LRU's cap (0 with the cache off)."""
        ...

    def is_resident(self, model: ServedModel) -> bool: ...

    def host_resident(self, model: ServedModel) -> bool: ...

    def floor(self, model: ServedModel) -> Residency: ...

    def statistics(self) -> WeightCacheStatistics | None:
        """The cache's snapshot (metrics), or ``None`` with the cache off."""
        ...


class ResidentWeights:
    """The weight cache turned off: every version stays on the device while it is served."""

    def __init__(
        self,
        to_device: Callable[[list[np.ndarray]], list[Any]],
        free: Callable[[Sequence[Any]], None],
        *,
        thread: ThreadRunner | None = None,
    ) -> None:
        self._to_device = to_device
        self._free = free
        self._thread = thread if thread is not None else in_threads()
        self._arrays: dict[ServedModel, Sequence[Any]] = {}
        self._in_use: dict[ServedModel, int] = {}
        self._retired: set[ServedModel] = set()

    async def add(self, model: ServedModel) -> None:
        host = await self._thread(model.bundle.read_weights)
        self._arrays[model] = await self._thread(self._to_device, host)

    async def warm_up(self, model: ServedModel) -> dict[int, float]:
        weights = await self.acquire(model)
        try:
            return await self._thread(model.loaded.warmup, weights)
        finally:
            self.release(model)

    async def finish_probe(self) -> None:
        return None  # no budget to size

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

    def acquire_now(self, model: ServedModel) -> Sequence[Any] | None:
        arrays = self._arrays.get(model)
        if arrays is None:
            return None  # removed: acquire says why
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

    # The control RPCs and the reads. With the cache off the answers are constant: every
    # model is on the device, nothing has a host copy, there is no on-demand budget, and
    # nothing can be moved or compacted.

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

    @property
    def resident_bytes(self) -> int:
        return sum(m.bundle.weights_nbytes for m in self._arrays)

    @property
    def on_demand_budget(self) -> int:
        return 0

    def is_resident(self, model: ServedModel) -> bool:
        return model in self._arrays

    def host_resident(self, model: ServedModel) -> bool:
        return False

    def floor(self, model: ServedModel) -> Residency:
        return "device"

    def statistics(self) -> None:
        return None

    def _drop(self, model: ServedModel) -> None:
        arrays = self._arrays.pop(model, None)
        if arrays is not None:
            self._free(arrays)
            log.debug("freed the device weights of %r", model)


# ------------------------------------------------------------------------- the factory


def startup_order(bundles: Mapping[str, Bundle], config: ServerConfig) -> list[str]:
    """The order to load the startup set in: ``probe_order`` (pinned models first, then
    ascending weight size), which makes the cache's probe exact; ``kind: meta`` bundles
    (no weights) last, by name, once the models they call are loaded."""
    sizes = {name: b.weights_nbytes for name, b in bundles.items() if not b.is_meta}
    pinned = {n for n in sizes if config.scheduler.for_model(n).residency == "device"}
    metas = sorted(n for n, b in bundles.items() if b.is_meta)
    return [*probe_order(sizes, pinned), *metas]


def make_weight_provider(
    config: ServerConfig, runtime: Runtime, *, thread: ThreadRunner | None = None
) -> WeightProvider:
    """The cache when it is on for this worker (``weights.cache_enabled``), else every
    model's weights device resident for its lifetime. ``thread`` runs their blocking
    steps (default: worker threads)."""
    stats = runtime.memory_stats()
    arena = resolve_arena(stats.limit if stats is not None else None, config.runtime)
    if not cache_enabled(config.runtime, arena):
        log.info(
            "on-demand weight cache off (weight_cache_fraction %g, arena %s): every model's "
            "weights stay on the device",
            config.runtime.weight_cache_fraction,
            f"{arena} bytes" if arena else "none; set runtime.arena_bytes on the CPU backend",
        )
        return ResidentWeights(runtime.to_device, runtime.free, thread=thread)
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
        thread=thread,
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
