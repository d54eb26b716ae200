"""The weight-cache policy, one behaviour at a time (the state machine covers the mixes).

Each test plays the driver by hand: it carries out the plan the policy returns and reports
loads back, so the assertions read like the dispatch loop's life.
"""

from __future__ import annotations

import attrs
import pytest

from reactantserver.errors import LifecycleError, NotFound, NotResident
from reactantserver.weights import CachePlan, Hit, Wait, WeightCachePolicy


def load(policy: WeightCachePolicy, name: str, seconds: float = 0.01) -> CachePlan:
    """Acquire ``name``, expect a load plan, and report the load done."""
    plan = policy.acquire(name)
    assert isinstance(plan, CachePlan), plan
    assert plan.load == (name,)
    policy.loaded(name, seconds)
    return plan


def cache(budget: int = 100, **models: tuple[int, str | None]) -> WeightCachePolicy:
    policy = WeightCachePolicy(budget)
    for name, (nbytes, floor) in models.items():
        plan = policy.register(name, nbytes, floor)  # type: ignore[arg-type]
        for n in plan.load:
            policy.loaded(n, 0.0)
        policy.done(plan)
    return policy


# ------------------------------------------------------------------ lazy load and reuse


def test_first_acquire_loads_and_later_ones_reuse() -> None:
    policy = cache(100, a=(40, None))
    assert policy.residency("a").device == "absent"
    plan = policy.acquire("a")
    assert plan == CachePlan(load=("a",))  # system floor: the host copy exists already
    assert policy.acquire("a") == Wait(name="a", blockers=("a",), reason="loading")
    assert policy.loaded("a", 0.25) == CachePlan()  # a system copy is kept, nothing to drop
    assert policy.acquire("a") == Hit("a")
    assert policy.acquire("a") == Hit("a")
    stats = policy.statistics()
    assert (stats.loads, stats.misses, stats.hits, stats.evictions) == (1, 1, 2, 0)
    assert stats.load_seconds == 0.25
    assert stats.resident_bytes == 40


def test_system_keeps_its_host_copy_and_unpinned_maps_per_load() -> None:
    policy = WeightCachePolicy(100)
    assert policy.register("sys", 10, "system") == CachePlan(host_load=("sys",))
    assert policy.register("unp", 10, "unpinned") == CachePlan()
    assert not policy.residency("unp").host
    plan = policy.acquire("unp")
    assert plan == CachePlan(host_load=("unp",), load=("unp",))  # map the file for the transfer
    assert policy.residency("unp").host
    assert policy.loaded("unp", 0.0) == CachePlan(host_drop=("unp",))  # ...and unmap it after
    assert not policy.residency("unp").host
    assert policy.residency("sys").host


def test_failed_load_leaves_the_model_absent_and_releases_its_budget() -> None:
    policy = cache(100, a=(60, "unpinned"))
    policy.acquire("a")
    assert policy.load_failed("a") == CachePlan(host_drop=("a",))
    stats = policy.statistics()
    assert stats.resident_bytes == 0 and stats.load_failures == 1 and stats.loads == 0
    assert policy.residency("a").device == "absent"
    assert isinstance(policy.acquire("a"), CachePlan)  # the next acquire retries


# ------------------------------------------------------------------------------- LRU


def test_lru_evicts_the_least_recently_used_first() -> None:
    policy = cache(100, a=(40, None), b=(40, None), c=(40, None))
    load(policy, "a")
    load(policy, "b")
    assert policy.acquire("a") == Hit("a")  # a is now more recent than b
    plan = load(policy, "c")
    assert plan.evict == ("b",)
    assert policy.lru == ("a", "c")
    assert policy.statistics().evictions == 1
    assert policy.residency("b").host  # eviction keeps the system host copy


def test_eviction_frees_only_as_much_as_needed() -> None:
    policy = cache(100, a=(30, None), b=(30, None), c=(30, None), d=(50, None))
    for n in "abc":
        load(policy, n)
    assert load(policy, "d").evict == ("a", "b")  # 90 - 30 - 30 + 50 = 80 <= 100
    assert policy.lru == ("c", "d")


# ---------------------------------------------------------------- in use and pinned


def test_a_model_in_use_is_never_evicted_the_load_waits() -> None:
    policy = cache(100, a=(70, None), b=(70, None))
    load(policy, "a")
    policy.pin_in_use("a")
    assert policy.acquire("b") == Wait(name="b", blockers=("a",), reason="in_use")
    assert policy.statistics().misses == 1  # a's; a wait is not a miss, the retry will be
    policy.unpin_in_use("a")
    assert load(policy, "b").evict == ("a",)


