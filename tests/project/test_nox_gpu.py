"""``nox -s gpu`` without a GPU: the session, its driver and the benchmarks' code paths.

The GPU itself is ``test_gpu_*.py``'s business (skipped here). What can be checked on the
CPU is checked here, in real processes: the nox session runs the driver
(``benchmarks/gpu/run_gpu.py``) with ``--no-venv --no-install`` on this environment; the
driver's steps, time limits, budget and summary; and every GPU benchmark end to end at
its smoke-test sizes on the CPU backend (``--backend cpu --quick``), so a GPU session
spends its device time running them, not debugging them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clocks import wait_until
from nox_harness import environment, nox_argv, nox_path

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU))
sys.path.insert(0, str(ROOT))
import run_gpu  # noqa: E402
import wheels  # noqa: E402

import noxfile  # noqa: E402


def _driver(*args: str, out: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    return subprocess.run(
        [sys.executable, str(GPU / "run_gpu.py"), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_the_session_installs_the_cuda_build_and_runs_the_driver() -> None:
    assert ".[cuda]" in noxfile.GPU_REQUIREMENTS
    assert "gpu" in noxfile.__doc__  # listed among the sessions
    assert [s.name for s in run_gpu.STEPS] == [
        "device",
        "tests",
        "bandwidth",
        "prefetch",
        "catalog",
        "batch",
    ]
    # Every step fits the device tool's 10 minutes, and the expected total fits the budget.
    assert all(s.limit <= 600 for s in run_gpu.STEPS)
    assert sum(s.expected for s in run_gpu.STEPS) < 540
    # The outputs fit the device tool's limit of eight files.
    logs = {s.log for s in run_gpu.STEPS}
    assert len(logs) + len(run_gpu.BENCHES) + 1 <= 8  # + summary.txt
    tests = run_gpu.command("tests", "cuda", False)
    assert tests[1:5] == ["-m", "pytest", "-m", "gpu"]
    assert (
        "tests/runtime/test_gpu_serving.py" in tests and "tests/runtime/test_gpu_memory.py" in tests
    )
    assert not any(t.endswith("test_nox_gpu.py") for t in tests)


@pytest.mark.slow
def test_nox_gpu_runs_the_driver_and_writes_its_results(tmp_path: Path) -> None:
    """The session as the GPU machine runs it (``--no-venv --no-install``: JAX's CUDA
    build is already there), here with the CPU backend and one quick step."""
    out = tmp_path / "out"
    argv = nox_argv(sys.executable, "-s", "gpu", "--no-venv", "--no-install")
    argv += ["--", "--backend", "cpu", "--quick", "--only", "device,bandwidth"]
    env = environment(nox_path(tmp_path), OUT=str(out), PYTHONUNBUFFERED="1")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = (out / "summary.txt").read_text()
    assert "device     ok" in summary and "bandwidth  ok" in summary
    assert "(a) cold-load bandwidth" in summary
    assert sorted(p.name for p in out.iterdir()) == [
        "bench.log",
        "bench_gpu_bandwidth.txt",
        "summary.txt",
    ]
    assert "Session gpu was successful" in done.stderr + done.stdout


def test_a_step_that_no_longer_fits_the_budget_is_skipped_and_said(tmp_path: Path) -> None:
    done = _driver("--only", "tests", "--budget", "5", "--backend", "cpu", out=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = (tmp_path / "summary.txt").read_text()
    assert "tests      skipped" in summary
    assert "5 s of the budget left, it needs about 120 s" in summary


def test_a_step_over_its_limit_is_killed_with_everything_it_started(tmp_path: Path) -> None:
    """The limit kills the step's process group: a worker a test started goes too."""
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(120)\n"
    )
    log = (tmp_path / "log.txt").open("w")
    start = time.monotonic()
    rc, last = run_gpu.run_step([sys.executable, "-c", code], log, 3.0, dict(os.environ))
    log.close()
    assert rc is None and last == "started"
    assert time.monotonic() - start < 60
    child = int(pid_file.read_text())

    def gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        # A zombie until init reaps it: look at its state.
        state = Path(f"/proc/{child}/stat")
        return state.exists() and state.read_text().split(") ")[-1].startswith("Z")

    wait_until(gone, what=f"the step's child {child} gone after the time limit")
    assert "started" in (tmp_path / "log.txt").read_text()


