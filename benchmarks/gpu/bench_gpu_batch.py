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

Then, in the same run and on the same compiled program (each model at batch 1, the
same inputs and device weights), one execution's round trip -- numpy in, numpy out --
five ways, interleaved in ``--rounds`` rounds so that drift hits all alike:

* ``ours``: ``LoadedModel.execute`` (the runtime's transfer path: outputs compiled into
  pinned host memory on CUDA, ``runtime/model.py``'s ``output_path``);
* ``ours, 2 in flight``: ``LoadedModel.launch`` of execution i+1 before ``fetch`` of
  execution i, per execution over a stream of them -- what the pipelined dispatch loop
  (``scheduler.pipeline_depth: 2``) pays per batch;
* ``plain jax.jit``: ``jax.jit(exported.call)`` on the numpy input, ``np.asarray`` out;
* ``pinned-host output``: the same with ``out_shardings=SingleDeviceSharding(device,
  memory_kind="pinned_host")`` (where the device offers that memory), numpy handed
  straight to it; ``pinned, inputs put``: the same program with the inputs put on the
  device first, in one ``jax.device_put`` of the list (the runtime's way before issue
  40: which way the inputs go, measured side by side);
* ``ours, pinned path`` (where the runtime's own path is another, e.g. on the CPU):
  ``LoadedModel.execute`` on CUDA's path, outputs compiled into pinned host memory;
* ``torch`` (mlp_wide, when torch imports with a GPU): the same MLP with the same weights,
  ``x.cuda()`` in, ``.cpu()`` out.

Each is printed with its ratio to the plain and the pinned-host round trips. Goal
(issue 33): ``ours`` at batch 1 within 1.3x of the pinned-host round trip.

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

from reactantserver.bundle import load_bundle
from reactantserver.runtime.artifact import deserialize_artifact

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


def random_inputs(rng: Any, bundle: Any, program: Any, size: int) -> list[list[np.ndarray]]:
    """Four draws of random inputs for ``program`` at batch ``size``."""
    return [
        [
            rng.standard_normal(shape).astype(spec.numpy_dtype)
            for spec, shape in zip(bundle.inputs, program.input_shapes(size), strict=True)
        ]
        for _ in range(4)
    ]


def p50_p99(samples: list[float]) -> tuple[float, float]:
    """The median and the 99th percentile (rank ``int(0.99 n)``) of ``samples``."""
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def curve(
    runtime: Any, path: Path, repeats: int, reader: Any = None, energy_seconds: float = 0.0
) -> list[tuple[int, float, float, float | None]]:
    """(size, p50 seconds, p99 seconds, joules per row or None) per compiled size."""
    bundle = load_bundle(path)
    program = runtime.load(bundle)
    weights = runtime.to_device(bundle.read_weights())
    rng = np.random.default_rng(0)
    rows = []
    try:
        for size in program.sizes:
            draws = random_inputs(rng, bundle, program, size)
            for i in range(3):
                program.execute(draws[i % 4], weights)
            times = []
            for i in range(repeats):
                start = time.perf_counter()
                program.execute(draws[i % 4], weights)
                times.append(time.perf_counter() - start)
            joules = joules_per_row(
                lambda d: program.execute(d, weights), draws, size, reader, energy_seconds
            )
            rows.append((size, *p50_p99(times), joules))
    finally:
        runtime.free(weights)
    return rows


def side_by_side(
    runtime: Any, path: Path, repeats: int, rounds: int, torch_width: int | None
) -> list[tuple[str, float, float]]:
    """(path, p50 seconds, p99 seconds) of one batch-1 round trip, every way at once."""
    import jax

    bundle = load_bundle(path)
    program = runtime.load(bundle, sizes=(1,))
    weights = runtime.to_device(bundle.read_weights())
    rng = np.random.default_rng(1)
    draws = random_inputs(rng, bundle, program, 1)
    exported = deserialize_artifact(bundle)
    args = [np.asarray(d) for d in draws[0]]
    plain = jax.jit(exported.call).lower(*args, *weights).compile()
    ways: dict[str, Any] = {
        "ours": lambda x: program.execute(x, weights),
        "plain jax.jit": lambda x: [np.asarray(r) for r in jax.tree.leaves(plain(*x, *weights))],
    }
    kinds = {m.kind for m in runtime.device.addressable_memories()}
    if "pinned_host" in kinds:
        from jax.sharding import SingleDeviceSharding

        pinned = (
            jax.jit(
                exported.call,
                out_shardings=SingleDeviceSharding(runtime.device, memory_kind="pinned_host"),
            )
            .lower(*args, *weights)
            .compile()
        )
        ways["pinned-host output"] = lambda x: [
            np.asarray(r) for r in jax.tree.leaves(pinned(*x, *weights))
        ]
        # The same program with the inputs put on the device first, in one call (what
        # runtime/model.py did before issue 40): which way the inputs go is measured.
        ways["pinned, inputs put"] = lambda x: [
            np.asarray(r)
            for r in jax.tree.leaves(pinned(*jax.device_put(list(x), runtime.device), *weights))
        ]
        if runtime.output_path != "pinned_host":
            # CUDA's transfer path of the runtime, compiled and run here too (the CPU
            # offers pinned host memory): what a GPU worker's execute does.
            path = runtime.output_path
            runtime.output_path = "pinned_host"
            try:
                cuda_path = runtime.load(bundle, sizes=(1,))
            finally:
                runtime.output_path = path
            ways["ours, pinned path"] = lambda x: cuda_path.execute(x, weights)
    torch_call = _torch_mlp(bundle, torch_width) if torch_width else None
    if torch_call is not None:
        ways["torch"] = torch_call
    times: dict[str, list[float]] = {name: [] for name in [*ways, "ours, 2 in flight"]}
    per_round = max(1, repeats // rounds)
    try:
        for fn in ways.values():
            for i in range(10):
                fn(draws[i % 4])
        for _ in range(rounds):
            for name, fn in ways.items():
                for i in range(per_round):
                    start = time.perf_counter()
                    fn(draws[i % 4])
                    times[name].append(time.perf_counter() - start)
            # Two in flight: launch i+1, then fetch i; the time per execution of the stream.
            start = time.perf_counter()
            previous = program.launch(draws[0], weights)
            for i in range(1, per_round + 1):
                launched = program.launch(draws[i % 4], weights)
                program.fetch(previous)
                previous = launched
            program.fetch(previous)
            times["ours, 2 in flight"].append((time.perf_counter() - start) / (per_round + 1))
    finally:
        runtime.free(weights)
    return [(name, *p50_p99(samples)) for name, samples in times.items()]


def _torch_mlp(bundle: Any, width: int) -> Any:
    """The zoo MLP in PyTorch on the GPU with ``bundle``'s weights (None without torch+GPU)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    host = dict(zip((w.name for w in bundle.weight_specs), bundle.read_weights(), strict=True))
    w = {name: torch.from_numpy(np.array(a)).cuda() for name, a in host.items()}

    def layer(name: str) -> tuple[Any, Any]:
        matches = [k for k in w if k.startswith(name)]
        weight = next(w[k] for k in matches if k.endswith("w"))
        bias = next(w[k] for k in matches if k.endswith("b"))
        return weight, bias

    (w1, b1), (w2, b2), (w3, b3) = layer("dense1"), layer("dense2"), layer("head")
    assert w2.shape == (width, width)

    def call(x: list[np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            h = torch.relu(torch.from_numpy(x[0]).cuda() @ w1 + b1)
            h = torch.relu(h @ w2 + b2)
            logits = h @ w3 + b3
            return [logits.cpu().numpy(), torch.softmax(logits, -1).cpu().numpy()]

    return call


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--repeats", type=int, default=None, help="runs per size (200; 5 quick)")
    parser.add_argument("--resnet-width", type=int, default=8)
    parser.add_argument(
        "--quick", action="store_true", help="sizes 1, 2, 4; narrow MLP (smoke test)"
    )
    parser.add_argument("--out", type=Path, default=None, help="results folder (default $OUT)")
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds of the side-by-side table"
    )
    parser.add_argument(
        "--energy-seconds",
        type=float,
        default=1.0,
        help="seconds of back-to-back runs per size for J/row (0: skip)",
    )
    args = parser.parse_args(argv)
    sizes, mlp_width = SIZES, MLP_WIDE_WIDTH
    if args.quick:
        sizes, mlp_width, args.energy_seconds = (1, 2, 4), 256, 0.2
    if args.repeats is None:
        args.repeats = 5 if args.quick else 200
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
        table.line("")
        table.line(
            f"one execution at batch 1, the same program every way, numpy in and out; "
            f"{args.repeats} runs each in {args.rounds} interleaved rounds (runtime transfer "
            f"path: {runtime.output_path})"
        )
        table.line(
            f"{'model':<10} {'path':<20} {'p50 ms':>8} {'p99 ms':>8} {'/plain':>7} {'/pinned':>8}"
        )
        verdicts: list[tuple[str, dict[str, float]]] = []
        for name, path in paths.items():
            ways = side_by_side(
                runtime,
                path,
                args.repeats,
                args.rounds,
                mlp_width if name == "mlp_wide" else None,
            )
            p50 = {way: median for way, median, _ in ways}
            for way, median, p99 in ways:
                pinned = p50.get("pinned-host output")
                table.line(
                    f"{name:<10} {way:<20} {1e3 * median:>8.3f} {1e3 * p99:>8.3f} "
                    f"{median / p50['plain jax.jit']:>6.2f}x "
                    f"{'-' if pinned is None else format(median / pinned, '.2f') + 'x':>8}"
                )
            verdicts.append((name, p50))
        for name, p50 in verdicts:
            pinned = p50.get("pinned-host output")
            if pinned is None:
                continue
            cells = [
                f"{way} {p50[way] / pinned:.2f}x ({'met' if p50[way] <= 1.3 * pinned else 'not met'})"
                for way in ("ours", "ours, pinned path")
                if way in p50
            ]
            table.line(f"{name}: / the pinned-host round trip, goal <= 1.3x: {'; '.join(cells)}")
        table.line(
            "goal (issues 33, 40): ours at batch 1 <= 1.3x the pinned-host output round trip; "
            "'2 in flight' is per execution of a stream (no p99: one figure per round)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
