"""CPU time of a process and its threads, and how busy the machine is, from ``/proc``.

``calibrate`` measures what a worker (and a gateway) spends on the host's cores per request
and per execution. It reads the kernel's own accounting of the process it started -- the
scheduler's nanosecond run time of each thread (``/proc/PID/task/TID/schedstat``), falling
back to the tick counts of ``stat`` where schedstat is absent -- so nothing is added to the
server's hot path and nothing needs a third-party package. The main thread of a worker is
its event loop (asyncio hosting Trio): the RPC path. Every other thread is the device
thread, XLA's pool and the copy threads.

Linux only: elsewhere :func:`available` is False and ``calibrate`` says the host figures
were not measured.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import attrs

__all__ = [
    "MachineLoad",
    "ThreadTimes",
    "available",
    "hungry_threads",
    "machine_busy",
    "start_spinners",
    "thread_times",
]

_PROC = Path("/proc")


def available() -> bool:
    """Whether this machine has the ``/proc`` files read here."""
    return (_PROC / "self" / "stat").is_file()


@attrs.frozen
class ThreadTimes:
    """CPU seconds of one process so far: its main thread, and all its threads."""

    main: float
    total: float

    @property
    def others(self) -> float:
        return self.total - self.main

    def __sub__(self, other: ThreadTimes) -> ThreadTimes:
        return ThreadTimes(self.main - other.main, self.total - other.total)


def _task_seconds(task: Path) -> float:
    try:
        return int((task / "schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    # The tick counts of stat: fields 14 and 15, counted after the ``(comm)`` field.
    text = (task / "stat").read_text()
    rest = text[text.rindex(")") + 2 :].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def thread_times(pid: int) -> ThreadTimes:
    """CPU seconds of ``pid``'s main thread and of all its live threads (``OSError`` when
    the process is gone)."""
    base = _PROC / str(pid) / "task"
    main = _task_seconds(base / str(pid))
    total = 0.0
    for task in base.iterdir():
        try:
            total += _task_seconds(task)
        except (OSError, ValueError):
            continue  # the thread ended while we read
    return ThreadTimes(main, max(total, main))


@attrs.frozen
class MachineLoad:
    """The machine's cores, how many were busy over a short window, and how many threads
    of other processes wanted a core on average (the run queue, this one's sampler
    excluded): what a fleet started now would share the cores with."""

    cores: int
    busy: float
    runnable: float = 0.0


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies over every core, from the first line of /proc/stat."""
    fields = [int(x) for x in (_PROC / "stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _procs_running() -> int:
    for line in (_PROC / "stat").read_text().splitlines():
        if line.startswith("procs_running "):
            return int(line.split()[1])
    return 0


def machine_busy(seconds: float = 1.0, samples: int = 40) -> MachineLoad:
    """Cores busy (out of this process's cores) over ``seconds`` of waiting, and the mean
    run queue over ``samples`` looks at it: what other processes keep busy before a
    calibration starts its own."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    busy0, total0 = _cpu_ticks()
    queue = 0
    for _ in range(samples):
        time.sleep(seconds / samples)
        queue += max(0, _procs_running() - 1)  # this thread, running to read the file
    busy1, total1 = _cpu_ticks()
    all_cores = os.cpu_count() or cores
    share = (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0
    return MachineLoad(
        cores=cores, busy=min(float(cores), share * all_cores), runnable=queue / samples
    )


_SPIN = """
import time
print("spinning", flush=True)
wall = time.monotonic(); cpu = time.process_time(); end = wall + {seconds}
while time.monotonic() < end:
    pass
print(time.process_time() - cpu, time.monotonic() - wall)
"""


def start_spinners(k: int, seconds: float) -> list[Any]:
    """Start ``k`` processes that each spin on a core for ``seconds`` (always runnable:
    what a hungry thread of another process is), and return once every one of them
    spins (each says so on its first line; blocks: call it off an event loop). Each
    prints its CPU and wall seconds on exit (``proc.communicate()``)."""
    import subprocess
    import sys

    code = _SPIN.format(seconds=seconds)
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(k)
    ]
    for proc in procs:
        assert proc.stdout is not None
        proc.stdout.readline()  # "spinning"
    return procs


def hungry_threads(seconds: float = 1.0, spinners: int | None = None) -> tuple[float, float]:
    """How many always-runnable threads of other processes this machine's cores are
    shared with, measured the way a busy fleet would feel them: ``spinners`` processes
    (default: one per core) each spin for ``seconds``; with ``C`` cores and ``b`` hungry
    threads, processor sharing gives them ``k C / (k + b)`` cores together, so
    ``b = k C / obtained - k``. Returns ``(b, cores obtained)``.

    The run queue (:func:`machine_busy`'s ``runnable``) counts threads that want a core at
    one instant, bursts included; this counts what they take from work that wants cores
    all the time -- what a fleet under load competes with."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    k = spinners or cores
    procs = start_spinners(k, seconds)
    obtained = 0.0
    for proc in procs:
        out, _ = proc.communicate()
        cpu, wall = (float(x) for x in out.split())
        obtained += cpu / wall if wall > 0 else 0.0
    obtained = min(float(cores), obtained)
    background = k * cores / obtained - k if obtained > 0 else float(k)
    return max(0.0, background), obtained