def test_without_a_gpu_the_run_stops_after_the_device_step_and_fails(tmp_path: Path) -> None:
    done = _driver("--only", "device,bandwidth", out=tmp_path)
    assert done.returncode == 1
    summary = (tmp_path / "summary.txt").read_text()
    assert "device     failed (1)" in summary
    assert "bandwidth  not run" in summary and "no GPU (see the device step)" in summary


@pytest.mark.slow
def test_every_gpu_benchmark_runs_at_its_smoke_test_sizes_on_the_cpu(tmp_path: Path) -> None:
    done = _driver(
        "--backend", "cpu", "--quick", "--only", "bandwidth,prefetch,catalog,batch", out=tmp_path
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = (tmp_path / "summary.txt").read_text()
    for step in ("bandwidth", "prefetch", "catalog", "batch"):
        assert f"{step:<10} ok" in summary, summary
    tables = {p.name: p.read_text() for p in tmp_path.glob("bench_gpu_*.txt")}
    assert len(tables) == 4
    assert "ratio = plain device_put time" in tables["bench_gpu_bandwidth.txt"]
    assert "idle fraction" in tables["bench_gpu_prefetch.txt"]
    assert "largest catalog meeting the QoS at 20 requests/s" in tables["bench_gpu_catalog.txt"]
    assert "mlp_wide" in tables["bench_gpu_batch.txt"]
    for table in tables.values():
        assert table.splitlines()[1].startswith("device: ")  # the device in every table


@pytest.mark.slow
def test_a_before_after_run_runs_the_baseline_trees_benchmark_first(tmp_path: Path) -> None:
    """``--baseline DIR`` runs DIR's benchmark script (DIR's ``src`` first on the path) before
    ours, with the ``--bench-args`` of that step for both; the summary carries both tables,
    the baseline's marked BASELINE, and ours has the side-by-side round trips."""
    root = GPU.parents[1]
    done = _driver(
        "--backend",
        "cpu",
        "--quick",
        "--only",
        "batch",
        "--baseline",
        str(root),
        "--bench-args",
        "batch=--rounds 2",
        out=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = (tmp_path / "summary.txt").read_text()
    assert "batch@base ok" in summary.replace("  ", " ").replace("  ", " "), summary
    assert "BASELINE (d) single-model batch curve" in summary
    # The baseline's table is in the summary, not a file of its own: $OUT holds at most
    # the device tool's eight files.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bench.log",
        "bench_gpu_batch.txt",
        "summary.txt",
    ]
    ours = (tmp_path / "bench_gpu_batch.txt").read_text()
    for way in ("ours", "ours, 2 in flight", "plain jax.jit", "pinned-host output"):
        assert f" {way} " in ours, ours
    assert "in 2 interleaved rounds" in ours
    assert run_gpu.bench_args(["catalog=--rates 1000,2000 --seconds 5"]) == {
        "catalog": ["--rates", "1000,2000", "--seconds", "5"]
    }


def test_the_carried_wheels_are_exactly_what_the_gpu_image_lacks() -> None:
    """``wheels.WHEELS`` is the closure of what ``nox -s gpu`` needs on CPython 3.12
    (reactantserver with its cuda extra, pytest-trio, nox), read from the installed
    metadata, less the GPU image's packages and JAX's own: nothing missing (flatbuffers,
    which jax.export needs, was), nothing carried for nothing (trio-asyncio was)."""
    carried = {wheels._name(requirement) for requirement in wheels.WHEELS}
    assert carried == wheels.needed()
    assert {"flatbuffers", "nvidia-ml-py"} <= carried
    assert all("==" in requirement for requirement in wheels.WHEELS)  # pinned


@pytest.mark.slow
def test_a_call_cut_short_still_leaves_the_summary_of_every_finished_step(
    tmp_path: Path,
) -> None:
    """The summary is rewritten after every step: the driver killed outright (SIGKILL, as
    when a device call runs out of time) while its second step runs still leaves a
    summary that says the first step's outcome."""
    import psutil

    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    argv = [sys.executable, str(GPU / "run_gpu.py"), "--out", str(tmp_path)]
    argv += ["--backend", "cpu", "--quick", "--only", "device,bandwidth"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("===== bandwidth"):
            break
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    for child in children:
        child.kill()
    proc.wait(30)
    psutil.wait_procs(children, timeout=30)
    summary = (tmp_path / "summary.txt").read_text()
    assert "device     ok" in summary
    assert "bandwidth  " not in summary  # it had not finished
