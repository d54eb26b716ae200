"""The typed configuration: frozen attrs classes, names and defaults.

The first half is one worker (``ServerConfig`` and its blocks); the second half is the
node file (``NodeConfig``) and the gateway (``GatewayConfig``). This module holds only the
shapes. Loading (ruamel.yaml + cattrs, unknown keys
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

from collections.abc import Iterator, Mapping
from typing import Literal

import attrs

from .source import SourceMap

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
    #: On the CPU backend, a batch whose learned cost is below this runs on the dispatch
    #: loop itself instead of the device thread (a thread hand-off costs more than a
    #: program of tens of microseconds); 0 = never. Ignored on cuda.
    inline_max_seconds: float = 0.0001
    #: Batches launched on the device and not yet back (>= 1): with 2 or more, the next
    #: batch's weights, input transfer and program call overlap the previous one's
    #: execution and output transfer (the device still runs one program at a time).
    #: Unset: 2 on cuda, 1 on cpu (where 1 keeps tiny programs inline on the loop).
    pipeline_depth: int | None = None
    models: Mapping[str, ModelSchedConfig] = attrs.field(factory=dict)

    def for_model(self, name: str) -> ModelSchedConfig:
        """The overrides for ``name``, or the defaults when it has none."""
        return self.models.get(name, _DEFAULT_MODEL)


_DEFAULT_MODEL = ModelSchedConfig()

#: The API groups a restriction names (docs/security.md): Triton's
#: ``--grpc-restricted-protocol`` groups, and ours for the control services.
API_GROUPS: tuple[str, ...] = (
    "inference",
    "health",
    "metadata",
    "model-repository",
    "model-config",
    "shared-memory",
    "statistics",
    "trace",
    "logging",
    "control",
    "placement",
)


@attrs.frozen(kw_only=True)
class TlsConfig:
    """``tls:`` -- TLS on a gRPC listener (a worker's ``endpoints.tls``, a gateway's
    ``tls``): the certificate chain and its key, and with ``client_ca_file`` mutual TLS
    (every client must present a certificate that CA signed). The files are read again
    when they change: a new connection gets the new certificate."""

    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""


@attrs.frozen(kw_only=True)
class ClientTlsConfig:
    """TLS on a connection to a worker (a gateway's ``worker_client.tls``): on when
    ``ca_file`` is set. ``cert_file``/``key_file``: the certificate presented to workers
    that ask for one (mTLS); ``server_name``: the name the workers' certificate must carry
    ("" = each worker's host)."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""


@attrs.frozen(kw_only=True)
class Restriction:
    """One item of ``restricted:``: API groups that only some callers may use.

    A call of one of ``groups`` must carry the header ``header`` with the key read from
    ``key_file`` or the environment variable ``key_env`` (never written in the YAML
    itself), or -- under mutual TLS -- come from a client certificate whose subject CN or
    one of whose subject alternative names is in ``identities``.
    """

    groups: tuple[str, ...]
    header: str = ""
    key_file: str = ""
    key_env: str = ""
    identities: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class GatewayTrust:
    """``endpoints.gateway:`` -- how a worker knows its gateway: a call carrying the
    header ``reactant-gateway-key`` with the key of ``key_file`` / ``key_env`` (or, under
    mutual TLS, from a certificate named in ``identities``) is the gateway's. It passes
    every restriction (the gateway enforces its own) and may name the client it acts
    for, whose shared-memory regions it then uses."""

    key_file: str = ""
    key_env: str = ""
    identities: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class EndpointsConfig:
    """``endpoints:`` -- where the worker listens and how much it takes in at once."""

    host: str = "127.0.0.1"
    #: gRPC port. In a node file, worker i gets ``base_port + i`` unless it sets one.
    port: int = 8080
    #: Admin HTTP port (/healthz, /readyz, /metrics); 0 = off. In a node file,
    #: worker i gets ``metrics_base_port + i`` when that is set.
    metrics_port: int = 0
    #: Cap on ModelInfer calls in flight (other RPCs are not counted); past it ModelInfer
    #: is shed with RESOURCE_EXHAUSTED. 0 = uncapped.
    max_concurrent_requests: int = 64
    #: Largest gRPC message accepted or sent, in bytes. A request is refused (with
    #: RESOURCE_EXHAUSTED) as soon as its 5-byte length prefix declares more.
    max_message_bytes: int = 512 * 1024 * 1024
    #: Open gRPC connections at most. Past it, a connection still in its HTTP/2
    #: handshake is closed to make room, or else the new one is refused with GOAWAY.
    max_connections: int = 256
    #: Concurrent calls (HTTP/2 streams) per connection, advertised in SETTINGS; a
    #: stream past it is refused with REFUSED_STREAM, which clients retry.
    max_concurrent_streams: int = 128
    #: A new connection must complete the HTTP/2 preface and SETTINGS within this time.
    handshake_timeout_seconds: float = 10.0
    #: A connection with no working call for this long gets GOAWAY and is closed (a
    #: call still waiting for its request message does not count as working).
    idle_timeout_seconds: float = 300.0
    #: A unary call must have sent its whole request message this long after its headers.
    body_timeout_seconds: float = 60.0
    #: A connection whose peer reads none of its waiting answers for this long is closed.
    send_timeout_seconds: float = 60.0
    #: Bytes of answers one connection may have waiting for its peer to read them.
    max_unsent_bytes: int = 64 * 1024 * 1024
    #: Open admin HTTP connections at most (a new one past it closes the oldest that has
    #: not sent its request yet, or is refused).
    max_admin_connections: int = 64
    #: Registered system shared-memory regions at most (each holds a file descriptor).
    max_shm_regions: int = 256
    #: Shared-memory keys a client may register must start with this ("" = any name
    #: under /dev/shm, which lets a client read and write other programs' objects).
    shm_key_prefix: str = "/reactantserver-"
    #: TLS (and, with ``client_ca_file``, mutual TLS) on the gRPC listener.
    tls: TlsConfig = attrs.field(factory=TlsConfig)
    #: API groups that need a key (or a client certificate): Triton's
    #: ``--grpc-restricted-protocol``. Empty: every group is open.
    restricted: tuple[Restriction, ...] = ()
    #: The gateway in front of this worker (its key or certificate).
    gateway: GatewayTrust = attrs.field(factory=GatewayTrust)


@attrs.frozen(kw_only=True)
class CostConfig:
    """``cost:`` -- what a device costs to run, for ``reactantserver report`` and the
    dashboard's cost per million requests (docs/monitoring.md)."""

    #: Price of one device-hour, in the operator's currency; ``None`` (the default) means
    #: unset, and no cost is reported.
    device_hour: float | None = None


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
    #: Follow symbolic links out of the model repository (a bundle directory, or a file of
    #: one); off: such a bundle fails to load, saying which link.
    follow_symlinks: bool = False
    model_control_mode: ControlMode = "dynamic"
    model_poll_seconds: float = 15.0
    #: Device ordinal among the visible devices (None = 0 / the supervisor's choice).
    gpu: int | None = None
    runtime: RuntimeConfig = attrs.field(factory=RuntimeConfig)
    scheduler: SchedulerConfig = attrs.field(factory=SchedulerConfig)
    endpoints: EndpointsConfig = attrs.field(factory=EndpointsConfig)
    cost: CostConfig = attrs.field(factory=CostConfig)


# ---------------------------------------------------------------------------------------------
# The node file (node.yaml): one machine, one or more single-GPU workers, optionally a gateway.
# ---------------------------------------------------------------------------------------------


class Settings(Mapping[str, object]):
    """A block of worker settings exactly as written: ``global:`` or a worker's own keys.

    It is *partial* by nature -- a worker's ``scheduler: {max_queue_depth: 8}`` says nothing
    about the discipline -- so it is kept as a read-only nested mapping keyed like
    ``ServerConfig`` rather than as a record with every field optional (which would restate
    every field of the four records above and drift from them). Its keys and the shape of
    its blocks are checked when the node file is loaded, and every value is checked by
    resolving each worker; ``resolve_worker`` deep-merges the blocks over the defaults and
    structures the result into a ``ServerConfig``.
    """

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, object] | None = None) -> None:
        self._data: dict[str, object] = {str(k): _freeze(v) for k, v in (data or {}).items()}

    def __getitem__(self, key: str) -> object:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Settings({self._data!r})"


