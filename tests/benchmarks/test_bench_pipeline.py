"""``benchmarks/bench_pipeline.py`` (``nox -s bench -- pipeline``) prints the fake-device
simulation's table: its three columns and the rows issue 33 is judged by. The numbers
themselves are asserted in ``tests/scheduling/test_sched_pipeline.py``."""

from __future__ import annotations

import pytest
from conftest import ROOT, load_file

bp = load_file("reactantserver_bench_pipeline", ROOT / "benchmarks" / "bench_pipeline.py")


def test_prints_the_three_columns(capsys: pytest.CaptureFixture[str]) -> None:
    assert bp.main(["--runs", "1", "--requests", "80"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "prefetch off, d1" in line)
    columns = [c.strip() for c in header.split("  ") if c.strip()]
    assert columns == ["prefetch off, d1", "prefetch on, d1", "prefetch on, d2"]
    assert "device idle fraction" in out
    assert "throughput (requests/s)" in out
