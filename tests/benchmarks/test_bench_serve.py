"""The serving benchmark's comparison with a baseline tree (``benchmarks/bench_serve.py
--baseline REV``): a worker started from another tree runs that tree's package, and the
report gives the ratio of medians and one ratio for each pair of processes. No timing is
asserted: the benchmark itself is where numbers live."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from conftest import ROOT, load_file

bs = load_file("reactantserver_bench_serve", ROOT / "benchmarks" / "bench_serve.py")


def test_a_worker_started_from_another_tree_runs_that_trees_package(tmp_path: Path) -> None:
    """``start_ours(src=...)`` puts that tree's package first on the worker's path, so the
    baseline's worker is the baseline's code, not this tree's."""
    package = tmp_path / "src" / "reactantserver"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "cli.py").write_text(
        "import pathlib, sys\n"
        "pathlib.Path(sys.argv[-3]).with_suffix('.ran').write_text(' '.join(sys.argv[1:]))\n"
    )
    server = bs.start_ours(tmp_path / "repo", tmp_path, cache_dir=tmp_path, src=tmp_path / "src")
    assert server.proc.wait(60) == 0
    (ran,) = tmp_path.glob("node_*.ran")
    assert ran.read_text().startswith("serve ")


def test_the_comparison_gives_the_ratio_and_each_pair_of_processes_its_own() -> None:
    """Windows are grouped by the pair of processes that measured them: the ratio of the
    medians first, then each pair's, so an offset one pair carries shows as such."""
    base = bs.Side("abc1234", [100e-6, 100e-6, 80e-6, 80e-6], [900.0] * 4, [2, 2])
    this = bs.Side("this tree", [90e-6, 90e-6, 80e-6, 80e-6], [950.0] * 4, [2, 2])
    assert bs.pair_ratios(base.cpu, this.cpu, this.per_pair) == [0.9, 1.0]
    row = this.row(16, base)
    assert row.split()[:5] == ["this", "tree", "16", "950", "85.0"]
    assert row.endswith("| CPU x0.944, by pair of processes x0.900 x1.000")
    assert "x" not in base.row(16)
    one = bs.Side("this tree", [90e-6, 90e-6], [950.0] * 2, [2])
    assert "by pair" not in one.row(1, bs.Side("abc1234", [100e-6] * 2, [900.0] * 2, [2]))


def test_the_command_line_takes_a_baseline_and_its_pairs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--baseline REV --pairs N --runs M`` run the comparison instead of the tables
    (the run itself needs a worker: the benchmark, not this test)."""
    ran: list[functools.partial[object]] = []
    monkeypatch.setattr(bs, "run_in_workdir", lambda workdir, prefix, run: ran.append(run))
    bs.main(["--baseline", "f61d277", "--pairs", "5", "--runs", "3"])
    (run,) = ran
    (args,) = run.args
    assert (args.baseline, args.pairs, args.runs) == ("f61d277", 5, 3)
    assert run.func is bs.against_baseline
