"""The CUDA code paths, exercised on the CPU with fakes that say what they stand for.

No GPU is needed here; ``test_gpu_*.py`` run the same paths on a real one (``nox -s
gpu``). What is faked, and why it is honest:

* Out of device memory is JAX's own exception class (``jax.errors.JaxRuntimeError``)
  carrying XLA's status text, raised by ``fake_device.FakeDevice`` when a transfer would
  take its live bytes past a capacity -- the arithmetic of an allocator's limit, not
  its fragmentation.
* Allocator statistics are a dict with the keys JAX's GPU client returns from
  ``Device.memory_stats()`` (the CPU client returns None).
* A "CUDA runtime" is the real CPU runtime reporting ``backend == "cuda"`` and GPU
  statistics: the CPU device lists the same memory kinds as a GPU (``device``,
  ``pinned_host``, ``unpinned_host``), so the pinned-host staging path runs for real,
  with host memory on both sides.
* The GPU-visibility decision of ``gpu_support`` is given its inputs (the platform
  list, the installed plugins, a probe result) rather than a machine.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from conftest import inline
from fake_device import FakeDevice, Models, jax_out_of_memory, make_cache, run_batch
from gpu_support import ProbeResult, cuda_plugins, no_gpu_reason

from reactantserver.config import ModelSchedConfig, RuntimeConfig, ServerConfig
from reactantserver.errors import ExecutionFailed, ResourceExhausted
from reactantserver.runtime import EnvironmentReport, LoadedModel, MemoryStats, Runtime
from reactantserver.runtime.device_errors import is_out_of_memory
from reactantserver.runtime.weight_cache import CachedWeights
from reactantserver.runtime.weight_provider import make_weight_provider
from reactantserver.status import StatusCode, code_of

# --------------------------------------------------------------------- out of memory


@pytest.mark.parametrize(
    ("message", "oom"),
    [
        ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4294967296 bytes.", True),
        (
            "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 268435456 bytes.\n"
            "BufferAssignment OOM Debugging.\nBufferAssignment stats: ...",
            True,
        ),
        (
            "INTERNAL: Failed to allocate 1048576 bytes: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
            True,
        ),
        ("INTERNAL: CUDA error: an illegal memory access was encountered", False),
        ("INVALID_ARGUMENT: argument 0 has the wrong shape", False),
    ],
)
def test_out_of_memory_is_recognised_in_what_jax_raises(message: str, oom: bool) -> None:
    from jax.errors import JaxRuntimeError

    assert is_out_of_memory(JaxRuntimeError(message)) is oom


def test_host_memory_errors_are_not_device_out_of_memory() -> None:
    assert not is_out_of_memory(MemoryError("Unable to allocate 4.00 GiB for an array"))
    assert not is_out_of_memory(ValueError("RESOURCE_EXHAUSTED"))  # not a device status


async def test_a_load_the_allocator_refuses_is_retried_once_on_a_compacted_arena(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The budget says b fits next to idle a; the device disagrees (30 bytes are held by
    something the budget does not know of). The cache frees every idle copy and loads
    b on the second try: the batch never sees the failure."""
    device = FakeDevice(capacity=100)
    device.foreign = 30
    models = Models(tmp_path, device)
    cache = make_cache(device, 100)
    a, b = models("a", 40), models("b", 40)
    for m in (a, b):
        await cache.add(m)  # type: ignore[arg-type]
    await run_batch(cache, device, a)
    with caplog.at_level(logging.WARNING, logger="reactantserver.runtime.weight_cache"):
        await run_batch(cache, device, b)
    assert "the device is out of memory loading b#2" in caplog.text
    assert "freeing every idle on-demand copy and trying once more" in caplog.text
    s = cache.statistics().policy
    assert (s.compactions, s.load_failures, s.loads) == (1, 1, 2)
    assert s.lru == ("b#2",) and device.live == 40