def _freeze(value: object) -> object:
    if isinstance(value, Settings):
        return value
    if isinstance(value, Mapping):
        return Settings(value)
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


#: The keys a ``global:`` block or a worker entry may set (beyond a worker's own
#: ``name``/``port``/``metrics_port``/``gpu``): the ``ServerConfig`` fields a node file
#: leaves to the operator. ``name``, ``model_dirs`` and ``gpu`` come from the node file's
#: own keys, and so do ``endpoints.port`` / ``endpoints.metrics_port``.
SETTINGS_KEYS: tuple[str, ...] = (
    "cache_dir",
    "follow_symlinks",
    "model_control_mode",
    "model_poll_seconds",
    "models_include",
    "runtime",
    "scheduler",
    "endpoints",
    "cost",
)

#: ``gpus: auto``, a device count (0 = a CPU node), or an explicit list of device
#: ordinals / UUID strings (passed to ``CUDA_VISIBLE_DEVICES`` verbatim).
Gpus = Literal["auto"] | int | tuple[int | str, ...]


@attrs.frozen(kw_only=True)
class WorkerEntry:
    """One item of ``workers:``: a worker's identity plus its override blocks."""

    #: Routing identity; also the ``--worker`` argument and the ``worker`` metric label.
    name: str
    #: gRPC port; ``None`` means ``base_port + index``.
    port: int | None = None
    #: Admin HTTP port; ``None`` means ``metrics_base_port + index`` (or off when that is 0).
    metrics_port: int | None = None
    #: Device ordinal among the visible devices; ``None`` leaves it to the supervisor.
    gpu: int | None = None
    #: Every other key of the entry, deep-merged over ``global:``.
    settings: Settings = attrs.field(factory=Settings, converter=Settings)


