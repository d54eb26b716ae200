"""GPU benchmark (d): the single-model batch curve, batch 1 -> 64, for resnet and mlp_wide.

``resnet`` is the zoo's residual CNN (32x32 RGB, width ``--resnet-width``, 8 as served by
the example repository) and ``mlp_wide`` the zoo's MLP at width 4096 (``32 -> 4096 ->
4096 -> 10``: a 64 MiB middle layer, ``benchmarks/peer/bundles.py``). Each is exported
with compiled batch sizes 1, 2, 4, 8, 16, 32 and 64 and loaded by the worker's runtime
(``Runtime.load``); its weights go to the device once. Every size then runs
``--repeats`` times (after three warm-up runs) through ``LoadedModel.execute`` -- what
the dispatch loop runs per batch: inputs from host memory, the program, outputs back to
host memory -- on fresh random inputs. Reported per size: p50 and p99 of one execution,
rows per second at the p50 (``size / p50``), the speed-up over batch 1, and joules per
row where the device's energy counter can be read (NVML on the GPU, RAPL on a CPU that
exposes it; ``-`` otherwise): the counter's advance over at least ``--energy-seconds`` of
back-to-back executions at that size, divided by the rows they answered (the whole
device's energy while busy with this model, transfers included).

No gRPC and no scheduler here: this is the device's side of batching, the ceiling the
scheduler's coalescing can reach.

    python benchmarks/gpu/bench_gpu_batch.py                    # on the GPU
    python benchmarks/gpu/bench_gpu_batch.py --backend cpu --quick   # smoke test

About 40 s on an H100 (mostly exporting and compiling 2 x 7 programs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness import ROOT, Table, device_header, start_runtime

sys.path.insert(0, str(ROOT / "examples"))
SIZES = (1, 2, 4, 8, 16, 32, 64)
MLP_WIDE_WIDTH = 4096


def export_models(
    out: Path, sizes: tuple[int, ...], resnet_width: int, mlp_width: int
) -> dict[str, Path]:
    from zoo import mlp, resnet

    from reactantserver.export import export_spec

    specs = {
        "resnet": resnet.export_spec(width=resnet_width, batch_sizes=sizes),
        "mlp_wide": mlp.export_spec(width=mlp_width, batch_sizes=sizes),
    }
    paths = {}
    for name, spec in specs.items():
        export_spec(spec, out / name)
        paths[name] = out / name
    return paths


def energy_reader(backend: str) -> Any:
    """The device's energy counter (``reactantserver.energy``), or None with the reason
    printed: the J/row column then says ``-``."""
    import os

    from reactantserver.energy import open_reader
    from reactantserver.worker.core import gpu_label

    reader = open_reader(backend, gpu_label(None, os.environ), env=os.environ)
    if isinstance(reader, str):
        print(f"energy: not measured ({reader})", file=sys.stderr)
        return None
    return reader


def joules_per_row(
    execute: Any, draws: list[Any], size: int, reader: Any, seconds: float
) -> float | None:
    """Energy counter advance over >= ``seconds`` of back-to-back executions / rows."""
    if reader is None or seconds <= 0:
        return None
    first = reader.read()
    runs, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        execute(draws[runs % len(draws)])
        runs += 1
    last = reader.read()
    if first is None or last is None or last.joules < first.joules:
        return None
    return (last.joules - first.joules) / (runs * size)


def curve(
    runtime: Any, path: Path, repeats: int, reader: Any = None, energy_seconds: float = 0.0
) -> list[tuple[int, float, float, float | None]]:
    """(size, p50 seconds, p99 seconds, joules per row or None) per compiled size."""
    from reactantserver.bundle import load_bundle

    bundle = load_bundle(path)
    program = runtime.load(bundle)
    weights = runtime.to_device(bundle.read_weights())
    rng = np.random.default_rng(0)
    rows = []
    try:
        for size in program.sizes:
            draws = [
                [
                    rng.standard_normal(shape).astype(spec.numpy_dtype)
                    for spec, shape in zip(bundle.inputs, program.input_shapes(size), strict=True)
                ]
                for _ in range(4)
            ]
            for i in range(3):
                program.execute(draws[i % 4], weights)
            times = []
            for i in range(repeats):
                start = time.perf_counter()
                program.execute(draws[i % 4], weights)
                times.append(time.perf_counter() - start)
            times.sort()
            joules = joules_per_row(
                lambda d: program.execute(d, weights), draws, size, reader, energy_seconds
            )
            rows.append(
                (
                    size,
                    statistics.median(times),
                    times[min(len(times) - 1, int(0.99 * len(times)))],
                    joules,
                )
            )
    finally:
        runtime.free(weights)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--resnet-width", type=int, default=8)
    parser.add_argument(
        "--quick", action="store_true", help="sizes 1, 2, 4; narrow MLP (smoke test)"
    )
    parser.add_argument("--out", type=Path, default=None, help="results folder (default $OUT)")
    parser.add_argument(
        "--energy-seconds",
        type=float,
        default=1.0,
        help="seconds of back-to-back runs per size for J/row (0: skip)",
    )
    args = parser.parse_args(argv)
    sizes, mlp_width = SIZES, MLP_WIDE_WIDTH
    if args.quick:
        sizes, mlp_width, args.repeats, args.energy_seconds = (1, 2, 4), 256, 5, 0.2
    runtime = start_runtime(args.backend)
    reader = energy_reader(args.backend)
    with Table("bench_gpu_batch", out=args.out) as table, tempfile.TemporaryDirectory() as tmp:
        paths = export_models(Path(tmp), sizes, args.resnet_width, mlp_width)
        table.line(
            "(d) single-model batch curve: LoadedModel.execute (inputs in, program, outputs out)"
        )
        table.line(device_header(runtime))
        table.line(
            f"resnet: the zoo's CNN at width {args.resnet_width} (32x32x3 images); mlp_wide: the "
            f"zoo's MLP at width {mlp_width}; {args.repeats} runs per size after 3 warm-ups"
        )
        table.line(
            f"{'model':<10} {'batch':>5} {'p50 ms':>8} {'p99 ms':>8} {'rows/s':>10} {'vs batch 1':>10}"
            f" {'J/row':>9}"
        )
        for name, path in paths.items():
            rows = curve(runtime, path, args.repeats, reader, args.energy_seconds)
            base = rows[0][0] / rows[0][1]
            for size, p50, p99, joules in rows:
                rate = size / p50
                table.line(
                    f"{name:<10} {size:>5} {1e3 * p50:>8.3f} {1e3 * p99:>8.3f} {rate:>10.0f} {rate / base:>9.1f}x"
                    f" {'-' if joules is None else format(joules, '.5f'):>9}"
                )
        source = f"{reader.source}: {reader.description}" if reader else "not measured"
        table.line(
            f"J/row: device energy over >= {args.energy_seconds:g} s of back-to-back runs per "
            f"size / rows answered ({source})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
