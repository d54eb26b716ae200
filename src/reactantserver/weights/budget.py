"""How many bytes of device memory the on-demand weight cache may use: pure arithmetic.

Theory of operation
-------------------
At the worst instant the device arena holds four things at once: the weights of every
``device``-floor model (*pinned*), the on-demand weights currently cached, the transient
memory of the one execution in flight (*scratch*: activations, GEMM/conv workspace,
inputs and outputs), and a slack the operator keeps free (*wiggle*). The cache budget is
what is left for on-demand weights once the other three are reserved::

    scratch_ceiling = floor((1 - wiggle) * arena)
    weight_pool     = max(0, min(floor(fraction * arena), scratch_ceiling - max_scratch))
    on_demand       = clamp(weight_pool - pinned, 0, weight_pool)

``fraction`` (``runtime.weight_cache_fraction``) caps the share of the arena devoted to
weights, pinned plus on demand; ``wiggle`` (``runtime.weight_cache_wiggle_fraction``) is
held back from everything. Pinned weights come off the top of the pool, so an operator
never subtracts them by hand. When the pinned set alone exceeds the pool, or nothing is
left for on-demand weights, no sizing can fix it and :attr:`WeightBudget.warnings` says
so (the cache still runs: every on-demand model then loads alone, see ``policy``).

``max_scratch`` comes from the startup *peak probe*: every model is loaded and run once on
zeros at each compiled (variant, batch size) and the allocator's high-water mark is read.
Two ways of turning peaks into scratch are supported (:func:`max_scratch`):

* exact, when the backend can reset the peak: the peak is reset after the model's weights
  are on the device, so ``peak - in_use_before_run`` is that model's own transient and
  nothing earlier (compile-time autotuning scratch in particular) can inflate it;
* the ordering estimate, when it cannot: models run in ascending weight size after the
  pinned set, and ``peak - pinned - largest_weight_so_far`` bounds the transient. This is
  exact for a clean session and pessimistic otherwise (never optimistic: a stale peak only
  makes the estimate larger).

The arena is ``mem_fraction * device memory`` on a GPU. JAX reports it directly as the
allocator's ``bytes_limit`` (XLA applies ``XLA_PYTHON_CLIENT_MEM_FRACTION`` itself); a
backend that reports only total memory goes through :func:`arena_from_device`. The CPU
backend reports no arena at all, so ``runtime.arena_bytes`` supplies one
(:func:`resolve_arena`); with neither, the cache is off and every model's weights stay on
the device (:func:`cache_enabled`).

:class:`BudgetSizer` keeps the budget over a worker's life: it re-solves the formula when
the pinned set changes, collects the startup probe's measurements, and learns a larger
scratch from a warm-up after the probe that raised the allocator's peak (the only way a
model loaded later moves the estimate). The driver applies each new budget to the
policy with ``WeightCachePolicy.set_budget``.

Invariants (``tests/weights/test_weights_budget.py``): the split never promises a byte the arena
does not have (every product is floored); ``on_demand + pinned_bytes <= weight_pool``
whenever the pinned set fits the pool; the sizer's scratch estimate never shrinks, so a
re-solve can only keep or lower the budget for the same pinned set.

Nothing here touches a device: the runtime measures, this module decides.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import attrs

from ..config.schema import RuntimeConfig
from ..errors import ConfigError

__all__ = [
    "BudgetSizer",
    "ProbeMeasurement",
    "WeightBudget",
    "arena_from_device",
    "budget_from_config",
    "cache_enabled",
    "max_scratch",
    "probe_order",
    "resolve_arena",
    "weight_budget",
]


@attrs.frozen(kw_only=True)
class WeightBudget:
    """The resolved split of the arena; every field is a byte count except the flag."""

    #: The device memory arena the split was made of.
    arena: int
    #: ``floor((1 - wiggle) * arena)``: the most that weights plus scratch may use.
    scratch_ceiling: int
    #: Measured worst-case execution scratch that was held back.
    max_scratch: int
    #: Bytes for all weights, pinned plus on demand.
    weight_pool: int
    #: Bytes of ``device``-floor weights, reserved off the top of the pool.
    pinned_bytes: int
    #: The on-demand cache budget: what the LRU may keep resident.
    on_demand: int
    #: The pinned set alone does not fit in the pool; no sizing can fix that.
    pinned_over_commit: bool

    @property
    def warnings(self) -> tuple[str, ...]:
        """Operator-facing warnings about this split (empty when it is healthy)."""
        out: list[str] = []
        if self.pinned_over_commit:
            out.append(
                f"weight cache: device-pinned weights ({self.pinned_bytes} bytes) exceed the "
                f"weight pool ({self.weight_pool} bytes = min(weight_cache_fraction * arena, "
                f"(1 - wiggle) * arena - scratch {self.max_scratch})); pin fewer models or "
                "raise runtime.mem_fraction / weight_cache_fraction"
            )
        if self.on_demand == 0:
            out.append(
                "weight cache: no room is left for on-demand weights (budget 0 bytes); every "
                "on-demand model will load alone, evicting all others, on each switch"
            )
        return tuple(out)


def _check_fraction(name: str, value: float, *, allow_one: bool = True) -> None:
    upper_ok = value <= 1.0 if allow_one else value < 1.0
    if not (math.isfinite(value) and value >= 0.0 and upper_ok):
        bound = "[0, 1]" if allow_one else "[0, 1)"
        raise ConfigError(f"runtime.{name}: expected a fraction in {bound}; got {value!r}")


def weight_budget(
    *, arena: int, fraction: float, wiggle: float, max_scratch: int = 0, pinned_bytes: int = 0
) -> WeightBudget:
    """Solve the budget formula (see the module docstring).

    >>> weight_budget(arena=1000, fraction=1.0, wiggle=0.1).on_demand
    900
    >>> weight_budget(arena=1000, fraction=1.0, wiggle=0.1, max_scratch=300).on_demand
    600
    """
    _check_fraction("weight_cache_fraction", fraction)
    _check_fraction("weight_cache_wiggle_fraction", wiggle, allow_one=False)
    if arena < 0 or max_scratch < 0 or pinned_bytes < 0:
        raise ValueError(
            f"weight_budget: byte counts must be >= 0; got arena={arena}, "
            f"max_scratch={max_scratch}, pinned_bytes={pinned_bytes}"
        )
    # Floors, not rounding: the budget must never promise a byte the arena does not have.
    scratch_ceiling = math.floor((1.0 - wiggle) * arena)
    weight_pool = max(0, min(math.floor(fraction * arena), scratch_ceiling - max_scratch))
    on_demand = min(max(weight_pool - pinned_bytes, 0), weight_pool)
    return WeightBudget(
        arena=arena,
        scratch_ceiling=scratch_ceiling,
        max_scratch=max_scratch,
        weight_pool=weight_pool,
        pinned_bytes=pinned_bytes,
        on_demand=on_demand,
        pinned_over_commit=pinned_bytes > weight_pool,
    )


def arena_from_device(device_bytes: int, mem_fraction: float) -> int:
    """``floor(mem_fraction * device_bytes)``: the arena of a backend that reports only
    its total memory."""
    if not (math.isfinite(mem_fraction) and 0.0 < mem_fraction <= 1.0):
        raise ConfigError(
            f"runtime.mem_fraction: expected a fraction in (0, 1]; got {mem_fraction!r}"
        )
    return math.floor(mem_fraction * device_bytes)


def resolve_arena(reported_arena: int | None, runtime: RuntimeConfig) -> int | None:
    """The arena to size the cache from, or ``None`` when there is none.

    A backend-reported arena (JAX's ``bytes_limit``, already ``mem_fraction`` of the
    device) wins; otherwise ``runtime.arena_bytes`` stands in (the CPU backend reports
    nothing, so this is how the whole cache runs and is tested on CPU); ``0`` there means
    no arena.
    """
    if reported_arena is not None and reported_arena > 0:
        return reported_arena
    if runtime.arena_bytes < 0:
        raise ConfigError(f"runtime.arena_bytes: expected bytes >= 0; got {runtime.arena_bytes}")
    return runtime.arena_bytes or None


def cache_enabled(runtime: RuntimeConfig, arena: int | None) -> bool:
    """The on-demand cache runs iff ``weight_cache_fraction > 0`` and there is an arena.

    Otherwise every model's weights are loaded at start and stay on the device.
    """
    return runtime.weight_cache_fraction > 0.0 and arena is not None and arena > 0


def budget_from_config(
    runtime: RuntimeConfig,
    *,
    reported_arena: int | None,
    max_scratch: int = 0,
    pinned_bytes: int = 0,
) -> WeightBudget | None:
    """The budget for this worker's config, or ``None`` when the cache is off."""
    arena = resolve_arena(reported_arena, runtime)
    if arena is None or not cache_enabled(runtime, arena):
        return None
    return weight_budget(
        arena=arena,
        fraction=runtime.weight_cache_fraction,
        wiggle=runtime.weight_cache_wiggle_fraction,
        max_scratch=max_scratch,
        pinned_bytes=pinned_bytes,
    )


