"""The weight cache's device driver (``runtime/weight_cache.py``), against a fake device.

The fake device (``fake_device.py``) copies arrays like a real one and keeps books the
tests read: bytes live on the "device" and their high-water mark, transfers, frees, and
whether an array was freed while an execution held it. Each test plays the executor
(acquire, run, release) and the control plane around it; the real worker and the real
CPU device are in ``test_weight_cache_worker.py``, the CUDA-only paths in
``test_cuda_paths.py``.

Time is virtual (``autojump_clock``) and the cache's blocking steps run inline through an
injected thread runner (``conftest.inline``), so "not yet" is exact: after
``trio.testing.wait_all_tasks_blocked()`` every task has done all it can, and what has
not happened will not happen until the test acts.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from conftest import inline
from fake_device import FakeBundle, FakeDevice, Models, make_cache, run_batch

from reactantserver.config.schema import (
    ModelSchedConfig,
    RuntimeConfig,
    SchedulerConfig,
    ServerConfig,
)
from reactantserver.errors import ExecutionFailed, FailedPrecondition, LifecycleError, NotResident
from reactantserver.runtime.host_memory import PinnedHostStaging, copying_allocate
from reactantserver.runtime.weight_cache import CachedWeights
from reactantserver.runtime.weight_provider import make_weight_provider, startup_order
from reactantserver.weights import HostStore


@pytest.fixture
def device() -> FakeDevice:
    return FakeDevice()


@pytest.fixture
def models(tmp_path: Path, device: FakeDevice) -> Models:
    return Models(tmp_path, device)


# ------------------------------------------------------------------------------ tests


async def test_a_miss_loads_the_file_contents_and_the_next_acquire_hits(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    cache = make_cache(device, 100)
    a = models("a", 40)
    await cache.add(a)  # type: ignore[arg-type]
    assert not cache.is_resident(a)  # type: ignore[arg-type]
    assert device.transfers == 0  # system floor: a host copy, no device load yet
    await run_batch(cache, device, a)
    await run_batch(cache, device, a)
    stats = cache.statistics()
    assert (stats.policy.loads, stats.policy.misses, stats.policy.hits) == (1, 1, 1)
    assert device.transfers == 1
    assert cache.resident_bytes == stats.device_bytes == 40
    assert stats.host.models == {f"a#{a.generation}": 40}  # the system copy stays


async def test_a_load_from_a_system_copy_is_one_transfer_on_the_loop_with_no_thread_hop(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    """A ``system`` version's host copy is one packed buffer; a miss moves it with one
    packed transfer, carried out on the event loop (the real one is queued on the device,
    not waited for): not one call goes to a worker thread, and the weights are exact."""
    calls: list[str] = []

    async def counted(fn: Any, *args: Any) -> Any:
        calls.append(getattr(fn, "__name__", repr(fn)))
        return await inline(fn, *args)

    config = RuntimeConfig(weight_cache_fraction=1.0, weight_cache_wiggle_fraction=0.0)
    cache = CachedWeights(device, config, arena=100, thread=counted)  # type: ignore[arg-type]
    a, b, c = models("a", 40), models("b", 40), models("c", 40)
    for m in (a, b, c):
        await cache.add(m)  # type: ignore[arg-type]
    assert "packed_loader" in calls  # compiled at add, in a thread: never on a load
    calls.clear()
    for m in (a, b, c, a, b):  # five misses, two of them evicting
        await run_batch(cache, device, m)
    stats = cache.statistics().policy
    assert (stats.loads, stats.misses, stats.evictions) == (5, 5, 3)
    assert device.transfers == device.packed_transfers == 5
    assert calls == []  # no thread hop: loads and frees ran on the loop
    assert device.live == 80 and device.peak <= 100


async def test_a_version_past_the_packed_limit_loads_per_tensor_in_a_thread(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    """Past ``PACKED_LOAD_MAX_BYTES`` the copy dominates any per-tensor overhead: no unpack
    program is made, and a load is one put of the tensors in a worker thread."""
    from reactantserver.runtime.weight_io import PACKED_LOAD_MAX_BYTES

    calls: list[str] = []

    async def counted(fn: Any, *args: Any) -> Any:
        calls.append(getattr(fn, "__name__", repr(fn)))
        return await inline(fn, *args)

    nbytes = PACKED_LOAD_MAX_BYTES + 64
    config = RuntimeConfig(weight_cache_fraction=1.0, weight_cache_wiggle_fraction=0.0)
    cache = CachedWeights(device, config, arena=nbytes, thread=counted)  # type: ignore[arg-type]
    big = models("big", nbytes)
    await cache.add(big)  # type: ignore[arg-type]
    assert "packed_loader" not in calls
    calls.clear()
    await run_batch(cache, device, big)
    assert len(calls) == 1 and "to_device" in calls[0]  # one thread hop: the put
    assert device.transfers == 1 and device.packed_transfers == 0


async def test_lru_victims_are_freed_before_the_transfer(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    cache = make_cache(device, 100)
    a, b, c = models("a", 40), models("b", 40), models("c", 40)
    for m in (a, b, c):
        await cache.add(m)  # type: ignore[arg-type]
    await run_batch(cache, device, a)
    await run_batch(cache, device, b)
    await run_batch(cache, device, a)  # a is now the most recently used
    await run_batch(cache, device, c)  # evicts b, the least recently used
    assert cache.is_resident(a) and cache.is_resident(c)  # type: ignore[arg-type]
    assert not cache.is_resident(b)  # type: ignore[arg-type]
    assert device.live == 80
    assert device.peak <= 100  # b's copy was gone before c's arrived
    stats = cache.statistics().policy
    assert (stats.loads, stats.evictions, stats.hits) == (3, 1, 1)


async def test_device_floor_loads_at_add_stays_and_comes_off_the_budget(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    cache = make_cache(device, 100)
    pinned = models("p", 30, "device")
    await cache.add(pinned)  # type: ignore[arg-type]
    assert cache.is_resident(pinned)  # type: ignore[arg-type]
    assert cache.budget.pinned_bytes == 30
    assert cache.policy.budget == 70  # the pool is shared: pinned bytes come off the top
    pinned_arrays = await cache.acquire(pinned)  # type: ignore[arg-type]
    cache.release(pinned)  # type: ignore[arg-type]
    others = [models(f"m{i}", 30) for i in range(4)]
    for m in others:
        await cache.add(m)  # type: ignore[arg-type]
    for m in others * 2:
        await run_batch(cache, device, m)
    assert not any(a.deleted for a in pinned_arrays)
    assert cache.statistics().policy.resident_bytes <= 70
    assert cache.statistics().host.models.keys() == {
        f"m{i}#{m.generation}" for i, m in enumerate(others)
    }
    await cache.remove(pinned)  # type: ignore[arg-type]
    assert cache.policy.budget == 100  # re-solved without the pinned bytes
    assert all(a.deleted for a in pinned_arrays)


async def test_unpinned_maps_the_file_only_while_loading(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    cache = make_cache(device, 100)
    u = models("u", 40, "unpinned")
    await cache.add(u)  # type: ignore[arg-type]
    await run_batch(cache, device, u)
    host = cache.statistics().host
    assert host.resident_bytes == 0 and host.maps == 1 and host.maps_open == 0
    assert not cache.residency(u).host  # type: ignore[arg-type]


async def test_a_load_waits_for_the_model_in_use_then_evicts_it(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    cache = make_cache(device, 50)
    a, b = models("a", 40), models("b", 40)
    await cache.add(a)  # type: ignore[arg-type]
    await cache.add(b)  # type: ignore[arg-type]
    arrays_a = await cache.acquire(a)  # type: ignore[arg-type]
    got_b = trio.Event()

    async def want_b() -> None:
        await cache.acquire(b)  # type: ignore[arg-type]
        got_b.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(want_b)
        await trio.testing.wait_all_tasks_blocked()
        assert not got_b.is_set()  # b does not fit while a runs
        assert not any(x.deleted for x in arrays_a)
        cache.release(a)  # type: ignore[arg-type]
        with trio.fail_after(5):
            await got_b.wait()
    cache.release(b)  # type: ignore[arg-type]
    assert all(x.deleted for x in arrays_a)
    assert device.peak <= 50


async def test_prefetch_loads_the_next_model_without_touching_the_running_one(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    cache = make_cache(device, 100)
    a, b, c = models("a", 40), models("b", 40), models("c", 40)
    for m in (a, b, c):
        await cache.add(m)  # type: ignore[arg-type]
    await run_batch(cache, device, b)
    arrays_a = await cache.acquire(a)  # type: ignore[arg-type]  # a runs...
    await cache.prefetch(c)  # type: ignore[arg-type]  # ...while c is fetched, evicting idle b
    assert cache.is_resident(c) and not cache.is_resident(b)  # type: ignore[arg-type]
    assert not any(x.deleted for x in arrays_a)
    cache.release(a)  # type: ignore[arg-type]
    transfers = device.transfers
    await run_batch(cache, device, c)
    assert device.transfers == transfers  # a hit: the prefetch did the load
    stats = cache.statistics().policy
    assert (stats.prefetches, stats.prefetch_hits, stats.prefetch_wasted) == (1, 1, 0)


async def test_prefetch_can_be_turned_off(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    cache = make_cache(device, 100, weight_prefetch=False)
    a = models("a", 40)
    await cache.add(a)  # type: ignore[arg-type]
    await cache.prefetch(a)  # type: ignore[arg-type]
    assert not cache.is_resident(a) and device.transfers == 0  # type: ignore[arg-type]


async def test_a_failed_load_fails_the_batch_and_the_next_acquire_retries(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    cache = make_cache(device, 100)
    a = models("a", 40)
    await cache.add(a)  # type: ignore[arg-type]
    device.fail_next = 1
    with pytest.raises(ExecutionFailed, match="loading its weights onto the device failed"):
        await cache.acquire(a)  # type: ignore[arg-type]
    assert cache.statistics().policy.load_failures == 1
    assert cache.statistics().policy.resident_bytes == 0  # the budget was released
    await run_batch(cache, device, a)
    assert cache.statistics().policy.loads == 1


async def test_compaction_frees_on_demand_copies_and_reloads_the_named_ones(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    cache = make_cache(device, 200)
    p = models("p", 30, "device")
    a, b, c = models("a", 40), models("b", 40), models("c", 40)
    for m in (p, a, b, c):
        await cache.add(m)  # type: ignore[arg-type]
    pinned_arrays = await cache.acquire(p)  # type: ignore[arg-type]
    cache.release(p)  # type: ignore[arg-type]
    for m in (a, b, c):
        await run_batch(cache, device, m)
    reloaded, resident = await cache.compact([b])  # type: ignore[list-item]
    assert (reloaded, resident) == (1, 70)  # b reloaded, p never left
    assert not any(x.deleted for x in pinned_arrays)
    assert [cache.is_resident(m) for m in (a, b, c)] == [False, True, False]  # type: ignore[arg-type]
    stats = cache.statistics().policy
    assert stats.compactions == 1 and stats.lru == (f"b#{b.generation}",)


async def test_compaction_waits_for_the_running_batch(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    cache = make_cache(device, 100)
    a = models("a", 40)
    await cache.add(a)  # type: ignore[arg-type]
    arrays = await cache.acquire(a)  # type: ignore[arg-type]
    device.executing |= {id(x) for x in arrays}
    done = trio.Event()

    async def compact() -> None:
        await cache.compact()
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(compact)
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set() and not any(x.deleted for x in arrays)
        device.executing.clear()
        cache.release(a)  # type: ignore[arg-type]
    assert done.is_set() and all(x.deleted for x in arrays)
    assert device.freed_while_executing == 0


async def test_automatic_compaction_after_every_interval_loads(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    cache = make_cache(device, 100, interval=3)
    ms = [models(f"m{i}", 40) for i in range(4)]
    for m in ms:
        await cache.add(m)  # type: ignore[arg-type]
    for m in ms[:3]:
        await run_batch(cache, device, m)
    assert cache.statistics().policy.compactions == 0
    await run_batch(cache, device, ms[3])  # the acquire after the 3rd load compacts first
    stats = cache.statistics().policy
    assert stats.compactions == 1
    assert stats.lru == (f"m3#{ms[3].generation}",)  # only the model about to run reloaded
    assert device.live == 40


async def test_remove_waits_for_the_batch_then_frees_both_copies(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    cache = make_cache(device, 100)
    a = models("a", 40)
    await cache.add(a)  # type: ignore[arg-type]
    arrays = await cache.acquire(a)  # type: ignore[arg-type]
    removed = trio.Event()

    async def remove() -> None:
        await cache.remove(a)  # type: ignore[arg-type]
        removed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(remove)
        await trio.testing.wait_all_tasks_blocked()
        assert not removed.is_set() and not any(x.deleted for x in arrays)
        cache.release(a)  # type: ignore[arg-type]
    assert all(x.deleted for x in arrays) and device.live == 0
    assert cache.statistics().host.resident_bytes == 0
    with pytest.raises(LifecycleError, match="never added"):
        await cache.acquire(a)  # type: ignore[arg-type]


async def test_two_versions_of_one_model_have_their_own_weights(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    cache = make_cache(device, 100)
    old, new = models("m", 40), models("m", 40)
    await cache.add(old)  # type: ignore[arg-type]
    await cache.add(new)  # type: ignore[arg-type]
    await run_batch(cache, device, old)  # each checks its own file's contents
    await run_batch(cache, device, new)
    await cache.remove(old)  # type: ignore[arg-type]
    assert cache.is_resident(new)  # type: ignore[arg-type]
    assert set(cache.statistics().policy.models) == {f"m#{new.generation}"}


async def test_explicit_mode_loads_only_on_command(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    cache = make_cache(device, 100, explicit=True)
    a = models("a", 40)
    await cache.add(a)  # type: ignore[arg-type]
    costs = await cache.warm_up(a)  # type: ignore[arg-type]
    assert costs == {1: 0.001}
    assert device.live == 0 and device.transfers == 1  # warmed on a transient copy
    with pytest.raises(NotResident):
        await cache.acquire(a)  # type: ignore[arg-type]
    assert await cache.set_floor(a, "device") == "device"  # type: ignore[arg-type]
    await run_batch(cache, device, a)
    assert cache.budget.pinned_bytes == 40 and cache.policy.budget == 60
    assert await cache.set_floor(a, "system") == "system"  # type: ignore[arg-type]
    assert not cache.is_resident(a) and device.live == 0  # type: ignore[arg-type]
    assert cache.policy.budget == 100


async def test_an_oversize_model_loads_alone_with_a_warning(
    device: FakeDevice,
    models: Models,
    caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    cache = make_cache(device, 100)
    a, big = models("a", 40), models("big", 150)
    await cache.add(a)  # type: ignore[arg-type]
    await cache.add(big)  # type: ignore[arg-type]
    await run_batch(cache, device, a)
    with caplog.at_level(logging.WARNING):
        await run_batch(cache, device, big)
    assert "larger than the whole on-demand budget" in caplog.text
    assert device.live == 150 and device.peak == 150  # a was freed first
    assert cache.statistics().policy.oversize_loads == 1


async def test_the_startup_warm_ups_probe_each_model_alone_and_size_the_budget(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    device = FakeDevice(stats=True)
    models = Models(tmp_path, device)
    config = RuntimeConfig(weight_cache_fraction=1.0, weight_cache_wiggle_fraction=0.1)
    cache = CachedWeights(device, config, arena=1000, thread=inline)  # type: ignore[arg-type]
    assert cache.probe_available and cache.policy.budget == 900
    # The big model has the small scratch: without running models alone, in ascending
    # weight size, the probe would read the big model's weights as scratch.
    startup = {
        m.name: m
        for m in (
            models("big", 400, scratch=10),
            models("mid", 80, scratch=120),
            models("p", 100, "device", scratch=50),
            models("small", 20, scratch=300),
        )
    }
    server = ServerConfig(
        scheduler=SchedulerConfig(models={"p": ModelSchedConfig(residency="device")})
    )
    bundles: dict[str, Any] = {n: m.bundle for n, m in startup.items()}
    bundles["glue"] = FakeBundle("glue", tmp_path, (), is_meta=True)
    assert startup_order(bundles, server) == ["p", "small", "mid", "big", "glue"]
    order = ["p", "small", "mid", "big"]
    for name in order:
        await cache.add(startup[name])  # type: ignore[arg-type]
        await cache.warm_up(startup[name])  # type: ignore[arg-type]
    # Alone: live bytes during each run were the pinned model plus its own weights.
    assert [startup[n].loaded.seen_live for n in order] == [[100], [120], [180], [500]]
    b = await cache.finish_probe()
    assert b.max_scratch == 300  # exact: small's run set the peak
    # pool = min(1000, 900 - 300) = 600; on demand = 600 - 100 pinned.
    assert (b.weight_pool, b.pinned_bytes, b.on_demand) == (600, 100, 500)
    assert cache.policy.budget == 500 and cache.statistics().probed
    # A model loaded later that raises the peak raises the estimate (and shrinks the budget).
    hungry = models("hungry", 10, scratch=700)
    await cache.add(hungry)  # type: ignore[arg-type]
    await cache.warm_up(hungry)  # type: ignore[arg-type]
    assert cache.budget.max_scratch == 700 and cache.policy.budget == 100
    assert not cache.is_resident(startup["big"])  # type: ignore[arg-type]  # evicted to fit


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_churn_never_runs_a_model_without_its_weights(
    tmp_path: Path, seed: int, autojump_clock: trio.testing.MockClock
) -> None:
    """Zipf traffic over 12 models with a budget for about 3, prefetch on, compaction
    every 7 loads and a control task compacting and re-flooring meanwhile: every batch
    finds its weights (checked byte for byte, before and after it "runs"), no array is
    freed while an execution holds it, and the device never holds more than the budget
    (plus the pinned model)."""
    device = FakeDevice()
    models = Models(tmp_path, device)
    cache = make_cache(device, 130, interval=7)
    rng = random.Random(seed)
    catalog = [
        models(f"m{i}", rng.randrange(10, 45), "unpinned" if i % 4 == 0 else None)
        for i in range(12)
    ]
    pinned = models("p", 20, "device")
    for m in (*catalog, pinned):
        await cache.add(m)  # type: ignore[arg-type]
    weights = [1 / (i + 1) for i in range(len(catalog))]
    order = rng.choices(catalog, weights, k=150)
    done = trio.Event()

    async def dispatch() -> None:
        async with trio.open_nursery() as nursery:
            for i, model in enumerate(order):
                if i + 1 < len(order):
                    nursery.start_soon(cache.prefetch, order[i + 1])
                await run_batch(cache, device, model)
        done.set()

    async def control() -> None:
        while not done.is_set():
            await trio.sleep(0.01)
            await cache.compact([rng.choice(catalog)])  # type: ignore[list-item]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(dispatch)
        nursery.start_soon(control)
    stats = cache.statistics().policy
    assert device.freed_while_executing == 0
    assert device.peak <= 130  # pinned + on demand never exceed the pool
    assert stats.load_failures == 0 and stats.loads > 12 and stats.evictions > 0
    assert stats.compactions >= 1 and stats.prefetches > 0
    assert cache.is_resident(pinned)  # type: ignore[arg-type]


async def test_acquires_wait_while_a_command_waits_for_the_running_batch(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    """The command gate: a compaction waiting for a running batch holds back new acquires
    (and prefetches) until it has run, so it cannot be starved."""
    cache = make_cache(device, 100)
    a, b = models("a", 40), models("b", 40)
    await cache.add(a)  # type: ignore[arg-type]
    await cache.add(b)  # type: ignore[arg-type]
    await cache.acquire(a)  # type: ignore[arg-type]  # a batch runs on a
    order: list[str] = []

    async def compact() -> None:
        await cache.compact()
        order.append("compact")

    async def batch_b() -> None:
        await cache.acquire(b)  # type: ignore[arg-type]
        order.append("b")
        cache.release(b)  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(compact)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(batch_b)
        await cache.prefetch(b)  # type: ignore[arg-type]  # the gate is closed: nothing
        await trio.testing.wait_all_tasks_blocked()
        assert order == [] and device.transfers == 1  # both wait for a's batch
        cache.release(a)  # type: ignore[arg-type]
    assert order == ["compact", "b"]


async def test_removal_refuses_new_acquires_at_once_and_frees_after_the_batch(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    cache = make_cache(device, 100)
    a = models("a", 40)
    await cache.add(a)  # type: ignore[arg-type]
    await cache.acquire(a)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cache.remove, a)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(LifecycleError, match="being removed"):
            await cache.acquire(a)  # type: ignore[arg-type]
        assert device.live == 40  # the running batch keeps its weights
        cache.release(a)  # type: ignore[arg-type]
    assert device.live == 0


async def test_with_the_cache_off_every_model_stays_on_the_device(
    device: FakeDevice, models: Models, autojump_clock: trio.testing.MockClock
) -> None:
    """``ResidentWeights`` is the one way to say "cache off": loaded at ``add``, freed at
    ``remove`` (after the last batch), never moved, nothing to compact or report."""
    from reactantserver.runtime.weight_provider import ResidentWeights

    weights = ResidentWeights(device.to_device, device.free)  # type: ignore[arg-type]
    a = models("a", 10**3, "unpinned")
    await weights.add(a)  # type: ignore[arg-type]
    assert weights.floor(a) == "device" and weights.is_resident(a)  # type: ignore[arg-type]
    assert await weights.acquire(a) and device.live == 10**3  # type: ignore[arg-type]
    assert await weights.compact([a]) == (0, 10**3)  # type: ignore[list-item]
    with pytest.raises(FailedPrecondition, match="cache is off"):
        await weights.set_floor(a, "system")  # type: ignore[arg-type]
    assert await weights.set_floor(a, "device") == "device"  # type: ignore[arg-type]
    assert weights.statistics() is None and weights.on_demand_budget == 0
    await weights.remove(a)  # type: ignore[arg-type]
    assert device.live == 10**3  # still in use by the batch
    weights.release(a)  # type: ignore[arg-type]
    assert device.live == 0 and not weights.is_resident(a)  # type: ignore[arg-type]


# ------------------------------------------------------------ the real CPU device


@pytest.mark.slow
async def test_staged_host_copies_load_and_run_on_the_cpu_device(
    zoo_repo: Path, zoo_models: dict[str, Any], zoo_runtime: Any
) -> None:
    from reactantserver.bundle import load_bundle
    from reactantserver.models import ServedModel

    bundle = load_bundle(zoo_repo / "mlp")
    program, reference = zoo_models["mlp"]
    model = ServedModel(
        bundle, program, ModelSchedConfig(), platform="jax_cpu", generation=1, max_queue_depth=8
    )
    staging = PinnedHostStaging.for_device(zoo_runtime.device)
    assert staging is not None  # the CPU client lists a pinned_host memory space too
    arena = 10 * bundle.weights_nbytes
    cache = CachedWeights(
        zoo_runtime,
        RuntimeConfig(arena_bytes=arena),
        arena=arena,
        staging=staging,
        host=HostStore(allocate=copying_allocate),
    )
    await cache.add(model)
    stats = cache.statistics()
    assert stats.staged_bytes == bundle.weights_nbytes and stats.pinned_host
    assert stats.host.resident_bytes == 0  # the pageable copy was dropped once staged
    weights = await cache.acquire(model)
    try:
        assert {w.sharding.memory_kind for w in weights} == {"device"}
        x = [np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)]
        for got, want in zip(
            program.execute(x, weights), program.execute(x, reference), strict=True
        ):
            np.testing.assert_array_equal(got, want)
    finally:
        cache.release(model)
    assert await cache.compact() == (0, 0)
    assert all(w.is_deleted() for w in weights)
    await cache.remove(model)
    assert cache.statistics().staged_bytes == 0


@pytest.mark.slow
def test_make_weight_provider_turns_the_cache_on_with_an_arena(zoo_runtime: Any) -> None:
    from reactantserver.runtime.weight_provider import ResidentWeights

    assert isinstance(make_weight_provider(ServerConfig(), zoo_runtime), ResidentWeights)
    on = ServerConfig(runtime=RuntimeConfig(arena_bytes=1000))
    cache = make_weight_provider(on, zoo_runtime)
    assert isinstance(cache, CachedWeights)
    assert cache.budget.on_demand == 900  # floor(0.9 * 1000): wiggle 0.1, no scratch on CPU
    assert not cache.probe_available  # the CPU reports no allocator statistics
    off = ServerConfig(runtime=RuntimeConfig(arena_bytes=1000, weight_cache_fraction=0.0))
    assert isinstance(make_weight_provider(off, zoo_runtime), ResidentWeights)


@pytest.mark.slow
def test_cpu_host_copies_are_really_copied_to_the_device(zoo_runtime: Any) -> None:
    for shape, dtype in (((3, 5), np.float32), ((1 << 16,), np.uint8), ((7,), np.int64)):
        host = copying_allocate(shape, np.dtype(dtype))
        host[...] = 1
        assert host.flags.c_contiguous and host.shape == shape
        (device,) = zoo_runtime.to_device([host])
        assert device.unsafe_buffer_pointer() != host.ctypes.data
        host[...] = 2  # the device copy is unaffected
        assert np.asarray(device).max() == 1
        zoo_runtime.free([device])


@pytest.mark.slow
def test_packed_loads_on_the_cpu_are_real_copies_and_one_program_serves_a_layout(
    zoo_repo: Path, zoo_runtime: Any, tmp_path: Path
) -> None:
    """On the real CPU device: a version's packed host copy, loaded with its layout's
    unpack program, gives exactly its weights in new device buffers (changing the host
    copy afterwards changes nothing on the device); the variants of one architecture share
    one program; and every dtype a weights file may hold, zero-sized tensors included,
    comes back as ``Runtime.to_device`` puts it (bit for bit; 64-bit ones as JAX converts
    them without ``jax_enable_x64``)."""
    from reactantserver.bundle import load_bundle, write_weights
    from reactantserver.weights import read_layout

    store = HostStore(allocate=copying_allocate)
    loaders = []
    for name in ("mlp", "mlp_v000"):
        bundle = load_bundle(zoo_repo / name)
        assert bundle.weights_path is not None
        copy = store.materialize(name, read_layout(bundle.weights_path))
        assert copy.packed is not None
        loaders.append(zoo_runtime.packed_loader(copy.layout.tensors))
        arrays = loaders[-1](copy.packed)
        host_range = range(copy.packed.ctypes.data, copy.packed.ctypes.data + copy.packed.nbytes)
        for device, host in zip(arrays, bundle.read_weights(), strict=True):
            assert device.unsafe_buffer_pointer() not in host_range
            np.testing.assert_array_equal(np.asarray(device), host)
        copy.packed[...] = 0
        for device, host in zip(arrays, bundle.read_weights(), strict=True):
            np.testing.assert_array_equal(np.asarray(device), host)  # a copy, not a view
        zoo_runtime.free(arrays)
    assert loaders[0] is loaders[1]  # one program per layout
    import ml_dtypes

    rng = np.random.default_rng(5)
    odd = [
        ("f16", rng.standard_normal((3, 5)).astype(np.float16)),
        ("b", rng.integers(0, 2, (7,)).astype(np.bool_)),
        ("i8", rng.integers(-128, 127, (9,)).astype(np.int8)),
        ("empty", np.zeros((0, 4), np.float32)),
        ("bf16", rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16)),
        ("u8", rng.integers(0, 255, (13,)).astype(np.uint8)),
        ("i64", rng.integers(-(2**40), 2**40, (2, 2)).astype(np.int64)),
        ("f64", rng.standard_normal((1,)).astype(np.float64)),
    ]
    path = tmp_path / "weights.safetensors"
    write_weights(path, odd)
    copy = store.materialize("odd", read_layout(path))
    arrays = zoo_runtime.packed_loader(copy.layout.tensors)(copy.packed)
    for device, (name, host) in zip(arrays, odd, strict=True):
        got, (want,) = np.asarray(device), zoo_runtime.to_device([host])
        want = np.asarray(want)
        assert (got.dtype, got.shape) == (want.dtype, want.shape), name
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    without = [(n, a) for n, a in odd if a.dtype.itemsize < 8]  # the unpack program's path
    write_weights(path, without)
    copy = store.materialize("odd", read_layout(path))
    arrays = zoo_runtime.packed_loader(copy.layout.tensors)(copy.packed)
    for device, (name, host) in zip(arrays, without, strict=True):
        got = np.asarray(device)
        assert (got.dtype, got.shape) == (host.dtype, host.shape), name
        np.testing.assert_array_equal(got.view(np.uint8), host.view(np.uint8))


@pytest.mark.slow
def test_a_layout_is_cut_from_words_of_its_own_width_and_staged_as_those_words(
    zoo_runtime: Any, tmp_path: Path
) -> None:
    """A packed buffer is handed to its unpack program as the layout's one dtype where the
    tensors share it (slices only), as unsigned words of their one width where they share
    a width of 2 or 4 bytes, and as bytes otherwise; whichever it is, each tensor comes
    back bit for bit, from the host buffer and from a copy staged in pinned host memory,
    the staged copy is one array of those words, and a layout of more tensors than one
    program cuts on the CPU comes back whole and in order from several."""
    import ml_dtypes

    from reactantserver.bundle import write_weights
    from reactantserver.runtime.unpack import CPU_MAX_OUTPUTS, packed_word
    from reactantserver.weights import read_layout

    rng = np.random.default_rng(7)

    def normal(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return rng.standard_normal(shape).astype(dtype)

    def ints(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)

    layouts = [
        (
            "float32",
            [normal((16, 3), np.float32), normal((3,), np.float32), normal((0,), np.float32)],
        ),
        ("bfloat16", [normal((5, 2), ml_dtypes.bfloat16), normal((7,), ml_dtypes.bfloat16)]),
        ("int8", [ints((9,), np.int8), ints((3, 3), np.int8)]),
        (
            "uint16",
            [normal((3,), np.float16), normal((2, 2), ml_dtypes.bfloat16), ints((5,), np.int16)],
        ),
        ("uint32", [normal((4, 4), np.float32), ints((6,), np.int32), ints((1,), np.uint32)]),
        ("uint8", [ints((5,), np.int8), normal((3,), np.float32), rng.integers(0, 2, 4) > 0]),
        # More tensors than one program cuts on the CPU (CPU_MAX_OUTPUTS): several programs.
        (
            "float32",
            [normal((i % 3 + 1, 2, i + 1), np.float32) for i in range(2 * CPU_MAX_OUTPUTS + 1)],
        ),
        (
            "uint32",
            [
                normal((i + 1,), np.float32) if i % 2 else ints((2, i + 1), np.int32)
                for i in range(CPU_MAX_OUTPUTS + 1)
            ],
        ),
    ]
    staging = PinnedHostStaging.for_device(zoo_runtime.device)
    assert staging is not None  # the CPU client lists a pinned_host space too
    store = HostStore(allocate=copying_allocate)
    for n, (word, arrays) in enumerate(layouts):
        path = tmp_path / f"{n}.safetensors"
        write_weights(path, [(f"t{i}", a) for i, a in enumerate(arrays)])
        copy = store.materialize(str(n), read_layout(path))
        assert copy.packed is not None
        assert packed_word(copy.layout.tensors) == np.dtype(word), word
        load = zoo_runtime.packed_loader(copy.layout.tensors)
        staged = staging.stage_packed(copy.packed.view(np.dtype(word)))
        assert (
            staged.dtype == np.dtype(word) and staged.size * staged.itemsize == copy.packed.nbytes
        )
        for source in (copy.packed, staged):
            loaded = load(source)
            for got, want in zip(loaded, arrays, strict=True):
                got = np.asarray(got)
                assert (got.dtype, got.shape) == (want.dtype, want.shape), word
                np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
            zoo_runtime.free(loaded)
        zoo_runtime.free([staged])
