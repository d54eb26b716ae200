"""What compressed requests cost the server, and why answers are not compressed.

A real server (``serve_grpc`` over ``Service``, Trio as asyncio's guest, as the worker
runs) in this process on 127.0.0.1, over a host whose model returns its input (the
transport and the inflation are what is measured); ``tritonclient.grpc`` in a separate
process sends ModelInfer with ``compression_algorithm=`` None, ``gzip`` and ``deflate``,
in alternating rounds (identity, gzip, deflate, identity, ...), so that a noisy machine
slows all three alike. Per request: the server process's CPU (user + system, every
thread) and the client's p50 round trip. Three inputs: a small one (one row of 16
FP32), 256 KiB of random FP32 (what tensors are like: barely compressible) and 256 KiB of
FP32 holding small integers (compressible).

The second table is the case for compressing *answers*, measured in this process with
zlib as gRPC would use it (level 6, gzip's default; level 1, the fastest): the ratio,
the compression speed, and the link speed below which the bytes saved would arrive sooner
than the CPU spent compressing them -- compression pays only on a link slower than that.

    python benchmarks/bench_compression.py [--seconds 1.0] [--rounds 4]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import trio
import tritonclient.grpc as tc

from reactantserver.config.schema import EndpointsConfig
from reactantserver.service import Service
from reactantserver.transport import guest
from reactantserver.worker.grpc import serve_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_grpc import COLS, _Host  # (bench_grpc's identity host)

ALGORITHMS = (None, "gzip", "deflate")


def inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    rows = 256 * 1024 // (4 * COLS)
    integers = np.arange(rows * COLS) % 100
    return {
        "small (64 B)": np.ones((1, COLS), np.float32),
        "256 KiB random FP32": rng.standard_normal((rows, COLS)).astype(np.float32),
        "256 KiB small integers": integers.astype(np.float32).reshape(rows, COLS),
    }


def _batch(url: str, label: str, algorithm: str | None, seconds: float) -> tuple[int, float]:
    """In the client process: calls for ``seconds``; (calls, p50 seconds)."""
    x = inputs()[label]
    client = tc.InferenceServerClient(url)
    tensor = tc.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    client.infer("identity", [tensor], compression_algorithm=algorithm)  # warm
    samples = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        client.infer("identity", [tensor], compression_algorithm=algorithm)
        samples.append(time.perf_counter() - t)
    client.close()
    return len(samples), statistics.median(samples)


async def _serve_and_measure(seconds: float, rounds: int) -> list[str]:
    service = Service(_Host(), max_concurrent_requests=0)
    rows = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_grpc, service, EndpointsConfig(port=0))
        url = f"127.0.0.1:{port}"
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            for label in inputs():
                cpu: dict[str | None, list[float]] = {a: [] for a in ALGORITHMS}
                rtt: dict[str | None, list[float]] = {a: [] for a in ALGORITHMS}
                for _ in range(rounds):
                    for algorithm in ALGORITHMS:
                        before = time.process_time()
                        calls, p50 = await trio.to_thread.run_sync(
                            pool.apply, _batch, (url, label, algorithm, seconds)
                        )
                        cpu[algorithm].append((time.process_time() - before) / (calls + 1))
                        rtt[algorithm].append(p50)
                base = statistics.median(cpu[None])
                for algorithm in ALGORITHMS:
                    used = statistics.median(cpu[algorithm])
                    rows.append(
                        f"{label:<24} {algorithm or 'identity':<9} {used * 1e6:10.0f} "
                        f"{used / base:8.2f}x {statistics.median(rtt[algorithm]) * 1e3:9.3f}"
                    )
        nursery.cancel_scope.cancel()
    return rows


def _answers() -> list[str]:
    rows = []
    for label, x in inputs().items():
        if x.nbytes < 1024:
            continue
        data = x.tobytes()
        for level in (1, 6):
            start = time.perf_counter()
            for _ in range(5):
                packed = zlib.compress(data, level)
            seconds = (time.perf_counter() - start) / 5
            saved = len(data) - len(packed)
            # Sending ``saved`` bytes takes longer than compressing at a link slower than this.
            pays_below = saved / seconds / 1e6 * 8  # Mbit/s
            rows.append(
                f"{label:<24} {level:>5} {len(packed) / len(data):8.3f} "
                f"{len(data) / seconds / 1e6:10.0f} {pays_below:14.0f}"
            )
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per batch of calls")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds")
    args = parser.parse_args(argv)
    rows = guest.run(lambda: _serve_and_measure(args.seconds, args.rounds))
    print("Requests (server CPU per request, every thread; client p50 round trip)")
    print(f"{'input':<24} {'encoding':<9} {'CPU us':>10} {'vs ident':>9} {'p50 ms':>9}")
    for row in rows:
        print(row)
    print()
    print("Answers, if they were compressed (zlib in this process)")
    print(f"{'output':<24} {'level':>5} {'ratio':>8} {'MB/s':>10} {'pays < Mbit/s':>14}")
    for row in _answers():
        print(row)


if __name__ == "__main__":
    main()