async def test_a_load_that_never_fits_is_resource_exhausted_and_the_cache_serves_on(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    device = FakeDevice(capacity=100)
    device.foreign = 50
    models = Models(tmp_path, device)
    cache = make_cache(device, 100)
    small, big = models("small", 20), models("big", 60)
    for m in (small, big):
        await cache.add(m)  # type: ignore[arg-type]
    await run_batch(cache, device, small)
    with pytest.raises(ResourceExhausted) as info:
        await cache.acquire(big)  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith(
        "model 'big': the device is out of memory for its weights (60 bytes), even with every "
        "idle model's weights freed (RESOURCE_EXHAUSTED: Out of memory while trying to "
        "allocate 60 bytes.)"
    )
    assert "raise runtime.mem_fraction" in message
    assert code_of(info.value) == StatusCode.RESOURCE_EXHAUSTED  # clients retry it
    s = cache.statistics().policy
    assert (s.compactions, s.load_failures) == (1, 2)
    assert s.resident_bytes == 0 and not cache.is_resident(big)  # type: ignore[arg-type]
    await run_batch(cache, device, small)  # the worker's other models still run
    device.foreign = 0  # whatever held the memory let it go: the next acquire succeeds
    await run_batch(cache, device, big)
    assert cache.statistics().policy.lru == ("small#1", "big#2")  # both fit the budget


async def test_other_load_failures_stay_internal_and_are_not_retried(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    device = FakeDevice()
    models = Models(tmp_path, device)
    cache = make_cache(device, 100)
    a = models("a", 40)
    await cache.add(a)  # type: ignore[arg-type]
    device.fail_next = 1  # FakeDevice.failure: an INTERNAL error, not out of memory
    with pytest.raises(ExecutionFailed, match="loading its weights onto the device failed"):
        await cache.acquire(a)  # type: ignore[arg-type]
    assert cache.statistics().policy.compactions == 0


async def test_out_of_memory_in_a_probe_run_fails_the_version_without_compacting(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The startup probe runs each version alone: there is nothing to free, so the
    warm-up (and with it the model's load) fails with the out-of-memory error."""
    device = FakeDevice(stats=True, capacity=50)
    models = Models(tmp_path, device)
    config = RuntimeConfig(weight_cache_fraction=1.0, weight_cache_wiggle_fraction=0.0)
    cache = CachedWeights(device, config, arena=1000, thread=inline)  # type: ignore[arg-type]
    small, huge = models("small", 10), models("huge", 80)
    for m in (small, huge):
        await cache.add(m)  # type: ignore[arg-type]
    await cache.warm_up(small)  # type: ignore[arg-type]
    with pytest.raises(ResourceExhausted, match="out of memory for its weights"):
        await cache.warm_up(huge)  # type: ignore[arg-type]
    s = cache.statistics().policy
    assert (s.compactions, s.load_failures) == (0, 1)
    await cache.remove(huge)  # type: ignore[arg-type]  # what the worker does next
    b = await cache.finish_probe()
    assert b.on_demand > 0 and cache.probe_available


def _fake_program(error: Exception) -> Any:
    def run(*args: Any) -> Any:
        raise error

    return run


def test_an_execution_out_of_memory_is_resource_exhausted(
    zoo_repo: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``LoadedModel.execute`` over a stand-in executable that raises what XLA raises
    when an execution's buffers do not fit."""
    from reactantserver.bundle import load_bundle

    bundle = load_bundle(zoo_repo / "double")
    oom = LoadedModel(bundle, {s: _fake_program(jax_out_of_memory(1 << 30)) for s in (1, 4, 8)}, [])
    x = [np.zeros((4, 16), np.float32)]
    weights: list[Any] = [object()] * len(bundle.weight_specs)
    with (
        caplog.at_level(logging.WARNING, logger="reactantserver.runtime"),
        pytest.raises(ResourceExhausted) as info,
    ):
        oom.execute(x, weights)
    assert str(info.value).startswith(
        "model 'double': the device ran out of memory executing at batch size 4 "
        "(RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1073741824 bytes.)"
    )
    assert "raise runtime.weight_cache_wiggle_fraction" in str(info.value)
    assert caplog.messages == [str(info.value)]  # the operator hears of it once
    from jax.errors import JaxRuntimeError

    broken = LoadedModel(
        bundle,
        {s: _fake_program(JaxRuntimeError("INTERNAL: launch failed")) for s in (1, 4, 8)},
        [],
    )
    with pytest.raises(ExecutionFailed, match="execution at batch size 4 failed"):
        broken.execute(x, weights)


# ------------------------------------------------------------- allocator statistics

#: What ``Device.memory_stats()`` returns on JAX's GPU client (keys of XLA's
#: ``AllocatorStats``), here for a 24 GiB arena with 1 GiB in use.
GPU_STATS = {
    "num_allocs": 412,
    "bytes_in_use": 1 << 30,
    "peak_bytes_in_use": 3 << 29,
    "largest_alloc_size": 1 << 28,
    "bytes_limit": 24 << 30,
    "bytes_reserved": 0,
    "peak_bytes_reserved": 0,
    "bytes_reservable_limit": 0,
    "largest_free_block_bytes": 23 << 30,
    "pool_bytes": 24 << 30,
    "peak_pool_bytes": 24 << 30,
}


class _GpuDeviceStandIn:
    """A ``jax.Device`` as far as ``Runtime.memory_stats`` and staging look at it."""

    device_kind = "NVIDIA H100 80GB HBM3"

    def __init__(self, kinds: Sequence[str] = ("device",)) -> None:
        self._kinds = kinds

    def memory_stats(self) -> dict[str, int]:
        return dict(GPU_STATS)

    def addressable_memories(self) -> list[Any]:
        return [type("Memory", (), {"kind": k})() for k in self._kinds]


def test_allocator_statistics_are_read_as_the_gpu_client_reports_them() -> None:
    runtime = Runtime(
        RuntimeConfig(backend="cuda"),
        _GpuDeviceStandIn(),  # type: ignore[arg-type]
        "cuda",
        False,
        "",
        EnvironmentReport(applied={}, ignored={}, jax_was_initialised=False),
    )
    stats = runtime.memory_stats()
    assert stats == MemoryStats(
        in_use=1 << 30, limit=24 << 30, peak=3 << 29, raw={k: int(v) for k, v in GPU_STATS.items()}
    )


class _CudaRuntimeStandIn:
    """The real CPU runtime reporting backend ``cuda`` and GPU allocator statistics."""

    backend = "cuda"

    def __init__(self, cpu: Any, device: Any = None) -> None:
        self._cpu = cpu
        self.device = device if device is not None else cpu.device

    def memory_stats(self) -> MemoryStats:
        return MemoryStats(in_use=0, limit=GPU_STATS["bytes_limit"], peak=0, raw=GPU_STATS)

    def to_device(self, host: Sequence[np.ndarray]) -> list[Any]:
        return self._cpu.to_device(host)  # type: ignore[no-any-return]

    def packed_loader(self, tensors: Sequence[Any]) -> Any:
        return self._cpu.packed_loader(tensors)

    def free(self, arrays: Sequence[Any]) -> None:
        self._cpu.free(arrays)


@pytest.mark.slow
async def test_on_cuda_the_cache_sizes_from_the_device_and_stages_in_pinned_memory(
    zoo_repo: Path, zoo_models: dict[str, Any], zoo_runtime: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from reactantserver.bundle import load_bundle
    from reactantserver.models import ServedModel

    runtime = _CudaRuntimeStandIn(zoo_runtime)
    # arena_bytes is for backends that report no arena: the device's limit wins.
    config = ServerConfig(runtime=RuntimeConfig(backend="cuda", arena_bytes=1000))
    with caplog.at_level(logging.INFO, logger="reactantserver.runtime.weight_provider"):
        cache = make_weight_provider(config, runtime)  # type: ignore[arg-type]
    assert isinstance(cache, CachedWeights)
    assert cache.budget.arena == GPU_STATS["bytes_limit"] and cache.probe_available
    assert (
        f"on-demand weight cache on: arena {GPU_STATS['bytes_limit']} bytes (reported by the "
        "device)" in caplog.text
    )
    assert "host copies in pinned host memory" in caplog.text
    bundle = load_bundle(zoo_repo / "mlp")
    program, reference = zoo_models["mlp"]
    model = ServedModel(
        bundle, program, ModelSchedConfig(), platform="jax_cuda", generation=1, max_queue_depth=8
    )
    await cache.add(model)
    stats = cache.statistics()
    assert stats.pinned_host and stats.staged_bytes == bundle.weights_nbytes
    assert stats.host.resident_bytes == 0  # the pageable copy is dropped once staged
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


@pytest.mark.slow
def test_on_cuda_without_a_pinned_host_space_host_copies_stay_pageable(
    zoo_runtime: Any, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = _CudaRuntimeStandIn(zoo_runtime, device=_GpuDeviceStandIn(kinds=("device",)))
    with caplog.at_level(logging.INFO, logger="reactantserver.runtime.weight_provider"):
        cache = make_weight_provider(ServerConfig(), runtime)  # type: ignore[arg-type]
    assert isinstance(cache, CachedWeights)
    assert not cache.statistics().pinned_host
    assert "host copies in pageable memory" in caplog.text


def test_cuda_settings_reach_a_fresh_process_before_jax_starts() -> None:
    """``runtime.backend: cuda`` with its allocator settings, in a process where JAX has
    not started: the variables are set before it does; without a GPU the runtime falls
    back to the CPU (allowed) and says so."""
    code = (
        "import json, logging, os, sys\n"
        "logging.basicConfig(level=logging.WARNING, format='%(message)s')\n"
        "from reactantserver.config import RuntimeConfig\n"
        "from reactantserver.runtime import Runtime\n"
        "assert 'jax' not in sys.modules\n"
        "rt = Runtime.start(RuntimeConfig(backend='cuda', mem_fraction=0.3, preallocate=False))\n"
        "print(json.dumps({'backend': rt.backend, 'fell_back': rt.fell_back,\n"
        "  'env': {k: os.environ[k] for k in sorted(rt.environment.applied)}}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "backend": "cpu",
        "fell_back": True,
        "env": {
            "JAX_PLATFORMS": "cuda,cpu",
            "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.3",
            "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        },
    }
    assert "runtime.backend is cuda but no CUDA device is visible; falling back to the CPU" in (
        out.stderr
    )


# ------------------------------------------------------------------ the gpu marker


def test_a_cpu_only_run_skips_the_gpu_tests_without_looking_further() -> None:
    def never() -> Any:
        raise AssertionError("must not be called")

    reason, probe = no_gpu_reason("cpu", plugins=never, probe=never)
    assert reason == (
        "JAX_PLATFORMS=cpu: a CPU-only run (nox -s tests); nox -s gpu runs these on a machine "
        "with an NVIDIA GPU"
    )
    assert probe is None


def test_without_a_cuda_plugin_no_subprocess_is_started() -> None:
    def never() -> ProbeResult:
        raise AssertionError("must not probe")

    reason, _ = no_gpu_reason(None, plugins=list, probe=never)
    assert reason is not None and reason.startswith("no CUDA plugin of JAX is installed")


def test_the_probe_decides_when_a_plugin_is_there() -> None:
    plugins = ["jax-cuda13-plugin"]
    reason, _ = no_gpu_reason(
        "cuda,cpu",
        plugins=lambda: plugins,
        probe=lambda: ProbeResult(error="RuntimeError: Unable to initialize backend 'cuda'"),
    )
    assert reason == "JAX sees no GPU: RuntimeError: Unable to initialize backend 'cuda'"
    found = ProbeResult(devices=("NVIDIA H100 80GB HBM3",), jax="0.11.2")
    assert no_gpu_reason(None, plugins=lambda: plugins, probe=lambda: found) == (None, found)


def test_cuda_plugins_are_recognised_by_distribution_name() -> None:
    names = ["jax", "jaxlib", "jax-cuda12-plugin", "jax_cuda13_pjrt", "jax-cuda12-plugin", "torch"]
    assert cuda_plugins(names) == ["jax-cuda12-plugin", "jax_cuda13_pjrt"]