# ---------------------------------------------------------------------------------------------
# The gateway (gateway.yml, or the ``gateway:`` block of a node file).
# ---------------------------------------------------------------------------------------------

GatewayMode = Literal["round_robin", "least_outstanding", "lpt_packing"]
WorkBasis = Literal["compute", "items", "requests"]
RoutingPolicy = Literal["fill_rr", "fill_least"]
#: How lpt_packing fills a model's replicas. The original's third mode, ``inflight``, was
#: removed (it routes to the replica with the most in flight and parks a model on one
#: worker); the loader refuses it with that reason.
FillMode = Literal["run", "spread"]
CompactionMode = Literal["eager", "scheduled", "off"]
LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["json", "text"]
#: A replica count: a positive integer, or ``all`` (every ready worker; tracks the fleet).
Replicas = int | Literal["all"]

GATEWAY_MODES: tuple[GatewayMode, ...] = ("round_robin", "least_outstanding", "lpt_packing")
#: Worker disciplines that may sit behind ``lpt_packing`` (the gateway is then the
#: placement and fairness authority, so workers must not reorder by share).
LPT_DISCIPLINES: tuple[Discipline, ...] = ("fifo", "edf")

DEFAULT_GRPC_MSG_BYTES = 512 * 1024 * 1024


@attrs.frozen(kw_only=True)
class ListenConfig:
    """``listen:`` -- the gateway's own addresses, ``host:port``."""

    grpc: str = "0.0.0.0:8001"
    #: Admin HTTP (/healthz, /readyz, /metrics); port 0 turns it off.
    metrics: str = "0.0.0.0:8002"


