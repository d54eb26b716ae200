"""GPU benchmark (a): cold-load bandwidth of the weight cache against a plain device_put.

Two models of ``--mib`` MiB each (``--tensors`` tensors) under a budget that holds one,
so every ``CachedWeights.acquire`` is a cold load: evict the other model, transfer in a
worker thread, report to the policy, pin. Each load is timed against a plain
``jax.device_put`` + ``block_until_ready`` of the same bytes from the same kind of host
memory, after freeing the copy the previous put made (the cache frees its victim first
too, so both start from the same allocator state), alternating which goes first,
``--repeats`` times. Rows:

* ``pageable``: ``system`` host copies in ordinary (pageable) host memory, as on the CPU
  backend or a device without a ``pinned_host`` memory space; the plain put moves the
  cache's own host arrays.
* ``pinned``: ``system`` host copies staged in the device's page-locked ``pinned_host``
  memory space (the worker's default on CUDA); the plain put moves a pinned copy of the
  same bytes, staged the same way, with ``jax.device_put`` to the ``device`` memory kind.
* ``file map``: ``residency: unpinned``, every load maps ``weights.safetensors`` (in the
  page cache after the first), transfers and unmaps; the plain put maps the same file.

The ratio is plain time / cache time, the median over adjacent pairs (goal >= 0.9), with
the ratio of the best times in parentheses.

    python benchmarks/gpu/bench_gpu_bandwidth.py                 # on the GPU
    python benchmarks/gpu/bench_gpu_bandwidth.py --backend cpu --quick   # smoke test

About 30 s on an H100 with the defaults (256 MiB in 16 tensors, 20 repeats per row).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import numpy as np
import trio
from harness import Table, device_header, start_runtime

from reactantserver.bundle import read_weight_specs, write_weights
from reactantserver.config import ModelSchedConfig, RuntimeConfig
from reactantserver.config.schema import Residency
from reactantserver.runtime.host_memory import PinnedHostStaging, copying_allocate
from reactantserver.runtime.weight_cache import CachedWeights
from reactantserver.weights import HostStore, map_weights, read_layout

MiB = 2**20


@attrs.define(eq=False)
class Version:
    """What the cache reads of a ``ServedModel`` (hashable by identity, like it)."""

    name: str
    generation: int
    bundle: Any
    sched: ModelSchedConfig
    loaded: Any = None


def weights_model(
    root: Path, name: str, generation: int, nbytes: int, tensors: int, floor: Residency
) -> Version:
    directory = root / name
    directory.mkdir(parents=True)
    path = directory / "weights.safetensors"
    rng = np.random.default_rng(generation)
    each = nbytes // tensors // 4
    write_weights(
        path, [(f"w{i}", rng.standard_normal(each, dtype=np.float32)) for i in range(tensors)]
    )
    bundle = SimpleNamespace(
        name=name, weights_path=path, weight_specs=read_weight_specs(name, path)
    )
    return Version(name, generation, bundle, ModelSchedConfig(residency=floor))


async def measure(
    runtime: Any, root: Path, row: str, nbytes: int, tensors: int, repeats: int
) -> tuple[list[float], list[float]]:
    """(seconds of each plain put, of each cache cold load) for one row."""
    import jax
    from jax.sharding import SingleDeviceSharding

    cpu = runtime.backend == "cpu"
    staging = PinnedHostStaging.for_device(runtime.device) if row == "pinned" else None
    if row == "pinned" and staging is None:
        raise RuntimeError(f"{runtime.device} has no pinned_host memory space")
    # On the CPU, host copies must not be 64-byte aligned or the "device" copy aliases
    # them (host_memory.copying_allocate); a GPU always copies.
    store = HostStore(allocate=copying_allocate) if cpu else HostStore()
    config = RuntimeConfig(weight_cache_wiggle_fraction=0.0, arena_bytes=nbytes * 3 // 2)
    cache = CachedWeights(
        runtime,
        config,
        arena=config.arena_bytes,
        staging=staging,
        host=store,
        memory=lambda: None,  # the budget is the benchmark's: no probe
    )
    floor: Residency = "unpinned" if row == "file map" else "system"
    models = [weights_model(root, f"{row[0]}{i}", i + 1, nbytes, tensors, floor) for i in range(2)]
    for m in models:
        await cache.add(m)
    device = (
        SingleDeviceSharding(runtime.device, memory_kind="device") if staging else runtime.device
    )
    sources: list[Any] = []
    for m in models:
        key = cache.key(m)
        if row == "pinned":
            from reactantserver.bundle import read_weights

            assert staging is not None
            sources.append(
                staging.stage(read_weights(m.name, m.bundle.weights_path, m.bundle.weight_specs))
            )
        elif row == "pageable":
            host = store.get(key)
            assert host is not None
            sources.append(list(host.arrays))
        else:
            sources.append(m.bundle.weights_path)
    resident: list[Any] = []

    def plain(i: int) -> float:
        nonlocal resident
        start = time.perf_counter()
        runtime.free(resident)
        if row == "file map":
            with map_weights(models[i].name, read_layout(sources[i])) as mapped:
                resident = jax.device_put(list(mapped.weights.arrays), device)
                jax.block_until_ready(resident)
        else:
            resident = jax.device_put(sources[i], device)
            jax.block_until_ready(resident)
        return time.perf_counter() - start

    async def cached(i: int) -> float:
        start = time.perf_counter()
        await cache.acquire(models[i])
        elapsed = time.perf_counter() - start
        cache.release(models[i])
        return elapsed

    plain_s: list[float] = []
    cache_s: list[float] = []
    for i in range(repeats + 1):
        which = i % 2
        if which:
            c = await cached(which)
            p = plain(which)
        else:
            p = plain(which)
            c = await cached(which)
        if i:  # the first round pays one-time costs
            plain_s.append(p)
            cache_s.append(c)
    runtime.free(resident)
    for m in models:
        await cache.remove(m)
    assert cache.statistics().policy.loads == repeats + 1
    return plain_s, cache_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--mib", type=int, default=256, help="MiB of weights per model")
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="8 MiB, 3 repeats (smoke test)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default $OUT)")
    args = parser.parse_args(argv)
    if args.quick:
        args.mib, args.tensors, args.repeats = 8, 4, 3
    runtime = start_runtime(args.backend)
    nbytes = args.mib * MiB
    rows = ["pageable", "pinned", "file map"]
    with Table("bench_gpu_bandwidth", out=args.out) as table, tempfile.TemporaryDirectory() as tmp:
        table.line(
            "(a) cold-load bandwidth: weight cache vs plain jax.device_put of the same bytes"
        )
        table.line(device_header(runtime))
        table.line(
            f"{args.mib} MiB in {args.tensors} tensors per load, {args.repeats} loads each, "
            "alternating; times are medians (best in parentheses)"
        )
        table.line(
            f"{'host memory':<12} {'device_put ms':>18} {'cache ms':>18} "
            f"{'device_put GB/s':>16} {'cache GB/s':>11} {'ratio (best)':>13}"
        )
        for row in rows:
            plain, cached = trio.run(
                measure,
                runtime,
                Path(tmp) / row.replace(" ", "_"),
                row,
                nbytes,
                args.tensors,
                args.repeats,
            )
            mp, mc = statistics.median(plain), statistics.median(cached)
            ratio = statistics.median(p / c for p, c in zip(plain, cached, strict=True))
            table.line(
                f"{row:<12} {1e3 * mp:>9.2f} ({1e3 * min(plain):>6.2f}) "
                f"{1e3 * mc:>9.2f} ({1e3 * min(cached):>6.2f}) "
                f"{nbytes / mp / 1e9:>16.2f} {nbytes / mc / 1e9:>11.2f} "
                f"{ratio:>6.2f} ({min(plain) / min(cached):.2f})"
            )
        table.line("ratio = plain device_put time / cache cold-load time (goal >= 0.90)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
