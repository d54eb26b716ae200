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

Three configurations alternate, ``--runs`` times each: prefetch off at pipeline depth 1
(each batch's weights load, then it runs, then its outputs come back, and only then does
the next start), prefetch on at depth 1 (a load of the likely next model overlaps the
running batch: issue 20's design), and prefetch on at depth ``--depth`` (default 2: the
next batch is prepared -- its weights acquired, loading if they must -- and launched
while the current one runs; issue 33). The table shows medians: throughput, the device
idle fraction (``1 - device seconds charged to batches / wall seconds``), the bound the
copy engine sets on it (``1 - device seconds / max(device seconds, loads x mean load)``:
loads run one at a time), loads, demand loads (misses), prefetch hits and waste.

The execution/load ratio. ``repeats = load / one`` makes an execution *about* a cold
load only by the host's clock: ``one`` includes the dispatch and the input transfer. The
table therefore prints the ratio as measured: one execution at batch 1
(``LoadedModel.execute``, weights resident) over the cold load, and the device seconds
charged per dispatch in the prefetch-off runs over their mean load -- the figure
``--simulate --exec-load-ratio`` takes.

Goal (issue 40), one the dispatch loop controls: with prefetch and the pipeline the
device idles at most ``pipeline_sim.PREFETCH_GOAL`` (0.05) more than its copy engine's
bound -- the loop keeps the copy engine busy while batches execute. (Issue 33's "idle
halved" cannot be met where loads take longer than executions, whatever the loop does:
the H200's ratio was 0.44.)

``--simulate`` runs the same three on ``pipeline_sim.FakeGpu`` instead, on a virtual
clock: an honest asynchronous fake device with a copy engine for loads, input and output
transfers and host work of its own, calibrated from a measured ratio (``--exec-load-ratio``,
default the H200's 0.44 of 2026-11-27, commit a02cdcc; cold load ``--load-ms``, default its
3.53 ms; ``pipeline_sim.py``'s header). It needs no device and shows what the dispatch
loop does with the time; the GPU run shows what the device does.

    python benchmarks/gpu/bench_gpu_prefetch.py                   # on the GPU
    python benchmarks/gpu/bench_gpu_prefetch.py --simulate        # the fake device, any machine
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
from pipeline_sim import EXEC_LOAD_RATIO, LOAD_SECONDS, PREFETCH_GOAL

from reactantserver.bundle import load_bundle
from reactantserver.config import RuntimeConfig
from reactantserver.runtime.host_memory import PinnedHostStaging, copying_allocate
from reactantserver.runtime.weight_cache import CachedWeights
from reactantserver.weights import HostStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from catalog_run import zipf_catalog_run

MiB = 2**20
#: (label, prefetch, pipeline depth or None for ``--depth``), in table order.
CONFIGS: tuple[tuple[str, bool, int | None], ...] = (
    ("prefetch off, d1", False, 1),
    ("prefetch on, d1", True, 1),
    ("prefetch on, pipeline", True, None),
)
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
) -> tuple[list[Any], Any, int, float, float]:
    """Export one model, derive the others (same artifact, own weights), compile once.

    Returns (bundles, compiled program, repeats, seconds of one cold load, seconds of one
    execution at batch 1).
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
    # What one execution at batch 1 costs on the device, weights resident: the other half
    # of the execution/load ratio.
    resident = jax.device_put(list(params.values()), runtime.device)
    rows = compiled.zeros(1)
    execution = best_seconds(lambda: compiled.execute(rows, resident))
    runtime.free(resident)
    return bundles, compiled, repeats, load_seconds, execution


def _unaligned(a: np.ndarray) -> np.ndarray:
    out = copying_allocate(a.shape, a.dtype)
    out[...] = a
    return out


async def zipf_run(
    runtime: Any,
    bundles: Sequence[Any],
    program: Any,
    prefetch: bool,
    depth: int,
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
        pipeline_depth=depth,
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
    parser.add_argument("--depth", type=int, default=2, help="pipeline depth of the last column")
    parser.add_argument("--quick", action="store_true", help="tiny models, one run (smoke test)")
    parser.add_argument(
        "--simulate", action="store_true", help="the fake device on a virtual clock (no JAX)"
    )
    parser.add_argument(
        "--exec-load-ratio",
        type=float,
        default=EXEC_LOAD_RATIO,
        help="--simulate: an execution's device time / a cold load's (default: the H200's)",
    )
    parser.add_argument(
        "--load-ms", type=float, default=1e3 * LOAD_SECONDS, help="--simulate: a cold load"
    )
    parser.add_argument("--out", type=Path, default=None, help="results folder (default $OUT)")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.width, args.requests, args.runs = 20, 256, 80, 1
    if args.simulate:
        return simulate(args)
    runtime = start_runtime(args.backend)
    with Table("bench_gpu_prefetch", out=args.out) as table, tempfile.TemporaryDirectory() as tmp:
        bundles, program, repeats, load_s, exec_s = build_catalog(runtime, Path(tmp), args)
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
            f"{repeats} x {args.layers} layers ({repeats} = load / one call of one repeat); "
            f"measured, one execution {1e3 * exec_s:.2f} ms: execution/load "
            f"{exec_s / load_s:.2f}"
        )
        runs: list[list[dict[str, float]]] = [[] for _ in CONFIGS]
        for i in range(args.runs):
            for k, (_, prefetch, depth) in enumerate(CONFIGS):
                runs[k].append(
                    trio.run(
                        zipf_run, runtime, bundles, program, prefetch, depth or args.depth, i, args
                    )
                )
        write_table(table, runs, args)
    return 0


ROWS = (
    ("throughput (requests/s)", "throughput", "{:>22.1f}"),
    ("device idle fraction", "idle", "{:>22.3f}"),
    ("copy-engine bound", "bound", "{:>22.3f}"),
    ("dispatches", "dispatches", "{:>22.0f}"),
    ("weight loads", "loads", "{:>22.0f}"),
    ("demand loads (misses)", "misses", "{:>22.0f}"),
    ("prefetches", "prefetches", "{:>22.0f}"),
    ("prefetch hits", "prefetch_hits", "{:>22.0f}"),
    ("prefetches wasted", "prefetch_wasted", "{:>22.0f}"),
    ("mean load (ms)", "load_ms", "{:>22.2f}"),
)


def write_table(table: Any, runs: list[list[dict[str, float]]], args: argparse.Namespace) -> None:
    """The medians of each configuration side by side, and the goal's line."""

    def med(k: int, key: str) -> float:
        return statistics.median(r[key] for r in runs[k])

    labels = [label.replace("pipeline", f"d{args.depth}") for label, _, _ in CONFIGS]
    table.line(f"{'':<24}" + "".join(f"{label:>22}" for label in labels))
    for label, key, fmt in ROWS:
        if all(key in r for rs in runs for r in rs):
            table.line(f"{label:<24}" + "".join(fmt.format(med(k, key)) for k in range(len(runs))))
    last = len(runs) - 1
    gap = med(last, "idle") - med(last, "bound")
    table.line(
        f"throughput {labels[last]} / {labels[0]}: "
        f"{med(last, 'throughput') / med(0, 'throughput'):.2f}x; idle fraction "
        f"{med(0, 'idle'):.3f} -> {med(1, 'idle'):.3f} (prefetch, d1) -> "
        f"{med(last, 'idle'):.3f} ({labels[last]})"
    )
    if all("exec_ms" in r for r in runs[0]):
        table.line(
            f"measured in the prefetch-off runs: {med(0, 'exec_ms'):.2f} ms of device time "
            f"per dispatch / {med(0, 'load_ms'):.2f} ms per load: execution/load "
            f"{med(0, 'exec_ms') / med(0, 'load_ms'):.2f} (--simulate --exec-load-ratio)"
        )
    table.line(
        f"goal (issue 40): {labels[last]} idles at most {PREFETCH_GOAL:g} more than its "
        f"copy-engine bound: {gap:+.3f} ({'met' if gap <= PREFETCH_GOAL else 'not met'})"
    )


def simulate(args: argparse.Namespace) -> int:
    """The three configurations on the fake device (``pipeline_sim``), virtual time."""
    from pipeline_sim import run_simulation

    t_load = args.load_ms / 1e3
    t_exec = args.exec_load_ratio * t_load

    capacity = max(1, args.models // RATIO)
    with Table("bench_gpu_prefetch_sim", out=args.out) as table:
        table.line(
            "(b) prefetch off vs on, simulated: pipeline_sim.FakeGpu on a virtual clock, the "
            "real Scheduler"
        )
        table.line(
            f"Zipf(s={args.zipf}) over {args.models} models, {capacity} resident at most "
            f"(1/{RATIO}), {args.clients} closed-loop clients, {args.requests} single-row "
            f"requests, median of {args.runs} runs; cold load {args.load_ms:g} ms (one copy "
            f"engine), execution {args.exec_load_ratio:g} of it ({1e3 * t_exec:.2f} ms), input "
            "0.1 ms, output 0.1 ms, host work 0.2 ms per batch"
        )
        runs: list[list[dict[str, float]]] = [[] for _ in CONFIGS]
        for i in range(args.runs):
            for k, (_, prefetch, depth) in enumerate(CONFIGS):
                runs[k].append(
                    run_simulation(
                        depth=depth or args.depth,
                        prefetch=prefetch,
                        models=args.models,
                        capacity=capacity,
                        requests=args.requests,
                        clients=args.clients,
                        zipf=args.zipf,
                        seed=i,
                        t_exec=t_exec,
                        t_load=t_load,
                    )
                )
        write_table(table, runs, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
