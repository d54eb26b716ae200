"""The lifecycle driver: carries out what ``ModelVersions`` decides, one operation at a time.

Theory of operation
-------------------
:class:`~reactantserver.lifecycle.ModelVersions` decides which version of each model
admits requests, when a swap is complete and when a version may be freed; this driver
does the I/O around those decisions:

* **Commands** -- :meth:`LifecycleDriver.load` and :meth:`LifecycleDriver.unload`, from
  the startup load, the repository watcher and the control RPCs -- run one at a time
  under one lock, and each returns only once the policy says its name is *settled*: a
  load after the new version serves without a gate, an unload after every version of the
  name is freed. A load reads the bundle and builds the version off the event loop
  (:class:`~reactantserver.worker.build.VersionBuilder`) while the current version keeps
  serving; a failed build changes nothing that serves.
* **Actions** -- the policy's answers -- are carried out by :meth:`carry_out`, by
  whoever received them: the scheduler actions (add, seed, re-batch, remove) are
  synchronous and done at once, before any checkpoint, so e.g. no request can slip
  through a gate before the scheduler batches the new way; ``Retire`` goes to the
  retirement loop.
* **The retirement loop** (:meth:`LifecycleDriver.run`, one task in the worker's nursery)
  frees each retired version's weights -- waiting, inside the weight provider, for the
  last batch using them -- and reports it to the policy.

The request path calls :meth:`ModelVersions.finish` itself and hands any actions to
:meth:`carry_out` (synchronously, possibly from an asyncio handler: nothing here awaits);
requests admitted behind a gate wait in the request path's gate table, and
:attr:`gate_opened` tells it when their gate opens. The commands' waits are on
:class:`~reactantserver.changes.Changes`, notified after every policy event.

Invariants (the policy's, ``lifecycle/versions.py``): a request is answered by the version
that admitted it; no version is freed while it has requests outstanding; at most one
version of a name admits; a failed build never replaces a serving version.
"""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import trio

from ..bundle import Bundle, load_bundle
from ..changes import Changes
from ..errors import BundleError, ReactantError
from ..lifecycle import (
    AddToScheduler,
    ModelState,
    ModelVersions,
    Rebatch,
    RemoveFromScheduler,
    Retire,
    SeedCosts,
    VersionAction,
)
from ..load_config import Override
from ..meta import MetaModel
from ..models import ServedModel
from ..runtime.weight_provider import WeightProvider
from ..scheduling import Scheduler
from ..threads import ThreadRunner
from .build import Version, VersionBuilder, batching_of

__all__ = ["LifecycleDriver"]

# One logger for the whole worker package (operators filter on "reactantserver.worker").
log = logging.getLogger(__package__)


