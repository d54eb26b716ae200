"""On-demand weights: which models' weights are on the device, and where the rest wait.

Three JAX-free parts, one concern each:

* ``policy``  -- :class:`WeightCachePolicy`, the sans-IO residency rules (budget, LRU,
  floors ``unpinned``/``system``/``device``, in-use protection, prefetch, compaction,
  removal, the gate for control commands), speaking in the frozen records of ``records``
  (plans, decisions, statistics);
* ``budget``  -- the budget formula, the startup peak-probe arithmetic and
  :class:`BudgetSizer`, which keeps the budget over the worker's life;
* ``host``    -- ``weights.safetensors`` read into RAM (``system``) or memory-mapped
  (``unpinned``), arrays in the bundle's argument order.

The device side (transfers in a worker thread, freeing buffers, reading the allocator's
peak) is the driver in ``reactantserver.runtime``; it feeds the policy events and carries
out the plans it returns. See docs/on_demand_weights.md.
"""

from .budget import (
    BudgetSizer,
    ProbeMeasurement,
    WeightBudget,
    arena_from_device,
    budget_from_config,
    cache_enabled,
    max_scratch,
    probe_order,
    resolve_arena,
    weight_budget,
)
from .host import (
    WEIGHTS_FILE,
    HostStore,
    HostStoreStatistics,
    HostWeights,
    MappedWeights,
    TensorSpec,
    WeightsLayout,
    map_weights,
    read_layout,
)
from .policy import WeightCachePolicy
from .records import (
    AcquireDecision,
    CachePlan,
    CacheStatistics,
    DeviceState,
    Hit,
    MemoryStats,
    ModelResidency,
    Wait,
    WeightCacheStatistics,
)

__all__ = [
    "WEIGHTS_FILE",
    "AcquireDecision",
    "BudgetSizer",
    "CachePlan",
    "CacheStatistics",
    "DeviceState",
    "Hit",
    "HostStore",
    "HostStoreStatistics",
    "HostWeights",
    "MappedWeights",
    "MemoryStats",
    "ModelResidency",
    "ProbeMeasurement",
    "TensorSpec",
    "Wait",
    "WeightBudget",
    "WeightCachePolicy",
    "WeightCacheStatistics",
    "WeightsLayout",
    "arena_from_device",
    "budget_from_config",
    "cache_enabled",
    "map_weights",
    "max_scratch",
    "probe_order",
    "read_layout",
    "resolve_arena",
    "weight_budget",
]