# --------------------------------------------------------------------------- the probe


def probe_order(nbytes: Mapping[str, int], pinned: Collection[str]) -> tuple[str, ...]:
    """The order the startup probe runs models in.

    Pinned models first (they are resident for the whole probe, by name), then the others
    by ascending weight size, ties by name. Ascending order is what makes the ordering
    estimate of :func:`max_scratch` sound: when model *i* runs, the largest on-demand weight
    seen so far is its own.
    """
    head = sorted(n for n in nbytes if n in pinned)
    tail = sorted((n for n in nbytes if n not in pinned), key=lambda n: (nbytes[n], n))
    return (*head, *tail)


@attrs.frozen(kw_only=True)
class ProbeMeasurement:
    """One model's probe run, as the runtime measured it."""

    model: str
    #: Bytes of this model's weights.
    weight_nbytes: int
    #: The allocator's high-water mark after running every (variant, batch size).
    peak_bytes: int
    #: Bytes in use right before the runs, when the peak was reset at that point; ``None``
    #: when the backend cannot reset the peak (the ordering estimate is used then).
    baseline_bytes: int | None = None
    #: Whether the model is ``device``-floor (resident throughout the probe).
    pinned: bool = False


def max_scratch(measurements: Sequence[ProbeMeasurement], pinned_bytes: int) -> int:
    """Worst-case execution scratch over the probe runs, in the order they ran.

    With a reset peak, a model's scratch is ``peak - baseline``. Without one it is
    ``peak - pinned_bytes - largest non-pinned weight so far`` (the ordering estimate;
    pinned models' own runs are covered because they are part of ``pinned_bytes``).
    Negative differences (allocator slack) count as zero.
    """
    worst = 0
    largest = 0
    for m in measurements:
        if not m.pinned:
            largest = max(largest, m.weight_nbytes)
        if m.baseline_bytes is not None:
            scratch = m.peak_bytes - m.baseline_bytes
        else:
            scratch = m.peak_bytes - pinned_bytes - largest
        worst = max(worst, scratch)
    return worst


