"""The gateway benchmark's core layouts (``benchmarks/bench_gateway.py``): which cores each
process is given, and that pinning reaches every thread of a process; and its comparison
with a baseline tree (``--baseline REV``): the tree extracted, its gateway started from
it, the ratio reported. No timing is asserted: the benchmark itself (``nox -s bench --
gateway``) is where numbers live."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, load_file
from hypothesis import given
from hypothesis import strategies as st

bg = load_file("reactantserver_bench_gateway", ROOT / "benchmarks" / "bench_gateway.py")


def test_two_cores_give_the_worker_one_and_the_rest_the_other() -> None:
    shared, pinned = bg.layouts(["shared", "pinned"], {0, 1})
    assert (shared.load, shared.gateway, shared.worker) == ({0, 1}, {0, 1}, {0, 1})
    assert (pinned.load, pinned.gateway, pinned.worker) == ({0}, {0}, {1})
    assert "worker on cores [1]" in pinned.describe()


def test_one_core_has_no_pinned_layout() -> None:
    assert [layout.name for layout in bg.layouts(["shared", "pinned"], {3})] == ["shared"]


@given(st.sets(st.integers(0, 63), min_size=3, max_size=16))
def test_pinned_gives_worker_and_gateway_a_core_each_from_three_cores(cores: set[int]) -> None:
    """With three or more cores the pinned layout gives the worker a core of its own (the
    highest), the gateway another (the next), and the load generator all the others: the
    three sets are disjoint, non-empty and together exactly the cores given."""
    (pinned,) = bg.layouts(["pinned"], cores)
    ordered = sorted(cores)
    assert pinned.worker == {ordered[-1]}
    assert pinned.gateway == {ordered[-2]}
    assert pinned.load == set(ordered[:-2])
    assert pinned.load | pinned.gateway | pinned.worker == cores


_CHILD = textwrap.dedent(
    """
    import os, sys, threading, time
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    print("ready", flush=True)
    sys.stdin.readline()  # pinned now: a thread started after it inherits the affinity
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    print("started", flush=True)
    time.sleep(60)
    """
)


def test_pin_moves_every_thread_and_the_threads_started_later() -> None:
    cores = os.sched_getaffinity(0)
    target = frozenset({min(cores)})
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        bg.pin(child.pid, target)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 10
        while len(tids := os.listdir(f"/proc/{child.pid}/task")) < 3:
            assert time.monotonic() < deadline, tids
            time.sleep(0.01)
        assert {tid: os.sched_getaffinity(int(tid)) for tid in tids} == dict.fromkeys(tids, target)
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("names", [["shared"], ["pinned"], ["shared", "pinned"]])
def test_layouts_are_within_the_cores_given(names: list[str]) -> None:
    cores = os.sched_getaffinity(0)
    for layout in bg.layouts(names, cores):
        for part in (layout.load, layout.gateway, layout.worker):
            assert part and part <= cores


def test_the_baseline_tree_is_the_revision_extracted(tmp_path: Path) -> None:
    """``--baseline REV`` runs the gateway of the tree at REV: ``git archive`` of src/ and
    tests/, here of HEAD, whose files are the committed ones."""
    tree = bg.baseline_tree("HEAD", tmp_path)
    if tree is None:
        pytest.skip("not a git checkout")
    committed = subprocess.run(
        ["git", "-C", str(ROOT), "show", "HEAD:src/reactantserver/gateway/forward.py"],
        capture_output=True,
        check=True,
    ).stdout
    assert (tree / "src" / "reactantserver" / "gateway" / "forward.py").read_bytes() == committed


def test_a_gateway_started_from_another_tree_runs_that_trees_package(tmp_path: Path) -> None:
    """``start_gateway(src=...)`` puts that tree's package first on the gateway's path, so
    the baseline's gateway is the baseline's code, not this tree's."""
    package = tmp_path / "src" / "reactantserver"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "cli.py").write_text(
        "import pathlib, sys\n"
        "pathlib.Path(sys.argv[-1]).with_suffix('.ran').write_text(' '.join(sys.argv[1:]))\n"
    )
    worker = bg.Server("worker", None, 1, tmp_path / "w.log")
    gateway = bg.start_gateway(worker, tmp_path, src=tmp_path / "src")
    assert gateway.proc.wait(60) == 0
    (ran,) = tmp_path.glob("gateway_*.ran")
    assert ran.read_text().startswith("gateway ")


def test_the_comparison_reports_the_ratio_to_the_baseline() -> None:
    base = bg.Side("abc1234", [80e-6, 70e-6, 75e-6], [150e-6] * 3, [3e-3] * 3)
    this = bg.Side("this tree", [60e-6, 57e-6, 63e-6], [150e-6] * 3, [2.9e-3] * 3)
    row = this.row(base)
    assert " 60.0 " in row and "0.400" in row and "x0.800" in row
    assert "x" not in base.row().split("|")[-1]


def test_the_comparison_gives_each_pair_of_processes_its_own_ratio() -> None:
    """Windows are grouped by the pair of processes that measured them: each pair's ratio
    is printed after the overall one, so an offset one pair carries shows as such."""
    base = bg.Side("abc1234", [100e-6, 100e-6, 80e-6, 80e-6], [150e-6] * 4, [3e-3] * 4, [2, 2])
    this = bg.Side("this tree", [90e-6, 90e-6, 80e-6, 80e-6], [150e-6] * 4, [3e-3] * 4, [2, 2])
    assert bg.pair_ratios(base, this) == [0.9, 1.0]
    assert this.row(base).endswith("by pair of processes x0.900 x1.000")
    one = bg.Side("this tree", [90e-6, 90e-6], [150e-6] * 2, [3e-3] * 2, [2])
    assert "by pair" not in one.row(bg.Side("abc1234", [100e-6] * 2, [150e-6] * 2, [3e-3] * 2, [2]))
