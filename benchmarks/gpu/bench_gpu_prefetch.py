"""GPU benchmark (b): prefetch on and off on a Zipf catalog ten times the weight budget.

``--models`` models share one exported artifact (``--layers`` layers of
``tanh(x @ W)``, ``W`` ``--width`` x ``--width`` float32, applied ``repeats`` times in a
loop) with weights of their own; the on-demand budget holds a tenth of the catalog.
``--clients`` closed-loop clients send single-row requests to models drawn from
Zipf(``--zipf``) through the real ``Scheduler`` + ``DeviceExecutor`` + ``CachedWeights``
on the real device (no gRPC: the transport is not what is measured). ``repeats`` is
calibrated at start so that one execution at batch size 1 costs about one cold load,
the regime where hiding loads behind executions matters most. Host copies are staged in
pinned host memory where the device has it (the worker's default on CUDA).

Prefetch off and on alternate, ``--runs`` times each; the table shows medians:
throughput, the device idle fraction (``1 - execution seconds / wall seconds``), loads,
demand loads (misses), prefetch hits and waste. Goal: the idle fraction halved.

    python benchmarks/gpu/bench_gpu_prefetch.py                   # on the GPU
    python benchmarks/gpu/bench_gpu_prefetch.py --backend cpu --quick   # smoke test

About 60 s on an H100 with the defaults (20 models of 128 MiB, 400 requests, 3 runs).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import trio
from harness import Table, device_header, start_runtime

from reactantserver.bundle import load_bundle
from reactantserver.config import RuntimeConfig
from reactantserver.runtime.host_memory import PinnedHostStaging, copying_allocate
from reactantserver.runtime.weight_cache import CachedWeights
from reactantserver.weights import HostStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from catalog_run import zipf_catalog_run

MiB = 2**20
BATCH_SIZES = (1, 4, 8)
RATIO = 10


def best_seconds(fn: Any, *args: Any, tries: int = 7) -> float:
    import jax

    best = math.inf
    for _ in range(tries):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def build_catalog(
    runtime: Any, root: Path, args: argparse.Namespace
) -> tuple[list[Any], Any, int, float]:
    """Export one model, derive the others (same artifact, own weights), compile once.

    Returns (bundles, compiled program, repeats, seconds of one cold load).
    """
    import jax
    import jax.numpy as jnp

    from reactantserver.export import export_bundle, write_bundle

    n = args.width
    rng = np.random.default_rng(0)
    params = {
        f"w{i}": (rng.standard_normal((n, n)) / math.sqrt(n)).astype(np.float32)
        for i in range(args.layers)
    }
    # A cold load as the cache does it on this backend: from pinned host memory on CUDA,
    # from (unaligned, so really copied) pageable memory on the CPU.
    staging = PinnedHostStaging.for_device(runtime.device) if runtime.backend == "cuda" else None
    if staging is not None:
        staged = staging.stage(list(params.values()))

        def load() -> list[Any]:
            runtime.free(staging.to_device(staged))
            return []

    else:
        host = [_unaligned(a) for a in params.values()]

        def load() -> list[Any]:
            runtime.free(runtime.to_device(host))
            return []

    load_seconds = best_seconds(load)

    def make(repeats: int) -> Any:
        def apply(p: dict[str, Any], x: Any) -> dict[str, Any]:
            def body(_: Any, h: Any) -> Any:
                for i in range(args.layers):
                    h = jnp.tanh(h @ p[f"w{i}"])
                return h

            return {"y": jax.lax.fori_loop(0, repeats, body, x)}

        return apply

    device_params = jax.device_put(params, runtime.device)
    x = np.ones((1, n), np.float32)
    one = best_seconds(jax.jit(make(1)), device_params, x)
    repeats = max(1, min(4096, round(load_seconds / one)))
    template = root / "m00"
    export_bundle(
        make(repeats),
        params,
        inputs=[("x", "FP32", [-1, n])],
        outputs=["y"],
        batch_sizes=BATCH_SIZES,
        out_dir=template,
        platforms=(runtime.backend,),
        rtol=1e-3,
        atol=1e-4,
    )
    base = load_bundle(template)
    artifact = base.read_artifact()
    for i in range(1, args.models):
        named = [
            (name, (rng.standard_normal(a.shape) / math.sqrt(n)).astype(np.float32))
            for name, a in params.items()
        ]
        write_bundle(root / f"m{i:02d}", base.manifest, artifact, named, None, False)
    bundles = [load_bundle(root / f"m{i:02d}") for i in range(args.models)]
    compiled = runtime.load(base)  # every bundle shares the artifact: compile it once
    return bundles, compiled, repeats, load_seconds


def _unaligned(a: np.ndarray) -> np.ndarray:
    out = copying_allocate(a.shape, a.dtype)
    out[...] = a
    return out


async def zipf_run(
    runtime: Any,
    bundles: Sequence[Any],
    program: Any,
    prefetch: bool,
    seed: int,
    args: argparse.Namespace,
) -> dict[str, float]:
    total = sum(b.weights_nbytes for b in bundles)
    arena = math.ceil(total / RATIO / 0.9)  # on_demand = floor(0.9 * arena): a tenth
    config = RuntimeConfig(arena_bytes=arena, weight_prefetch=prefetch)
    cuda = runtime.backend == "cuda"
    cache = CachedWeights(
        runtime,
        config,
        arena=arena,
        staging=PinnedHostStaging.for_device(runtime.device) if cuda else None,
        host=HostStore() if cuda else HostStore(allocate=copying_allocate),
        memory=lambda: None,  # the budget is the benchmark's: no probe
    )
    return await zipf_catalog_run(
        cache,
        bundles,
        program,
        f"jax_{runtime.backend}",
        batch_sizes=BATCH_SIZES,
        requests=args.requests,
        zipf=args.zipf,
        clients=args.clients,
        width=args.width,
        seed=seed,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--width", type=int, default=4096, help="layer width (W is width^2)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny models, one run (smoke test)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default $OUT)")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.width, args.requests, args.runs = 20, 256, 80, 1
    runtime = start_runtime(args.backend)
    with Table("bench_gpu_prefetch", out=args.out) as table, tempfile.TemporaryDirectory() as tmp:
        bundles, program, repeats, load_s = build_catalog(runtime, Path(tmp), args)
        size = bundles[0].weights_nbytes
        table.line(
            "(b) prefetch off vs on: Zipf catalog 10x the weight budget, real scheduler, executor and cache"
        )
        table.line(device_header(runtime))
        table.line(
            f"Zipf(s={args.zipf}) over {args.models} models of {size / MiB:.1f} MiB, budget 1/{RATIO} "
            f"of the catalog, {args.clients} closed-loop clients, {args.requests} single-row "
            f"requests, median of {args.runs} runs"
        )
        table.line(
            f"calibration: cold load {1e3 * load_s:.2f} ms; one execution at batch 1 runs "
            f"{repeats} x {args.layers} layers (about one cold load)"
        )
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for i in range(args.runs):
            for prefetch in (False, True):
                runs[prefetch].append(
                    trio.run(zipf_run, runtime, bundles, program, prefetch, i, args)
                )

        def med(prefetch: bool, key: str) -> float:
            return statistics.median(r[key] for r in runs[prefetch])

        table.line(f"{'':<26} {'prefetch off':>13} {'prefetch on':>13}")
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
            table.line(f"{label:<26} {fmt.format(med(False, key))} {fmt.format(med(True, key))}")
        table.line(
            f"throughput on/off {med(True, 'throughput') / med(False, 'throughput'):.2f}x; idle "
            f"fraction {med(False, 'idle'):.3f} -> {med(True, 'idle'):.3f} (goal: halved)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
