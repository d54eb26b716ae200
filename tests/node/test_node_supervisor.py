"""The supervisor with real child processes: a stand-in program (tests/node_standin.py)
in place of each child's command, started with the environment, affinity and signals
the plan gives it.

The plans are made by ``plan_node`` from real node files; only ``argv`` is replaced, so
what the stand-ins report (``CUDA_VISIBLE_DEVICES``, thread variables, CPU affinity) is
what a worker would get. Real workers are in tests/node/test_node_cli.py.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import pytest
import trio
from clocks import wait_until

from reactantserver.config import load_node
from reactantserver.node import NodePlan, Supervisor, plan_node, supervise

# Earlier tests of the suite load JAX into this process, and Python warns on every fork of
# a process with threads. The supervisor itself never loads JAX, and between fork and exec
# a child only calls prctl and sched_setaffinity (spawn.py), which take no lock.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")

STANDIN = str(Path(__file__).parent.with_name("node_standin.py"))
U0 = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
U1 = "GPU-9f8e7d6c-0000-1111-2222-333344445555"
FAKE_SMI = f"""#!/bin/sh
[ "$1" = "-L" ] || exit 9
echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: {U0})"
echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: {U1})"
"""


def make_plan(
    tmp_path: Path, text: str, env: Mapping[str, str], *, mode: str = "serve",
    grace: float | None = None,
) -> NodePlan:  # fmt: skip
    """The real plan of ``text``, each child's command replaced by the stand-in."""
    path = tmp_path / "node.yaml"
    path.write_text(text)
    (tmp_path / "models").mkdir(exist_ok=True)  # the model_repo every node file names
    environment = dict(env)
    plan = plan_node(
        load_node(path, environment),
        environment,
        runtime_dir=str(tmp_path / "run"),
        cpus=sorted(os.sched_getaffinity(0)),
    )
    children = []
    for child in plan.children:
        child = attrs.evolve(
            child,
            argv=(sys.executable, STANDIN, *child.argv[3:]),
            env={**child.env, "STANDIN_MODE": mode},
        )
        if grace is not None:
            child = attrs.evolve(child, grace_seconds=grace)
        children.append(child)
    return attrs.evolve(plan, children=tuple(children))


