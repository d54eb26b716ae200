"""Typed configuration: node.yaml / gateway.yml loading, validation, env overrides."""

from .schema import (
    EndpointsConfig,
    ModelSchedConfig,
    RuntimeConfig,
    SchedulerConfig,
    ServerConfig,
)

__all__ = [
    "EndpointsConfig",
    "ModelSchedConfig",
    "RuntimeConfig",
    "SchedulerConfig",
    "ServerConfig",
]
