"""GPU scenarios that must run in a process of their own; each prints one JSON line.

    python tests/gpu_scenarios.py cache_oom REPO MEM_FRACTION
    python tests/gpu_scenarios.py transfer_paths REPO BACKEND

``cache_oom``: the weight cache on a real CUDA ``Runtime`` whose budget is told the
arena is 100 times what the allocator really has (as when memory the budget does not
know of is taken: another process on the GPU, a leak). The repository holds ``double``
and ``huge`` (weights twice the real arena). Loading ``huge`` fails in the allocator; the
cache compacts and tries once more, then raises ``ResourceExhausted``; ``double`` then
loads and computes correctly on the same cache. Reported: the error, the cache's
counters, the allocator's limit and bytes in use, and ``double``'s answer check.

``transfer_paths``: every compiled model of REPO on a real ``Runtime`` of BACKEND, its
weights loaded by the weight cache as a worker loads them (host copies staged in pinned
host memory where the device has it): per model, the transfer path of each compiled
size (``model.output_path``), the memory kind of the outputs each size's launch returns,
and the memory kind of the weights the cache hands out. On ``cpu`` the runtime is put on
CUDA's path (the CPU offers ``pinned_host`` memory too), so the CPU suite checks the
logic the GPU test asserts (``test_runtime_transfers.py``; the GPU's is
``test_gpu_transfers.py``).

The tests that run them assert on the JSON; keeping the GPU work here keeps the test
process on the CPU.
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


async def transfer_paths(repo: Path, backend: str, runtime: Any = None) -> dict[str, Any]:
    """See the module docstring; ``runtime`` (a CPU one) is for in-process callers."""
    from reactantserver.bundle import load_bundle
    from reactantserver.config import ModelSchedConfig, RuntimeConfig
    from reactantserver.models import ServedModel
    from reactantserver.runtime import Runtime
    from reactantserver.runtime.host_memory import PinnedHostStaging, copying_allocate
    from reactantserver.runtime.weight_cache import CachedWeights
    from reactantserver.weights import HostStore

    if runtime is None:
        config = RuntimeConfig(backend=backend, allow_cpu_fallback=backend != "cuda")
        runtime = Runtime.start(config, "")
    path = runtime.output_path
    if runtime.backend == "cpu":
        runtime.output_path = "pinned_host"  # CUDA's path, on the CPU's pinned_host memory
    try:
        bundles = [
            load_bundle(d)
            for d in sorted(repo.iterdir())
            if (d / "manifest.yaml").is_file()
            and "kind: meta" not in (d / "manifest.yaml").read_text()
        ]
        arena = 2 * sum(b.weights_nbytes for b in bundles)
        cpu = runtime.backend == "cpu"
        cache = CachedWeights(
            runtime,
            RuntimeConfig(arena_bytes=arena, weight_cache_wiggle_fraction=0.0),
            arena=arena,
            staging=PinnedHostStaging.for_device(runtime.device),
            host=HostStore(allocate=copying_allocate) if cpu else HostStore(),
            memory=lambda: None,  # the budget is the scenario's: no probe
        )
        report: dict[str, Any] = {
            "backend": runtime.backend,
            "runtime_path": runtime.output_path,
            "models": {},
        }
        for generation, bundle in enumerate(bundles, start=1):
            loaded = runtime.load(bundle)
            model = ServedModel(
                bundle,
                loaded,
                ModelSchedConfig(),
                platform=f"jax_{runtime.backend}",
                generation=generation,
                max_queue_depth=8,
            )
            await cache.add(model)
            weights = await cache.acquire(model)
            try:
                kinds = {}
                for size in loaded.sizes:
                    launched = loaded.launch(loaded.zeros(size), weights)
                    kinds[str(size)] = sorted({o.sharding.memory_kind for o in launched.outputs})
                    loaded.fetch(launched)
                report["models"][bundle.name] = {
                    "paths": {str(size): p for size, p in loaded.paths.items()},
                    "output_kinds": kinds,
                    "weight_kinds": sorted({w.sharding.memory_kind for w in weights}),
                }
            finally:
                cache.release(model)
        stats = cache.statistics()
        report["staged_bytes"] = stats.staged_bytes
        report["weight_bytes"] = sum(b.weights_nbytes for b in bundles)
        report["pinned_host_staging"] = stats.pinned_host
        return report
    finally:
        runtime.output_path = path


def main(argv: list[str]) -> int:
    scenario, *args = argv
    if scenario == "cache_oom":
        result = trio.run(cache_oom, Path(args[0]), float(args[1]))
    elif scenario == "transfer_paths":
        result = trio.run(transfer_paths, Path(args[0]), args[1])
    else:
        print(f"unknown scenario {scenario!r}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
