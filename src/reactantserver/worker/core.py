"""The worker's wiring: one device, one Trio run, every service under one nursery.

``serve(config)`` starts the runtime, then :meth:`Worker.run` opens the nursery that
supervises the dispatch loop, the lifecycle's retirement loop, the gRPC listener and
the admin HTTP listener, and loads the repository's bundles while already answering
ServerLive (ServerReady and ``/readyz`` say "not ready" with the reason until every
bundle of the startup set is compiled).

Each part is a sans-IO policy with one small Trio driver, and this module only builds
and connects them:

===========================  =================================  ============================
policy (decides)             driver (does the I/O)              module
===========================  =================================  ============================
``SchedulingPolicy``         ``Scheduler`` (the dispatch loop)  ``scheduling``
``WeightCachePolicy``        ``CachedWeights`` (or the cache    ``runtime.weight_cache``,
                             off: ``ResidentWeights``)          ``runtime.weight_provider``
``ModelVersions``            ``LifecycleDriver``                ``worker.lifecycle``
``RepositoryWatch``          ``RepositoryDriver``               ``worker.repository``
===========================  =================================  ============================

The worker is the :class:`~reactantserver.host.ModelHost` behind
``reactantserver.service``, by composition: lookup, the index and the request path are
:class:`~reactantserver.worker.serving.Serving`'s, the control RPCs
:class:`~reactantserver.worker.control.ControlPlane`'s. ``model_control_mode``:
``dynamic`` loads the startup set, then watches the repository; ``static`` loads the
startup set only; ``explicit`` loads the startup set and lists every other bundle as not
loaded, and only RepositoryModelLoad/Unload change the set. See docs/lifecycle.md.

Shutdown (``stop`` set, e.g. by SIGTERM): the gRPC listener refuses new calls and waits
for the calls in flight, which the still-running dispatch loop answers; then whatever is
still admitted is failed (UNAVAILABLE), the loop closes once the device is idle, and the
nursery exits. The process runs all this as Trio's guest on a standard asyncio loop
(``transport.guest.run``; ``reactantserver serve`` does it), which hosts the gRPC
listener's connections (``transport/h2guard.py``).
"""

from __future__ import annotations

import gc
import logging
import math
import os
from collections.abc import Mapping, Sequence
from functools import partial

import attrs
import trio

from ..admin import AdminApp, serve_admin
from ..config import ServerConfig, dump_config
from ..config.schema import Residency
from ..energy import EnergyMeter, EnergyReader, open_reader
from ..host import HostedModel
from ..lifecycle import ModelState, ModelTable, ModelVersions
from ..load_config import Override
from ..metrics import WorkerCollector
from ..models import ServedModel
from ..records import CompactResult, ControlStatus, IndexEntry
from ..runtime import Runtime
from ..runtime.executor import DeviceExecutor
from ..runtime.weight_provider import WeightProvider, make_weight_provider
from ..scheduling import Scheduler
from ..service import Service
from ..shm import SharedMemoryRegistry
from ..signals import drain_on_signals
from ..statistics import ServedModelStatistics, WorkerStatistics
from ..threads import ThreadRunner, in_threads
from ..transport import guest
from ..transport.core.limits import WireCounters
from .build import Version, VersionBuilder
from .control import ControlPlane
from .grpc import serve_grpc
from .lifecycle import LifecycleDriver
from .metas import MetaGlue
from .repository import RepositoryDriver
from .serving import Serving

__all__ = ["Worker", "WorkerAddress", "serve"]

# One logger for the whole worker package (operators filter on "reactantserver.worker").
log = logging.getLogger(__package__)


#: Set by the node supervisor (docs/node.md): this worker's share of the host's cores.
WORKER_THREADS_VAR = "REACTANT_WORKER_THREADS"
DEFAULT_HOOK_THREADS = 4


def hook_threads(env: Mapping[str, str]) -> int:
    """How many model hooks may run at once: ``REACTANT_WORKER_THREADS``, else 4."""
    text = env.get(WORKER_THREADS_VAR, "").strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    if text:
        log.warning(
            "%s=%r is not a positive integer; model hooks use %d threads",
            WORKER_THREADS_VAR,
            text,
            DEFAULT_HOOK_THREADS,
        )
    return DEFAULT_HOOK_THREADS


