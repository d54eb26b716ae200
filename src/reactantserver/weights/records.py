"""The records the weight-cache policy speaks in: decisions for the driver, statistics out.

Every record is frozen; the policy (``policy.py``) creates them and nothing mutates them,
so a driver may keep a :class:`CachePlan` while it runs and a metrics collector may keep a
:class:`CacheStatistics` snapshot while the policy moves on. The device-side snapshot
(:class:`WeightCacheStatistics`, with the budget and the host store) and the allocator's
numbers (:class:`MemoryStats`) are here too, so that whatever reads them -- the metrics
collector, tests -- needs neither the runtime nor JAX.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, TypeAlias

import attrs

from ..config.schema import Residency
from .budget import WeightBudget
from .host import HostStoreStatistics

__all__ = [
    "AcquireDecision",
    "CachePlan",
    "CacheStatistics",
    "DeviceState",
    "Hit",
    "MemoryStats",
    "ModelResidency",
    "Wait",
    "WeightCacheStatistics",
]

DeviceState = Literal["absent", "loading", "resident"]


# ----------------------------------------------------------------------------- decisions


@attrs.frozen(kw_only=True)
class CachePlan:
    """I/O for the driver to carry out, in field order, then report with ``done``.

    ``evict``: free these device copies. ``host_drop``: release these host copies (a
    ``system`` copy or a transient map). ``host_load``: make a host copy available, by
    reading the file into RAM for a ``system`` model or by mapping it for the others.
    ``load``: transfer these to the device, then report ``WeightCachePolicy.loaded`` or
    ``WeightCachePolicy.load_failed`` for each.
    """

    evict: tuple[str, ...] = ()
    host_drop: tuple[str, ...] = ()
    host_load: tuple[str, ...] = ()
    load: tuple[str, ...] = ()
    #: The model loading past the budget, alone (log :attr:`warnings`).
    oversize: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """Nothing to do."""
        return not (self.evict or self.host_drop or self.host_load or self.load)


@attrs.frozen
class Hit:
    """The model's weights are on the device: run it."""

    name: str


@attrs.frozen(kw_only=True)
class Wait:
    """The load cannot start now: retry after a blocker is unpinned or finishes loading.

    ``reason`` is ``loading`` when the model itself is being loaded (a prefetch, or a
    load planned earlier) or only loads in flight stand in the way; ``in_use`` when a
    model pinned by a running execution does; ``command`` when a control command waits
    or runs (no blockers: retry once it has finished).
    """

    name: str
    blockers: tuple[str, ...]
    reason: Literal["in_use", "loading", "command"]


#: What :meth:`WeightCachePolicy.acquire` answers.
AcquireDecision: TypeAlias = Hit | Wait | CachePlan


# ---------------------------------------------------------------------------- statistics


@attrs.frozen(kw_only=True)
class ModelResidency:
    """Where one model's weights are."""

    name: str
    nbytes: int
    floor: Residency
    device: DeviceState
    host: bool
    in_use: int
    #: Loaded by a prefetch and not acquired since.
    prefetched: bool


@attrs.frozen(kw_only=True)
class CacheStatistics:
    """A snapshot of the cache for metrics and ModelControlStatus (byte counts in bytes)."""

    residency_mode: Literal["self_managed", "externally_managed"]
    #: The on-demand budget.
    budget: int
    #: Non-pinned weights loading or resident (what the budget bounds).
    resident_bytes: int
    #: Weights of every ``device``-floor model (reserved off the pool).
    pinned_bytes: int
    #: Weights with a host copy right now (``system`` copies and transient maps).
    host_bytes: int
    hits: int
    misses: int
    #: Completed on-demand loads (prefetches and compaction reloads included).
    loads: int
    #: Completed loads of ``device``-floor models.
    pinned_loads: int
    load_failures: int
    load_seconds: float
    evictions: int
    oversize_loads: int
    compactions: int
    prefetches: int
    #: Prefetched models that were then acquired before being evicted.
    prefetch_hits: int
    #: Prefetched models evicted without ever being acquired.
    prefetch_wasted: int
    #: Non-pinned models loading or resident, least recently used first.
    lru: tuple[str, ...]
    models: Mapping[str, ModelResidency]


@attrs.frozen(kw_only=True)
class WeightCacheStatistics:
    """A snapshot of the cache on a device, for metrics and ModelControlStatus (bytes)."""

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
class MemoryStats:
    """Device allocator statistics in bytes (GPU backends; the CPU reports none)."""

    in_use: int
    limit: int
    peak: int
    #: Everything the device reported, for metrics that want more.
    raw: Mapping[str, int]