@attrs.frozen(kw_only=True)
class GatewayGrpcConfig:
    """``grpc:`` -- message-size limits and the inbound admission cap."""

    max_recv_msg_bytes: int = DEFAULT_GRPC_MSG_BYTES
    max_send_msg_bytes: int = DEFAULT_GRPC_MSG_BYTES
    #: Inbound cap is this times the number of workers; 0 = uncapped. Keep it above
    #: ``worker_client.max_concurrent_streams`` so a burst has headroom.
    max_concurrent_requests_per_worker: int = 64
    #: The hardened wire's bounds per client, as a worker's ``endpoints:`` has them: open
    #: connections, calls per connection (SETTINGS_MAX_CONCURRENT_STREAMS), the time a new
    #: connection has for its HTTP/2 handshake and the time one may stay without a call.
    max_connections: int = 256
    max_concurrent_streams: int = 128
    handshake_timeout_seconds: float = 10.0
    idle_timeout_seconds: float = 300.0
    #: As a worker's ``endpoints:`` keys of the same names (held calls, unread answers,
    #: and the admin port's connections).
    body_timeout_seconds: float = 60.0
    send_timeout_seconds: float = 60.0
    max_unsent_bytes: int = 64 * 1024 * 1024
    max_admin_connections: int = 64


@attrs.frozen(kw_only=True)
class WorkerClientConfig:
    """``worker_client:`` -- how the gateway talks to each worker."""

    request_timeout_seconds: float = 60.0
    #: Outbound in-flight RPCs multiplexed to one worker.
    max_concurrent_streams: int = 32
    #: TLS to the workers (on when ``ca_file`` is set).
    tls: ClientTlsConfig = attrs.field(factory=ClientTlsConfig)
    #: The key the gateway presents to its workers (header ``reactant-gateway-key``;
    #: their ``endpoints.gateway``), from a file or an environment variable.
    key_file: str = ""
    key_env: str = ""


@attrs.frozen(kw_only=True)
class LoggingConfig:
    """``logging:``."""

    level: LogLevel = "info"
    format: LogFormat = "json"


@attrs.frozen(kw_only=True)
class GatewayModelConfig:
    """``scheduling.models.<name>:`` -- per-model placement under ``lpt_packing``.

    ``None`` everywhere means "inherit the ``scheduling:`` default" (``fill_mode: inherit``
    in YAML is the same as leaving it out).
    """

    replicas: Replicas | None = None
    fill_mode: FillMode | None = None
    fill_factor: float | None = None