def gpu_label(ordinal: int | None, env: Mapping[str, str]) -> str:
    """The ``gpu`` label of every series: the one device ``CUDA_VISIBLE_DEVICES`` gives this
    process (the node supervisor gives each worker exactly one, by index or UUID), else the
    configured ordinal (``0`` when none, e.g. on the CPU)."""
    visible = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible and "," not in visible:
        return visible
    return str(ordinal or 0)


def pipeline_depth(config: ServerConfig, backend: str) -> int:
    """``scheduler.pipeline_depth``, or when unset 2 on cuda (the next batch launches while
    the previous one's outputs come back: docs/gpu.md) and 1 on the CPU (where tiny
    programs run inline on the loop and a transfer is a zero-copy view)."""
    configured = config.scheduler.pipeline_depth
    if configured is not None:
        return configured
    return 2 if backend == "cuda" else 1


def freeze_heap(*, collect: bool = False) -> None:
    """Exempt every object alive now from the cyclic garbage collector's later passes.

    After the startup load the heap holds hundreds of thousands of long-lived objects
    (JAX, the compiled programs, the bundles). Requests once left cyclic garbage (grpclib's
    stream objects, before the server was our own; a direct ModelInfer leaves none now,
    ``tests/transport/test_wire_direct.py``, but a call on the task path may: an asyncio task, its
    exception's traceback), so the collector ran its oldest generation every few hundred
    milliseconds under load, and each of those passes walked the whole heap: 40-100 ms
    with the event loop stopped, the p99 latency at 64 requests in flight
    (docs/benchmarks.md). ``gc.freeze`` moves what exists now into a permanent
    generation those passes skip. ``collect`` first: after the startup load, so that no
    garbage is frozen with it (later loads freeze without it: a pass here would stop
    serving for as long as the ones avoided).
    """
    if collect:
        gc.collect()
    gc.freeze()


@attrs.frozen
class WorkerAddress:
    """Where a started worker listens (ports are the bound ones, also for port 0)."""

    host: str
    grpc_port: int
    metrics_port: int | None