def test_in_use_models_are_skipped_and_older_idle_ones_go_instead() -> None:
    policy = cache(100, a=(40, None), b=(40, None), c=(40, None))
    load(policy, "a")
    load(policy, "b")
    policy.pin_in_use("a")  # a is the LRU, but running
    assert load(policy, "c").evict == ("b",)


def test_device_floor_is_loaded_at_start_off_budget_and_never_evicted() -> None:
    policy = WeightCachePolicy(50)
    plan = policy.register("p", 500, "device")
    assert plan == CachePlan(host_load=("p",), load=("p",))  # mapped for the transfer only
    assert policy.loaded("p", 0.0) == CachePlan(host_drop=("p",))
    policy.register("q", 50, None)
    for _ in range(3):
        load(policy, "q")
        assert policy.acquire("p") == Hit("p")
        assert policy.compact().evict == ("q",)
    stats = policy.statistics()
    assert stats.pinned_bytes == 500 and stats.resident_bytes == 0
    assert stats.pinned_loads == 1 and stats.loads == 3
    assert policy.is_resident("p")


# --------------------------------------------------------------------------- oversize


def test_a_model_larger_than_the_budget_loads_alone_with_a_warning() -> None:
    policy = cache(100, a=(30, None), b=(30, None), big=(250, None))
    load(policy, "a")
    load(policy, "b")
    plan = load(policy, "big")
    assert plan.evict == ("a", "b")
    assert plan.oversize == "big"
    assert (
        plan.warnings and "larger than the whole on-demand budget (100 bytes)" in plan.warnings[0]
    )
    stats = policy.statistics()
    assert stats.lru == ("big",) and stats.resident_bytes == 250 and stats.oversize_loads == 1
    assert load(policy, "a").evict == ("big",)  # the next switch evicts it like any other


def test_an_oversize_load_waits_for_any_model_in_use() -> None:
    policy = cache(100, a=(10, None), big=(250, None))
    load(policy, "a")
    policy.pin_in_use("a")
    assert policy.acquire("big") == Wait(name="big", blockers=("a",), reason="in_use")


# --------------------------------------------------------------------------- explicit


def test_explicit_mode_never_loads_on_its_own() -> None:
    policy = WeightCachePolicy(100, explicit=True)
    policy.register("e", 40, None)
    with pytest.raises(NotResident, match="SetModelResidency"):
        policy.acquire("e")
    assert policy.prefetch_plan("e") is None

    assert policy.set_floor("e", "device") == CachePlan(load=("e",))  # system copy feeds it
    policy.loaded("e", 0.0)
    assert policy.acquire("e") == Hit("e")
    assert policy.lru == ()  # device floor is off budget
    assert policy.residency("e").host is False  # nothing left to use the host copy for

    # Demoted: no evictor runs in explicit mode, so the device copy goes now.
    assert policy.set_floor("e", "system") == CachePlan(evict=("e",), host_load=("e",))
    assert not policy.is_resident("e")
    assert policy.set_floor("e", "unpinned") == CachePlan(host_drop=("e",))
    assert policy.residency("e") == attrs.evolve(policy.residency("e"), host=False)
    with pytest.raises(NotResident):
        policy.acquire("e")


def test_explicit_mode_retries_a_device_floor_model_whose_load_failed() -> None:
    policy = WeightCachePolicy(100, explicit=True)
    policy.register("e", 40, "device")
    policy.load_failed("e")
    with pytest.raises(NotResident):
        policy.acquire("e")
    assert policy.set_floor("e", "device").load == ("e",)


def test_self_managed_demotion_keeps_the_device_copy_when_it_fits() -> None:
    policy = cache(100, a=(60, None), p=(30, "device"))
    load(policy, "a")
    assert policy.set_floor("p", "system") == CachePlan(host_load=("p",))
    assert policy.lru == ("a", "p")  # now an ordinary, evictable, most-recent model
    # Promoted while resident: off budget, and its host copy has no use left.
    assert policy.set_floor("a", "device") == CachePlan(host_drop=("a",))
    assert policy.set_floor("a", "unpinned") == CachePlan()
    # p (30) is resident; a (60) joins it: 90 <= 100, so a stays too.
    assert policy.lru == ("p", "a")
    policy.set_budget(70)
    assert policy.lru == ("a",)


# ------------------------------------------------------------------------- compaction