@attrs.frozen(kw_only=True)
class GatewaySchedulingConfig:
    """``scheduling:`` -- how requests are spread over workers. Every knob past ``mode``
    applies to ``lpt_packing`` only (``work_basis`` also to ``least_outstanding``)."""

    mode: GatewayMode = "round_robin"
    #: What "in-flight work" counts: measured GPU-seconds, items (rows) or requests.
    work_basis: WorkBasis = "compute"
    #: Repack after the fleet consumes this many GPU-seconds.
    rebalance_compute_seconds: float = 300.0
    #: Budget of the first traffic-driven repack; 0 = use ``rebalance_compute_seconds``.
    first_rebalance_compute_seconds: float = 60.0
    #: Advisory only (kept for compatibility; load no longer drives replica counts).
    max_worker_share: float = 0.8
    #: Minimum relative improvement needed to move a placement, in [0, 1).
    hysteresis: float = 0.0
    #: Half-life of the rate/cost smoothing in fleet GPU-seconds; 0 = the rebalance budget.
    ema_halflife_compute_seconds: float = 0.0
    default_replicas: Replicas = 1
    #: Per-replica fill target as a multiple of the model's max batch size.
    routing_fill_factor: float = 1.0
    routing_policy: RoutingPolicy = "fill_least"
    routing_fill_mode: FillMode = "run"
    #: Place a model only where its weights still fit, when any worker can fit it.
    forbid_memory_oversubscription: bool = True
    compaction_mode: CompactionMode = "eager"
    #: Compact on the first placement-changing repack at or after this many repacks.
    compaction_interval: int = 1
    models: Mapping[str, GatewayModelConfig] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class GatewayConfig:
    """The gateway: a raw-byte KServe V2 proxy in front of a flat list of workers."""

    listen: ListenConfig = attrs.field(factory=ListenConfig)
    #: Worker gRPC addresses (``host:port``), across any number of nodes.
    endpoints: tuple[str, ...] = ()
    #: Worker admin addresses whose /metrics the gateway merges into its own.
    metrics_endpoints: tuple[str, ...] = ()
    #: Friendly names, index-aligned with ``endpoints``; empty labels workers by address.
    worker_names: tuple[str, ...] = ()
    #: Models the workers are meant to serve: while no worker serving one is ready, a call
    #: for it is UNAVAILABLE (retry), as for any model a worker listed since the gateway
    #: started, not NOT_FOUND. A node's gateway gets the models its node file assigns.
    expected_models: tuple[str, ...] = ()
    grpc: GatewayGrpcConfig = attrs.field(factory=GatewayGrpcConfig)
    worker_client: WorkerClientConfig = attrs.field(factory=WorkerClientConfig)
    logging: LoggingConfig = attrs.field(factory=LoggingConfig)
    tls: TlsConfig = attrs.field(factory=TlsConfig)
    #: API groups that need a key or a client certificate (as a worker's
    #: ``endpoints.restricted``); the gateway checks its own clients.
    restricted: tuple[Restriction, ...] = ()
    scheduling: GatewaySchedulingConfig = attrs.field(factory=GatewaySchedulingConfig)
    #: The price of the workers' devices, for those that do not report their own.
    cost: CostConfig = attrs.field(factory=CostConfig)
    #: ``lpt_packing`` start: how long to wait for every worker to answer; 0 fails fast,
    #: ``.inf`` waits forever (the node supervisor's embedded gateway defaults to ``.inf``).
    startup_wait_seconds: float = 0.0
    #: Period of the readiness/discovery probe of every worker.
    health_interval_seconds: float = 10.0
    #: Exit (to be restarted) after this many consecutive rounds where no worker answered,
    #: once some worker has answered at least once; 0 disables.
    wedge_exit_rounds: int = 3


@attrs.frozen(kw_only=True)
class NodeConfig:
    """A node file: the workers of one machine, their shared settings, optionally a gateway.

    ``resolve_worker`` turns one worker of it into a ``ServerConfig``. ``source`` remembers
    the file and the line of every key so that errors found while resolving (including
    environment overrides) still point at the line to fix; it takes no part in equality.
    """

    #: The shared bundle repository; every worker gets ``model_dirs = (model_repo,)``.
    model_repo: str
    #: Worker i's gRPC port is ``base_port + i`` unless it sets ``port:``.
    base_port: int = 8080
    #: Worker i's admin port is ``metrics_base_port + i``; 0 = metrics off.
    metrics_base_port: int = 0
    gpus: Gpus = "auto"
    #: ``global:`` -- settings merged into every worker.
    global_: Settings = attrs.field(factory=Settings, converter=Settings)
    #: Explicit workers; empty means one per GPU (``worker0..N-1``), see ``worker_names``.
    workers: tuple[WorkerEntry, ...] = ()
    #: ``models:`` -- model name -> the workers that pin it to device memory.
    models: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    #: ``gateway:`` -- the embedded gateway's settings (same keys as gateway.yml; its
    #: endpoints default to this node's workers).
    gateway: GatewayConfig | None = None
    source: SourceMap = attrs.field(factory=lambda: SourceMap(), eq=False, repr=False)
