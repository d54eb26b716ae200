"""The gateway's configuration: a standalone gateway.yml, or a node's embedded gateway.

Theory of operation
-------------------
A gateway is configured in layers, each value remembering its origin (``RawTree``)::

    defaults  <-  the file (gateway.yml, or the node file's gateway: block)
              <-  what the node implies (embedded only)  <-  REACTANT_GATEWAY_*

then structured into a ``GatewayConfig`` and held to the gateway rules of ``rules``.

``load_gateway`` is the standalone gateway: the file is ``path``, else the one
``REACTANT_GATEWAY_FILE`` names, else none (defaults and the environment alone, e.g.
``REACTANT_GATEWAY_WORKERS=host:8080,host:8081``). It must end up with at least one
endpoint.

``resolve_gateway`` is the gateway a node supervisor embeds in front of its workers. Its
settings come from the node file's ``gateway:`` block or from the file
``REACTANT_GATEWAY_FILE`` names (not both). Whatever they leave unset is taken from the
node: ``endpoints`` are the workers' gRPC addresses (a wildcard bind address is reached
over loopback), ``worker_names`` their names, ``metrics_endpoints`` their admin addresses
(when every worker has one), the message-size limits the workers' smallest
``max_message_bytes``, and ``startup_wait_seconds`` is ``.inf`` (the workers compile
before they answer, and they are the supervisor's own children). Under ``lpt_packing``
every worker must run ``fifo`` or ``edf``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from . import env as envmod
from .convert import structure, yaml_keys
from .dump import to_plain
from .node import build_worker, environ, lpt_problems, worker_names
from .rules import GATEWAY_CROSS, GATEWAY_RULES, problems
from .schema import GatewayConfig, NodeConfig, ServerConfig
from .source import EnvOrigin, Path, RawTree, fail, raise_first, read_yaml, show


def _read_named(var: str, file: str) -> tuple[dict[str, Any], Any]:
    if not os.path.isfile(file):
        fail(EnvOrigin(var), f"expected the path of a gateway.yml; got {show(file)} (no such file)")
    return read_yaml(file)


def _finish(tree: RawTree, env: Mapping[str, str]) -> GatewayConfig:
    overrides, wrong = envmod.read(
        env, envmod.GATEWAY_PREFIX, envmod.GATEWAY_ENV, frozenset({envmod.GATEWAY_FILE_VAR})
    )
    raise_first(wrong)
    for setting, value in overrides:
        tree.set(setting.path, value, EnvOrigin(setting.var))
    cfg = structure(GatewayConfig, tree.data, tree.locate)
    raise_first(problems(cfg, GATEWAY_RULES, GATEWAY_CROSS, tree.locate))
    return cfg


def load_gateway(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> GatewayConfig:
    """A standalone gateway's configuration (see the module doc)."""
    environment = environ(env)
    workers_var = envmod.GATEWAY_PREFIX + "WORKERS"
    if path is None and environment.get(envmod.GATEWAY_FILE_VAR):
        data, source = _read_named(envmod.GATEWAY_FILE_VAR, environment[envmod.GATEWAY_FILE_VAR])
    elif path is not None:
        data, source = read_yaml(path)
    else:
        data, source = {}, None
    tree = RawTree(source.origin(()) if source else EnvOrigin(workers_var))
    if source is not None:
        tree.overlay(data, source.origin)
    cfg = _finish(tree, environment)
    if not cfg.endpoints:
        fail(
            tree.locate(("endpoints",)),
            f"expected at least one worker host:port (endpoints: or {workers_var}); got none",
        )
    return cfg


def is_gateway_document(data: Mapping[str, Any]) -> bool:
    """Whether a YAML document is a gateway.yml rather than a node file: it has keys, and
    all of them are gateway keys (the two files share no top-level key)."""
    gateway_keys = set(yaml_keys(GatewayConfig))
    return bool(data) and all(key in gateway_keys for key in data)


def connect_host(bind: str) -> str:
    """The address to reach a server bound to ``bind`` on this machine."""
    if bind in ("", "0.0.0.0"):
        return "127.0.0.1"
    if bind == "::":
        return "[::1]"
    if ":" in bind and not bind.startswith("["):
        return f"[{bind}]"
    return bind


def resolve_gateway(node: NodeConfig, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """The configuration of the gateway embedded in front of ``node``'s workers."""
    environment = environ(env)
    workers: list[tuple[ServerConfig, RawTree]] = []
    for index in range(len(worker_names(node))):
        cfg, wrong, tree = build_worker(node, index, environment)
        raise_first(wrong)
        assert cfg is not None
        workers.append((cfg, tree))

    file = environment.get(envmod.GATEWAY_FILE_VAR)
    explicit: Callable[[Path], bool]
    if file:
        if node.gateway is not None:
            fail(
                EnvOrigin(envmod.GATEWAY_FILE_VAR),
                f"expected one gateway configuration; {node.source.file} already has a "
                "gateway: block (keep one of them)",
            )
        data, source = _read_named(envmod.GATEWAY_FILE_VAR, file)
        tree = RawTree(source.origin(()))
        tree.overlay(data, source.origin)
        explicit = tree.has
    elif node.gateway is not None:
        tree = RawTree(node.source.origin(("gateway",)))
        tree.overlay(to_plain(node.gateway), lambda p: node.source.origin(("gateway", *p)))
        lines = node.source.lines

        def explicit(path: Path) -> bool:
            return ("gateway", *path) in lines

    else:
        tree = RawTree(node.source.origin(()))

        def explicit(path: Path) -> bool:
            return False

    here = node.source.origin(("workers",) if node.workers else ())
    configs = [cfg for cfg, _ in workers]
    if not explicit(("endpoints",)):
        addresses = [f"{connect_host(c.endpoints.host)}:{c.endpoints.port}" for c in configs]
        tree.set(("endpoints",), addresses, here)
        if not explicit(("worker_names",)):
            tree.set(("worker_names",), [c.name for c in configs], here)
        if not explicit(("metrics_endpoints",)) and all(c.endpoints.metrics_port for c in configs):
            metrics = [
                f"{connect_host(c.endpoints.host)}:{c.endpoints.metrics_port}" for c in configs
            ]
            tree.set(("metrics_endpoints",), metrics, here)
    smallest = min(c.endpoints.max_message_bytes for c in configs)
    for key in ("max_recv_msg_bytes", "max_send_msg_bytes"):
        if not explicit(("grpc", key)):
            tree.set(("grpc", key), smallest, here)
    if not explicit(("startup_wait_seconds",)):
        tree.set(("startup_wait_seconds",), math.inf, here)

    gateway = _finish(tree, environment)
    mode_at = tree.locate(("scheduling", "mode"))
    raise_first(lpt_problems(gateway.scheduling.mode, mode_at, workers))
    return gateway