def test_compaction_frees_on_demand_reloads_named_and_leaves_pinned() -> None:
    policy = cache(100, p=(500, "device"), a=(30, None), b=(30, None), c=(30, "unpinned"))
    for n in "abc":
        load(policy, n)
    plan = policy.compact(["c", "a", "p", "c"])
    assert plan.evict == ("a", "b", "c")
    assert plan.load == ("c", "a")  # named ones, in order, duplicates and pinned skipped
    assert plan.host_load == ("c",)  # the unpinned one is mapped again
    assert policy.lru == ("c", "a")
    assert policy.is_resident("p")
    stats = policy.statistics()
    assert stats.compactions == 1 and stats.resident_bytes == 60 and stats.evictions == 0


def test_compaction_reloads_a_missing_pinned_model_and_only_what_fits() -> None:
    policy = cache(100, a=(60, None), b=(60, None))
    policy.register("p", 10, "device")
    policy.load_failed("p")
    plan = policy.compact(["a", "b"])
    assert plan.load == ("p", "a")  # b does not fit after a: left to load on demand


def test_compaction_rejects_unknown_names_and_busy_moments() -> None:
    policy = cache(100, a=(10, None))
    with pytest.raises(NotFound, match="'ghost'"):
        policy.compact(["ghost"])
    load(policy, "a")
    policy.pin_in_use("a")
    with pytest.raises(LifecycleError, match="between batches"):
        policy.compact()


def test_compaction_in_explicit_mode_ignores_the_reload_list() -> None:
    policy = WeightCachePolicy(100, explicit=True)
    policy.register("a", 10, None)
    assert policy.compact(["a"]) == CachePlan()
    assert policy.statistics().compactions == 1


def test_auto_compaction_fires_every_interval_loads() -> None:
    policy = WeightCachePolicy(100, compaction_interval=2)
    for n in "ab":
        policy.register(n, 10, None)
    load(policy, "a")
    assert not policy.should_compact()
    load(policy, "b")
    assert policy.should_compact()
    policy.compact()
    assert not policy.should_compact()
    assert not WeightCachePolicy(100).should_compact()  # interval 0: never


# ----------------------------------------------------------------------------- prefetch


def test_prefetch_loads_into_free_budget_and_counts_a_hit_when_used() -> None:
    policy = cache(100, a=(40, None), b=(40, None))
    load(policy, "a")
    policy.pin_in_use("a")
    plan = policy.prefetch_plan("b")
    assert plan == CachePlan(load=("b",))
    assert policy.acquire("b") == Wait(name="b", blockers=("b",), reason="loading")
    policy.loaded("b", 0.0)
    assert policy.acquire("b") == Hit("b")
    stats = policy.statistics()
    assert (stats.prefetches, stats.prefetch_hits, stats.prefetch_wasted) == (1, 1, 0)


def test_prefetch_never_evicts_a_model_in_use() -> None:
    policy = cache(100, a=(70, None), b=(70, None))
    load(policy, "a")
    policy.pin_in_use("a")
    assert policy.prefetch_plan("b") is None
    assert policy.lru == ("a",)


def test_prefetch_evicts_only_the_idle_lru_models_a_demand_load_would() -> None:
    policy = cache(100, a=(40, None), b=(40, None), c=(40, None))
    load(policy, "a")
    load(policy, "b")
    policy.pin_in_use("b")  # b runs; a is idle and least recent
    plan = policy.prefetch_plan("c")
    assert plan is not None and plan.evict == ("a",)


def test_prefetch_declines_oversize_pinned_explicit_and_concurrent_loads() -> None:
    policy = cache(100, big=(150, None), p=(10, "device"), a=(10, None), b=(10, None))
    assert policy.prefetch_plan("big") is None  # never the evict-everything path
    assert policy.prefetch_plan("p") is None
    assert policy.prefetch_plan("ghost") is None  # a hint: unknown names are not errors
    assert policy.prefetch_plan("a") is not None
    assert policy.prefetch_plan("b") is None  # one prefetch transfer at a time


def test_an_unused_prefetch_that_gets_evicted_is_counted_as_wasted() -> None:
    policy = cache(50, a=(50, None), b=(50, None))
    assert policy.prefetch_plan("a") is not None
    policy.loaded("a", 0.0)
    load(policy, "b")
    assert policy.statistics().prefetch_wasted == 1


# --------------------------------------------------------------------------- budget


def test_shrinking_the_budget_evicts_lru_idle_models() -> None:
    policy = cache(100, a=(40, None), b=(40, None))
    load(policy, "a")
    load(policy, "b")
    assert policy.set_budget(50) == CachePlan(evict=("a",))
    assert policy.budget == 50


