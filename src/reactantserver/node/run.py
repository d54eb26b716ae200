"""``reactantserver node node.yaml``: load, detect, plan, write the children's files, supervise.

The runtime directory holds the files the children read (``node.yaml`` as they run it,
``gateway.yml``): ``--runtime-dir``, else ``REACTANT_RUNTIME_DIR`` (the container sets
``/run/reactantserver``), else a fresh temporary directory removed at exit, so two nodes
on one machine never share one.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from typing import TextIO

import trio

from ..config import load_node
from .plan import NodePlan, plan_node
from .report import describe_plan
from .supervisor import log, supervise

RUNTIME_DIR_VAR = "REACTANT_RUNTIME_DIR"


def available_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask; a container's cpuset)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover -- not Linux
        return list(range(os.cpu_count() or 1))


def make_plan(
    file: str, env: Mapping[str, str], *, runtime_dir: str, log_level: str = "info"
) -> NodePlan:
    """The plan for ``file`` on this machine (raises ``ConfigError``)."""
    node = load_node(file, env)
    return plan_node(node, env, runtime_dir=runtime_dir, cpus=available_cpus(), log_level=log_level)


def write_files(plan: NodePlan) -> None:
    for path, text in plan.files.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.tmp"
        with open(temporary, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(temporary, path)  # a child never reads half a file


def run_node(
    file: str,
    *,
    env: Mapping[str, str] | None = None,
    runtime_dir: str | None = None,
    log_level: str = "info",
    out: TextIO | None = None,
) -> int:
    """Run the node of ``file`` until SIGTERM/SIGINT; return the exit status."""
    environment = dict(os.environ if env is None else env)
    stream = sys.stderr if out is None else out
    chosen = runtime_dir or environment.get(RUNTIME_DIR_VAR) or None
    own_dir = chosen is None
    directory = chosen or tempfile.mkdtemp(prefix="reactantserver-node-")
    try:
        plan = make_plan(file, environment, runtime_dir=directory, log_level=log_level)
        for line in describe_plan(plan):
            log.info("%s", line)
        write_files(plan)
        for path in plan.files:
            log.info("wrote %s", path)

        def sink(line: str) -> None:
            stream.write(line + "\n")
            stream.flush()

        return trio.run(lambda: supervise(plan, env=environment, sink=sink))
    finally:
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)
