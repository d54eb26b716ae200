"""The node plan as text: logged when the supervisor starts, printed by ``reactantserver
config``. One line per child with its device, ports, threads and CPUs, then where clients
connect and the restart budget."""

from __future__ import annotations

from .plan import (
    GATEWAY_GRACE_SECONDS,
    WORKER_GRACE_SECONDS,
    ChildPlan,
    NodePlan,
    cpu_ranges,
)
from .restart import BACKOFF_CAP_SECONDS


def _child_line(child: ChildPlan, width: int) -> str:
    parts = [child.name.ljust(width)]
    if child.kind == "worker":
        parts.append(f"CUDA_VISIBLE_DEVICES={child.device if child.device is not None else ''!s}")
    parts.append(f"gRPC {child.grpc}")
    parts.append(f"metrics {child.metrics}" if child.metrics else "metrics off")
    if child.kind == "worker":
        parts.append(f"threads {child.threads}")
        if child.cpus:
            parts.append(f"cpus {cpu_ranges(child.cpus)}")
    return "  ".join(parts)


def describe_plan(plan: NodePlan) -> list[str]:
    """The plan, one line each (no trailing newlines)."""
    found = plan.detection
    if found.devices:
        devices = f"devices from {found.source}: {', '.join(found.devices)}"
    else:
        devices = f"no device ({found.source})"
    lines = [f"node plan: role {plan.role}; {devices}"]
    width = max((len(c.name) for c in plan.children), default=0)
    lines += ["  " + _child_line(child, width) for child in plan.children]
    if plan.gateway is not None:
        lines.append(f"  gateway endpoints: {', '.join(plan.gateway.endpoints)}")
    if plan.public_grpc:
        metrics = (
            f", /healthz /readyz /metrics on {plan.public_metrics}" if plan.public_metrics else ""
        )
        lines.append(f"  clients connect to gRPC {plan.public_grpc}{metrics}")
    budget = (
        f"at most {plan.max_restarts} in a row, then exit 1"
        if plan.max_restarts
        else "forever (REACTANT_SUPERVISOR_MAX_RESTARTS=0)"
    )
    lines.append(
        f"  restarts: backoff 1 s doubling to {BACKOFF_CAP_SECONDS:g} s, {budget}; "
        f"stop: SIGTERM, grace {GATEWAY_GRACE_SECONDS:g} s gateway then "
        f"{WORKER_GRACE_SECONDS:g} s workers, then SIGKILL"
    )
    lines += [f"  note: {note}" for note in plan.notes]
    return lines
