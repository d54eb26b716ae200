"""The gateway's configuration: a standalone gateway.yml, or a node's embedded gateway.

Theory of operation
-------------------
A gateway is configured in layers, each value remembering its origin (``RawTree``)::

    defaults  <-  the file (gateway.yml, or the node file's gateway: block)
              <-  what the node implies (embedded only)  <-  REACTANT_GATEWAY_*

then structured into a ``GatewayConfig`` and held to the gateway rules of ``rules``.
Like a node file, a gateway's configuration reports every problem it has at once.

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
``max_message_bytes``, ``startup_wait_seconds`` is ``.inf`` (the workers compile
before they answer, and they are the supervisor's own children), and ``expected_models``
are the models the node assigns to its workers (:func:`assigned_models`: so that a call
for one while the workers are down or still starting is UNAVAILABLE, which clients
retry, not NOT_FOUND). Under ``lpt_packing`` every worker must run ``fifo`` or ``edf``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from . import env as envmod
from .certs import gateway_file_problems
from .convert import try_structure, yaml_keys
from .dump import to_plain
from .node import anchor_gateway, build_workers, environ, lpt_problems
from .rules import GATEWAY_CROSS, GATEWAY_RULES, problems
from .schema import GatewayConfig, NodeConfig, ServerConfig
from .source import (
    EnvOrigin,
    Path,
    Problem,
    RawTree,
    SourceMap,
    describe,
    fail,
    raise_all,
    read_yaml,
    show,
)


def _read_named(
    var: str, file: str, found: list[Problem]
) -> tuple[dict[str, Any], SourceMap | None]:
    """The gateway.yml an environment variable names; a missing one is a problem (and no
    settings), so the rest of the configuration is still checked."""
    if not os.path.isfile(file):
        found.append(
            Problem(
                EnvOrigin(var),
                f"expected the path of a gateway.yml; got {show(file)} (no such file)",
            )
        )
        return {}, None
    return read_yaml(file)


def _finish(
    tree: RawTree, env: Mapping[str, str], found: list[Problem], file: str = "<env>"
) -> GatewayConfig | None:
    """Apply ``REACTANT_GATEWAY_*``, structure and hold to the gateway rules, and check its
    certificates and keys (relative paths anchored next to ``file``); every problem goes
    to ``found``. None when the record cannot be built at all."""
    ignore = frozenset({envmod.GATEWAY_FILE_VAR})
    envmod.apply(tree, env, envmod.GATEWAY_PREFIX, envmod.GATEWAY_ENV, ignore, found)
    cfg, structural = try_structure(GatewayConfig, tree.data, tree.locate)
    found.extend(structural)
    if cfg is not None:
        cfg = anchor_gateway(cfg, file)
        rules = problems(cfg, GATEWAY_RULES, GATEWAY_CROSS, tree.locate)
        found.extend(rules)
        if not rules:  # files of a block that is wrong already would only echo it
            found.extend(gateway_file_problems(cfg, tree.locate, env))
    return cfg


def load_gateway(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> GatewayConfig:
    """A standalone gateway's configuration (see the module doc); every problem at once."""
    environment = environ(env)
    workers_var = envmod.GATEWAY_PREFIX + "WORKERS"
    found: list[Problem] = []
    source: SourceMap | None = None
    data: dict[str, Any] = {}
    if path is None and environment.get(envmod.GATEWAY_FILE_VAR):
        var = envmod.GATEWAY_FILE_VAR
        data, source = _read_named(var, environment[var], found)
    elif path is not None:
        data, source = read_yaml(path)
    tree = RawTree(source.origin(()) if source else EnvOrigin(workers_var))
    if source is not None:
        tree.overlay(data, source.origin)
    cfg = _finish(tree, environment, found, source.file if source else "<env>")
    if cfg is not None and not cfg.endpoints:
        found.append(
            Problem(
                tree.locate(("endpoints",)),
                f"expected at least one worker host:port (endpoints: or {workers_var}); got none",
            )
        )
    raise_all(found)
    assert cfg is not None
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


def repository_models(directories: Sequence[str]) -> list[str]:
    """The bundle names of a repository (empty when it cannot be listed: the worker that
    reads it says why, and a gateway's configuration must not fail on a repository that
    lives on another host)."""
    from ..bundle.repository import find_bundles  # numpy and the hooks: only when needed

    try:
        return list(find_bundles(directories).paths)
    except OSError:
        return []


