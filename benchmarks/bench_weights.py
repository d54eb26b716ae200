"""On-demand weights: cold-load bandwidth, and prefetch under a Zipf workload.

(a) Cold-load bandwidth. Two models of ``BW_MIB`` MiB each (``BW_TENSORS`` tensors) under
    a budget that holds one, so every ``CachedWeights.acquire`` is a cold load: evict the
    other model, transfer from the ``system`` host copy in a worker thread, report to the
    policy, pin. It is timed against a plain ``jax.device_put`` + ``block_until_ready`` of
    the very same host arrays (``Runtime.to_device``) after freeing the copy the previous
    put made (the cache frees its victim first too, and both then start from the same
    allocator state), interleaved, ``BW_REPEATS`` each.
    The ratio is plain time / cache time (goal >= 0.9): the median over the adjacent
    (cache load, plain put) pairs, which see the same background load, and in parentheses
    the ratio of the best times (noise from other processes only ever adds time). A second row
    stages the host copies in the device's ``pinned_host`` memory space first (on by
    default on CUDA only; on the CPU it is just another host buffer).

(b) Prefetch. ``ZIPF_MODELS`` models share one exported artifact (a stack of tanh(x @ W)
    layers, ``LAYER_N`` x ``LAYER_N`` float32 weights, applied ``repeats`` times) with
    their own weights; the arena is set so the on-demand budget holds a tenth of the
    catalog. ``CLIENTS`` closed-loop clients send single-row requests to models drawn from
    Zipf(``ZIPF_S``) through the real ``Scheduler`` + ``DeviceExecutor`` + ``CachedWeights``
    (no gRPC). ``repeats`` is calibrated at start so that one execution at batch size 1
    costs about one cold load. Two devices, each with prefetch off and on (median of
    ``ZIPF_RUNS`` alternating runs): the real CPU ``Runtime``, and a *modelled copy engine*
    -- the same scheduler, executor and cache over a device whose transfers and executions
    are sleeps of the calibrated lengths, so they overlap without contending, as a GPU's
    DMA engines and SMs do (on the CPU a transfer is a memcpy on the cores XLA computes
    on). Reported: throughput and the device idle fraction,
    ``1 - sum(execution seconds) / wall seconds``.

    python benchmarks/bench_weights.py          (or: nox -s bench -- weights)

Timings are wall-clock on the CPU backend of whatever machine runs it, and noisy on a
busy one: (a) reports the best of its repeats beside the medians, (b) medians of runs.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import attrs
import numpy as np
import trio

from reactantserver.bundle import (
    load_bundle,
    read_weight_specs,
    read_weights,
    write_weights,
)
from reactantserver.config import ModelSchedConfig, RuntimeConfig
from reactantserver.runtime import Runtime
from reactantserver.runtime.host_memory import PinnedHostStaging, copying_allocate
from reactantserver.runtime.weight_cache import (
    CachedWeights,
)
from reactantserver.weights import HostStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from catalog_run import zipf_catalog_run

MiB = 1024 * 1024
BW_MIB = 64
BW_TENSORS = 8
BW_REPEATS = 25

ZIPF_MODELS = 20
ZIPF_S = 1.1
LAYER_N = 1024
LAYERS = 4
BATCH_SIZES = (1, 4, 8)
CLIENTS = 8
REQUESTS = 300
ZIPF_RUNS = 3
RATIO = 10


# ------------------------------------------------------------------- (a) bandwidth


def _unaligned(a: np.ndarray) -> np.ndarray:
    out = copying_allocate(a.shape, a.dtype)
    out[...] = a
    return out


@attrs.define(eq=False)
class _Version:
    """What the cache reads of a ``ServedModel`` (hashable by identity, like it), plus a
    pageable numpy copy of the same bytes for the baseline."""

    name: str
    generation: int
    bundle: Any
    arrays: list[np.ndarray]
    sched: ModelSchedConfig = attrs.field(factory=ModelSchedConfig)
    loaded: Any = None


def _weights_model(root: Path, name: str, generation: int, nbytes: int, tensors: int) -> Any:
    """A model version as the cache sees it: a weights file and its header specs."""
    directory = root / name
    directory.mkdir(parents=True)
    path = directory / "weights.safetensors"
    rng = np.random.default_rng(generation)
    each = nbytes // tensors // 4
    write_weights(
        path, [(f"w{i}", rng.standard_normal(each, dtype=np.float32)) for i in range(tensors)]
    )
    specs = read_weight_specs(name, path)
    return _Version(
        name=name,
        generation=generation,
        bundle=SimpleNamespace(name=name, weights_path=path, weight_specs=specs),
        arrays=read_weights(name, path, specs),
    )


async def _bandwidth(
    runtime: Runtime, root: Path, staging: PinnedHostStaging | None
) -> tuple[list[float], list[float], int]:
    """(seconds of each plain device_put, of each cache cold load, bytes per load)."""
    nbytes = BW_MIB * MiB
    store = HostStore(allocate=copying_allocate)  # what the worker uses on the CPU
    config = RuntimeConfig(weight_cache_wiggle_fraction=0.0, arena_bytes=nbytes * 3 // 2)
    cache = CachedWeights(runtime, config, arena=config.arena_bytes, staging=staging, host=store)
    models = [
        _weights_model(root, f"{tag}{i}", i + 1, nbytes, BW_TENSORS)
        for i, tag in enumerate(("a", "b"))
    ]
    for m in models:
        await cache.add(m)
    plain_copies = [[_unaligned(a) for a in m.arrays] for m in models]
    plain: list[float] = []
    cached: list[float] = []
    # The baseline keeps one copy on the device too and frees it before each put, as a
    # cold load in a full cache evicts before it transfers: both start from the same
    # allocator state (freed pages to reuse), which otherwise dominates the difference.
    resident: list[Any] = []

    async def through_cache(model: Any) -> float:
        start = time.perf_counter()
        arrays = await cache.acquire(model)
        elapsed = time.perf_counter() - start
        cache.release(model)
        # On the CPU a device_put of a 64-byte aligned array aliases it instead of
        # copying; the host copies are not aligned (``copying_allocate``): both copy.
        assert all(a.unsafe_buffer_pointer() % 64 == 0 for a in arrays)
        return elapsed

    def plain_put(source: list[np.ndarray]) -> float:
        nonlocal resident
        assert all(a.ctypes.data % 64 for a in source)
        start = time.perf_counter()
        runtime.free(resident)
        resident = runtime.to_device(source)
        return time.perf_counter() - start

    for i in range(BW_REPEATS + 1):
        model = models[i % 2]
        # The baseline: the same bytes from pageable numpy arrays, the cache's own host
        # copy when it keeps one (the staged row keeps its copy in pinned_host instead).
        host = store.get(cache.key(model))
        source = list(host.arrays) if host is not None else plain_copies[i % 2]
        # Alternate which goes first, so that neither profits from the other's traces.
        if i % 2:
            c = await through_cache(model)
            p = plain_put(source)
        else:
            p = plain_put(source)
            c = await through_cache(model)
        if i:  # the first round also pays one-time setup
            cached.append(c)
            plain.append(p)
    runtime.free(resident)
    assert cache.statistics().policy.loads == BW_REPEATS + 1
    return plain, cached, nbytes


def bandwidth_table(runtime: Runtime, root: Path) -> None:
    rows = [("system (pageable host copy)", None)]
    staging = PinnedHostStaging.for_device(runtime.device)
    if staging is not None:
        rows.append(("system (pinned_host staging)", staging))
    print(
        f"(a) cold-load bandwidth: {BW_MIB} MiB in {BW_TENSORS} tensors, "
        f"best of {BW_REPEATS} loads each (times, GB/s), backend {runtime.backend}"
    )
    print(
        f"{'host copy':<30} {'device_put ms':>13} {'cache ms':>9} {'device_put GB/s':>16} "
        f"{'cache GB/s':>11} {'ratio (best)':>13}"
    )
    for label, stage in rows:
        plain, cached, nbytes = trio.run(_bandwidth, runtime, root / label.split()[1], stage)
        best_plain, best_cached = min(plain), min(cached)
        ratio = statistics.median(p / c for p, c in zip(plain, cached, strict=True))
        print(
            f"{label:<30} {1e3 * best_plain:>13.2f} {1e3 * best_cached:>9.2f} "
            f"{nbytes / best_plain / 1e9:>16.2f} {nbytes / best_cached / 1e9:>11.2f} "
            f"{ratio:>6.2f} ({best_plain / best_cached:.2f})"
        )
    print("ratio = plain device_put time / cache cold-load time (goal >= 0.90)")
    if staging is not None and runtime.backend == "cpu":
        print(
            "(pinned_host staging is on by default on CUDA only; on the CPU it is one more "
            "host buffer, shown here to exercise the path)"
        )
    print()


# -------------------------------------------------------------------- (b) prefetch


def _catalog(runtime: Runtime, root: Path) -> tuple[list[Any], Any, int, float, dict[int, float]]:
    """Export one model, derive the catalog.

    Returns (bundles, compiled program, repeats, seconds of one cold load, seconds of one
    execution per compiled batch size).
    """
    import jax
    import jax.numpy as jnp

    from reactantserver.export import export_bundle, write_bundle

    rng = np.random.default_rng(0)
    params = {
        f"w{i}": (rng.standard_normal((LAYER_N, LAYER_N)) / math.sqrt(LAYER_N)).astype(np.float32)
        for i in range(LAYERS)
    }
    host = [_unaligned(a) for a in params.values()]  # as the cache's copies: really copied

    def timed(fn: Any, *args: Any) -> float:
        best = math.inf
        for _ in range(7):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            best = min(best, time.perf_counter() - start)
        return best

    def to_device() -> list[Any]:
        arrays = runtime.to_device(host)
        runtime.free(arrays)
        return []

    load_seconds = timed(to_device)

    def make(repeats: int) -> Any:
        def apply(p: dict[str, Any], x: Any) -> dict[str, Any]:
            def body(_: Any, h: Any) -> Any:
                for i in range(LAYERS):
                    h = jnp.tanh(h @ p[f"w{i}"])
                return h

            return {"y": jax.lax.fori_loop(0, repeats, body, x)}

        return apply

    x = np.ones((1, LAYER_N), np.float32)
    one = timed(jax.jit(make(1)), jax.device_put(params), x)
    repeats = max(1, min(256, round(load_seconds / one)))
    template = root / "m00"
    export_bundle(
        make(repeats),
        params,
        inputs=[("x", "FP32", [-1, LAYER_N])],
        outputs=["y"],
        batch_sizes=BATCH_SIZES,
        out_dir=template,
        platforms=("cpu",),
    )
    base = load_bundle(template)
    artifact = base.read_artifact()
    for i in range(1, ZIPF_MODELS):
        named = [
            (n, rng.standard_normal(a.shape).astype(np.float32) / math.sqrt(LAYER_N))
            for n, a in params.items()
        ]
        write_bundle(root / f"m{i:02d}", base.manifest, artifact, named, None, False)
    bundles = [load_bundle(root / f"m{i:02d}") for i in range(ZIPF_MODELS)]
    # Every bundle shares the artifact: compile it once, run it with each one's weights.
    compiled = runtime.load(base)
    weights = runtime.to_device(base.read_weights())
    run_seconds = {
        size: timed(compiled.execute, [np.ones((size, LAYER_N), np.float32)], weights)
        for size in BATCH_SIZES
    }
    runtime.free(weights)
    return bundles, compiled, repeats, load_seconds, run_seconds


class _Token:
    """A device array of the modelled device (no memory behind it)."""

    def is_deleted(self) -> bool:
        return False


class _ModelledDevice:
    """A device with its own copy engine: a transfer is a sleep of ``bytes / bandwidth``.

    Sleeps overlap without contending, as a GPU's DMA engines and its SMs do, which the
    CPU cannot show: there the "transfer" is a memcpy on the same cores XLA computes on.
    """

    def __init__(self, bandwidth: float) -> None:
        self._bandwidth = bandwidth

    def to_device(self, host: Sequence[np.ndarray]) -> list[Any]:
        time.sleep(sum(a.nbytes for a in host) / self._bandwidth)
        return [_Token() for _ in host]

    def free(self, arrays: Sequence[Any]) -> None:
        return None

    def memory_stats(self) -> None:
        return None


class _ModelledProgram:
    """An execution is a sleep of the measured seconds at its batch size."""

    def __init__(self, seconds: dict[int, float]) -> None:
        self._seconds = seconds

    def execute(self, inputs: Sequence[np.ndarray], weights: Sequence[Any]) -> list[np.ndarray]:
        size = inputs[0].shape[0]
        time.sleep(self._seconds[size])
        return [np.zeros((size, LAYER_N), np.float32)]

    def warmup(self, weights: Sequence[Any]) -> dict[int, float]:
        return dict(self._seconds)


async def _zipf_run(
    device: Any, bundles: Sequence[Any], program: Any, prefetch: bool, seed: int
) -> dict[str, float]:
    total = sum(b.weights_nbytes for b in bundles)
    arena = math.ceil(total / RATIO / 0.9)  # on_demand = floor(0.9 * arena), no scratch
    config = RuntimeConfig(arena_bytes=arena, weight_prefetch=prefetch)
    # The CPU's host copies, as the worker makes them (so that loads really copy).
    host = HostStore(allocate=copying_allocate)
    cache = CachedWeights(device, config, arena=arena, host=host)
    return await zipf_catalog_run(
        cache,
        bundles,
        program,
        "jax_cpu",
        batch_sizes=BATCH_SIZES,
        requests=REQUESTS,
        zipf=ZIPF_S,
        clients=CLIENTS,
        width=LAYER_N,
        seed=seed,
    )


def prefetch_table(runtime: Runtime, root: Path) -> None:
    bundles, compiled, repeats, load_s, run_s = _catalog(runtime, root)
    size = bundles[0].weights_nbytes
    print(
        f"(b) Zipf(s={ZIPF_S}) over {ZIPF_MODELS} models of {size / MiB:.1f} MiB, budget "
        f"1/{RATIO} of the catalog, {CLIENTS} closed-loop clients, {REQUESTS} single-row "
        f"requests, median of {ZIPF_RUNS} runs"
    )
    print(
        f"    calibration: cold load {1e3 * load_s:.2f} ms, one execution "
        + ", ".join(f"at batch {b} {1e3 * t:.2f} ms" for b, t in run_s.items())
        + f" ({repeats} repeats of {LAYERS} layers)"
    )
    setups = {
        "cpu": (runtime, compiled),
        "model": (_ModelledDevice(size / load_s), _ModelledProgram(run_s)),
    }
    runs: dict[tuple[str, bool], list[dict[str, float]]] = {}
    for i in range(ZIPF_RUNS):
        for setup, (device, program) in setups.items():
            for prefetch in (False, True):
                result = trio.run(_zipf_run, device, bundles, program, prefetch, i)
                runs.setdefault((setup, prefetch), []).append(result)

    def med(setup: str, prefetch: bool, key: str) -> float:
        return statistics.median(r[key] for r in runs[setup, prefetch])

    print(f"{'':<26} {'real CPU device':>27}   {'modelled copy engine':>27}")
    print(
        f"{'':<26} {'prefetch off':>13} {'prefetch on':>13}   {'prefetch off':>13} {'prefetch on':>13}"
    )
    for label, key, fmt in (
        ("throughput (requests/s)", "throughput", "{:>13.1f}"),
        ("device idle fraction", "idle", "{:>13.3f}"),
        ("dispatches", "dispatches", "{:>13.0f}"),
        ("weight loads", "loads", "{:>13.0f}"),
        ("demand loads (misses)", "misses", "{:>13.0f}"),
        ("prefetches", "prefetches", "{:>13.0f}"),
        ("prefetch hits", "prefetch_hits", "{:>13.0f}"),
        ("prefetches wasted", "prefetch_wasted", "{:>13.0f}"),
        ("mean load (ms)", "load_ms", "{:>13.2f}"),
    ):
        cells = [fmt.format(med(setup, on, key)) for setup in setups for on in (False, True)]
        print(f"{label:<26} {cells[0]} {cells[1]}   {cells[2]} {cells[3]}")
    for setup, title in (("cpu", "real CPU device"), ("model", "modelled copy engine")):
        print(
            f"{title}: throughput on/off "
            f"{med(setup, True, 'throughput') / med(setup, False, 'throughput'):.2f}x, "
            f"idle fraction {med(setup, False, 'idle'):.3f} -> {med(setup, True, 'idle'):.3f}"
        )


def main() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    runtime = Runtime.start(RuntimeConfig(backend="cpu"), "")
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as tmp:
        bandwidth_table(runtime, Path(tmp) / "bw")
        prefetch_table(runtime, Path(tmp) / "zipf")


if __name__ == "__main__":
    main()