# -------------------------------------------------------------------------- the sizer


class BudgetSizer:
    """The budget over a worker's life, sans-IO (see the module docstring).

    ``fraction`` and ``wiggle`` are ``runtime.weight_cache_fraction`` and
    ``runtime.weight_cache_wiggle_fraction``. The scratch estimate starts at 0 and only
    grows: from the probe (:meth:`finish_probe`), then from warm-ups that raise the
    allocator's peak (:meth:`observe_warm_up`).
    """

    def __init__(self, *, arena: int, fraction: float, wiggle: float) -> None:
        self._arena = arena
        self._fraction = fraction
        self._wiggle = wiggle
        self._max_scratch = 0
        self._probed = False
        self._measurements: list[ProbeMeasurement] = []
        self._budget = self._solve(pinned_bytes=0)

    @property
    def budget(self) -> WeightBudget:
        """The split in force."""
        return self._budget

    @property
    def probed(self) -> bool:
        """Whether :meth:`finish_probe` has run."""
        return self._probed

    def probing(self, stats_available: bool) -> bool:
        """Whether a warm-up now is a probe run (before the probe ends, on a backend that
        reports allocator statistics)."""
        return stats_available and not self._probed

    def resize(self, pinned_bytes: int) -> WeightBudget | None:
        """Re-solve for the current pinned set and scratch; the new split if it changed."""
        budget = self._solve(pinned_bytes=pinned_bytes)
        if budget == self._budget:
            return None
        self._budget = budget
        return budget

    def record_probe(self, measurement: ProbeMeasurement) -> None:
        """One probe run, as the driver measured it (in the order the runs went)."""
        self._measurements.append(measurement)

    def finish_probe(self, live: Collection[str], pinned_bytes: int) -> int:
        """End the probe: the scratch is the worst of the runs of models still ``live``
        (:func:`max_scratch`); later warm-ups may only raise it. Returns how many runs it
        was taken from; call :meth:`resize` to apply it."""
        runs = [m for m in self._measurements if m.model in live]
        self._max_scratch = max(self._max_scratch, max_scratch(runs, pinned_bytes))
        self._probed = True
        self._measurements.clear()
        return len(runs)

    def observe_warm_up(self, *, peak_before: int, peak_after: int, in_use_before: int) -> bool:
        """A warm-up after the probe: if it raised the allocator's peak, its transient
        (``peak_after - in_use_before``) may raise the scratch estimate. True when it did;
        call :meth:`resize` to apply it."""
        if not self._probed or peak_after <= peak_before:
            return False
        scratch = peak_after - in_use_before
        if scratch <= self._max_scratch:
            return False
        self._max_scratch = scratch
        return True

    def _solve(self, *, pinned_bytes: int) -> WeightBudget:
        return weight_budget(
            arena=self._arena,
            fraction=self._fraction,
            wiggle=self._wiggle,
            max_scratch=self._max_scratch,
            pinned_bytes=pinned_bytes,
        )
