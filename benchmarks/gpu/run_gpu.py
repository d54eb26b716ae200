"""``nox -s gpu``: the GPU tests and the GPU benchmarks in one run, results in one folder.

Each step is a subprocess with a time limit; when it runs over, its whole process group
(pytest and the workers it started, a benchmark and its worker) is killed and the run
goes on, so one hang costs its limit, not the run. A global budget (``--budget``,
default 540 s: the device tool allows 600 s per command) is checked before each step: a
step that no longer fits is skipped and the summary says so.

| step | what it runs | on an H100 | limit |
| --- | --- | --- | --- |
| ``device`` | ``nvidia-smi`` and JAX's view of the GPU; without a GPU the run stops here | 2 s | 120 s |
| ``tests`` | ``pytest -m gpu tests/runtime/test_gpu_*.py`` | 2 min | 330 s |
| ``bandwidth`` | benchmark (a), ``bench_gpu_bandwidth.py`` | 20 s | 120 s |
| ``prefetch`` | benchmark (b), ``bench_gpu_prefetch.py`` (three configurations now) | 85 s | 180 s |
| ``catalog`` | benchmark (c), ``bench_gpu_catalog.py`` | 4 min | 420 s |
| ``batch`` | benchmark (d), ``bench_gpu_batch.py`` | 60 s | 150 s |

The third column: the NVIDIA H200 run of 2026-11-27 (``summary.txt`` of
``../shared/measurements/gpu-h200-2026-11-27``), rounded up; since then the catalog has
rows at 2,000 and 4,000 requests/s, prefetch a third configuration and batch a
side-by-side table, which the estimates include.

A before/after run on one machine: ``--baseline DIR`` names another tree of the project
(``git archive`` of the commit to compare against); each benchmark step then runs that
tree's script first (with that tree's ``src`` first on ``PYTHONPATH``; its table goes
into the summary, marked ``BASELINE``), then ours -- except the catalog, which serves
both trees side by side in one run (``bench_gpu_catalog.py --baseline``: one worker per
tree, their windows alternating, one table). ``--bench-args STEP=ARGS`` gives a
benchmark extra arguments, for both trees (e.g. fewer catalog sizes so that both fit one
device call). docs/gpu.md has the one-call command.

A call that cannot lose its results: each step runs under its own time limit, and
``summary.txt`` is rewritten after every step (and before the first), so a call cut
short -- the device tool ends a command at its limit -- still leaves the summary of
every step that finished and every table written so far. The results, in ``$OUT`` when
set (the device tool brings that folder back), else ``gpu-results/`` (git-ignored), are
seven files, within the tool's limit of eight, with or without a baseline:

* ``summary.txt``: the device, each step's status and seconds, and every table (the
  baseline's first);
* ``tests.log``: pytest's output (``-v``, skip reasons, durations);
* ``bench.log``: everything the ``device`` step and the benchmarks printed;
* ``bench_gpu_bandwidth.txt``, ``bench_gpu_prefetch.txt``, ``bench_gpu_catalog.txt``,
  ``bench_gpu_batch.txt``: the four tables.

    python benchmarks/gpu/run_gpu.py                       # what nox -s gpu runs
    python benchmarks/gpu/run_gpu.py --only tests,catalog  # some steps
    python benchmarks/gpu/run_gpu.py --backend cpu --quick --only device,bandwidth  # no GPU

``--backend cpu --quick`` runs the benchmarks' smoke-test sizes on the CPU (and the
tests as a dry run, ``REACTANT_GPU_DRY_RUN=1``): it checks this driver, not a GPU. The
exit status is 0 only when every step that ran succeeded.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import attrs
from harness import ROOT, describe_device, results_dir

HERE = Path(__file__).resolve().parent

#: Run in the device step: what the driver and JAX see; exit 1 without a GPU.
DEVICE_CHECK = """\
import json, shutil, subprocess, sys
smi = shutil.which("nvidia-smi")
if smi:
    subprocess.run([smi, "-L"], check=False)
try:
    import jax
    gpus = jax.devices("gpu")
    print(f"jax {jax.__version__}: {[d.device_kind for d in gpus]}")
    print(json.dumps({k: int(v) for k, v in (gpus[0].memory_stats() or {}).items()}))
