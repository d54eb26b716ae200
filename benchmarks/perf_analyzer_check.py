"""Triton's ``perf_analyzer`` against a worker and a gateway in front of it (``nox -s perf_analyzer``).

Issue 17 asks that ``perf_analyzer`` work against the gateway exactly as against a worker.
This starts one CPU worker serving the zoo's ``double`` (``bench_serve``'s repository) and
a gateway with that worker as its endpoint, runs ``perf_analyzer`` against each in four
ways -- synchronous calls, asynchronous calls, inputs and outputs in system shared memory,
and ``--streaming`` (every request on one ModelStreamInfer stream, issue 43) -- and prints what it measured (its own throughput and latency, and the server-side
statistics it read through ``ModelStatistics``). It exits non-zero if any run fails.

``perf_analyzer`` is a C++ program; PyPI's ``tritonclient`` wheels carry it up to 2.41
(``bin/perf_analyzer``). It needs ``libb64.so.0d`` (Debian's ``libb64-0d``) and
``libcudart.so.12`` (PyPI's ``nvidia-cuda-runtime-cu12``) even on a machine without a GPU;
the nox session provides both. Run directly::

    PERF_ANALYZER=/path/to/perf_analyzer python benchmarks/perf_analyzer_check.py

On a loaded machine perf_analyzer may not find three windows within 10 % of each other
("Failed to obtain stable measurement"); ``--stability-percentage 50`` (passed on to it,
``nox -s perf_analyzer -- --stability-percentage 50``) relaxes that.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_serve as bs  # noqa: E402
from bench_gateway import start_gateway  # noqa: E402

#: (label, perf_analyzer arguments) for each run.
RUNS = (
    ("sync, 4 in flight", ["--concurrency-range", "4"]),
    ("async, 8 in flight", ["--async", "--concurrency-range", "8"]),
    ("system shm, batch 4", ["--shared-memory", "system", "-b", "4", "--concurrency-range", "2"]),
    ("streaming, 8 in flight", ["--streaming", "--concurrency-range", "8"]),
)
_RESULT = re.compile(r"Concurrency: \d+, throughput: ([\d.]+) infer/sec, latency (\d+) usec")
_SERVER = re.compile(r"Avg request latency: (\d+) usec")


def find_perf_analyzer() -> str:
    path = os.environ.get("PERF_ANALYZER") or shutil.which("perf_analyzer")
    if not path:
        sys.exit(
            "perf_analyzer not found: set PERF_ANALYZER or put it on PATH (nox -s perf_analyzer)"
        )
    probe = subprocess.run([path, "--version"], capture_output=True, text=True)
    if probe.returncode != 0:
        sys.exit(f"{path} does not run here:\n{probe.stderr or probe.stdout}")
    return path


def run(tool: str, url: str, args: list[str], extra: list[str]) -> tuple[str, str]:
    """One perf_analyzer run: (a result cell, its output if it failed)."""
    cmd = [tool, "-m", bs.SMALL_MODEL, "-i", "grpc", "-u", url, "--measurement-interval", "2000"]
    cmd += extra
    done = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=300)
    result = _RESULT.search(done.stdout)
    if done.returncode != 0 or result is None:
        return "FAILED", done.stdout[-2000:] + done.stderr[-2000:]
    server = _SERVER.search(done.stdout)
    cell = f"{float(result[1]):7.0f}/s {int(result[2]) / 1000:6.2f} ms"
    return cell + (f"  (server {int(server[1])} us)" if server else ""), ""


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--stability-percentage",
        type=float,
        help="passed to perf_analyzer (its default: 10)",
    )
    options = parser.parse_args(argv)
    extra = []
    if options.stability_percentage is not None:
        extra = ["--stability-percentage", f"{options.stability_percentage:g}"]
    tool = find_perf_analyzer()
    probe = subprocess.run([tool, "--version"], capture_output=True, text=True)
    version = (probe.stdout or probe.stderr).strip()
    with tempfile.TemporaryDirectory(prefix="rs_perf_analyzer_") as tmp:
        work = Path(tmp)
        repo = work / "repo"
        bs.build_repo(repo, zoo=(bs.SMALL_MODEL,), exported=())
        worker = bs.start_ours(repo, work, cache_dir=work / "cache")
        gateway = None
        try:
            await bs.wait_ready(worker, [bs.SMALL_MODEL])
            gateway = start_gateway(worker, work)
            await bs.wait_ready(gateway, [bs.SMALL_MODEL])
            print(f"{version}; model {bs.SMALL_MODEL!r}; 2 s measurement windows")
            print(f"{'run':22s} {'worker':38s} {'gateway':38s}")
            failures = []
            for label, args in RUNS:
                cells = []
                for name, server in (("worker", worker), ("gateway", gateway)):
                    cell, output = run(tool, server.url, args, extra)
                    cells.append(cell)
                    if output:
                        failures.append(f"--- {label}, {name}:\n{output}")
                print(f"{label:22s} {cells[0]:38s} {cells[1]:38s}")
            for failure in failures:
                print(failure)
            return 1 if failures else 0
        finally:
            if gateway is not None:
                gateway.stop()
            worker.stop()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