class LifecycleDriver:
    """Builds, swaps, drains and frees model versions (see the module docstring)."""

    def __init__(
        self,
        versions: ModelVersions[Version],
        scheduler: Scheduler,
        weights: WeightProvider,
        builder: VersionBuilder,
        *,
        thread: ThreadRunner,
        follow_symlinks: bool = False,
    ) -> None:
        self._versions = versions
        #: ``follow_symlinks`` of the configuration: links out of the repository.
        self._follow_symlinks = follow_symlinks
        self._scheduler = scheduler
        self._weights = weights
        self._builder = builder
        self._thread = thread
        self._changes = Changes()
        self._lock = trio.Lock()
        #: Called with a version whose gate just opened (the request path registers it:
        #: the requests it holds at that gate continue).
        self.gate_opened: Callable[[Version], None] | None = None
        # Unbounded on purpose, and still bounded: at most one Retire per version ever
        # built, and a version is built only under the lifecycle lock.
        self._retire_send, self._retire_recv = trio.open_memory_channel[Version](math.inf)

    # ---------------------------------------------------------- the request path

    def carry_out(self, actions: Sequence[VersionAction[Version]]) -> None:
        """Carry out the policy's actions in order: scheduler calls now, frees later."""
        for action in actions:
            if isinstance(action, AddToScheduler):
                served = _compiled(action.version)
                self._scheduler.add_model(
                    served.name,
                    served.compiled_batch_sizes,
                    coalescable=served.batched,
                    weight=served.sched.weight,
                    max_batch_size=served.sched.max_batch_size or None,
                )
                self._seed(served)
            elif isinstance(action, SeedCosts):
                served = _compiled(action.version)
                self._rescheduled(served)
                self._seed(served)
            elif isinstance(action, Rebatch):
                served = _compiled(action.version)
                self._scheduler.update_model(
                    served.name,
                    compiled_batch_sizes=served.compiled_batch_sizes,
                    coalescable=served.batched,
                )
                self._rescheduled(served)
                self._seed(served)
                self.carry_out(self._versions.rebatched(served))
                if self.gate_opened is not None:
                    self.gate_opened(served)
            elif isinstance(action, RemoveFromScheduler):
                self._scheduler.remove_model(action.name)
            elif isinstance(action, Retire):
                self._retire_send.send_nowait(action.version)
        self._changes.notify()

    # ------------------------------------------------------------------ commands

    async def load(
        self,
        name: str,
        source: Path | Bundle,
        *,
        begun: bool = False,
        override: Override | None = None,
    ) -> Version | None:
        """Load ``name`` from its directory (or an already checked bundle), with the
        ``config`` override of RepositoryModelLoad if any (``load_config``: checked
        against the bundle by the builder; refused, it is a failed load like any other).

        The new version is built while any current one keeps serving, then swapped in;
        returns once the swap is complete. On failure the current version, if any, keeps
        serving, the reason goes to the log, the state table (RepositoryIndex) and
        ``worker_model_load_failures_total``, and ``None`` is returned. ``begun``: the
        ``LOAD`` event was already applied (the startup set is marked loading up front).
        """
        async with self._lock:
            if not begun:
                self._versions.begin_load(name)
                self._changes.notify()
            current = self._versions.current.get(name)
            try:
                bundle = (
                    source
                    if isinstance(source, Bundle)
                    else await self._thread(
                        partial(
                            load_bundle, source, name=name, follow_symlinks=self._follow_symlinks
                        )
                    )
                )
                self._versions.check_replaceable(name, meta=bundle.is_meta)
                version = await self._builder.build(bundle, current, override)
            except ReactantError as exc:
                log.debug("model %r: the load failure's traceback", name, exc_info=exc)
                if isinstance(exc, BundleError):  # clients read the public reason (errors.py)
                    self._load_failed(name, exc.public, exc.detail)
                else:
                    self._load_failed(name, str(exc))
                return None
            except Exception as exc:
                # A bug or an unexpected library error: keep the worker (and any serving
                # version) alive, and keep the traceback.
                log.exception("model %r: unexpected error while loading", name)
                self._load_failed(name, f"unexpected {type(exc).__name__}: {exc}")
                return None
            self.carry_out(self._versions.loaded(name, version, batching=batching_of(version)))
            # A swap to other batch sizes completes once the old version has drained.
            await self._changes.until(lambda: self._versions.settled(name))
            _log_loaded(version, current)
            # The new version's long-lived objects join the frozen heap (worker/core.py).
            gc.freeze()
            return version

    async def unload(self, name: str) -> None:
        """Stop admitting ``name``, answer what it admitted, free its memory; returns when
        it is unloaded. ``NotFound`` when it is not loaded."""
        async with self._lock:
            current = self._versions.current.get(name)
            state = self._versions.state(name)
            actions = self._versions.unload(name)
            self._changes.notify()
            if state is ModelState.FAILED:
                return  # nothing served: the failure is forgotten
            if isinstance(current, MetaModel):
                # It holds no memory: requests already running keep their version.
                log.info("meta model %r unloaded", name)
                return
            log.info("model %r unloading: no new requests; answering the admitted ones", name)
            self.carry_out(actions)
            await self._changes.until(lambda: self._versions.settled(name))
            log.info("model %r unloaded", name)

    async def finish_startup(self) -> None:
        """The startup set is loaded: let the weight provider size its budget (with the
        cache on, the startup warm-ups were its probe)."""
        async with self._lock:
            await self._weights.finish_probe()

    # ---------------------------------------------------------- the retirement loop

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Free retired versions as they come, in order; runs until cancelled."""
        task_status.started()
        async for version in self._retire_recv:
            served = _compiled(version)
            try:
                await self._weights.remove(served)
            except Exception:
                # Never a reason to stop retiring the others; the version is gone anyway.
                log.exception(
                    "model %r: freeing generation %d failed", served.name, served.generation
                )
            self.carry_out(self._versions.retired(version))
            log.info("model %r: generation %d retired", served.name, served.generation)

    # ------------------------------------------------------------------ internals

    def _rescheduled(self, served: ServedModel) -> None:
        """A version took over a scheduler entry: its cap (a version's own, from the node
        configuration or its load's ``config``) and a weight its ``config`` sets (the
        entry's, like SetModelPolicy's: kept when a load sets none)."""
        self._scheduler.update_model(served.name, max_batch_size=served.sched.max_batch_size)
        if served.override is not None and served.override.weight is not None:
            self._scheduler.set_weight(served.name, served.override.weight)

    def _seed(self, served: ServedModel) -> None:
        for size, seconds in served.warmup_costs.items():
            # The runtime keys an unbatched model's single program by 0; to the scheduler
            # that program is a dispatch of one request, size 1.
            self._scheduler.seed_cost(served.name, max(size, 1), seconds)

    def _load_failed(self, name: str, reason: str, detail: str | None = None) -> None:
        """The load failed: ``reason`` in the state table (clients read it), ``detail``
        (the whole story, default the reason) in the log."""
        serving = name in self._versions.current
        self._versions.load_failed(name, reason)
        self._changes.notify()
        log.error(
            "model %r failed to load%s: %s",
            name,
            "; the previous version keeps serving" if serving else "",
            reason if detail is None else detail,
        )


def _compiled(version: Version) -> ServedModel:
    """The policy emits scheduler actions and frees only for compiled versions."""
    assert isinstance(version, ServedModel), version
    return version


def _log_loaded(version: Version, old: Version | None) -> None:
    replacing = f" replacing generation {old.generation}" if old is not None else ""
    if isinstance(version, MetaModel):
        ready, reason = version.ready()
        log.info(
            "meta model %r loaded (generation %d; calls %s)%s%s",
            version.name,
            version.generation,
            ", ".join(version.calls) or "nothing",
            replacing,
            "" if ready else f"; not ready yet: {reason}",
        )
        return
    reports = (
        "none, programs of the previous version reused"
        if isinstance(old, ServedModel) and old.loaded is version.loaded
        else ", ".join(
            f"b{r.batch_size}={r.seconds:.2f}s/{r.cache}" for r in version.loaded.compile_reports
        )
    )
    log.info(
        "model %r ready (generation %d; compile %s)%s",
        version.name,
        version.generation,
        reports,
        replacing,
    )
