"""The on-demand load path on the CPU backend: this tree against a baseline, in one run.

What issue 40 measures in every session, GPU or not, on the catalog of
``gpu/bench_gpu_catalog.py`` (``examples/build_repo.py``'s seeded variants of the zoo's
MLP and ResNet, about 51 KB of weights a model, half with 6 tensors and half with 14),
with the weight budget a tenth of the catalog's bytes:

(a) **Host time per load.** In-process: ``CachedWeights`` over the real CPU ``Runtime``
    (the worker's host copies, ``copying_allocate``), a closed loop of ``acquire`` ->
    ``release`` over models drawn uniformly from the catalog, so that nine acquires in ten
    are cold loads. Reported: microseconds per load as the cache times it (the policy's
    ``load_seconds / loads``: the event loop's time for a load queued on the device, a
    worker thread's for one waited for there -- what ``worker_weight_load_seconds_total``
    counts) and acquires per second, the loop's capacity. Each tree runs in a process of
    its own (its ``src`` first on the path), the two alternating, ``--runs`` times each;
    medians. Goal: at most 0.1 ms per load.
(b) **The served catalog.** ``gpu/bench_gpu_catalog.py --backend cpu --baseline``: one
    worker per tree over gRPC, open-loop single-row requests uniform over the catalog, the
    trees' windows alternating: loads/s, ms per load, answered/s and p99 side by side.

The baseline is ``--baseline REF`` (a git ref, archived into ``.baseline/``, or a
directory holding a tree's ``src/``), by default the merge base of this tree with
``main``.

    python benchmarks/bench_catalog.py                 # (or: nox -s bench -- catalog)
    python benchmarks/bench_catalog.py --models 1000 --rates 1000 --seconds 8
    python benchmarks/bench_catalog.py --baseline 07de721 --runs 5

About three minutes with the defaults on a 2-core machine (two workers start on 300
models; building the catalog the first time adds half a minute).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GPU = HERE / "gpu"


def child(repo: Path, models: int, acquires: int) -> dict[str, float]:
    """(a) in this process, with whichever ``reactantserver`` the path gives: the cache's
    per-load seconds and acquires per second over ``acquires`` uniform draws. Uses only
    what every tree since issue 20 has (``CachedWeights`` and ``HostStore``)."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    import attrs
    import trio

    from reactantserver.bundle import load_bundle
    from reactantserver.config import ModelSchedConfig, RuntimeConfig
    from reactantserver.runtime import Runtime
    from reactantserver.runtime.host_memory import copying_allocate
    from reactantserver.runtime.weight_cache import CachedWeights
    from reactantserver.weights import HostStore

    @attrs.define(eq=False)
    class Version:
        """What the cache reads of a ``ServedModel`` (hashable by identity, like it)."""

        name: str
        generation: int
        bundle: Any
        sched: ModelSchedConfig = attrs.field(factory=ModelSchedConfig)
        loaded: Any = None

    runtime = Runtime.start(RuntimeConfig(backend="cpu"), "")
    names = sorted(p.name for p in repo.iterdir() if (p / "manifest.yaml").is_file())[:models]
    versions = [Version(n, 1, load_bundle(repo / n)) for n in names]
    total = sum(v.bundle.weights_nbytes for v in versions)

    async def main() -> dict[str, float]:
        arena = math.ceil(total / 10 / 0.9)  # on_demand = floor(0.9 * arena): a tenth
        cache = CachedWeights(
            runtime,
            RuntimeConfig(arena_bytes=arena, weight_prefetch=False),
            arena=arena,
            host=HostStore(allocate=copying_allocate),
            memory=lambda: None,
        )
        for v in versions:
            await cache.add(v)
        draws = random.Random(0).choices(versions, k=acquires)
        for v in draws[:200]:  # first calls and a full cache, unmeasured
            await cache.acquire(v)
            cache.release(v)
        before = cache.statistics().policy
        cold: list[float] = []
        clock = time.perf_counter
        start = clock()
        for v in draws:
            resident = cache.is_resident(v)
            t0 = clock()
            await cache.acquire(v)
            if not resident:
                cold.append(clock() - t0)
            cache.release(v)
        wall = clock() - start
        after = cache.statistics().policy
        loads = after.loads - before.loads
        return {
            "us_per_load": 1e6 * (after.load_seconds - before.load_seconds) / loads,
            "us_cold_p50": 1e6 * statistics.median(cold),
            "acquires_per_s": acquires / wall,
            "loads_per_s": loads / wall,
            "miss_ratio": loads / acquires,
        }

    result: dict[str, float] = trio.run(main)
    return result


