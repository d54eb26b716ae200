"""The typed configuration of one worker: frozen attrs classes, names and defaults.

This module holds only the shapes. Loading (ruamel.yaml + cattrs, unknown keys
refused, file:line in every error), validation of ranges and cross-field rules,
environment overrides and per-worker resolution of a node.yaml live beside it in
the ``reactantserver.config`` package. Everything downstream (scheduler, cache,
runtime, transport) reads these records and nothing else.

A ``ServerConfig`` is *one resolved worker*: the node file's ``global:`` block
merged with the worker's own override blocks, the top-level ``models:`` pin map
turned into ``scheduler.models.<name>.residency: device``, and environment
overrides applied on top.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import attrs

Backend = Literal["cpu", "cuda"]
Discipline = Literal["fair", "fifo", "edf"]
ControlMode = Literal["dynamic", "static", "explicit"]
Residency = Literal["unpinned", "system", "device"]

BACKENDS: tuple[Backend, ...] = ("cpu", "cuda")
DISCIPLINES: tuple[Discipline, ...] = ("fair", "fifo", "edf")
CONTROL_MODES: tuple[ControlMode, ...] = ("dynamic", "static", "explicit")
RESIDENCIES: tuple[Residency, ...] = ("unpinned", "system", "device")


@attrs.frozen(kw_only=True)
class RuntimeConfig:
    """``runtime:`` -- the device, its memory arena and the on-demand weight cache."""

    #: ``cpu`` or ``cuda``.
    backend: Backend = "cpu"
    #: When ``cuda`` is asked for but no GPU is usable, run on the CPU (with a warning)
    #: instead of refusing to start.
    allow_cpu_fallback: bool = True
    #: Fraction of device memory XLA's allocator claims as its arena (GPU only).
    mem_fraction: float = 0.9
    #: Claim the arena up front (GPU only).
    preallocate: bool = True
    #: Fraction of the arena for all weights (pinned + on demand); 0 keeps every
    #: model's weights on the device for the server's lifetime.
    weight_cache_fraction: float = 1.0
    #: Fraction of the arena kept free for activations; sizes the startup peak probe.
    weight_cache_wiggle_fraction: float = 0.1
    #: Arena size in bytes when the backend reports none (the CPU backend). 0 means
    #: "no arena": on CPU the weight cache is then off and all weights stay resident.
    arena_bytes: int = 0
    #: While a batch executes, start loading the weights of the model most likely
    #: to run next (only when that evicts nothing in use).
    weight_prefetch: bool = True


@attrs.frozen(kw_only=True)
class ModelSchedConfig:
    """``scheduler.models.<name>:`` -- per-model scheduling and residency overrides."""

    #: Relative share of device time under ``fair`` (must be > 0).
    weight: float = 1.0
    #: Residency floor; ``None`` means the default (``system`` when the weight cache
    #: is on). ``pin_to_gpu: true`` in YAML is an alias for ``device``.
    residency: Residency | None = None
    #: Cap on rows coalesced into one dispatch; 0 = uncapped. Never splits a request.
    max_batch_size: int = 0


@attrs.frozen(kw_only=True)
class SchedulerConfig:
    """``scheduler:`` -- the dispatch discipline, batching and queue bounds."""

    discipline: Discipline = "fair"
    #: Half-life of the per-model device-time EMA that ``fair`` compares to weights.
    ema_halflife_seconds: float = 30.0
    #: Per-model queue cap; a full queue refuses new requests (RESOURCE_EXHAUSTED).
    max_queue_depth: int = 1024
    #: A device execution running longer than this fails its requests and marks the
    #: worker not ready until the device returns.
    dispatch_timeout_seconds: float = 30.0
    #: Defragment device memory every N on-demand weight loads; 0 disables.
    compaction_interval: int = 0
    #: Smoothing of the per-(model, batch size) cost EMA (first sample seeds it).
    cost_ema_alpha: float = 0.2
    #: Clamp on the fair discipline's share deficit.
    recency_penalty_cap: float = 0.25
    #: Meta-model requests allowed to run their glue code at once.
    meta_concurrency: int = 2
    models: Mapping[str, ModelSchedConfig] = attrs.field(factory=dict)

    def for_model(self, name: str) -> ModelSchedConfig:
        """The overrides for ``name``, or the defaults when it has none."""
        return self.models.get(name, _DEFAULT_MODEL)


_DEFAULT_MODEL = ModelSchedConfig()


@attrs.frozen(kw_only=True)
class EndpointsConfig:
    """``endpoints:`` -- where the worker listens and how much it takes in at once."""

    host: str = "127.0.0.1"
    #: gRPC port. In a node file, worker i gets ``base_port + i`` unless it sets one.
    port: int = 8080
    #: Admin HTTP port (/healthz, /readyz, /metrics); 0 = off. In a node file,
    #: worker i gets ``metrics_base_port + i`` when that is set.
    metrics_port: int = 0
    #: In-flight RPC cap; past it requests are shed with RESOURCE_EXHAUSTED. 0 = uncapped.
    max_concurrent_requests: int = 64
    #: Largest gRPC message accepted or sent, in bytes.
    max_message_bytes: int = 512 * 1024 * 1024


@attrs.frozen(kw_only=True)
class ServerConfig:
    """One resolved worker: everything ``reactantserver serve`` needs."""

    name: str = "worker0"
    #: Model repositories; every immediate subdirectory with a manifest.yaml is a bundle.
    model_dirs: tuple[str, ...] = ()
    #: Allowlist of model names to load; empty loads every bundle.
    models_include: tuple[str, ...] = ()
    #: JAX persistent compilation cache; empty disables it.
    cache_dir: str = ""
    model_control_mode: ControlMode = "dynamic"
    model_poll_seconds: float = 15.0
    #: Device ordinal among the visible devices (None = 0 / the supervisor's choice).
    gpu: int | None = None
    runtime: RuntimeConfig = attrs.field(factory=RuntimeConfig)
    scheduler: SchedulerConfig = attrs.field(factory=SchedulerConfig)
    endpoints: EndpointsConfig = attrs.field(factory=EndpointsConfig)
