"""Issue 33's pipeline on a fake device: the device's idle fraction and throughput.

The simulation ``benchmarks/gpu/bench_gpu_prefetch.py --simulate`` runs, on any machine:
``pipeline_sim.FakeGpu`` (an asynchronous fake device with a copy engine for weight
loads, input and output transfers and host work of its own, at the H200's calibration)
driven by the real ``Scheduler`` on a virtual clock, a Zipf catalog ten times the weight
budget, closed-loop clients. Three columns: prefetch off at pipeline depth 1, prefetch on
at depth 1, prefetch on at depth 2 (``--depth``). Virtual time: the numbers do not depend
on the machine (Trio's task order moves the last column a little from run to run), and
the whole table takes a few seconds. The GPU run
(``nox -s gpu``) shows what the device does with the same dispatch loop.

    python benchmarks/bench_pipeline.py      (or: nox -s bench -- pipeline)

Options are ``bench_gpu_prefetch.py``'s (``--runs``, ``--requests``, ``--models``,
``--clients``, ``--zipf``, ``--depth``).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import bench_gpu_prefetch  # benchmarks/gpu/; it imports pipeline_sim


def main(argv: Sequence[str] | None = None) -> int:
    options = list(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory() as out:  # the table is printed; its file is not kept
        return bench_gpu_prefetch.main(["--simulate", "--out", out, *options])


if __name__ == "__main__":
    raise SystemExit(main())
