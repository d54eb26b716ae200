"""The Python client's own CPU per call, against a running worker (docs/benchmarks.md).

    PYTHONPATH=<tree>/src python benchmarks/client_cost.py HOST:PORT [BIG_MODEL] [N] [SMALL] [ROWS]

``N`` calls (default 8) of ``BIG_MODEL`` (default ``double_38mb``, as ``bench_serve``
builds it) with ``bench_serve.big_array()`` inline (``ROWS`` rows of it: the model's one
batch size, 593,750 for ``double_38mb``; ``double`` exported at 262,144 or 1,048,576 rows
gives 16 or 64 MiB), ``time.process_time`` around each (the
client process only; median printed), then ``SMALL`` (default 2000) one-row calls of
``double`` in a row: the client's CPU per call over all of them and the median wall time
of one call. Run it with ``PYTHONPATH`` at two checkouts, alternating, to compare
clients side by side against the same server.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_serve as bs

from reactantserver.client import AsyncClient


async def main(url: str, model: str, n: int, small: int, rows: int) -> None:
    x = np.resize(bs.big_array(), (rows, bs.FEATURES))
    async with AsyncClient(url, timeout=120) as client:
        out = await client.infer(model, {"x": x})
        assert np.array_equal(out["y"], 2 * x)
        cpu, wall = [], []
        for _ in range(n):
            t0, c0 = time.perf_counter(), time.process_time()
            await client.infer(model, {"x": x})
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - t0)
        print(
            f"{model} ({x.nbytes / 2**20:.1f} MiB): "
            f"client CPU {statistics.median(cpu) * 1e3:.1f} ms per call, "
            f"p50 {statistics.median(wall) * 1e3:.1f} ms ({n} calls)"
        )
        if small:
            one = np.ones((1, bs.FEATURES), np.float32)
            await client.infer(bs.SMALL_MODEL, {"x": one})
            walls = []
            c0 = time.process_time()
            for _ in range(small):
                t0 = time.perf_counter()
                await client.infer(bs.SMALL_MODEL, {"x": one})
                walls.append(time.perf_counter() - t0)
            per_call = (time.process_time() - c0) / small
            print(
                f"{bs.SMALL_MODEL}: client CPU {per_call * 1e6:.0f} us per call, "
                f"p50 {statistics.median(walls) * 1e6:.0f} us ({small} calls)"
            )


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(
        main(
            args[0],
            args[1] if len(args) > 1 else bs.BIG_MODEL,
            int(args[2]) if len(args) > 2 else 8,
            int(args[3]) if len(args) > 3 else 2000,
            int(args[4]) if len(args) > 4 else bs.BIG_ROWS,
        )
    )
