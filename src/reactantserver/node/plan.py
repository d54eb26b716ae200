"""The node plan: which children a node runs, each with its command, environment and ports.

Theory of operation
-------------------
``plan_node`` is a pure function of the node file, the supervisor's environment, the
device detection and the CPUs it may use; it returns a frozen ``NodePlan`` that the
supervisor carries out and ``reactantserver config`` prints. Nothing is started here.

1. **Role** (``REACTANT_ROLE``): ``all`` (default) runs the workers and, for two or more,
   the gateway; ``workers`` only the workers; ``gateway`` only the gateway.
2. **Devices** (``devices.detect``, then ``assign``). A node whose every worker runs
   ``runtime.backend: cpu`` is a CPU node without looking at hardware (naming GPUs for it
   in ``REACTANT_GPUS`` / ``gpus:`` is a conflict). A CUDA node where no source finds a
   device is an error listing every source tried, unless an operator said ``0`` on
   purpose and the workers may fall back to the CPU.
3. **Workers.** Explicit ``workers:`` win: worker *i* takes device *i*, or the device its
   ``gpu: N`` names. Otherwise one worker per device (``worker0..N-1``), and on a CPU node
   ``REACTANT_CPU_WORKERS`` (default 1).
4. **Ports.** Worker *i* serves ``base_port + i`` / ``metrics_base_port + i``. A node's
   public addresses are its gateway's ``listen.grpc`` / ``listen.metrics`` (the node's
   ``gateway:`` block or a gateway.yml, default 8001 / 8002): with role ``all`` and one
   worker, no gateway runs and that worker binds the public addresses itself (the
   gateway's host and ports); with two or more, the gateway binds them and the workers
   listen on their own ``endpoints.host`` (loopback, by default) behind it. Ports must not collide.
5. **Files** (``files``). The node file as the children run it (``node.yaml``: workers listed, paths
   absolute, device assignment in a header comment) and, when a gateway runs, its
   effective ``gateway.yml`` (``resolve_gateway``: endpoints = the workers,
   ``startup_wait_seconds: .inf``, ``expected_models`` = the models the node assigns to
   its workers), both in the runtime directory.
6. **Children.** A worker runs ``reactantserver serve node.yaml --worker NAME`` with its
   single device in ``CUDA_VISIBLE_DEVICES`` (``""`` on a CPU node, so an inherited value
   never leaks), ``REACTANT_WORKER_NAME``, and its thread budget
   ``min(cores // workers, 16)`` (``REACTANT_WORKER_THREADS`` overrides) in
   ``REACTANT_WORKER_THREADS`` / ``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS`` /
   ``MKL_NUM_THREADS``, plus its own share of the CPUs as affinity (which also bounds
   XLA's CPU thread pool, sized from the affinity mask); the event loop is one more
   thread. The gateway runs ``reactantserver gateway gateway.yml``.

Every worker's configuration is resolved here exactly as the child will resolve it (the
file, the inherited environment and the variables above), so a bad override or a port
collision stops the node before anything starts instead of crash-looping one child.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

import attrs

from ..config import env as envmod
from ..config import materialize_workers, resolve_gateway, resolve_worker
from ..config.gateway import connect_host
from ..config.node import worker_names
from ..config.schema import GatewayConfig, NodeConfig, ServerConfig
from ..config.source import EnvOrigin, fail, show
from . import devices as devmod
from .assign import CPU_WORKERS_VAR, assign, decide_devices, int_var
from .devices import Detection
from .files import gateway_document, materialized_node

Role = Literal["all", "workers", "gateway"]
ROLES: tuple[Role, ...] = ("all", "workers", "gateway")

ROLE_VAR = "REACTANT_ROLE"
THREADS_VAR = "REACTANT_WORKER_THREADS"
MAX_RESTARTS_VAR = "REACTANT_SUPERVISOR_MAX_RESTARTS"
#: Thread-pool variables of the native libraries a worker may load (numpy's BLAS, OpenMP).
LIBRARY_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

#: A worker's thread budget is its share of the cores, capped: a bigger pool only adds
#: contention to a process that runs one device execution at a time.
MAX_WORKER_THREADS = 16
#: SIGTERM-to-SIGKILL windows. A worker answers what it accepted (its own drain is
#: bounded at 30 s, but a healthy one finishes in well under 15); the gateway only
#: forwards, and stops first.
WORKER_GRACE_SECONDS = 15.0
GATEWAY_GRACE_SECONDS = 10.0


@attrs.frozen
class ChildPlan:
    """One child process of the node, exactly as it will be started."""

    name: str
    kind: Literal["worker", "gateway"]
    argv: tuple[str, ...]
    #: What the supervisor sets over its own environment (the child inherits the rest).
    env: Mapping[str, str]
    grace_seconds: float
    #: The child's ``CUDA_VISIBLE_DEVICES`` token; None = no device (a CPU node, the gateway).
    device: str | None = None
    #: ``host:port`` of its gRPC and admin listeners ("" = none).
    grpc: str = ""
    metrics: str = ""
    #: Thread budget (0 for the gateway, which is not sized).
    threads: int = 0
    #: CPU affinity; empty = inherit the supervisor's.
    cpus: tuple[int, ...] = ()
    #: The configuration the worker will run with (None for the gateway).
    config: ServerConfig | None = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen
class NodePlan:
    """Everything the supervisor does, decided before it starts anything."""

    role: Role
    detection: Detection
    children: tuple[ChildPlan, ...]
    #: path -> contents, written before any child starts.
    files: Mapping[str, str]
    #: Where clients connect (the gateway, or the sole worker); "" when nothing is public.
    public_grpc: str
    public_metrics: str
    #: Consecutive restarts allowed per child; 0 = forever.
    max_restarts: int
    notes: tuple[str, ...] = ()
    gateway: GatewayConfig | None = attrs.field(default=None, eq=False, repr=False)


def worker_threads(cores: int, workers: int) -> int:
    """A worker's thread budget: its share of the cores, at least 1, at most 16."""
    return max(1, min(cores // max(workers, 1), MAX_WORKER_THREADS))


def cpu_shares(cpus: Sequence[int], workers: int) -> list[tuple[int, ...]]:
    """Split the CPUs into ``workers`` disjoint, near-equal runs; with fewer CPUs than
    workers, each worker gets one CPU, shared round-robin."""
    if not cpus:
        return [() for _ in range(workers)]
    if len(cpus) < workers:
        return [(cpus[i % len(cpus)],) for i in range(workers)]
    size, extra = divmod(len(cpus), workers)
    out, at = [], 0
    for i in range(workers):
        take = size + (1 if i < extra else 0)
        out.append(tuple(cpus[at : at + take]))
        at += take
    return out


def cpu_ranges(cpus: tuple[int, ...]) -> str:
    """``(0, 1, 2, 5)`` -> ``0-2,5``."""
    out: list[str] = []
    start = prev = cpus[0]
    for cpu in (*cpus[1:], None):
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(out)


def read_role(env: Mapping[str, str]) -> Role:
    text = env.get(ROLE_VAR, "").strip().lower() or "all"
    for role in ROLES:
        if text == role:
            return role
    fail(EnvOrigin(ROLE_VAR), f"expected one of {', '.join(ROLES)}; got {show(env[ROLE_VAR])}")


def split_address(address: str) -> tuple[str, int]:
    """``"0.0.0.0:8001"`` / ``"[::]:8001"`` -> host and port (already checked by the rules)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


# --- the plan ------------------------------------------------------------------------------------


def node_gateway(node: NodeConfig, env: Mapping[str, str]) -> tuple[GatewayConfig, str | None]:
    """The gateway ``reactantserver node`` runs in front of ``node``'s workers under
    ``env``'s role, and the gateway.yml it read (None: the node file's ``gateway:`` block
    and the defaults). ``reactantserver config NODE --gateway`` prints this, so the two
    agree (issue 42: the command printed defaults and ignored the gateway.yml beside)."""
    gateway_env, file = _gateway_env(node, env)
    return _embedded_gateway(node, gateway_env, read_role(env)), file


def _embedded_gateway(node: NodeConfig, gateway_env: Mapping[str, str], role: str) -> GatewayConfig:
    """The gateway in front of ``node``'s workers under ``role``: when the node runs the
    workers too (role ``all``) it waits for their restarts and presents the node key."""
    gateway = resolve_gateway(node, gateway_env, restarts_workers=role == "all")
    return _with_node_key(gateway) if role == "all" else gateway


def _gateway_env(node: NodeConfig, env: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """The environment to resolve the embedded gateway with: a ``gateway.yml`` beside the
    node file is used when ``REACTANT_GATEWAY_FILE`` names none (the container mounts
    both under /etc/reactantserver)."""
    out = dict(env)
    if out.get(envmod.GATEWAY_FILE_VAR) or node.source.file.startswith("<"):
        return out, out.get(envmod.GATEWAY_FILE_VAR) or None
    beside = os.path.join(os.path.dirname(os.path.abspath(node.source.file)), "gateway.yml")
    if os.path.isfile(beside) and os.path.abspath(beside) != os.path.abspath(node.source.file):
        out[envmod.GATEWAY_FILE_VAR] = beside
        return out, beside
    return out, None


def _check_ports(
    children: Sequence[ChildPlan], gateway_listen: Sequence[tuple[str, str]], node: NodeConfig
) -> None:
    taken: dict[int, str] = {}
    for what, address in gateway_listen:
        port = split_address(address)[1]
        if port:
            taken[port] = what
    for child in children:
        for kind, address in (("gRPC", child.grpc), ("metrics", child.metrics)):
            if not address:
                continue
            port = split_address(address)[1]
            if port in taken:
                fail(
                    node.source.origin(("base_port",)),
                    f"expected a port of its own for {child.name}'s {kind} listener; "
                    f"{port} is also {taken[port]} (change base_port / metrics_base_port, "
                    "the gateway's listen:, or the INFERENCE_SERVER_ENDPOINTS_* overrides)",
                )
            taken[port] = f"{child.name}'s {kind} port"


def _worker_children(
    node: NodeConfig,
    assignment: Sequence[str | None],
    env: Mapping[str, str],
    cpus: Sequence[int],
    public: tuple[int, int, str] | None,
    command: tuple[str, str, str],
    *,
    fronted: bool = False,
) -> list[ChildPlan]:
    """One child per worker of ``node`` (the node as the children read it); ``public`` is
    the (gRPC port, metrics port, host) a sole public worker binds; ``fronted``: the node's
    gateway runs in front of them."""
    python, node_path, log_level = command
    names = worker_names(node)
    threads = int_var(env, THREADS_VAR, worker_threads(len(cpus), len(names)), 1)
    shares = cpu_shares(cpus, len(names))
    children = []
    for index, name in enumerate(names):
        device = assignment[index]
        child_env = {
            envmod.WORKER_NAME_VAR: name,
            devmod.VISIBLE_VAR: device if device is not None else "",
            THREADS_VAR: str(threads),
            **{var: str(threads) for var in LIBRARY_THREAD_VARS},
            "PYTHONUNBUFFERED": "1",
        }
        if public is not None:
            # The node's public address is its gateway's, host included: the workers'
            # endpoints.host is where they listen behind a gateway (loopback).
            child_env["INFERENCE_SERVER_ENDPOINTS_HOST"] = public[2]
            child_env["INFERENCE_SERVER_ENDPOINTS_PORT"] = str(public[0])
            child_env["INFERENCE_SERVER_ENDPOINTS_METRICS_PORT"] = str(public[1])
        elif fronted and not _trusts_a_gateway(resolve_worker(node, name, env)):
            # Behind the node's own gateway: trust it by the key the supervisor makes.
            child_env[WORKER_TRUST_VAR] = NODE_KEY_VAR
        # Exactly what the child will resolve: a bad override fails here, not in a loop.
        cfg = resolve_worker(node, name, {**env, **child_env})
        host = _bracket(cfg.endpoints.host)
        metrics = cfg.endpoints.metrics_port
        argv = ("-m", "reactantserver.cli", "serve", node_path, "--worker", name)
        children.append(
            ChildPlan(
                name=name,
                kind="worker",
                argv=(python, *argv, "--log-level", log_level),
                env=child_env,
                grace_seconds=WORKER_GRACE_SECONDS,
                device=device,
                grpc=f"{host}:{cfg.endpoints.port}",
                metrics=f"{host}:{metrics}" if metrics else "",
                threads=threads,
                cpus=shares[index],
                config=cfg,
            )
        )
    return children


#: The variable holding the key the node's gateway presents to the node's workers: the
#: supervisor makes one per run (``secrets.token_hex``) and only its children see it, so
#: the workers trust their own gateway's ``reactant-owner`` and no one else's
#: (docs/security.md, "Shared memory through the gateway").
NODE_KEY_VAR = "REACTANT_NODE_GATEWAY_KEY"
#: The override that points a worker's ``endpoints.gateway.key_env`` at it.
WORKER_TRUST_VAR = "INFERENCE_SERVER_ENDPOINTS_GATEWAY_KEY_ENV"


def _trusts_a_gateway(cfg: ServerConfig) -> bool:
    trust = cfg.endpoints.gateway
    return bool(trust.key_file or trust.key_env or trust.identities)


def _with_node_key(gateway: GatewayConfig) -> GatewayConfig:
    """The node's gateway presents the node key to its workers unless told another."""
    wc = gateway.worker_client
    if wc.key_file or wc.key_env:
        return gateway
    return attrs.evolve(gateway, worker_client=attrs.evolve(wc, key_env=NODE_KEY_VAR))


def plan_node(
    node: NodeConfig,
    env: Mapping[str, str],
    *,
    runtime_dir: str,
    cpus: Sequence[int],
    python: str = sys.executable,
    log_level: str = "info",
    nvidia_smi: Callable[[Mapping[str, str]], str | None] = devmod.run_nvidia_smi,
    dev_nodes: Callable[[], Iterable[str]] = devmod.list_dev,
) -> NodePlan:
    """The plan of the module doc. Raises ``ConfigError`` for anything that would stop a
    child from starting."""
    role = read_role(env)
    max_restarts = int_var(env, MAX_RESTARTS_VAR, 0, 0)
    declared = [resolve_worker(node, name, env) for name in worker_names(node)]
    detection, notes = decide_devices(node, env, role, declared, nvidia_smi, dev_nodes)

    assignment: list[str | None] = []
    # gpus: auto on a gateway-only host: only the gateway's own endpoints can say.
    unknown_workers = role == "gateway" and not node.workers and detection.source == "none"
    if unknown_workers:
        grown = node
    else:
        assignment = assign(node, detection, env)
        grown = materialize_workers(node, len(assignment))
    # The node as the children read it (materialized_node writes this): each child sees
    # one device at ordinal 0, so no worker keeps a gpu: of its own.
    children_node = attrs.evolve(
        grown,
        gpus=0 if all(d is None for d in assignment) else len(assignment),
        workers=tuple(attrs.evolve(entry, gpu=None) for entry in grown.workers),
    )
    if not detection.devices and node.workers and env.get(CPU_WORKERS_VAR, "").strip():
        notes.append(f"{CPU_WORKERS_VAR} ignored: {node.source.file} lists its workers")
    if role != "gateway" and len(detection.devices) > len(assignment):
        unused = len(detection.devices) - len(assignment)
        notes.append(f"{unused} device(s) found by {detection.source} have no worker")

    names = worker_names(grown)
    runs_gateway = role == "gateway" or (role == "all" and len(names) > 1)
    sole_public = role == "all" and len(names) == 1
    gateway_env, gateway_file = _gateway_env(node, env)
    if gateway_file:
        notes.append(f"gateway settings from {gateway_file}")
    # The sole public worker needs the gateway's listen ports; otherwise the gateway is
    # resolved after the workers, whose port checks say more than its own would.
    gateway = resolve_gateway(grown, gateway_env) if sole_public else None
    node_path = os.path.join(runtime_dir, "node.yaml")
    gateway_path = os.path.join(runtime_dir, "gateway.yml")

    children: list[ChildPlan] = []
    if role != "gateway":
        public = None
        if gateway is not None:
            public = (
                split_address(gateway.listen.grpc)[1],
                split_address(gateway.listen.metrics)[1],
                split_address(gateway.listen.grpc)[0],
            )
        children = _worker_children(
            children_node,
            assignment,
            env,
            cpus,
            public,
            (python, node_path, log_level),
            fronted=runs_gateway,
        )
        _check_ports(children, [], node)
    if runs_gateway:
        gateway = _embedded_gateway(grown, gateway_env, role)
        if unknown_workers and _derived(grown, gateway):
            fail(
                EnvOrigin(ROLE_VAR),
                "expected the gateway's endpoints: (or REACTANT_GATEWAY_WORKERS), or a worker "
                "count in workers:, gpus: or REACTANT_GPUS: with role gateway and gpus: auto "
                "there is no way to know this node's workers",
            )
        listen = [
            ("the gateway's listen.grpc", gateway.listen.grpc),
            ("the gateway's listen.metrics", gateway.listen.metrics),
        ]
        _check_ports(children, listen, node)
        metrics_on = split_address(gateway.listen.metrics)[1] != 0
        children.insert(
            0,
            ChildPlan(
                name="gateway",
                kind="gateway",
                argv=(python, "-m", "reactantserver.cli", "gateway", gateway_path),
                env={"PYTHONUNBUFFERED": "1"},
                grace_seconds=GATEWAY_GRACE_SECONDS,
                grpc=gateway.listen.grpc,
                metrics=gateway.listen.metrics if metrics_on else "",
            ),
        )

    files = {}
    if role != "gateway":
        files[node_path] = materialized_node(grown, assignment, detection.source)
    if runs_gateway:
        assert gateway is not None
        files[gateway_path] = gateway_document(gateway, node.source.file)
    front = children[0] if (sole_public or runs_gateway) else None
    return NodePlan(
        role=role,
        detection=detection,
        children=tuple(children),
        files=files,
        public_grpc=front.grpc if front else "",
        public_metrics=front.metrics if front else "",
        max_restarts=max_restarts,
        notes=tuple(notes),
        gateway=gateway if runs_gateway else None,
    )


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _derived(node: NodeConfig, gateway: GatewayConfig) -> bool:
    """Whether the gateway's endpoints are the node's own (derived, not configured)."""
    configs = [resolve_worker(node, name, {}) for name in worker_names(node)]
    ours = tuple(f"{connect_host(c.endpoints.host)}:{c.endpoints.port}" for c in configs)
    return gateway.endpoints == ours
