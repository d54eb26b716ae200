"""On a GPU: device memory as the allocator and the driver report it (issue 20).

* ``runtime.mem_fraction`` and ``runtime.preallocate`` reach XLA's allocator: the
  arena the worker reports is that fraction of the device, and ``nvidia-smi`` shows it
  claimed up front, or not, accordingly.
* The weight cache's arena, budget and probe come from the allocator's real statistics:
  the arena is the allocator's limit, the scratch is measured (and covers at least the
  warm-ups' inputs and outputs), and the budget is exactly the formula of
  docs/on_demand_weights.md over those numbers.
* Out of device memory during a weight load, in the cache on a real allocator: one
  compaction and retry, then ``ResourceExhausted``; the cache serves on.

Every GPU configuration runs in a process of its own (a worker, or
``gpu_scenarios.py``); this process stays on the CPU. Skipped where no GPU is visible.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ZOO_NAMES
from gpu_support import BACKEND, dry_run, huge_bundle, require_gpu
from harness import gpu_memory, running_worker, worker_env

from reactantserver.bundle import load_bundle
from reactantserver.weights import weight_budget

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

HERE = Path(__file__).resolve().parents[1]
MiB = 2**20


@pytest.mark.parametrize(("mem_fraction", "preallocate"), [(0.25, True), (0.5, False)])
def test_mem_fraction_and_preallocate_reach_the_allocator(
    zoo_repo: Path, tmp_path: Path, mem_fraction: float, preallocate: bool
) -> None:
    require_gpu("XLA's GPU allocator and nvidia-smi")
    idle = gpu_memory()
    assert idle is not None, "nvidia-smi is needed to see what the worker claimed"
    settings = {"mem_fraction": mem_fraction, "preallocate": preallocate}
    with running_worker(
        tmp_path, zoo_repo, backend=BACKEND, include=("double",), runtime=settings
    ) as worker:
        m = worker.metrics()
        held = gpu_memory()
    assert held is not None
    limit = m["worker_device_memory_limit_bytes"]
    want = mem_fraction * idle.total_bytes
    # XLA takes the fraction of the device's memory (total, or free at start, which on
    # an idle GPU is total less the CUDA context): within 3 %.
    assert abs(limit - want) <= 0.03 * want, (limit, want)
    claimed = (held.used_mib - idle.used_mib) * MiB
    print(f"mem_fraction {mem_fraction} preallocate {preallocate}: limit {limit:.0f}, ", end="")
    print(f"nvidia-smi used {idle.used_mib} -> {held.used_mib} MiB of {idle.total_mib}")
    if preallocate:
        assert claimed >= 0.95 * limit, (claimed, limit)
    else:
        # The CUDA context and what the models use: far below the arena.
        assert claimed < 0.2 * limit, (claimed, limit)


def test_arena_budget_and_probe_come_from_the_allocators_statistics(
    zoo_repo: Path, tmp_path: Path
) -> None:
    """The zoo with ``resnet`` pinned (``residency: device``): the cache's arena is the
    allocator's limit, its scratch the probe's measurement, its budget the formula."""
    settings: dict[str, object] = {"mem_fraction": 0.5, "preallocate": False}
    if dry_run():
        settings = {"arena_bytes": 64 * MiB}  # the CPU reports no arena
    with running_worker(
        tmp_path,
        zoo_repo,
        backend=BACKEND,
        include=ZOO_NAMES,
        runtime=settings,
        models={"resnet": {"residency": "device"}},
    ) as worker:
        m = worker.metrics()
        log = worker.log_text()
    arena = int(m["worker_weight_cache_arena_bytes"])
    scratch = int(m["worker_weight_cache_max_scratch_bytes"])
    pinned = int(m["worker_weight_cache_pinned_bytes"])
    assert pinned == load_bundle(zoo_repo / "resnet").weights_nbytes
    b = weight_budget(
        arena=arena, fraction=1.0, wiggle=0.1, max_scratch=scratch, pinned_bytes=pinned
    )
    assert m["worker_weight_pool_bytes"] == b.weight_pool
    assert m["worker_weight_cache_max_bytes"] == b.on_demand
    print(
        f"arena {arena}, scratch {scratch}, pinned {pinned}, pool {b.weight_pool}, on demand {b.on_demand}"
    )
    require_gpu("allocator statistics (the CPU reports none: no probe)")
    assert arena == m["worker_device_memory_limit_bytes"]
    assert f"weight cache sized: {len(ZOO_NAMES)} probe run(s), max scratch {scratch} bytes" in log
    # Each warm-up ran every compiled size on zeros: its inputs and outputs were on the
    # device at the peak, above the baseline of resident weights.
    io = 0
    for name in ZOO_NAMES:
        bundle = load_bundle(zoo_repo / name)
        size = max(bundle.compiled_batch_sizes)
        specs = [*bundle.inputs, *bundle.outputs]
        io = max(io, sum(s.numpy_dtype.itemsize * math.prod(s.with_batch(size)) for s in specs))
    assert io <= scratch < arena // 4, (io, scratch, arena)
    assert scratch <= m["worker_device_memory_peak_in_use_bytes"]


def test_out_of_memory_in_the_cache_compacts_retries_then_fails_cleanly(
    zoo_repo: Path, tmp_path: Path
) -> None:
    require_gpu("a real allocator that runs out of memory")
    memory = gpu_memory()
    assert memory is not None
    arena = 512 * MiB
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(zoo_repo / "double", repo / "double")
    huge_bundle(repo / "huge", 2 * arena)
    out = subprocess.run(
        [
            sys.executable,
            str(HERE / "gpu_scenarios.py"),
            "cache_oom",
            str(repo),
            repr(arena / memory.total_bytes),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=worker_env(),
    )
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(result)
    assert "the device is out of memory for its weights" in result["error"]
    assert "RESOURCE_EXHAUSTED" in result["error"]
    assert result["double_before"] and result["double_after"]
    assert result["compactions"] == 1  # one retry, on a compacted arena
    assert result["load_failures"] == 2
    assert not result["huge_resident"]
    assert result["in_use_after"] < 64 * MiB  # the failed load left nothing behind
