"""The node supervisor: one worker process per GPU from one node file (docs/node.md).

JAX-free: the supervisor never touches a device; each child it starts does.

    detect(...)          -> Detection      which devices, from which source (devices.py)
    assign(node, detection, env)           which device each worker gets (assign.py)
    plan_node(...)       -> NodePlan       the children, their argv/env/ports (plan.py)
    describe_plan(plan)  -> list[str]      the plan as text, one line a child (report.py)
    materialized_node(...), gateway_document(...)   the files the children read (files.py)
    RestartPolicy                          backoff and restart budget, sans-IO (restart.py)
    start(argv, env)     -> Child          a child that dies with the supervisor (spawn.py)
    supervise(plan, ...) -> int            run the children under Trio (supervisor.py)
    run_node(file, ...)  -> int            ``reactantserver node`` (run.py)
    python -m reactantserver.node.healthcheck   exit 0 when the node is ready (healthcheck.py)
"""

from .devices import Detection, detect
from .plan import ChildPlan, NodePlan, plan_node, worker_threads
from .report import describe_plan
from .restart import GiveUp, Restart, RestartPolicy
from .run import run_node
from .supervisor import Supervisor, supervise

__all__ = [
    "ChildPlan",
    "Detection",
    "GiveUp",
    "NodePlan",
    "Restart",
    "RestartPolicy",
    "Supervisor",
    "describe_plan",
    "detect",
    "plan_node",
    "run_node",
    "supervise",
    "worker_threads",
]