except Exception as exc:
    print(f"no GPU visible to JAX: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    sys.exit(1)
"""


@attrs.frozen
class Step:
    name: str
    #: Seconds it should take on an H100 (an estimate until a GPU run says otherwise).
    expected: float
    limit: float
    log: str


STEPS: tuple[Step, ...] = (
    Step("device", 5, 120, "bench.log"),
    Step("tests", 120, 330, "tests.log"),
    Step("bandwidth", 20, 120, "bench.log"),
    Step("prefetch", 85, 180, "bench.log"),
    Step("catalog", 240, 420, "bench.log"),
    Step("batch", 60, 150, "bench.log"),
)
BENCHES = {
    "bandwidth": "bench_gpu_bandwidth.py",
    "prefetch": "bench_gpu_prefetch.py",
    "catalog": "bench_gpu_catalog.py",
    "batch": "bench_gpu_batch.py",
}


@attrs.frozen
class Outcome:
    step: str
    status: str
    seconds: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "skipped")


def command(
    step: str,
    backend: str,
    quick: bool,
    root: Path = ROOT,
    extra: Sequence[str] = (),
) -> list[str]:
    """The subprocess a step runs (a benchmark: ``root``'s script, with ``extra``)."""
    python = sys.executable
    if step == "device":
        return [python, "-c", DEVICE_CHECK]
    if step == "tests":
        tests = sorted(
            str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "runtime").glob("test_gpu_*.py")
        )
        pytest = ["-p", "no:cacheprovider", "-v", "-rfEs", "--durations=15"]
        return [python, "-m", "pytest", "-m", "gpu", *tests, *pytest]
    flags = ["--backend", backend, *(["--quick"] if quick else []), *extra]
    return [python, str(root / "benchmarks" / "gpu" / BENCHES[step]), *flags]


def bench_args(pairs: Sequence[str]) -> dict[str, list[str]]:
    """``--bench-args STEP=ARGS`` as extra arguments per step (ARGS split like a shell)."""
    out: dict[str, list[str]] = {}
    for pair in pairs:
        step, sep, text = pair.partition("=")
        if not sep or step not in BENCHES:
            raise SystemExit(f"--bench-args: expected STEP=ARGS with STEP one of {list(BENCHES)}")
        out.setdefault(step, []).extend(shlex.split(text))
    return out


def environment(backend: str, root: Path = ROOT) -> dict[str, str]:
    """The steps' environment: ours (``root``'s ``src`` first on the path), unbuffered,
    without a JAX platform list (each worker and benchmark sets it from its backend; the
    tests decide for themselves)."""
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    env["PYTHONUNBUFFERED"] = "1"
    src = str(root / "src")
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT / "src")]
    env["PYTHONPATH"] = os.pathsep.join([src, *rest])
    if backend == "cpu":
        env["REACTANT_GPU_DRY_RUN"] = "1"
    return env


def run_step(
    argv: Sequence[str], log: TextIO, limit: float, env: dict[str, str]
) -> tuple[int | None, str]:
    """Run ``argv``, copying its output to our stdout and ``log``; (exit status or None if
    it was killed at ``limit``, its last non-empty line)."""
    proc = subprocess.Popen(
        list(argv),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,  # its own process group: a timeout kills all of it
    )
    last = [""]

    def copy() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            log.write(line)
            if line.strip():
                last[0] = line.strip()
        log.flush()

    reader = threading.Thread(target=copy, daemon=True)
    reader.start()
    try:
        rc: int | None = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        rc = None
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=15)
                break
            except subprocess.TimeoutExpired:
                continue
    reader.join(30)
    return rc, last[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated steps (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated steps to leave out")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for the whole run")
    parser.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--quick", action="store_true", help="the benchmarks' smoke-test sizes")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default $OUT)")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another tree of the project: run its benchmark scripts first, for a before/after",
    )
    parser.add_argument(
        "--bench-args",
        action="append",
        default=[],
        metavar="STEP=ARGS",
        help="extra arguments for a benchmark step, both trees (repeatable)",
    )
    args = parser.parse_args(argv)
    extra = bench_args(args.bench_args)
    baseline = args.baseline.resolve() if args.baseline else None
    if baseline is not None and not (baseline / "benchmarks" / "gpu").is_dir():
        parser.error(f"--baseline {baseline}: not a tree of the project (no benchmarks/gpu)")
    known = [s.name for s in STEPS]
    only = [s for s in args.only.split(",") if s]
    skip = [s for s in args.skip.split(",") if s]
    unknown = sorted(set(only + skip) - set(known))
    if unknown:
        parser.error(f"unknown step(s) {unknown}; the steps are {known}")
    out = args.out or results_dir()
    out.mkdir(parents=True, exist_ok=True)
    env = environment(args.backend)
    env["OUT"] = str(out)
    for step, script in BENCHES.items():  # no stale table from an earlier run
        if not ((only and step not in only) or step in skip):
            (out / (Path(script).stem + ".txt")).unlink(missing_ok=True)
    started = time.monotonic()
    deadline = started + args.budget
    outcomes: list[Outcome] = []
    logs: dict[str, TextIO] = {}
    stop_reason = ""
    # Baseline tables live outside $OUT (its files are counted); the summary carries them.
    base_tables = Path(tempfile.mkdtemp(prefix="run-gpu-baseline-"))

    def write_summary() -> None:
        """Rewritten after every step: a call cut short still leaves what it measured."""
        text = summary(outcomes, out, time.monotonic() - started, args, base_tables)
        (out / "summary.txt").write_text(text)

    write_summary()
    try:
        for step in STEPS:
            if (only and step.name not in only) or step.name in skip:
                continue
            if stop_reason:
                outcomes.append(Outcome(step.name, "not run", 0.0, stop_reason))
                continue
            left = deadline - time.monotonic()
            if left < step.expected:
                outcomes.append(
                    Outcome(
                        step.name,
                        "skipped",
                        0.0,
                        f"{left:.0f} s of the budget left, it needs about {step.expected:.0f} s",
                    )
                )
                continue
            log = logs.get(step.log)
            if log is None:
                log = logs[step.log] = (out / step.log).open("w")
            step_extra = list(extra.get(step.name, []))
            if baseline is not None and step.name == "catalog":
                # The catalog serves both trees side by side in one run and one table.
                step_extra += ["--baseline", str(baseline)]
            elif baseline is not None and step.name in BENCHES:
                outcomes.append(
                    run_baseline(step, baseline, step_extra, args, base_tables, log, left)
                )
                write_summary()
                left = deadline - time.monotonic()
            argv = command(step.name, args.backend, args.quick, extra=step_extra)
            banner = f"===== {step.name}: {' '.join(argv)}"
            print(banner, flush=True)
            log.write(banner + "\n")
            t0 = time.monotonic()
            limit = min(step.limit, left)
            rc, last = run_step(argv, log, limit, env)
            seconds = time.monotonic() - t0
            if rc is None:
                outcomes.append(
                    Outcome(step.name, "timed out", seconds, f"killed after {limit:.0f} s")
                )
            elif step.name == "device" and rc != 0 and args.backend == "cpu":
                outcomes.append(Outcome(step.name, "ok", seconds, "no GPU: a --backend cpu run"))
            elif rc == 0:
                outcomes.append(Outcome(step.name, "ok", seconds, _summary_of(step.name, last)))
            else:
                outcomes.append(Outcome(step.name, f"failed ({rc})", seconds, last[:160]))
            if step.name == "device" and rc != 0 and args.backend == "cuda":
                stop_reason = "no GPU (see the device step)"
            write_summary()
    finally:
        for log in logs.values():
            log.close()
        write_summary()
        shutil.rmtree(base_tables, ignore_errors=True)
    print((out / "summary.txt").read_text(), flush=True)
    return 0 if all(o.ok for o in outcomes) else 1


