"""Typed configuration: node.yaml / gateway.yml loading, validation, environment overrides.

The public surface::

    load_node(path, env=None) -> NodeConfig                 read + check a node file
    resolve_worker(node, name=None, env=None) -> ServerConfig   one worker, env applied
    load_server_config(path, worker=None, env=None) -> ServerConfig  the two combined
    worker_names(node) -> tuple[str, ...]                   the node's workers, in order
    materialize_workers(node, count) -> NodeConfig          one worker per detected device
    load_gateway(path=None, env=None) -> GatewayConfig      a standalone gateway
    resolve_gateway(node, env=None) -> GatewayConfig        a node's embedded gateway
    dump_config(obj) -> str                                 the effective config as YAML

Every error is one ``reactantserver.errors.ConfigError`` whose message is
``FILE:LINE: key.path: expected ...; got ...`` (or ``VARIABLE: ...`` for the environment).
See docs/configuration.md.
"""

from .dump import dump_config
from .gateway import load_gateway, resolve_gateway
from .node import (
    default_worker_names,
    load_node,
    load_server_config,
    materialize_workers,
    resolve_worker,
    worker_names,
)
from .schema import (
    EndpointsConfig,
    GatewayConfig,
    GatewayGrpcConfig,
    GatewayModelConfig,
    GatewaySchedulingConfig,
    ListenConfig,
    LoggingConfig,
    ModelSchedConfig,
    NodeConfig,
    RuntimeConfig,
    SchedulerConfig,
    ServerConfig,
    Settings,
    TlsConfig,
    WorkerClientConfig,
    WorkerEntry,
)

__all__ = [
    "EndpointsConfig",
    "GatewayConfig",
    "GatewayGrpcConfig",
    "GatewayModelConfig",
    "GatewaySchedulingConfig",
    "ListenConfig",
    "LoggingConfig",
    "ModelSchedConfig",
    "NodeConfig",
    "RuntimeConfig",
    "SchedulerConfig",
    "ServerConfig",
    "Settings",
    "TlsConfig",
    "WorkerClientConfig",
    "WorkerEntry",
    "default_worker_names",
    "dump_config",
    "load_gateway",
    "load_node",
    "load_server_config",
    "materialize_workers",
    "resolve_gateway",
    "resolve_worker",
    "worker_names",
]