class Lines:
    """The supervisor's sink: every line, with the (Trio) time it arrived."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []
        self.arrived = trio.Event()

    def __call__(self, line: str) -> None:
        self.lines.append((trio.current_time(), line))
        self.arrived.set()
        self.arrived = trio.Event()

    def of(self, name: str) -> list[str]:
        prefix = f"[{name}] "
        return [line[len(prefix) :] for _, line in self.lines if line.startswith(prefix)]

    def reports(self, name: str) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.of(name) if line.startswith("{")]

    async def wait_for(self, ready: Callable[[], bool], timeout: float = 60.0) -> None:
        with trio.fail_after(timeout):
            while not ready():
                await self.arrived.wait()


async def start(
    nursery: trio.Nursery, plan: NodePlan, env: Mapping[str, str], sink: Lines
) -> tuple[Supervisor, list[int]]:
    status: list[int] = []

    async def run(task_status: trio.TaskStatus[Supervisor]) -> None:
        status.append(
            await supervise(plan, env=env, sink=sink, handle_signals=False, task_status=task_status)
        )

    return await nursery.start(run), status


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


async def test_a_fake_nvidia_smi_gives_each_child_exactly_its_device(tmp_path: Path) -> None:
    """``nvidia-smi -L`` (a fake one, on PATH) lists two GPUs; each worker child is started
    with exactly its own GPU's UUID in CUDA_VISIBLE_DEVICES, its name, its thread budget
    and its own CPUs, and the gateway with no device setting of its own."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("REACTANT_GPUS", None)
    text = "model_repo: models\nbase_port: 18300\nglobal:\n  runtime: {backend: cuda}\n"
    plan = make_plan(tmp_path, text, env)
    assert plan.detection.source == "nvidia-smi -L"
    sink = Lines()
    async with trio.open_nursery() as nursery:
        supervisor, status = await start(nursery, plan, env, sink)
        names = ("gateway", "worker0", "worker1")
        await sink.wait_for(lambda: all(sink.reports(n) for n in names))
        supervisor.request_stop()
    assert status == [0]
    cpus = sorted(os.sched_getaffinity(0))
    for name, device in (("worker0", U0), ("worker1", U1)):
        (report,) = sink.reports(name)
        env_seen = report["env"]
        assert isinstance(env_seen, dict)
        assert env_seen["CUDA_VISIBLE_DEVICES"] == device
        assert env_seen["REACTANT_WORKER_NAME"] == name
        threads = str(max(1, min(len(cpus) // 2, 16)))
        assert env_seen["REACTANT_WORKER_THREADS"] == env_seen["OMP_NUM_THREADS"] == threads
        child = next(c for c in plan.children if c.name == name)
        assert report["cpus"] == list(child.cpus)
        assert report["argv"] == ["serve", str(tmp_path / "run" / "node.yaml"), "--worker", name,
                                  "--log-level", "info"]  # fmt: skip
        assert f"stopping {name}" in sink.of(name)
    (gateway,) = sink.reports("gateway")
    assert gateway["env"] == {}  # the supervisor's own environment has no device setting
    assert gateway["argv"] == ["gateway", str(tmp_path / "run" / "gateway.yml")]


CPU_NODE = "model_repo: models\nbase_port: 18400\nmetrics_base_port: 18500\n"


async def test_output_is_relayed_line_by_line_with_the_child_name(tmp_path: Path) -> None:
    env = {**os.environ, "REACTANT_ROLE": "workers"}
    plan = make_plan(tmp_path, CPU_NODE, env, mode="chatty")
    sink = Lines()
    async with trio.open_nursery() as nursery:
        supervisor, status = await start(nursery, plan, env, sink)
        await sink.wait_for(lambda: "no newline at the end" in sink.of("worker0"))
        supervisor.request_stop()
    assert status == [0]
    lines = [line for line in sink.of("worker0") if not line.startswith("{")]  # no report
    # stdout and stderr are two pipes: each keeps its order, the two interleave freely.
    assert [line for line in lines if line not in ("err one", "stopping worker0")] == [
        "out one",
        "out two",
        "no newline at the end",
    ]
    assert lines.count("err one") == 1


async def test_a_crashing_child_backs_off_then_the_budget_stops_the_node(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A child that crashes at once is restarted after 1 s, then 2 s; with
    REACTANT_SUPERVISOR_MAX_RESTARTS=2 the third crash in a row stops the node, exit 1."""
    caplog.set_level(logging.INFO, "reactantserver.node")
    env = {**os.environ, "REACTANT_SUPERVISOR_MAX_RESTARTS": "2"}
    plan = make_plan(tmp_path, CPU_NODE, env, mode="crash")
    sink = Lines()
    async with trio.open_nursery() as nursery:
        supervisor, status = await start(nursery, plan, env, sink)
    assert status == [1]
    assert supervisor.starts() == {"worker0": 3}
    starts = [at for at, line in sink.lines if line.startswith("[worker0] {")]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(gaps) == 2
    assert 1.0 <= gaps[0] < 2.0 + 5  # 1 s backoff (plus a loaded machine's start time)
    assert 2.0 <= gaps[1] < 4.0 + 5
    messages = [r.getMessage() for r in caplog.records if r.name == "reactantserver.node"]
    assert "worker0 exited with status 3" in messages
    assert "restarting worker0 in 1 s (restart 1 in a row)" in messages
    assert "restarting worker0 in 2 s (restart 2 in a row)" in messages
    assert (
        "worker0 failed 3 times in a row; REACTANT_SUPERVISOR_MAX_RESTARTS=2 allows 2 "
        "restart(s): stopping the node" in messages
    )
    assert messages[-1] == "node stopped (exit status 1)"


async def test_stop_goes_front_to_back_and_kills_what_outlives_its_grace(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway is asked to stop (and gone) before any worker is; a child that ignores
    SIGTERM is SIGKILLed after its grace period and the node exits 1."""
    caplog.set_level(logging.INFO, "reactantserver.node")
    env = {**os.environ, "REACTANT_CPU_WORKERS": "2"}
    plan = make_plan(tmp_path, CPU_NODE, env)
    stubborn = attrs.evolve(
        plan.children[2], env={**plan.children[2].env, "STANDIN_MODE": "stubborn"},
        grace_seconds=1.0,
    )  # fmt: skip
    plan = attrs.evolve(plan, children=(*plan.children[:2], stubborn))
    sink = Lines()
    async with trio.open_nursery() as nursery:
        supervisor, status = await start(nursery, plan, env, sink)
        await sink.wait_for(lambda: all(sink.reports(c.name) for c in plan.children))
        pids = supervisor.pids()
        supervisor.request_stop()
    assert status == [1]
    order = [line for _, line in sink.lines if "stopping" in line or "ignoring" in line]
    assert order[0] == "[gateway] stopping gateway"
    assert set(order[1:]) == {"[worker0] stopping worker0", "[worker1] ignoring SIGTERM"}
    messages = [r.getMessage() for r in caplog.records if r.name == "reactantserver.node"]
    assert "worker1 did not stop within its 1 s grace period: SIGKILL" in messages
    assert not any(alive(pid) for pid in pids.values())


def test_a_sigkilled_supervisor_leaves_no_child_behind(tmp_path: Path) -> None:
    """The children get SIGKILL from the kernel when the supervisor dies (parent-death
    signal), also when the supervisor itself is SIGKILLed and cannot forward anything."""
    env = {**os.environ, "REACTANT_CPU_WORKERS": "2", "REACTANT_ROLE": "workers"}
    plan = make_plan(tmp_path, CPU_NODE, env)
    driver = textwrap.dedent(
        f"""
        import pickle, sys, trio
        from reactantserver.node import supervise
        plan = pickle.loads(bytes.fromhex({__import__("pickle").dumps(plan).hex()!r}))
        sink = lambda line: (sys.stdout.write(line + "\\n"), sys.stdout.flush())
        trio.run(lambda: supervise(plan, sink=sink))
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True, env=env
    )
    pids: list[int] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("[worker") and "{" in line:
                pids.append(json.loads(line.split(" ", 1)[1])["pid"])
        assert len(pids) == 2, "the children did not start"
        assert all(alive(pid) for pid in pids)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        wait_until(lambda: not any(alive(pid) for pid in pids), what="the children gone")
    finally:
        proc.kill()
        proc.wait()
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