class Worker:
    """One device's server (see the module docstring).

    ``thread`` runs the blocking work of every driver -- compiles, file reads, weight
    transfers, executions, hooks -- in place of their worker threads: tests on virtual
    time pass one that runs inline. By default each driver has threads of its own.

    ``energy_reader`` is the device's power counter (``serve`` opens NVML's or RAPL's;
    tests pass a fake): with it, each batch's device seconds and the counter's advance
    are attributed to models (``reactantserver.energy``); without, energy is "not
    measured" and no energy series is exported.
    """

    def __init__(
        self,
        config: ServerConfig,
        runtime: Runtime,
        *,
        thread: ThreadRunner | None = None,
        energy_reader: EnergyReader | None = None,
    ) -> None:
        self.config = config
        self.runtime = runtime
        self._initial_load_done = False
        #: Which version of each model serves, what each has outstanding, and the
        #: lifecycle state of every name (``reactantserver.lifecycle``).
        self.versions: ModelVersions[Version] = ModelVersions()
        #: Device weights: the on-demand cache, or every model resident with it off.
        self.weights: WeightProvider = make_weight_provider(config, runtime, thread=thread)
        self.executor = DeviceExecutor(self.weights, self._compiled)
        # Tiny programs run on the dispatch loop itself, on the CPU backend only (on a GPU
        # every execution goes to the device thread). Tests on virtual time (``thread``
        # given) run every execution inline, like the rest of their blocking work.
        inline_max = config.scheduler.inline_max_seconds if runtime.backend == "cpu" else 0.0
        #: Energy per model, fed by every batch on the loop's clock (None: not measured).
        self.energy = (
            EnergyMeter(energy_reader, trio.current_time) if energy_reader is not None else None
        )
        self.scheduler = Scheduler(
            config.scheduler,
            self.executor,
            inline_max_seconds=math.inf if thread is not None else inline_max,
            # Virtual-time tests run executions inline: no pipeline threads there.
            pipeline_depth=1 if thread is not None else pipeline_depth(config, runtime.backend),
            on_batch=self.energy.on_batch if self.energy is not None else None,
            # Tiny batches run by a pass of the host loop, without waking the dispatch loop.
            soon=guest.call_soon,
            # ...and a lone request's answer leaves before its batch's bookkeeping.
            send=guest.send_held,
        )
        default = in_threads()
        metas = MetaGlue(config, self.versions, thread=thread or default)
        builder = VersionBuilder(config, runtime, self.weights, metas, thread=thread or default)
        self.lifecycle = LifecycleDriver(
            self.versions,
            self.scheduler,
            self.weights,
            builder,
            thread=thread or default,
            follow_symlinks=config.follow_symlinks,
        )
        self.repository = RepositoryDriver(
            config, self.versions, self.lifecycle, thread=thread or default
        )
        self.serving = Serving(
            self.versions,
            self.scheduler,
            self.lifecycle,
            meta_concurrency=config.scheduler.meta_concurrency,
            # Hooks get their own threads: never queued behind the device thread. Under
            # the node supervisor, as many as the worker's share of the host's cores.
            hook_thread=thread or in_threads(trio.CapacityLimiter(hook_threads(os.environ))),
        )
        self.control = ControlPlane(
            config,
            self.versions,
            self.scheduler,
            self.weights,
            self.lifecycle,
            metas,
            thread=thread or default,
        )
        # ModelHost.begin and .withdraw are Serving's own methods: the request path is the
        # hot path, and a delegating method would add a frame to every request.
        self.begin = self.serving.begin
        self.withdraw = self.serving.withdraw
        #: begin -> wait -> finish for Trio callers (tests, tools).
        self.infer = self.serving.infer
        self.service = Service(
            self,
            max_concurrent_requests=config.endpoints.max_concurrent_requests,
            registry=SharedMemoryRegistry(
                max_regions=config.endpoints.max_shm_regions,
                prefix=config.endpoints.shm_key_prefix,
            ),
        )
        #: The gRPC wire layer's counters (connections, client errors), for /metrics.
        self.wire = WireCounters()

    # ------------------------------------------------------------------ running

    async def run(
        self,
        *,
        stop: trio.Event,
        task_status: trio.TaskStatus[WorkerAddress] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until ``stop`` is set, then drain and return."""
        cfg = self.config
        async with trio.open_nursery() as nursery:
            await nursery.start(self.scheduler.run)
            await nursery.start(self.lifecycle.run)
            await nursery.start(self.serving.run)
            grpc_stop = trio.Event()
            grpc_done = trio.Event()

            async def grpc(task_status: trio.TaskStatus[int]) -> None:
                try:
                    await serve_grpc(
                        self.service,
                        cfg.endpoints,
                        stop=grpc_stop,
                        counters=self.wire,
                        task_status=task_status,
                    )
                finally:
                    grpc_done.set()

            grpc_port = await nursery.start(grpc)
            metrics_port = None
            if cfg.endpoints.metrics_port:
                from prometheus_client import CollectorRegistry

                registry = CollectorRegistry()
                registry.register(WorkerCollector(self.statistics))
                app = AdminApp(registry, self.readiness, before_metrics=self._before_metrics)
                metrics_port = await nursery.start(
                    partial(
                        serve_admin,
                        max_connections=cfg.endpoints.max_admin_connections,
                    ),
                    app,
                    cfg.endpoints.host,
                    cfg.endpoints.metrics_port,
                )
                self.service.admin = (cfg.endpoints.host, metrics_port)
            task_status.started(WorkerAddress(cfg.endpoints.host, grpc_port, metrics_port))
            nursery.start_soon(self.manage_models)
            await stop.wait()
            log.info("stopping: no new calls; answering the calls in flight")
            grpc_stop.set()
            await grpc_done.wait()
            # Whatever is still admitted (calls past the grace period were withdrawn by
            # their handlers) is failed with UNAVAILABLE: gated requests here, queued
            # ones by the scheduler, which waits for the batch on the device.
            self.serving.close()
            await self.scheduler.aclose()
            nursery.cancel_scope.cancel()
        log.info("worker %s stopped", cfg.name)

    async def manage_models(self) -> None:
        """Load the startup set; in dynamic mode, then watch the repository."""
        baseline = await self.repository.load_startup_set()
        freeze_heap(collect=True)
        self._initial_load_done = True
        if self.config.model_control_mode == "dynamic":
            await self.repository.watch(baseline)

    async def _before_metrics(self) -> None:
        """A scrape closes the open energy interval (an idle device is read here)."""
        if self.energy is not None:
            busy = self.scheduler.statistics().executing is not None
            self.energy.sample_at_scrape(executing=busy)

    # ---------------------------------------------------------------- reads

    @property
    def model_states(self) -> ModelTable:
        """The lifecycle state of every known model name (read only)."""
        return self.versions.states

    def served_models(self) -> dict[str, ServedModel]:
        """The compiled version serving each loaded model, now (a new dict)."""
        return {n: v for n, v in self.versions.current.items() if isinstance(v, ServedModel)}

    def _compiled(self, name: str) -> ServedModel | None:
        version = self.versions.current.get(name)
        return version if isinstance(version, ServedModel) else None

    def readiness(self) -> tuple[bool, str]:
        # Only the startup load gates readiness: a model added or reloaded later
        # compiles while the others serve, and only its own ModelReady says "not yet".
        if not self._initial_load_done:
            pending = ", ".join(self.versions.states.in_state(ModelState.LOADING))
            return False, f"loading models ({pending or 'scanning the repository'})"
        if not self.scheduler.ready:
            return False, f"dispatch loop is {self.scheduler.health.value}"
        if not any(isinstance(v, ServedModel) for v in self.versions.current.values()):
            return False, "no model is loaded"
        return True, ""

    def statistics(self) -> WorkerStatistics:
        """One snapshot of the whole worker (what ``/metrics`` reads)."""
        cfg = self.config
        sched = self.scheduler.statistics()
        models = tuple(
            ServedModelStatistics(
                name=name,
                max_batch_size=served.max_batch_size,
                weight_nbytes=served.bundle.weights_nbytes,
                resident=self.weights.is_resident(served),
                batch_rows=served.batch_rows_histogram(),
                requests=self.service.request_statistics(name),
            )
            for name, served in sorted(self.served_models().items())
        )
        states = self.versions.states
        repository = self.repository.statistics()
        return WorkerStatistics(
            name=cfg.name,
            gpu=gpu_label(cfg.gpu, os.environ),
            backend=self.backend,
            control_mode=cfg.model_control_mode,
            discipline=cfg.scheduler.discipline,
            ready=self.readiness()[0],
            scheduler=sched,
            service=self.service.statistics(),
            control=self.control.status(sched),
            models=models,
            lifecycle=dict(states.records),
            load_failures=dict(states.load_failures),
            repository_polls=repository.polls,
            repository_poll_failures=repository.poll_failures,
            resident_weight_bytes=self.weights.resident_bytes,
            weight_cache=self.weights.statistics(),
            meta=self.serving.meta_runner.statistics(),
            memory=self.runtime.memory_stats(),
            wire=self.wire.statistics(),
            energy=self.energy.statistics() if self.energy is not None else None,
            cost_device_hour=cfg.cost.device_hour,
        )

    # ---------------------------------------------------------------- ModelHost

    @property
    def backend(self) -> str:
        return self.runtime.backend

    @property
    def device_ordinal(self) -> int:
        return self.config.gpu or 0

    def get(self, name: str) -> HostedModel:
        return self.serving.get(name)

    def index(self) -> Sequence[IndexEntry]:
        return self.serving.index()

    async def load(self, name: str, override: Override | None = None) -> None:
        await self.control.load(name, override)

    async def unload(self, name: str) -> None:
        await self.control.unload(name)

    def control_status(self) -> ControlStatus:
        return self.control.status()

    async def set_residency(self, name: str, target: Residency) -> Residency:
        return await self.control.set_residency(name, target)

    async def set_policy(self, name: str, weight: float) -> None:
        await self.control.set_policy(name, weight)

    async def compact(self, reload: Sequence[str]) -> CompactResult:
        return await self.control.compact(reload)


async def serve(
    config: ServerConfig,
    *,
    stop: trio.Event | None = None,
    task_status: trio.TaskStatus[WorkerAddress] = trio.TASK_STATUS_IGNORED,
    energy_reader: EnergyReader | None = None,
) -> None:
    """Run one worker until ``stop`` is set (or SIGINT/SIGTERM when ``stop`` is None).

    Energy is read from ``energy_reader`` when given (tests), else from the device's own
    counter where one can be read (NVML on ``cuda``, RAPL on the CPU)."""
    log.info("effective configuration of worker %s:\n%s", config.name, dump_config(config))
    runtime = Runtime.start(config.runtime, config.cache_dir, device_ordinal=config.gpu)
    if energy_reader is None:
        opened = open_reader(runtime.backend, gpu_label(config.gpu, os.environ), env=os.environ)
        if isinstance(opened, str):
            log.info("energy: not measured (%s)", opened)
        else:
            log.info("energy: measured by %s (%s)", opened.source, opened.description)
            energy_reader = opened
    worker = Worker(config, runtime, energy_reader=energy_reader)
    if stop is not None:
        await worker.run(stop=stop, task_status=task_status)
        return
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(drain_on_signals, stop, nursery.cancel_scope, log)
        await worker.run(stop=stop, task_status=task_status)
        nursery.cancel_scope.cancel()
