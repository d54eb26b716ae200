"""The node supervisor: run a ``NodePlan``'s children, restart the ones that crash, stop
them in order.

Theory of operation
-------------------
One Trio nursery holds a task per child (``_keep_running``): start it (``spawn.start``),
relay its output, wait for its exit, ask its ``RestartPolicy`` what to do, sleep the
backoff (woken early by a stop), start it again. A policy that gives up stops the node
with exit status 1.

**Restarts are for crashes.** A child that exits with a status in :data:`FINAL_STATUSES`
-- 2, a configuration error, or 78 (``EX_CONFIG``), an environment that does not allow
what the configuration asks, such as a port another process holds -- would fail the same
way on every restart. The node stops at once instead: the supervisor repeats the child's
error lines (what ``serve`` / ``gateway`` print as ``reactantserver <command>: ...``, kept
from its last lines of output), says why it does not restart, and exits with that status.

Stopping (SIGTERM or SIGINT to the supervisor, or the ``stop`` event) goes front to
back, so that every request the node accepted is answered: first the gateway gets
SIGTERM and its grace period (it drains what it is forwarding while the workers still
serve), then every worker gets SIGTERM and its own grace period (it answers what it
accepted and exits 0). A child still running at the end of its grace period is
SIGKILLed. A second signal during the stop SIGKILLs every child at once.

Exit status: 0 when every child stopped by itself within its grace period; 1 when the
restart budget ran out or a child had to be killed; a child's 2 or 78 when it exited with
it (the first such child's).

Invariants: a child is never started once the stop has begun; at most one process per
child exists at a time (the next is started only after the previous one was reaped);
``supervise`` returns only after every child it started has been reaped.
"""

from __future__ import annotations

import collections
import logging
import os
import secrets
import signal
from collections.abc import Callable, Mapping

import attrs
import trio

from . import spawn
from .plan import NODE_KEY_VAR, ChildPlan, NodePlan, cpu_ranges
from .restart import GiveUp, RestartPolicy

log = logging.getLogger("reactantserver.node")

#: After a child exits, how long its output may take to finish arriving (a grandchild
#: holding the pipe open must not hold the supervisor up).
DRAIN_OUTPUT_SECONDS = 5.0
#: Exit statuses that mean "a restart would fail the same way" (the contract of
#: ``reactantserver serve`` and ``gateway``: startup.py), with what each one says.
FINAL_STATUSES: Mapping[int, str] = {
    2: "a configuration error",
    78: "a configuration or environment error (EX_CONFIG)",
}
#: How many of a child's last output lines are kept to repeat its error.
KEPT_LINES = 20
#: The prefix of the command line's own error lines (``reactantserver serve: ...``).
ERROR_PREFIX = "reactantserver "


def error_lines(lines: collections.abc.Iterable[str]) -> list[str]:
    """The command line's error lines (``reactantserver serve: ...``) among a child's last
    lines of output, without the hint about tracebacks; the last line when there is none."""
    said = [line for line in lines if line.strip()]
    out = [s for s in said if s.startswith(ERROR_PREFIX) and "--log-level debug" not in s]
    return out or said[-1:]


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


@attrs.define
class _Slot:
    """One child of the plan and its current process, if any."""

    plan: ChildPlan
    policy: RestartPolicy
    process: spawn.Child | None = None
    #: Set when the current process has been reaped.
    gone: trio.Event = attrs.field(factory=trio.Event)
    starts: int = 0
    #: The current (or last) process's last lines of output (no relay prefix), for its error.
    tail: collections.deque[str] = attrs.field(factory=lambda: collections.deque(maxlen=KEPT_LINES))