def run_baseline(
    step: Step,
    root: Path,
    extra: Sequence[str],
    args: argparse.Namespace,
    folder: Path,
    log: TextIO,
    left: float,
) -> Outcome:
    """``step``'s benchmark from the baseline tree ``root``; its table to ``folder`` (out
    of ``$OUT``: the summary carries it)."""
    (folder / (Path(BENCHES[step.name]).stem + ".txt")).unlink(missing_ok=True)
    env = environment(args.backend, root)
    env["OUT"] = str(folder)
    argv = command(step.name, args.backend, args.quick, root=root, extra=extra)
    banner = f"===== {step.name} (baseline {root}): {' '.join(argv)}"
    print(banner, flush=True)
    log.write(banner + "\n")
    t0 = time.monotonic()
    limit = min(step.limit, left)
    rc, last = run_step(argv, log, limit, env)
    seconds = time.monotonic() - t0
    name = f"{step.name}@base"
    if rc is None:
        return Outcome(name, "timed out", seconds, f"killed after {limit:.0f} s")
    if rc == 0:
        return Outcome(name, "ok", seconds, str(root))
    return Outcome(name, f"failed ({rc})", seconds, last[:160])


def _summary_of(step: str, last: str) -> str:
    if step == "tests":
        found = re.search(r"(\d+ (passed|failed|skipped|error)[^=]*)", last)
        return found.group(1).strip() if found else last
    return ""


def summary(
    outcomes: Sequence[Outcome],
    out: Path,
    seconds: float,
    args: argparse.Namespace,
    base_tables: Path | None = None,
) -> str:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    try:  # the device tool's copy of the tree may have no .git, the machine no git
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    lines = [
        f"nox -s gpu summary, {stamp}, commit {rev or 'unknown'}, backend {args.backend}"
        + (" (quick)" if args.quick else ""),
        f"device: {describe_device()}",
        f"{'step':<10} {'status':<12} {'seconds':>8}  detail",
    ]
    for o in outcomes:
        lines.append(f"{o.step:<10} {o.status:<12} {o.seconds:>8.1f}  {o.detail}")
    lines.append(f"total {seconds:.1f} s of a {args.budget:.0f} s budget; results in {out}")
    folders = [(base_tables, "BASELINE "), (out, "")] if base_tables else [(out, "")]
    for name in BENCHES.values():
        for folder, label in folders:
            table = folder / (Path(name).stem + ".txt")
            if table.is_file():
                text = table.read_text().rstrip()
                lines += ["", f"{label}{text}" if label else text]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
