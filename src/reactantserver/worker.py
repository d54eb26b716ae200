"""The worker: one device, one Trio run, every service under one nursery.

``serve(config)`` starts the runtime, then ``Worker.run`` opens the nursery that
supervises the dispatch loop, the gRPC listener and the admin HTTP listener, and
loads the repository's bundles while already answering ServerLive (ServerReady and
``/readyz`` say "not ready" with the reason until every bundle is compiled).

The worker is the ``ModelHost`` behind ``reactantserver.service``: it owns the
model table (name -> the ``ServedModel`` now serving it), runs the model.py hooks,
submits requests to the scheduler and answers the repository and control RPCs.

Model versions. Each request is submitted with the ``ServedModel`` that admitted it
as its scheduler group, and the worker counts requests outstanding per version.
Replacing a model (RepositoryModelLoad of a changed bundle) compiles the new version
off the event loop while the old one keeps serving, swaps the table entry in one
step, and retires the old version only when its last outstanding request has been
answered; unloading stops admission at once and frees memory after the drain. No
request that was admitted fails because of a load or unload.

Shutdown (``stop`` set, e.g. by SIGTERM): the gRPC listener refuses new calls and
waits for the calls in flight, which the still-running dispatch loop answers; then
the loop closes and the nursery exits.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import trio

from . import hooks as hooks_mod
from .admin import AdminApp, serve_admin
from .bundle import Bundle, bundle_dirs, load_bundle, scan_repository
from .config import ServerConfig, dump_config
from .config.schema import Residency
from .errors import (
    BundleError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ReactantError,
    Unavailable,
)
from .metrics import WorkerCollector
from .models import ServedModel
from .runtime import Runtime
from .runtime.executor import DeviceExecutor, ResidentWeights
from .scheduling import Scheduler
from .scheduling.assemble import request_rows
from .service import (
    CompactResult,
    ControlStatus,
    IndexEntry,
    ModelControlInfo,
    Service,
)
from .transport.grpc import serve_grpc

log = logging.getLogger(__name__)


@attrs.frozen
class WorkerAddress:
    """Where a started worker listens (ports are the bound ones, also for port 0)."""

    host: str
    grpc_port: int
    metrics_port: int | None


class Worker:
    """Implements ``reactantserver.service.ModelHost`` over the runtime and scheduler."""

    def __init__(self, config: ServerConfig, runtime: Runtime) -> None:
        self.config = config
        self.runtime = runtime
        self._models: dict[str, ServedModel] = {}
        self._failed: dict[str, str] = {}
        self._loading: set[str] = set()
        self._outstanding: dict[ServedModel, int] = {}
        self._drained: dict[ServedModel, trio.Event] = {}
        self._generation = 0
        self._initial_load_done = False
        self._lifecycle = trio.Lock()
        # Model hooks run in threads so a slow preprocess never stalls the event loop;
        # they get their own limiter so they never queue behind the device thread.
        self._hook_threads = trio.CapacityLimiter(4)
        self.weights = ResidentWeights(runtime.to_device, runtime.free)
        self.executor = DeviceExecutor(self.weights, self._models.get)
        self.scheduler = Scheduler(config.scheduler, self.executor)
        self.service = Service(
            self, max_concurrent_requests=config.endpoints.max_concurrent_requests
        )

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
            grpc_stop = trio.Event()
            grpc_done = trio.Event()

            async def grpc(task_status: trio.TaskStatus[int]) -> None:
                try:
                    await serve_grpc(
                        self.service, cfg.endpoints, stop=grpc_stop, task_status=task_status
                    )
                finally:
                    grpc_done.set()

            grpc_port = await nursery.start(grpc)
            metrics_port = None
            if cfg.endpoints.metrics_port:
                from prometheus_client import CollectorRegistry

                registry = CollectorRegistry()
                registry.register(WorkerCollector(self))
                app = AdminApp(registry, self.readiness)
                metrics_port = await nursery.start(
                    serve_admin, app, cfg.endpoints.host, cfg.endpoints.metrics_port
                )
            task_status.started(WorkerAddress(cfg.endpoints.host, grpc_port, metrics_port))
            nursery.start_soon(self._load_initial)
            await stop.wait()
            log.info("stopping: no new calls; answering the calls in flight")
            grpc_stop.set()
            await grpc_done.wait()
            await self.scheduler.aclose()
            nursery.cancel_scope.cancel()
        log.info("worker %s stopped", cfg.name)

    async def _load_initial(self) -> None:
        scan = await trio.to_thread.run_sync(
            partial(scan_repository, self.config.model_dirs, include=self.config.models_include)
        )
        for name, error in scan.errors.items():
            self._failed[name] = error.detail
            log.error("%s", error)
        self._loading.update(scan.bundles)
        for name in sorted(scan.bundles):
            async with self._lifecycle:
                await self._install(scan.bundles[name])
        self._initial_load_done = True
        ready = sorted(self._models)
        log.info(
            "startup load done: %d model(s) ready (%s), %d failed",
            len(ready),
            ", ".join(ready) or "none",
            len(self._failed),
        )

    # ---------------------------------------------------------------- lifecycle

    async def _install(self, bundle: Bundle) -> ServedModel | None:
        """Compile ``bundle`` and make it the model's serving version (lock held)."""
        name = bundle.name
        self._loading.add(name)
        try:
            if bundle.is_meta:
                raise BundleError(name, "kind: meta bundles are not served by this version yet")
            loaded = await trio.to_thread.run_sync(self.runtime.load, bundle)
            self._generation += 1
            served = ServedModel(
                bundle,
                loaded,
                self.config.scheduler.for_model(name),
                platform=f"jax_{self.runtime.backend}",
                generation=self._generation,
                max_queue_depth=self.config.scheduler.max_queue_depth,
            )
            await self.weights.add(served)
            costs = await self._warm_up(served)
        except ReactantError as exc:
            detail = exc.detail if isinstance(exc, BundleError) else str(exc)
            self._failed[name] = detail
            log.error("model %r failed to load: %s", name, detail)
            return None
        finally:
            self._loading.discard(name)
        self._failed.pop(name, None)
        old = self._models.get(name)
        if old is None:
            self.scheduler.add_model(
                name,
                bundle.compiled_batch_sizes,
                coalescable=bundle.batched,
                weight=served.sched.weight,
                max_batch_size=served.sched.max_batch_size or None,
            )
        else:
            self.scheduler.update_model(
                name,
                compiled_batch_sizes=bundle.compiled_batch_sizes,
                coalescable=bundle.batched,
                max_batch_size=served.sched.max_batch_size or None,
            )
        for size, seconds in costs.items():
            self.scheduler.seed_cost(name, size, seconds)
        self._models[name] = served
        reports = ", ".join(
            f"b{r.batch_size}={r.seconds:.2f}s/{r.cache}" for r in loaded.compile_reports
        )
        log.info(
            "model %r ready (generation %d; compile %s)%s",
            name,
            served.generation,
            reports,
            " replacing the previous version" if old is not None else "",
        )
        if old is not None:
            await self._retire(old)
        return served

    async def _warm_up(self, served: ServedModel) -> dict[int, float]:
        """Run every compiled size on zeros: seconds per size, to seed the cost estimates."""
        weights = await self.weights.acquire(served)
        try:
            return await trio.to_thread.run_sync(served.loaded.warmup, weights)
        finally:
            self.weights.release(served)

    async def _retire(self, old: ServedModel) -> None:
        """Free ``old`` once every request it admitted has been answered."""
        if self._outstanding.get(old):
            drained = self._drained.setdefault(old, trio.Event())
            await drained.wait()
        await self.weights.remove(old)

    # ------------------------------------------------------------- ModelHost

    @property
    def backend(self) -> str:
        return self.runtime.backend

    @property
    def device_ordinal(self) -> int:
        return self.config.gpu or 0

    def readiness(self) -> tuple[bool, str]:
        if not self._initial_load_done or self._loading:
            pending = ", ".join(sorted(self._loading)) or "scanning the repository"
            return False, f"loading models ({pending})"
        if not self.scheduler.ready:
            return False, f"dispatch loop is {self.scheduler.health.value}"
        if not self._models:
            return False, "no model is loaded"
        return True, ""

    def served_models(self) -> Mapping[str, ServedModel]:
        """The serving version of every loaded model (a read-only view)."""
        return self._models

    def get(self, name: str) -> ServedModel:
        served = self._models.get(name)
        if served is None:
            if name in self._loading:
                raise Unavailable(f"model {name!r} is still loading")
            if name in self._failed:
                raise NotFound(f"model {name!r} failed to load: {self._failed[name]}")
            raise NotFound(f"model {name!r} is not loaded")
        return served

    def index(self) -> Sequence[IndexEntry]:
        entries = {name: IndexEntry(name, "", "READY", "") for name in self._models}
        for name in self._loading:
            entries.setdefault(name, IndexEntry(name, "", "LOADING", "compiling"))
        for name, reason in self._failed.items():
            if name in self._models:
                reason = f"serving the previous version; the new one failed: {reason}"
                entries[name] = IndexEntry(name, "", "READY", reason)
            else:
                entries[name] = IndexEntry(name, "", "UNAVAILABLE", reason)
        return [entries[n] for n in sorted(entries)]

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        deadline: float,
    ) -> Mapping[str, Any]:
        served = self.get(model)
        bundle = served.bundle
        rows: int | None = None
        if served.batched:
            try:
                rows = request_rows(inputs)
            except ValueError as exc:
                raise InvalidArgument(f"model {model!r}: {exc}") from None
        hooks = bundle.hooks
        exe_inputs: Mapping[str, np.ndarray] = inputs
        if hooks is not None and hooks.preprocess is not None:
            exe_inputs = await trio.to_thread.run_sync(
                hooks_mod.run_preprocess,
                model,
                hooks,
                dict(inputs),
                bundle.inputs,
                rows,
                limiter=self._hook_threads,
            )
        self._outstanding[served] = self._outstanding.get(served, 0) + 1
        try:
            result = await self.scheduler.submit(
                model,
                exe_inputs,
                rows=rows or 1,
                deadline=None if math.isinf(deadline) else deadline,
                group=served,
            )
        finally:
            left = self._outstanding[served] - 1
            if left:
                self._outstanding[served] = left
            else:
                del self._outstanding[served]
                drained = self._drained.pop(served, None)
                if drained is not None:
                    drained.set()
        if hooks is not None and hooks.postprocess is not None:
            result = await trio.to_thread.run_sync(
                hooks_mod.run_postprocess,
                model,
                hooks,
                dict(result),
                bundle.client_outputs,
                rows,
                limiter=self._hook_threads,
            )
        return result

    async def load(self, name: str) -> None:
        path = self._find_bundle_dir(name)
        async with self._lifecycle:
            try:
                bundle = await trio.to_thread.run_sync(load_bundle, path)
            except BundleError as exc:
                self._failed[name] = exc.detail
                raise InvalidArgument(f"model {name!r} cannot be loaded: {exc.detail}") from None
            if await self._install(bundle) is None:
                raise InvalidArgument(f"model {name!r} cannot be loaded: {self._failed[name]}")

    async def unload(self, name: str) -> None:
        async with self._lifecycle:
            served = self._models.pop(name, None)
            if served is None:
                raise NotFound(f"model {name!r} is not loaded")
            log.info("model %r unloading: no new requests; draining the queued ones", name)
            if self._outstanding.get(served):
                await self._drained.setdefault(served, trio.Event()).wait()
            self.scheduler.remove_model(name)
            await self.weights.remove(served)
            log.info("model %r unloaded", name)

    def _find_bundle_dir(self, name: str) -> Path:
        for directory in self.config.model_dirs:
            for path in bundle_dirs(Path(directory)):
                if path.name == name:
                    return path
        raise NotFound(
            f"model {name!r} is not in the model repository ({', '.join(self.config.model_dirs)})"
        )

    # ------------------------------------------------------------------ control

    def _residency(self, served: ServedModel) -> Residency:
        # With the weight cache off every model stays on the device.
        return "device"

    def control_status(self) -> ControlStatus:
        stats = self.scheduler.statistics().policy.models
        infos = []
        for name, served in sorted(self._models.items()):
            s = stats.get(name)
            batched = served.batched
            infos.append(
                ModelControlInfo(
                    name=name,
                    residency=self._residency(served),
                    device_resident=self.weights.is_resident(served),
                    host_resident=False,
                    weight_nbytes=served.bundle.weights_nbytes,
                    weight=s.weight if s else served.sched.weight,
                    queue_depth=s.queue_depth if s else 0,
                    total_compute_seconds=s.compute_seconds if s else 0.0,
                    requests_served=s.requests if s else 0,
                    dispatch_count=s.dispatches if s else 0,
                    max_batch_size=served.max_batch_size,
                    batch_input_name=served.inputs[0].name if batched and served.inputs else "",
                    batch_axis=1 if batched else 0,
                    rows_served=s.rows if s else 0,
                )
            )
        return ControlStatus(
            residency_mode=(
                "externally_managed"
                if self.config.model_control_mode == "explicit"
                else "self_managed"
            ),
            discipline=self.config.scheduler.discipline,
            models=tuple(infos),
            weight_cache_max_bytes=0,
        )

    async def set_residency(self, name: str, target: Residency) -> Residency:
        self.get(name)
        if self.config.model_control_mode != "explicit":
            raise FailedPrecondition(
                "SetModelResidency needs model_control_mode: explicit "
                f"(this worker runs {self.config.model_control_mode})"
            )
        raise FailedPrecondition(
            "the on-demand weight cache is off on this worker (runtime.weight_cache_fraction "
            "is 0 or the device reports no arena; set runtime.arena_bytes on CPU); every model "
            "is device resident"
        )

    async def set_policy(self, name: str, weight: float) -> None:
        self.get(name)
        if not math.isfinite(weight) or weight <= 0:
            raise InvalidArgument(
                f"model {name!r}: weight must be a finite number > 0; got {weight}"
            )
        self.scheduler.set_weight(name, weight)
        log.info("model %r: weight set to %g", name, weight)

    async def compact(self, reload: Sequence[str]) -> CompactResult:
        for name in reload:
            self.get(name)
        raise FailedPrecondition(
            "CompactMemory needs the on-demand weight cache, which is off on this worker"
        )


async def serve(
    config: ServerConfig,
    *,
    stop: trio.Event | None = None,
    task_status: trio.TaskStatus[WorkerAddress] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one worker until ``stop`` is set (or SIGINT/SIGTERM when ``stop`` is None)."""
    log.info("effective configuration of worker %s:\n%s", config.name, dump_config(config))
    runtime = Runtime.start(config.runtime, config.cache_dir, device_ordinal=config.gpu)
    worker = Worker(config, runtime)
    if stop is not None:
        await worker.run(stop=stop, task_status=task_status)
        return
    import signal

    stop = trio.Event()
    async with trio.open_nursery() as nursery:

        async def on_signals(task_status: trio.TaskStatus[None]) -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                task_status.started()
                async for signum in signals:
                    if not stop.is_set():
                        log.info("received %s: draining", signal.Signals(signum).name)
                        stop.set()
                    else:
                        log.warning("received %s again: stopping now", signal.Signals(signum).name)
                        nursery.cancel_scope.cancel()

        await nursery.start(on_signals)
        await worker.run(stop=stop, task_status=task_status)
        nursery.cancel_scope.cancel()