class Supervisor:
    """The running node. ``supervise`` builds one; tests get it from ``task_status``."""

    def __init__(self, plan: NodePlan, env: Mapping[str, str], sink: Callable[[str], None]) -> None:
        self.plan = plan
        self._env = dict(env)
        # The key the node's gateway presents to its workers (plan.py: NODE_KEY_VAR), made
        # for this run, known to its children only.
        self._env.setdefault(NODE_KEY_VAR, secrets.token_hex(32))
        self._sink = sink
        self._slots = [_Slot(child, RestartPolicy(plan.max_restarts)) for child in plan.children]
        self.stop_requested = trio.Event()
        self.exit_status = 0
        #: Set whenever any child has been started; tests wait on it (and pids()).
        self.changed = trio.Event()

    # ------------------------------------------------------------------ inspection

    def pids(self) -> dict[str, int]:
        """name -> pid of every child running now."""
        return {s.plan.name: s.process.pid for s in self._slots if s.process is not None}

    def starts(self) -> dict[str, int]:
        """name -> how many times the child has been started."""
        return {s.plan.name: s.starts for s in self._slots}

    # ------------------------------------------------------------------ control

    def request_stop(self, status: int = 0) -> None:
        if not self.stop_requested.is_set():
            self.exit_status = max(self.exit_status, status)
            self.stop_requested.set()

    def kill_all(self) -> None:
        for slot in self._slots:
            if slot.process is not None:
                slot.process.send_signal(signal.SIGKILL)

    async def run(self, task_status: trio.TaskStatus[Supervisor]) -> int:
        async with trio.open_nursery() as nursery:
            for slot in self._slots:
                nursery.start_soon(self._keep_running, slot)
            task_status.started(self)
            await self.stop_requested.wait()
            await self._stop_children()
            nursery.cancel_scope.cancel()
        log.info("node stopped (exit status %d)", self.exit_status)
        return self.exit_status

    # ------------------------------------------------------------------ one child

    def _announce(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def _keep_running(self, slot: _Slot) -> None:
        child = slot.plan
        while not self.stop_requested.is_set():  # never start a child once a stop began
            slot.gone = trio.Event()
            try:
                process = spawn.start(child.argv, {**self._env, **child.env}, cpus=child.cpus)
            except OSError as exc:
                slot.gone.set()
                log.error("cannot start %s: %s", child.name, exc)
                code = None
            else:
                slot.process = process
                slot.starts += 1
                slot.policy.started(trio.current_time())
                log.info("started %s (pid %d)%s", child.name, process.pid, _device_note(child))
                self._announce()
                code = await self._wait(slot, process)
            if self.stop_requested.is_set():
                return
            if code is not None and code in FINAL_STATUSES:
                self._give_up_at_once(slot, code)
                return
            decision = slot.policy.exited(trio.current_time())
            if code is not None:
                log.warning("%s %s", child.name, describe_exit(code))
            if isinstance(decision, GiveUp):
                log.error(
                    "%s failed %d times in a row; %s=%d allows %d restart(s): stopping the node",
                    child.name,
                    decision.failures,
                    "REACTANT_SUPERVISOR_MAX_RESTARTS",
                    decision.max_restarts,
                    decision.max_restarts,
                )
                self.request_stop(1)
                return
            log.info(
                "restarting %s in %g s (restart %d in a row)",
                child.name,
                decision.delay,
                decision.attempt,
            )
            with trio.move_on_after(decision.delay):
                await self.stop_requested.wait()

    def _give_up_at_once(self, slot: _Slot, code: int) -> None:
        """``slot``'s child exited with a status a restart cannot change: stop the node."""
        name = slot.plan.name
        for line in error_lines(slot.tail):
            log.error("%s: %s", name, line)
        log.error(
            "%s exited with status %d, %s: a restart would fail the same way, so the node "
            "stops (fix what the line above says, then start it again)",
            name,
            code,
            FINAL_STATUSES[code],
        )
        self.request_stop(code)

    async def _wait(self, slot: _Slot, process: spawn.Child) -> int:
        name = slot.plan.name
        slot.tail.clear()
        relayed = f"[{name}] "  # what spawn.relay_lines puts before each line

        def sink(line: str) -> None:
            slot.tail.append(line.removeprefix(relayed))
            self._sink(line)

        async with trio.open_nursery() as relays:
            relays.start_soon(spawn.relay_lines, process.stdout, name, sink)
            relays.start_soon(spawn.relay_lines, process.stderr, name, sink)
            try:
                code = await process.wait()
            except BaseException:
                # Cancelled from outside (not the node's own stop): leave nothing running.
                process.kill_and_reap()
                raise
            finally:
                slot.process = None
                slot.gone.set()
            relays.cancel_scope.deadline = trio.current_time() + DRAIN_OUTPUT_SECONDS
        return code

    # ------------------------------------------------------------------ stopping

    async def _stop_children(self) -> None:
        front = [s for s in self._slots if s.plan.kind == "gateway"]
        back = [s for s in self._slots if s.plan.kind != "gateway"]
        for stage in (front, back):
            running = [s for s in stage if s.process is not None]
            for slot in running:
                log.info("stopping %s (SIGTERM)", slot.plan.name)
                assert slot.process is not None
                slot.process.send_signal(signal.SIGTERM)
            async with trio.open_nursery() as waits:
                for slot in running:
                    waits.start_soon(self._await_exit, slot)

    async def _await_exit(self, slot: _Slot) -> None:
        with trio.move_on_after(slot.plan.grace_seconds):
            await slot.gone.wait()
            return
        if slot.process is not None:
            log.warning(
                "%s did not stop within its %g s grace period: SIGKILL",
                slot.plan.name,
                slot.plan.grace_seconds,
            )
            self.exit_status = 1
            slot.process.send_signal(signal.SIGKILL)
        await slot.gone.wait()


def _device_note(child: ChildPlan) -> str:
    if child.kind != "worker":
        return ""
    device = child.device if child.device is not None else "(none: CPU)"
    cpus = f", cpus {cpu_ranges(child.cpus)}" if child.cpus else ""
    return f": CUDA_VISIBLE_DEVICES={device}, gRPC {child.grpc}{cpus}"


async def supervise(
    plan: NodePlan,
    *,
    env: Mapping[str, str] | None = None,
    sink: Callable[[str], None],
    handle_signals: bool = True,
    task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED,
) -> int:
    """Run the node until SIGTERM/SIGINT (or ``request_stop``); return the exit status.

    ``env`` is the environment children inherit (default ``os.environ``); ``sink`` gets
    every line of their output, prefixed with the child's name.
    """
    supervisor = Supervisor(plan, os.environ if env is None else env, sink)
    if not handle_signals:
        return await supervisor.run(task_status)
    async with trio.open_nursery() as nursery:

        async def on_signals(task_status: trio.TaskStatus[None]) -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                task_status.started()
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if not supervisor.stop_requested.is_set():
                        log.info("received %s: stopping the node", name)
                        supervisor.request_stop(0)
                    else:
                        log.warning("received %s again: killing every child now", name)
                        supervisor.exit_status = 1
                        supervisor.kill_all()

        await nursery.start(on_signals)
        status = await supervisor.run(task_status)
        nursery.cancel_scope.cancel()
    return status