def test_shrinking_below_two_busy_models_is_refused_unchanged() -> None:
    policy = cache(100, a=(40, None), b=(40, None))
    load(policy, "a")
    load(policy, "b")
    policy.pin_in_use("a")
    policy.pin_in_use("b")
    with pytest.raises(LifecycleError, match="in use or loading"):
        policy.set_budget(50)
    assert policy.budget == 100 and policy.lru == ("a", "b")


# ----------------------------------------------------- bookkeeping and driver mistakes


def test_statistics_are_a_frozen_snapshot() -> None:
    policy = cache(100, a=(10, None))
    stats = policy.statistics()
    load(policy, "a")
    assert stats.models["a"].device == "absent"  # the snapshot did not move
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        stats.loads = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        stats.models["b"] = stats.models["a"]  # type: ignore[index]


def test_unregister_releases_everything() -> None:
    policy = cache(100, a=(10, None), p=(10, "device"))
    load(policy, "a")
    assert policy.unregister("a") == CachePlan(evict=("a",), host_drop=("a",))
    assert policy.unregister("p") == CachePlan(evict=("p",))
    assert policy.statistics().resident_bytes == 0
    assert "a" not in policy


@pytest.mark.parametrize(
    "misuse",
    [
        lambda p: p.loaded("a", 0.0),
        lambda p: p.load_failed("a"),
        lambda p: p.unpin_in_use("a"),
        lambda p: p.pin_in_use("a"),
        lambda p: p.register("a", 1, None),
    ],
)
def test_driver_protocol_violations_are_lifecycle_errors(misuse) -> None:  # type: ignore[no-untyped-def]
    policy = cache(100, a=(10, None))
    with pytest.raises(LifecycleError):
        misuse(policy)


def test_control_commands_refuse_a_busy_model() -> None:
    policy = cache(100, a=(10, None))
    policy.acquire("a")  # loading
    with pytest.raises(LifecycleError, match="while it is loading"):
        policy.set_floor("a", "device")
    policy.loaded("a", 0.0)
    policy.pin_in_use("a")
    with pytest.raises(LifecycleError, match="while it is in use"):
        policy.unregister("a")


def test_unknown_models_are_not_found() -> None:
    with pytest.raises(NotFound, match="'ghost'"):
        WeightCachePolicy(10).acquire("ghost")


# ------------------------------------------------------------- removal and commands


def test_a_model_being_removed_is_never_handed_out_again() -> None:
    policy = cache(100, a=(10, None), b=(10, None))
    load(policy, "a")
    policy.pin_in_use("a")
    policy.begin_remove("a")
    assert not policy.removable("a")  # a batch still runs on it
    with pytest.raises(LifecycleError, match="a is being removed"):
        policy.acquire("a")
    assert policy.prefetch_plan("a") is None
    policy.unpin_in_use("a")
    assert policy.removable("a")
    assert policy.unregister("a") == CachePlan(evict=("a",), host_drop=("a",))


def test_a_command_waits_for_the_running_batch_and_closes_the_gate_meanwhile() -> None:
    policy = cache(100, a=(10, None), b=(10, None))
    plan = load(policy, "a")
    policy.done(plan)
    policy.pin_in_use("a")
    policy.want_command()
    assert policy.acquire("b") == Wait(name="b", blockers=(), reason="command")
    assert policy.prefetch_plan("b") is None
    assert not policy.try_start_command()  # "a" is still in use
    policy.unpin_in_use("a")
    assert policy.try_start_command()
    assert policy.acquire("b", command=True) == CachePlan(load=("b",))  # the command's own
    policy.end_command(started=True)
    assert policy.acquire("a") == Hit("a")


def test_a_command_waits_for_every_plan_to_be_done() -> None:
    policy = cache(100, a=(10, None))
    plan = policy.acquire("a")
    assert isinstance(plan, CachePlan)
    policy.loaded("a", 0.0)
    policy.want_command()
    assert not policy.try_start_command()  # the load's plan is still being carried out
    policy.done(plan)
    assert policy.try_start_command()
    with pytest.raises(LifecycleError, match="done"):
        policy.done(plan)  # reported twice


def test_evict_idle_frees_every_idle_on_demand_copy_and_keeps_the_budget() -> None:
    policy = cache(100, a=(10, None), b=(10, None), p=(10, "device"))
    for name in ("a", "b"):  # p, device-floor, was loaded at registration
        load(policy, name)
    policy.pin_in_use("b")
    assert policy.evict_idle() == CachePlan(evict=("a",))
    assert policy.budget == 100 and policy.lru == ("b",) and policy.is_resident("p")
