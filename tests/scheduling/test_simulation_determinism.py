"""A seed gives the same simulation table on any machine, loaded or not.

docs/scheduling.md and docs/fleet.md print the simulators' tables, and
tests/docs/test_docs_output.py compares them with a fresh run. A fresh clone failed that
(issue 42): ``dispatches=16408 utilization=98.5%`` against the page's 16411 / 98.4 %.
The cause was not load but the CPU: numpy picks its ``np.exp2`` kernel by the CPU it
finds (AVX-512 or not), the kernels differ in the last bit, and one flipped comparison
of two fair priorities changes every dispatch after it. glibc's ``exp``/``log``/``pow``
have FMA variants chosen the same way. ``reactantserver.floatmath`` replaced both in
the simulation path.

Each test here runs a short version of a page's simulation (the same flags, fewer
virtual seconds) in a subprocess three ways and requires the same output:

* plainly;
* as a machine without AVX-512, AVX2 or FMA runs it: numpy's dispatched CPU features
  off (``NPY_DISABLE_CPU_FEATURES``) and glibc's FMA and AVX2 variants off
  (``GLIBC_TUNABLES``);
* beside a CPU hog the test starts itself (a loaded machine).

On a machine with AVX-512 the scheduling run differed before floatmath (the fleet run
is a guard: what it prints did not change); on one without, the numpy half of the check
has nothing to turn off and passes anyway.
Nothing here reads a clock: the hogs only make the machine busy.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: glibc >= 2.33 names; older ones ignore unknown names (the check then covers less).
GLIBC_OFF = "glibc.cpu.hwcaps=-AVX2,-FMA,-FMA4,-AVX512F"

SIMULATIONS = {
    # docs/scheduling.md's partly idle mix under fair, shortened: the block that failed
    # (30 virtual seconds are enough for the old np.exp2 to change the table here).
    "scheduling": shlex.split(
        "examples/simulate.py --load 0.8 --timeout 1 --discipline fair --rows 8 "
        "--duration 30 --warmup 5"
    ),
    # docs/fleet.md's comparison, shortened: the catalog's log-uniform draws, the
    # arrivals and the packer's EWMAs (a guard: its printed table did not differ before).
    "fleet": shlex.split("examples/simulate_fleet.py --duration 15 --warmup 5 --modes lpt_packing"),
}


def _dispatched_features() -> str:
    """numpy's dispatch targets this CPU has (what a CPU without them would not run)."""
    from numpy._core._multiarray_umath import (  # type: ignore[attr-defined]
        __cpu_dispatch__,
        __cpu_features__,
    )

    return " ".join(f for f in __cpu_dispatch__ if __cpu_features__.get(f))


def _run(args: list[str], extra: dict[str, str]) -> str:
    env = {**os.environ, **extra}
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    assert "numpy" not in done.stderr, done.stderr  # a refused NPY_DISABLE_CPU_FEATURES
    # How long the simulation took in real time is the one thing that may differ.
    return re.sub(r"simulated in \d+\.\d+ s", "simulated in N s", done.stdout)


@contextlib.contextmanager
def _hogs() -> Iterator[None]:
    """A busy process beside the simulation for the duration of the block (one: a
    simulation slowed down is all it takes to show, and CI has two cores)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SIMULATIONS))
def test_the_same_table_on_another_cpu_and_under_load(name: str) -> None:
    args = SIMULATIONS[name]
    plain = _run(args, {})
    other_cpu = {"GLIBC_TUNABLES": GLIBC_OFF}
    if features := _dispatched_features():
        other_cpu["NPY_DISABLE_CPU_FEATURES"] = features
    assert _run(args, other_cpu) == plain, f"{name}: another CPU's numpy/libm changed the table"
    with _hogs():
        assert _run(args, {}) == plain, f"{name}: a loaded machine changed the table"
