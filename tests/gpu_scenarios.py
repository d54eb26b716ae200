"""GPU scenarios that must run in a process of their own; each prints one JSON line.

    python tests/gpu_scenarios.py cache_oom REPO MEM_FRACTION

``cache_oom``: the weight cache on a real CUDA ``Runtime`` whose budget is told the
arena is 100 times what the allocator really has (as when memory the budget does not
know of is taken: another process on the GPU, a leak). The repository holds ``double``
and ``huge`` (weights twice the real arena). Loading ``huge`` fails in the allocator; the
cache compacts and tries once more, then raises ``ResourceExhausted``; ``double`` then
loads and computes correctly on the same cache. Reported: the error, the cache's
counters, the allocator's limit and bytes in use, and ``double``'s answer check.

The test that runs it (``test_gpu_memory.py``) asserts on the JSON; keeping the GPU
work here keeps the test process on the CPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import trio


async def cache_oom(repo: Path, mem_fraction: float) -> dict[str, Any]:
    from reactantserver.bundle import load_bundle
    from reactantserver.config import ModelSchedConfig, RuntimeConfig
    from reactantserver.errors import ResourceExhausted
    from reactantserver.models import ServedModel
    from reactantserver.runtime import Runtime
    from reactantserver.runtime.host_memory import PinnedHostStaging
    from reactantserver.runtime.weight_cache import CachedWeights

    config = RuntimeConfig(
        backend="cuda", allow_cpu_fallback=False, mem_fraction=mem_fraction, preallocate=False
    )
    runtime = Runtime.start(config, "")
    stats = runtime.memory_stats()
    assert stats is not None and runtime.backend == "cuda"
    cache = CachedWeights(
        runtime,
        config,
        arena=100 * stats.limit,  # the lie: the budget believes in 100x the memory
        staging=PinnedHostStaging.for_device(runtime.device),
    )
    models = {}
    for generation, name in enumerate(("double", "huge"), start=1):
        bundle = load_bundle(repo / name)
        models[name] = ServedModel(
            bundle,
            runtime.load(bundle),
            ModelSchedConfig(),
            platform="jax_cuda",
            generation=generation,
            max_queue_depth=8,
        )
        await cache.add(models[name])
    await cache.finish_probe()  # no probe: the scenario is about loads, not sizing

    async def run_double() -> bool:
        model = models["double"]
        weights = await cache.acquire(model)
        try:
            x = np.arange(64, dtype=np.float32).reshape(4, 16)
            (y,) = model.loaded.execute([x], weights)
            return bool(np.array_equal(y, 2 * x))
        finally:
            cache.release(model)

    ok_before = await run_double()
    error = ""
    try:
        await cache.acquire(models["huge"])
        cache.release(models["huge"])
    except ResourceExhausted as exc:
        error = str(exc)
    ok_after = await run_double()
    policy = cache.statistics().policy
    after = runtime.memory_stats()
    assert after is not None
    return {
        "error": error,
        "double_before": ok_before,
        "double_after": ok_after,
        "compactions": policy.compactions,
        "load_failures": policy.load_failures,
        "huge_resident": cache.is_resident(models["huge"]),
        "limit": stats.limit,
        "huge_bytes": models["huge"].bundle.weights_nbytes,
        "in_use_after": after.in_use,
    }


def main(argv: list[str]) -> int:
    scenario, *args = argv
    if scenario == "cache_oom":
        result = trio.run(cache_oom, Path(args[0]), float(args[1]))
    else:
        print(f"unknown scenario {scenario!r}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