def assigned_models(node: NodeConfig, workers: Iterable[ServerConfig]) -> tuple[str, ...]:
    """The models ``node`` assigns to its workers: each one's ``models_include``, or every
    bundle of its repository when that is empty, and the ``models:`` pins; sorted."""
    names = set(node.models)
    repositories: set[tuple[str, ...]] = set()
    for cfg in workers:
        if cfg.models_include:
            names.update(cfg.models_include)
        else:
            repositories.add(cfg.model_dirs)
    for directories in repositories:  # the workers' shared repository is listed once
        names.update(repository_models(directories))
    return tuple(sorted(names))


def _worker_tls_problems(
    gateway: GatewayConfig, workers: Sequence[tuple[ServerConfig, RawTree]], tree: RawTree
) -> list[Problem]:
    """The embedded gateway must speak TLS to workers that serve it, and present a
    certificate to workers that ask for one."""
    tls = gateway.worker_client.tls
    for cfg, worker in workers:
        ep = cfg.endpoints.tls
        if ep.cert_file and not tls.ca_file:
            where = describe(worker.locate(("endpoints", "tls", "cert_file")))
            return [Problem(tree.locate(("worker_client", "tls", "ca_file")),
                            f"expected the CA of the workers' certificates: {cfg.name} serves "
                            f"TLS (endpoints.tls, {where})")]  # fmt: skip
        if ep.client_ca_file and not tls.cert_file:
            where = describe(worker.locate(("endpoints", "tls", "client_ca_file")))
            return [Problem(tree.locate(("worker_client", "tls", "cert_file")),
                            f"expected a client certificate for the workers: {cfg.name} asks "
                            f"for one (endpoints.tls.client_ca_file, {where})")]  # fmt: skip
    return []


def resolve_gateway(
    node: NodeConfig, env: Mapping[str, str] | None = None, *, restarts_workers: bool = False
) -> GatewayConfig:
    """The configuration of the gateway embedded in front of ``node``'s workers.

    ``restarts_workers``: the supervisor that runs this gateway runs (and restarts) the
    workers too (``REACTANT_ROLE=all``). Then ``wedge_exit_rounds`` defaults to 0: with
    every worker away the supervisor is already restarting them, and a gateway that exited
    would take the node's public port with it while they come back (19 s of "connection
    refused" in issue 42) instead of answering UNAVAILABLE.
    """
    environment = environ(env)
    found: list[Problem] = []
    workers = build_workers(node, environment, found)
    if found:
        raise_all(found)  # the gateway's defaults are derived from the workers

    file = environment.get(envmod.GATEWAY_FILE_VAR)
    explicit: Callable[[Path], bool]
    if file:
        if node.gateway is not None:
            # Which of the two is meant is unknowable: checking either would be a guess.
            fail(
                EnvOrigin(envmod.GATEWAY_FILE_VAR),
                f"expected one gateway configuration; {node.source.file} already has a "
                "gateway: block (keep one of them)",
            )
        data, source = _read_named(envmod.GATEWAY_FILE_VAR, file, found)
        tree = RawTree(source.origin(()) if source else EnvOrigin(envmod.GATEWAY_FILE_VAR))
        if source is not None:
            tree.overlay(data, source.origin)
        explicit = tree.has
        anchor_at = source.file if source else "<env>"
    elif node.gateway is not None:
        tree = RawTree(node.source.origin(("gateway",)))
        tree.overlay(to_plain(node.gateway), lambda p: node.source.origin(("gateway", *p)))
        lines = node.source.lines

        def explicit(path: Path) -> bool:
            return ("gateway", *path) in lines

        anchor_at = node.source.file
    else:
        anchor_at = node.source.file
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
    if restarts_workers and not explicit(("wedge_exit_rounds",)):
        tree.set(("wedge_exit_rounds",), 0, here)
    if not explicit(("expected_models",)):
        tree.set(("expected_models",), list(assigned_models(node, configs)), here)

    gateway = _finish(tree, environment, found, anchor_at)
    if gateway is not None:
        mode_at = tree.locate(("scheduling", "mode"))
        found.extend(lpt_problems(gateway.scheduling.mode, mode_at, workers))
        found.extend(_worker_tls_problems(gateway, workers, tree))
    raise_all(found)
    assert gateway is not None
    return gateway
