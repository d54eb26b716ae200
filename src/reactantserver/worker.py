"""The worker: one device, one Trio run, every service under one nursery.

``serve(config)`` starts the runtime, then ``Worker.run`` opens the nursery that
supervises the dispatch loop, the gRPC listener and the admin HTTP listener, and
loads the repository's bundles while already answering ServerLive (ServerReady and
``/readyz`` say "not ready" with the reason until every bundle is compiled).

The worker is the ``ModelHost`` behind ``reactantserver.service``: it owns the
model table (name -> the ``ServedModel`` now serving it), runs the model.py hooks,
submits requests to the scheduler and answers the repository and control RPCs.

Model versions. Each request is submitted with the ``ServedModel`` that admitted it
as its scheduler group, and the worker counts requests outstanding per version from
the moment ``get`` hands the version out. Replacing a model (a changed bundle seen by
the watcher, or RepositoryModelLoad) compiles the new version off the event loop
while the old one keeps serving, swaps the table entry in one step, and retires the
old version in the background once its last outstanding request has been answered.
If the new version batches differently (other compiled sizes), requests for it wait
at an admission gate until the old version has drained, so the scheduler never mixes
the two versions' batch sizes. Unloading stops admission at once (``NOT_FOUND``) and
frees memory after the drain. No request that was admitted fails because of a load,
a reload or an unload; a version that fails to load leaves the old one serving.

Lifecycle. Per-name states and their legal transitions live in
``reactantserver.lifecycle`` (``ModelTable``); every load, swap and unload runs under
one lock (``_lifecycle``), so they are serialised. ``model_control_mode``: ``dynamic``
loads the startup set, then a watcher task polls the repository every
``model_poll_seconds`` and acts on debounced changes (``RepositoryWatch``);
``static`` loads the startup set only; ``explicit`` loads the startup set and lists
every other bundle as not loaded, and only RepositoryModelLoad/Unload change the set
(they are refused with FAILED_PRECONDITION in the other modes). See docs/lifecycle.md.

Meta models (``kind: meta``, ``reactantserver.meta``) go through the same lifecycle
states but live in a table of their own (``_metas``): they have no weights, queue or
compiled program, so nothing that handles compiled versions ever meets one. ``get``,
``index`` and ``infer`` see both tables; ``infer`` of a meta model runs its glue on the
request's task through ``MetaRunner``, and each sub-call comes back into ``infer`` as a
*committed* request. A meta model is ready when every callee is (computed on demand).
See docs/meta_models.md.

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
from types import MappingProxyType
from typing import Any

import attrs
import numpy as np
import trio

from . import hooks as hooks_mod
from .admin import AdminApp, serve_admin
from .bundle import Bundle, Signature, bundle_dirs, load_bundle, scan_repository, signature
from .config import ServerConfig, dump_config
from .config.schema import Residency
from .errors import (
    BundleError,
    ExecutionFailed,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ReactantError,
    Unavailable,
)
from .lifecycle import (
    Action,
    LifecycleEvent,
    ModelState,
    ModelTable,
    RepositoryWatch,
    changed_files,
    index_view,
)
from .meta import MetaModel, MetaRunner, declared_kind, meta_control_info, weakest_residency
from .metrics import WorkerCollector
from .models import ServedModel
from .records import CompactResult, ControlStatus, IndexEntry, ModelControlInfo
from .runtime import LoadedModel, Runtime
from .runtime.executor import DeviceExecutor, ResidentWeights
from .runtime.weight_cache import (
    CachedWeights,
    WeightCacheStatistics,
    make_weight_provider,
    startup_order,
)
from .scheduling import Scheduler
from .scheduling.assemble import request_rows
from .service import Service
from .transport.grpc import serve_grpc

log = logging.getLogger(__name__)


#: Why a bundle cannot replace a model of the other kind under the same name.
_KIND_CHANGE = (
    "kind: {new} cannot replace the kind: {old} model serving under this name; unload it "
    "(or remove its directory and wait for the unload) first"
)


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
        #: Lifecycle state of every known model name (the rules: ``lifecycle.py``).
        self.model_states = ModelTable()
        self._outstanding: dict[ServedModel, int] = {}
        self._drained: dict[ServedModel, trio.Event] = {}
        #: name -> set once the old version drained (a swap that changed batching).
        self._gates: dict[str, trio.Event] = {}
        self._generation = 0
        self._initial_load_done = False
        self._lifecycle = trio.Lock()
        # The run nursery: background retirement of replaced versions lives here.
        self._nursery: trio.Nursery | None = None
        # Model hooks run in threads so a slow preprocess never stalls the event loop;
        # they get their own limiter so they never queue behind the device thread.
        self._hook_threads = trio.CapacityLimiter(4)
        # The on-demand weight cache when it is on (weight_cache_fraction > 0 and an
        # arena: the device's, or runtime.arena_bytes on CPU), else all resident.
        self.weights: CachedWeights | ResidentWeights = make_weight_provider(config, runtime)
        self.executor = DeviceExecutor(self.weights, self._models.get)
        self.scheduler = Scheduler(config.scheduler, self.executor)
        #: Loaded ``kind: meta`` models (no weights, no queue): a table of their own so
        #: everything that handles compiled versions (executor, weights, control status)
        #: never meets one; ``get`` and ``index`` show both tables.
        self._metas: dict[str, MetaModel] = {}
        self.metas = MetaRunner(self, concurrency=config.scheduler.meta_concurrency)
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
            self._nursery = nursery
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
            nursery.start_soon(self._manage_models)
            await stop.wait()
            log.info("stopping: no new calls; answering the calls in flight")
            grpc_stop.set()
            await grpc_done.wait()
            await self.scheduler.aclose()
            nursery.cancel_scope.cancel()
        log.info("worker %s stopped", cfg.name)

    # ---------------------------------------------------------------- lifecycle

    async def _manage_models(self) -> None:
        """Load the startup set; in dynamic mode, then watch the repository."""
        baseline = await self._load_initial()
        if self.config.model_control_mode == "dynamic":
            await self._watch(RepositoryWatch(baseline))

    async def _load_initial(self) -> dict[str, Signature]:
        """Load the startup set; return the signatures it came from (the watch baseline).

        The startup set is ``models_include`` (every bundle when empty) in every mode.
        Signatures are taken *before* the bundles are read: a file that changes in
        between then differs from the baseline and is reloaded by the watcher, never
        missed.
        """
        cfg = self.config
        explicit = cfg.model_control_mode == "explicit"
        listing = await trio.to_thread.run_sync(
            self._list_repository, () if explicit else cfg.models_include
        )
        scan = await trio.to_thread.run_sync(
            partial(scan_repository, cfg.model_dirs, include=cfg.models_include)
        )
        if explicit:
            # The control plane may load any bundle: list the rest as not loaded.
            for name in listing:
                self.model_states.declare(name)
        for name, error in scan.errors.items():
            log.error("%s", error)
            if name not in scan.bundles:  # a duplicate name keeps its first bundle
                self.model_states.apply(name, LifecycleEvent.LOAD)
                self.model_states.apply(name, LifecycleEvent.LOAD_FAILED, error.detail)
        for name in scan.bundles:
            self.model_states.apply(name, LifecycleEvent.LOAD)
        for name in self._startup_order(scan.bundles):
            async with self._lifecycle:
                await self._load(name, scan.bundles[name], begun=True)
        async with self._lifecycle:
            await self.weights.finish_probe()  # with the cache on, the warm-ups were the probe
        self._initial_load_done = True
        ready = sorted(self._models)
        failed = self.model_states.in_state(ModelState.FAILED)
        log.info(
            "startup load done: %d model(s) ready (%s), %d failed%s",
            len(ready),
            ", ".join(ready) or "none",
            len(failed),
            f" ({', '.join(failed)})" if failed else "",
        )
        baseline = {name: sig for name, (_, sig) in listing.items() if name in scan.errors}
        baseline.update({name: b.signature for name, b in scan.bundles.items()})
        return baseline

    def _list_repository(self, include: Sequence[str]) -> dict[str, tuple[Path, Signature]]:
        """Bundle directories (first one wins per name) and their signatures; a thread.

        Raises ``OSError`` when a repository directory cannot be listed: the caller
        must not mistake an unreadable repository for an empty one.
        """
        wanted = set(include)
        out: dict[str, tuple[Path, Signature]] = {}
        for directory in self.config.model_dirs:
            for path in bundle_dirs(Path(directory)):
                if (wanted and path.name not in wanted) or path.name in out:
                    continue
                sig = signature(path)
                if sig:  # empty: the directory vanished while we looked
                    out[path.name] = (path, sig)
        return out

    async def _watch(self, watch: RepositoryWatch) -> None:
        """Dynamic mode: poll the repository and act on settled changes, one at a time."""
        period = self.config.model_poll_seconds
        log.info(
            "watching %s every %g s for added, changed and removed bundles",
            ", ".join(self.config.model_dirs),
            period,
        )
        while True:
            await trio.sleep(period)
            try:
                listing = await trio.to_thread.run_sync(
                    self._list_repository, self.config.models_include
                )
            except OSError as exc:
                log.warning("repository poll failed (%s); leaving every model as it is", exc)
                continue
            actions = watch.observe({name: sig for name, (_, sig) in listing.items()})
            for action in actions:
                async with self._lifecycle:
                    await self._act(action, listing)

    async def _act(self, action: Action, listing: Mapping[str, tuple[Path, Signature]]) -> None:
        """Carry out one repository change (lock held)."""
        name = action.name
        if action.kind == "remove":
            log.info("repository: %r was removed; unloading it", name)
            state = self.model_states.state(name)
            if state is ModelState.READY:
                await self._unload(name)
            elif state is ModelState.FAILED:
                self.model_states.apply(name, LifecycleEvent.UNLOAD)
            if self.model_states.state(name) is ModelState.UNLOADED:
                self.model_states.forget(name)
            return
        files = ", ".join(changed_files(action.previous, action.signature))
        if action.kind == "add":
            log.info("repository: %r is new; loading it", name)
        elif name in self._models:
            log.info(
                "repository: %r changed (%s); loading the new version while the current one serves",
                name,
                files,
            )
        else:
            log.info("repository: %r changed (%s); trying to load it again", name, files)
        await self._load(name, listing[name][0])

    async def _load(
        self, name: str, source: Path | Bundle, *, begun: bool = False
    ) -> ServedModel | MetaModel | None:
        """Load ``name`` from its directory (or an already checked bundle); lock held.

        Compiles and warms up the new version while any current one keeps serving,
        then admits it (``_swap``). On failure the current version, if any, keeps
        serving and the reason goes to the log, the state table (RepositoryIndex) and
        ``worker_model_load_failures_total``. ``begun``: the ``LOAD`` event was
        already applied (the startup set is marked loading up front).
        """
        if not begun:
            self.model_states.apply(name, LifecycleEvent.LOAD)
        try:
            bundle = (
                source
                if isinstance(source, Bundle)
                else await trio.to_thread.run_sync(partial(load_bundle, source, name=name))
            )
            if bundle.is_meta:
                meta = await self._build_meta(bundle)
            else:
                if name in self._metas:
                    raise BundleError(name, _KIND_CHANGE.format(old="meta", new="model"))
                served, costs = await self._build(bundle)
        except ReactantError as exc:
            self._load_failed(name, exc.detail if isinstance(exc, BundleError) else str(exc))
            return None
        except Exception as exc:
            # A bug or an unexpected library error: keep the worker (and any serving
            # version) alive, and keep the traceback.
            log.exception("model %r: unexpected error while loading", name)
            self._load_failed(name, f"unexpected {type(exc).__name__}: {exc}")
            return None
        if bundle.is_meta:
            self._swap_meta(meta)
            return meta
        await self._swap(served, costs)
        return served

    # ------------------------------------------------------------- meta models

    async def _build_meta(self, bundle: Bundle) -> MetaModel:
        """A ``MetaModel`` for ``bundle``, or ``BundleError`` why it cannot be served.

        Refused: a name that a compiled model serves (no in-place kind change) and a
        ``calls`` entry naming a meta model, loaded or on disk. A callee that is merely
        missing is not a load error (it may be loaded later): the meta model is listed,
        and stays not ready until the callee serves, saying which.
        """
        name = bundle.name
        if name in self._models:
            raise BundleError(name, _KIND_CHANGE.format(old="model", new="meta"))
        calls = bundle.manifest.calls
        on_disk = [c for c in calls if c not in self._models and c not in self._metas]
        disk_kinds = await trio.to_thread.run_sync(self._declared_kinds, on_disk)
        for i, callee in enumerate(calls):
            if callee in self._metas or disk_kinds.get(callee) == "meta":
                raise BundleError(
                    name,
                    f"manifest.yaml: calls[{i}]: {callee!r} is a kind: meta model; a meta "
                    "model may call compiled models only (inline the other glue instead)",
                )
        self._generation += 1
        return MetaModel(bundle, generation=self._generation, callee_problem=self._callee_problem)

    def _declared_kinds(self, names: Sequence[str]) -> dict[str, str | None]:
        """The manifest ``kind`` of each named bundle on disk (a thread; first dir wins)."""
        wanted = set(names)
        kinds: dict[str, str | None] = {}
        for directory in self.config.model_dirs:
            for path in bundle_dirs(Path(directory)):
                if path.name in wanted and path.name not in kinds:
                    kinds[path.name] = declared_kind(path)
        return kinds

    def _swap_meta(self, meta: MetaModel) -> None:
        """Serve ``meta`` (lock held). Requests running on an older version finish on it."""
        old = self._metas.get(meta.name)
        self._metas[meta.name] = meta
        self.model_states.apply(meta.name, LifecycleEvent.LOADED)
        ready, reason = meta.ready()
        log.info(
            "meta model %r loaded (generation %d; calls %s)%s%s",
            meta.name,
            meta.generation,
            ", ".join(meta.calls) or "nothing",
            f" replacing generation {old.generation}" if old is not None else "",
            "" if ready else f"; not ready yet: {reason}",
        )

    def _unload_meta(self, name: str) -> None:
        """Stop admitting meta model ``name`` (lock held).

        It holds no memory, so nothing waits for a drain: requests already running keep
        their ``MetaModel`` and finish (their sub-calls need only the callees).
        """
        self.model_states.apply(name, LifecycleEvent.UNLOAD)
        del self._metas[name]
        self.model_states.apply(name, LifecycleEvent.DRAINED)
        log.info("meta model %r unloaded", name)

    def _callee_problem(self, callee: str) -> str | None:
        """Why a meta model cannot call ``callee`` now (``None``: it can). Cheap: dict reads."""
        if callee in self._metas:
            return f"its callee {callee!r} is a meta model; meta models call compiled models only"
        served = self._models.get(callee)
        if served is None:
            state = self.model_states.state(callee)
            if state is ModelState.UNLOADED:
                return f"its callee {callee!r} is not loaded"
            return f"its callee {callee!r} is not loaded ({state.value})"
        ready, reason = served.ready()
        return None if ready else f"its callee {callee!r} is not ready: {reason}"

    def _load_failed(self, name: str, detail: str) -> None:
        serving = name in self._models or name in self._metas
        self.model_states.apply(name, LifecycleEvent.LOAD_FAILED, detail or "unknown error")
        log.error(
            "model %r failed to load%s: %s",
            name,
            "; the previous version keeps serving" if serving else "",
            detail,
        )

    async def _build(self, bundle: Bundle) -> tuple[ServedModel, dict[int, float]]:
        """Compile ``bundle`` off the loop, place its weights, warm it up."""
        loaded = self._reusable_programs(bundle)
        if loaded is None:
            loaded = await trio.to_thread.run_sync(self.runtime.load, bundle)
        else:
            log.info(
                "model %r: only the weights changed; reusing the compiled programs", bundle.name
            )
        self._generation += 1
        served = ServedModel(
            bundle,
            loaded,
            self.config.scheduler.for_model(bundle.name),
            platform=f"jax_{self.runtime.backend}",
            generation=self._generation,
            max_queue_depth=self.config.scheduler.max_queue_depth,
            readiness=self._resident_readiness
            if self.config.model_control_mode == "explicit"
            else None,
        )
        await self.weights.add(served)
        try:
            costs = await self._warm_up(served)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.weights.remove(served)  # never leak a failed version's weights
            raise
        return served, costs

    def _reusable_programs(self, bundle: Bundle) -> LoadedModel | None:
        """The serving version's compiled programs, when ``bundle`` can run on them.

        Weights are arguments of the programs, never baked in: a new version whose
        manifest, artifact file and weight layout (names, dtypes, shapes) are those of
        the serving one differs only in weight values, and needs no compilation (the
        warm-up still runs, on the new weights).
        """
        old = self._models.get(bundle.name)
        if old is None:
            return None
        before = old.bundle
        artifact = bundle.manifest.artifact

        def entry(sig: Signature) -> tuple[str, int, int] | None:
            return next((e for e in sig if e[0] == artifact), None)

        same = (
            before.manifest == bundle.manifest
            and before.weight_specs == bundle.weight_specs
            and entry(before.signature) == entry(bundle.signature) is not None
        )
        return old.loaded if same else None

    async def _swap(self, served: ServedModel, costs: Mapping[int, float]) -> None:
        """Make ``served`` the serving version of its name, atomically (lock held)."""
        name = served.name
        bundle = served.bundle
        old = self._models.get(name)
        if old is None:
            self.scheduler.add_model(
                name,
                bundle.compiled_batch_sizes,
                coalescable=bundle.batched,
                weight=served.sched.weight,
                max_batch_size=served.sched.max_batch_size or None,
            )
            self._seed_costs(name, costs)
            self._models[name] = served
        elif (old.compiled_batch_sizes, old.batched) == (
            bundle.compiled_batch_sizes,
            bundle.batched,
        ):
            # Same batching: the scheduler entry (queue, weight, learned costs) carries
            # over; queued requests keep their version through their batch group.
            self._models[name] = served
            self._seed_costs(name, costs)
            self._retire_later(old)
        else:
            # Different batch sizes: the old version's queued requests must run at the
            # old sizes. New requests (already admitted to ``served``) wait at a gate
            # until the old version has drained, then the scheduler switches sizes.
            gate = self._gates[name] = trio.Event()
            self._models[name] = served
            try:
                await self._drain(old)
                self.scheduler.update_model(
                    name,
                    compiled_batch_sizes=bundle.compiled_batch_sizes,
                    coalescable=bundle.batched,
                )
                self._seed_costs(name, costs)
            finally:
                del self._gates[name]
                gate.set()
            await self.weights.remove(old)
        self.model_states.apply(name, LifecycleEvent.LOADED)
        reports = (
            "none, programs of the previous version reused"
            if old is not None and old.loaded is served.loaded
            else ", ".join(
                f"b{r.batch_size}={r.seconds:.2f}s/{r.cache}" for r in served.loaded.compile_reports
            )
        )
        log.info(
            "model %r ready (generation %d; compile %s)%s",
            name,
            served.generation,
            reports,
            f" replacing generation {old.generation}" if old is not None else "",
        )

    def _seed_costs(self, name: str, costs: Mapping[int, float]) -> None:
        for size, seconds in costs.items():
            # The runtime keys an unbatched model's single program by 0; to the scheduler
            # that program is a dispatch of one request, size 1.
            self.scheduler.seed_cost(name, max(size, 1), seconds)

    async def _warm_up(self, served: ServedModel) -> dict[int, float]:
        """Run every compiled size on zeros: seconds per size, to seed the cost estimates
        (with the cache on this is also its startup probe: runtime/weight_cache.py)."""
        return await self.weights.warm_up(served)

    async def _drain(self, served: ServedModel) -> None:
        """Wait until every request admitted to ``served`` has been answered."""
        if self._outstanding.get(served):
            await self._drained.setdefault(served, trio.Event()).wait()

    def _retire_later(self, old: ServedModel) -> None:
        if self._nursery is None:  # pragma: no cover - the worker always runs in run()
            raise RuntimeError("Worker.run() is not running")
        self._nursery.start_soon(self._retire, old)

    async def _retire(self, old: ServedModel) -> None:
        """Free a replaced version once every request it admitted has been answered."""
        await self._drain(old)
        await self.weights.remove(old)
        log.info("model %r: generation %d retired", old.name, old.generation)

    async def _unload(self, name: str) -> None:
        """Stop admitting ``name``, answer what it admitted, free its memory (lock held)."""
        state = self.model_states.state(name)
        if state is ModelState.FAILED:
            self.model_states.apply(name, LifecycleEvent.UNLOAD)
            return
        if name in self._metas:
            self._unload_meta(name)
            return
        served = self._models.get(name)
        if served is None:
            raise NotFound(f"model {name!r} is not loaded")
        self.model_states.apply(name, LifecycleEvent.UNLOAD)
        del self._models[name]
        log.info("model %r unloading: no new requests; answering the admitted ones", name)
        # Older versions still retiring share the scheduler entry: drain them too
        # before the entry (and any queue it still had) goes away.
        for version in [m for m in self._outstanding if m.name == name]:
            await self._drain(version)
        self.scheduler.remove_model(name)
        await self.weights.remove(served)
        self.model_states.apply(name, LifecycleEvent.DRAINED)
        log.info("model %r unloaded", name)

    # ------------------------------------------------------------- ModelHost

    @property
    def backend(self) -> str:
        return self.runtime.backend

    @property
    def device_ordinal(self) -> int:
        return self.config.gpu or 0

    def readiness(self) -> tuple[bool, str]:
        # Only the startup load gates readiness: a model added or reloaded later
        # compiles while the others serve, and only its own ModelReady says "not yet".
        if not self._initial_load_done:
            pending = ", ".join(self.model_states.in_state(ModelState.LOADING))
            return False, f"loading models ({pending or 'scanning the repository'})"
        if not self.scheduler.ready:
            return False, f"dispatch loop is {self.scheduler.health.value}"
        if not self._models:
            return False, "no model is loaded"
        return True, ""

    def _resident_readiness(self, served: ServedModel) -> tuple[bool, str]:
        """Explicit mode: a model serves only while its weights are on the device."""
        if self.weights.is_resident(served):
            return True, ""
        return False, (
            "its weights are not on the device (explicit mode: the control plane makes it "
            "resident with SetModelResidency)"
        )

    def served_models(self) -> Mapping[str, ServedModel]:
        """The serving version of every loaded model (a read-only view)."""
        return self._models

    def meta_models(self) -> Mapping[str, MetaModel]:
        """Every loaded meta model (a read-only view; ``self.metas`` has the gate's state)."""
        return MappingProxyType(self._metas)

    def get(self, name: str) -> ServedModel | MetaModel:
        served = self._models.get(name)
        if served is not None:
            return served
        meta = self._metas.get(name)
        if meta is not None:
            return meta
        record = self.model_states.get(name)
        if record.state is ModelState.LOADING:
            raise Unavailable(f"model {name!r} is still loading")
        if record.state is ModelState.FAILED:
            raise NotFound(f"model {name!r} failed to load: {record.error}")
        if record.state is ModelState.DRAINING:
            raise NotFound(f"model {name!r} is being unloaded")
        raise NotFound(f"model {name!r} is not loaded")

    def index(self) -> Sequence[IndexEntry]:
        entries = []
        for name, record in sorted(self.model_states.records.items()):
            state, reason = index_view(record)
            meta = self._metas.get(name)
            if meta is not None and state == "READY":
                # Loaded, but callable only once every callee serves: say which is missing.
                ready, why = meta.ready()
                if not ready:
                    state, reason = "UNAVAILABLE", f"loaded, not ready: {why}"
            entries.append(IndexEntry(name, "", state, reason))
        return entries

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        deadline: float,
        *,
        committed: bool = False,
    ) -> Mapping[str, Any]:
        """``committed``: a meta model's sub-call (``reactantserver.meta``): dispatched
        ahead of the discipline's choice and never shed for EDF laxity."""
        served = self.get(model)
        if isinstance(served, MetaModel):
            if committed:  # the meta context refuses this first; never nest glue
                raise ExecutionFailed(f"model {model!r} is a meta model; it cannot be a sub-call")
            return await self.metas.run(served, inputs, deadline)
        rows: int | None = None
        if served.batched:
            try:
                rows = request_rows(inputs)
            except ValueError as exc:
                raise InvalidArgument(f"model {model!r}: {exc}") from None
        # Counted from the moment the version is handed out (no await in between), so
        # a swap or an unload waits for this request, preprocess hook included.
        self._outstanding[served] = self._outstanding.get(served, 0) + 1
        try:
            gate = self._gates.get(model)
            if gate is not None:
                await gate.wait()  # the previous version, batching differently, drains
            result = await self._submit(served, inputs, rows, deadline, committed=committed)
        finally:
            left = self._outstanding[served] - 1
            if left:
                self._outstanding[served] = left
            else:
                del self._outstanding[served]
                drained = self._drained.pop(served, None)
                if drained is not None:
                    drained.set()
        hooks = served.bundle.hooks
        if hooks is not None and hooks.postprocess is not None:
            result = await trio.to_thread.run_sync(
                hooks_mod.run_postprocess,
                model,
                hooks,
                dict(result),
                served.bundle.client_outputs,
                rows,
                limiter=self._hook_threads,
            )
        return result

    async def _submit(
        self,
        served: ServedModel,
        inputs: Mapping[str, np.ndarray],
        rows: int | None,
        deadline: float,
        *,
        committed: bool = False,
    ) -> Mapping[str, Any]:
        """Preprocess (a thread) and queue one request on ``served``; its raw outputs."""
        model = served.name
        bundle = served.bundle
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
        result: Mapping[str, Any] = await self.scheduler.submit(
            model,
            exe_inputs,
            rows=rows or 1,
            deadline=None if math.isinf(deadline) else deadline,
            group=served,
            committed=committed,
        )
        return result

    def _require_explicit(self, rpc: str) -> None:
        mode = self.config.model_control_mode
        if mode == "explicit":
            return
        why = (
            "the repository watcher loads, reloads and unloads models as their files change"
            if mode == "dynamic"
            else "the model set is fixed at startup"
        )
        raise FailedPrecondition(
            f"{rpc} needs model_control_mode: explicit; this worker runs in {mode} mode, "
            f"where {why}"
        )

    async def load(self, name: str) -> None:
        self._require_explicit("RepositoryModelLoad")
        path = await trio.to_thread.run_sync(self._find_bundle_dir, name)
        async with self._lifecycle:
            current = self._models.get(name)
            if current is not None:
                now = await trio.to_thread.run_sync(signature, path)
                if now == current.bundle.signature:
                    log.info("model %r: load asked, files unchanged; nothing to do", name)
                    return
            if await self._load(name, path) is None:
                error = self.model_states.get(name).error
                raise InvalidArgument(f"model {name!r} cannot be loaded: {error}")

    async def unload(self, name: str) -> None:
        self._require_explicit("RepositoryModelUnload")
        async with self._lifecycle:
            await self._unload(name)

    def _find_bundle_dir(self, name: str) -> Path:
        """The directory of bundle ``name`` in ``model_dirs`` (the first one wins)."""
        for directory in self.config.model_dirs:
            for path in bundle_dirs(Path(directory)):
                if path.name == name:
                    return path
        raise NotFound(
            f"model {name!r} is not in the model repository ({', '.join(self.config.model_dirs)})"
        )

    # ------------------------------------------------------------------ control

    # ----------------------------------------------------------- weight cache

    def _startup_order(self, bundles: Mapping[str, Bundle]) -> list[str]:
        """Startup load order: the cache probe's (pinned first, then ascending weight size,
        meta models last), since with the cache on the startup warm-ups are the probe."""
        return startup_order(bundles, self.config)

    def weight_cache_statistics(self) -> WeightCacheStatistics | None:
        """The on-demand weight cache's snapshot (metrics), or ``None`` when it is off."""
        return self.weights.statistics()

    def control_status(self) -> ControlStatus:
        stats = self.scheduler.statistics().policy.models
        infos = []
        for name, served in sorted(self._models.items()):
            s = stats.get(name)
            batched = served.batched
            infos.append(
                ModelControlInfo(
                    name=name,
                    residency=self.weights.floor(served),
                    device_resident=self.weights.is_resident(served),
                    host_resident=self.weights.host_resident(served),
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
            models=self._with_metas(infos),
            # The on-demand budget (the LRU's cap); 0 with the cache off.
            weight_cache_max_bytes=self.weights.on_demand_budget,
        )

    def _with_metas(self, infos: Sequence[ModelControlInfo]) -> tuple[ModelControlInfo, ...]:
        """ModelControlStatus's view of meta models (docs/protocol.md): each meta model is
        listed as one unit -- footprint and compute of the models it calls -- and those
        callees are not listed on their own, so a placement tool moves them together."""
        if not self._metas:
            return tuple(infos)
        by_name = {info.name: info for info in infos}
        hidden = {callee for meta in self._metas.values() for callee in meta.calls}
        out = [info for info in infos if info.name not in hidden]
        for meta in self._metas.values():
            subs = [by_name[c] for c in meta.calls if c in by_name]
            out.append(meta_control_info(meta, subs))
        return tuple(sorted(out, key=lambda info: info.name))

    def _targets(self, name: str, rpc: str) -> list[ServedModel]:
        """The compiled models a control RPC naming ``name`` acts on: the model itself,
        or for a meta model the models it calls (those loaded now; at least one)."""
        model = self.get(name)
        if not isinstance(model, MetaModel):
            return [model]
        subs = [self._models[c] for c in model.calls if c in self._models]
        if not subs:
            raise FailedPrecondition(
                f"{rpc}: meta model {name!r} acts through the models it calls "
                f"({', '.join(model.calls) or 'none declared'}), and none is loaded"
            )
        return subs

    async def set_residency(self, name: str, target: Residency) -> Residency:
        """SetModelResidency: explicit mode only (the control plane owns residency)."""
        targets = self._targets(name, "SetModelResidency")
        if self.config.model_control_mode != "explicit":
            raise FailedPrecondition(
                "SetModelResidency needs model_control_mode: explicit; this worker runs in "
                f"{self.config.model_control_mode} mode, where it manages residency itself"
            )
        # A meta model's target applies to each model it calls (one target for a model).
        after = [await self._apply_residency(served, target) for served in targets]
        return weakest_residency(after)

    async def _apply_residency(self, served: ServedModel, target: Residency) -> Residency:
        """The weight cache's part of SetModelResidency (mode already checked)."""
        floor = await self.weights.set_floor(served, target)
        log.info("model %r: residency is %s", served.name, floor)
        return floor

    async def set_policy(self, name: str, weight: float) -> None:
        """SetModelPolicy, every mode: the model's fair share, live.

        The weight lives in the scheduler's entry for the name, so it survives version
        swaps; an unload drops the entry and a later load starts from the configuration.
        """
        targets = self._targets(name, "SetModelPolicy")
        for served in targets:  # a meta model's weight goes to each model it calls
            self.scheduler.set_weight(served.name, weight)
            log.info("model %r: weight set to %g", served.name, weight)

    async def compact(self, reload: Sequence[str]) -> CompactResult:
        """CompactMemory, every mode; every named model must be loaded (else NOT_FOUND)."""
        named = [served for name in reload for served in self._targets(name, "CompactMemory")]
        models = list(dict.fromkeys(named))  # a meta model and its callee may both be named
        return await self._compact_weights(models)

    async def _compact_weights(self, reload: Sequence[ServedModel]) -> CompactResult:
        """The weight cache's part of CompactMemory (names already checked)."""
        reloaded, resident = await self.weights.compact(reload)
        return CompactResult(reloaded_models=reloaded, resident_bytes_after=resident)


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
