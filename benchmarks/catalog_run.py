"""One Zipf run over a catalog of models, through the real scheduler and a weight cache.

Shared by ``bench_weights.py`` (CPU) and ``gpu/bench_gpu_prefetch.py`` (CUDA). No side
effects at import (``bench_weights`` pins JAX to the CPU when imported; this must not).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import trio

from reactantserver.config import ModelSchedConfig, SchedulerConfig
from reactantserver.runtime.weight_cache import CachedWeights


async def zipf_catalog_run(
    cache: CachedWeights,
    bundles: Sequence[Any],
    program: Any,
    platform: str,
    *,
    batch_sizes: Sequence[int],
    requests: int,
    zipf: float,
    clients: int,
    width: int,
    seed: int,
    pipeline_depth: int = 1,
) -> dict[str, float]:
    """Serve ``bundles`` from ``cache`` through a real scheduler: ``requests`` one-row
    requests, models drawn from Zipf(``zipf``) popularity, sent by ``clients`` closed-loop
    clients, with ``pipeline_depth`` batches in flight at most. Throughput, the device's
    idle fraction (1 - device seconds charged to batches / wall) and the bound the loads
    set on it, device seconds per dispatch, dispatches and the cache's counters over the
    run."""
    from reactantserver.models import ServedModel
    from reactantserver.runtime.executor import DeviceExecutor
    from reactantserver.scheduling import Scheduler

    served = {
        b.name: ServedModel(
            b,
            program,
            ModelSchedConfig(),
            platform=platform,
            generation=i + 1,
            max_queue_depth=1024,
        )
        for i, b in enumerate(bundles)
    }
    executor = DeviceExecutor(cache, served.get)
    scheduler = Scheduler(SchedulerConfig(), executor, pipeline_depth=pipeline_depth)
    for name, model in served.items():
        await cache.add(model)
        scheduler.add_model(name, batch_sizes, coalescable=True)
        for size, seconds in (await cache.warm_up(model)).items():
            scheduler.seed_cost(name, size, seconds)
    await cache.finish_probe()
    names = list(served)
    weights = [1 / (k + 1) ** zipf for k in range(len(names))]
    plan = random.Random(seed).choices(names, weights, k=requests)
    x = np.ones((1, width), np.float32)
    before = cache.statistics().policy
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        queue = iter(plan)

        async def client() -> None:
            for name in queue:
                await scheduler.submit(name, {"x": x}, rows=1, group=served[name])

        start = trio.current_time()
        async with trio.open_nursery() as clients_nursery:
            for _ in range(clients):
                clients_nursery.start_soon(client)
        wall = trio.current_time() - start
        await scheduler.aclose()
    stats = scheduler.statistics().policy
    busy = sum(m.compute_seconds for m in stats.models.values())
    after = cache.statistics().policy
    for model in served.values():
        await cache.remove(model)
    loads = after.loads - before.loads
    load_seconds = after.load_seconds - before.load_seconds
    return {
        "throughput": requests / wall,
        "idle": 1.0 - busy / wall,
        # Loads run one at a time: the device idles at least this (pipeline_sim.py). Only
        # meaningful where a load is timed as its transfer (a load waited for in a thread).
        "bound": 1.0 - busy / max(busy, load_seconds),
        "exec_ms": 1e3 * busy / max(1, sum(m.dispatches for m in stats.models.values())),
        "wall": wall,
        "dispatches": sum(m.dispatches for m in stats.models.values()),
        "loads": loads,
        "misses": after.misses - before.misses,
        "prefetches": after.prefetches - before.prefetches,
        "prefetch_hits": after.prefetch_hits - before.prefetch_hits,
        "prefetch_wasted": after.prefetch_wasted - before.prefetch_wasted,
        "load_ms": 1e3 * (after.load_seconds - before.load_seconds) / max(1, loads),
    }