def run_child(src: Path, repo: Path, models: int, acquires: int) -> dict[str, float]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, str(Path(__file__)), "--child", str(repo), str(models), str(acquires)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def merge_base() -> str:
    for ref in ("main", "origin/main"):
        out = subprocess.run(
            ["git", "-C", str(ROOT), "merge-base", "HEAD", ref], capture_output=True, text=True
        )
        if out.returncode == 0:
            return out.stdout.strip()
    return "HEAD"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(child(Path(argv[1]), int(argv[2]), int(argv[3]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=300, help="catalog size")
    parser.add_argument("--rates", default="400", help="(b): offered requests/s")
    parser.add_argument("--seconds", type=float, default=5.0, help="(b): window per row")
    parser.add_argument("--warmup", type=float, default=1.0, help="(b): unmeasured lead-in")
    parser.add_argument("--runs", type=int, default=3, help="(a): runs per tree")
    parser.add_argument("--acquires", type=int, default=3000, help="(a): acquires per run")
    parser.add_argument("--baseline", default=None, help="git ref or tree (default: merge base)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the catalog here")
    parser.add_argument("--skip-served", action="store_true", help="(a) only")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(GPU))
    import bench_gpu_catalog as catalog

    ref = args.baseline or merge_base()
    base = catalog.baseline_tree(ref)
    with tempfile.TemporaryDirectory(prefix="bench-catalog-") as tmp:
        work = args.workdir or Path(tmp)
        repo = work / "repo"
        names = catalog.catalog_names(args.models)
        built = catalog.build(repo, names)
        print(f"catalog: {len(names)} models built in {built:.0f} s (kept ones reused)")
        trees = {f"base {base.name}": base / "src", "this tree": ROOT / "src"}
        results: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
        for run in range(args.runs):
            order = list(trees) if run % 2 == 0 else list(trees)[::-1]
            for label in order:
                results[label].append(run_child(trees[label], repo, args.models, args.acquires))
        print(
            f"(a) host time per load, in-process: CachedWeights on the CPU Runtime, {args.models} "
            f"models, budget a tenth, {args.acquires} uniform acquires per run, median of "
            f"{args.runs} alternating runs; load average {os.getloadavg()[0]:.1f}"
        )
        print(
            f"{'tree':<18} {'us/load':>8} {'cold p50 us':>12} {'loads/s':>9} {'acquires/s':>11} "
            f"{'miss ratio':>11}"
        )
        med: dict[str, dict[str, float]] = {}
        for label, runs in results.items():
            med[label] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            m = med[label]
            print(
                f"{label:<18} {m['us_per_load']:>8.1f} {m['us_cold_p50']:>12.1f} "
                f"{m['loads_per_s']:>9.0f} {m['acquires_per_s']:>11.0f} {m['miss_ratio']:>11.2f}"
            )
        b, t = med[f"base {base.name}"], med["this tree"]
        print(
            f"this tree: {t['us_cold_p50']:.1f} us per cold acquire at the median, "
            f"{t['us_per_load']:.1f} us per load on average (base {b['us_cold_p50']:.1f} and "
            f"{b['us_per_load']:.1f}; goal <= 100 at the median: "
            f"{'met' if t['us_cold_p50'] <= 100 else 'not met'}); loads/s "
            f"{t['loads_per_s'] / b['loads_per_s']:.2f}x the base's"
        )
        print(
            "us/load = the cache's seconds in loads / loads (the loop's, or a worker "
            "thread's); cold p50 = the median wall time of an acquire that loaded"
        )
        if args.skip_served:
            return 0
        print()
        served = [
            sys.executable,
            str(GPU / "bench_gpu_catalog.py"),
            *("--backend", "cpu", "--catalogs", str(args.models), "--rates", args.rates),
            *("--seconds", str(args.seconds), "--warmup", str(args.warmup)),
            *("--baseline", str(base), "--workdir", str(work), "--out", str(work / "out")),
        ]
        return subprocess.call(served)


if __name__ == "__main__":
    sys.exit(main())
